//! Replies and their queue: [`Conn`] is the socket as seen by everyone who
//! writes to it (the event loop and the engine's workers), and the NBD
//! encoding of every reply, the engine's extents included.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::core::{DevError, DevResult, Extent, Lent};
use crate::engine::{Buf, Op, Request, Sink, Waker};

use super::super::proto::*;
use super::super::sock::Sock;

/// A reply (or the rest of one) waiting for room in the socket.
struct Pending {
    head: [u8; 32],
    head_len: u8,
    body: Vec<u8>,
    /// The payload buffer (a read's data), kept alive and charged.
    buf: Buf,
    data: (usize, usize),
    /// Bytes of this reply already sent.
    sent: usize,
    /// `body` is the connection's cork buffer (the unsent end of corked
    /// replies): it goes back to [`Out::cork`] once sent, so corking
    /// allocates nothing after the first batch.
    cork: bool,
}

impl Pending {
    fn len(&self) -> usize {
        self.head_len as usize + self.body.len() + (self.data.1 - self.data.0)
    }

    /// The unsent parts, as up to three slices.
    fn parts(&self) -> [&[u8]; 3] {
        let mut skip = self.sent;
        let mut out: [&[u8]; 3] = [
            &self.head[..self.head_len as usize],
            &self.body,
            self.buf.get(self.data.0..self.data.1).unwrap_or(&[]),
        ];
        for p in out.iter_mut() {
            let k = skip.min(p.len());
            *p = &p[k..];
            skip -= k;
        }
        out
    }
}

/// Memory a queued reply holds besides its bytes: the `Pending` itself
/// and the queue's and allocator's share. A 16-byte reply costs about ten
/// times its length; counting only the bytes let a client that never reads
/// queue hundreds of MiB of small replies under a cap meant for megabytes.
const REPLY_OVERHEAD: usize = std::mem::size_of::<Pending>() + 32;

/// The environment variable that turns corking off (`0`), for A/Bs.
pub const CORK_ENV: &str = "UDM_REPLY_CORK";

/// Most bytes of replies gathered while corked (see [`Conn::cork`])
/// before they are sent anyway.
const CORK_CAP: usize = 64 << 10;

/// Largest read whose data is copied into the corked replies: a 4 KiB
/// read's copy costs far less than the `writev` it saves, a large read is
/// better sent on its own (lent reads keep their one copy).
const CORK_DATA_MAX: usize = 8 << 10;

std::thread_local! {
    /// The connection whose replies this thread gathers instead of
    /// sending one by one (its address; 0: none): set by the event loop
    /// while it drives that connection's requests.
    static CORKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// While alive, replies this thread makes for its connection are gathered
/// and sent with one `writev` when it drops (see [`Conn::cork`]).
pub struct Cork<'a> {
    conn: &'a Conn,
    prev: usize,
}

impl Drop for Cork<'_> {
    fn drop(&mut self) {
        CORKED.with(|c| c.set(self.prev));
        self.conn.uncork();
    }
}

struct Out {
    queue: VecDeque<Pending>,
    /// Whole replies gathered while corked, not sent yet (never part of
    /// one: a reply is either all here or not at all).
    cork: Vec<u8>,
    /// The cork buffer is in `queue`, its end not sent yet: nothing is
    /// corked until it comes back.
    cork_away: bool,
    /// Bytes in `queue` not sent yet.
    bytes: u64,
    /// Last progress while the queue was not empty.
    since: Option<Instant>,
    tls: Option<Box<rustls::ServerConnection>>,
    dead: bool,
}

/// A connection as seen by everyone who writes to it.
pub struct Conn {
    pub sock: Sock,
    out: Mutex<Out>,
    pub(super) structured: AtomicBool,
    /// Context id of `base:allocation` (for BLOCK_STATUS replies).
    pub(super) meta_id: std::sync::atomic::AtomicU32,
    /// Still negotiating (a candidate for shedding at the connection cap).
    pub in_handshake: AtomicBool,
    /// Closed by the server (shed, error); the loop finishes the close.
    closed: AtomicBool,
    /// What the queued replies cost, readable without the lock: their
    /// unsent bytes plus [`REPLY_OVERHEAD`] each (see [`Out::cost`]).
    queued: AtomicUsize,
    /// Counted in the server's live connections (cleared by whoever
    /// uncounts it first).
    counted: AtomicBool,
    live: Option<Arc<AtomicUsize>>,
    /// The count of connections from the same address (or uid), for the
    /// per-client cap; decremented with `live`.
    source: OnceLock<Arc<AtomicUsize>>,
    /// Milliseconds the connection had been idle in transmission at the
    /// last sweep of its loop (0: busy or still negotiating): what the
    /// accept path reads to pick an idle connection to shed.
    pub idle_ms: AtomicU64,
    /// The TLS handshake is being run by the handshake thread
    /// (`nbd/handshaker.rs`), which holds the TLS session meanwhile: the
    /// session and the loop leave the connection alone until it is done.
    pub tls_offloaded: AtomicBool,
    /// A TLS session was started (set once, on the connection's loop, and
    /// never cleared): plain connections read and check without the reply
    /// lock, which a worker holds while it writes a reply — a reader
    /// waiting on it cost a sleep and a wake-up per request.
    tls_on: AtomicBool,
    /// The socket became writable while someone held the reply lock: the
    /// holder flushes again after it lets go (see [`Conn::flush`]).
    kick: AtomicBool,
    /// Ask the owning event loop to look at this connection.
    notify: OnceLock<Waker>,
    /// An extent list kept from the last BLOCK_STATUS reply, handed to the
    /// next one so steady-state BLOCK_STATUS allocates nothing.
    spare_extents: Mutex<Vec<Extent>>,
    /// The export's log of failed requests, once in transmission.
    pub(super) failures: OnceLock<Arc<crate::nbd::export::FailureLog>>,
}

