//! Fixed-size element pool with a reserve and bulk allocation,
//! after `mm/mempool.c` and the bulk variants proposed for dm-crypt's write
//! bounce pages.
//!
//! Why: an encrypted write of a borrowed buffer needs one bounce page per
//! 4 KiB — 256 pages for a 1 MiB request. Taking them one at a time costs a
//! lock round trip and a budget update per page (the kernel patch this
//! follows measured the loop at many times one bulk call). [`MemPool::alloc_bulk`]
//! takes all of them under one lock acquisition with at most one budget
//! charge. [`MemPool::alloc_each`] keeps the one-at-a-time path (the kernel's
//! `crypt_alloc_buffer` loop before bulk allocation) for the ablation benchmark.
//!
//! Lists: the *reserve* holds `min` elements allocated at creation and is
//! refilled first by frees (it guarantees progress and is not charged to the
//! budget); the *cache* keeps further returned elements for reuse (charged).
//! The pool's charge is always (elements it owns − `min`) × element size.
//!
//! Allocation order, as `mempool_alloc`: cache, then a new element if the
//! budget's approximate check passes, then the reserve; a bulk request takes
//! its missing elements from the reserve only if the reserve holds all of
//! them (all or nothing). If that fails the caller gives back everything,
//! takes the pool's allocation mutex and accumulates elements — cache,
//! reserve, exact budget check — sleeping until frees arrive. The mutex is
//! dm-crypt's `bio_alloc_lock`: two writers each holding half the reserve and
//! waiting for the other half would deadlock; serialising the ones that
//! block means one of them always completes from the reserve (a request
//! never needs more than `min` elements), and elements come back as writes
//! complete.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::budget::Budget;
use super::raw::RawBuf;

/// The crypt target's reserve: BIO_MAX_VECS pages, the most one request
/// needs (1 MiB of 4 KiB pages).
pub const BIO_MAX_VECS: usize = 256;

const WAIT_SLICE: Duration = Duration::from_millis(100);

static BULK_BOUNCE: AtomicBool = AtomicBool::new(true);

/// Choose how crypt targets created from now on take their write bounce
/// pages: `true` (default) in one bulk call, `false` one at a time — the
/// behaviour before bulk allocation, kept for the ablation benchmark.
pub fn set_bulk_bounce_default(bulk: bool) {
    BULK_BOUNCE.store(bulk, Ordering::Relaxed);
}

/// See [`set_bulk_bounce_default`].
pub fn bulk_bounce_default() -> bool {
    BULK_BOUNCE.load(Ordering::Relaxed)
}

struct State {
    reserve: Vec<RawBuf>,
    cache: Vec<RawBuf>,
}

/// Pool of fixed-size, page-aligned elements; see the module docs.
pub struct MemPool {
    elem_size: usize,
    min: usize,
    cache_max: usize,
    state: Mutex<State>,
    /// Serialises allocators that may block (dm-crypt's bio_alloc_lock).
    alloc_lock: Mutex<()>,
    budget: Arc<Budget>,
}

impl MemPool {
    /// A pool of `elem_size`-byte elements with `min` reserved (allocated
    /// now) and up to `cache_max` further free elements kept for reuse.
    pub fn new(
        elem_size: usize,
        min: usize,
        cache_max: usize,
        budget: Arc<Budget>,
    ) -> Arc<MemPool> {
        let elem_size = elem_size.max(1);
        Arc::new(MemPool {
            elem_size,
            min,
            cache_max,
            state: Mutex::new(State {
                reserve: (0..min).map(|_| RawBuf::new(elem_size)).collect(),
                cache: Vec::with_capacity(cache_max),
            }),
            alloc_lock: Mutex::new(()),
            budget,
        })
    }

    /// dm-crypt's page pool: 4 KiB pages, a reserve of [`BIO_MAX_VECS`],
    /// and a cache of four requests' worth.
    pub fn pages(budget: Arc<Budget>) -> Arc<MemPool> {
        Self::new(4096, BIO_MAX_VECS, 4 * BIO_MAX_VECS, budget)
    }

    pub fn elem_size(&self) -> usize {
        self.elem_size
    }

