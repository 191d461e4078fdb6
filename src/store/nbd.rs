//! A remote NBD export as a backing store: udm as an NBD *client*, so a
//! table can stack on nbdkit, qemu-nbd, another udm or a remote machine.
//!
//! How it works, and why:
//! - **Handshake**: fixed newstyle, `NBD_OPT_STRUCTURED_REPLY` (so reads
//!   may come back as data and hole chunks, and errors carry messages),
//!   then `NBD_OPT_GO` asking for block sizes (falls back to
//!   `NBD_OPT_EXPORT_NAME` for servers without GO). Old-style servers and
//!   TLS are refused with a message.
//! - **Many requests in flight**: every call takes a slot in a fixed table
//!   (its index and a sequence number form the NBD cookie), sends its
//!   request under the send lock and sleeps on the slot's condition
//!   variable. One reader thread per connection reads replies in whatever
//!   order the server sends them, matches them to slots by cookie, and
//!   reads read data straight into the waiting caller's buffer (no copy in
//!   udm). Calls are synchronous like every [`BlockDevice`]; the engine
//!   gives this store [`QUEUE_DEPTH`] workers of its own (see
//!   `Limits::queue_depth`), so that many requests are on the wire at once.
//! - **Reconnect**: when the connection breaks (the server restarts, the
//!   network drops, the server answers `ESHUTDOWN`), every request in
//!   flight and every new one waits while the store reconnects (backoff
//!   from 50 ms to 1 s) and is then **sent again** on the new connection;
//!   the export must come back with the same size. A request that has not
//!   got through within [`RETRY_WINDOW`] of the break, or whose connection
//!   broke [`MAX_ATTEMPTS`] times, fails with EIO and the error names the
//!   export; later requests try to reconnect again (one attempt at a time,
//!   shared by the requests that arrive while it runs), so a
//!   server that comes back later is used again without a restart of udm.
//!   Resending is safe because the engine never has two overlapping
//!   requests in flight where either is a write, so a write sent twice
//!   writes the same bytes, and a read sent twice reads them. What a resend
//!   cannot repair: a server that *lost* writes it had acknowledged but not
//!   yet flushed (a crash of a server with a volatile cache). nbdkit and
//!   qemu-nbd over a file keep such writes in the kernel's page cache,
//!   which outlives their process.
//! - A server that accepts a request and never answers is not detected (no
//!   per-request timeout): the same as the kernel's NBD client without
//!   `-timeout`.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::device::write_zeroes_by_writing;
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

use crate::protocol::nbd::{
    CMD_DISC, CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES, ESHUTDOWN,
    FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT, INFO_BLOCK_SIZE, INFO_EXPORT, MAX_PAYLOAD,
    NBD_MAGIC, OLDSTYLE_MAGIC, OPT_EXPORT_NAME, OPT_GO, OPT_REPLY_MAGIC, OPT_STRUCTURED_REPLY,
    REPLY_FLAG_DONE, REPLY_TYPE_ERROR_BIT, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA,
    REPLY_TYPE_OFFSET_HOLE, REP_ACK, REP_ERR_UNSUP, REP_INFO, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC,
    STRUCTURED_REPLY_MAGIC, TF_READ_ONLY, TF_SEND_FLUSH, TF_SEND_FUA, TF_SEND_TRIM,
    TF_SEND_WRITE_ZEROES,
};

/// Requests this store asks the engine to keep in flight.
pub const QUEUE_DEPTH: u32 = 64;
/// Slots per connection (at least the queue depth, plus room for flushes
/// and the LUKS reader, which call from outside the engine).
const SLOTS: usize = 128;
/// How long requests keep waiting for a broken connection to come back.
pub const RETRY_WINDOW: Duration = Duration::from_secs(30);
/// Connections one request may see break before it fails.
pub const MAX_ATTEMPTS: u32 = 8;
/// Largest payload sent in one request (the protocol's default maximum).
/// Deadline for connecting and for each handshake read.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    Tcp(String, u16),
    Unix(PathBuf),
}

/// A remote export: server address and export name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdSpec {
    pub addr: NbdAddr,
    pub export: String,
}

