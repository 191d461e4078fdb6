//! The one place payload buffers come from: the device's recycling
//! [`BufPool`] (mempool reserve and per-core budget counter), so steady-state requests allocate nothing
//! and a device's in-flight payload memory is bounded by its budget.
//!
//! A buffer taken after a fair admission ([`super::Engine::try_admit`])
//! carries its *charge*: the bytes counted against its client and its
//! export. The charge goes back when the buffer is dropped, wherever that
//! happens: on the worker right after the reply went out, or later, when a
//! reply that did not fit into the socket has been queued by the
//! connection and finally sent. So a client that does not read its replies
//! keeps being charged for them, and stops being admitted.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::mem::{BufPool, PooledBuf};

/// Who gets a buffer's charge back (the engine's shared state).
pub(crate) trait Uncharge: Send + Sync {
    fn uncharge(&self, client: u32, queue: u32, bytes: u64);
}

pub(crate) struct Charge {
    pub to: Arc<dyn Uncharge>,
    pub client: u32,
    pub queue: u32,
    pub bytes: u64,
}

/// A payload buffer (or none, for requests without data).
pub struct Buf {
    data: Option<PooledBuf>,
    charge: Option<Charge>,
}

impl Buf {
    /// No buffer; never allocates.
    pub fn empty() -> Buf {
        Buf {
            data: None,
            charge: None,
        }
    }

    /// Attach the admission charge this buffer carries until dropped.
    pub(crate) fn set_charge(&mut self, c: Charge) {
        self.charge = Some(c);
    }

    /// Return the memory to the pool now and hand the charge to the
    /// caller (who releases it under its own lock): `(client, bytes)`.
    pub(crate) fn free_and_take_charge(&mut self) -> Option<(u32, u32, u64)> {
        self.data = None;
        self.charge.take().map(|c| (c.client, c.queue, c.bytes))
    }

    /// Bytes of the buffer (0 for none).
    pub fn is_some(&self) -> bool {
        self.data.is_some()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // Memory first: whoever is admitted on the released charge must
        // find the buffer back in the pool, never wait for it.
        self.data = None;
        if let Some(c) = self.charge.take() {
            c.to.uncharge(c.client, c.queue, c.bytes);
        }
    }
}

/// A buffer of exactly `len` bytes from `pool` (contents unspecified).
pub fn get_buf(pool: &Arc<BufPool>, len: usize) -> Buf {
    Buf {
        data: Some(pool.get(len)),
        charge: None,
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            Some(b) => b,
            None => &[],
        }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            Some(b) => b,
            None => &mut [],
        }
    }
}
