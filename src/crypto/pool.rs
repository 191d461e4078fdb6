//! A persistent pool of crypto worker threads that splits *one* request's
//! sectors across cores (ordered parallel encryption, as dm-crypt's
//! parallel processing of one bio's sectors), so a
//! single QD1 stream of large requests uses every core.
//!
//! Design points:
//! - the submitting thread does a share of the work itself and then waits,
//!   so a request completes (and a write goes down) only after all of its
//!   sectors are done: no reordering of writes is introduced;
//! - workers never wait on other work, so any number of concurrent
//!   submitters cannot deadlock the pool;
//! - threads are created once (per target), not per request: spawning costs
//!   more than encrypting a megabyte.
//!
//! - the submitter runs one part; the workers it enlisted claim the rest
//!   from a shared counter, so any number of parts spreads over the
//!   threads;
//! - idle workers and waiting submitters spin briefly before sleeping, so a
//!   stream of back-to-back requests never pays a wake-up (tens of
//!   microseconds on a VM, as long as encrypting half a megabyte).
//!
//! Work is handed over as a borrowed closure; the submitter blocks until
//! every helper has finished, which is what makes lending stack data to
//! other threads sound (see `run`).
//!
//! **Adaptive splitting.** A split only pays when the helpers run on cores
//! that would otherwise be idle. With every core already busy (several
//! streams, or a deep NBD queue) a helper only adds a thread per core and
//! costs throughput (four streams on two cores lost clearly with two
//! threads against one). So the pool counts the threads doing crypto work in the
//! whole process (submitters inside `run`, helpers enlisted), and a
//! request enlists only as many helpers as there are cores left idle; with
//! none, it runs where it is. The submitter then works through the parts
//! itself as well (parts are claimed from a shared counter), and takes
//! back the tickets no helper picked up yet.
//!
//! **Only awake helpers are enlisted.** A helper that has gone to sleep
//! (a gapped stream: its spin ran out before the next request came) is
//! not woken for the request at hand: on a virtual machine the wake-up
//! can take as long as the work it would take, and a late helper that
//! claims the last part makes the request *slower* than one thread (1 MiB
//! requests with gaps, measured: docs/BENCHMARKS.md). Instead
//! the request runs on the submitter, and the sleeper is woken after it
//! completes, to wait for the next request (up to `PREWAKE_WAIT`, yielding
//! its core to other threads after the first `SPIN`): the next request
//! finds it awake and splits. When such a wake-up finds no request, the
//! next ones back off (1, 2, 4 … 64 requests without one), so a device
//! that went quiet costs a wake-up only now and then.
//!
//! **A helper that just worked waits longer.** After finishing a part a
//! helper waits for the next request as long as one woken early (up to
//! `PREWAKE_WAIT`, yielding its core after the first `SPIN`), unless every
//! core is already doing crypto (then no request would enlist it, and it
//! sleeps at once). A stream with gaps shorter than that finds it awake and
//! splits every request: the gapped bench came close to twice one
//! thread's rate while four streams stayed level (docs/BENCHMARKS.md).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker, and a submitter waiting for its helpers, spin
/// before sleeping. Waking a sleeping thread costs tens of microseconds on
/// a virtual machine (an inter-processor interrupt through the host), as
/// much as encrypting half a megabyte; a stream of back-to-back requests
/// finds a spinning worker instead. Bounded, so an idle device costs no CPU.
const SPIN: Duration = Duration::from_micros(30);

/// Threads of the process doing crypto work right now: submitters inside
/// [`CryptPool::run`] and the helpers they enlisted (counted from the
/// moment they are enlisted until their ticket is done or taken back).
static BUSY: AtomicUsize = AtomicUsize::new(0);

