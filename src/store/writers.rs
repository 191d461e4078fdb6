//! A few threads of a file store that run its buffered writes with
//! `pwrite`, for files whose filesystem cannot take a buffered write
//! without blocking (ext4 and most others: `RWF_NOWAIT` gives
//! `EOPNOTSUPP`).
//!
//! Why not the ring for those writes: io_uring cannot try such a write
//! inline, so it hands every one to its io-wq workers, and there it
//! serialises the writes of one inode on one worker (io-wq "hashes"
//! buffered writes to regular files), which then posts a completion that
//! wakes the store's completion thread, which sends the reply: two thread
//! hand-offs per write, one write at a time. 4 KiB random writes at QD32
//! on ext4 (linear and LUKS) ran behind nbdkit's file plugin, whose 16
//! threads call `pwrite` themselves (docs/SCALING.md has the
//! measurements). Here the thread that writes also completes the request
//! (sends its reply): one hand-off, and none while the queue is never
//! empty, which is the case at a deep queue depth.
//!
//! Jobs are closures that own everything they touch; the store keeps the
//! buffers and itself alive until each job's completion has run (the
//! contract of [`crate::core::BlockDevice::submit`]).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Writer threads per store unless `UDM_FILE_WRITERS` says otherwise.
/// One: the filesystem runs the buffered writes of one file one at a time
/// anyway (ext4 holds the inode lock across the copy into the page
/// cache), and on two vCPUs one writer beat two or four, which contend
/// for that lock (docs/BENCHMARKS.md).
pub const DEFAULT_WRITERS: usize = 1;

/// Largest write run on a lone client's event loop: about where the
/// copy into the page cache starts to cost more than the hand-off saves.
pub const SOLE_INLINE_MAX: usize = 32 << 10;

/// The environment variable for the A/B of this choice: `ring` (writes as
/// ring entries) or a thread count.
pub const ENV: &str = "UDM_FILE_WRITERS";

/// How a file store on the io_uring path runs its submitted buffered
/// writes (reads always take the ring).
#[derive(Debug)]
pub enum Writes {
    /// As ring entries: where the filesystem takes buffered writes
    /// without blocking (XFS, btrfs), the kernel does them inline.
    Ring,
    /// `pwrite` on the store's writer threads.
    Threads(Writers),
}

impl Writes {
    /// The choice for a writable, buffered regular file on the ring path.
    pub fn for_file(file: &File, path: &Path) -> Writes {
        const XFS: i64 = 0x5846_5342;
        const BTRFS: i64 = 0x9123_683E;
        // SAFETY: fstatfs writes one statfs struct into the zeroed local.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open and `st` is a live, writable struct.
        let known = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } == 0;
        let n = match std::env::var(ENV) {
            Ok(v) if v == "ring" => return Writes::Ring,
            Ok(v) => match v.parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => n,
                _ => {
                    tracing::warn!(
                        "{ENV}={v}: give 'ring' or a thread count from 1 to 64; using {DEFAULT_WRITERS}"
                    );
                    DEFAULT_WRITERS
                }
            },
            Err(_) if known && matches!(st.f_type as i64, XFS | BTRFS) => return Writes::Ring,
            Err(_) => DEFAULT_WRITERS,
        };
        match Writers::new(n) {
            // The default also runs a lone client's writes on its own
            // event loop (`core::sole`); a count given explicitly means
            // threads only, for the A/B.
            Ok(w) => Writes::Threads(w.inline_when_sole(std::env::var_os(ENV).is_none())),
            Err(e) => {
                tracing::warn!(
                    "{}: cannot start writer threads ({e}); writes go through the ring",
                    path.display()
                );
                Writes::Ring
            }
        }
    }

    /// Writer threads (0: none).
    pub fn threads(&self) -> usize {
        match self {
            Writes::Threads(w) => w.threads(),
            _ => 0,
        }
    }
}

/// One write and its completion.
pub type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Threads waiting on the condition variable.
    idle: usize,
    stop: bool,
}

