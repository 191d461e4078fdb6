//! `zero` target.
