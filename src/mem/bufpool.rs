//! Recycling pool of contiguous payload buffers (NBD request and reply
//! payloads), in power-of-two size classes, each class a mempool with a
//! reserve, charged to the device's [`Budget`].
//!
//! Why: a request's payload is one contiguous buffer of up to 32 MiB. Asking
//! the system allocator for it per request costs an mmap, page faults and a
//! munmap for large sizes, and lets a flood of requests take unbounded
//! memory. The pool keeps returned buffers per class and hands them out
//! again (no allocator call in steady state), and refuses to grow past the
//! budget: the request then takes a buffer from the class reserve or waits
//! until one comes back.
//!
//! `get` order, as `mempool_alloc`: (1) the class cache (buffers already
//! charged), (2) a new buffer if the approximate budget check passes, (3) the
//! class reserve, (4) the slow path: drop cached buffers of other classes,
//! re-check exactly, and sleep until any buffer of the device is released.
//! A waiter holds nothing while it sleeps, so there is no hold-and-wait and
//! no deadlock; because the exact check lets a charge through whenever true
//! usage is below the limit, the pool always makes progress once in-flight
//! buffers are dropped.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::budget::Budget;
use super::raw::{RawBuf, PAGE_SIZE};

/// Largest length `get` serves from a class (32 MiB + 4 KiB: a maximal
/// request plus room for a header).
pub const MAX_LEN: usize = (32 << 20) + PAGE_SIZE;

const MIN_SHIFT: u32 = 12; // 4 KiB
const MAX_POW2_SHIFT: u32 = 25; // 32 MiB
const POW2_CLASSES: usize = (MAX_POW2_SHIFT - MIN_SHIFT + 1) as usize;
/// Power-of-two classes 4 KiB..32 MiB plus one for exactly [`MAX_LEN`].
pub const CLASSES: usize = POW2_CLASSES + 1;
const OVERSIZE: u8 = u8::MAX;

/// Bytes of returned buffers a class keeps for reuse (at least 4 buffers).
const CACHE_BYTES_PER_CLASS: usize = 64 << 20;
/// How long a waiter sleeps before re-checking without a wake-up.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Size of class `i`.
pub fn class_size(i: usize) -> usize {
    if i < POW2_CLASSES {
        1 << (MIN_SHIFT as usize + i)
    } else {
        MAX_LEN
    }
}

/// Class serving `len` bytes, `None` above [`MAX_LEN`].
#[inline]
pub fn class_of(len: usize) -> Option<usize> {
    if len <= 1 << MIN_SHIFT {
        Some(0)
    } else if len <= 1 << MAX_POW2_SHIFT {
        let shift = usize::BITS - (len - 1).leading_zeros();
        Some((shift - MIN_SHIFT) as usize)
    } else if len <= MAX_LEN {
        Some(POW2_CLASSES)
    } else {
        None
    }
}

/// Reserve size of a class: small classes keep a few elements, large ones
/// none (about 4 MiB of reserve per pool in all).
fn class_min(size: usize) -> usize {
    if size <= 64 << 10 {
        4
    } else if size <= 1 << 20 {
        2
    } else {
        0
    }
}

#[derive(Default)]
struct ClassState {
    /// Guaranteed elements, refilled first by frees; not budget-charged.
    reserve: Vec<RawBuf>,
    /// Returned buffers kept for reuse; budget-charged.
    cache: Vec<RawBuf>,
}

struct Class {
    size: usize,
    min: usize,
    cache_max: usize,
    state: Mutex<ClassState>,
}

impl Class {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, ClassState> {
        // A poisoned lock only means a panic elsewhere; the lists are valid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Recycling pool of contiguous payload buffers; see the module docs.
pub struct BufPool {
    classes: Box<[Class]>,
    budget: Arc<Budget>,
}

impl BufPool {
    /// A pool charging `budget`, with every class reserve filled.
    pub fn new(budget: Arc<Budget>) -> Arc<BufPool> {
        let classes = (0..CLASSES)
            .map(|i| {
                let size = class_size(i);
                let min = class_min(size);
                let cache_max = (CACHE_BYTES_PER_CLASS / size).max(4);
                Class {
                    size,
                    min,
                    cache_max,
                    state: Mutex::new(ClassState {
                        reserve: (0..min).map(|_| RawBuf::new(size)).collect(),
                        // Full capacity up front: the list never grows (no
                        // allocator call) when a burst returns more buffers.
                        cache: Vec::with_capacity(cache_max),
                    }),
                }
            })
            .collect();
        Arc::new(BufPool { classes, budget })
    }

