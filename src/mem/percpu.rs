//! An approximate per-core counter: shards with a batch, after the
//! kernel's `percpu_counter`.
//!
//! Why: every buffer allocation and free adjusts its device's memory count.
//! One shared atomic would bounce its cache line between all cores on every
//! request, and an exact read that sums every shard under a lock serialises
//! all of them near the limit — the spinlock contention Arne Welzel removed
//! from dm-crypt by switching to `percpu_counter_read_positive`.
//!
//! Layout: a folded global `count` plus one cache-line-padded delta per
//! shard. A thread adds to the shard of the CPU it is running on (read
//! from glibc's rseq area; a round-robin thread index where that is
//! missing); when the shard's
//! delta would reach `±batch` it is folded into `count` under the lock.
//! Every shard's delta therefore stays strictly inside `(-batch, batch)`, so
//! the lock-free [`PerCpuCounter::read`] differs from the true sum by at most
//! `(batch - 1) × shards` — [`PerCpuCounter::error_bound`]. The exact
//! [`PerCpuCounter::sum`] takes the lock and walks every shard: it is for
//! slow paths only (waiting, teardown checks, the benchmark's ablation).

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// One value on its own cache line (two lines: adjacent-line prefetch).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub T);

/// Per-core sharded counter; see the module docs.
pub struct PerCpuCounter {
    count: Padded<AtomicI64>,
    shards: Box<[Padded<AtomicI64>]>,
    mask: usize,
    batch: i64,
    fold: Mutex<()>,
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's shard hint: assigned round robin on first use.
#[inline]
fn thread_index() -> usize {
    THREAD_INDEX.with(|c| {
        let v = c.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT_THREAD.fetch_add(1, Relaxed);
        c.set(v);
        v
    })
}

/// The shard to count on: the CPU this thread runs on, as the kernel's
/// per-CPU counters do, so threads on different cores never write the same
/// cache line, and threads sharing a core (more threads than cores) share
/// a shard without contending. glibc answers `sched_getcpu` from the rseq
/// area the kernel keeps current (a load, no system call). Where that is
/// unavailable, a round-robin thread index stands in. A migration between
/// reading the CPU and updating the shard is harmless: the update is a
/// compare-exchange, so it only costs a shared cache line once.
#[inline]
fn shard_hint() -> usize {
    // SAFETY: sched_getcpu takes no arguments and has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu >= 0 {
        cpu as usize
    } else {
        thread_index()
    }
}

/// Online CPUs (at least 1).
pub fn cpu_count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Default shard count: one per CPU, rounded up to a power of two, 1..=256.
pub fn default_shards() -> usize {
    cpu_count().clamp(1, 256).next_power_of_two()
}

/// The kernel's `percpu_counter_batch`: max(32, 2 × CPUs).
pub fn default_batch() -> i64 {
    (2 * cpu_count() as i64).max(32)
}

impl PerCpuCounter {
    /// A counter with [`default_shards`] shards and the given batch (>= 1).
    pub fn new(batch: i64) -> PerCpuCounter {
        Self::with_shards(batch, default_shards())
    }

    /// A counter with an explicit shard count (rounded up to a power of two).
    pub fn with_shards(batch: i64, shards: usize) -> PerCpuCounter {
        let n = shards.clamp(1, 1 << 16).next_power_of_two();
        PerCpuCounter {
            count: Padded(AtomicI64::new(0)),
            shards: (0..n).map(|_| Padded(AtomicI64::new(0))).collect(),
            mask: n - 1,
            batch: batch.max(1),
            fold: Mutex::new(()),
        }
    }

    pub fn batch(&self) -> i64 {
        self.batch
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Largest possible |read() - sum()|: (batch - 1) × shards.
    pub fn error_bound(&self) -> u64 {
        (self.batch as u64 - 1) * self.shards.len() as u64
    }

    /// Add `amount` (may be negative) on the shard of the CPU this thread
    /// runs on.
    #[inline]
    pub fn add(&self, amount: i64) {
        self.add_on(shard_hint(), amount)
    }

    /// Add on a chosen shard (tests and benchmarks pin shards with this).
    #[inline]
    pub fn add_on(&self, shard: usize, amount: i64) {
        let s = &self.shards[shard & self.mask].0;
        let mut cur = s.load(Relaxed);
        loop {
            let new = cur.saturating_add(amount);
            if new.abs() >= self.batch {
                break;
            }
            match s.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(v) => cur = v,
            }
        }
        self.fold_in(s, amount);
    }

