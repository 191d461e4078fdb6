//! (filled by the nbd work)