    /// The budget this pool charges.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// A buffer of exactly `len` bytes (contents unspecified). Blocks while
    /// the device is over budget (backpressure); never fails. Lengths above
    /// [`MAX_LEN`] get an unpooled buffer, still charged.
    pub fn get(self: &Arc<Self>, len: usize) -> PooledBuf {
        let Some(ci) = class_of(len) else {
            return self.get_oversize(len);
        };
        let class = &self.classes[ci];
        // 1. cached buffer of this class (already charged).
        if let Some(buf) = class.lock().cache.pop() {
            return self.wrap(buf, ci, len);
        }
        // 2. new buffer within the budget (approximate check).
        if self.budget.try_charge(class.size as u64) {
            return self.wrap(RawBuf::new(class.size), ci, len);
        }
        // 3. the reserve.
        if let Some(buf) = class.lock().reserve.pop() {
            return self.wrap(buf, ci, len);
        }
        self.get_slow(ci, len)
    }

    #[cold]
    fn get_slow(self: &Arc<Self>, ci: usize, len: usize) -> PooledBuf {
        let class = &self.classes[ci];
        loop {
            let token = self.budget.prepare_wait();
            let got = {
                let mut st = class.lock();
                st.cache.pop().or_else(|| st.reserve.pop())
            };
            if let Some(buf) = got {
                self.budget.finish_wait();
                return self.wrap(buf, ci, len);
            }
            self.trim_except(ci);
            if self.budget.try_charge_exact(class.size as u64) {
                self.budget.finish_wait();
                return self.wrap(RawBuf::new(class.size), ci, len);
            }
            self.budget.wait(token, WAIT_SLICE);
            self.budget.finish_wait();
        }
    }

    #[cold]
    fn get_oversize(self: &Arc<Self>, len: usize) -> PooledBuf {
        loop {
            let token = self.budget.prepare_wait();
            self.trim_except(usize::MAX);
            if self.budget.try_charge_exact(len as u64) {
                self.budget.finish_wait();
                return PooledBuf {
                    pool: self.clone(),
                    buf: Some(RawBuf::new(len)),
                    class: OVERSIZE,
                    len,
                };
            }
            self.budget.wait(token, WAIT_SLICE);
            self.budget.finish_wait();
        }
    }

    /// Release the cached buffers of every class but `keep` to the system.
    fn trim_except(&self, keep: usize) {
        for (i, c) in self.classes.iter().enumerate() {
            if i == keep {
                continue;
            }
            // Drain, not take: the cache keeps its reserved capacity.
            let freed: Vec<RawBuf> = c.lock().cache.drain(..).collect();
            if !freed.is_empty() {
                let bytes = (freed.len() * c.size) as u64;
                drop(freed);
                self.budget.uncharge(bytes);
            }
        }
    }

    /// Release every cached buffer (not the reserves) to the system.
    pub fn trim(&self) {
        self.trim_except(usize::MAX)
    }

    /// Bytes currently cached for reuse (charged but not in use).
    pub fn cached_bytes(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| (c.lock().cache.len() * c.size) as u64)
            .sum()
    }

    #[inline]
    fn wrap(self: &Arc<Self>, buf: RawBuf, class: usize, len: usize) -> PooledBuf {
        PooledBuf {
            pool: self.clone(),
            buf: Some(buf),
            class: class as u8,
            len,
        }
    }

    #[inline]
    fn put(&self, buf: RawBuf, class: u8) {
        if class == OVERSIZE {
            let bytes = buf.size() as u64;
            drop(buf);
            self.budget.uncharge(bytes);
            return;
        }
        let c = &self.classes[class as usize];
        let mut st = c.lock();
        if st.reserve.len() < c.min {
            // The reserve is refilled first (mempool_free). No charge
            // moves: a class's charge is always (buffers it holds - min) x
            // size, and moving a buffer between lists keeps that count.
            st.reserve.push(buf);
            drop(st);
            self.budget.notify();
            return;
        }
        if st.cache.len() < c.cache_max {
            st.cache.push(buf);
            drop(st);
            self.budget.notify();
            return;
        }
        drop(st);
        drop(buf);
        self.budget.uncharge(c.size as u64);
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        // Cached buffers were charged; give the budget back.
        let bytes: u64 = self
            .classes
            .iter()
            .map(|c| (c.lock().cache.len() * c.size) as u64)
            .sum();
        if bytes > 0 {
            self.budget.uncharge(bytes);
        }
    }
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("budget", &self.budget)
            .finish()
    }
}

/// A buffer from a [`BufPool`]: derefs to exactly the requested length and
/// returns its memory to the pool on drop.
pub struct PooledBuf {
    pool: Arc<BufPool>,
    buf: Option<RawBuf>,
    class: u8,
    len: usize,
}

impl PooledBuf {
    /// Bytes available without a new buffer (the class size).
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.size())
    }

    /// Change the visible length within the capacity (e.g. shrink to a short
    /// read). Returns false and changes nothing if `len` exceeds it.
    pub fn set_len(&mut self, len: usize) -> bool {
        if len > self.capacity() {
            return false;
        }
        self.len = len;
        true
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b.as_slice()[..self.len],
            None => &[],
        }
    }
}

