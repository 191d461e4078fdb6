//! Transmission: the session's request loop once an export is chosen.
//! Each request goes through named steps: read and check its header,
//! admit it (the engine's fair budget), receive a write's payload straight
//! into its buffer, then submit it; a refused write's payload is skipped.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::Extent;
use crate::engine::{Buf, ClientId, Op, Request, Sink, Ticket};

use super::super::export::{ConnectionGuard, Exported};
use super::super::handshake::{self, Negotiated};
use super::super::proto::*;
use super::input::Input;
use super::options::Cx;
use super::reply::{Conn, MAX_EXTENTS};
use super::validate::{check, invalid, Checked, ExportView};

/// Requests parsed per drive before other connections get their turn.
const BATCH: usize = 32;

/// The time of one drive, read from the clock once, when first needed:
/// the idle and payload deadlines it feeds are seconds long, and three
/// clock reads per 4 KiB write showed in the loop's CPU profile.
#[derive(Default)]
struct Stamp(Option<Instant>);

impl Stamp {
    fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

enum TxState {
    Header,
    Admit(RequestHeader),
    Payload(Payload),
    /// Discard a refused write's payload, then send its error.
    Skip {
        left: u64,
        cookie: u64,
        error: u32,
    },
}

/// A write whose payload is being received.
struct Payload {
    req: Request,
    ticket: Ticket,
    /// Payload bytes in the buffer so far.
    filled: usize,
    /// When the payload last made progress (or was admitted).
    progress: Instant,
}

/// A session in transmission.
pub(super) struct Tx {
    export: Arc<Exported>,
    _attached: ConnectionGuard,
    pub(super) client: ClientId,
    view: ExportView,
    emulated_zero: bool,
    sink: Arc<dyn Sink>,
    state: TxState,
}

impl Tx {
    pub(super) fn new(conn: &Arc<Conn>, client: ClientId, neg: Negotiated) -> Tx {
        let ex = &neg.export.export;
        let limits = ex.device.limits();
        let _ = conn.failures.set(neg.export.failures.clone());
        Tx {
            // `dmsetup remove --force` ends the connection through this hook.
            _attached: {
                let closing = conn.clone();
                neg.export
                    .connect_closable(Box::new(move || closing.kill()))
            },
            client,
            view: ExportView {
                size: ex.device.size(),
                read_only: ex.is_read_only(),
                fast_zero: limits.write_zeroes,
                max_payload: u64::from(handshake::max_payload(&neg.export)),
                meta: neg.meta_base_allocation,
            },
            emulated_zero: !limits.write_zeroes,
            sink: conn.clone(),
            state: TxState::Header,
            export: neg.export,
        }
    }

    /// A request is half received (header, admission or payload).
    pub(super) fn busy(&self) -> bool {
        !matches!(self.state, TxState::Header)
    }

    /// How long the payload being received has made no progress.
    pub(super) fn payload_stalled_for(&self, now: Instant) -> Option<Duration> {
        match &self.state {
            TxState::Payload(p) => Some(now.saturating_duration_since(p.progress)),
            _ => None,
        }
    }

