//! One io_uring per file store: the file's reads, writes, syncs and
//! fallocates go to the kernel as submission entries and come back as
//! completions, so no thread waits inside a syscall for the disk.
//!
//! Why a ring and not more threads: a `pwrite` into a file on a disk
//! filesystem can block for milliseconds in writeback throttling, and a
//! worker blocked there serves nobody. With the ring the engine starts a
//! request on the connection's reader ([`Ring::start`]) and the reply goes
//! out from whichever thread sees the completion; the kernel does the
//! waiting (inline for page-cache hits, in its own workers otherwise).
//!
//! Buffered writes to a file whose filesystem cannot take them without
//! blocking (ext4) do not come here: the kernel would punt each to io-wq
//! and run them one at a time, so the store gives them a writer thread
//! (`writers.rs`).
//!
//! Who reaps: the thread that submitted looks at the completion queue
//! right after `io_uring_enter` returns, because a page-cache hit has
//! completed by then: a 4 KiB read at QD1 is answered on the reader
//! without any thread switch. Everything else is reaped by the ring's
//! completion thread, which sleeps in `io_uring_enter` until a completion
//! arrives; it waits there only while an entry is outstanding (else on a
//! condition variable, woken by a submitter whose entry did not complete
//! at once), because a thread asleep in the ring is woken by every
//! completion, also those the submitter reaps itself: at QD1 that was one
//! useless thread switch per request. Synchronous calls (the [`crate::core::BlockDevice`] methods run
//! by the engine's workers) submit the same way and park until their
//! entry completes.
//!
//! The file is registered as the ring's fixed file 0 (the kernel skips the
//! descriptor lookup per entry). Registered buffers are not used: the
//! engine's payload buffers come and go with the pool's size classes (a
//! buffer freed while registered would keep its old pages pinned, and a
//! fixed read into its address range would land in them), and for
//! page-cache I/O, nearly all of this store's, a fixed buffer saves no
//! page pinning: the kernel copies into user memory either way. fio on
//! the same ext4 file showed no consistent gain (docs/BENCHMARKS.md).
//! SQPOLL was measured and not kept: on two vCPUs its polling thread took
//! many times the server CPU per 4 KiB read for fewer IOPS
//! (docs/BENCHMARKS.md).
//! IOPOLL needs O_DIRECT on a polled block queue.

use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{JoinHandle, Thread};

use io_uring::{opcode, squeue, types, IoUring};

/// Submission queue entries; the completion queue is twice that. The
/// engine keeps at most the store's queue depth of submitted requests in
/// flight plus one synchronous call per worker, and a full queue is
/// submitted and retried, never an error.
const ENTRIES: u32 = 256;

/// Tag in the low bit of `user_data`: a parked synchronous caller (set)
/// or a boxed completion (clear). 0 is the stop entry's wake-up.
const WAITER: u64 = 1;

/// A completion handed the result (`res` of the CQE: bytes, or -errno).
pub type Done = Box<dyn FnOnce(i32) + Send>;

/// A synchronous caller waiting for its entry.
struct Waiter {
    result: AtomicI32,
    done: AtomicBool,
    thread: Thread,
}

struct Inner {
    ring: IoUring,
    /// Held while entries are pushed and submitted: the submission queue
    /// has one producer at a time.
    sq: Mutex<()>,
    /// Held while completions are taken off the queue (not while they
    /// run): the completion queue has one consumer at a time.
    cq: Mutex<()>,
    stop: AtomicBool,
    /// Entries pushed and not yet reaped.
    pending: AtomicUsize,
    /// The completion thread waits on `wake` (true) rather than in the
    /// ring, because nothing was outstanding.
    idle: Mutex<bool>,
    wake: Condvar,
    /// Whether the file is registered (fixed file 0).
    fixed: bool,
    fd: RawFd,
}

/// A ring bound to one open file. The file must outlive the ring (the
/// store owns both and drops the ring first).
pub struct Ring {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fixed", &self.inner.fixed)
            .finish()
    }
}