    #[cold]
    fn fold_in(&self, s: &AtomicI64, amount: i64) {
        let _g = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        // Move the whole local delta plus this amount into `count`: the sum
        // is unchanged and the shard restarts from 0, inside the bound.
        let local = s.swap(0, Relaxed);
        self.count.0.fetch_add(local + amount, Relaxed);
    }

    /// Approximate value, lock-free, one load (`percpu_counter_read`).
    #[inline]
    pub fn read(&self) -> i64 {
        self.count.0.load(Relaxed)
    }

    /// Approximate value clamped at 0 (`percpu_counter_read_positive`).
    #[inline]
    pub fn read_positive(&self) -> u64 {
        self.read().max(0) as u64
    }

    /// Exact value: takes the lock and adds every shard
    /// (`percpu_counter_sum`). Slow paths only.
    pub fn sum(&self) -> i64 {
        let _g = self.fold.lock().unwrap_or_else(|e| e.into_inner());
        self.count.0.load(Relaxed) + self.shards.iter().map(|s| s.0.load(Relaxed)).sum::<i64>()
    }

    /// Compare with `rhs` like `__percpu_counter_compare`: decide from the
    /// rough count when it is further than the error bound from `rhs`,
    /// otherwise from the exact sum (which is what contends near a limit).
    pub fn compare(&self, rhs: i64) -> std::cmp::Ordering {
        let rough = self.read();
        let bound = self.error_bound() as i64;
        if (rough - rhs).abs() > bound {
            rough.cmp(&rhs)
        } else {
            self.sum().cmp(&rhs)
        }
    }
}

impl std::fmt::Debug for PerCpuCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerCpuCounter")
            .field("approx", &self.read())
            .field("shards", &self.shards.len())
            .field("batch", &self.batch)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    proptest! {
        /// After every single operation, on any shard, the lock-free read is
        /// within (batch - 1) × shards of the exact sum, which equals the
        /// true total.
        #[test]
        fn error_bound_holds(
            batch in 1i64..100,
            shards in 1usize..9,
            ops in proptest::collection::vec((0usize..16, -300i64..300), 1..400),
        ) {
            let c = PerCpuCounter::with_shards(batch, shards);
            let bound = c.error_bound() as i64;
            prop_assert_eq!(bound, (batch - 1) * c.shards() as i64);
            let mut truth = 0i64;
            for (shard, amount) in ops {
                c.add_on(shard, amount);
                truth += amount;
                prop_assert_eq!(c.sum(), truth);
                prop_assert!((c.read() - truth).abs() <= bound,
                    "read {} truth {} bound {}", c.read(), truth, bound);
            }
        }
    }

    /// The bound is tight: it can actually be reached.
    #[test]
    fn error_bound_is_reachable() {
        let c = PerCpuCounter::with_shards(32, 4);
        for s in 0..4 {
            c.add_on(s, 31);
        }
        assert_eq!(c.read(), 0);
        assert_eq!(c.sum(), 124);
        assert_eq!(c.error_bound(), 124);
        c.add_on(0, 1); // reaches the batch: folds
        assert_eq!(c.read(), 32);
        assert_eq!(c.sum(), 125);
    }

    /// Many threads adding and subtracting concurrently: the exact sum is
    /// right at the end, and the rough read was never further than the bound
    /// from what was true at quiescent points.
    #[test]
    fn concurrent_adds_are_exact_and_bounded() {
        let c = Arc::new(PerCpuCounter::with_shards(8, 2));
        let threads = 4;
        let per = 20_000i64;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        c.add(if (i + t) % 3 == 0 { -2 } else { 3 });
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let mut truth = 0;
        for t in 0..threads {
            for i in 0..per {
                truth += if (i + t) % 3 == 0 { -2 } else { 3 };
            }
        }
        assert_eq!(c.sum(), truth);
        assert!((c.read() - truth).unsigned_abs() <= c.error_bound());
    }

    #[test]
    fn compare_is_exact_near_the_threshold() {
        let c = PerCpuCounter::with_shards(32, 2);
        c.add_on(0, 31);
        c.add_on(1, 31);
        assert_eq!(c.read(), 0);
        assert_eq!(c.compare(62), std::cmp::Ordering::Equal);
        assert_eq!(c.compare(63), std::cmp::Ordering::Less);
        assert_eq!(c.compare(-1000), std::cmp::Ordering::Greater);
    }
}