    /// Give back what a half-received request holds, and the client.
    pub(super) fn close(self, cx: &Cx) {
        if let TxState::Payload(p) = self.state {
            drop(p.req);
            cx.engine.cancel(p.ticket);
        }
        cx.engine.close_client(self.client);
    }
}

/// Whether the client's queued replies are over its cap: its requests
/// are then not read (back-pressure). The cap is the client's byte limit,
/// and no more than its fair share of the export's memory budget, so
/// clients that never read their replies cannot hold all of it.
fn replies_over_cap(tx: &Tx, conn: &Conn, cx: &Cx) -> bool {
    let queued = conn.queued();
    // The engine's lock only when replies are queued at all.
    queued > 0
        && (queued > cx.opts.client.max_bytes || queued > cx.engine.fair_share(&tx.export.queue))
}

/// Run transmission as far as input, admission and output allow. An
/// `Interrupted` error asks the loop to let other connections run.
pub(super) fn drive(
    tx: &mut Tx,
    input: &mut Input,
    conn: &Arc<Conn>,
    cx: &Cx,
    last_active: &mut Instant,
) -> io::Result<()> {
    let mut parsed = 0;
    let mut stamp = Stamp::default();
    // The replies of requests run inline below leave in one `writev` when
    // this returns (however it returns).
    let _cork = conn.cork();
    loop {
        let go = match std::mem::replace(&mut tx.state, TxState::Header) {
            TxState::Header => {
                let go = read_header(tx, input, conn, cx, parsed)?;
                if go {
                    parsed += 1;
                    *last_active = stamp.now();
                }
                go
            }
            TxState::Admit(h) => admit(tx, conn, cx, h, &mut stamp),
            TxState::Payload(p) => receive_payload(tx, input, conn, cx, p, &mut stamp)?,
            TxState::Skip {
                left,
                cookie,
                error,
            } => skip(tx, input, conn, left, cookie, error)?,
        };
        if !go {
            return Ok(());
        }
    }
}

/// Read the next request header and check it: false when there is none
/// to read now (or output back-pressure, or the client disconnected);
/// `Interrupted` once `parsed` reaches a batch.
fn read_header(
    tx: &mut Tx,
    input: &mut Input,
    conn: &Conn,
    cx: &Cx,
    parsed: usize,
) -> io::Result<bool> {
    if input.eof && input.inb.avail() < REQUEST_LEN {
        return Ok(false);
    }
    if replies_over_cap(tx, conn, cx) {
        // Back-pressure: its replies wait for the client.
        return Ok(false);
    }
    if parsed >= BATCH {
        return Err(io::Error::from(io::ErrorKind::Interrupted));
    }
    if !input.need(conn, REQUEST_LEN)? {
        return Ok(false);
    }
    let mut hb = [0u8; REQUEST_LEN];
    hb.copy_from_slice(&input.inb.bytes()[..REQUEST_LEN]);
    input.inb.consume(REQUEST_LEN);
    let h = RequestHeader::decode(&hb);
    if h.magic != REQUEST_MAGIC {
        return Err(invalid(
            "bad request magic (not an NBD client, or out of sync)",
        ));
    }
    match check(&tx.view, conn, &h)? {
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
            input.eof = true;
            return Ok(false);
        }
    }
    Ok(true)
}

/// Admit a checked request and submit it (a write waits for its payload
/// first): false when the engine refused it for now (it wakes the session).
fn admit(tx: &mut Tx, conn: &Conn, cx: &Cx, h: RequestHeader, stamp: &mut Stamp) -> bool {
    let q = tx.export.queue.clone();
    let len = u64::from(h.len);
    let max_extents = if h.flags & CMD_FLAG_REQ_ONE != 0 {
        1
    } else {
        MAX_EXTENTS as u32
    };
    let mem = if matches!(h.cmd, CMD_READ | CMD_WRITE) {
        cx.engine.mem_cost(&q, h.offset, len)
    } else {
        0
    };
    let work = if h.cmd == CMD_WRITE_ZEROES && tx.emulated_zero {
        // Zeroing that writes every byte is charged as the write it is
        // (capped so it is admitted when idle).
        len.min(cx.opts.client.max_bytes)
    } else if h.cmd == CMD_BLOCK_STATUS {
        // The extent list the engine fills.
        u64::from(max_extents) * std::mem::size_of::<Extent>() as u64
    } else if matches!(h.cmd, CMD_TRIM | CMD_WRITE_ZEROES) {
        4096
    } else {
        0
    };
    let admitted = if h.cmd == CMD_WRITE {
        // Its payload is still on the way: the engine caps what such
        // writes may hold.
        cx.engine.try_admit_payload(tx.client, &q, mem, work)
    } else {
        cx.engine.try_admit(tx.client, &q, mem, work)
    };
    let Some(mut t) = admitted else {
        tx.state = TxState::Admit(h);
        return false;
    };
    let request = |op: Op, buf: Buf, head: usize| Request {
        op,
        tag: h.cookie,
        offset: h.offset,
        len,
        fua: h.flags & CMD_FLAG_FUA != 0,
        buf,
        head,
        extents: Vec::new(),
        sink: tx.sink.clone(),
    };
    match h.cmd {
        CMD_READ => {
            let (buf, head) = cx.engine.charged_buffer(&mut t, &q, h.offset, len);
            cx.engine.submit_or_run(t, &q, request(Op::Read, buf, head));
        }
        CMD_WRITE => {
            let (buf, head) = cx.engine.charged_buffer(&mut t, &q, h.offset, len);
            tx.state = TxState::Payload(Payload {
                req: request(Op::Write, buf, head),
                ticket: t,
                filled: 0,
                progress: stamp.now(),
            });
        }
        CMD_FLUSH => cx.engine.submit(t, &q, request(Op::Flush, Buf::empty(), 0)),
        CMD_WRITE_ZEROES => cx
            .engine
            .submit(t, &q, request(Op::WriteZeroes, Buf::empty(), 0)),
        CMD_BLOCK_STATUS => {
            let mut r = request(Op::Extents { max: max_extents }, Buf::empty(), 0);
            r.extents = conn.take_extents();
            cx.engine.submit(t, &q, r)
        }
        _ => cx.engine.submit(t, &q, request(Op::Trim, Buf::empty(), 0)),
    }
    true
}

