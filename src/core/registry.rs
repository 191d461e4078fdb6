//! (core: registry)
