//! Per-device budget of buffer memory (an approximate per-core counter
//! applied to dm-crypt's `pages_per_client`).
//!
//! Why: a device must not be able to take all of the host's memory because
//! a client queues many large writes. Each device may hold at most its share
//! of a global budget; a pool that would exceed it falls back to its reserve
//! or waits until buffers come back (backpressure), it never fails and never
//! asks the system for more.
//!
//! What is counted: bytes a pool holds from the system *beyond its fixed
//! reserve* (buffers in use plus buffers cached for reuse). The check on the
//! hot path is the lock-free approximate read (`used_approx() < limit`, then
//! add), so a device can overshoot by the counter's error bound plus one
//! request per concurrent allocator; the exact sum is used only on the slow
//! path (before sleeping) so that a stale approximation can never block a
//! device whose true usage is below the limit.

use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::percpu::{default_shards, PerCpuCounter};

/// dm-crypt's floor for `pages_per_client`: BIO_MAX_VECS × 16 pages.
pub const MIN_DEFAULT_DEVICE_BUDGET: u64 = 256 * 16 * 4096;

/// Per-device in-flight memory budget counted in per-core shards.
pub struct Budget {
    limit: u64,
    unlimited: bool,
    used: PerCpuCounter,
    waiters: AtomicUsize,
    generation: Mutex<u64>,
    wake: Condvar,
}

impl Budget {
    /// A budget of `limit_bytes` (at least 1 byte), with a batch chosen so
    /// that the approximation error is at most about 1/8 of the limit
    /// (between 4 KiB and 4 MiB per shard).
    pub fn new(limit_bytes: u64) -> Arc<Budget> {
        let shards = default_shards();
        let batch = (limit_bytes / (8 * shards as u64)).clamp(4096, 4 << 20);
        Self::with_batch(limit_bytes, batch as i64, shards)
    }

    /// A budget with an explicit counter batch and shard count (tests,
    /// benchmarks).
    pub fn with_batch(limit_bytes: u64, batch: i64, shards: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit: limit_bytes.max(1),
            unlimited: false,
            used: PerCpuCounter::with_shards(batch, shards),
            waiters: AtomicUsize::new(0),
            generation: Mutex::new(0),
            wake: Condvar::new(),
        })
    }

    /// A budget that never refuses (usage is still counted).
    pub fn unlimited() -> Arc<Budget> {
        Arc::new(Budget {
            limit: u64::MAX,
            unlimited: true,
            used: PerCpuCounter::new(4 << 20),
            waiters: AtomicUsize::new(0),
            generation: Mutex::new(0),
            wake: Condvar::new(),
        })
    }

    /// The limit in bytes, `None` when unlimited.
    pub fn limit(&self) -> Option<u64> {
        (!self.unlimited).then_some(self.limit)
    }

    /// Lock-free approximate usage (may be off by [`Budget::error_bound`]).
    #[inline]
    pub fn used_approx(&self) -> u64 {
        self.used.read_positive()
    }

    /// Exact usage: sums every shard under a lock. Not for the hot path.
    pub fn used_exact(&self) -> i64 {
        self.used.sum()
    }

    /// Largest difference between [`Budget::used_approx`] and the truth.
    pub fn error_bound(&self) -> u64 {
        self.used.error_bound()
    }

    /// Hot-path charge: succeeds when the approximate usage is below the
    /// limit (then adds `bytes`, so one charge may overshoot).
    #[inline]
    pub fn try_charge(&self, bytes: u64) -> bool {
        if !self.unlimited && self.used.read_positive() >= self.limit {
            return false;
        }
        self.used.add(bytes as i64);
        true
    }

    /// The same check made exactly (what `percpu_counter_compare` does
    /// near the limit: a locked sum of every shard). Used on slow paths and as the
    /// benchmark's ablation.
    pub fn try_charge_exact(&self, bytes: u64) -> bool {
        if !self.unlimited && self.used.sum() >= self.limit as i64 {
            return false;
        }
        self.used.add(bytes as i64);
        true
    }

    /// Charge without checking (memory a pool must take to make progress).
    #[inline]
    pub fn force_charge(&self, bytes: u64) {
        self.used.add(bytes as i64);
    }

    /// Return `bytes` to the budget and wake anyone waiting for memory.
    #[inline]
    pub fn uncharge(&self, bytes: u64) {
        self.used.add(-(bytes as i64));
        self.notify();
    }

    /// Whether some allocation is waiting for memory of this device.
    #[inline]
    pub fn has_waiters(&self) -> bool {
        self.waiters.load(Ordering::Relaxed) != 0
    }

    /// Wake waiters after memory was released (budget or a pool's lists).
    /// Cheap when nobody waits: one fence and one load.
    #[inline]
    pub fn notify(&self) {
        // Pairs with the fence in `prepare_wait`: either the waiter's
        // re-check sees our release, or we see its waiter count.
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) != 0 {
            self.notify_slow();
        }
    }

    #[cold]
    fn notify_slow(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *g = g.wrapping_add(1);
        self.wake.notify_all();
    }

    /// Register as a waiter before re-checking for memory. Returns a token
    /// for [`Budget::wait`]; every `prepare_wait` must be matched by one
    /// [`Budget::finish_wait`].
    pub(crate) fn prepare_wait(&self) -> u64 {
        let g = *self.generation.lock().unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        g
    }

    /// Sleep until memory was released since `token` was taken (or a
    /// timeout passes, as a safety net: mempool sleeps at most 5 s).
    pub(crate) fn wait(&self, token: u64, timeout: Duration) {
        let g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        if *g != token {
            return;
        }
        let _ = self
            .wake
            .wait_timeout_while(g, timeout, |g| *g == token)
            .unwrap_or_else(|e| e.into_inner());
    }

    pub(crate) fn finish_wait(&self) {
        self.waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit())
            .field("used_approx", &self.used_approx())
            .finish()
    }
}