impl Out {
    /// What the queue costs: unsent bytes plus each reply's overhead, so
    /// the per-connection caps bound memory, not just payload.
    fn cost(&self) -> usize {
        self.bytes as usize + self.queue.len() * REPLY_OVERHEAD
    }
}

impl Conn {
    /// A connection on a non-blocking socket; `live` counts open
    /// connections for the cap (decremented once, when it closes).
    pub fn new(sock: Sock, live: Option<Arc<AtomicUsize>>) -> Conn {
        Conn {
            sock,
            out: Mutex::new(Out {
                queue: VecDeque::new(),
                cork: Vec::new(),
                cork_away: false,
                bytes: 0,
                since: None,
                tls: None,
                dead: false,
            }),
            structured: AtomicBool::new(false),
            meta_id: std::sync::atomic::AtomicU32::new(0),
            in_handshake: AtomicBool::new(true),
            closed: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            counted: AtomicBool::new(live.is_some()),
            live,
            source: OnceLock::new(),
            idle_ms: AtomicU64::new(0),
            tls_offloaded: AtomicBool::new(false),
            tls_on: AtomicBool::new(false),
            kick: AtomicBool::new(false),
            notify: OnceLock::new(),
            spare_extents: Mutex::new(Vec::new()),
            failures: OnceLock::new(),
        }
    }

    fn out(&self) -> MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_notify(&self, w: Waker) {
        let _ = self.notify.set(w);
    }

    /// Ask the owning event loop to look at this connection.
    pub fn notify(&self) {
        if let Some(w) = self.notify.get() {
            w();
        }
    }

    /// Count the connection in its client's tally as well (the accept
    /// path increments `c` before this; [`Conn::uncount`] decrements it).
    pub fn count_source(&self, c: Arc<AtomicUsize>) {
        let _ = self.source.set(c);
    }

