//! Exact allocation counts on the pools' steady-state paths, measured with a
//! counting global allocator (allocation counts are facts, not timings).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use udm::mem::{BlockPool, Budget, BufPool, MemPool, RawBlockPool};

struct Counting;

thread_local! {
    // Per thread: tests run in parallel and the harness allocates too, so
    // only the thread under test counts, into its own counters.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Net bytes held (allocated minus freed) by this thread.
    static NET: Cell<i64> = const { Cell::new(0) };
}

fn note(bytes: i64) {
    if COUNTING.try_with(|c| c.get()).unwrap_or(false) {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        let _ = NET.try_with(|c| c.set(c.get() + bytes));
    }
}

// SAFETY: forwards every call to the System allocator unchanged; counting
// touches only an atomic and a const-initialised thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size() as i64);
        // SAFETY: caller upholds GlobalAlloc::alloc's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size() as i64);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n as i64 - l.size() as i64);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(-(l.size() as i64));
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCS.with(|c| c.set(0));
    NET.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCS.with(|c| c.get()))
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

/// The class cache's list is reserved in full when the pool is made (and
/// keeps that capacity through `trim`), so a burst of returned buffers never
/// makes the list itself grow: the count on the free side is exact.
#[test]
fn bufpool_burst_returns_never_grow_the_cache_list() {
    let pool = BufPool::new(Budget::new(256 << 20));
    for round in 0..2 {
        let mut held: Vec<_> = (0..256).map(|_| pool.get(4096)).collect();
        let ((), n) = counted(|| {
            for b in held.drain(..) {
                drop(b);
            }
        });
        assert_eq!(
            n, 0,
            "round {round}: returning 256 buffers allocated {n} times"
        );
        assert_eq!(pool.cached_bytes(), 256 * 4096, "round {round}");
        pool.trim();
        assert_eq!(pool.cached_bytes(), 0);
    }
}

#[test]
fn mempool_bulk_steady_state_makes_no_heap_allocations() {
    let pool = MemPool::pages(Budget::new(256 << 20));
    let mut list = pool.list(256);
    for _ in 0..3 {
        pool.alloc_bulk_into(&mut list, 256);
        list.clear();
        pool.alloc_each_into(&mut list, 256);
        list.clear();
    }
    let ((), n) = counted(|| {
        for _ in 0..200 {
            pool.alloc_bulk_into(&mut list, 256);
            list.page_mut(255)[4095] = 1;
            list.clear();
            pool.alloc_each_into(&mut list, 256);
            list.clear();
        }
    });
    assert_eq!(
        n, 0,
        "MemPool bulk/each allocated {n} times in steady state"
    );
}

#[test]
fn block_pool_steady_state_is_allocation_free_and_drop_returns_everything() {
    let ((), n) = counted(|| {
        let pool = RawBlockPool::new(256, 256).unwrap();
        let mut v = Vec::with_capacity(8192);
        for _ in 0..3 {
            for _ in 0..8192 {
                v.push(pool.alloc());
            }
            for b in v.drain(..) {
                // SAFETY: allocated from this pool just above, freed once.
                unsafe { pool.free(b) };
            }
        }
        drop(v);
        drop(pool);
        assert_eq!(NET.with(|c| c.get()), 0, "memory not returned on drop");
    });
    assert!(n > 0);

    let pool: BlockPool<[u64; 8]> = BlockPool::new();
    let warm: Vec<_> = (0..1000).map(|i| pool.alloc([i; 8])).collect();
    drop(warm);
    let ((), n) = counted(|| {
        for r in 0..10u64 {
            let mut held = [const { None }; 64];
            for (i, slot) in held.iter_mut().enumerate() {
                *slot = Some(pool.alloc([r + i as u64; 8]));
            }
            drop(held);
        }
    });
    assert_eq!(
        n, 0,
        "BlockPool allocated {n} times with free blocks available"
    );
}