/// Physical memory of this host in bytes (sysconf), if known.
pub fn total_ram_bytes() -> Option<u64> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if pages <= 0 || page <= 0 {
        return None;
    }
    (pages as u64).checked_mul(page as u64)
}

/// Default total budget for all devices: 2 % of RAM, as dm-crypt.
/// Falls back to 1 GiB × 2 % if the RAM size cannot be read.
pub fn default_total_budget() -> u64 {
    total_ram_bytes().unwrap_or(1 << 30) / 50
}

/// One device's share of `total` among `devices` devices. With the default
/// total the share is floored like dm-crypt's (16 MiB); an explicit total
/// (`explicit = true`, from `--memory-budget`) is divided exactly.
pub fn per_device_budget(total: u64, devices: usize, explicit: bool) -> u64 {
    let share = total / devices.max(1) as u64;
    if explicit {
        share.max(1)
    } else {
        share.max(MIN_DEFAULT_DEVICE_BUDGET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_dm_crypt() {
        let ram = total_ram_bytes().unwrap();
        assert!(ram > 0);
        assert_eq!(default_total_budget(), ram / 50);
        assert_eq!(per_device_budget(100 << 20, 4, true), 25 << 20);
        assert_eq!(per_device_budget(100 << 20, 4, false), 25 << 20);
        assert_eq!(
            per_device_budget(40 << 20, 4, false),
            MIN_DEFAULT_DEVICE_BUDGET
        );
        assert_eq!(per_device_budget(40 << 20, 4, true), 10 << 20);
        assert_eq!(per_device_budget(1 << 40, 2, false), 1 << 39);
        assert_eq!(per_device_budget(10, 0, true), 10);
    }

    #[test]
    fn charge_until_limit_then_refuse() {
        let b = Budget::with_batch(16 << 10, 1, 1); // exact counter
        assert!(b.try_charge(8 << 10));
        assert!(b.try_charge(8 << 10));
        assert!(!b.try_charge(1));
        assert!(!b.try_charge_exact(1));
        b.uncharge(4 << 10);
        assert!(b.try_charge(4 << 10));
        assert_eq!(b.used_exact(), 16 << 10);
        b.uncharge(16 << 10);
        assert_eq!(b.used_exact(), 0);
        let u = Budget::unlimited();
        assert!(u.try_charge(u64::MAX / 4));
        assert_eq!(u.limit(), None);
    }

    #[test]
    fn waiter_is_woken_by_uncharge() {
        let b = Budget::with_batch(4096, 1, 1);
        assert!(b.try_charge(4096));
        let b2 = b.clone();
        let h = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            loop {
                let tok = b2.prepare_wait();
                let ok = b2.try_charge(4096);
                if ok {
                    b2.finish_wait();
                    return t0.elapsed();
                }
                b2.wait(tok, Duration::from_secs(30));
                b2.finish_wait();
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        b.uncharge(4096);
        let waited = h.join().unwrap();
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
        assert_eq!(b.used_exact(), 4096);
    }
}
