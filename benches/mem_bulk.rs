//! Bulk mempool allocation: the 256 bounce pages of a 1 MiB write taken one
//! at a time (dm-crypt's `crypt_alloc_buffer` loop) vs in one bulk call.
//! Only the allocation is timed (as a function trace of that loop would); the pages are
//! returned untimed between iterations.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use udm::mem::{Budget, MemPool, BIO_MAX_VECS};

fn bench(c: &mut Criterion) {
    let pool = MemPool::pages(Budget::new(1 << 30));
    let mut list = pool.list(BIO_MAX_VECS);
    // Warm: the pool holds its reserve plus a request's worth in cache.
    pool.alloc_bulk_into(&mut list, BIO_MAX_VECS);
    list.clear();

    let mut g = c.benchmark_group("mempool_alloc_256_pages");
    g.bench_function("one_at_a_time", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                pool.alloc_each_into(&mut list, BIO_MAX_VECS);
                t += t0.elapsed();
                black_box(list.page(BIO_MAX_VECS - 1).as_ptr());
                list.clear();
            }
            t
        })
    });
    g.bench_function("bulk", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                pool.alloc_bulk_into(&mut list, BIO_MAX_VECS);
                t += t0.elapsed();
                black_box(list.page(BIO_MAX_VECS - 1).as_ptr());
                list.clear();
            }
            t
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
