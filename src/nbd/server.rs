//! Listening, accepting and shutting down.
//!
//! The accepting thread only accepts: it hands each connection to an event
//! loop (`reactor.rs`), which runs the handshake and the requests; the
//! shared [`Engine`] executes them. So the accept path never waits behind
//! a handshake, and threads do not grow with connections.
//!
//! Connection cap (`--max-connections`, `admission.rs`): one client holds
//! at most `--max-connections-per-client`; at the cap, the oldest
//! connection still in its handshake is shed to make room, else the oldest
//! idle one of the client holding the most; only when none is either is a
//! new client refused. A flood of sockets that never negotiate, or that
//! negotiate and sit, therefore cannot lock other clients out, and the
//! handshake and unused deadlines clear them anyway.
//!
//! Shutdown (SIGINT/SIGTERM, or a flag for embedders and tests): stop
//! accepting, stop reading new requests, let every admitted request finish
//! and be answered, flush every export, return.

use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;

use super::admission::Admission;
use super::conn::{Cx, NetOptions};
use super::export::{AccessPolicy, BudgetPolicy, Export, ExportSet};
use super::reactor::Net;
use super::sock::Sock;
use super::tls::{self, TlsOptions};

/// Where to listen.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A Unix socket path (a stale socket file there is replaced).
    Unix(PathBuf),
    /// `HOST:PORT`, or `HOST` for the standard port 10809.
    Tcp(String),
    /// A listening Unix socket the service manager bound and passed
    /// (socket activation); its file belongs to the manager and stays.
    ActivatedUnix(Arc<UnixListener>),
    /// A listening TCP socket the service manager passed.
    ActivatedTcp(Arc<TcpListener>),
}

/// Where the server listens once it does, for readiness hooks: the
/// address a client's URI needs.
#[derive(Debug, Clone)]
pub enum Bound {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

/// What the server tells a [`ServeOptions::events`] hook.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    /// The socket listens and the event loops run: clients are served.
    Listening(Bound),
    /// A stop was asked for: no new clients, in-flight requests finish.
    Stopping,
}

/// A hook told of [`ServerEvent`]s (readiness notification, pidfile).
pub type EventHook = Arc<dyn Fn(ServerEvent) + Send + Sync>;

/// Everything `serve` needs.
pub struct ServerConfig {
    pub listen: Listen,
    /// The first export is also the default export "".
    pub exports: Vec<Export>,
    /// Worker threads; 0 = number of cores.
    pub threads: usize,
}

/// Default mode of the NBD Unix socket, as root or not: only the server's
/// own user (and root) may connect; `--socket-mode 0660` shares it with
/// the socket's group. It never depends on the umask.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// Default `--max-connections` (lowered to what the descriptor limit
/// allows).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16384;

/// Optional knobs of [`serve_with`].
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Total in-flight payload memory for all exports (divided equally);
    /// `None`: 2 % of RAM, at least 16 MiB per export.
    pub memory_budget: Option<u64>,
    /// Stop when this becomes true (checked every 100 ms) instead of on
    /// SIGINT/SIGTERM; no signal handlers are installed then.
    pub stop: Option<Arc<AtomicBool>>,
    /// Most open connections (`None`: [`DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: Option<usize>,
    /// Event loop threads (0: one per core).
    pub net_threads: usize,
    /// Handshake deadline, idle deadline, reply deadline, per-connection
    /// caps (the TLS mode inside is set from `tls`).
    pub net: NetOptions,
    pub tls: TlsOptions,
    /// Access rules by export name, also for exports added later
    /// (`None`: keep the set's policy; a new set has none, i.e. every
    /// export open to every client that reaches the server).
    pub policy: Option<AccessPolicy>,
    /// Mode of the Unix socket (`None`: [`DEFAULT_SOCKET_MODE`]).
    pub socket_mode: Option<u32>,
    /// Serve this export set, owned by the caller (who adds and removes
    /// exports while the server runs: the control socket). The exports of
    /// the [`ServerConfig`] are added to it, and it may start empty.
    /// `None`: a set of the configured exports, which must not be empty.
    pub exports: Option<Arc<ExportSet>>,
    /// Told when the server listens and when it starts stopping.
    pub events: Option<EventHook>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("memory_budget", &self.memory_budget)
            .field("stop", &self.stop)
            .field("exports", &self.exports.as_ref().map(|e| e.list().len()))
            .field("max_connections", &self.max_connections)
            .field("net_threads", &self.net_threads)
            .field("net", &self.net)
            .field("tls", &self.tls)
            .finish()
    }
}

use super::proto::DEFAULT_PORT;

