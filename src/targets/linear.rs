//! `linear` target.
