//! (core: table)
