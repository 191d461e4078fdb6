//! (filled by the mem work)