    /// Take the connection out of the server's count (once).
    pub fn uncount(&self) {
        if self.counted.swap(false, Ordering::AcqRel) {
            if let Some(l) = &self.live {
                l.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(c) = self.source.get() {
                c.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Close from outside the event loop (shedding at the connection
    /// cap): the socket is shut at once, so the client sees it now and its
    /// loop, woken by the hang-up, frees the rest.
    pub fn shed(&self) {
        self.uncount();
        self.kill();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Drop the connection: no more replies, queued ones are thrown away
    /// (their buffers and charges go back), the socket is shut down.
    pub fn kill(&self) {
        self.closed.store(true, Ordering::Release);
        let dropped = {
            let mut out = self.out();
            out.dead = true;
            out.bytes = 0;
            out.since = None;
            std::mem::take(&mut out.queue)
        };
        self.queued.store(0, Ordering::Relaxed);
        self.sock.shutdown(Shutdown::Both);
        drop(dropped);
        self.notify();
    }

    /// What the replies waiting for the socket cost: their unsent bytes
    /// plus a fixed overhead each (the caps on queued replies compare
    /// this).
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed) as u64
    }

    /// How long queued replies have made no progress.
    pub fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let out = self.out();
        if out.queue.is_empty() && !out.tls.as_ref().is_some_and(|t| t.wants_write()) {
            return None;
        }
        out.since.map(|s| now.saturating_duration_since(s))
    }

    /// Send `head`, `body` and the data of `req` (a read's bytes) as one
    /// message, now if the socket takes it, else queued (taking the
    /// request's buffer, which stays charged until sent).
    fn send(&self, head: &[u8], body: &[u8], req: Option<&mut Request>) {
        self.send_locked(head, body, req);
        self.after_unlock();
    }

    /// A writable edge that found the lock taken set `kick`: whoever held
    /// it flushes now, having let go (the edge may be the only one, and a
    /// reply queued by this holder would wait for the next).
    fn after_unlock(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        while self.kick.swap(false, Ordering::SeqCst) {
            let mut out = self.out();
            if out.dead {
                return;
            }
            let r = flush_locked(&self.sock, &mut out);
            self.queued.store(out.cost(), Ordering::Relaxed);
            drop(out);
            if let Err(e) = r {
                self.fail(&e);
                return;
            }
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    /// Gather the replies this thread makes for this connection until the
    /// guard drops, then send them with one `writev`: the event loop corks
    /// while it drives a batch of requests, so the replies of those it
    /// runs inline (a write into a mapped file, a cached read) cost one
    /// system call together instead of one each. At 4 KiB and QD32 the
    /// `writev` per reply was the largest single cost of the loop.
    /// Replies made by other threads (workers, the ring's completion
    /// thread) are sent as before; NBD lets replies arrive in any order.
    /// `UDM_REPLY_CORK=0` sends each reply at once (the A/B of this).
    pub fn cork(&self) -> Cork<'_> {
        static ON: OnceLock<bool> = OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var(CORK_ENV).map_or(true, |v| v != "0"));
        let me = if on { self as *const Conn as usize } else { 0 };
        let prev = CORKED.with(|c| c.replace(me));
        Cork { conn: self, prev }
    }

    /// Whether a reply of `len` bytes made now goes to the cork.
    fn corks(&self, out: &Out, len: usize) -> bool {
        out.tls.is_none()
            && !out.cork_away
            && len <= CORK_DATA_MAX + 32
            && CORKED.with(|c| c.get()) == self as *const Conn as usize
    }

    /// Room for `len` more bytes in the cork, sending what it holds first
    /// when they would not fit. False when the connection failed.
    fn cork_room(&self, out: &mut MutexGuard<'_, Out>, len: usize) -> bool {
        if out.cork.len() + len <= CORK_CAP {
            if out.cork.capacity() == 0 {
                out.cork.reserve(CORK_CAP);
            }
            return true;
        }
        match self.send_cork(out) {
            Ok(()) => true,
            Err(e) => {
                out.dead = true;
                tracing::debug!("reply to {} failed: {e}", self.sock.peer());
                false
            }
        }
    }

    /// Send the corked replies now, queueing what the socket does not take.
    fn send_cork(&self, out: &mut MutexGuard<'_, Out>) -> io::Result<()> {
        if out.cork.is_empty() {
            return Ok(());
        }
        let mut sent = 0;
        if out.queue.is_empty() {
            match self.sock.try_writev(&[IoSlice::new(&out.cork)]) {
                Ok(n) => sent = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if sent < out.cork.len() {
            // The buffer itself is queued (no copy, no allocation).
            let body = std::mem::take(&mut out.cork);
            out.bytes += (body.len() - sent) as u64;
            if out.since.is_none() {
                out.since = Some(Instant::now());
            }
            out.cork_away = true;
            out.queue.push_back(Pending {
                head: [0; 32],
                head_len: 0,
                body,
                buf: Buf::empty(),
                data: (0, 0),
                sent,
                cork: true,
            });
        }
        out.cork.clear();
        if out.queue.is_empty() {
            return Ok(());
        }
        flush_locked(&self.sock, out)
    }

    /// The cork's guard dropped: send what it gathered.
    fn uncork(&self) {
        let mut out = self.out();
        if out.dead {
            out.cork.clear();
            return;
        }
        let r = self.send_cork(&mut out);
        self.queued.store(out.cost(), Ordering::Relaxed);
        drop(out);
        match r {
            Err(e) => self.fail(&e),
            Ok(()) => self.after_unlock(),
        }
    }

    fn send_locked(&self, head: &[u8], body: &[u8], req: Option<&mut Request>) {
        let mut out = self.out();
        if out.dead {
            return;
        }
        let (ds, de) = req
            .as_deref()
            .map_or((0, 0), |r| (r.head, r.head + r.data().len()));
        let total = head.len() + body.len() + (de - ds);
        if self.corks(&out, total) {
            if !self.cork_room(&mut out, total) {
                drop(out);
                return self.kill();
            }
            let data: &[u8] = req.as_deref().map_or(&[], |r| r.data());
            for part in [head, body, data] {
                out.cork.extend_from_slice(part);
            }
            return;
        }
        let mut sent = 0;
        if out.tls.is_none() && out.queue.is_empty() {
            let data: &[u8] = req.as_deref().map_or(&[], |r| r.data());
            match self.sock.try_writev(&[
                IoSlice::new(head),
                IoSlice::new(body),
                IoSlice::new(data),
            ]) {
                Ok(n) if n == total => return,
                Ok(n) => sent = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    drop(out);
                    self.fail(&e);
                    return;
                }
            }
        }
        self.queue_rest(out, head, body, req.map(|r| (r, (ds, de))), sent);
    }

    /// Queue what `send_locked` or `send_lent` could not send now (the
    /// slow path: the client is not reading fast enough, or TLS, which
    /// always goes through the queue): `sent` bytes of the reply are out;
    /// the data are `req.buf[ds..de]`, and the request's buffer is taken.
    fn queue_rest(
        &self,
        mut out: MutexGuard<'_, Out>,
        head: &[u8],
        body: &[u8],
        req: Option<(&mut Request, (usize, usize))>,
        sent: usize,
    ) {
        let total = head.len() + body.len() + req.as_ref().map_or(0, |(_, (s, e))| e - s);
        let (h, b) = if head.len() <= 32 {
            (head, body.to_vec())
        } else {
            (&[][..], [head, body].concat())
        };
        let mut p = Pending {
            head: [0; 32],
            head_len: h.len() as u8,
            body: b,
            buf: Buf::empty(),
            data: (0, 0),
            sent,
            cork: false,
        };
        p.head[..h.len()].copy_from_slice(h);
        if let Some((r, data)) = req {
            p.buf = std::mem::replace(&mut r.buf, Buf::empty());
            p.data = data;
        }
        out.bytes += (total - sent) as u64;
        if out.since.is_none() {
            out.since = Some(Instant::now());
        }
        out.queue.push_back(p);
        let r = flush_locked(&self.sock, &mut out);
        self.queued.store(out.cost(), Ordering::Relaxed);
        drop(out);
        if let Err(e) = r {
            self.fail(&e);
        }
    }

    /// Send bytes the caller keeps (handshake replies).
    pub fn send_bytes(&self, b: &[u8]) {
        if !b.is_empty() {
            self.send(&[], b, None)
        }
    }

    /// Send what is queued, as far as the socket takes it (the event loop
    /// calls this when the socket is writable). Returns the bytes still
    /// queued.
    ///
    /// Without waiting for the lock: a worker holding it is sending a
    /// reply right now, and sleeping on it cost the loop a context switch
    /// per reply at a deep queue. `kick` makes that worker flush again
    /// once it lets go (a Dekker pair of fences: either this side sees the
    /// lock free or the holder sees the kick).
    pub fn flush(&self) -> u64 {
        self.kick.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut out = match self.out.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return self.queued(),
        };
        self.kick.store(false, Ordering::Relaxed);
        if out.dead {
            return 0;
        }
        let r = flush_locked(&self.sock, &mut out);
        self.queued.store(out.cost(), Ordering::Relaxed);
        let left = out.bytes;
        drop(out);
        if let Err(e) = r {
            self.fail(&e);
        }
        left
    }

    fn fail(&self, e: &io::Error) {
        tracing::debug!("reply to {} failed: {e}", self.sock.peer());
        self.kill();
    }

    /// Switch the connection to TLS (after the STARTTLS ACK went out).
    pub(super) fn start_tls(&self, cfg: &Arc<rustls::ServerConfig>) -> io::Result<()> {
        let mut out = self.out();
        if !out.queue.is_empty() {
            return Err(io::Error::other(
                "client did not read the STARTTLS reply before starting TLS",
            ));
        }
        let s = rustls::ServerConnection::new(cfg.clone())
            .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
        out.tls = Some(Box::new(s));
        self.tls_on.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether the TLS handshake finished with a client certificate:
    /// rustls hands one over only after the verifier accepted it, and
    /// never when the server asks for none.
    pub(super) fn tls_peer_verified(&self) -> bool {
        self.out()
            .tls
            .as_ref()
            .is_some_and(|t| !t.is_handshaking() && t.peer_certificates().is_some())
    }

    /// Whether a TLS session is set up and still in its handshake.
    pub fn tls_handshaking(&self) -> bool {
        self.out().tls.as_ref().is_some_and(|t| t.is_handshaking())
    }

    /// Run the TLS handshake as far as the socket allows, off the event
    /// loop (`nbd/handshaker.rs`): `Ok(true)` once it is over. The session
    /// is taken out of the lock meanwhile, so the server's signature never
    /// holds up a loop that looks at this connection (nothing else uses
    /// the session while [`Conn::tls_offloaded`] is set).
    pub fn tls_handshake_step(&self) -> io::Result<bool> {
        let Some(mut tls) = self.out().tls.take() else {
            return Ok(true);
        };
        let r = tls_handshake(&self.sock, &mut tls);
        let mut out = self.out();
        if out.dead {
            return Err(io::Error::other("closed during the TLS handshake"));
        }
        out.tls = Some(tls);
        r
    }

    pub fn is_tls(&self) -> bool {
        self.tls_on.load(Ordering::Acquire)
    }

    /// Read client bytes: straight from the socket, or decrypted.
    /// `WouldBlock` when none are available, `Ok(0)` at the end.
    pub(super) fn read_input(&self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.is_tls() {
            return self.sock.try_read(buf);
        }
        let mut guard = self.out();
        let out = &mut *guard;
        loop {
            let tls = out.tls.as_mut().expect("TLS session present");
            match tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match tls.read_tls(&mut &self.sock) {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
            let processed = tls.process_new_packets();
            // Handshake messages and alerts go out now.
            let r = flush_locked(&self.sock, out);
            self.queued.store(out.cost(), Ordering::Relaxed);
            let tls = out.tls.as_mut().expect("TLS session present");
            if let Err(e) = processed {
                let _ = tls.write_tls(&mut &self.sock);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("TLS: {e}"),
                ));
            }
            r?;
        }
    }

    pub(super) fn send_ok(&self, cookie: u64) {
        self.send(&simple_reply(0, cookie), &[], None);
    }

    /// An error reply; reads with structured replies must get an error
    /// chunk, everything else may use a simple reply.
    pub(super) fn send_error(&self, cookie: u64, error: u32, is_read: bool, msg: &str) {
        if is_read && self.structured.load(Ordering::Relaxed) {
            let msg = &msg.as_bytes()[..msg.len().min(1024)];
            let h = chunk_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_ERROR,
                cookie,
                6 + msg.len() as u32,
            );
            let mut body = Vec::with_capacity(6 + msg.len());
            body.extend_from_slice(&error.to_be_bytes());
            body.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            body.extend_from_slice(msg);
            self.send(&h, &body, None);
        } else {
            self.send(&simple_reply(error, cookie), &[], None);
        }
    }

    pub(super) fn send_read(&self, cookie: u64, offset: u64, req: Option<&mut Request>) {
        let len = req.as_ref().map_or(0, |r| r.data().len());
        if self.structured.load(Ordering::Relaxed) && len == 0 {
            let h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
            self.send(&h, &[], None);
        } else {
            let (h, n) = self.read_head(cookie, offset, len);
            self.send(&h[..n], &[], req);
        }
    }

    /// The header of a successful read's reply carrying `len > 0` bytes
    /// (simple, or one data chunk for the whole read, so DF always holds),
    /// and its length.
    fn read_head(&self, cookie: u64, offset: u64, len: usize) -> ([u8; 28], usize) {
        let mut h = [0u8; 28];
        if !self.structured.load(Ordering::Relaxed) {
            h[..16].copy_from_slice(&simple_reply(0, cookie));
            return (h, 16);
        }
        h[..20].copy_from_slice(&chunk_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            cookie,
            8 + len as u32,
        ));
        h[20..].copy_from_slice(&offset.to_be_bytes());
        (h, 28)
    }

    /// A read's reply from bytes a device lent (see [`Sink::complete_lent`]):
    /// what the socket takes now goes straight from them (one copy, the
    /// kernel's); the rest is copied into the request's buffer and queued,
    /// so nothing refers to the lent bytes once this returns.
    fn send_lent(&self, req: &mut Request, data: &dyn Lent) {
        self.send_lent_locked(req, data);
        self.after_unlock();
    }

    fn send_lent_locked(&self, req: &mut Request, data: &dyn Lent) {
        let (ds, de) = (req.head, req.head + req.len as usize);
        let (lent_at, lent_len) = data.iov();
        if de > lent_len || de > req.buf.len() {
            let e = DevError::Target("internal error: lent bytes shorter than the read".into());
            return self.complete(req, Err(e));
        }
        let (h, hn) = self.read_head(req.tag, req.offset, de - ds);
        let head = &h[..hn];
        let mut out = self.out();
        if out.dead {
            return;
        }
        if self.corks(&out, hn + de - ds) {
            if !self.cork_room(&mut out, hn + de - ds) {
                drop(out);
                return self.kill();
            }
            // Copied into the cork while the bytes are still lent.
            let at = out.cork.len();
            out.cork.extend_from_slice(head);
            out.cork.resize(at + hn + de - ds, 0);
            if let Err(e) = data.copy_to(ds, &mut out.cork[at + hn..]) {
                out.cork.truncate(at);
                drop(out);
                return self.complete(req, Err(e));
            }
            return;
        }
        let mut sent = 0;
        if out.tls.is_none() && out.queue.is_empty() {
            let iov = [
                libc::iovec {
                    iov_base: head.as_ptr() as *mut libc::c_void,
                    iov_len: head.len(),
                },
                libc::iovec {
                    // In bounds: `ds <= de <= lent_len` (checked above).
                    iov_base: lent_at.wrapping_add(ds) as *mut libc::c_void,
                    iov_len: de - ds,
                },
            ];
            match self.sock.try_writev_raw(&iov) {
                Ok(n) if n == hn + de - ds => return,
                Ok(n) => sent = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    drop(out);
                    return self.fail(&e);
                }
            }
        }
        // The data not sent yet, copied while the bytes are still lent.
        let from = ds + sent.saturating_sub(hn);
        if let Err(e) = data.copy_to(from, &mut req.buf[from..de]) {
            drop(out);
            if sent == 0 {
                // Nothing of the reply is out: the client gets the error.
                return self.complete(req, Err(e));
            }
            // Half a reply is on the wire; the rest cannot be made good.
            return self.fail(&io::Error::other(format!("read failed mid-reply: {e}")));
        }
        self.queue_rest(out, head, &[], Some((req, (ds, de))), sent);
    }