impl DerefMut for PooledBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        match &mut self.buf {
            Some(b) => &mut b.as_mut_slice()[..len],
            None => &mut [],
        }
    }
}

impl Drop for PooledBuf {
    #[inline]
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.put(buf, self.class);
        }
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    #[test]
    fn classes_cover_every_length() {
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(8192), Some(1));
        assert_eq!(class_of(1 << 20), Some(8));
        assert_eq!(class_of(32 << 20), Some(POW2_CLASSES - 1));
        assert_eq!(class_of((32 << 20) + 1), Some(POW2_CLASSES));
        assert_eq!(class_of(MAX_LEN), Some(POW2_CLASSES));
        assert_eq!(class_of(MAX_LEN + 1), None);
        for len in [
            1usize,
            511,
            4096,
            4097,
            65535,
            65536,
            65537,
            1 << 20,
            3 << 20,
            MAX_LEN,
        ] {
            let c = class_of(len).unwrap();
            assert!(class_size(c) >= len);
            if c > 0 {
                assert!(
                    class_size(c - 1) < len,
                    "class of {len} is not the smallest"
                );
            }
        }
    }

    #[test]
    fn get_gives_exact_length_and_recycles() {
        let pool = BufPool::new(Budget::new(64 << 20));
        let mut a = pool.get(5000);
        assert_eq!(a.len(), 5000);
        assert_eq!(a.capacity(), 8192);
        a.fill(7);
        let p = a.as_ptr();
        let mut b = pool.get(5000);
        assert_ne!(b.as_ptr(), p);
        b.fill(9);
        assert!(a.iter().all(|&x| x == 7));
        drop(a);
        let c = pool.get(6000);
        // LIFO reuse of the cached or reserve buffer: no new allocation.
        assert_eq!(c.as_ptr(), p);
        assert!(pool.get(0).is_empty());
        let big = pool.get(MAX_LEN);
        assert_eq!(big.len(), MAX_LEN);
        let huge = pool.get(MAX_LEN + 1);
        assert_eq!(huge.len(), MAX_LEN + 1);
        drop(huge);
        assert!(b.set_len(8192));
        assert!(!b.set_len(8193));
        assert_eq!(b.len(), 8192);
    }

    #[test]
    fn charge_matches_cached_memory_when_idle() {
        let budget = Budget::with_batch(1 << 30, 1, 1);
        let pool = BufPool::new(budget.clone());
        let bufs: Vec<_> = (0..20).map(|i| pool.get(4096 << (i % 6))).collect();
        assert!(budget.used_exact() > 0);
        drop(bufs);
        assert_eq!(budget.used_exact() as u64, pool.cached_bytes());
        pool.trim();
        assert_eq!(budget.used_exact(), 0);
        let b = pool.get(1 << 20);
        drop(pool);
        drop(b);
        assert_eq!(budget.used_exact(), 0);
    }

    /// Over budget, `get` waits until a buffer is returned (backpressure),
    /// then proceeds.
    #[test]
    fn over_budget_waits_for_a_free() {
        let budget = Budget::with_batch(4 << 20, 1, 1);
        let pool = BufPool::new(budget.clone());
        // Exhaust budget and the 2 MiB class (no reserve).
        let held: Vec<_> = (0..2).map(|_| pool.get(2 << 20)).collect();
        assert!(budget.used_exact() >= 4 << 20);
        let done = Arc::new(AtomicBool::new(false));
        let (p2, d2) = (pool.clone(), done.clone());
        let h = std::thread::spawn(move || {
            let b = p2.get(2 << 20);
            d2.store(true, Ordering::SeqCst);
            b.len()
        });
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            !done.load(Ordering::SeqCst),
            "get did not wait while over budget"
        );
        let t0 = Instant::now();
        drop(held);
        assert_eq!(h.join().unwrap(), 2 << 20);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(budget.used_exact() <= 4 << 20);
    }

    /// Many threads, a budget far below their combined demand, mixed sizes:
    /// everyone finishes (no deadlock) and usage stays bounded.
    #[test]
    fn no_deadlock_under_pressure() {
        let budget = Budget::new(3 << 20);
        let pool = BufPool::new(budget.clone());
        let hs: Vec<_> = (0..6)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let mut peak = 0u64;
                    for i in 0..200 {
                        let len = 4096usize << ((i + t) % 10);
                        let mut b = pool.get(len);
                        b[0] = t as u8;
                        b[len - 1] = i as u8;
                        peak = peak.max(pool.budget().used_approx());
                        assert_eq!(b[0], t as u8);
                    }
                    peak
                })
            })
            .collect();
        for h in hs {
            let peak = h.join().unwrap();
            // limit + one in-flight request per thread + approximation error
            assert!(
                peak <= (3 << 20) + 6 * (2 << 20) + budget.error_bound(),
                "peak {peak}"
            );
        }
        pool.trim();
        assert_eq!(budget.used_exact(), 0);
    }
}
