//! A persistent pool of crypto worker threads that splits *one* request's
//! sectors across cores (seed 002: dm-crypt parallel processing), so a
//! single QD1 stream of large requests uses every core.
//!
//! Design points taken from the seed discussion:
//! - the submitting thread does a share of the work itself and then waits,
//!   so a request completes (and a write goes down) only after all of its
//!   sectors are done: no reordering of writes is introduced;
//! - workers never wait on other work, so any number of concurrent
//!   submitters cannot deadlock the pool;
//! - threads are created once (per target), not per request: spawning costs
//!   more than encrypting a megabyte.
//!
//! Work is handed over as a borrowed closure; the submitter blocks until
//! every part has finished, which is what makes lending stack data to other
//! threads sound (see `run`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, Thread};

/// Completion state of one `run` call; lives on the submitter's stack.
struct Latch {
    remaining: AtomicUsize,
    panicked: AtomicBool,
    waiter: Thread,
}

/// One part of a request handed to a worker.
struct Job {
    /// `&'scope (dyn Fn(usize) + Sync)` with the lifetime erased.
    f: *const (dyn Fn(usize) + Sync + 'static),
    index: usize,
    latch: *const Latch,
}

// SAFETY: the pointers refer to a closure that is `Sync` and a latch whose
// fields are atomics or `Thread` (Sync); both outlive the job because the
// submitter waits for `remaining == 0` before returning (see `run`).
unsafe impl Send for Job {}

/// The job queue: a ring that keeps its capacity, so handing out jobs
/// never allocates once it has grown (a channel would allocate a block
/// every few dozen messages).
struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>, // (jobs, closed)
    ready: Condvar,
}

/// Worker threads for splitting requests.
pub struct CryptPool {
    queue: Arc<Queue>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for CryptPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CryptPool({} workers)", self.workers.len())
    }
}

impl CryptPool {
    /// A pool whose submitters plus `threads - 1` workers make `threads`
    /// cores of parallelism; `threads == 0` means one per available core.
    /// Returns `None` when that is a single thread (nothing to split onto).
    pub fn new(threads: usize, name: &str) -> Option<Arc<CryptPool>> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        if threads <= 1 {
            return None;
        }
        let queue = Arc::new(Queue {
            jobs: Mutex::new((VecDeque::with_capacity(4 * threads), false)),
            ready: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for i in 0..threads - 1 {
            let q = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || worker(q));
            match spawned {
                Ok(h) => workers.push(h),
                Err(e) => {
                    tracing::warn!("crypt worker thread not started: {e}");
                    break;
                }
            }
        }
        if workers.is_empty() {
            return None;
        }
        Some(Arc::new(CryptPool { queue, workers }))
    }

    /// Threads that work on one request (workers plus the submitter).
    pub fn parallelism(&self) -> usize {
        self.workers.len() + 1
    }

    /// Call `f(i)` for every `i` in `0..n`: index 0 on the calling thread,
    /// the rest on workers; returns when all calls have returned. Returns
    /// `false` if any call panicked.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        if n == 0 {
            return true;
        }
        let latch = Latch {
            remaining: AtomicUsize::new(n - 1),
            panicked: AtomicBool::new(false),
            waiter: std::thread::current(),
        };
        // SAFETY: erasing the closure's lifetime is sound because this
        // function does not return before every job has signalled the latch
        // (the wait loop below), after which no worker touches `f` or
        // `latch` again (the worker clones the waiter handle first).
        let fp: *const (dyn Fn(usize) + Sync + 'static) = unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f)
        };
        let mut sent = 1;
        {
            let mut q = self.queue.jobs.lock().unwrap_or_else(|e| e.into_inner());
            if !q.1 {
                for index in 1..n {
                    q.0.push_back(Job {
                        f: fp,
                        index,
                        latch: &latch,
                    });
                    sent += 1;
                }
            }
        }
        if sent > 1 {
            self.queue.ready.notify_all();
        }
        // Parts that could not be queued run here, after ours.
        let own = catch_unwind(AssertUnwindSafe(|| f(0))).is_ok();
        for index in sent..n {
            if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
                latch.panicked.store(true, Ordering::Relaxed);
            }
            latch.remaining.fetch_sub(1, Ordering::AcqRel);
        }
        while latch.remaining.load(Ordering::Acquire) != 0 {
            std::thread::park();
        }
        own && !latch.panicked.load(Ordering::Relaxed)
    }
}

fn worker(q: Arc<Queue>) {
    loop {
        let job = {
            let mut g = q.jobs.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = g.0.pop_front() {
                    break j;
                }
                if g.1 {
                    return;
                }
                g = q.ready.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        };
        // SAFETY: the submitter keeps `*job.f` and `*job.latch` alive until
        // `remaining` reaches zero, which happens only after our decrement
        // below; we clone the waiter handle before decrementing and do not
        // touch the latch afterwards.
        unsafe {
            let f = &*job.f;
            let latch = &*job.latch;
            if catch_unwind(AssertUnwindSafe(|| f(job.index))).is_err() {
                latch.panicked.store(true, Ordering::Relaxed);
            }
            let waiter = latch.waiter.clone();
            if latch.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                waiter.unpark();
            }
        }
    }
}

impl Drop for CryptPool {
    fn drop(&mut self) {
        // Closing the queue ends every worker's loop once it is empty.
        self.queue.jobs.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.queue.ready.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_part_once_and_waits() {
        let pool = CryptPool::new(3, "t").unwrap();
        assert_eq!(pool.parallelism(), 3);
        let mut data = vec![0u32; 64];
        let parts: Vec<Mutex<Option<&mut [u32]>>> =
            data.chunks_mut(8).map(|c| Mutex::new(Some(c))).collect();
        let ok = pool.run(parts.len(), &|i| {
            let p = parts[i].lock().unwrap().take().unwrap();
            for v in p.iter_mut() {
                *v += i as u32 + 1;
            }
        });
        assert!(ok);
        drop(parts);
        for (i, c) in data.chunks(8).enumerate() {
            assert!(c.iter().all(|&v| v == i as u32 + 1));
        }
    }

    #[test]
    fn a_panicking_part_is_reported_not_propagated() {
        let pool = CryptPool::new(2, "t").unwrap();
        let ok = pool.run(4, &|i| {
            if i == 2 {
                panic!("part 2");
            }
        });
        assert!(!ok);
        // The pool still works afterwards.
        assert!(pool.run(4, &|_| {}));
    }

    /// Part 0 (the caller) waits for part 1 to start: this only finishes
    /// quickly if part 1 really runs on another thread at the same time.
    #[test]
    fn parts_run_concurrently() {
        let pool = CryptPool::new(2, "t").unwrap();
        let started = AtomicBool::new(false);
        let saw = AtomicBool::new(false);
        let t0 = std::time::Instant::now();
        assert!(pool.run(2, &|i| {
            if i == 1 {
                started.store(true, Ordering::SeqCst);
            } else {
                while !started.load(Ordering::SeqCst)
                    && t0.elapsed() < std::time::Duration::from_secs(5)
                {
                    std::hint::spin_loop();
                }
                saw.store(started.load(Ordering::SeqCst), Ordering::SeqCst);
            }
        }));
        assert!(
            saw.load(Ordering::SeqCst),
            "part 1 did not run while part 0 was running"
        );
    }

    #[test]
    fn single_thread_means_no_pool() {
        assert!(CryptPool::new(1, "t").is_none());
    }
}