impl std::fmt::Display for NbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.addr {
            NbdAddr::Tcp(h, p) if h.contains(':') => {
                write!(f, "nbd://[{h}]:{p}/{}", self.export)
            }
            NbdAddr::Tcp(h, p) => write!(f, "nbd://{h}:{p}/{}", self.export),
            NbdAddr::Unix(s) => write!(f, "nbd+unix:///{}?socket={}", self.export, s.display()),
        }
    }
}

enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(b),
            Sock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What the handshake told us about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ExportInfo {
    size: u64,
    flags: u16,
    min_block: u32,
    max_payload: u32,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_option(w: &mut impl Write, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut h = Vec::with_capacity(16 + data.len());
    h.extend_from_slice(&IHAVEOPT.to_be_bytes());
    h.extend_from_slice(&opt.to_be_bytes());
    h.extend_from_slice(&(data.len() as u32).to_be_bytes());
    h.extend_from_slice(data);
    w.write_all(&h)
}

/// One option reply: (type, data). Replies longer than 64 KiB are refused
/// (no option udm sends has a legitimate reply that long).
fn read_option_reply(r: &mut impl Read, opt: u32) -> Result<(u32, Vec<u8>), String> {
    let mut h = [0u8; 20];
    r.read_exact(&mut h).map_err(|e| e.to_string())?;
    if be64(&h) != OPT_REPLY_MAGIC {
        return Err("bad option reply magic (not an NBD server?)".into());
    }
    if be32(&h[8..]) != opt {
        return Err(format!(
            "reply to option {} instead of {opt}",
            be32(&h[8..])
        ));
    }
    let (ty, len) = (be32(&h[12..]), be32(&h[16..]));
    if len > 64 << 10 {
        return Err(format!("option reply of {len} bytes"));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data).map_err(|e| e.to_string())?;
    Ok((ty, data))
}

fn option_error(ty: u32, data: &[u8]) -> String {
    let msg = String::from_utf8_lossy(data);
    let what = match ty {
        0x8000_0001 => "unsupported",
        0x8000_0002 => "refused by policy",
        0x8000_0003 => "invalid",
        0x8000_0005 => "TLS required",
        0x8000_0006 => "no such export",
        0x8000_0007 => "server shutting down",
        0x8000_0008 => "block size constraints not supported",
        _ => "error",
    };
    if msg.is_empty() {
        format!("server: {what}")
    } else {
        format!("server: {what}: {msg}")
    }
}

/// Connect and negotiate; returns the socket, whether structured replies
/// are on, and the export's facts.
fn handshake(spec: &NbdSpec) -> Result<(Sock, bool, ExportInfo), String> {
    let mut s = match &spec.addr {
        NbdAddr::Tcp(h, p) => {
            let addrs: Vec<_> = (h.as_str(), *p)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {h}: {e}"))?
                .collect();
            let mut last = None;
            let mut sock = None;
            for a in addrs {
                match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                    Ok(t) => {
                        sock = Some(t);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            let t = sock.ok_or_else(|| match last {
                Some(e) => format!("cannot connect: {e}"),
                None => format!("{h} has no address"),
            })?;
            let _ = t.set_nodelay(true);
            Sock::Tcp(t)
        }
        NbdAddr::Unix(p) => Sock::Unix(
            UnixStream::connect(p)
                .map_err(|e| format!("cannot connect to {}: {e}", p.display()))?,
        ),
    };
    s.set_read_timeout(Some(CONNECT_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let io = |e: io::Error| format!("handshake: {e}");
    if read_u64(&mut s).map_err(io)? != NBD_MAGIC {
        return Err("not an NBD server (bad greeting)".into());
    }
    match read_u64(&mut s).map_err(io)? {
        IHAVEOPT => {}
        OLDSTYLE_MAGIC => {
            return Err(
                "old-style NBD servers are not supported; run the server in newstyle mode".into(),
            )
        }
        _ => return Err("bad greeting magic".into()),
    }
    let mut f = [0u8; 2];
    s.read_exact(&mut f).map_err(io)?;
    let sflags = u16::from_be_bytes(f);
    if sflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err("server does not speak fixed newstyle negotiation".into());
    }
    let no_zeroes = sflags & FLAG_NO_ZEROES != 0;
    let cflags = u32::from(FLAG_FIXED_NEWSTYLE)
        | if no_zeroes {
            u32::from(FLAG_NO_ZEROES)
        } else {
            0
        };
    s.write_all(&cflags.to_be_bytes()).map_err(io)?;

    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).map_err(io)?;
    let (ty, data) = read_option_reply(&mut s, OPT_STRUCTURED_REPLY)?;
    let structured = match ty {
        REP_ACK => true,
        t if t & 0x8000_0000 != 0 => false,
        t => {
            return Err(format!(
                "unexpected reply {t} to STRUCTURED_REPLY: {data:?}"
            ))
        }
    };

    let name = spec.export.as_bytes();
    let mut go = Vec::with_capacity(8 + name.len());
    go.extend_from_slice(&(name.len() as u32).to_be_bytes());
    go.extend_from_slice(name);
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut s, OPT_GO, &go).map_err(io)?;
    let mut info = ExportInfo {
        size: u64::MAX,
        flags: 0,
        min_block: 1,
        max_payload: MAX_PAYLOAD,
    };
    loop {
        let (ty, data) = read_option_reply(&mut s, OPT_GO)?;
        match ty {
            REP_ACK => break,
            REP_INFO if data.len() >= 2 => match be16(&data) {
                INFO_EXPORT if data.len() >= 12 => {
                    info.size = be64(&data[2..]);
                    info.flags = be16(&data[10..]);
                }
                INFO_BLOCK_SIZE if data.len() >= 14 => {
                    info.min_block = be32(&data[2..]).max(1);
                    info.max_payload = be32(&data[10..]).clamp(1, MAX_PAYLOAD);
                }
                _ => {}
            },
            REP_INFO => return Err("short INFO reply".into()),
            REP_ERR_UNSUP => {
                // A server without GO: the old way, no error reply possible.
                send_option(&mut s, OPT_EXPORT_NAME, name).map_err(io)?;
                let mut b = [0u8; 10];
                s.read_exact(&mut b).map_err(|e| {
                    format!(
                        "export '{}' refused (server closed after EXPORT_NAME: {e})",
                        spec.export
                    )
                })?;
                info.size = be64(&b);
                info.flags = be16(&b[8..]);
                if !no_zeroes {
                    let mut z = [0u8; 124];
                    s.read_exact(&mut z).map_err(io)?;
                }
                break;
            }
            t if t & 0x8000_0000 != 0 => {
                return Err(format!(
                    "export '{}': {}",
                    spec.export,
                    option_error(t, &data)
                ))
            }
            t => return Err(format!("unexpected reply {t} to GO")),
        }
    }
    if info.size == u64::MAX {
        return Err("server sent no export size".into());
    }
    if !info.min_block.is_power_of_two() || info.min_block > 64 << 10 {
        return Err(format!(
            "server's minimum block size {} is not usable",
            info.min_block
        ));
    }
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((s, structured, info))
}

/// A request's outcome as the reader saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pending,
    /// Done; 0 = success, else the NBD error value.
    Done(u32),
    /// The connection broke before the reply.
    Lost,
}

struct Slot {
    seq: u32,
    busy: bool,
    outcome: Outcome,
    /// First error of a structured reply that is not finished yet.
    err: u32,
    /// Read requests: where the data goes, the request's offset and length.
    buf: *mut u8,
    offset: u64,
    len: usize,
}

// SAFETY: `buf` is only dereferenced by the connection's reader thread
// while the caller that owns the buffer sleeps in `Conn::call` waiting for
// this slot's outcome; the caller does not return (and so does not give up
// the `&mut [u8]` the pointer came from) before the outcome is set, which
// the reader does only after its last access. The pointer is never used
// after the slot is freed.
unsafe impl Send for Slot {}

struct Table {
    slots: Vec<Slot>,
    free: Vec<u16>,
    next_seq: u32,
    /// Why the connection is unusable (set once, never cleared).
    dead: Option<String>,
}

/// One connection to the server.
struct Conn {
    send: Mutex<Sock>,
    /// A handle for shutting the socket down from any thread.
    control: Sock,
    table: Mutex<Table>,
    /// One per slot: the caller waiting on it.
    wake: Vec<Condvar>,
    /// Callers waiting for a free slot.
    free_cv: Condvar,
    structured: bool,
    info: ExportInfo,
    reader: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request to send.
struct Cmd<'a> {
    ty: u16,
    flags: u16,
    offset: u64,
    len: u32,
    payload: &'a [IoSlice<'a>],
    read: Option<&'a mut [u8]>,
}

