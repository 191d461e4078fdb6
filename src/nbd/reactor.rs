//! The event loops: a few threads (one per core by default) that own every
//! connection's socket and drive its [`Session`] when the socket has
//! something, so threads and stacks do not grow with the number of
//! connections. Requests still run on the engine's workers (or inline, for
//! small ones, on the loop that parsed them).
//!
//! Why epoll through `mio` rather than io_uring: the work per event is a
//! few small reads and one `writev`, the same syscalls a thread per
//! connection made, plus one `epoll_wait` per batch of events
//! (docs/BENCHMARKS.md, "event loop", has the 4 KiB QD1/QD32 and 1 MiB
//! figures against the thread-per-connection server); io_uring would save
//! those few syscalls at the price of owned buffers for every read in
//! flight on idle sockets, which is the memory this design avoids.
//!
//! Edge-triggered readiness: a session reads until a read comes back
//! short, then waits for the next edge (Linux reports a new edge for every
//! arrival after the event was delivered, so nothing is missed), and one
//! that stops early (a batch done, back-pressure, admission refused) is
//! resumed by the loop (pending list) or by a wake-up (the engine's, or
//! writable space for its replies), not by the socket.
//!
//! **Busy polling.** After an event a loop keeps polling (`epoll_wait`
//! with a zero timeout, yielding its core between polls) for
//! `--poll-us` (default 50 µs) before it sleeps. On a virtual machine,
//! waking a thread that sleeps on another vCPU (the idle vCPU halted; the
//! host must deliver an interrupt and schedule it) takes longer than
//! serving a 4 KiB read from memory, so a QD1 client paid that on every
//! request; the poll more than makes up for it (docs/BENCHMARKS.md, "busy
//! polling"). The poll
//! only runs while requests keep arriving within the window, so an idle
//! server still sleeps, and only after rounds whose requests all ran
//! inline: while requests run on the engine's workers the loop sleeps
//! (their completion wakes it), so it never takes a core from them
//! (polling then cost 1 MiB writes 5 %). And it backs off (`spin.rs`)
//! when a yield shows other processes want the core, or when windows keep
//! ending before the client's next request: under load a spinning loop
//! lost its core for a time slice per request.
//!
//! Deadlines (handshake, idle, stalled replies) are checked by sweeping the
//! loop's connections four times a second: a few microseconds for ten
//! thousand connections, and no timer structure to keep consistent.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use std::os::unix::io::AsRawFd;

use crate::engine::Waker;

use super::conn::{Conn, Cx, Drive, NetOptions, Session};
use super::handshaker::Handshaker;
use super::spin::Spin;

const WAKE: Token = Token(0);
const SWEEP: Duration = Duration::from_millis(250);
/// How long a shutdown waits for clients to collect their last replies.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Inbox {
    new: Vec<Arc<Conn>>,
    wakes: Vec<usize>,
    stop: bool,
}

/// What other threads use to talk to one loop.
struct Handle {
    waker: mio::Waker,
    inbox: Mutex<Inbox>,
}

impl Handle {
    fn post(&self, f: impl FnOnce(&mut Inbox)) {
        let mut i = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        let was_empty = i.new.is_empty() && i.wakes.is_empty() && !i.stop;
        f(&mut i);
        drop(i);
        if was_empty {
            let _ = self.waker.wake();
        }
    }
}

/// The running event loops of a server.
pub struct Net {
    handles: Vec<Arc<Handle>>,
    threads: Vec<JoinHandle<()>>,
    next: usize,
    handshaker: Option<Handshaker>,
}

impl Net {
    /// Start `threads` loops (0: one per core).
    pub fn start(cx: Arc<Cx>, threads: usize) -> std::io::Result<Net> {
        let n = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        let mut net = Net {
            handles: Vec::new(),
            threads: Vec::new(),
            next: 0,
            handshaker: match cx.tls {
                Some(_) => Some(Handshaker::start()?),
                None => None,
            },
        };
        for i in 0..n {
            let mut lp = Loop::new(cx.clone())?;
            lp.tls_handshakes = net.handshaker.as_ref().map(Handshaker::sender);
            net.handles.push(lp.handle.clone());
            net.threads.push(
                std::thread::Builder::new()
                    .name(format!("udm-net-{i}"))
                    .spawn(move || lp.run())?,
            );
        }
        Ok(net)
    }

