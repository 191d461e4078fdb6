//! The per-thread block cache of the block-pool benchmark
//! (`benches/support/block_cache.rs`) is unsafe code whose figures are
//! published: it must hand out distinct, writable blocks, move them through
//! its depot as magazines or chains without losing or doubling any, and
//! give every block back to the pool.

#[allow(dead_code)]
#[path = "../benches/support/block_cache.rs"]
mod block_cache;

use std::collections::HashSet;
use std::ptr::{self, NonNull};

use block_cache::{Depot, MAGAZINE};
use udm::mem::RawBlockPool;

/// Write a distinct byte into every block, then check none was disturbed.
fn distinct_and_writable(blocks: &[NonNull<u8>], size: usize) {
    let set: HashSet<usize> = blocks.iter().map(|p| p.as_ptr() as usize).collect();
    assert_eq!(set.len(), blocks.len(), "a block was handed out twice");
    for (i, b) in blocks.iter().enumerate() {
        // SAFETY: each block is ours, at least `size` bytes, in use.
        unsafe { ptr::write_bytes(b.as_ptr(), i as u8, size) };
    }
    for (i, b) in blocks.iter().enumerate() {
        // SAFETY: as above.
        let s = unsafe { std::slice::from_raw_parts(b.as_ptr(), size) };
        assert!(s.iter().all(|&x| x == i as u8), "block {i} overwritten");
    }
}

/// Small blocks (chained through each other): distinct, drained to and
/// refilled from the depot, mixed with frees through another cache.
#[test]
fn cache_round_trips_through_the_depot() {
    let pool = RawBlockPool::new(48, 16).unwrap();
    {
        let depot = Depot::new(&pool);
        assert!(!depot.parks_magazines());
        {
            let c = depot.cache();
            let a: Vec<NonNull<u8>> = (0..1000).map(|_| c.alloc()).collect();
            distinct_and_writable(&a, 48);
            let other = depot.cache();
            for (i, b) in a.into_iter().enumerate() {
                // SAFETY: allocated above, freed once (half via the other cache).
                unsafe {
                    if i % 2 == 0 {
                        c.free(b)
                    } else {
                        other.free(b)
                    }
                }
                assert!(c.cached() <= 2 * MAGAZINE);
            }
            drop(other);
            let again: Vec<NonNull<u8>> = (0..1000).map(|_| c.alloc()).collect();
            distinct_and_writable(&again, 48);
            assert_eq!(pool.chunks(), 1, "grew although 1000 blocks were free");
            for b in again {
                // SAFETY: allocated above, freed once.
                unsafe { c.free(b) };
            }
        }
        // Every block taken from the pool (whole magazines) is parked.
        assert!(depot.parked() >= 1000);
        assert_eq!(
            depot.parked(),
            pool.active(),
            "cache drop did not park its blocks"
        );
    }
    assert_eq!(pool.active(), 0, "depot drop did not return its blocks");
}

/// Blocks large enough to park whole magazines: out through a cache, back
/// as magazines, out again through another cache, never handed out twice
/// and without growing.
#[test]
fn parked_magazines_round_trip() {
    for size in [256usize, 300, 4096] {
        let pool = RawBlockPool::new(size, 8).unwrap();
        let n = 10 * MAGAZINE + 5;
        {
            let depot = Depot::new(&pool);
            assert!(depot.parks_magazines());
            {
                let c = depot.cache();
                let v: Vec<NonNull<u8>> = (0..n).map(|_| c.alloc()).collect();
                distinct_and_writable(&v, size);
                for b in v {
                    // SAFETY: allocated above, freed once.
                    unsafe { c.free(b) };
                }
            }
            // The pool hands out whole magazines: n rounded up.
            let parked = depot.parked();
            assert_eq!(parked, n.next_multiple_of(MAGAZINE));
            assert_eq!(pool.active(), parked);
            let chunks = pool.chunks();
            let c = depot.cache();
            let got: Vec<NonNull<u8>> = (0..parked).map(|_| c.alloc()).collect();
            distinct_and_writable(&got, size);
            assert_eq!(
                pool.active(),
                parked,
                "size {size}: parked blocks not reused"
            );
            assert_eq!(
                pool.chunks(),
                chunks,
                "grew although {parked} blocks were free"
            );
            for b in got {
                // SAFETY: allocated above, freed once.
                unsafe { c.free(b) };
            }
        }
        assert_eq!(pool.active(), 0, "size {size}: blocks not returned");
    }
}

/// Several threads, each with its own cache over one depot.
#[test]
fn caches_on_many_threads() {
    let pool = RawBlockPool::new(32, 8).unwrap();
    {
        let depot = Depot::new(&pool);
        std::thread::scope(|sc| {
            for t in 0..4usize {
                let depot = &depot;
                sc.spawn(move || {
                    let c = depot.cache();
                    let mut held = Vec::new();
                    for i in 0..30_000usize {
                        let b = c.alloc();
                        let v = (t * 7 + i) as u8;
                        // SAFETY: ours, 32 bytes, in use.
                        unsafe { ptr::write_bytes(b.as_ptr(), v, 32) };
                        held.push((b, v));
                        if i % 100 == 99 {
                            for (b, v) in held.drain(..) {
                                // SAFETY: as above.
                                let s = unsafe { std::slice::from_raw_parts(b.as_ptr(), 32) };
                                assert!(s.iter().all(|&x| x == v), "block shared");
                                // SAFETY: allocated above, freed once.
                                unsafe { c.free(b) };
                            }
                        }
                    }
                    for (b, _) in held {
                        // SAFETY: allocated above, freed once.
                        unsafe { c.free(b) };
                    }
                });
            }
        });
    }
    assert_eq!(pool.active(), 0);
}