impl Conn {
    fn open(spec: &NbdSpec) -> Result<Arc<Conn>, String> {
        let (sock, structured, info) = handshake(spec)?;
        let recv = sock.try_clone().map_err(|e| e.to_string())?;
        let control = sock.try_clone().map_err(|e| e.to_string())?;
        let slots = (0..SLOTS)
            .map(|_| Slot {
                seq: 0,
                busy: false,
                outcome: Outcome::Pending,
                err: 0,
                buf: std::ptr::null_mut(),
                offset: 0,
                len: 0,
            })
            .collect();
        let conn = Arc::new(Conn {
            send: Mutex::new(sock),
            control,
            table: Mutex::new(Table {
                slots,
                free: (0..SLOTS as u16).rev().collect(),
                next_seq: 1,
                dead: None,
            }),
            wake: (0..SLOTS).map(|_| Condvar::new()).collect(),
            free_cv: Condvar::new(),
            structured,
            info,
            reader: Mutex::new(None),
        });
        let c = conn.clone();
        let h = std::thread::Builder::new()
            .name("udm-nbd-client".into())
            .spawn(move || c.reader(recv))
            .map_err(|e| format!("cannot start the reply reader: {e}"))?;
        *lock(&conn.reader) = Some(h);
        Ok(conn)
    }

