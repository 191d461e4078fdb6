//! TLS handshakes off the event loops (second review, F26).
//!
//! A TLS handshake costs the server a signature (RSA: about a millisecond
//! of CPU), far more than serving a small request. Run on the event loops,
//! a flood of handshakes would queue established clients' requests behind
//! them. So once a session has answered STARTTLS its loop hands the
//! connection to one handshake thread, which runs at the lowest CPU
//! priority (nice 19: the loops and workers go first whenever they have
//! something to do) and gives the connection back, by a wake-up of its
//! loop, when the handshake is over. A flood then only delays other
//! handshakes, and the handshake deadline (`--handshake-timeout`) and the
//! per-client connection cap bound those.

use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::conn::Conn;

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
        libc::setpriority(libc::PRIO_PROCESS, tid, 19)
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
    loop {
        if conns.is_empty() {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(c) => conns.push(c),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        conns.extend(rx.try_iter());
        let ready = wait_readable(&conns);
        let mut i = 0;
        conns.retain(|c| {
            i += 1;
            !(ready[i - 1] && step(c))
        });
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
    match c.tls_handshake_step() {
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
