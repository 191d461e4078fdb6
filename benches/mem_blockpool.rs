//! Fixed-size block pool in dmapool_test's shape: for each (size, blocks)
//! allocate all blocks, then free them all; one iteration = one such round.
//! Block pool (free stack linked through the free blocks) vs the system
//! allocator. `blockpool` takes the pool's lock per operation (as dmapool
//! does, and as udm's request path does); `blockpool_local` goes through a
//! per-thread cache kept here in `benches/` (`support/block_cache.rs`),
//! which visits a lock once per 32 blocks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use udm::mem::RawBlockPool;

// Shared with tests/bench_block_cache.rs, which uses more of it.
#[allow(dead_code)]
#[path = "support/block_cache.rs"]
mod block_cache;

/// dmapool_test's parameter sets (size, blocks) with 4 KiB pages.
const CASES: [(usize, usize); 5] = [
    (16, 8192),
    (64, 8192),
    (256, 8192),
    (1024, 2048),
    (4096, 1024),
];
const ALIGN: usize = 8;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("dmapool_test");
    for (size, blocks) in CASES {
        let id = format!("{size}x{blocks}");
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        let mut ptrs: Vec<*mut u8> = Vec::with_capacity(blocks);
        g.bench_function(BenchmarkId::new("system", &id), |b| {
            b.iter(|| {
                for _ in 0..blocks {
                    // SAFETY: layout has non-zero size.
                    let p = unsafe { System.alloc(layout) };
                    assert!(!p.is_null());
                    ptrs.push(p);
                }
                black_box(&ptrs);
                for p in ptrs.drain(..) {
                    // SAFETY: p came from System.alloc with this layout.
                    unsafe { System.dealloc(p, layout) };
                }
            })
        });
        let pool = RawBlockPool::new(size, ALIGN).unwrap();
        let mut blks: Vec<NonNull<u8>> = Vec::with_capacity(blocks);
        g.bench_function(BenchmarkId::new("blockpool", &id), |b| {
            b.iter(|| {
                for _ in 0..blocks {
                    blks.push(pool.alloc());
                }
                black_box(&blks);
                for p in blks.drain(..) {
                    // SAFETY: p came from pool.alloc and is freed once.
                    unsafe { pool.free(p) };
                }
            })
        });
        let depot = block_cache::Depot::new(&pool);
        g.bench_function(BenchmarkId::new("blockpool_local", &id), |b| {
            let local = depot.cache();
            b.iter(|| {
                for _ in 0..blocks {
                    blks.push(local.alloc());
                }
                black_box(&blks);
                for p in blks.drain(..) {
                    // SAFETY: p came from the pool through the cache, freed once.
                    unsafe { local.free(p) };
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