    /// Hand a new connection to the next loop (round robin).
    pub fn add(&mut self, conn: Arc<Conn>) {
        let h = &self.handles[self.next % self.handles.len()];
        self.next = self.next.wrapping_add(1);
        h.post(|i| i.new.push(conn));
    }

    /// Stop: handshakes are dropped, transmissions stop reading, finish
    /// what is in flight and collect their replies; then the loops end.
    pub fn stop(self) {
        for h in &self.handles {
            h.post(|i| i.stop = true);
        }
        for t in self.threads {
            let _ = t.join();
        }
        if let Some(h) = self.handshaker {
            h.stop();
        }
    }
}

/// Serve one connection on the calling thread until it closes (the fuzz
/// harness's entry point).
pub fn run_one(cx: Arc<Cx>, conn: Arc<Conn>) {
    match Loop::new(cx) {
        Ok(mut lp) => {
            lp.single = true;
            lp.add(conn);
            lp.run();
        }
        Err(e) => tracing::warn!("cannot start an event loop: {e}"),
    }
}

/// Record how long a session in transmission has been idle (for the
/// accept path's shedding) and say why it must go, if its idle time is
/// past `--idle-timeout`, or past the unused deadline for a client that
/// never sent a request while the server is crowded.
fn idle_verdict(s: &Session, cx: &Cx, o: &NetOptions, now: Instant) -> Option<&'static str> {
    if s.input.eof || !s.idle(cx) {
        s.conn.idle_ms.store(0, Ordering::Relaxed);
        return None;
    }
    let idle = now.saturating_duration_since(s.last_active);
    let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(1);
    s.conn.idle_ms.store(ms, Ordering::Relaxed);
    if o.idle_timeout.is_some_and(|t| idle > t) {
        return Some("idle for longer than --idle-timeout");
    }
    if s.unused() && idle > o.unused_timeout && cx.crowded() {
        return Some(
            "sent no request after its handshake; dropped after the unused deadline \
             (over half of --max-connections open)",
        );
    }
    None
}

struct Slot {
    s: Session,
    gen: u32,
}

struct Loop {
    poll: Poll,
    handle: Arc<Handle>,
    cx: Arc<Cx>,
    slots: Vec<Option<Slot>>,
    gens: Vec<u32>,
    free: Vec<usize>,
    live: usize,
    pending: Vec<usize>,
    /// Spare lists swapped with the inbox and the pending list, so that
    /// neither allocates in steady state.
    spare_inbox: Inbox,
    spare_pending: Vec<usize>,
    stopping: Option<Instant>,
    single: bool,
    /// A session driven in this round left requests on the engine's
    /// workers (see busy polling in the module doc).
    workers_busy: bool,
    /// Where TLS handshakes go (`None`: run here, as without TLS there are
    /// none).
    tls_handshakes: Option<Sender<Arc<Conn>>>,
}

fn token(idx: usize, gen: u32) -> usize {
    ((gen as usize) << 32) | (idx + 1)
}