/// Receive a write's payload into its buffer, then submit the write:
/// false when the socket has no more bytes now (the state is kept).
fn receive_payload(
    tx: &mut Tx,
    input: &mut Input,
    conn: &Conn,
    cx: &Cx,
    mut p: Payload,
    stamp: &mut Stamp,
) -> io::Result<bool> {
    let len = p.req.len as usize;
    let head = p.req.head;
    let start = p.filled;
    let r = loop {
        let k = (len - p.filled).min(input.inb.avail());
        if k > 0 {
            let at = head + p.filled;
            p.req.buf[at..at + k].copy_from_slice(&input.inb.bytes()[..k]);
            input.inb.consume(k);
            p.filled += k;
        }
        if p.filled == len {
            break Ok(true);
        }
        if input.eof {
            break Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client closed the connection in the middle of a write",
            ));
        }
        // Large remainder, nothing buffered: straight into the payload
        // buffer (plain sockets).
        let got = if len - p.filled >= 4096 && !conn.is_tls() {
            read_direct(input, conn, &mut p.req.buf[head + p.filled..head + len])
        } else {
            input.fill(conn).map(|more| more.then_some(0))
        };
        match got {
            Ok(Some(n)) => p.filled += n,
            Ok(None) if input.eof => {}
            Ok(None) => break Ok(false),
            Err(e) => break Err(e),
        }
    };
    if p.filled > start {
        p.progress = stamp.now();
    }
    match r {
        Ok(true) => {
            // Submitting ends the payload's wait (`payload_received`).
            let q = tx.export.queue.clone();
            cx.engine.submit_or_run(p.ticket, &q, p.req);
            Ok(true)
        }
        Ok(false) => {
            tx.state = TxState::Payload(p);
            Ok(false)
        }
        Err(e) => {
            drop(p.req);
            cx.engine.cancel(p.ticket);
            input.eof = true;
            Err(e)
        }
    }
}

/// Read payload bytes from the socket straight into `dst`: the bytes
/// read, `None` when none are there now (or at the end of input).
fn read_direct(input: &mut Input, conn: &Conn, dst: &mut [u8]) -> io::Result<Option<usize>> {
    if input.drained {
        return Ok(None);
    }
    let want = dst.len();
    match conn.sock.try_read(dst) {
        Ok(0) => {
            input.eof = true;
            Ok(None)
        }
        Ok(n) => {
            if n < want {
                input.drained = true;
            }
            Ok(Some(n))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            input.drained = true;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Discard a refused write's payload, then send its error: false when the
/// input runs out first.
fn skip(
    tx: &mut Tx,
    input: &mut Input,
    conn: &Conn,
    mut left: u64,
    cookie: u64,
    error: u32,
) -> io::Result<bool> {
    while left > 0 {
        let k = (left as usize).min(input.inb.avail());
        input.inb.consume(k);
        left -= k as u64;
        if left > 0 && !input.fill(conn)? {
            if !input.eof {
                tx.state = TxState::Skip {
                    left,
                    cookie,
                    error,
                };
            }
            return Ok(false);
        }
    }
    // Only now: a client may not expect the reply to a request it is
    // still sending.
    conn.send_error(cookie, error, false, "");
    Ok(true)
}
