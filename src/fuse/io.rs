//! FUSE requests into the engine: the same calls an NBD connection makes
//! (admission, a charged buffer, `submit_or_run`), with the FUSE reply
//! object kept under the request's tag until the engine hands the request
//! back to [`Replies`], the front end's [`Sink`].
//!
//! A FUSE thread may block in admission (it is ours, not a client's
//! socket loop), so a refused request waits on a condition the engine's
//! waker signals instead of parking a connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use fuser::{Errno, ReplyData, ReplyEmpty, ReplyWrite};

use crate::core::{DevError, DevResult, Extent};
use crate::engine::{Buf, ClientId, ClientLimits, Engine, Op, Queue, Request, Sink, Ticket};

/// The errno a file operation fails with for a device error.
pub(super) fn errno_of(e: &DevError, is_write: bool) -> Errno {
    let n = match e {
        DevError::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        DevError::OutOfRange { .. } if is_write => libc::ENOSPC,
        DevError::OutOfRange { .. } | DevError::Misaligned { .. } => libc::EINVAL,
        DevError::ReadOnly => libc::EROFS,
        DevError::NotSupported(_) => libc::EOPNOTSUPP,
        DevError::Target(_) => libc::EIO,
    };
    Errno::from_i32(n)
}

/// What answers a request once the engine is done with it.
pub(super) enum Pending {
    /// `read`: the data, or the error.
    Read(ReplyData),
    /// `write`: the byte count the kernel asked for.
    Write(ReplyWrite, u32),
    /// `fsync`, and one-piece `fallocate`s.
    Done(ReplyEmpty),
    /// A request the FUSE thread waits for itself (`lseek`'s extents,
    /// the pieces of a long `fallocate`).
    Wait(Arc<Waiter>),
}

impl Pending {
    fn finish(self, result: DevResult<()>, req: &mut Request) {
        let w = req.op.is_write();
        match (self, result) {
            (Pending::Read(r), Ok(())) => r.data(req.data()),
            (Pending::Write(r, n), Ok(())) => r.written(n),
            (Pending::Done(r), Ok(())) => r.ok(),
            (Pending::Read(r), Err(e)) => r.error(errno_of(&e, w)),
            (Pending::Write(r, _), Err(e)) => r.error(errno_of(&e, w)),
            (Pending::Done(r), Err(e)) => r.error(errno_of(&e, w)),
            (Pending::Wait(x), res) => x.set(res, std::mem::take(&mut req.extents)),
        }
    }

    /// Answer with an error without running anything.
    pub(super) fn fail(self, e: Errno) {
        match self {
            Pending::Read(r) => r.error(e),
            Pending::Write(r, _) => r.error(e),
            Pending::Done(r) => r.error(e),
            Pending::Wait(x) => x.set(
                Err(DevError::Io(std::io::Error::from_raw_os_error(e.code()))),
                Vec::new(),
            ),
        }
    }
}

/// A request's result for a FUSE thread that waits for it.
#[derive(Default)]
pub(super) struct Waiter {
    done: Mutex<Option<(DevResult<()>, Vec<Extent>)>>,
    cv: Condvar,
}