    /// An extent list for the next BLOCK_STATUS request (the one kept
    /// from the last reply, or a new, empty one).
    pub(super) fn take_extents(&self) -> Vec<Extent> {
        std::mem::take(&mut *self.spare_extents.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Keep `list` (emptied) for the next BLOCK_STATUS request, if it is
    /// larger than the one kept but small enough that thousands of idle
    /// connections do not hold much ([`KEPT_EXTENTS`]).
    fn keep_extents(&self, mut list: Vec<Extent>) {
        list.clear();
        let mut spare = self.spare_extents.lock().unwrap_or_else(|p| p.into_inner());
        if spare.capacity() < list.capacity() && list.capacity() <= KEPT_EXTENTS {
            *spare = list;
        }
    }

    /// A BLOCK_STATUS reply: one chunk for `base:allocation` carrying the
    /// extents the engine returned, encoded on the stack (at most
    /// [`MAX_EXTENTS`] descriptors, 8 KiB).
    fn send_block_status(&self, req: &Request) {
        let mut body = [0u8; 8 * MAX_EXTENTS];
        let n = encode_extents(&req.extents, &mut body);
        let mut h = [0u8; 24];
        h[..20].copy_from_slice(&chunk_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_BLOCK_STATUS,
            req.tag,
            4 + n as u32,
        ));
        h[20..].copy_from_slice(&self.meta_id.load(Ordering::Relaxed).to_be_bytes());
        self.send(&h, &body[..n], None);
    }
}

/// Most extents in one BLOCK_STATUS reply (the spec suggests at most 2^20;
/// clients ask again from where a reply ends).
pub(super) const MAX_EXTENTS: usize = 1024;

/// Largest extent list a connection keeps between BLOCK_STATUS requests
/// (3 KiB); a longer reply's list is freed.
const KEPT_EXTENTS: usize = 128;

/// NBD `base:allocation` descriptors for `extents`: (length, flags)
/// pairs of big-endian u32, as many as fit into `out`; returns the bytes
/// written. The lengths fit: a request's range is at most 4 GiB - 1.
fn encode_extents(extents: &[Extent], out: &mut [u8]) -> usize {
    let mut n = 0;
    for (e, d) in extents.iter().zip(out.chunks_exact_mut(8)) {
        let flags = (u32::from(e.hole) * STATE_HOLE) | (u32::from(e.zero) * STATE_ZERO);
        d[..4].copy_from_slice(&(e.len.min(u64::from(u32::MAX)) as u32).to_be_bytes());
        d[4..].copy_from_slice(&flags.to_be_bytes());
        n += 8;
    }
    n
}

/// Send queued replies until the socket is full or the queue empty.
/// Read, process and answer handshake records until the socket has no
/// more or the handshake is over (what is left to send then goes out with
/// the connection's next flush).
fn tls_handshake(sock: &Sock, tls: &mut rustls::ServerConnection) -> io::Result<bool> {
    loop {
        while tls.wants_write() {
            match tls.write_tls(&mut &*sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if !tls.is_handshaking() {
            return Ok(true);
        }
        match tls.read_tls(&mut &*sock) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed during the TLS handshake",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
        if let Err(e) = tls.process_new_packets() {
            // The alert, if the socket takes it.
            let _ = tls.write_tls(&mut &*sock);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("TLS: {e}"),
            ));
        }
    }
}

fn flush_locked(sock: &Sock, out: &mut Out) -> io::Result<()> {
    let before = out.bytes;
    let r = if out.tls.is_some() {
        flush_tls(sock, out)
    } else {
        flush_plain(sock, out)
    };
    if out.bytes != before || out.queue.is_empty() {
        out.since = (!out.queue.is_empty()).then(Instant::now);
    }
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        r => r,
    }
}