impl Loop {
    fn new(cx: Arc<Cx>) -> std::io::Result<Loop> {
        let poll = Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), WAKE)?;
        Ok(Loop {
            poll,
            handle: Arc::new(Handle {
                waker,
                inbox: Mutex::new(Inbox::default()),
            }),
            cx,
            slots: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            live: 0,
            pending: Vec::new(),
            spare_inbox: Inbox::default(),
            spare_pending: Vec::new(),
            stopping: None,
            single: false,
            workers_busy: false,
            tls_handshakes: None,
        })
    }

    /// The slot of token `t`, if it is still the same connection.
    fn slot(&self, t: usize) -> Option<usize> {
        let idx = (t & 0xffff_ffff).checked_sub(1)?;
        let gen = (t >> 32) as u32;
        match self.slots.get(idx) {
            Some(Some(s)) if s.gen == gen => Some(idx),
            _ => None,
        }
    }

    fn add(&mut self, conn: Arc<Conn>) {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.gens.push(0);
            self.slots.len() - 1
        });
        self.gens[idx] = self.gens[idx].wrapping_add(1);
        let gen = self.gens[idx];
        let tok = token(idx, gen);
        let fd = conn.sock.as_raw_fd();
        if let Err(e) = self.poll.registry().register(
            &mut SourceFd(&fd),
            Token(tok),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!("cannot watch a new connection: {e}");
            conn.kill();
            conn.uncount();
            self.free.push(idx);
            return;
        }
        let h = self.handle.clone();
        conn.set_notify(Arc::new(move || h.post(|i| i.wakes.push(tok))));
        let s = Session::new(conn);
        self.slots[idx] = Some(Slot { s, gen });
        self.live += 1;
        if self.stopping.is_some() {
            self.close(idx, "server shutting down");
            return;
        }
        self.drive(idx);
    }

    fn close(&mut self, idx: usize, why: &str) {
        let Some(mut slot) = self.slots[idx].take() else {
            return;
        };
        if !why.is_empty() {
            tracing::info!("client {}: {why}", slot.s.conn.sock.peer());
        }
        let fd = slot.s.conn.sock.as_raw_fd();
        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
        slot.s.close(&self.cx);
        self.free.push(idx);
        self.live -= 1;
    }

    fn drive(&mut self, idx: usize) {
        let Some(slot) = self.slots[idx].as_mut() else {
            return;
        };
        let tok = token(idx, slot.gen);
        let h = self.handle.clone();
        let make_waker = move || -> Waker {
            let h = h.clone();
            Arc::new(move || h.post(|i| i.wakes.push(tok)))
        };
        // Alone on this loop, the connection may have its blocking writes
        // run right here (`core::sole`).
        // Device code is contained below (`dm::LiveDevice`); this is the
        // last net for a bug in the connection's own handling: it costs
        // that connection, never the loop and its other clients.
        let cx = &self.cx;
        let live = self.live;
        let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::core::sole::with_sole_client(live == 1, || slot.s.drive(cx, &make_waker))
        }));
        let d = match driven {
            Ok(d) => d,
            Err(p) => {
                tracing::error!(
                    "client {}: its connection's handling panicked ({}); the connection is \
                     closed, the other clients go on",
                    slot.s.conn.sock.peer(),
                    crate::core::fault::panic_message(&*p)
                );
                return self.close(idx, "");
            }
        };
        if let Some(tx) = &self.tls_handshakes {
            let c = &slot.s.conn;
            if slot.s.in_handshake()
                && !c.tls_offloaded.load(Ordering::Acquire)
                && c.tls_handshaking()
            {
                c.tls_offloaded.store(true, Ordering::Release);
                if tx.send(c.clone()).is_err() {
                    c.tls_offloaded.store(false, Ordering::Release);
                }
            }
        }
        match d {
            Drive::Wait => {}
            Drive::Yield => self.pending.push(tok),
            Drive::Close => return self.close(idx, ""),
        }
        // Requests left running on the engine's workers: their completion
        // wakes the loop, and polling meanwhile would take a core from them.
        // Without busy polling the answer is never used, so the engine's
        // state lock is not taken for it.
        let polling = !self.cx.opts.busy_poll.is_zero();
        if let Some(c) = slot.s.client().filter(|_| polling) {
            if self.cx.engine.client_requests(c) > 0 {
                self.workers_busy = true;
            }
        }
        // A client that sent its last request (or left) is closed once
        // everything it asked for is answered.
        let s = &slot.s;
        if s.input.eof && s.idle(&self.cx) {
            if let Some(c) = s.client() {
                if !self.cx.engine.wake_when_idle(c) {
                    return;
                }
            }
            if s.conn.queued() == 0 {
                self.close(idx, "");
            }
        }
    }

    fn sweep(&mut self, now: Instant) {
        let o = self.cx.opts.clone();
        for idx in 0..self.slots.len() {
            let Some(slot) = self.slots[idx].as_mut() else {
                continue;
            };
            let s = &mut slot.s;
            if s.conn.is_closed() {
                self.close(idx, "");
                continue;
            }
            if s.in_handshake() {
                if self.stopping.is_some() {
                    self.close(idx, "server shutting down");
                } else if now.saturating_duration_since(s.accepted) > o.handshake_timeout {
                    self.close(
                        idx,
                        "no handshake within the deadline (--handshake-timeout)",
                    );
                }
                continue;
            }
            if let Some(t) = s.conn.stalled_for(now) {
                if t > o.reply_timeout {
                    self.close(
                        idx,
                        "stopped reading its replies; dropped after --reply-timeout",
                    );
                    continue;
                }
            }
            if s.payload_stalled_for(now)
                .is_some_and(|t| t > o.payload_timeout)
            {
                self.close(
                    idx,
                    "sent part of a write and stopped; dropped after --payload-timeout",
                );
                continue;
            }
            if self.stopping.is_some() {
                s.input.eof = true;
            }
            if let Some(why) = idle_verdict(s, &self.cx, &o, now) {
                self.close(idx, why);
                continue;
            }
            if let Some(t0) = self.stopping {
                if now.saturating_duration_since(t0) > DRAIN_LIMIT {
                    self.close(idx, "did not collect its replies before shutdown");
                    continue;
                }
            }
            if slot.s.input.eof {
                self.drive(idx);
            }
        }
    }

    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_sweep = Instant::now();
        let tick = if self.single {
            Duration::from_millis(5)
        } else {
            SWEEP
        };
        let mut spin = Spin::new(self.cx.opts.busy_poll);
        // The end of the last round: close enough to the next poll to judge
        // the polling window by (one clock read per round, not two).
        let mut now = Instant::now();
        loop {
            let timeout = if !self.pending.is_empty() || spin.polling(now) {
                Duration::ZERO
            } else {
                tick
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!("event loop: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            let had_events = !events.is_empty();
            if !had_events && timeout.is_zero() && self.pending.is_empty() {
                // Polling: let a runnable thread on this core go first
                // (and stop polling if one took the core for a slice).
                spin.idle_poll();
            }
            self.workers_busy = false;
            for ev in events.iter() {
                if ev.token() == WAKE {
                    continue;
                }
                let Some(idx) = self.slot(ev.token().0) else {
                    continue;
                };
                if let Some(slot) = self.slots[idx].as_mut() {
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        slot.s.input.drained = false;
                    }
                    // Always under the connection's lock, never judged by
                    // the lock-free byte count: a worker may be queueing a
                    // reply right now, and this edge may be the only one.
                    if (ev.is_writable() || ev.is_error())
                        && !slot.s.conn.tls_offloaded.load(Ordering::Acquire)
                    {
                        slot.s.conn.flush();
                    }
                }
                self.drive(idx);
            }
            let mut inbox = std::mem::take(&mut self.spare_inbox);
            std::mem::swap(
                &mut inbox,
                &mut *self.handle.inbox.lock().unwrap_or_else(|p| p.into_inner()),
            );
            if inbox.stop && self.stopping.is_none() {
                self.stopping = Some(Instant::now());
                self.sweep(Instant::now());
            }
            for c in inbox.new.drain(..) {
                self.add(c);
            }
            let woken = !inbox.wakes.is_empty();
            for t in inbox.wakes.drain(..) {
                if let Some(idx) = self.slot(t) {
                    if let Some(slot) = self.slots[idx].as_mut() {
                        if slot.s.conn.queued() > 0 {
                            slot.s.conn.flush();
                        }
                    }
                    self.drive(idx);
                }
            }
            inbox.stop = false;
            self.spare_inbox = inbox;
            let mut pending = std::mem::take(&mut self.spare_pending);
            std::mem::swap(&mut pending, &mut self.pending);
            for t in pending.drain(..) {
                if let Some(idx) = self.slot(t) {
                    self.drive(idx);
                }
            }
            self.spare_pending = pending;
            now = Instant::now();
            // Poll for the next request only after a round whose requests
            // all finished here (small ones, run inline): that is the
            // client waiting on us. Requests on workers end polling.
            spin.after_round(now, had_events || woken, self.workers_busy);
            if now.duration_since(last_sweep) >= tick {
                last_sweep = now;
                self.sweep(now);
            }
            if self.live == 0 && (self.stopping.is_some() || self.single) {
                return;
            }
            if self.single && self.cx.shutting_down.load(Ordering::Relaxed) {
                self.stopping.get_or_insert(now);
            }
        }
    }
}
