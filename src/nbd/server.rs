//! Listening, accepting and shutting down.
//!
//! One thread per connection runs the handshake and then reads requests;
//! the shared [`Engine`] executes them. Shutdown (SIGINT/SIGTERM, or a
//! flag for embedders and tests): stop accepting, stop reading new
//! requests (the read side of every socket is shut down), let every
//! admitted request finish and be answered, flush every export, return.

use std::io;
use std::net::{Shutdown, TcpListener, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::engine::Engine;

use super::conn::{transmission, Conn};
use super::export::{BudgetPolicy, Export, ExportSet};
use super::handshake::negotiate;
use super::sock::Sock;

/// Where to listen.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A Unix socket path (a stale socket file there is replaced).
    Unix(PathBuf),
    /// `HOST:PORT`, or `HOST` for the standard port 10809.
    Tcp(String),
}

/// Everything `serve` needs.
pub struct ServerConfig {
    pub listen: Listen,
    /// The first export is also the default export "".
    pub exports: Vec<Export>,
    /// Worker threads; 0 = number of cores.
    pub threads: usize,
}

/// Optional knobs of [`serve_with`].
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Total in-flight payload memory for all exports (divided equally);
    /// `None`: 2 % of RAM, at least 16 MiB per export.
    pub memory_budget: Option<u64>,
    /// Stop when this becomes true (checked every 100 ms) instead of on
    /// SIGINT/SIGTERM; no signal handlers are installed then.
    pub stop: Option<Arc<AtomicBool>>,
    /// Serve this export set, owned by the caller (who adds and removes
    /// exports while the server runs: the control socket). The exports of
    /// the [`ServerConfig`] are added to it, and it may start empty.
    /// `None`: a set of the configured exports, which must not be empty.
    pub exports: Option<Arc<ExportSet>>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("memory_budget", &self.memory_budget)
            .field("stop", &self.stop)
            .field("exports", &self.exports.as_ref().map(|e| e.list().len()))
            .finish()
    }
}

use super::proto::DEFAULT_PORT;

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    fn bind(l: &Listen) -> io::Result<Listener> {
        match l {
            Listen::Unix(p) => {
                if let Ok(m) = std::fs::symlink_metadata(p) {
                    if m.file_type().is_socket() && UnixStream::connect(p).is_err() {
                        // A socket file nobody listens on: left by a crash.
                        let _ = std::fs::remove_file(p);
                    }
                }
                let u = UnixListener::bind(p).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "cannot listen on {}: {e} (is another server running there? \
                             remove the file or choose another --socket)",
                            p.display()
                        ),
                    )
                })?;
                Ok(Listener::Unix(u, p.clone()))
            }
            Listen::Tcp(a) => {
                let has_port = a.parse::<std::net::SocketAddr>().is_ok()
                    || a.contains("]:")
                    || a.matches(':').count() == 1;
                let addr = if has_port {
                    a.clone()
                } else if a.starts_with('[') {
                    format!("{a}:{DEFAULT_PORT}")
                } else if a.contains(':') {
                    format!("[{a}]:{DEFAULT_PORT}")
                } else {
                    format!("{a}:{DEFAULT_PORT}")
                };
                let addrs: Vec<_> = addr
                    .to_socket_addrs()
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("bad listen address {a:?}: {e}"))
                    })?
                    .collect();
                let t = TcpListener::bind(&addrs[..]).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
                })?;
                Ok(Listener::Tcp(t))
            }
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Listener::Unix(u, _) => u.as_raw_fd(),
            Listener::Tcp(t) => t.as_raw_fd(),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix(u, _) => u.set_nonblocking(true),
            Listener::Tcp(t) => t.set_nonblocking(true),
        }
    }

    fn accept(&self) -> io::Result<Sock> {
        let s = match self {
            Listener::Unix(u, _) => {
                let (s, _) = u.accept()?;
                s.set_nonblocking(false)?;
                Sock::Unix(s)
            }
            Listener::Tcp(t) => {
                let (s, _) = t.accept()?;
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                Sock::Tcp(s)
            }
        };
        Ok(s)
    }

    /// Where clients reach us, for the log.
    fn describe(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("nbd+unix:///?socket={}", p.display()),
            Listener::Tcp(t) => t
                .local_addr()
                .map_or_else(|_| "tcp".to_string(), |a| format!("nbd://{a}")),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Write end of the self-pipe the signal handler writes to (-1: none).
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
    let fd = SIGNAL_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; `b` is a live stack byte.
        unsafe { libc::write(fd, &b as *const u8 as *const libc::c_void, 1) };
    }
}

/// A pipe whose read end wakes the accept loop.
struct Pipe {
    r: RawFd,
    w: RawFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the live array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pipe {
            r: fds[0],
            w: fds[1],
        })
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // SAFETY: both descriptors are owned by this struct and closed once.
        unsafe {
            libc::close(self.r);
            libc::close(self.w);
        }
    }
}

/// Serve until SIGINT or SIGTERM, then shut down cleanly (see module doc).
pub fn serve(cfg: ServerConfig) -> io::Result<()> {
    serve_with(cfg, ServeOptions::default())
}

/// Like [`serve`], but stops when `stop` becomes true (checked at least
/// every 100 ms) and installs no signal handlers. For embedding and tests.
pub fn serve_with_shutdown(cfg: ServerConfig, stop: Arc<AtomicBool>) -> io::Result<()> {
    serve_with(
        cfg,
        ServeOptions {
            stop: Some(stop),
            ..ServeOptions::default()
        },
    )
}

