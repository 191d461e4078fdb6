//! (filled by the luks work)