/// Cores of the machine (the parallelism a split can use at most).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One `run` call; lives on the submitter's stack.
struct Request {
    /// `&'scope (dyn Fn(usize) + Sync)` with the lifetime erased.
    f: *const (dyn Fn(usize) + Sync + 'static),
    n: usize,
    /// Next part index to claim: the submitter claims one part, helpers
    /// claim parts from here until none is left.
    next: AtomicUsize,
    /// Helper tickets not finished (queued or running).
    outstanding: AtomicUsize,
    panicked: AtomicBool,
    waiter: Thread,
}

impl Request {
    /// Claim and run parts until none is left.
    fn work(&self) {
        // SAFETY: see `Job`: the closure outlives every helper's use.
        let f = unsafe { &*self.f };
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// A helper ticket: "claim parts of this request".
struct Job {
    req: *const Request,
}

// SAFETY: the request (and the closure it points to) is only touched while
// its submitter waits in `run`, which returns only after `outstanding`
// reached zero, i.e. after every ticket was finished by a worker; the
// closure is Sync and the request's fields are atomics or `Thread` (Sync).
unsafe impl Send for Job {}

/// The job queue: a ring that keeps its capacity, so handing out jobs
/// never allocates once it has grown (a channel would allocate a block
/// every few dozen messages).
struct Queue {
    jobs: Mutex<Jobs>,
    ready: Condvar,
    /// Jobs in the ring, readable without the lock by spinning workers.
    queued: AtomicUsize,
    /// Workers awake and idle (spinning for a job): the helpers a request
    /// may enlist without paying a wake-up.
    spinning: AtomicUsize,
    /// A worker was woken early for the next request and has not yet
    /// found one.
    prewoken: AtomicBool,
    /// Requests still to go without an early wake-up, and the current
    /// back-off (doubling while early wake-ups find nothing to do).
    prewake_skip: AtomicUsize,
    prewake_backoff: AtomicUsize,
}

/// How long a worker woken early waits for the next request: longer than
/// one large request takes, so a stream whose request ran alone finds the
/// worker awake for the next one.
const PREWAKE_WAIT: Duration = Duration::from_micros(400);

/// Longest back-off between early wake-ups that found no work.
const PREWAKE_BACKOFF_MAX: usize = 64;

struct Jobs {
    ring: VecDeque<Job>,
    closed: bool,
    /// Workers blocked on `ready` (the rest are running or spinning).
    sleeping: usize,
}

/// Worker threads for splitting requests.
pub struct CryptPool {
    queue: Arc<Queue>,
    workers: Vec<JoinHandle<()>>,
    /// Threads inside `run` right now.
    submitters: AtomicUsize,
    /// Enlist helpers only for idle cores (see the module doc); off: always
    /// split (the behaviour before, kept for ablations and tests).
    adaptive: AtomicBool,
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
            jobs: Mutex::new(Jobs {
                ring: VecDeque::with_capacity(4 * threads),
                closed: false,
                sleeping: 0,
            }),
            ready: Condvar::new(),
            queued: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            prewoken: AtomicBool::new(false),
            prewake_skip: AtomicUsize::new(0),
            prewake_backoff: AtomicUsize::new(0),
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
        Some(Arc::new(CryptPool {
            queue,
            workers,
            submitters: AtomicUsize::new(0),
            adaptive: AtomicBool::new(true),
        }))
    }

    /// Threads that work on one request (workers plus the submitter).
    pub fn parallelism(&self) -> usize {
        self.workers.len() + 1
    }

    /// Split only onto idle cores (`true`, the default) or always.
    pub fn set_adaptive(&self, on: bool) {
        self.adaptive.store(on, Ordering::Relaxed);
    }

    /// Call `f(i)` for every `i` in `0..n`, spread over the calling thread
    /// and as many workers as there are idle cores; returns when all calls
    /// have returned. Returns `false` if any call panicked. Parts are
    /// claimed one at a time by whoever is free, the caller included.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
        if n == 0 {
            return true;
        }
        // SAFETY: erasing the closure's lifetime is sound because this
        // function does not return before `outstanding` is zero (the wait
        // below), after which no worker touches the request or `f` again
        // (a worker clones the waiter handle before its final decrement).
        let fp: *const (dyn Fn(usize) + Sync + 'static) = unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f)
        };
        // Enlist helpers only for cores nobody uses for crypto now.
        let others = BUSY.fetch_add(1, Ordering::AcqRel);
        let adaptive = self.adaptive.load(Ordering::Relaxed);
        let idle = if adaptive {
            cores().saturating_sub(others + 1)
        } else {
            usize::MAX
        };
        let wanted = self.workers.len().min(n - 1).min(idle);
        // Adaptive: only workers that are awake (see the module doc).
        let tickets = if adaptive {
            wanted.min(self.queue.spinning.load(Ordering::Acquire))
        } else {
            wanted
        };
        self.submitters.fetch_add(1, Ordering::Relaxed);
        let req = Request {
            f: fp,
            n,
            next: AtomicUsize::new(0),
            outstanding: AtomicUsize::new(tickets),
            panicked: AtomicBool::new(false),
            waiter: std::thread::current(),
        };
        let mut sent = 0;
        let mut wake = 0;
        if tickets > 0 {
            let mut q = self.queue.jobs.lock().unwrap_or_else(|e| e.into_inner());
            if !q.closed {
                BUSY.fetch_add(tickets, Ordering::AcqRel);
                for _ in 0..tickets {
                    q.ring.push_back(Job { req: &req });
                }
                sent = tickets;
                self.queue.queued.fetch_add(tickets, Ordering::Release);
                // An enlisted worker is awake; one that fell asleep since
                // leaves its ticket to the submitter, which takes it back.
                wake = if adaptive { 0 } else { q.sleeping.min(tickets) };
            }
        }
        if sent == 0 {
            req.outstanding.store(0, Ordering::Release);
        }
        for _ in 0..wake {
            self.queue.ready.notify_one();
        }
        // Work through the parts here too: whatever a helper has not
        // claimed yet, the submitter does, so a helper that is slow to
        // wake never delays the request.
        req.work();
        if sent > 0 {
            // Take back the tickets no helper picked up: they would only
            // wake a thread to find nothing left.
            let mut q = self.queue.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let before = q.ring.len();
            let me: *const Request = &req;
            q.ring.retain(|j| !std::ptr::eq(j.req, me));
            let taken = before - q.ring.len();
            if taken > 0 {
                self.queue.queued.fetch_sub(taken, Ordering::Relaxed);
                BUSY.fetch_sub(taken, Ordering::AcqRel);
                req.outstanding.fetch_sub(taken, Ordering::AcqRel);
            }
        }
        // Spin for the helpers only when we are the pool's only submitter
        // (one stream: the wake-up would cost as much as the part). With
        // several requests in flight every core has other work, and a
        // spinning submitter only takes CPU from it (NBD writes at QD16
        // on two cores lost throughput to it), so it sleeps at once.
        let alone = self.submitters.load(Ordering::Relaxed) == 1;
        let t0 = Instant::now();
        while req.outstanding.load(Ordering::Acquire) != 0 {
            if alone && t0.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
        BUSY.fetch_sub(1, Ordering::AcqRel);
        self.submitters.fetch_sub(1, Ordering::Relaxed);
        if tickets < wanted {
            self.prewake();
        }
        !req.panicked.load(Ordering::Relaxed)
    }

    /// This request wanted a helper that was asleep: wake one now, after
    /// the request, to spin for the next one, unless recent early
    /// wake-ups found nothing to do (then wait out the back-off).
    fn prewake(&self) {
        let q = &self.queue;
        let skip = q.prewake_skip.load(Ordering::Relaxed);
        if skip > 0 {
            q.prewake_skip.store(skip - 1, Ordering::Relaxed);
            return;
        }
        let g = q.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if g.sleeping > 0 && !q.prewoken.swap(true, Ordering::AcqRel) {
            q.ready.notify_one();
        }
    }
}

fn worker(q: Arc<Queue>) {
    // Idle workers are counted in `spinning` from the moment they finish
    // a job (before the submitter can see it finished) until they take the
    // next one or go to sleep.
    q.spinning.fetch_add(1, Ordering::AcqRel);
    let mut worked = false;
    loop {
        // Spin briefly for the next job before taking the lock to sleep;
        // woken early, or just done with a part, wait for the next request
        // longer, yielding the core to anyone else who wants it (see the
        // module doc).
        let t0 = Instant::now();
        let early = worked || q.prewoken.load(Ordering::Acquire);
        worked = false;
        while q.queued.load(Ordering::Acquire) == 0 {
            let t = t0.elapsed();
            if t < SPIN {
                std::hint::spin_loop();
            } else if early && t < PREWAKE_WAIT && BUSY.load(Ordering::Relaxed) < cores() {
                // (With every core already doing crypto no request would
                // enlist this worker: sleep instead of taking their time.)
                std::thread::yield_now();
            } else {
                break;
            }
        }
        let job = {
            let mut g = q.jobs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(j) = g.ring.pop_front() {
                q.queued.fetch_sub(1, Ordering::Relaxed);
                q.spinning.fetch_sub(1, Ordering::AcqRel);
                if q.prewoken.swap(false, Ordering::AcqRel) {
                    // The early wake-up paid off: keep doing it.
                    q.prewake_backoff.store(0, Ordering::Relaxed);
                }
                j
            } else {
                if g.closed {
                    q.spinning.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                q.spinning.fetch_sub(1, Ordering::AcqRel);
                if q.prewoken.swap(false, Ordering::AcqRel) {
                    // Woken early for nothing: back off.
                    let b = q.prewake_backoff.load(Ordering::Relaxed);
                    let b = (b * 2).clamp(1, PREWAKE_BACKOFF_MAX);
                    q.prewake_backoff.store(b, Ordering::Relaxed);
                    q.prewake_skip.store(b, Ordering::Relaxed);
                }
                g.sleeping += 1;
                g = q.ready.wait(g).unwrap_or_else(|e| e.into_inner());
                g.sleeping -= 1;
                q.spinning.fetch_add(1, Ordering::AcqRel);
                continue;
            }
        };
        // SAFETY: the submitter keeps the request alive until
        // `outstanding` reaches zero, which happens only after our
        // decrement below; we clone the waiter handle before decrementing
        // and do not touch the request afterwards.
        unsafe {
            let req = &*job.req;
            req.work();
            worked = true;
            let waiter = req.waiter.clone();
            BUSY.fetch_sub(1, Ordering::AcqRel);
            q.spinning.fetch_add(1, Ordering::AcqRel);
            if req.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
                waiter.unpark();
            }
        }
    }
}

impl Drop for CryptPool {
    fn drop(&mut self) {
        // Closing the queue ends every worker's loop once it is empty.
        self.queue
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed = true;
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
        // Other tests of this process may keep the cores busy; this one is
        // about the mechanism, not the policy.
        pool.set_adaptive(false);
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

    /// With every core already doing crypto work, a request is not split:
    /// it runs entirely on the submitting thread.
    #[test]
    fn no_helpers_when_the_cores_are_busy() {
        let pool = CryptPool::new(2, "t").unwrap();
        let n = cores();
        BUSY.fetch_add(n, Ordering::AcqRel);
        let me = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        assert!(pool.run(8, &|_| {
            if std::thread::current().id() != me {
                elsewhere.fetch_add(1, Ordering::Relaxed);
            }
        }));
        BUSY.fetch_sub(n, Ordering::AcqRel);
        assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn single_thread_means_no_pool() {
        assert!(CryptPool::new(1, "t").is_none());
    }
}
