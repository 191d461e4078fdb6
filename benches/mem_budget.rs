//! Approximate per-core counter: the budget check on every allocate/free made approximately
//! (lock-free read of the folded count) vs exactly (locked sum of every
//! shard, what `percpu_counter_compare` does near the limit), with 1, 2 and
//! 2 × CPUs threads hammering it.
//!
//! Reported time per iteration = the threads' summed CPU time / (threads ×
//! ops per thread): the CPU time one allocate/free pair costs. CPU time, not
//! wall time, because the benchmark machine is shared: wall time would count
//! time slices given to other processes. Contention (cache-line transfers,
//! lock spinning, futex calls) is CPU time and shows. A cost that does not
//! grow with the thread count scales.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use criterion::{criterion_group, BenchmarkId, Criterion};
use udm::mem::percpu::{cpu_count, default_batch, default_shards};
use udm::mem::Budget;

const PAGE: u64 = 4096;

fn hammer(budget: &Arc<Budget>, threads: usize, iters: u64, exact: bool) -> Duration {
    let start = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (b, s) = (budget.clone(), start.clone());
            std::thread::spawn(move || {
                s.wait();
                let t0 = thread_cpu_time();
                for _ in 0..iters {
                    let ok = if exact {
                        b.try_charge_exact(PAGE)
                    } else {
                        b.try_charge(PAGE)
                    };
                    if ok {
                        b.uncharge(PAGE);
                    }
                }
                thread_cpu_time() - t0
            })
        })
        .collect();
    let total: Duration = hs.into_iter().map(|h| h.join().unwrap()).sum();
    total / threads as u32
}

/// CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn bench(c: &mut Criterion) {
    let cpus = cpu_count();
    let mut counts = vec![1, 2, 2 * cpus];
    counts.dedup();
    // Batch as the kernel's percpu_counter_batch, counted in pages.
    let batch = default_batch() * PAGE as i64;
    let mut g = c.benchmark_group("budget_check_alloc_free");
    for &threads in &counts {
        for (name, exact) in [("exact", true), ("approx", false)] {
            let budget = Budget::with_batch(1 << 40, batch, default_shards());
            g.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
                b.iter_custom(|iters| hammer(&budget, t, iters, exact))
            });
            assert_eq!(budget.used_exact(), 0);
        }
    }
    g.finish();

    // The exact sum walks every shard, one per CPU: its cost grows with the
    // machine (dm-crypt's measurements were on hosts of 96-256 CPUs). One thread, shard counts
    // standing in for CPU counts.
    let mut g = c.benchmark_group("budget_check_vs_cpus");
    for shards in [2usize, 16, 64, 256] {
        for (name, exact) in [("exact", true), ("approx", false)] {
            let budget = Budget::with_batch(1 << 40, batch, shards);
            g.bench_with_input(BenchmarkId::new(name, shards), &shards, |b, _| {
                b.iter_custom(|iters| hammer(&budget, 1, iters, exact))
            });
        }
    }
    g.finish();
}

/// `UDM_BUDGET_OPS=N UDM_BUDGET_MODE=exact|approx`: run N pairs on one
/// thread and exit, for instruction counting under callgrind
/// (bench/mem.sh --callgrind).
fn callgrind_mode() -> bool {
    let Ok(ops) = std::env::var("UDM_BUDGET_OPS") else {
        return false;
    };
    let ops: u64 = ops.parse().expect("UDM_BUDGET_OPS must be a number");
    let exact = std::env::var("UDM_BUDGET_MODE").as_deref() == Ok("exact");
    let budget = Budget::with_batch(1 << 40, default_batch() * PAGE as i64, default_shards());
    for _ in 0..ops {
        let ok = if exact {
            budget.try_charge_exact(PAGE)
        } else {
            budget.try_charge(PAGE)
        };
        if ok {
            budget.uncharge(PAGE);
        }
    }
    true
}

fn main() {
    if callgrind_mode() {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench
}