/// The operations the file store submits.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Read { buf: *mut u8, len: u32 },
    Write { buf: *const u8, len: u32 },
    Writev { iov: *const libc::iovec, n: u32 },
    Fdatasync,
    Fallocate { mode: i32, len: u64 },
}

impl Ring {
    /// A ring for `fd`, or why this kernel cannot give one (io_uring
    /// missing or disabled by `kernel.io_uring_disabled`, or an opcode the
    /// store needs unknown to it): the caller falls back to the syscalls.
    pub fn new(fd: RawFd) -> io::Result<Ring> {
        let ring = IoUring::builder().dontfork().build(ENTRIES)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Read::CODE, "READ"),
            (opcode::Write::CODE, "WRITE"),
            (opcode::Writev::CODE, "WRITEV"),
            (opcode::Fsync::CODE, "FSYNC"),
            (opcode::Fallocate::CODE, "FALLOCATE"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("the kernel's io_uring has no {name} operation"),
                ));
            }
        }
        let fixed = ring.submitter().register_files(&[fd]).is_ok();
        let inner = Arc::new(Inner {
            ring,
            sq: Mutex::new(()),
            cq: Mutex::new(()),
            stop: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            idle: Mutex::new(false),
            wake: Condvar::new(),
            fixed,
            fd,
        });
        let thread = std::thread::Builder::new()
            .name("udm-uring".into())
            .spawn({
                let inner = inner.clone();
                move || completion_loop(&inner)
            })?;
        Ok(Ring {
            inner,
            thread: Some(thread),
        })
    }

    /// Start `op` at `offset`; `done` gets the result on whatever thread
    /// sees the completion (possibly this one, before `start` returns).
    ///
    /// # Safety
    ///
    /// The memory `op` points to must stay valid, and untouched by others,
    /// until `done` runs.
    pub unsafe fn start(&self, op: Op, offset: u64, done: Done) {
        let tag = Box::into_raw(Box::new(done)) as u64;
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.inner.push(op, offset, tag) {
            self.inner.pending.fetch_sub(1, Ordering::SeqCst);
            // SAFETY: the entry was not queued, so the box is still ours.
            let done = unsafe { Box::from_raw(tag as *mut Done) };
            done(-e.raw_os_error().unwrap_or(libc::EIO));
            return;
        }
        self.inner.reap();
        self.inner.kick();
    }

    /// Run `op` at `offset` and wait for it: the result of the CQE.
    ///
    /// # Safety
    ///
    /// As [`Ring::start`]; the borrow ends when this returns.
    pub unsafe fn run(&self, op: Op, offset: u64) -> i32 {
        let w = Waiter {
            result: AtomicI32::new(0),
            done: AtomicBool::new(false),
            thread: std::thread::current(),
        };
        let tag = &w as *const Waiter as u64 | WAITER;
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.inner.push(op, offset, tag) {
            self.inner.pending.fetch_sub(1, Ordering::SeqCst);
            return -e.raw_os_error().unwrap_or(libc::EIO);
        }
        self.inner.reap();
        self.inner.kick();
        while !w.done.load(Ordering::Acquire) {
            std::thread::park();
        }
        w.result.load(Ordering::Relaxed)
    }

    /// Whether the file is registered with the ring (fixed file).
    pub fn fixed_file(&self) -> bool {
        self.inner.fixed
    }
}

