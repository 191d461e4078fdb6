//! The control socket: a Unix socket, mode 0600, whose peers must be the
//! server's own user or root (checked with SO_PEERCRED on every
//! connection, so a socket file made reachable by mistake still refuses
//! strangers).
//!
//! Hostile or broken peers cost little and stop nothing: a connection is
//! served by a thread of its own, at most [`MAX_CONNECTIONS`] at a time
//! (past that a peer gets an error reply and is closed); a started
//! message must arrive whole within [`MESSAGE_DEADLINE`]; a connection
//! idle between messages for [`IDLE_LIMIT`] is closed; malformed or
//! oversized messages get an error reply and the connection is closed
//! (its stream cannot be trusted any more). None of it touches the NBD
//! side: the exports keep serving.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::proto::{self, Code, ReadError, Reply, Request};
use super::service::Service;

/// Control connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// A message whose first byte arrived must be complete within this.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(5);
/// A connection with no message for this long is closed.
pub const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// Where the control socket goes when `--control` is not given:
/// `$UDM_CONTROL`, else `/run/udm/control` for root, else
/// `$XDG_RUNTIME_DIR/udm/control`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("UDM_CONTROL").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/run/udm/control"));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|p| !p.is_empty())
        .map(|d| PathBuf::from(d).join("udm/control"))
}

/// The uid of the peer of a Unix socket (one implementation, the NBD
/// socket's, for both servers).
pub use crate::nbd::sock::peer_uid;

