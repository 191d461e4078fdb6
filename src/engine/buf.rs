//! The one place payload buffers come from. Every request buffer is taken
//! here so that switching the allocation strategy (the recycling
//! `crate::mem::BufPool`) touches one function, not the I/O path.

/// A payload buffer: derefs to `[u8]`, returns its memory when dropped.
pub type Buf = Vec<u8>;

/// A buffer of exactly `len` bytes (contents unspecified to callers).
pub fn get_buf(len: usize) -> Buf {
    vec![0u8; len]
}

/// An empty buffer for requests that carry no data; never allocates.
pub fn no_buf() -> Buf {
    Vec::new()
}
