//! One connection: the socket shared by the event loop and the workers
//! ([`Conn`]: replies and their queue), and the state machine that the
//! connection's event loop drives ([`Session`]: handshake framing, then
//! request parsing).
//!
//! Why this shape (the server at scale):
//! - **No thread per connection.** A session is a state machine driven by
//!   whichever event loop owns it, only when its socket has something
//!   (`nbd/reactor.rs`); a silent connection costs a few hundred bytes and
//!   no thread. Its input buffer is taken from the loop's free list while
//!   bytes are buffered and given back when they are consumed, so
//!   thousands of idle connections hold no buffers.
//! - **Nobody waits for a client.** Sockets are non-blocking. A reply that
//!   does not fit into the socket is queued on the connection (holding its
//!   payload buffer, which stays charged to the client), and the event
//!   loop sends the rest when the socket drains. While a client's queued
//!   replies exceed its byte cap, its requests are not read
//!   (back-pressure); a client whose replies make no progress for the
//!   reply deadline is dropped. So a client that never reads stalls only
//!   itself, and a worker never blocks in a send.
//! - **Admission never blocks either.** A request is parsed, checked
//!   against the export (every check that needs no device access happens
//!   here, so a bad request never costs a worker) and admitted by
//!   [`Engine::try_admit`]; when refused, the session stops reading until
//!   the engine wakes it.
//! - **Small requests stay inline.** A read or write of at most 64 KiB
//!   whose turn has come runs on the event loop that parsed it
//!   ([`Engine::submit_or_run`]): for 4 KiB the hand-off to a worker costs
//!   more than the I/O. Its reply usually goes out in the same `writev`
//!   as before.
//! - **Payloads are read straight into their buffer** once the batched
//!   header bytes are used up (one copy, the kernel's), except under TLS,
//!   where rustls decrypts into its own buffer first.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::core::DevResult;
use crate::engine::{Buf, ClientId, ClientLimits, Engine, Op, Request, Sink, Ticket, Waker};

use super::export::{ConnectionGuard, ExportSet, Exported};
use super::handshake::{self, Negotiated, Negotiation, Peer, Step};
use super::proto::*;
use super::sock::Sock;
use super::tls::TlsMode;

/// Default of [`NetOptions::busy_poll`] (`--poll-us`).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// Per-connection limits and deadlines of a server.
#[derive(Debug, Clone)]
pub struct NetOptions {
    /// A client that has not finished the handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// A client in transmission with nothing in flight and no request for
    /// this long is dropped (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// A client whose queued replies make no progress for this long (it
    /// stopped reading) is dropped.
    pub reply_timeout: Duration,
    /// Caps on one client's requests and bytes in flight (queued replies
    /// included).
    pub client: ClientLimits,
    pub tls: TlsMode,
    /// How long an event loop keeps polling without sleeping after its last
    /// event (zero: sleep at once). See `reactor`'s module doc.
    pub busy_poll: Duration,
}

impl Default for NetOptions {
    fn default() -> Self {
        NetOptions {
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
            reply_timeout: Duration::from_secs(30),
            client: ClientLimits::default(),
            tls: TlsMode::Off,
            busy_poll: DEFAULT_BUSY_POLL,
        }
    }
}

/// Everything a session needs from its server.
pub struct Cx {
    pub exports: Arc<ExportSet>,
    pub engine: Arc<Engine>,
    pub opts: NetOptions,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub shutting_down: AtomicBool,
}

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

struct Out {
    queue: VecDeque<Pending>,
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
    structured: AtomicBool,
    /// Context id of `base:allocation` (for BLOCK_STATUS replies).
    meta_id: std::sync::atomic::AtomicU32,
    /// Still negotiating (a candidate for shedding at the connection cap).
    pub in_handshake: AtomicBool,
    /// Closed by the server (shed, error); the loop finishes the close.
    closed: AtomicBool,
    /// Queued bytes, readable without the lock.
    queued: AtomicUsize,
    /// Counted in the server's live connections (cleared by whoever
    /// uncounts it first).
    counted: AtomicBool,
    live: Option<Arc<AtomicUsize>>,
    /// Ask the owning event loop to look at this connection.
    notify: OnceLock<Waker>,
}

