//! (core: mapped)