fn flush_plain(sock: &Sock, out: &mut Out) -> io::Result<()> {
    while !out.queue.is_empty() {
        let mut iov: [IoSlice<'_>; 24] = [IoSlice::new(&[]); 24];
        let mut n = 0;
        for p in out.queue.iter().take(8) {
            for part in p.parts() {
                iov[n] = IoSlice::new(part);
                n += 1;
            }
        }
        let mut done = sock.try_writev(&iov[..n])?;
        if done == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "client stopped accepting data",
            ));
        }
        out.bytes -= done as u64;
        while done > 0 {
            let p = out
                .queue
                .front_mut()
                .expect("bytes sent belong to a queued reply");
            let left = p.len() - p.sent;
            if done >= left {
                done -= left;
                if let Some(p) = out.queue.pop_front().filter(|p| p.cork) {
                    out.cork = p.body;
                    out.cork.clear();
                    out.cork_away = false;
                }
            } else {
                p.sent += done;
                done = 0;
            }
        }
    }
    Ok(())
}

/// Under TLS: encrypt queued replies piece by piece (at most 16 KiB of
/// plaintext ahead of what the socket took), so the TLS buffers stay small
/// and the payload buffers keep the charge until their bytes are out.
fn flush_tls(sock: &Sock, out: &mut Out) -> io::Result<()> {
    const AHEAD: usize = 16 << 10;
    let tls = out.tls.as_mut().expect("TLS session present");
    loop {
        while tls.wants_write() {
            tls.write_tls(&mut &*sock)?;
        }
        let Some(p) = out.queue.front_mut() else {
            return Ok(());
        };
        let mut fed = 0;
        for part in p.parts() {
            if fed >= AHEAD {
                break;
            }
            let k = part.len().min(AHEAD - fed);
            if k == 0 {
                continue;
            }
            let n = std::io::Write::write(&mut tls.writer(), &part[..k])?;
            fed += n;
            if n < k {
                break;
            }
        }
        p.sent += fed;
        out.bytes -= fed as u64;
        if p.sent >= p.len() {
            out.queue.pop_front();
        }
        if fed == 0 && !tls.wants_write() {
            return Ok(());
        }
    }
}