impl Conn {
    /// A connection on a non-blocking socket; `live` counts open
    /// connections for the cap (decremented once, when it closes).
    pub fn new(sock: Sock, live: Option<Arc<AtomicUsize>>) -> Conn {
        Conn {
            sock,
            out: Mutex::new(Out {
                queue: VecDeque::new(),
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
            notify: OnceLock::new(),
        }
    }

    fn out(&self) -> MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_notify(&self, w: Waker) {
        let _ = self.notify.set(w);
    }

    fn notify(&self) {
        if let Some(w) = self.notify.get() {
            w();
        }
    }

    /// Take the connection out of the server's count (once).
    pub fn uncount(&self) {
        if self.counted.swap(false, Ordering::AcqRel) {
            if let Some(l) = &self.live {
                l.fetch_sub(1, Ordering::AcqRel);
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

    /// Bytes of replies waiting for the socket.
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
        let mut out = self.out();
        if out.dead {
            return;
        }
        let (ds, de) = req
            .as_deref()
            .map_or((0, 0), |r| (r.head, r.head + r.data().len()));
        let total = head.len() + body.len() + (de - ds);
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
        // Queue the rest (the slow path: the client is not reading fast
        // enough, or TLS, which always goes through the queue).
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
        };
        p.head[..h.len()].copy_from_slice(h);
        if let Some(r) = req {
            p.buf = std::mem::replace(&mut r.buf, Buf::empty());
            p.data = (ds, de);
        }
        out.bytes += (total - sent) as u64;
        if out.since.is_none() {
            out.since = Some(Instant::now());
        }
        out.queue.push_back(p);
        let r = flush_locked(&self.sock, &mut out);
        self.queued.store(out.bytes as usize, Ordering::Relaxed);
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
    pub fn flush(&self) -> u64 {
        let mut out = self.out();
        if out.dead {
            return 0;
        }
        let r = flush_locked(&self.sock, &mut out);
        self.queued.store(out.bytes as usize, Ordering::Relaxed);
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
    fn start_tls(&self, cfg: &Arc<rustls::ServerConfig>) -> io::Result<()> {
        let mut out = self.out();
        if !out.queue.is_empty() {
            return Err(io::Error::other(
                "client did not read the STARTTLS reply before starting TLS",
            ));
        }
        let s = rustls::ServerConnection::new(cfg.clone())
            .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
        out.tls = Some(Box::new(s));
        Ok(())
    }

    pub fn is_tls(&self) -> bool {
        self.out().tls.is_some()
    }

    /// Read client bytes: straight from the socket, or decrypted.
    /// `WouldBlock` when none are available, `Ok(0)` at the end.
    fn read_input(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut guard = self.out();
        let out = &mut *guard;
        if out.tls.is_none() {
            drop(guard);
            return self.sock.try_read(buf);
        }
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
            self.queued.store(out.bytes as usize, Ordering::Relaxed);
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

    fn send_ok(&self, cookie: u64) {
        self.send(&simple_reply(0, cookie), &[], None);
    }

    /// An error reply; reads with structured replies must get an error
    /// chunk, everything else may use a simple reply.
    fn send_error(&self, cookie: u64, error: u32, is_read: bool, msg: &str) {
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

    fn send_read(&self, cookie: u64, offset: u64, req: Option<&mut Request>) {
        let len = req.as_ref().map_or(0, |r| r.data().len());
        if !self.structured.load(Ordering::Relaxed) {
            self.send(&simple_reply(0, cookie), &[], req);
        } else if len == 0 {
            let h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
            self.send(&h, &[], None);
        } else {
            // One data chunk for the whole read, so DF always holds.
            let mut h = [0u8; 28];
            h[..20].copy_from_slice(&chunk_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                cookie,
                8 + len as u32,
            ));
            h[20..].copy_from_slice(&offset.to_be_bytes());
            self.send(&h, &[], req);
        }
    }

    /// A BLOCK_STATUS reply: one chunk for `base:allocation` carrying the
    /// extent descriptors the engine wrote into the request's buffer.
    fn send_block_status(&self, req: &mut Request) {
        let descriptors = req.data().len();
        let mut h = [0u8; 24];
        h[..20].copy_from_slice(&chunk_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_BLOCK_STATUS,
            req.cookie,
            4 + descriptors as u32,
        ));
        h[20..].copy_from_slice(&self.meta_id.load(Ordering::Relaxed).to_be_bytes());
        self.send(&h, &[], Some(req));
    }
}

/// Send queued replies until the socket is full or the queue empty.
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
                out.queue.pop_front();
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

impl Sink for Conn {
    fn complete(&self, req: &mut Request, result: DevResult<()>) {
        match result {
            Ok(()) if req.op == Op::Read => {
                let (c, o) = (req.cookie, req.offset);
                self.send_read(c, o, Some(req))
            }
            Ok(()) if req.op == Op::BlockStatus => self.send_block_status(req),
            Ok(()) => self.send_ok(req.cookie),
            Err(e) => {
                tracing::warn!(
                    "{:?} of {} bytes at offset {} failed: {e}",
                    req.op,
                    req.len,
                    req.offset
                );
                let msg = e.to_string();
                self.send_error(
                    req.cookie,
                    e.nbd_errno(req.op.is_write()),
                    req.op == Op::Read,
                    &msg,
                );
            }
        }
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Input bytes read but not consumed, in a buffer borrowed from the event
/// loop's free list only while it holds bytes.
#[derive(Default)]
struct InBuf {
    buf: Option<Box<[u8]>>,
    start: usize,
    end: usize,
}

const INBUF: usize = 16 << 10;

thread_local! {
    /// Input buffers not in use, per event loop thread.
    static FREE_INBUFS: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

impl InBuf {
    fn avail(&self) -> usize {
        self.end - self.start
    }

    fn bytes(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[self.start..self.end],
            None => &[],
        }
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.release();
        }
    }

    /// Give the buffer back once it holds nothing.
    fn release(&mut self) {
        self.start = 0;
        self.end = 0;
        if let Some(b) = self.buf.take() {
            FREE_INBUFS.with(|f| {
                let mut f = f.borrow_mut();
                if f.len() < 256 {
                    f.push(b);
                }
            });
        }
    }

    /// Room to read into, compacting first.
    fn space(&mut self) -> &mut [u8] {
        let b = self.buf.get_or_insert_with(|| {
            FREE_INBUFS
                .with(|f| f.borrow_mut().pop())
                .unwrap_or_else(|| vec![0u8; INBUF].into_boxed_slice())
        });
        if self.start > 0 {
            b.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut b[self.end..]
    }
}

/// What a session waits for after a [`Session::drive`].
pub enum Drive {
    /// An event (readable, writable, or an engine wake-up).
    Wait,
    /// Nothing: it stopped only to let other connections run.
    Yield,
    /// The session is over; close it.
    Close,
}

enum TxState {
    Header,
    Admit(RequestHeader),
    Payload {
        req: Request,
        ticket: Ticket,
        filled: usize,
    },
    /// Discard a refused write's payload, then send its error.
    Skip {
        left: u64,
        cookie: u64,
        error: u32,
    },
}

struct Tx {
    export: Arc<Exported>,
    _attached: ConnectionGuard,
    client: ClientId,
    meta: Option<u32>,
    size: u64,
    read_only: bool,
    fast_zero: bool,
    emulated_zero: bool,
    max_payload: u64,
    sink: Arc<dyn Sink>,
    state: TxState,
}

struct Hs {
    neg: Negotiation,
    flags_done: bool,
    msg: Vec<u8>,
}

enum Phase {
    Hs(Box<Hs>),
    Tx(Box<Tx>),
    Done,
}

/// Most extents in one BLOCK_STATUS reply (the spec suggests at most 2^20;
/// clients ask again from where a reply ends).
const MAX_EXTENTS: usize = 1024;

/// Requests parsed per drive before other connections get their turn.
const BATCH: usize = 32;

/// One connection's protocol state, owned and driven by its event loop.
pub struct Session {
    pub conn: Arc<Conn>,
    phase: Phase,
    inb: InBuf,
    pub accepted: Instant,
    pub last_active: Instant,
    /// Plain socket: the last read returned less than asked, so the socket
    /// is empty until the next readable edge (saves a read that would
    /// return `WouldBlock`).
    pub drained: bool,
    /// No more input will be read (end of stream, DISC, shutdown).
    pub eof: bool,
    peer: Peer,
}

impl Session {
    /// A new connection; the greeting is sent at once.
    pub fn new(conn: Arc<Conn>) -> Session {
        let now = Instant::now();
        conn.send_bytes(&handshake::greeting());
        let peer = conn.sock.peer_info();
        Session {
            conn,
            phase: Phase::Hs(Box::new(Hs {
                neg: Negotiation::default(),
                flags_done: false,
                msg: Vec::new(),
            })),
            inb: InBuf::default(),
            accepted: now,
            last_active: now,
            drained: false,
            eof: false,
            peer,
        }
    }

    pub fn in_handshake(&self) -> bool {
        matches!(self.phase, Phase::Hs(_))
    }

    /// The engine client of a session in transmission.
    pub fn client(&self) -> Option<ClientId> {
        match &self.phase {
            Phase::Tx(t) => Some(t.client),
            _ => None,
        }
    }

    /// Whether the session has nothing in flight and nothing queued.
    pub fn idle(&self, cx: &Cx) -> bool {
        let inflight = match &self.phase {
            Phase::Tx(t) => {
                cx.engine.client_requests(t.client) > 0 || !matches!(t.state, TxState::Header)
            }
            _ => false,
        };
        !inflight && self.conn.queued() == 0
    }

    /// Read more input into the buffer: `Ok(false)` when none is there now.
    fn fill(&mut self) -> io::Result<bool> {
        fill_fields(&mut self.inb, &mut self.drained, &mut self.eof, &self.conn)
    }

    /// Make `n` bytes available in the input buffer (`n` ≤ its size).
    fn need(&mut self, n: usize) -> io::Result<bool> {
        while self.inb.avail() < n {
            if self.eof || !self.fill()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Run the session as far as its input, admission and output allow.
    pub fn drive(&mut self, cx: &Cx, make_waker: &dyn Fn() -> Waker) -> Drive {
        if self.conn.is_closed() {
            return Drive::Close;
        }
        let r = match self.phase {
            Phase::Hs(_) => self.drive_hs(cx),
            Phase::Tx(_) => self.drive_tx(cx),
            Phase::Done => return Drive::Close,
        };
        match r {
            Ok(Some(neg)) => {
                self.enter_tx(cx, neg, make_waker);
                Drive::Yield
            }
            Ok(None) => {
                if self.in_handshake() && self.eof {
                    return Drive::Close;
                }
                if matches!(self.phase, Phase::Done) {
                    return Drive::Close;
                }
                Drive::Wait
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Drive::Yield,
            Err(e) => {
                tracing::info!("client {}: {e}", self.conn.sock.peer());
                Drive::Close
            }
        }
    }

    fn drive_hs(&mut self, cx: &Cx) -> io::Result<Option<Negotiated>> {
        let Phase::Hs(hs) = &mut self.phase else {
            return Ok(None);
        };
        let mut out = Vec::new();
        loop {
            // A client that does not read its option replies gets no more.
            if self.conn.queued() > 64 << 10 {
                return Ok(None);
            }
            let need = if !hs.flags_done {
                4
            } else if hs.msg.len() < 16 {
                16
            } else {
                let len = u32::from_be_bytes([hs.msg[12], hs.msg[13], hs.msg[14], hs.msg[15]]);
                if len > MAX_OPTION_LEN {
                    return Err(invalid("option payload too large"));
                }
                16 + len as usize
            };
            while hs.msg.len() < need {
                if self.inb.avail() == 0 {
                    if self.eof {
                        return Ok(None);
                    }
                    if !fill_fields(&mut self.inb, &mut self.drained, &mut self.eof, &self.conn)? {
                        return Ok(None);
                    }
                    continue;
                }
                let k = (need - hs.msg.len()).min(self.inb.avail());
                hs.msg.extend_from_slice(&self.inb.bytes()[..k]);
                self.inb.consume(k);
            }
            if !hs.flags_done {
                let f = u32::from_be_bytes([hs.msg[0], hs.msg[1], hs.msg[2], hs.msg[3]]);
                hs.neg.client_flags(f)?;
                hs.flags_done = true;
                hs.msg.clear();
                continue;
            }
            if need == 16 && hs.msg[12..16] != [0, 0, 0, 0] {
                // The header is in: now its payload.
                continue;
            }
            let magic = u64::from_be_bytes(hs.msg[0..8].try_into().unwrap_or([0; 8]));
            if magic != IHAVEOPT {
                return Err(invalid("bad option magic"));
            }
            let opt = u32::from_be_bytes([hs.msg[8], hs.msg[9], hs.msg[10], hs.msg[11]]);
            let ctx = handshake::Ctx {
                exports: &cx.exports,
                shutting_down: cx.shutting_down.load(Ordering::Relaxed),
                tls: cx.opts.tls,
                peer: &self.peer,
            };
            out.clear();
            let step = hs.neg.option(&ctx, opt, &hs.msg[16..], &mut out);
            hs.msg.clear();
            hs.msg.shrink_to(4096);
            let step = step?;
            if matches!(step, Step::Done(_)) {
                // Past the handshake before the client can know it: the
                // accept path sheds only connections still negotiating, and
                // must never pick one whose client already has its reply.
                self.conn.in_handshake.store(false, Ordering::Release);
            }
            self.conn.send_bytes(&out);
            match step {
                Step::Continue => {}
                Step::Close => {
                    self.phase = Phase::Done;
                    return Ok(None);
                }
                Step::StartTls => {
                    let Some(cfg) = &cx.tls else {
                        return Err(invalid("STARTTLS accepted without a TLS configuration"));
                    };
                    if self.inb.avail() != 0 {
                        return Err(invalid("client sent data before the TLS handshake"));
                    }
                    self.conn.start_tls(cfg)?;
                    hs.neg.tls_active = true;
                }
                Step::Done(neg) => return Ok(Some(neg)),
            }
        }
    }

    fn enter_tx(&mut self, cx: &Cx, neg: Negotiated, make_waker: &dyn Fn() -> Waker) {
        let ex = &neg.export.export;
        let client = cx
            .engine
            .add_client_with(cx.opts.client, Some(make_waker()));
        self.conn
            .structured
            .store(neg.structured, Ordering::Relaxed);
        self.conn
            .meta_id
            .store(neg.meta_base_allocation.unwrap_or(0), Ordering::Relaxed);
        self.conn.in_handshake.store(false, Ordering::Release);
        tracing::debug!(
            "client {}: serving export {:?}",
            self.conn.sock.peer(),
            ex.name
        );
        let limits = ex.device.limits();
        self.phase = Phase::Tx(Box::new(Tx {
            // `dmsetup remove --force` ends the connection through this hook.
            _attached: {
                let closing = self.conn.clone();
                neg.export
                    .connect_closable(Box::new(move || closing.kill()))
            },
            client,
            meta: neg.meta_base_allocation,
            size: ex.device.size(),
            read_only: ex.is_read_only(),
            fast_zero: limits.write_zeroes,
            emulated_zero: !limits.write_zeroes,
            max_payload: u64::from(handshake::max_payload(&neg.export)),
            sink: self.conn.clone(),
            state: TxState::Header,
            export: neg.export,
        }));
        self.last_active = Instant::now();
    }

    /// Forget the session: give back what a half-parsed request holds and
    /// release the engine client (requests in flight still finish).
    pub fn close(&mut self, cx: &Cx) {
        if let Phase::Tx(tx) = std::mem::replace(&mut self.phase, Phase::Done) {
            let tx = *tx;
            if let TxState::Payload { req, ticket, .. } = tx.state {
                drop(req);
                cx.engine.cancel(ticket);
            }
            cx.engine.close_client(tx.client);
        }
        self.inb.release();
        self.conn.kill();
        self.conn.uncount();
    }

    fn drive_tx(&mut self, cx: &Cx) -> io::Result<Option<Negotiated>> {
        let mut parsed = 0;
        loop {
            let Phase::Tx(tx) = &mut self.phase else {
                return Ok(None);
            };
            match std::mem::replace(&mut tx.state, TxState::Header) {
                TxState::Header => {
                    if self.eof && self.inb.avail() < REQUEST_LEN {
                        return Ok(None);
                    }
                    if self.conn.queued() > tx_out_cap(cx) {
                        // Back-pressure: its replies wait for the client.
                        return Ok(None);
                    }
                    if parsed >= BATCH {
                        return Err(io::Error::from(io::ErrorKind::Interrupted));
                    }
                    if !self.need(REQUEST_LEN)? {
                        return Ok(None);
                    }
                    let mut hb = [0u8; REQUEST_LEN];
                    hb.copy_from_slice(&self.inb.bytes()[..REQUEST_LEN]);
                    self.inb.consume(REQUEST_LEN);
                    let h = RequestHeader::decode(&hb);
                    if h.magic != REQUEST_MAGIC {
                        return Err(invalid(
                            "bad request magic (not an NBD client, or out of sync)",
                        ));
                    }
                    parsed += 1;
                    self.last_active = Instant::now();
                    let Phase::Tx(tx) = &mut self.phase else {
                        return Ok(None);
                    };
                    match check(tx, &self.conn, &h)? {
                        Checked::Done => {}
                        Checked::Skip(left, error) => {
                            tx.state = TxState::Skip {
                                left,
                                cookie: h.cookie,
                                error,
                            }
                        }
                        Checked::Admit => tx.state = TxState::Admit(h),
                        Checked::Disconnect => {
                            self.eof = true;
                            return Ok(None);
                        }
                    }
                }
                TxState::Admit(h) => {
                    let q = tx.export.queue.clone();
                    let len = u64::from(h.len);
                    let data = matches!(h.cmd, CMD_READ | CMD_WRITE);
                    let status_buf = if h.flags & CMD_FLAG_REQ_ONE != 0 {
                        8
                    } else {
                        8 * MAX_EXTENTS
                    };
                    let mem = if data {
                        cx.engine.mem_cost(&q, h.offset, len)
                    } else if h.cmd == CMD_BLOCK_STATUS {
                        cx.engine.mem_cost_plain(status_buf as u64)
                    } else {
                        0
                    };
                    let work = if h.cmd == CMD_WRITE_ZEROES && tx.emulated_zero {
                        // Zeroing that writes every byte is charged as the
                        // write it is (capped so it is admitted when idle).
                        len.min(cx.opts.client.max_bytes)
                    } else if matches!(h.cmd, CMD_TRIM | CMD_WRITE_ZEROES) {
                        4096
                    } else {
                        0
                    };
                    let Some(mut t) = cx.engine.try_admit(tx.client, &q, mem, work) else {
                        tx.state = TxState::Admit(h);
                        return Ok(None);
                    };
                    let fua = h.flags & CMD_FLAG_FUA != 0;
                    let request = |op: Op, buf: Buf, head: usize| Request {
                        op,
                        cookie: h.cookie,
                        flags: h.flags,
                        offset: h.offset,
                        len,
                        fua,
                        buf,
                        head,
                        sink: tx.sink.clone(),
                    };
                    match h.cmd {
                        CMD_READ => {
                            let (buf, head) = cx.engine.charged_buffer(&mut t, &q, h.offset, len);
                            let r = request(Op::Read, buf, head);
                            cx.engine.submit_or_run(t, &q, r);
                        }
                        CMD_WRITE => {
                            let (buf, head) = cx.engine.charged_buffer(&mut t, &q, h.offset, len);
                            let req = request(Op::Write, buf, head);
                            tx.state = TxState::Payload {
                                req,
                                ticket: t,
                                filled: 0,
                            };
                        }
                        CMD_FLUSH => {
                            let r = request(Op::Flush, Buf::empty(), 0);
                            cx.engine.submit(t, &q, r)
                        }
                        CMD_WRITE_ZEROES => {
                            let r = request(Op::WriteZeroes, Buf::empty(), 0);
                            cx.engine.submit(t, &q, r)
                        }
                        CMD_BLOCK_STATUS => {
                            let buf = cx.engine.charged_plain_buffer(&mut t, &q, status_buf);
                            let r = request(Op::BlockStatus, buf, 0);
                            cx.engine.submit(t, &q, r)
                        }
                        _ => {
                            let r = request(Op::Trim, Buf::empty(), 0);
                            cx.engine.submit(t, &q, r)
                        }
                    }
                }
                TxState::Payload {
                    mut req,
                    ticket,
                    mut filled,
                } => {
                    let len = req.len as usize;
                    let head = req.head;
                    loop {
                        let k = (len - filled).min(self.inb.avail());
                        if k > 0 {
                            req.buf[head + filled..head + filled + k]
                                .copy_from_slice(&self.inb.bytes()[..k]);
                            self.inb.consume(k);
                            filled += k;
                        }
                        if filled == len {
                            break;
                        }
                        if self.eof {
                            return self.abort_payload(cx, req, ticket);
                        }
                        // Large remainder, nothing buffered: straight into
                        // the payload buffer (plain sockets).
                        if len - filled >= 4096 && !self.conn.is_tls() {
                            if self.drained {
                                return self.park_payload(req, ticket, filled);
                            }
                            let dst = &mut req.buf[head + filled..head + len];
                            let want = dst.len();
                            match self.conn.sock.try_read(dst) {
                                Ok(0) => {
                                    self.eof = true;
                                }
                                Ok(n) => {
                                    filled += n;
                                    if n < want {
                                        self.drained = true;
                                    }
                                }
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                    self.drained = true;
                                }
                                Err(e) => {
                                    self.abort_payload(cx, req, ticket)?;
                                    return Err(e);
                                }
                            }
                            continue;
                        }
                        match self.fill() {
                            Ok(true) => {}
                            Ok(false) if self.eof => {}
                            Ok(false) => return self.park_payload(req, ticket, filled),
                            Err(e) => {
                                self.abort_payload(cx, req, ticket)?;
                                return Err(e);
                            }
                        }
                    }
                    let Phase::Tx(tx) = &mut self.phase else {
                        return Ok(None);
                    };
                    let q = tx.export.queue.clone();
                    cx.engine.submit_or_run(ticket, &q, req);
                }
                TxState::Skip {
                    mut left,
                    cookie,
                    error,
                } => {
                    while left > 0 {
                        let k = (left as usize).min(self.inb.avail());
                        self.inb.consume(k);
                        left -= k as u64;
                        if left > 0 && !self.fill()? {
                            if self.eof {
                                return Ok(None);
                            }
                            let Phase::Tx(tx) = &mut self.phase else {
                                return Ok(None);
                            };
                            tx.state = TxState::Skip {
                                left,
                                cookie,
                                error,
                            };
                            return Ok(None);
                        }
                    }
                    // Only now: a client may not expect the reply to a
                    // request it is still sending.
                    self.conn.send_error(cookie, error, false, "");
                }
            }
        }
    }

    fn park_payload(
        &mut self,
        req: Request,
        ticket: Ticket,
        filled: usize,
    ) -> io::Result<Option<Negotiated>> {
        if let Phase::Tx(tx) = &mut self.phase {
            tx.state = TxState::Payload {
                req,
                ticket,
                filled,
            };
        }
        Ok(None)
    }

    fn abort_payload(
        &mut self,
        cx: &Cx,
        req: Request,
        ticket: Ticket,
    ) -> io::Result<Option<Negotiated>> {
        drop(req);
        cx.engine.cancel(ticket);
        self.eof = true;
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "client closed the connection in the middle of a write",
        ))
    }
}

/// Read more input into `inb`: `Ok(false)` when none is there now. A free
/// function over the session's fields, so the handshake can fill while it
/// holds its own state.
fn fill_fields(
    inb: &mut InBuf,
    drained: &mut bool,
    eof: &mut bool,
    conn: &Arc<Conn>,
) -> io::Result<bool> {
    if *drained {
        return Ok(false);
    }
    let tls = conn.is_tls();
    let space = inb.space();
    let want = space.len();
    match conn.read_input(space) {
        Ok(0) => {
            *eof = true;
            if inb.avail() == 0 {
                inb.release();
            }
            Ok(false)
        }
        Ok(n) => {
            inb.end += n;
            if n < want && !tls {
                *drained = true;
            }
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            if !tls {
                *drained = true;
            }
            if inb.avail() == 0 {
                inb.release();
            }
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Queued reply bytes above which a client's requests are not read.
fn tx_out_cap(cx: &Cx) -> u64 {
    cx.opts.client.max_bytes
}

enum Checked {
    /// Answered here (an error or a no-op).
    Done,
    /// Refused with this error, sent once its payload is skipped.
    Skip(u64, u32),
    /// Valid: admit and run it.
    Admit,
    Disconnect,
}

/// Check a request against the export; answer what needs no device.
fn check(tx: &Tx, conn: &Conn, h: &RequestHeader) -> io::Result<Checked> {
    let len = u64::from(h.len);
    let in_range = h.offset.checked_add(len).is_some_and(|e| e <= tx.size);
    let bad_flags = |allowed: u16| h.flags & !allowed != 0;
    let structured = conn.structured.load(Ordering::Relaxed);
    Ok(match h.cmd {
        CMD_READ => {
            let df = if structured { CMD_FLAG_DF } else { 0 };
            let err = if bad_flags(CMD_FLAG_FUA | df) {
                Some((EINVAL, "unsupported flags on READ"))
            } else if h.len > MAX_PAYLOAD {
                Some((EINVAL, "READ larger than the 32 MiB maximum"))
            } else if len > tx.max_payload {
                Some((
                    EINVAL,
                    "READ larger than the export's advertised maximum block size \
                     (its memory budget is small: raise --memory-budget)",
                ))
            } else if !in_range {
                Some((EINVAL, "READ beyond the end of the export"))
            } else {
                None
            };
            if let Some((e, msg)) = err {
                conn.send_error(h.cookie, e, true, msg);
                Checked::Done
            } else if len == 0 {
                conn.send_read(h.cookie, h.offset, None);
                Checked::Done
            } else {
                Checked::Admit
            }
        }
        CMD_WRITE => {
            if h.len > MAX_DISCARDED_PAYLOAD {
                return Err(invalid("absurd WRITE length"));
            }
            let err = if bad_flags(CMD_FLAG_FUA) {
                Some(EINVAL)
            } else if tx.read_only {
                Some(EPERM)
            } else if h.len > MAX_PAYLOAD || len > tx.max_payload {
                Some(EINVAL)
            } else if !in_range {
                Some(ENOSPC)
            } else {
                None
            };
            if let Some(e) = err {
                // The payload is already on the wire: consume it so the
                // stream stays in sync, then refuse the request.
                Checked::Skip(len, e)
            } else if len == 0 {
                conn.send_ok(h.cookie);
                Checked::Done
            } else {
                Checked::Admit
            }
        }
        CMD_DISC => Checked::Disconnect,
        CMD_FLUSH => {
            if bad_flags(CMD_FLAG_FUA) || h.offset != 0 || len != 0 {
                conn.send_error(h.cookie, EINVAL, false, "");
                Checked::Done
            } else {
                Checked::Admit
            }
        }
        CMD_TRIM | CMD_WRITE_ZEROES => {
            let zero = h.cmd == CMD_WRITE_ZEROES;
            let allowed = if zero {
                CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
            } else {
                CMD_FLAG_FUA
            };
            let err = if bad_flags(allowed) {
                Some(EINVAL)
            } else if tx.read_only {
                Some(EPERM)
            } else if !in_range {
                Some(if zero { ENOSPC } else { EINVAL })
            } else if zero && h.flags & CMD_FLAG_FAST_ZERO != 0 && !tx.fast_zero {
                Some(ENOTSUP)
            } else {
                None
            };
            if let Some(e) = err {
                conn.send_error(h.cookie, e, false, "");
                Checked::Done
            } else if len == 0 {
                conn.send_ok(h.cookie);
                Checked::Done
            } else {
                Checked::Admit
            }
        }
        CMD_CACHE => {
            // A prefetch hint; with no cache of our own there is
            // nothing to do beyond checking the request.
            if bad_flags(CMD_FLAG_FUA) || !in_range {
                conn.send_error(h.cookie, EINVAL, false, "");
            } else {
                conn.send_ok(h.cookie);
            }
            Checked::Done
        }
        CMD_BLOCK_STATUS
            if tx.meta.is_some()
                && !bad_flags(CMD_FLAG_FUA | CMD_FLAG_REQ_ONE)
                && in_range
                && len > 0 =>
        {
            Checked::Admit
        }
        _ => {
            conn.send_error(h.cookie, EINVAL, false, "");
            Checked::Done
        }
    })
}
