//! Ordered parallel encryption: a large request is cut into one part per
//! crypto thread, every part is encrypted (or decrypted) and moved by the
//! thread that took it, and the request completes only when every part
//! has, so no write is reordered against a later request. The per-request
//! state lives in the target's fixed-size block pool, so a split request
//! allocates nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use std::sync::Arc;

use super::Crypt;
use crate::core::{DevError, DevResult};
use crate::crypto::pool::CryptPool;
use crate::crypto::SectorCrypt;

/// Requests at least this large are split across the worker pool.
const SPLIT_MIN: usize = 128 << 10;
/// Smallest share of a request given to one thread.
const PART_MIN: usize = 64 << 10;
/// Most parts one request is split into (bounds the per-request state).
const MAX_PARTS: usize = 64;

/// Bytes `[start, end)` of part `i` of a request of `len` bytes cut into
/// parts of `per` bytes (empty past the end).
#[inline]
pub(super) fn part(i: usize, per: usize, len: usize) -> std::ops::Range<usize> {
    let start = i.saturating_mul(per).min(len);
    start..start.saturating_add(per).min(len)
}

impl Crypt {
    /// How a request of `len` bytes is cut for the pool: (bytes per part,
    /// number of parts). One part when the pool is off for this direction
    /// or the request is small. Over a device with a queue depth (a file
    /// on disk through io_uring, an RBD image, a remote NBD export) the
    /// parts split only the cipher work: the request's I/O is one call
    /// made by the thread that owns the request ([`Crypt::queued`]), so
    /// no crypto thread ever waits on the disk or the network.
    pub(super) fn plan(&self, len: usize, may_split: bool) -> (usize, usize) {
        let threads = if may_split && len >= SPLIT_MIN {
            self.helpers().map_or(1, |p| p.parallelism())
        } else {
            1
        };
        let ss = self.opts.sector_size as usize;
        // Two parts per thread: whoever is free takes the next one, so a
        // helper that starts late (woken from sleep) still takes a share,
        // and one that cannot start leaves it to the submitter.
        let want = if threads > 1 { 2 * threads } else { 1 };
        let parts = want.min(len / PART_MIN).clamp(1, MAX_PARTS);
        let per = (len / ss).div_ceil(parts).max(1) * ss;
        (per, len.div_ceil(per).max(1))
    }

    /// Whether the lower device waits (disk, network) and keeps requests
    /// in flight: its I/O is done whole, outside the split. Asked per
    /// request because the device may be a mapped device whose table (and
    /// so its queue depth) is reloaded.
    pub(super) fn queued(&self) -> bool {
        self.area.dev.limits().queue_depth > 0
    }

    /// The crypto helper threads, started on first use: the first request
    /// large enough to be split, so a target that only ever sees small
    /// requests starts none.
    pub(super) fn helpers(&self) -> Option<&Arc<CryptPool>> {
        self.pool
            .get_or_init(|| {
                if self.threads == 1 {
                    None
                } else {
                    CryptPool::new(self.threads, "udm-crypt")
                }
            })
            .as_ref()
    }

    /// Run `f(i)` for parts `0..n`, on the pool when there is more than one;
    /// the first error wins. Returns only when every part has finished, so
    /// a request completes as a whole (no reordering).
    pub(super) fn run_parts(
        &self,
        n: usize,
        f: &(dyn Fn(usize) -> DevResult<()> + Sync),
    ) -> DevResult<()> {
        let pool = match self.pool.get() {
            Some(Some(p)) if n > 1 => p,
            _ => {
                for i in 0..n {
                    f(i)?;
                }
                return Ok(());
            }
        };
        let first_err: Mutex<Option<DevError>> = Mutex::new(None);
        let ok = pool.run(n, &|i| {
            if let Err(e) = f(i) {
                first_err
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        });
        if let Some(e) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        if !ok {
            return Err(DevError::Target(
                "crypt: a worker thread failed while processing the request".into(),
            ));
        }
        Ok(())
    }
}

/// The per-request state of a split request: where its buffer lies and
/// which parts have been handed to a thread. It lives in the target's
/// block pool for the duration of one request.
pub(super) struct CryptIo {
    base: *mut u8,
    len: usize,
    per: usize,
    taken: [AtomicBool; MAX_PARTS],
}

// SAFETY: `base` points into the buffer of the request that owns this
// descriptor; the request outlives every use (run_parts returns only when
// all parts are done), and `take` hands each disjoint part out at most
// once, so sharing the descriptor between the request's threads is sound.
unsafe impl Send for CryptIo {}
// SAFETY: as above; the only shared mutation is through the atomics.
unsafe impl Sync for CryptIo {}

impl CryptIo {
    pub(super) fn new(buf: &mut [u8], per: usize) -> CryptIo {
        CryptIo {
            base: buf.as_mut_ptr(),
            len: buf.len(),
            per,
            taken: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// Part `i` (bytes `[i*per, min((i+1)*per, len))`), the first time it is
    /// asked for; `None` after that or past the end.
    // Handing out `&mut` from `&self` is the point: each part exactly once.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn take(&self, i: usize) -> Option<&mut [u8]> {
        let start = i.checked_mul(self.per)?;
        if i >= MAX_PARTS || start >= self.len || self.taken[i].swap(true, Ordering::AcqRel) {
            return None;
        }
        let n = self.per.min(self.len - start);
        // SAFETY: `[start, start + n)` lies inside the buffer `base..base+len`
        // that the request borrows mutably for longer than `&self` (the
        // descriptor is dropped before the request returns); parts are
        // disjoint and the swap above hands each out only once, so no two
        // live `&mut` overlap.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.add(start), n) })
    }
}

/// Encrypt (or decrypt) `buf`, whose first byte is at dm-crypt sector
/// `first`, in place, cut into `n` parts of `per` bytes spread over
/// `pool` (on this thread alone without one). The cipher-only split of a
/// request over a queued device: its I/O is done whole by the caller.
pub(super) fn cipher_parts(
    pool: Option<&CryptPool>,
    sc: &SectorCrypt,
    buf: &mut [u8],
    first: u64,
    (per, n): (usize, usize),
    encrypt: bool,
) -> DevResult<()> {
    let one = |p: &mut [u8], at: usize| {
        let sector = first.wrapping_add((at / 512) as u64);
        if encrypt {
            sc.encrypt(p, sector);
        } else {
            sc.decrypt(p, sector);
        }
    };
    let pool = match pool {
        Some(p) if n > 1 => p,
        _ => {
            one(buf, 0);
            return Ok(());
        }
    };
    let io = CryptIo::new(buf, per);
    let ok = pool.run(n, &|i| {
        if let Some(p) = io.take(i) {
            one(p, i * per);
        }
    });
    if !ok {
        return Err(DevError::Target(
            "crypt: a worker thread failed while processing the request".into(),
        ));
    }
    Ok(())
}