enum Listener {
    /// The socket, and its path when the file is ours to remove.
    Unix(UnixListener, Option<PathBuf>),
    Tcp(TcpListener),
}

impl Listener {
    fn bind(l: &Listen, socket_mode: u32) -> io::Result<Listener> {
        match l {
            Listen::Unix(p) => {
                if let Ok(m) = std::fs::symlink_metadata(p) {
                    if m.file_type().is_socket() && UnixStream::connect(p).is_err() {
                        // A socket file nobody listens on: left by a crash.
                        let _ = std::fs::remove_file(p);
                    }
                }
                let u = bind_unix(p, socket_mode).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "cannot listen on {}: {e} (is another server running there? \
                             remove the file or choose another --socket)",
                            p.display()
                        ),
                    )
                })?;
                Ok(Listener::Unix(u, Some(p.clone())))
            }
            Listen::ActivatedUnix(u) => Ok(Listener::Unix(u.try_clone()?, None)),
            Listen::ActivatedTcp(t) => Ok(Listener::Tcp(t.try_clone()?)),
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

    /// Accept one connection, non-blocking (the event loops' mode).
    fn accept(&self) -> io::Result<Sock> {
        let s = match self {
            Listener::Unix(u, _) => {
                let (s, _) = u.accept()?;
                s.set_nonblocking(true)?;
                let s = Sock::Unix(s);
                s.widen_send_buffer();
                s
            }
            Listener::Tcp(t) => {
                let (s, _) = t.accept()?;
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                Sock::Tcp(s)
            }
        };
        Ok(s)
    }

    /// Where clients reach us (`None`: an unnamed socket).
    fn bound(&self) -> Option<Bound> {
        match self {
            Listener::Unix(_, Some(p)) => Some(Bound::Unix(p.clone())),
            Listener::Unix(u, None) => u
                .local_addr()
                .ok()?
                .as_pathname()
                .map(|p| Bound::Unix(p.to_path_buf())),
            Listener::Tcp(t) => t.local_addr().ok().map(Bound::Tcp),
        }
    }

    /// Where clients reach us, for the log.
    fn describe(&self) -> String {
        match self.bound() {
            Some(Bound::Unix(p)) => format!("nbd+unix:///?socket={}", p.display()),
            Some(Bound::Tcp(a)) => format!("nbd://{a}"),
            None => "an unnamed socket".to_string(),
        }
    }
}

/// Bind a Unix socket with exactly `mode`. The umask is narrowed around
/// bind(2) so the socket is never reachable with a wider mode, not even
/// for the instant before the chmod (which makes the mode exact whatever
/// the umask was).
fn bind_unix(p: &std::path::Path, mode: u32) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mode = mode & 0o777;
    // SAFETY: umask(2) only swaps the process's file mode mask.
    let old = unsafe { libc::umask(0o777 & !mode as libc::mode_t) };
    let r = UnixListener::bind(p);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let u = r?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    Ok(u)
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, Some(p)) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The self-pipe that SIGINT/SIGTERM write to (through `signal-hook`), so
/// that a signal wakes the accept loop's poll at once; the handlers also
/// set the stop flag. Dropping it unregisters them.
struct Pipe {
    read: UnixStream,
    ids: Vec<signal_hook::SigId>,
}

impl Pipe {
    fn install(stop: &Arc<AtomicBool>) -> io::Result<Pipe> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let mut pipe = Pipe {
            read,
            ids: Vec::new(),
        };
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            pipe.ids
                .push(signal_hook::flag::register(sig, Arc::clone(stop))?);
            pipe.ids.push(signal_hook::low_level::pipe::register(
                sig,
                write.try_clone()?,
            )?);
        }
        Ok(pipe)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
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
    let stop = Arc::new(AtomicBool::new(false));
    let pipe = Pipe::install(&stop)?;
    run(cfg, &stop, Some(&pipe), &opts)
}

/// Raise the soft limit on open descriptors to the hard limit (each
/// connection is one) and return the limit now in force.
fn raise_nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the live struct only.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
    }
    r.rlim_cur
}

/// Descriptors kept back from the connection cap (exports, the listener,
/// epoll, pipes, logs).
const FD_RESERVE: usize = 64;