/// [`serve`] with options.
pub fn serve_with(cfg: ServerConfig, opts: ServeOptions) -> io::Result<()> {
    // SIGPIPE would kill us when a client vanishes; we handle EPIPE.
    // SAFETY: setting a signal disposition to ignore is always sound.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    if let Some(stop) = &opts.stop {
        return run(cfg, stop, None, &opts);
    }
    let pipe = Pipe::new()?;
    SIGNALLED.store(false, Ordering::SeqCst);
    SIGNAL_FD.store(pipe.w, Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only touches atomics and calls
        // write(2); the sigaction struct is fully initialised.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    let stop = AtomicBool::new(false);
    let r = run(cfg, &stop, Some(&pipe), &opts);
    SIGNAL_FD.store(-1, Ordering::SeqCst);
    r
}

fn run(
    cfg: ServerConfig,
    stop: &AtomicBool,
    pipe: Option<&Pipe>,
    opts: &ServeOptions,
) -> io::Result<()> {
    let exports = match &opts.exports {
        Some(set) => {
            for e in cfg.exports {
                set.add(e)
                    .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
            }
            set.clone()
        }
        None if cfg.exports.is_empty() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no exports configured: give at least one device to serve",
            ))
        }
        None => Arc::new(export_set(cfg.exports, cfg.threads, opts.memory_budget)?),
    };
    let engine = exports.engine().clone();
    let listener = Listener::bind(&cfg.listen)?;
    listener.set_nonblocking()?;
    let shutting_down = Arc::new(AtomicBool::new(false));
    // Connections: a handle to shut the socket's read side, and the thread.
    let conns: Arc<Mutex<Vec<(u64, Sock)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    tracing::info!(
        "serving {} export(s) on {}",
        exports.list().len(),
        listener.describe()
    );

    let stopped =
        || stop.load(Ordering::SeqCst) || (pipe.is_some() && SIGNALLED.load(Ordering::SeqCst));
    while !stopped() {
        let mut fds = [
            libc::pollfd {
                fd: listener.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pipe.map_or(-1, |p| p.r),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads/writes the live array of two pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
        if n <= 0 || fds[0].revents == 0 {
            continue;
        }
        let sock = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                // Out of descriptors and the like: keep serving the others.
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let handle = match dup_sock(&sock) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("cannot track connection: {e}");
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, handle));
        let (exports, engine, shutting_down, conns) = (
            exports.clone(),
            engine.clone(),
            shutting_down.clone(),
            conns.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("udm-conn-{id}"))
            .spawn(move || {
                connection(sock, &exports, &engine, &shutting_down);
                conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|(i, _)| *i != id);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => tracing::warn!("cannot start a connection thread: {e}"),
        }
        threads.retain(|t| !t.is_finished());
    }

    tracing::info!("shutting down: finishing in-flight requests");
    drop(listener);
    // Requests waiting behind a suspended device must run before the
    // connections can finish.
    engine.release_all();
    shutting_down.store(true, Ordering::SeqCst);
    for (_, s) in conns.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        s.shutdown(Shutdown::Read);
    }
    for t in threads {
        let _ = t.join();
    }
    let flushed = engine.flush_all();
    engine.shutdown();
    flushed.map_err(|e| io::Error::other(format!("final flush failed: {e}")))?;
    tracing::info!("all exports flushed; bye");
    Ok(())
}

fn dup_sock(s: &Sock) -> io::Result<Sock> {
    Ok(match s {
        Sock::Unix(u) => Sock::Unix(u.try_clone()?),
        Sock::Tcp(t) => Sock::Tcp(t.try_clone()?),
    })
}

/// An engine with `threads` workers and a set holding `exports`, with the
/// memory budget shared among them.
pub fn export_set(
    exports: Vec<Export>,
    threads: usize,
    memory_budget: Option<u64>,
) -> io::Result<ExportSet> {
    let engine = Arc::new(Engine::start(threads)?);
    let set = ExportSet::new(
        engine,
        BudgetPolicy {
            total: memory_budget,
            exports: exports.len(),
        },
    );
    for e in exports {
        set.add(e)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    }
    Ok(set)
}

/// Serve one already connected client, handshake to close, on the exports
/// of `exports`. Returns when the client disconnects, breaks the protocol
/// or closes its socket.
///
/// The entry point for the fuzz target `nbd_client` and its regression test
/// (`udm::fuzzing`); the server itself calls it per accepted connection.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn serve_connection(sock: Sock, exports: &ExportSet, shutting_down: &AtomicBool) {
    connection(sock, exports, exports.engine(), shutting_down)
}

/// One client from handshake to close. Never panics on client input; any
/// error ends this connection only.
fn connection(sock: Sock, exports: &ExportSet, engine: &Engine, shutting_down: &AtomicBool) {
    let peer = sock.peer();
    // A client that stops reading replies must not hold a worker forever.
    let _ = sock.set_write_timeout(Some(std::time::Duration::from_secs(60)));
    // Haggling takes milliseconds; a client silent for long during it is
    // holding a thread for nothing. (Transmission may idle forever.)
    let _ = sock.set_read_timeout(Some(std::time::Duration::from_secs(120)));
    let neg = match negotiate(&sock, exports, shutting_down) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => {
            tracing::info!("client {peer}: handshake ended: {e}");
            sock.shutdown(Shutdown::Both);
            return;
        }
    };
    if let Err(e) = sock.set_read_timeout(None) {
        tracing::info!("client {peer}: {e}");
        return;
    }
    tracing::debug!("client {peer}: serving export {:?}", neg.export.export.name);
    let conn = Arc::new(Conn::new(sock, neg.structured));
    if let Err(e) = transmission(&conn, neg, engine) {
        tracing::info!("client {peer}: disconnected: {e}");
    }
    conn.sock.shutdown(Shutdown::Both);
}
