//! `error` target.