fn run(
    cfg: ServerConfig,
    stop: &AtomicBool,
    pipe: Option<&Pipe>,
    opts: &ServeOptions,
) -> io::Result<()> {
    let tls_config = tls::server_config(&opts.tls)
        .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    let max_conns = connection_cap(opts.max_connections);
    let exports = exports_of(cfg.exports, cfg.threads, opts)?;
    let engine = exports.engine().clone();
    let listener = Listener::bind(&cfg.listen, opts.socket_mode.unwrap_or(DEFAULT_SOCKET_MODE))?;
    listener.set_nonblocking()?;
    let mut net_opts = opts.net.clone();
    net_opts.tls = opts.tls.mode;
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cx = Arc::new(Cx {
        exports: exports.clone(),
        engine: engine.clone(),
        opts: net_opts,
        tls: tls_config,
        shutting_down: AtomicBool::new(false),
        conns: Some((live.clone(), max_conns)),
    });
    let mut net = Net::start(cx.clone(), opts.net_threads)?;
    let mut admit = Admission::new(
        max_conns,
        opts.net.max_connections_per_client.unwrap_or(0),
        live,
    );
    tracing::info!(
        "serving {} export(s) on {} (at most {max_conns} connections, {} per client)",
        exports.list().len(),
        listener.describe(),
        admit.per_client()
    );
    if let (Some(hook), Some(b)) = (&opts.events, listener.bound()) {
        hook(ServerEvent::Listening(b));
    }

    let stopped = || stop.load(Ordering::SeqCst);
    while !stopped() {
        let mut fds = [
            libc::pollfd {
                fd: listener.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pipe.map_or(-1, |p| p.read.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads/writes the live array of two pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 100) };
        if n <= 0 || fds[0].revents == 0 {
            continue;
        }
        // Take a burst of pending connections per wake-up (bounded, so a
        // flood cannot keep the stop flag from being looked at).
        for _ in 0..1024 {
            let sock = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // Out of descriptors and the like: keep serving the others.
                    tracing::warn!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                    break;
                }
            };
            if let Some(conn) = admit.admit(sock) {
                net.add(conn);
            }
        }
    }

    tracing::info!("shutting down: finishing in-flight requests");
    if let Some(hook) = &opts.events {
        hook(ServerEvent::Stopping);
    }
    drop(listener);
    shut_down(&engine, cx, net)
}

/// Let every admitted request finish and be answered, then flush every
/// export.
fn shut_down(engine: &Engine, cx: Arc<Cx>, net: Net) -> io::Result<()> {
    // Requests waiting behind a suspended device must run before the
    // connections can finish.
    engine.release_all();
    cx.shutting_down.store(true, Ordering::SeqCst);
    net.stop();
    drop(cx);
    let flushed = engine.flush_all();
    engine.shutdown();
    flushed.map_err(|e| io::Error::other(format!("final flush failed: {e}")))?;
    tracing::info!("all exports flushed; bye");
    Ok(())
}

/// `--max-connections`, or what the descriptor limit (raised to its hard
/// limit) allows.
fn connection_cap(asked: Option<usize>) -> usize {
    let nofile = raise_nofile_limit();
    let fd_cap = (nofile as usize).saturating_sub(FD_RESERVE).max(1);
    match asked {
        Some(n) => {
            if n > fd_cap {
                tracing::warn!(
                    "--max-connections {n} is above what the descriptor limit ({nofile}) \
                     allows; connections past {fd_cap} will be refused by the system \
                     (raise `ulimit -n`)"
                );
            }
            n.max(1)
        }
        None => DEFAULT_MAX_CONNECTIONS.min(fd_cap),
    }
}

/// The caller's export set or a new one, with the access policy set
/// before the configured exports are added (so they get their names'
/// rules).
fn exports_of(
    configured: Vec<Export>,
    threads: usize,
    opts: &ServeOptions,
) -> io::Result<Arc<ExportSet>> {
    let exports = match &opts.exports {
        Some(set) => set.clone(),
        None if configured.is_empty() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no exports configured: give at least one device to serve",
            ))
        }
        None => Arc::new(ExportSet::new(
            Arc::new(Engine::start(threads)?),
            BudgetPolicy {
                total: opts.memory_budget,
                exports: configured.len(),
            },
        )),
    };
    if let Some(p) = &opts.policy {
        exports.set_policy(p.clone());
    }
    for e in configured {
        exports
            .add(e)
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    }
    Ok(exports)
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
/// (`udm::fuzzing`); it runs the server's own event loop on the calling
/// thread for this one connection.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn serve_connection(sock: Sock, exports: &Arc<ExportSet>, shutting_down: &AtomicBool) {
    if let Err(e) = sock.set_nonblocking(true) {
        tracing::warn!("cannot make the socket non-blocking: {e}");
        return;
    }
    let cx = Arc::new(Cx {
        exports: exports.clone(),
        engine: exports.engine().clone(),
        opts: NetOptions::default(),
        tls: None,
        shutting_down: AtomicBool::new(shutting_down.load(Ordering::Relaxed)),
        conns: None,
    });
    super::reactor::run_one(cx, Arc::new(super::conn::Conn::new(sock, None)));
}
