//! A counting global allocator for the tests that prove a path allocates
//! nothing: allocation counts are facts, not timings. A test binary opts in
//! with `#[global_allocator] static A: common::alloc::Counting = common::alloc::Counting;`
//! (only that binary's allocator changes). The counters are process-wide, so
//! counting tests in one binary must not overlap.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Size of the latest allocation, to name the culprit in a failure.
static LAST_SIZE: AtomicU64 = AtomicU64::new(0);

/// Allocations (alloc, alloc_zeroed, realloc) so far, in every thread.
pub fn allocs() -> u64 {
    ALLOCS.load(Ordering::SeqCst)
}

/// Size in bytes of the latest allocation.
pub fn last_size() -> u64 {
    LAST_SIZE.load(Ordering::SeqCst)
}

fn note(size: usize) {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    LAST_SIZE.store(size as u64, Ordering::Relaxed);
}

// SAFETY: forwards every call to the system allocator unchanged; it only
// counts allocations on the side (atomics, no allocation of its own).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

/// Allocations made while `f` runs: the fewest of `runs` runs, and every
/// run's count. Why the fewest: the counter is process-wide (allocations on
/// worker threads must count), so it also sees the test harness's own
/// bookkeeping around starting a test thread — a few allocations, once, that
/// land in whichever run is under way. A path that allocates per request
/// shows in every run.
pub fn fewest_allocs(runs: usize, mut f: impl FnMut()) -> (u64, Vec<u64>) {
    let mut all = Vec::with_capacity(runs);
    for _ in 0..runs {
        let before = allocs();
        f();
        all.push(allocs() - before);
    }
    (all.iter().copied().min().unwrap_or(0), all)
}