struct Inner {
    q: Mutex<Queue>,
    cv: Condvar,
}

/// The threads and their queue.
pub struct Writers {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    /// Run a job on the submitting thread when that is an event loop
    /// reading for one client only ([`crate::core::sole`]).
    sole_inline: bool,
}

impl std::fmt::Debug for Writers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writers")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Writers {
    /// `n` threads (at least one).
    pub fn new(n: usize) -> std::io::Result<Writers> {
        let inner = Arc::new(Inner {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let mut w = Writers {
            inner,
            threads: Vec::new(),
            sole_inline: false,
        };
        for _ in 0..n.max(1) {
            let inner = w.inner.clone();
            w.threads.push(
                std::thread::Builder::new()
                    .name("udm-write".into())
                    .spawn(move || work(&inner))?,
            );
        }
        Ok(w)
    }

    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Let a lone client's event loop run its jobs itself (see
    /// [`Writers::run`]).
    pub fn inline_when_sole(mut self, on: bool) -> Writers {
        self.sole_inline = on;
        self
    }

    /// Whether a lone client's jobs run on its event loop.
    pub fn sole_inline(&self) -> bool {
        self.sole_inline
    }

    /// Queue `job`; an idle thread is woken only if there is one (a busy
    /// thread takes it next). On an event loop that reads for one client
    /// only, the job runs right here unless told otherwise
    /// ([`crate::core::sole`], [`Writers::inline_when_sole`]).
    ///
    /// For a write of `len` bytes: only one of at most
    /// [`SOLE_INLINE_MAX`] runs on a lone client's event loop. A larger
    /// one goes to the writer thread even then, so the loop receives the
    /// next request while the filesystem copies this one (1 MiB writes
    /// at QD16 on ext4 were clearly faster handed off, same run).
    pub fn run(&self, len: usize, job: Job) {
        if self.sole_inline && len <= SOLE_INLINE_MAX && crate::core::sole::sole_client() {
            return job();
        }
        let mut q = self.inner.q.lock().unwrap_or_else(|p| p.into_inner());
        q.jobs.push_back(job);
        let wake = q.idle > 0;
        drop(q);
        if wake {
            self.inner.cv.notify_one();
        }
    }
}

fn work(inner: &Inner) {
    loop {
        let job = {
            let mut q = inner.q.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.stop {
                    return;
                }
                q.idle += 1;
                q = inner.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                q.idle -= 1;
            }
        };
        // A job carries device code (a layer's prepare step, its
        // completion): a panic there fails that request, not this thread,
        // which the other files' writes still need.
        crate::core::fault::run_callback("a file writer thread", job);
    }
}

impl Drop for Writers {
    /// Let the threads finish what is queued (nothing, normally: every
    /// caller keeps the store alive until its write completed) and end.
    /// Dropped on one of these threads (the last reference to the store
    /// went in a completion), that thread is left to end on its own.
    fn drop(&mut self) {
        self.inner.q.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.inner.cv.notify_all();
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_job_runs_once_and_drop_waits_for_the_queue() {
        let n = Arc::new(AtomicUsize::new(0));
        let w = Writers::new(3).unwrap();
        assert_eq!(w.threads(), 3);
        for _ in 0..1000 {
            let n = n.clone();
            w.run(
                0,
                Box::new(move || {
                    n.fetch_add(1, Ordering::Relaxed);
                }),
            );
        }
        drop(w);
        assert_eq!(n.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn a_job_may_drop_the_last_reference_to_its_own_pool() {
        let w = Arc::new(Writers::new(1).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let held = w.clone();
        let slot = Arc::new(Mutex::new(Some(held)));
        let s2 = slot.clone();
        drop(w);
        let job: Job = Box::new(move || {
            // The pool's last reference goes here, on its own thread.
            let pool = s2.lock().unwrap().take();
            drop(pool);
            tx.send(()).unwrap();
        });
        slot.lock().unwrap().as_ref().unwrap().run(0, job);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the job ran and the drop did not wait for itself");
    }
}
