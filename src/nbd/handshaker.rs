//! TLS handshakes off the event loops (second review, F26).
//!
//! A TLS handshake costs the server a signature (RSA: about a millisecond
//! of CPU), far more than serving a small request. Run on the event loops,
//! a flood of handshakes would queue established clients' requests behind
//! them. So once a session has answered STARTTLS its loop hands the
//! connection to one handshake thread, which runs at a low CPU priority
//! (nice 10: a tenth of the weight of a loop or worker, so they go first
//! whenever they have something to do, yet handshakes still progress on a
//! busy machine, where nice 19 starved them) and gives the connection back, by a wake-up of its
//! loop, when the handshake is over. Each client (address, IPv6 /64, uid)
//! may start [`RATE`] handshakes a second (bursts of [`BURST`]); past that
//! its connection is closed at once, before any signature. A flood from
//! few addresses then costs the server little, one from many only delays
//! other handshakes, and the handshake deadline (`--handshake-timeout`)
//! and the per-client connection cap bound those.

use std::collections::HashMap;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::sock::Source;

/// TLS handshakes one client may start per second, and in one burst: far
/// above what a client that reconnects needs, low enough that one
/// address's signatures take a few percent of a core.
pub const RATE: f64 = 16.0;
pub const BURST: f64 = 32.0;

/// Per-client token buckets of handshakes.
#[derive(Default)]
struct Limiter {
    buckets: HashMap<Source, (f64, Instant)>,
    last_log: Option<Instant>,
}

impl Limiter {
    /// Whether `c`'s client may start one more handshake now.
    fn allow(&mut self, c: &Conn) -> bool {
        let now = Instant::now();
        if self.buckets.len() > 4096 {
            // Full buckets carry no state worth keeping.
            self.buckets
                .retain(|_, (_, t)| now.duration_since(*t).as_secs_f64() * RATE < BURST);
        }
        let b = self
            .buckets
            .entry(Source::of(&c.sock.peer_info()))
            .or_insert((BURST, now));
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * RATE).min(BURST);
        b.1 = now;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            return true;
        }
        if self
            .last_log
            .is_none_or(|t| now.duration_since(t) > Duration::from_secs(5))
        {
            self.last_log = Some(now);
            tracing::warn!(
                "client {}: more than {RATE} TLS handshakes a second; closing the excess",
                c.sock.peer()
            );
        }
        false
    }
}

/// The handshake thread's nice value (see the module doc).
const NICE: libc::c_int = 10;

/// How long the thread waits on its sockets before it looks for new ones.
const TICK: Duration = Duration::from_millis(20);

/// The handshake thread of a server.
pub struct Handshaker {
    tx: Sender<Arc<Conn>>,
    thread: JoinHandle<()>,
}

impl Handshaker {
    pub fn start() -> std::io::Result<Handshaker> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("udm-tls-hs".into())
            .spawn(move || run(rx))?;
        Ok(Handshaker { tx, thread })
    }

    /// Where the loops send connections whose TLS handshake is to run.
    pub fn sender(&self) -> Sender<Arc<Conn>> {
        self.tx.clone()
    }

    /// End the thread once every loop (holding a sender) has ended.
    pub fn stop(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

fn lower_priority() {
    // SAFETY: gettid and setpriority act on the calling thread only (on
    // Linux a thread id is a valid PRIO_PROCESS target).
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, NICE)
    };
    if r != 0 {
        tracing::debug!(
            "cannot lower the TLS handshake thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn run(rx: Receiver<Arc<Conn>>) {
    lower_priority();
    let mut conns: Vec<Arc<Conn>> = Vec::new();
    let mut limiter = Limiter::default();
    loop {
        if conns.is_empty() {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(c) => take(&mut conns, &mut limiter, c),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        for c in rx.try_iter() {
            take(&mut conns, &mut limiter, c);
        }
        if conns.is_empty() {
            continue;
        }
        let ready = wait_readable(&conns);
        let mut i = 0;
        conns.retain(|c| {
            i += 1;
            !(ready[i - 1] && step(c))
        });
    }
}

/// Keep `c` for its handshake, or close it if its client is over the rate.
fn take(conns: &mut Vec<Arc<Conn>>, limiter: &mut Limiter, c: Arc<Conn>) {
    tracing::debug!("client {}: TLS handshake taken", c.sock.peer());
    if limiter.allow(&c) {
        conns.push(c);
    } else {
        c.tls_offloaded.store(false, Ordering::Release);
        c.kill();
    }
}

/// Sleep until one of `conns` has input (or a tick passes); which have
/// (a closed socket counts: it reads as the end).
fn wait_readable(conns: &[Arc<Conn>]) -> Vec<bool> {
    let mut fds: Vec<libc::pollfd> = conns
        .iter()
        .map(|c| libc::pollfd {
            fd: c.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: poll reads and writes the live array of `fds.len()` entries.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            TICK.as_millis() as libc::c_int,
        )
    };
    fds.iter().map(|f| f.revents != 0).collect()
}

/// Advance one handshake; true when the connection leaves the thread
/// (handed back to its loop, or closed).
fn step(c: &Conn) -> bool {
    if c.is_closed() {
        c.tls_offloaded.store(false, Ordering::Release);
        return true;
    }
    let r = c.tls_handshake_step();
    tracing::debug!("client {}: TLS handshake step: {r:?}", c.sock.peer());
    match r {
        Ok(false) => false,
        Ok(true) => {
            c.tls_offloaded.store(false, Ordering::Release);
            c.notify();
            true
        }
        Err(e) => {
            tracing::info!("client {}: {e}", c.sock.peer());
            c.tls_offloaded.store(false, Ordering::Release);
            c.kill();
            true
        }
    }
}