    fn is_dead(&self) -> Option<String> {
        lock(&self.table).dead.clone()
    }

    /// Mark the connection broken and wake the reader (which then fails
    /// every waiting request as lost).
    fn kill(&self, why: String) {
        let mut t = lock(&self.table);
        if t.dead.is_none() {
            t.dead = Some(why);
        }
        drop(t);
        self.control.shutdown();
    }

    /// Send one request and wait for its reply. `Err` = the connection
    /// broke (the caller may resend); `Ok(errno)` = the server's answer.
    fn call(&self, cmd: Cmd<'_>) -> Result<u32, String> {
        let mut t = lock(&self.table);
        let i = loop {
            if let Some(why) = &t.dead {
                return Err(why.clone());
            }
            if let Some(i) = t.free.pop() {
                break i as usize;
            }
            t = self.free_cv.wait(t).unwrap_or_else(|p| p.into_inner());
        };
        let seq = t.next_seq;
        t.next_seq = t.next_seq.wrapping_add(1).max(1);
        let (buf, blen) = match cmd.read {
            Some(b) => (b.as_mut_ptr(), b.len()),
            None => (std::ptr::null_mut(), 0),
        };
        t.slots[i] = Slot {
            seq,
            busy: true,
            outcome: Outcome::Pending,
            err: 0,
            buf,
            offset: cmd.offset,
            len: blen,
        };
        drop(t);
        let cookie = (u64::from(seq) << 16) | i as u64;
        let mut h = [0u8; 28];
        h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&cmd.flags.to_be_bytes());
        h[6..8].copy_from_slice(&cmd.ty.to_be_bytes());
        h[8..16].copy_from_slice(&cookie.to_be_bytes());
        h[16..24].copy_from_slice(&cmd.offset.to_be_bytes());
        h[24..28].copy_from_slice(&cmd.len.to_be_bytes());
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(1 + cmd.payload.len());
        iov.push(IoSlice::new(&h));
        iov.extend_from_slice(cmd.payload);
        let sent = write_all_vectored(&mut *lock(&self.send), &mut iov);
        if let Err(e) = sent {
            self.kill(format!("send failed: {e}"));
        }
        // Wait for the outcome even after a failed send: the reader may be
        // inside this slot's buffer until it has set one.
        let mut t = lock(&self.table);
        while t.slots[i].outcome == Outcome::Pending {
            t = self.wake[i].wait(t).unwrap_or_else(|p| p.into_inner());
        }
        let out = t.slots[i].outcome;
        let s = &mut t.slots[i];
        s.busy = false;
        s.buf = std::ptr::null_mut();
        s.len = 0;
        t.free.push(i as u16);
        let why = t.dead.clone();
        drop(t);
        self.free_cv.notify_one();
        match out {
            Outcome::Done(ESHUTDOWN) => {
                self.kill("server is shutting down (ESHUTDOWN)".into());
                Err("server is shutting down (ESHUTDOWN)".into())
            }
            Outcome::Done(e) => Ok(e),
            Outcome::Lost | Outcome::Pending => {
                Err(why.unwrap_or_else(|| "connection lost".into()))
            }
        }
    }

    /// The reply reader: runs until the connection breaks, then fails
    /// every request still waiting.
    fn reader(self: Arc<Self>, sock: Sock) {
        let mut r = io::BufReader::with_capacity(64 << 10, sock);
        let why = match self.read_replies(&mut r) {
            Ok(()) => "connection closed".to_string(),
            Err(e) => e,
        };
        let mut t = lock(&self.table);
        if t.dead.is_none() {
            t.dead = Some(why);
        }
        for (i, s) in t.slots.iter_mut().enumerate() {
            if s.busy && s.outcome == Outcome::Pending {
                s.outcome = Outcome::Lost;
                self.wake[i].notify_one();
            }
        }
        drop(t);
        self.free_cv.notify_all();
        self.control.shutdown();
    }

    /// The slot a cookie names, if it is waiting.
    fn slot_of(&self, t: &Table, cookie: u64) -> Result<usize, String> {
        let i = (cookie & 0xffff) as usize;
        let seq = (cookie >> 16) as u32;
        match t.slots.get(i) {
            Some(s) if s.busy && s.seq == seq && s.outcome == Outcome::Pending => Ok(i),
            _ => Err(format!("reply for unknown cookie {cookie:#x}")),
        }
    }

    fn finish(&self, i: usize, errno: u32) {
        let mut t = lock(&self.table);
        let s = &mut t.slots[i];
        let e = if s.err != 0 { s.err } else { errno };
        s.outcome = Outcome::Done(e);
        drop(t);
        self.wake[i].notify_one();
    }

    /// Read `n` bytes of read data into slot `i` at byte `at` of its
    /// buffer (checked by the caller to be inside it).
    fn fill(&self, r: &mut impl Read, i: usize, at: usize, n: usize) -> io::Result<()> {
        let (ptr, len) = {
            let t = lock(&self.table);
            (t.slots[i].buf, t.slots[i].len)
        };
        debug_assert!(at + n <= len);
        // SAFETY: the slot is busy and pending, so its caller is asleep in
        // `call` and the buffer behind `ptr` (of `len` bytes, borrowed
        // mutably for the whole call) is ours to write until we set the
        // outcome; `at + n <= len` was checked against the reply's range.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(at), n) };
        r.read_exact(dst)
    }

    fn zero(&self, i: usize, at: usize, n: usize) {
        let t = lock(&self.table);
        let ptr = t.slots[i].buf;
        // SAFETY: as in `fill`; the table lock is held besides.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(at), n) };
        dst.fill(0);
    }

    fn read_replies(&self, r: &mut impl Read) -> Result<(), String> {
        let io = |e: io::Error| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                "server closed the connection".to_string()
            } else {
                format!("receive failed: {e}")
            }
        };
        loop {
            let mut m = [0u8; 4];
            match r.read(&mut m[..1]) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            }
            r.read_exact(&mut m[1..]).map_err(io)?;
            match u32::from_be_bytes(m) {
                SIMPLE_REPLY_MAGIC => {
                    let mut h = [0u8; 12];
                    r.read_exact(&mut h).map_err(io)?;
                    let (errno, cookie) = (be32(&h), be64(&h[4..]));
                    let (i, len, is_read) = {
                        let t = lock(&self.table);
                        let i = self.slot_of(&t, cookie)?;
                        (i, t.slots[i].len, !t.slots[i].buf.is_null())
                    };
                    if is_read && errno == 0 {
                        if self.structured {
                            return Err(
                                "simple reply with data after structured replies were agreed"
                                    .into(),
                            );
                        }
                        self.fill(r, i, 0, len).map_err(io)?;
                    }
                    self.finish(i, errno);
                }
                STRUCTURED_REPLY_MAGIC => {
                    let mut h = [0u8; 16];
                    r.read_exact(&mut h).map_err(io)?;
                    let (flags, ty, cookie, plen) = (
                        be16(&h),
                        be16(&h[2..]),
                        be64(&h[4..]),
                        be32(&h[12..]) as usize,
                    );
                    let (i, base, len) = {
                        let t = lock(&self.table);
                        let i = self.slot_of(&t, cookie)?;
                        (i, t.slots[i].offset, t.slots[i].len)
                    };
                    match ty {
                        REPLY_TYPE_NONE if plen == 0 => {}
                        REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                            if plen < 8 || (ty == REPLY_TYPE_OFFSET_HOLE && plen != 12) {
                                return Err(format!("bad chunk length {plen}"));
                            }
                            let off = read_u64(r).map_err(io)?;
                            let n = if ty == REPLY_TYPE_OFFSET_DATA {
                                plen - 8
                            } else {
                                let mut b = [0u8; 4];
                                r.read_exact(&mut b).map_err(io)?;
                                u32::from_be_bytes(b) as usize
                            };
                            let at = off.checked_sub(base).map(|a| a as usize);
                            let at = match at {
                                Some(a) if a <= len && n <= len - a => a,
                                _ => {
                                    return Err(format!(
                                    "read chunk [{off}, +{n}) outside the request [{base}, +{len})"
                                ))
                                }
                            };
                            if ty == REPLY_TYPE_OFFSET_DATA {
                                self.fill(r, i, at, n).map_err(io)?;
                            } else {
                                self.zero(i, at, n);
                            }
                        }
                        t if t & REPLY_TYPE_ERROR_BIT != 0 && plen >= 6 => {
                            let mut b = vec![0u8; plen.min(64 << 10)];
                            if plen > b.len() {
                                return Err(format!("error chunk of {plen} bytes"));
                            }
                            r.read_exact(&mut b).map_err(io)?;
                            let errno = be32(&b).max(5);
                            let mlen = be16(&b[4..]) as usize;
                            let msg = String::from_utf8_lossy(b.get(6..6 + mlen).unwrap_or(&[]));
                            tracing::debug!(
                                "NBD server error {errno} for cookie {cookie:#x}: {msg}"
                            );
                            let mut t = lock(&self.table);
                            if t.slots[i].err == 0 {
                                t.slots[i].err = errno;
                            }
                        }
                        t => return Err(format!("unknown reply chunk type {t} ({plen} bytes)")),
                    }
                    if flags & REPLY_FLAG_DONE != 0 {
                        self.finish(i, 0);
                    }
                }
                m => return Err(format!("bad reply magic {m:#x}")),
            }
        }
    }

    /// Say goodbye and close.
    fn close(&self) {
        if self.is_dead().is_none() {
            let mut h = [0u8; 28];
            h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            h[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
            let _ = lock(&self.send).write_all(&h);
        }
        self.kill("closed".into());
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}

enum Link {
    Up(Arc<Conn>),
    /// Someone is connecting; wait for them.
    Connecting,
    /// Broken since `since`; the next attempt is due at `next`.
    Down {
        since: Instant,
        next: Instant,
        backoff: Duration,
        why: String,
    },
}

/// A remote NBD export used as a block device.
pub struct NbdStore {
    spec: NbdSpec,
    info: ExportInfo,
    structured: bool,
    read_only: bool,
    retry_window: Duration,
    link: Mutex<Link>,
    link_cv: Condvar,
}

impl NbdStore {
    /// Connect to the export; `read_only` also when the server says so.
    pub fn connect(spec: NbdSpec, read_only: bool) -> Result<NbdStore, String> {
        let conn = Conn::open(&spec).map_err(|e| format!("NBD export {spec}: {e}"))?;
        if conn.info.flags & TF_READ_ONLY != 0 && !read_only {
            tracing::info!("NBD export {spec} is read-only on the server; serving it read-only");
        }
        Ok(NbdStore {
            info: conn.info,
            structured: conn.structured,
            read_only: read_only || conn.info.flags & TF_READ_ONLY != 0,
            spec,
            retry_window: RETRY_WINDOW,
            link: Mutex::new(Link::Up(conn)),
            link_cv: Condvar::new(),
        })
    }

    /// How long requests wait for a broken connection to come back
    /// (default [`RETRY_WINDOW`]).
    pub fn with_retry_window(mut self, d: Duration) -> NbdStore {
        self.retry_window = d;
        self
    }

    /// Whether the server agreed to structured replies.
    pub fn structured_replies(&self) -> bool {
        self.structured
    }

    fn eio(&self, why: &str) -> DevError {
        DevError::Io(io::Error::other(format!("NBD export {}: {why}", self.spec)))
    }

    /// The live connection, reconnecting if it broke. Fails when the link
    /// has been down for longer than [`RETRY_WINDOW`] and one more attempt
    /// fails.
    fn conn(&self) -> DevResult<Arc<Conn>> {
        let mut l = lock(&self.link);
        // Whether this caller waited for someone else's attempt: once the
        // window has passed, that attempt's failure is this caller's too.
        let mut waited = false;
        loop {
            match &mut *l {
                Link::Up(c) => match c.is_dead() {
                    None => return Ok(c.clone()),
                    Some(why) => {
                        tracing::warn!(
                            "NBD export {}: connection lost ({why}); reconnecting",
                            self.spec
                        );
                        let old = c.clone();
                        let now = Instant::now();
                        *l = Link::Down {
                            since: now,
                            next: now,
                            backoff: Duration::from_millis(50),
                            why,
                        };
                        // Join its reader outside the lock.
                        drop(l);
                        old.close();
                        l = lock(&self.link);
                    }
                },
                Link::Connecting => {
                    waited = true;
                    l = self.link_cv.wait(l).unwrap_or_else(|p| p.into_inner());
                }
                Link::Down {
                    since,
                    next,
                    backoff,
                    why,
                } => {
                    let now = Instant::now();
                    let over = now.duration_since(*since) >= self.retry_window;
                    if over && waited {
                        return Err(self.eio(&format!(
                            "unreachable for {} s: {why}",
                            since.elapsed().as_secs()
                        )));
                    }
                    // Within the window, attempts follow the backoff; past
                    // it, every request that finds no attempt under way
                    // makes one, so a server that is back is used at once.
                    if !over && now < *next {
                        let wait = *next - now;
                        l = self
                            .link_cv
                            .wait_timeout(l, wait)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        continue;
                    }
                    let (since, backoff) = (*since, *backoff);
                    *l = Link::Connecting;
                    drop(l);
                    let r = Conn::open(&self.spec).and_then(|c| {
                        if c.info.size != self.info.size {
                            c.close();
                            Err(format!(
                                "export came back with size {} instead of {}; not using it",
                                c.info.size, self.info.size
                            ))
                        } else {
                            Ok(c)
                        }
                    });
                    l = lock(&self.link);
                    let gave_up = match r {
                        Ok(c) => {
                            tracing::info!("NBD export {}: reconnected", self.spec);
                            *l = Link::Up(c);
                            None
                        }
                        Err(why) => {
                            let out = (since.elapsed() >= self.retry_window).then(|| why.clone());
                            *l = Link::Down {
                                since,
                                next: Instant::now() + backoff,
                                backoff: (backoff * 2).min(Duration::from_secs(1)),
                                why,
                            };
                            out
                        }
                    };
                    self.link_cv.notify_all();
                    if let Some(why) = gave_up {
                        return Err(self.eio(&format!(
                            "unreachable for {} s: {why}",
                            since.elapsed().as_secs()
                        )));
                    }
                }
            }
        }
    }

    /// Run one command, resending it on a new connection if the old one
    /// broke.
    fn run(
        &self,
        ty: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[IoSlice<'_>],
        mut read: Option<&mut [u8]>,
    ) -> DevResult<()> {
        let mut attempts = 0;
        loop {
            let conn = self.conn()?;
            let cmd = Cmd {
                ty,
                flags,
                offset,
                len,
                payload,
                read: read.as_deref_mut(),
            };
            match conn.call(cmd) {
                Ok(0) => return Ok(()),
                Ok(errno) => {
                    return Err(DevError::Io(io::Error::from_raw_os_error(errno as i32)));
                }
                Err(why) => {
                    attempts += 1;
                    if attempts >= MAX_ATTEMPTS {
                        return Err(self.eio(&format!(
                            "request failed on {attempts} connections in a row: {why}"
                        )));
                    }
                }
            }
        }
    }

    fn write_cmd(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let native_fua = fua && self.info.flags & TF_SEND_FUA != 0;
        let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
        self.run(CMD_WRITE, flags, offset, len as u32, bufs, None)?;
        if fua && !native_fua {
            self.flush()?;
        }
        Ok(())
    }
}

impl Drop for NbdStore {
    fn drop(&mut self) {
        if let Link::Up(c) = &*lock(&self.link) {
            c.close();
        }
    }
}

impl BlockDevice for NbdStore {
    fn size(&self) -> u64 {
        self.info.size
    }

    fn limits(&self) -> Limits {
        let block = self.info.min_block.max(512);
        let max = self.info.max_payload.max(block) / block * block;
        Limits {
            logical_block_size: block,
            optimal_io_size: block.max(4096),
            max_io_size: max,
            discard: self.info.flags & TF_SEND_TRIM != 0,
            write_zeroes: self.info.flags & TF_SEND_WRITE_ZEROES != 0,
            read_only: self.read_only,
            queue_depth: QUEUE_DEPTH,
            io_boundary: 0,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let max = self.limits().max_io_size as usize;
        let mut pos = 0;
        while pos < buf.len() {
            let n = (buf.len() - pos).min(max);
            let at = offset + pos as u64;
            self.run(CMD_READ, 0, at, n as u32, &[], Some(&mut buf[pos..pos + n]))?;
            pos += n;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        let b = data.as_slice();
        let max = self.limits().max_io_size as usize;
        let mut pos = 0;
        while pos < b.len() {
            let n = (b.len() - pos).min(max);
            self.write_cmd(offset + pos as u64, &[IoSlice::new(&b[pos..pos + n])], fua)?;
            pos += n;
        }
        Ok(())
    }

    fn write_vectored(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if len <= self.limits().max_io_size as usize {
            return self.write_cmd(offset, bufs, fua);
        }
        let mut pos = offset;
        for (i, b) in bufs.iter().enumerate() {
            self.write(pos, WriteBuf::Borrowed(b), fua && i + 1 == bufs.len())?;
            pos += b.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only || self.info.flags & TF_SEND_FLUSH == 0 {
            return Ok(());
        }
        self.run(CMD_FLUSH, 0, 0, 0, &[], None)
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        if self.info.flags & TF_SEND_TRIM == 0 {
            return Ok(());
        }
        let step = (u32::MAX as u64 / 2) & !(u64::from(self.limits().logical_block_size) - 1);
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(step);
            self.run(CMD_TRIM, 0, offset + pos, n as u32, &[], None)?;
            pos += n;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        if self.info.flags & TF_SEND_WRITE_ZEROES == 0 {
            return write_zeroes_by_writing(self, offset, len, fua);
        }
        let native_fua = fua && self.info.flags & TF_SEND_FUA != 0;
        let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
        let step = (u32::MAX as u64 / 2) & !(u64::from(self.limits().logical_block_size) - 1);
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(step);
            self.run(CMD_WRITE_ZEROES, flags, offset + pos, n as u32, &[], None)?;
            pos += n;
        }
        if fua && !native_fua {
            self.flush()?;
        }
        Ok(())
    }
}