/// A running control server; stops (and removes its socket) on drop.
pub struct ControlServer {
    path: PathBuf,
    /// Whether the socket file is ours to remove (not when the service
    /// manager bound it).
    owns_file: bool,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Bind `path` (creating its directory, mode 0700, if missing) and
    /// serve `service` on it. A socket file nobody listens on is replaced;
    /// one a live server listens on is an error.
    pub fn start(path: &Path, service: Arc<Service>) -> io::Result<ControlServer> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))
                })?;
                let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
            }
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        check_dir(dir, path)?;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.file_type().is_socket() {
                if UnixStream::connect(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "another udm server listens on the control socket {}; \
                             give this one --control PATH",
                            path.display()
                        ),
                    ));
                }
                let _ = std::fs::remove_file(path);
            }
        }
        let listener = UnixListener::bind(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on control socket {}: {e}", path.display()),
            )
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Self::serve_on(listener, path.to_path_buf(), true, service)
    }

    /// Serve on a socket the service manager bound and passed (socket
    /// activation); its file is left in place on drop. Peers are checked
    /// as on a socket of our own.
    pub fn adopt(listener: UnixListener, service: Arc<Service>) -> io::Result<ControlServer> {
        let path = listener
            .local_addr()?
            .as_pathname()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Self::serve_on(listener, path, false, service)
    }

    fn serve_on(
        listener: UnixListener,
        path: PathBuf,
        owns_file: bool,
        service: Arc<Service>,
    ) -> io::Result<ControlServer> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("udm-control".into())
            .spawn(move || accept_loop(listener, service, s2))?;
        tracing::info!("control socket on {}", path.display());
        Ok(ControlServer {
            path,
            owns_file,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Refuse to serve keys from a socket others could replace: its directory
/// must belong to root or to us, and nobody else may write to it. A
/// sticky world-writable directory such as /tmp is refused too (there
/// another user could have planted the path, or the directory we meant to
/// create, first); a directory udm creates itself is 0700. See
/// docs/SECURITY.md, F16.
fn check_dir(dir: &Path, path: &Path) -> io::Result<()> {
    std::fs::metadata(dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("control socket directory {}: {e}", dir.display()),
        )
    })?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing the control socket {}: {why}; give --control a path in a directory \
                 only you (or root) own and may write to, e.g. $XDG_RUNTIME_DIR/udm/control, or \
                 a directory that does not exist yet (udm creates it with mode 0700)",
                path.display()
            ),
        ))
    };
    match crate::core::dirs::unsafe_dir(dir, false) {
        Some(why) => refuse(why),
        None => Ok(()),
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.owns_file {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn accept_loop(listener: UnixListener, service: Arc<Service>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut last_reap = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: poll reads/writes the live array of one pollfd.
        unsafe { libc::poll(fds.as_mut_ptr(), 1, 100) };
        if last_reap.elapsed() > Duration::from_millis(200) {
            service.reap_deferred();
            last_reap = Instant::now();
        }
        let s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!("control accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            let _ = send(
                &s,
                &Reply::err(
                    Code::Eagain,
                    format!("too many control connections (at most {MAX_CONNECTIONS}); retry"),
                ),
                &[],
            );
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (svc, act, st) = (service.clone(), active.clone(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name("udm-control-conn".into())
            .spawn(move || {
                connection(s, &svc, &st);
                act.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("cannot start a control connection thread: {e}");
        }
    }
    service.stop();
}

fn send(mut s: &UnixStream, reply: &Reply, payload: &[u8]) -> io::Result<()> {
    let json = serde_json::to_vec(reply).unwrap_or_else(|_| b"{\"v\":1,\"ok\":false}".to_vec());
    proto::write_message(&mut s, &json, payload)
}

/// Whether the peer is still connected (for long `wait`s).
fn peer_alive(s: &UnixStream) -> bool {
    let mut fds = [libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    }];
    // SAFETY: poll reads/writes the live array of one pollfd; 0 timeout.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
    n == 0 || fds[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0
}

fn connection(s: UnixStream, service: &Service, stop: &AtomicBool) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match peer_uid(&s) {
        Ok(uid) if uid == me || uid == 0 => {}
        Ok(uid) => {
            tracing::warn!("control: refused a peer with uid {uid}");
            let _ = send(
                &s,
                &Reply::err(
                    Code::Eperm,
                    format!(
                        "permission denied: this udm server runs as uid {me}; only that user \
                         and root may control it (you are uid {uid})"
                    ),
                ),
                &[],
            );
            return;
        }
        Err(e) => {
            tracing::warn!("control: cannot identify a peer: {e}");
            return;
        }
    }
    while !stop.load(Ordering::SeqCst) {
        let _ = s.set_read_timeout(Some(IDLE_LIMIT));
        let deadline = std::cell::Cell::new(None::<Instant>);
        let mut reader = DeadlineReader {
            s: &s,
            deadline: &deadline,
        };
        let msg = proto::read_message(&mut reader, || {
            deadline.set(Some(Instant::now() + MESSAGE_DEADLINE));
        });
        let msg = match msg {
            Ok(m) => m,
            Err(ReadError::Closed) => return,
            Err(ReadError::Io(e)) => {
                if deadline.get().is_some() {
                    let _ = send(
                        &s,
                        &Reply::err(
                            Code::Eproto,
                            format!(
                                "incomplete request: it did not arrive whole within {} s ({e})",
                                MESSAGE_DEADLINE.as_secs()
                            ),
                        ),
                        &[],
                    );
                }
                return;
            }
            Err(ReadError::Bad(why)) => {
                let _ = send(&s, &Reply::err(Code::Eproto, why), &[]);
                return;
            }
        };
        let req: Request = match serde_json::from_slice(&msg.json) {
            Ok(r) => r,
            Err(e) => {
                let _ = send(
                    &s,
                    &Reply::err(Code::Eproto, format!("malformed request JSON: {e}")),
                    &[],
                );
                return;
            }
        };
        if req.v != proto::VERSION {
            let _ = send(
                &s,
                &Reply::err(
                    Code::Eproto,
                    format!(
                        "control protocol version {} is not supported; this server speaks {}",
                        req.v,
                        proto::VERSION
                    ),
                ),
                &[],
            );
            return;
        }
        let _ = s.set_read_timeout(None);
        let alive = || peer_alive(&s);
        let (reply, payload) = match service.handle(&req, msg.payload, &alive) {
            Ok((v, p)) => (Reply::ok(v), p),
            Err(e) => (
                Reply::err(e.code, e.msg),
                zeroize::Zeroizing::new(Vec::new()),
            ),
        };
        if send(&s, &reply, &payload).is_err() {
            return;
        }
    }
}

/// Reads with the socket's timeout shortened to what is left of the
/// message deadline once a message has started.
struct DeadlineReader<'a> {
    s: &'a UnixStream,
    deadline: &'a std::cell::Cell<Option<Instant>>,
}

impl io::Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline.get() {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
            }
            self.s.set_read_timeout(Some(left))?;
        }
        (&*self.s).read(buf)
    }
}