impl Waiter {
    fn set(&self, r: DevResult<()>, extents: Vec<Extent>) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some((r, extents));
        self.cv.notify_all();
    }

    pub(super) fn wait(&self) -> (DevResult<()>, Vec<Extent>) {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Replies waiting for their request, by tag, and whether new requests
/// are still taken.
#[derive(Default)]
struct InFlight {
    pending: HashMap<u64, Pending>,
    closed: bool,
}

/// The front end's [`Sink`]: replies waiting for their request, by tag.
/// Also what shutdown waits on: the server's final flush must come after
/// every write a process was told succeeded, so the mount is closed (new
/// requests fail) and drained before it ([`Replies::close`]).
#[derive(Default)]
pub(super) struct Replies {
    state: Mutex<InFlight>,
    idle: Condvar,
}

impl Replies {
    fn lock(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `p` under `tag` until the request completes; hands it back
    /// when the mount no longer takes requests.
    fn hold(&self, tag: u64, p: Pending) -> Result<(), Pending> {
        let mut g = self.lock();
        if g.closed {
            return Err(p);
        }
        g.pending.insert(tag, p);
        Ok(())
    }

    fn take(&self, tag: u64) -> Option<Pending> {
        let mut g = self.lock();
        let p = g.pending.remove(&tag);
        if g.pending.is_empty() {
            self.idle.notify_all();
        }
        p
    }

    /// Refuse new requests (EIO) and wait up to `limit` for those in
    /// flight to complete; false if some are still running then.
    pub(super) fn close(&self, limit: Duration) -> bool {
        let mut g = self.lock();
        g.closed = true;
        let until = std::time::Instant::now() + limit;
        while !g.pending.is_empty() {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self
                .idle
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

impl Sink for Replies {
    fn complete(&self, req: &mut Request, result: DevResult<()>) {
        if let Some(p) = self.take(req.tag) {
            p.finish(result, req);
        }
    }
}

/// Bumped by the engine's waker when a refused admission may succeed.
#[derive(Default)]
struct Gate {
    generation: Mutex<u64>,
    cv: Condvar,
}

/// One request as a file operation asks for it.
pub(super) struct Call<'a> {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub fua: bool,
    /// A write's bytes (the FUSE session's receive buffer).
    pub data: Option<&'a [u8]>,
}

/// The mapper directory's engine client: every file operation of every
/// process is one client's request, so the engine's caps bound what the
/// mount as a whole has in flight.
pub(super) struct Front {
    engine: Arc<Engine>,
    client: ClientId,
    gate: Arc<Gate>,
    replies: Arc<Replies>,
    next_tag: AtomicU64,
}

impl Front {
    pub(super) fn new(engine: Arc<Engine>) -> Front {
        let gate = Arc::new(Gate::default());
        let g = gate.clone();
        let waker: crate::engine::Waker = Arc::new(move || {
            *g.generation.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            g.cv.notify_all();
        });
        let client = engine.add_client_with(ClientLimits::default(), Some(waker));
        Front {
            engine,
            client,
            gate,
            replies: Arc::new(Replies::default()),
            next_tag: AtomicU64::new(1),
        }
    }

    /// Admit a request on `q`, waiting while the engine refuses it.
    fn admit(&self, q: &Queue, mem: u64, work: u64) -> Ticket {
        loop {
            let seen = *self
                .gate
                .generation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(t) = self.engine.try_admit(self.client, q, mem, work) {
                return t;
            }
            let g = self
                .gate
                .generation
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if *g == seen {
                // The timeout only guards against a wake-up lost to a
                // queue that went away; the waker ends the wait normally.
                drop(self.gate.cv.wait_timeout(g, Duration::from_millis(100)));
            }
        }
    }

    /// Run `call` on `q`; `then` answers it when it is done (possibly
    /// before this returns, on this thread).
    pub(super) fn submit(&self, q: &Arc<Queue>, call: Call<'_>, then: Pending) {
        let Call {
            op,
            offset,
            len,
            fua,
            data,
        } = call;
        // Held before admission, so that a request waiting to be admitted
        // counts as in flight for shutdown.
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        if let Err(then) = self.replies.hold(tag, then) {
            return then.fail(Errno::from_i32(libc::EIO));
        }
        let data_op = matches!(op, Op::Read | Op::Write);
        let mem = if data_op {
            self.engine.mem_cost(q, offset, len)
        } else {
            0
        };
        if mem > self.engine.mem_limit(q) {
            // Never admitted: the export's budget is smaller than one request.
            if let Some(then) = self.replies.take(tag) {
                then.fail(Errno::from_i32(libc::ENOMEM));
            }
            return;
        }
        let work = match op {
            Op::WriteZeroes => len.min(crate::engine::MAX_CLIENT_BYTES),
            Op::Trim => 4096,
            Op::Extents { max } => u64::from(max) * std::mem::size_of::<Extent>() as u64,
            _ => 0,
        };
        let mut t = self.admit(q, mem, work);
        let (mut buf, head) = if data_op {
            self.engine.charged_buffer(&mut t, q, offset, len)
        } else {
            (Buf::empty(), 0)
        };
        if let Some(d) = data {
            buf[head..head + d.len()].copy_from_slice(d);
        }
        let req = Request {
            op,
            tag,
            offset,
            len,
            fua,
            buf,
            head,
            extents: Vec::new(),
            sink: self.replies.clone(),
        };
        if data_op {
            self.engine.submit_or_run(t, q, req);
        } else {
            self.engine.submit(t, q, req);
        }
    }

    /// What shutdown closes and drains (see [`Replies::close`]).
    pub(super) fn replies(&self) -> Arc<Replies> {
        self.replies.clone()
    }

    /// Run `call` on `q` and wait for it: the result and, for
    /// [`Op::Extents`], the extents.
    pub(super) fn run(&self, q: &Arc<Queue>, call: Call<'_>) -> (DevResult<()>, Vec<Extent>) {
        let w = Arc::new(Waiter::default());
        self.submit(q, call, Pending::Wait(w.clone()));
        w.wait()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.engine.remove_client(self.client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{Budget, BufPool};
    use crate::store::MemStore;

    fn queue(engine: &Engine, size: u64) -> Arc<Queue> {
        engine.add_queue(
            Arc::new(MemStore::new(size)),
            BufPool::new(Budget::new(8 << 20)),
        )
    }

    #[test]
    fn a_write_then_extents_and_a_read_go_through_the_engine() {
        let engine = Arc::new(Engine::start(2).unwrap());
        let q = queue(&engine, 1 << 20);
        let f = Front::new(engine.clone());
        let data = vec![0x5a_u8; 8192];
        let call = |op, offset, len, data| Call {
            op,
            offset,
            len,
            fua: false,
            data,
        };
        let (r, _) = f.run(&q, call(Op::Write, 4096, 8192, Some(&data)));
        r.unwrap();
        let (r, ext) = f.run(&q, call(Op::Extents { max: 16 }, 0, 1 << 20, None));
        r.unwrap();
        assert!(!ext.is_empty(), "no extents");
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), 1 << 20);
        let mut b = vec![0u8; 8192];
        q.device().read(4096, &mut b).unwrap();
        assert_eq!(b, data);
    }

    #[test]
    fn a_closed_front_refuses_new_requests_after_the_running_ones() {
        let engine = Arc::new(Engine::start(2).unwrap());
        let q = queue(&engine, 1 << 20);
        let f = Front::new(engine.clone());
        let data = vec![1u8; 4096];
        let call = |data| Call {
            op: Op::Write,
            offset: 0,
            len: 4096,
            fua: false,
            data,
        };
        f.run(&q, call(Some(&data))).0.unwrap();
        assert!(
            f.replies().close(Duration::from_secs(5)),
            "nothing was running"
        );
        let (r, _) = f.run(&q, call(Some(&data)));
        match r {
            Err(DevError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
            other => panic!("a request after close: {other:?}"),
        }
    }

    #[test]
    fn device_errors_become_errnos() {
        let oor = DevError::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(errno_of(&oor, true).code(), libc::ENOSPC);
        assert_eq!(errno_of(&oor, false).code(), libc::EINVAL);
        assert_eq!(errno_of(&DevError::ReadOnly, true).code(), libc::EROFS);
        let io = DevError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(errno_of(&io, true).code(), libc::ENOSPC);
    }
}
