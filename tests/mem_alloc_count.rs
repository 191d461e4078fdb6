//! Exact allocation counts on the pools' steady-state paths, measured with a
//! counting global allocator (allocation counts are facts, not timings).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use udm::mem::{Budget, BufPool};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Count only on the thread under test (the harness allocates on others).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.try_with(|c| c.get()).unwrap_or(false) {
        ALLOCS.fetch_add(1, Relaxed);
    }
}

// SAFETY: forwards every call to the System allocator unchanged; counting
// touches only an atomic and a const-initialised thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: caller upholds GlobalAlloc::alloc's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note();
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCS.store(0, Relaxed);
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCS.load(Relaxed))
}

#[test]
fn bufpool_steady_state_makes_no_heap_allocations() {
    let pool = BufPool::new(Budget::new(256 << 20));
    let sizes = [
        512usize,
        4096,
        5000,
        65536,
        1 << 20,
        4 << 20,
        (32 << 20) + 4096,
    ];
    // Warm up: every class has buffers and its lists have grown.
    for _ in 0..3 {
        let held: Vec<_> = sizes.iter().map(|&s| pool.get(s)).collect();
        drop(held);
    }
    let ((), n) = counted(|| {
        for _ in 0..1000 {
            for &s in &sizes {
                let mut b = pool.get(s);
                b[0] = 1;
                let last = b.len() - 1;
                b[last] = 2;
                drop(b);
            }
        }
    });
    assert_eq!(n, 0, "BufPool get/drop allocated {n} times in steady state");

    // Sanity: the counter does count (a cold class allocates).
    let (b, n) = counted(|| pool.get(16 << 20));
    drop(b);
    assert!(n >= 1, "counting allocator saw nothing");
}