    /// Reserve size: the largest request guaranteed to complete.
    pub fn min(&self) -> usize {
        self.min
    }

    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the lists are valid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty list bound to this pool, with room for `n` elements.
    pub fn list(self: &Arc<Self>, n: usize) -> PageList {
        PageList {
            pool: self.clone(),
            pages: Vec::with_capacity(n),
        }
    }

    /// One element without blocking: cache, new (approximate budget check),
    /// reserve; `None` when all three fail.
    pub fn try_alloc(&self) -> Option<RawBuf> {
        if let Some(e) = self.lock().cache.pop() {
            return Some(e);
        }
        if self.budget.try_charge(self.elem_size as u64) {
            return Some(RawBuf::new(self.elem_size));
        }
        self.lock().reserve.pop()
    }

    /// One element; sleeps until one is free, never fails.
    pub fn alloc(&self) -> RawBuf {
        if let Some(e) = self.try_alloc() {
            return e;
        }
        loop {
            let token = self.budget.prepare_wait();
            let got = {
                let mut st = self.lock();
                st.cache.pop().or_else(|| st.reserve.pop())
            };
            let got = got.or_else(|| {
                self.budget
                    .try_charge_exact(self.elem_size as u64)
                    .then(|| RawBuf::new(self.elem_size))
            });
            if let Some(e) = got {
                self.budget.finish_wait();
                return e;
            }
            self.budget.wait(token, WAIT_SLICE);
            self.budget.finish_wait();
        }
    }

    /// Return one element.
    pub fn free(&self, e: RawBuf) {
        let mut one = [Some(e)];
        self.free_iter(one.iter_mut().filter_map(Option::take));
    }

    /// `n` elements at once (see the module docs); never fails. Requests of
    /// more than `min` elements cannot be guaranteed by the reserve: when
    /// they have to block they are charged past the budget instead of
    /// waiting forever (callers should split requests at `min`).
    pub fn alloc_bulk(self: &Arc<Self>, n: usize) -> PageList {
        let mut list = self.list(n);
        self.alloc_bulk_into(&mut list, n);
        list
    }

    /// Append `n` elements to `list` (which must belong to this pool).
    pub fn alloc_bulk_into(&self, list: &mut PageList, n: usize) {
        debug_assert!(std::ptr::eq(Arc::as_ptr(&list.pool), self));
        let start = list.pages.len();
        if self.try_bulk(&mut list.pages, n) {
            return;
        }
        debug_assert_eq!(list.pages.len(), start);
        self.bulk_slow(&mut list.pages, n);
    }

    /// First pass, non-blocking and without the mutex: all `n` or nothing.
    #[inline]
    fn try_bulk(&self, out: &mut Vec<RawBuf>, n: usize) -> bool {
        let start = out.len();
        let mut st = self.lock();
        let from_cache = n.min(st.cache.len());
        let at = st.cache.len() - from_cache;
        out.extend(st.cache.drain(at..));
        let missing = n - from_cache;
        if missing == 0 {
            return true;
        }
        if self.budget.try_charge((missing * self.elem_size) as u64) {
            drop(st);
            out.extend((0..missing).map(|_| RawBuf::new(self.elem_size)));
            return true;
        }
        if st.reserve.len() >= missing {
            let at = st.reserve.len() - missing;
            out.extend(st.reserve.drain(at..));
            return true;
        }
        // All or nothing: give the cached elements back.
        st.cache.extend(out.drain(start..));
        false
    }

    #[cold]
    fn bulk_slow(&self, out: &mut Vec<RawBuf>, n: usize) {
        let _serial = self.alloc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let target = out.len() + n;
        loop {
            let token = self.budget.prepare_wait();
            {
                let mut st = self.lock();
                let want = target - out.len();
                let k = want.min(st.cache.len());
                let at = st.cache.len() - k;
                out.extend(st.cache.drain(at..));
                let want = target - out.len();
                let k = want.min(st.reserve.len());
                let at = st.reserve.len() - k;
                out.extend(st.reserve.drain(at..));
            }
            let missing = target - out.len();
            if missing > 0 {
                let bytes = (missing * self.elem_size) as u64;
                if n > self.min {
                    // The reserve can never cover this request: progress
                    // beats the budget.
                    self.budget.force_charge(bytes);
                    out.extend((0..missing).map(|_| RawBuf::new(self.elem_size)));
                } else if self.budget.try_charge_exact(bytes) {
                    out.extend((0..missing).map(|_| RawBuf::new(self.elem_size)));
                }
            }
            if out.len() == target {
                self.budget.finish_wait();
                return;
            }
            self.budget.wait(token, WAIT_SLICE);
            self.budget.finish_wait();
        }
    }

