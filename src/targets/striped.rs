//! `striped` target.
