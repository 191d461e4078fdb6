//! The session: one connection's protocol state, owned and driven by its
//! event loop. Handshake framing happens here; once an export is chosen
//! the session enters transmission ([`super::transmit`]).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::{ClientId, Waker};

use super::super::handshake::{self, Negotiated, Negotiation, Peer, Step};
use super::super::proto::*;
use super::input::Input;
use super::options::Cx;
use super::reply::Conn;
use super::transmit::{self, Tx};
use super::validate::invalid;

/// What a session waits for after a [`Session::drive`].
pub enum Drive {
    /// An event (readable, writable, or an engine wake-up).
    Wait,
    /// Nothing: it stopped only to let other connections run.
    Yield,
    /// The session is over; close it.
    Close,
}

struct Hs {
    neg: Negotiation,
    flags_done: bool,
    msg: Vec<u8>,
    /// The TLS handshake went to the handshake thread.
    tls_away: bool,
}

enum Phase {
    Hs(Box<Hs>),
    Tx(Box<Tx>),
    Done,
}

/// One connection's protocol state, owned and driven by its event loop.
pub struct Session {
    pub conn: Arc<Conn>,
    phase: Phase,
    pub input: Input,
    pub accepted: Instant,
    pub last_active: Instant,
    /// When transmission began (`None` before): a session whose
    /// `last_active` is still this has sent no request yet.
    tx_since: Option<Instant>,
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
                tls_away: false,
            })),
            input: Input::default(),
            accepted: now,
            last_active: now,
            tx_since: None,
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
            Phase::Tx(t) => cx.engine.client_requests(t.client) > 0 || t.busy(),
            _ => false,
        };
        !inflight && self.conn.queued() == 0
    }

    /// How long a write's payload has made no progress, if one is being
    /// received (the sweep drops it after `--payload-timeout`).
    pub fn payload_stalled_for(&self, now: Instant) -> Option<std::time::Duration> {
        match &self.phase {
            Phase::Tx(t) => t.payload_stalled_for(now),
            _ => None,
        }
    }

    /// Run the session as far as its input, admission and output allow.
    pub fn drive(&mut self, cx: &Cx, make_waker: &dyn Fn() -> Waker) -> Drive {
        if self.conn.is_closed() {
            return Drive::Close;
        }
        let r = match &mut self.phase {
            Phase::Hs(_) => self.drive_hs(cx),
            Phase::Tx(tx) => {
                transmit::drive(tx, &mut self.input, &self.conn, cx, &mut self.last_active)
                    .map(|()| None)
            }
            Phase::Done => return Drive::Close,
        };
        match r {
            Ok(Some((neg, reply))) => {
                // Attached (counted in the export's open count) before the
                // client can read the reply that ends its handshake, so a
                // `dmsetup remove` racing with the client's first request
                // sees the device in use.
                self.enter_tx(cx, neg, make_waker);
                self.conn.send_bytes(&reply);
                Drive::Yield
            }
            Ok(None) => {
                if self.in_handshake() && self.input.eof {
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

    /// Gather the next handshake message (flags, then option header and
    /// payload) into `hs.msg`: false when the input runs out first.
    fn gather(hs: &mut Hs, input: &mut Input, conn: &Conn) -> io::Result<bool> {
        loop {
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
                if input.inb.avail() == 0 {
                    if input.eof || !input.fill(conn)? {
                        return Ok(false);
                    }
                    continue;
                }
                let k = (need - hs.msg.len()).min(input.inb.avail());
                hs.msg.extend_from_slice(&input.inb.bytes()[..k]);
                input.inb.consume(k);
            }
            // An option header with a payload: now its payload.
            if !(hs.flags_done && need == 16 && hs.msg[12..16] != [0, 0, 0, 0]) {
                return Ok(true);
            }
        }
    }

    fn drive_hs(&mut self, cx: &Cx) -> io::Result<Option<(Negotiated, Vec<u8>)>> {
        let Phase::Hs(hs) = &mut self.phase else {
            return Ok(None);
        };
        let mut out = Vec::new();
        loop {
            // A client that does not read its option replies gets no more;
            // nothing is read while the handshake thread runs TLS.
            if self.conn.tls_offloaded.load(Ordering::Acquire) {
                hs.tls_away = true;
                return Ok(None);
            }
            if std::mem::take(&mut hs.tls_away) {
                // The handshake thread read the socket meanwhile: whatever
                // said it was drained before is stale.
                self.input.drained = false;
            }
            if self.conn.queued() > 64 << 10 {
                return Ok(None);
            }
            if !Self::gather(hs, &mut self.input, &self.conn)? {
                return Ok(None);
            }
            if !hs.flags_done {
                let f = u32::from_be_bytes([hs.msg[0], hs.msg[1], hs.msg[2], hs.msg[3]]);
                hs.neg.client_flags(f)?;
                hs.flags_done = true;
                hs.msg.clear();
                continue;
            }
            let magic = u64::from_be_bytes(hs.msg[0..8].try_into().unwrap_or([0; 8]));
            if magic != IHAVEOPT {
                return Err(invalid("bad option magic"));
            }
            let opt = u32::from_be_bytes([hs.msg[8], hs.msg[9], hs.msg[10], hs.msg[11]]);
            hs.neg.tls_verified = self.conn.tls_peer_verified();
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
            if !matches!(step, Step::Done(_)) {
                self.conn.send_bytes(&out);
            }
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
                    if self.input.inb.avail() != 0 {
                        return Err(invalid("client sent data before the TLS handshake"));
                    }
                    self.conn.start_tls(cfg)?;
                    hs.neg.tls_active = true;
                    hs.tls_away = true;
                    // Stop here: the loop hands the TLS handshake to the
                    // handshake thread before anything of it is read (or,
                    // without one, drives the session again at once).
                    return Err(io::Error::from(io::ErrorKind::Interrupted));
                }
                Step::Done(neg) => return Ok(Some((neg, out))),
            }
        }
    }

    fn enter_tx(&mut self, cx: &Cx, neg: Negotiated, make_waker: &dyn Fn() -> Waker) {
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
            neg.export.export.name
        );
        self.phase = Phase::Tx(Box::new(Tx::new(&self.conn, client, neg)));
        self.last_active = Instant::now();
        self.tx_since = Some(self.last_active);
    }

    /// In transmission without a single request so far.
    pub fn unused(&self) -> bool {
        self.tx_since.is_some_and(|t| t == self.last_active)
    }

    /// Forget the session: give back what a half-parsed request holds and
    /// release the engine client (requests in flight still finish).
    pub fn close(&mut self, cx: &Cx) {
        if let Phase::Tx(tx) = std::mem::replace(&mut self.phase, Phase::Done) {
            tx.close(cx);
        }
        self.input.inb.release();
        self.conn.kill();
        self.conn.uncount();
    }
}