    /// `n` elements one at a time, the way dm-crypt does without bulk
    /// allocation: a non-blocking pass per element; on the first failure
    /// free all, take the mutex and allocate each element blocking.
    /// (Ablation path.)
    pub fn alloc_each(self: &Arc<Self>, n: usize) -> PageList {
        let mut list = self.list(n);
        self.alloc_each_into(&mut list, n);
        list
    }

    /// Append `n` elements to `list`, one at a time (see [`MemPool::alloc_each`]).
    pub fn alloc_each_into(&self, list: &mut PageList, n: usize) {
        debug_assert!(std::ptr::eq(Arc::as_ptr(&list.pool), self));
        let start = list.pages.len();
        for _ in 0..n {
            match self.try_alloc() {
                Some(e) => list.pages.push(e),
                None => {
                    let taken: Vec<RawBuf> = list.pages.drain(start..).collect();
                    self.free_iter(taken);
                    let _serial = self.alloc_lock.lock().unwrap_or_else(|e| e.into_inner());
                    for _ in 0..n {
                        list.pages.push(self.alloc());
                    }
                    return;
                }
            }
        }
    }

    /// Return every element of `list` in one lock acquisition.
    pub fn free_bulk(&self, list: &mut PageList) {
        self.free_iter(list.pages.drain(..));
    }

    fn free_iter(&self, elems: impl IntoIterator<Item = RawBuf>) {
        let mut release: Option<Vec<RawBuf>> = None;
        {
            let mut st = self.lock();
            for e in elems {
                if st.reserve.len() < self.min {
                    st.reserve.push(e);
                } else if st.cache.len() < self.cache_max && !self.budget.has_waiters() {
                    st.cache.push(e);
                } else {
                    release.get_or_insert_with(Vec::new).push(e);
                }
            }
        }
        match release {
            Some(r) => {
                let bytes = (r.len() * self.elem_size) as u64;
                drop(r);
                self.budget.uncharge(bytes);
            }
            None => self.budget.notify(),
        }
    }

    /// Elements held free (reserve, cache).
    pub fn free_counts(&self) -> (usize, usize) {
        let st = self.lock();
        (st.reserve.len(), st.cache.len())
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        let cached = self.lock().cache.len();
        if cached > 0 {
            self.budget.uncharge((cached * self.elem_size) as u64);
        }
    }
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("elem_size", &self.elem_size)
            .field("min", &self.min)
            .finish()
    }
}

/// Elements taken from one [`MemPool`]; returned to it in one batch on drop
/// or [`PageList::clear`]. Hand them to `BlockDevice::write_vectored` with
/// [`PageList::io_slices`].
pub struct PageList {
    pool: Arc<MemPool>,
    pages: Vec<RawBuf>,
}

impl PageList {
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    pub fn pool(&self) -> &Arc<MemPool> {
        &self.pool
    }

    pub fn page(&self, i: usize) -> &[u8] {
        self.pages[i].as_slice()
    }

    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        self.pages[i].as_mut_slice()
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.pages.iter().map(RawBuf::as_slice)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.pages.iter_mut().map(RawBuf::as_mut_slice)
    }

    /// Scatter list of the first `len` bytes (the last element cut short).
    pub fn io_slices(&self, len: usize) -> Vec<IoSlice<'_>> {
        let mut v = Vec::with_capacity(self.pages.len());
        let mut left = len;
        for p in &self.pages {
            if left == 0 {
                break;
            }
            let n = left.min(p.size());
            v.push(IoSlice::new(&p.as_slice()[..n]));
            left -= n;
        }
        v
    }

    /// Return every element to the pool (one lock), keeping the list.
    pub fn clear(&mut self) {
        if !self.pages.is_empty() {
            let pool = self.pool.clone();
            pool.free_bulk(self);
        }
    }
}

impl Drop for PageList {
    fn drop(&mut self) {
        self.clear();
    }
}

