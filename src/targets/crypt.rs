//! `crypt` target.
