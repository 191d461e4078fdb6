//! The one place payload buffers come from: the device's recycling
//! [`BufPool`] (mempool reserve and per-core budget counter), so steady-state requests allocate nothing
//! and a device's in-flight payload memory is bounded by its budget.
//! Taking a buffer may block when the device is over budget; only
//! connection readers take buffers, never workers, so a waiting reader
//! never stops the work that would give memory back.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::mem::{BufPool, PooledBuf};

/// A payload buffer (or none, for requests without data).
pub struct Buf(Option<PooledBuf>);

impl Buf {
    /// No buffer; never allocates.
    pub fn empty() -> Buf {
        Buf(None)
    }
}

/// A buffer of exactly `len` bytes from `pool` (contents unspecified).
pub fn get_buf(pool: &Arc<BufPool>, len: usize) -> Buf {
    Buf(Some(pool.get(len)))
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Some(b) => b,
            None => &[],
        }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Some(b) => b,
            None => &mut [],
        }
    }
}