impl Drop for Ring {
    /// Stop the completion thread: a no-op entry wakes it, it sees the
    /// flag. Nothing is in flight here (every caller keeps the store alive
    /// until its completion ran). Dropped on the completion thread itself
    /// (the last reference went in a completion), the thread is left to
    /// end on its own.
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        let entry = opcode::Nop::new().build().user_data(0);
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        let woke = {
            let _g = self.inner.sq.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: pushes are serialised by `sq`; a no-op refers to no
            // memory.
            let pushed = unsafe { self.inner.ring.submission_shared().push(&entry) }.is_ok();
            pushed && self.inner.ring.submit().is_ok()
        };
        self.inner.kick();
        if let Some(t) = self.thread.take() {
            if woke && t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Inner {
    fn entry(&self, op: Op, offset: u64) -> squeue::Entry {
        macro_rules! on_file {
            ($b:expr) => {
                if self.fixed {
                    $b(types::Fixed(0)).build()
                } else {
                    $b(types::Fd(self.fd)).build()
                }
            };
        }
        match op {
            Op::Read { buf, len } => {
                on_file!(|f| opcode::Read::new(f, buf, len).offset(offset))
            }
            Op::Write { buf, len } => {
                on_file!(|f| opcode::Write::new(f, buf, len).offset(offset))
            }
            Op::Writev { iov, n } => {
                on_file!(|f| opcode::Writev::new(f, iov, n).offset(offset))
            }
            Op::Fdatasync => {
                on_file!(|f| opcode::Fsync::new(f).flags(types::FsyncFlags::DATASYNC))
            }
            Op::Fallocate { mode, len } => {
                on_file!(|f| opcode::Fallocate::new(f, len).offset(offset).mode(mode))
            }
        }
    }

    /// Queue one entry and submit it, making room first if the queue is
    /// full (submit what is there; the kernel takes entries at once).
    fn push(&self, op: Op, offset: u64, tag: u64) -> io::Result<()> {
        let entry = self.entry(op, offset).user_data(tag);
        let transient = |e: &io::Error| {
            matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
            )
        };
        let _g = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        let push = || {
            // SAFETY: pushes are serialised by `sq`, held here; the
            // entry's memory is the caller's to keep valid (`Ring::start`).
            unsafe { self.ring.submission_shared().push(&entry) }.is_ok()
        };
        while !push() {
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if transient(&e) => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                // EBUSY/EAGAIN: completions must be reaped first; the
                // completion thread is on it.
                Err(e) if transient(&e) => std::thread::yield_now(),
                Err(e) => {
                    // Queued: the next submit (any caller's) takes it.
                    tracing::warn!("io_uring submit: {e}");
                    return Ok(());
                }
            }
        }
    }

    /// Make sure the completion thread waits in the ring when something
    /// is outstanding (wake it from its condition variable).
    fn kick(&self) {
        if self.pending.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if *idle {
            *idle = false;
            self.wake.notify_one();
        }
    }

    /// Take every completion there is and finish each (outside the lock).
    /// Returns how many there were.
    fn reap(&self) -> usize {
        let mut got = [(0u64, 0i32); 32];
        let mut total = 0;
        loop {
            let n = {
                let Ok(_g) = self.cq.try_lock() else {
                    return total;
                };
                // SAFETY: completions are taken by one thread at a time
                // (`cq`).
                let cq = unsafe { self.ring.completion_shared() };
                let mut n = 0;
                for (slot, c) in got.iter_mut().zip(cq) {
                    *slot = (c.user_data(), c.result());
                    n += 1;
                }
                n
            };
            if n == 0 {
                return total;
            }
            self.pending.fetch_sub(n, Ordering::SeqCst);
            for &(tag, res) in &got[..n] {
                finish(tag, res);
            }
            total += n;
        }
    }
}

/// Hand one completion to whoever waits for it.
fn finish(tag: u64, res: i32) {
    if tag == 0 {
        return;
    }
    if tag & WAITER != 0 {
        // SAFETY: the waiter lives on its caller's stack until `done` is
        // set, and the caller does not return before that; the thread
        // handle is cloned before the flag lets the caller go.
        let w = unsafe { &*((tag & !WAITER) as *const Waiter) };
        let thread = w.thread.clone();
        w.result.store(res, Ordering::Relaxed);
        w.done.store(true, Ordering::Release);
        thread.unpark();
    } else {
        // SAFETY: the box leaked by `Ring::start`, reclaimed exactly once
        // (each entry completes once).
        let done = unsafe { Box::from_raw(tag as *mut Done) };
        // Device code (a layer's completion) runs here, on a thread every
        // file shares: its panic fails that request, not this thread.
        crate::core::fault::run_callback("the io_uring completion path", move || done(res));
    }
}