impl std::fmt::Debug for PageList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageList")
            .field("len", &self.pages.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn distinct(l: &PageList) -> bool {
        let s: HashSet<usize> = l.pages.iter().map(|p| p.as_ptr() as usize).collect();
        s.len() == l.len()
    }

    #[test]
    fn bulk_gives_distinct_writable_pages_and_recycles() {
        let budget = Budget::with_batch(64 << 20, 1, 1);
        let pool = MemPool::pages(budget.clone());
        let mut a = pool.alloc_bulk(256);
        assert_eq!(a.len(), 256);
        assert!(distinct(&a));
        for (i, p) in a.iter_mut().enumerate() {
            assert_eq!(p.len(), 4096);
            p.fill(i as u8);
        }
        let b = pool.alloc_bulk(256);
        assert!(distinct(&b));
        for (i, p) in a.iter().enumerate() {
            assert!(p.iter().all(|&x| x == i as u8));
        }
        // Over the reserve: new pages were charged.
        assert!(budget.used_exact() > 0);
        let io = a.io_slices(256 * 4096 - 100);
        assert_eq!(io.len(), 256);
        assert_eq!(io.iter().map(|s| s.len()).sum::<usize>(), 256 * 4096 - 100);
        assert_eq!(a.io_slices(5000).len(), 2);
        drop(a);
        drop(b);
        assert_eq!(pool.free_counts().0, 256);
        let c = pool.alloc_each(256);
        assert!(distinct(&c));
        drop(c);
        assert_eq!(budget.used_exact() as usize, pool.free_counts().1 * 4096);
        drop(pool);
        assert_eq!(budget.used_exact(), 0);
    }

    /// With the budget exhausted, bulk falls back to the reserve as a whole.
    #[test]
    fn over_budget_uses_the_reserve() {
        let budget = Budget::with_batch(4096, 1, 1);
        budget.force_charge(4096);
        let pool = MemPool::new(4096, 8, 8, budget.clone());
        let l = pool.alloc_bulk(8);
        assert_eq!(l.len(), 8);
        assert_eq!(pool.free_counts(), (0, 0));
        assert_eq!(budget.used_exact(), 4096);
        drop(l);
        assert_eq!(pool.free_counts(), (8, 0));
    }

    /// The deadlock `bio_alloc_lock` prevents: two writers each needing the whole reserve, no
    /// budget at all. Both must finish, repeatedly, with either path.
    #[test]
    fn two_writers_needing_the_whole_reserve_do_not_deadlock() {
        for bulk in [true, false] {
            let budget = Budget::with_batch(1, 1, 1);
            budget.force_charge(1 << 20); // nothing new may be allocated
            let pool = MemPool::new(4096, 16, 16, budget.clone());
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let pool = pool.clone();
                    std::thread::spawn(move || {
                        for i in 0..300 {
                            let mut l = if bulk {
                                pool.alloc_bulk(16)
                            } else {
                                pool.alloc_each(16)
                            };
                            assert_eq!(l.len(), 16);
                            l.page_mut(0)[0] = (t + i) as u8;
                            if i % 7 == 0 {
                                std::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(pool.free_counts(), (16, 0));
            assert_eq!(budget.used_exact(), 1 << 20);
        }
    }

    #[test]
    fn blocked_allocation_resumes_when_pages_return() {
        let budget = Budget::with_batch(1, 1, 1);
        budget.force_charge(1);
        let pool = MemPool::new(4096, 4, 4, budget);
        let held = pool.alloc_bulk(3);
        let done = Arc::new(AtomicBool::new(false));
        let (p2, d2) = (pool.clone(), done.clone());
        let h = std::thread::spawn(move || {
            let l = p2.alloc_bulk(4);
            d2.store(true, Ordering::SeqCst);
            l.len()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst));
        drop(held);
        assert_eq!(h.join().unwrap(), 4);
    }

    #[test]
    fn requests_larger_than_the_reserve_still_complete() {
        let budget = Budget::with_batch(1, 1, 1);
        budget.force_charge(1);
        let pool = MemPool::new(4096, 4, 4, budget.clone());
        let l = pool.alloc_bulk(10);
        assert_eq!(l.len(), 10);
        assert!(distinct(&l));
        drop(l);
        let one = pool.alloc();
        pool.free(one);
    }
}
