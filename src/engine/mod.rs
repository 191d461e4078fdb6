//! (filled by the engine work)