/// The completion thread: sleep until something completes, finish it.
fn completion_loop(inner: &Inner) {
    loop {
        if inner.reap() == 0 {
            if inner.stop.load(Ordering::Acquire) {
                return;
            }
            if inner.pending.load(Ordering::SeqCst) == 0 {
                let mut idle = inner.idle.lock().unwrap_or_else(|p| p.into_inner());
                *idle = true;
                while *idle
                    && inner.pending.load(Ordering::SeqCst) == 0
                    && !inner.stop.load(Ordering::Acquire)
                {
                    idle = inner.wake.wait(idle).unwrap_or_else(|p| p.into_inner());
                }
                *idle = false;
                continue;
            }
            match inner.ring.submitter().submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    tracing::error!("io_uring wait failed: {e}; file requests may hang");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;

    #[test]
    fn reads_writes_syncs_and_punches_through_the_ring() {
        let f = tempfile::tempfile_in("/var/tmp").unwrap();
        f.set_len(1 << 20).unwrap();
        let ring = Ring::new(f.as_raw_fd()).expect("io_uring on this kernel");
        let data = vec![0x5au8; 8192];
        // SAFETY: `data` outlives the call.
        let n = unsafe {
            ring.run(
                Op::Write {
                    buf: data.as_ptr(),
                    len: 8192,
                },
                4096,
            )
        };
        assert_eq!(n, 8192);
        // SAFETY: no memory.
        assert_eq!(unsafe { ring.run(Op::Fdatasync, 0) }, 0);
        let mut back = vec![0u8; 8192];
        f.read_exact_at(&mut back, 4096).unwrap();
        assert!(back == data);
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: no memory.
        let r = unsafe { ring.run(Op::Fallocate { mode, len: 4096 }, 4096) };
        assert_eq!(r, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut buf = vec![1u8; 8192];
        // SAFETY: `buf` is not touched until the completion has been
        // received below.
        unsafe {
            ring.start(
                Op::Read {
                    buf: buf.as_mut_ptr(),
                    len: 8192,
                },
                4096,
                Box::new(move |r| tx.send(r).unwrap()),
            )
        };
        assert_eq!(rx.recv().unwrap(), 8192);
        assert!(buf[..4096].iter().all(|&b| b == 0), "the punched hole");
        assert!(buf[4096..].iter().all(|&b| b == 0x5a));
        // Errors come back as -errno.
        let bad = tempfile::tempfile().unwrap();
        let ro = std::fs::File::open(format!("/proc/self/fd/{}", bad.as_raw_fd())).unwrap();
        let ring2 = Ring::new(ro.as_raw_fd()).unwrap();
        // SAFETY: `data` outlives the call.
        let e = unsafe {
            ring2.run(
                Op::Write {
                    buf: data.as_ptr(),
                    len: 512,
                },
                0,
            )
        };
        assert_eq!(e, -libc::EBADF);
    }

    #[test]
    fn many_threads_share_one_ring() {
        let f = Arc::new(tempfile::tempfile_in("/var/tmp").unwrap());
        f.set_len(64 << 20).unwrap();
        let ring = Arc::new(Ring::new(f.as_raw_fd()).unwrap());
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let at = (t as u64 * 200 + i) * 4096;
                        let data = [t ^ i as u8; 4096];
                        // SAFETY: `data` outlives the call.
                        let n = unsafe {
                            ring.run(
                                Op::Write {
                                    buf: data.as_ptr(),
                                    len: 4096,
                                },
                                at,
                            )
                        };
                        assert_eq!(n, 4096);
                        let mut back = [0u8; 4096];
                        // SAFETY: `back` outlives the call.
                        let n = unsafe {
                            ring.run(
                                Op::Read {
                                    buf: back.as_mut_ptr(),
                                    len: 4096,
                                },
                                at,
                            )
                        };
                        assert_eq!(n, 4096);
                        assert!(back == data);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(ring);
        assert_eq!(Arc::strong_count(&f), 1);
    }
}