/// What a client is told about a failed request: a fixed text per
/// error number. The error itself names backing paths and upstream
/// addresses, which are the server's business; it goes to the log.
fn client_message(errno: u32) -> &'static str {
    match errno {
        EIO => "I/O error",
        ENOSPC => "no space left on the device",
        EPERM => "not permitted",
        EINVAL => "invalid request",
        EOVERFLOW => "request too large",
        ENOTSUP => "not supported",
        ESHUTDOWN => "server shutting down",
        _ => "request failed",
    }
}

impl Sink for Conn {
    /// Plain connections only: TLS encrypts from user space, where a
    /// vanished page would raise SIGBUS, and copies anyway.
    fn takes_lent(&self) -> bool {
        !self.is_tls()
    }

    fn complete_lent(&self, req: &mut Request, data: &dyn Lent) {
        self.send_lent(req, data)
    }

    fn complete(&self, req: &mut Request, result: DevResult<()>) {
        match result {
            Ok(()) if req.op == Op::Read => {
                let (c, o) = (req.tag, req.offset);
                self.send_read(c, o, Some(req))
            }
            Ok(()) if matches!(req.op, Op::Extents { .. }) => {
                self.send_block_status(req);
                self.keep_extents(std::mem::take(&mut req.extents));
            }
            Ok(()) => self.send_ok(req.tag),
            Err(e) => {
                let what = format_args!(
                    "{:?} of {} bytes at offset {} failed: {e}",
                    req.op, req.len, req.offset
                );
                match self.failures.get() {
                    Some(log) => log.failed(what),
                    None => tracing::warn!("{what}"),
                }
                let errno = e.nbd_errno(req.op.is_write());
                self.send_error(req.tag, errno, req.op == Op::Read, client_message(errno));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While the loop corks a connection, replies it makes there wait and
    /// leave together, whole and in order, when the cork drops; a reply
    /// made by another thread meanwhile goes out at once, as does
    /// everything for another connection; a small lent read is copied
    /// into the cork; and a cork fuller than its cap is sent early.
    #[test]
    fn corked_replies_leave_together_when_the_cork_drops() {
        use std::io::Read;
        let pair = || {
            let (a, peer) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            peer.set_nonblocking(true).unwrap();
            (Arc::new(Conn::new(Sock::Unix(a), None)), peer)
        };
        let (conn, mut peer) = pair();
        let (other, mut other_peer) = pair();
        let pending = |p: &mut std::os::unix::net::UnixStream| {
            let mut b = vec![0u8; 1 << 20];
            match p.read(&mut b) {
                Ok(n) => b[..n].to_vec(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Vec::new(),
                Err(e) => panic!("{e}"),
            }
        };
        let cork = conn.cork();
        conn.send_ok(1);
        conn.send_error(2, 5, false, "x");
        other.send_ok(3);
        assert_eq!(pending(&mut other_peer), simple_reply(0, 3));
        let c2 = conn.clone();
        std::thread::spawn(move || c2.send_ok(4)).join().unwrap();
        assert_eq!(pending(&mut peer), simple_reply(0, 4), "a worker's reply");
        let mem = crate::store::mem::MemStore::new(1 << 20);
        let data = vec![0x5a; 4096];
        crate::core::BlockDevice::write(&mem, 8192, crate::core::WriteBuf::Borrowed(&data), false)
            .unwrap();
        let e = crate::engine::Engine::new(
            vec![Arc::new(crate::store::mem::MemStore::new(1 << 20))
                as Arc<dyn crate::core::BlockDevice>],
            1,
        )
        .unwrap();
        let (buf, head) = e.buffer(e.queue(0), 8192, 4096);
        let mut req = Request {
            op: Op::Read,
            tag: 6,
            offset: 8192,
            len: 4096,
            fua: false,
            buf,
            head,
            extents: Vec::new(),
            sink: conn.clone(),
        };
        assert!(crate::core::BlockDevice::lend(&mem, 8192, 4096, &mut |d| {
            conn.complete_lent(&mut req, d)
        }));
        assert!(pending(&mut peer).is_empty(), "corked replies wait");
        drop(cork);
        let mut want = simple_reply(0, 1).to_vec();
        want.extend_from_slice(&simple_reply(5, 2));
        want.extend_from_slice(&simple_reply(0, 6));
        want.extend_from_slice(&data);
        assert_eq!(pending(&mut peer), want);
        // Past the cap: sent early, nothing lost or reordered.
        let cork = conn.cork();
        let n = CORK_CAP / 16 + 10;
        for i in 0..n {
            conn.send_ok(i as u64);
        }
        let early = pending(&mut peer);
        assert_eq!(
            early.len(),
            CORK_CAP,
            "the full cork left before the next reply"
        );
        drop(cork);
        let mut all = early;
        all.extend(pending(&mut peer));
        let want: Vec<u8> = (0..n).flat_map(|i| simple_reply(0, i as u64)).collect();
        assert!(all == want);
        // A client that does not read: the cork's unsent end is queued as
        // it is (the buffer itself), nothing is corked meanwhile, and the
        // buffer comes back once the client has read everything.
        while conn.out().queue.is_empty() {
            let _c = conn.cork();
            for i in 0..64 {
                conn.send_ok(i);
            }
        }
        assert!(conn.out().cork_away);
        let mut got = Vec::new();
        for _ in 0..1000 {
            got.extend(pending(&mut peer));
            if conn.flush() == 0 && conn.out().queue.is_empty() {
                got.extend(pending(&mut peer));
                break;
            }
        }
        assert_eq!(got.len() % 16, 0, "whole replies only");
        assert!(got.chunks(16).all(|r| r[..4] == simple_reply(0, 0)[..4]));
        let out = conn.out();
        assert!(!out.cork_away && out.cork.capacity() >= CORK_CAP);
    }

    /// A client that never reads gets its small replies counted at what
    /// they hold in memory, not at their 16 bytes, so the reply caps stop
    /// reading its requests long before the heap grows by hundreds of MiB.
    #[test]
    fn small_queued_replies_count_their_overhead() {
        let (a, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let conn = Conn::new(Sock::Unix(a), None);
        for _ in 0..50_000 {
            conn.send_bytes(&[0u8; 16]);
        }
        let (bytes, replies) = {
            let out = conn.out();
            (out.bytes as usize, out.queue.len())
        };
        assert!(
            replies > 1000,
            "the socket took {replies} short of everything"
        );
        assert_eq!(conn.queued() as usize, bytes + replies * REPLY_OVERHEAD);
        assert!(conn.queued() as usize >= 5 * bytes);
    }

    /// A 2 MiB read answered from lent bytes fills the socket and queues
    /// the rest: the rest is a copy taken before the loan ended, so a write
    /// to the range afterwards (which the engine lets run once the reply
    /// is handed over) does not change what the client receives.
    #[test]
    fn the_unsent_part_of_a_lent_read_is_copied_before_the_loan_ends() {
        use crate::core::{BlockDevice, WriteBuf};
        use crate::store::mem::MemStore;
        const LEN: usize = 2 << 20;
        let mem = Arc::new(MemStore::new(LEN as u64));
        let old: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
        mem.write(0, WriteBuf::Borrowed(&old), false).unwrap();
        let e = crate::engine::Engine::new(vec![mem.clone() as Arc<dyn BlockDevice>], 1).unwrap();
        let (a, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let conn = Arc::new(Conn::new(Sock::Unix(a), None));
        let (buf, head) = e.buffer(e.queue(0), 0, LEN as u64);
        let mut req = Request {
            op: Op::Read,
            tag: 0x5eed,
            offset: 0,
            len: LEN as u64,
            fua: false,
            buf,
            head,
            extents: Vec::new(),
            sink: conn.clone(),
        };
        assert!(conn.takes_lent());
        let lent = mem.lend(0, LEN, &mut |d| conn.complete_lent(&mut req, d));
        assert!(lent);
        assert!(!req.buf.is_some(), "the queued reply took the buffer");
        assert!(conn.queued() > 0, "a socket buffer is smaller than 2 MiB");
        mem.write(0, WriteBuf::Borrowed(&vec![0xee; LEN]), false)
            .unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 16 + LEN];
            peer.read_exact(&mut got).unwrap();
            got
        });
        let t0 = Instant::now();
        while conn.flush() > 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "reply stuck");
            std::thread::yield_now();
        }
        let got = reader.join().unwrap();
        assert_eq!(got[..16], simple_reply(0, 0x5eed));
        assert!(
            got[16..] == old[..],
            "the client got bytes written after the read"
        );
    }
}
