//! `udm serve` as a service: the sockets a service manager passes
//! (socket activation), readiness and stop notification (sd_notify), the
//! pidfile, the URIs printed when ready, and the crypttab re-read on
//! SIGHUP.
//!
//! Readiness is told only once every device of the command line is built
//! and exported, the control socket listens and the NBD socket does: a
//! unit ordered after `udm.service` (or a script waiting for the pidfile
//! or `--print-uri`'s line) can use the devices at once, with no polling.

use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sd_notify::NotifyState;

use crate::control::Service;
use crate::nbd::{Bound, Listen};

/// The sockets a service manager passed (`LISTEN_FDS`, `LISTEN_PID`,
/// `LISTEN_FDNAMES`).
#[derive(Debug, Default)]
pub struct Activated {
    /// The NBD socket (Unix or TCP).
    pub nbd: Option<Listen>,
    /// The control socket.
    pub control: Option<UnixListener>,
}

/// A passed listening socket, by address family.
enum Passed {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// The activated sockets, if this process was given any. A socket named
/// `control` (`FileDescriptorName=control`) is the control socket, any
/// other name the NBD socket; without names the first is NBD and a second
/// Unix socket is the control socket.
pub fn take_activated() -> Result<Activated, String> {
    let fds: Vec<(RawFd, String)> = sd_notify::listen_fds_with_names()
        .map_err(|e| format!("socket activation: {e} (check LISTEN_FDS and LISTEN_FDNAMES)"))?
        .collect();
    let named = fds.iter().any(|(_, n)| n == "control");
    let mut out = Activated::default();
    for (i, (fd, name)) in fds.into_iter().enumerate() {
        let passed = adopt(fd).map_err(|e| format!("socket activation: fd {fd} ({name}): {e}"))?;
        let is_control = if named { name == "control" } else { i == 1 };
        match passed {
            Passed::Unix(u) if is_control => {
                if out.control.replace(u).is_some() {
                    return Err(
                        "socket activation: two control sockets were passed; give one \
                         socket the name 'control'"
                            .into(),
                    );
                }
            }
            Passed::Tcp(_) if is_control => {
                return Err(format!(
                    "socket activation: the control socket (fd {fd}) is TCP; it must be a \
                     Unix socket (ListenStream=/run/udm/control)"
                ))
            }
            p => {
                if out.nbd.is_some() {
                    return Err(format!(
                        "socket activation: more than one NBD socket was passed (fd {fd}, \
                         '{name}'); udm serves one: pass one, and name the control socket \
                         'control' (FileDescriptorName=control)"
                    ));
                }
                out.nbd = Some(match p {
                    Passed::Unix(u) => Listen::ActivatedUnix(Arc::new(u)),
                    Passed::Tcp(t) => Listen::ActivatedTcp(Arc::new(t)),
                });
            }
        }
    }
    Ok(out)
}

fn sockopt(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `v`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Take ownership of a passed descriptor: a listening stream socket,
/// Unix or TCP.
fn adopt(fd: RawFd) -> Result<Passed, String> {
    let ty = sockopt(fd, libc::SO_TYPE).map_err(|e| format!("not a socket: {e}"))?;
    if ty != libc::SOCK_STREAM {
        return Err("not a stream socket (use ListenStream=)".into());
    }
    if sockopt(fd, libc::SO_ACCEPTCONN).map_err(|e| e.to_string())? == 0 {
        return Err("not listening (a socket unit for udm needs Accept=no)".into());
    }
    let domain = sockopt(fd, libc::SO_DOMAIN).map_err(|e| e.to_string())?;
    // SAFETY: the service manager passed `fd` to this process, it is open
    // (getsockopt just succeeded) and nothing else in udm owns it; it is
    // taken once, here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    match domain {
        libc::AF_UNIX => Ok(Passed::Unix(UnixListener::from(owned))),
        libc::AF_INET | libc::AF_INET6 => Ok(Passed::Tcp(TcpListener::from(owned))),
        d => Err(format!("address family {d} is neither Unix nor IP")),
    }
}

/// Tell the service manager (if `NOTIFY_SOCKET` names one); a failure is
/// only logged: serving matters more than the notification.
pub fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("sd_notify: {e}");
    }
}

/// The NBD URI of each export name (none: the server's URI alone).
pub fn uris(bound: &Bound, names: &[String], tls: bool) -> Vec<String> {
    let s = if tls { "s" } else { "" };
    let one = |name: &str| match bound {
        Bound::Unix(p) => format!("nbd{s}+unix:///{name}?socket={}", p.display()),
        Bound::Tcp(a) => format!("nbd{s}://{a}/{name}"),
    };
    if names.is_empty() {
        return vec![one("")];
    }
    names.iter().map(|n| one(n)).collect()
}

/// `--pidfile`: claimed at start (refused while another live udm server's
/// pid is in it), written when the server is ready, removed on exit if it
/// still holds our pid. Its directory is checked as the control socket's
/// is (a sticky one such as /tmp passes: the file beside it is created
/// with `O_EXCL|O_NOFOLLOW`, so a planted name is never followed).
#[derive(Debug)]
pub struct Pidfile {
    path: PathBuf,
    written: bool,
}

/// Whether process `pid` exists (EPERM: it does, someone else's).
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A process's `comm` (its executable's name, cut to 15 bytes).
fn comm_of(pid: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Whether `pid` runs the program named `comm` with `arg` among its
/// arguments: a udm server, not whatever process was given the number of
/// a server that died (or a number someone wrote into the file).
fn runs(pid: i32, comm: &str, arg: &str) -> bool {
    if comm_of(&pid.to_string()).as_deref() != Some(comm) {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
}

impl Pidfile {
    pub fn claim(path: &Path) -> Result<Pidfile, String> {
        let dir = crate::core::dirs::parent_of(path);
        if let Some(why) = crate::core::dirs::unsafe_dir(dir, true) {
            return Err(format!(
                "--pidfile {}: refusing it: {why}; give a pidfile in a directory only you \
                 or root may write to (as /run/udm.pid), or in a sticky one such as /tmp",
                path.display()
            ));
        }
        if let Ok(text) = std::fs::read_to_string(path) {
            let pid = text.trim().parse::<i32>().ok().filter(|p| *p > 0);
            let me = comm_of("self").unwrap_or_else(|| "udm".into());
            if let Some(pid) = pid.filter(|p| *p as u32 != std::process::id() && alive(*p)) {
                if runs(pid, &me, "serve") {
                    return Err(format!(
                        "--pidfile {}: udm server {pid} is running and holds it; stop it, or \
                         give another --pidfile",
                        path.display()
                    ));
                }
                tracing::warn!(
                    "--pidfile {}: process {pid} in it is not a udm server (a stale pid, \
                     reused); replacing it",
                    path.display()
                );
            }
        }
        Ok(Pidfile {
            path: path.to_path_buf(),
            written: false,
        })
    }

    /// Write our pid: into a file beside it, renamed over it, so a reader
    /// never sees it half written. The file beside it is made new
    /// (`O_EXCL|O_NOFOLLOW`): a name planted there, a symlink to a file
    /// root would otherwise overwrite, is removed, never followed.
    pub fn write(&mut self) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let tmp = self.path.with_extension("udm-tmp");
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
        };
        let mut f = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Left by a server that died here, or planted: unlink
                // removes the name itself, whatever it points to.
                std::fs::remove_file(&tmp)?;
                create()?
            }
            other => other?,
        };
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(format!("{}\n", std::process::id()).as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        self.written = true;
        Ok(())
    }
}

impl Drop for Pidfile {
    fn drop(&mut self) {
        let ours = std::fs::read_to_string(&self.path)
            .is_ok_and(|t| t.trim() == std::process::id().to_string());
        if self.written && ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The crypttab `serve --crypttab` opened, for SIGHUP.
#[derive(Debug, Clone)]
pub struct CrypttabSource {
    pub path: PathBuf,
    pub no_kdf_limit: bool,
    pub allow_weak_cipher: bool,
    /// Open volumes by name, with the line each came from (whitespace
    /// normalised), to tell changed lines.
    pub lines: HashMap<String, String>,
    /// The devices under a volume's own, lowest first (a TrueCrypt
    /// cascade's `NAME_2`, `NAME_1`): closed after it.
    pub lower: HashMap<String, Vec<String>>,
}

/// A crypttab line as compared across reloads.
pub fn normalised_line(text: &str, line: usize) -> String {
    text.lines()
        .nth(line.saturating_sub(1))
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The SIGHUP handler thread; stops on drop.
pub struct Reloader {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reloader {
    /// Catch SIGHUP from now on (a reload request must never kill the
    /// server, crypttab or not) and re-read `crypttab` on each.
    pub fn start(service: Arc<Service>, crypttab: Option<CrypttabSource>) -> io::Result<Reloader> {
        let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("udm-reload".into())
            .spawn(move || {
                let mut crypttab = crypttab;
                for _ in signals.forever() {
                    match crypttab.as_mut() {
                        Some(ct) => reload(&service, ct),
                        None => tracing::info!("SIGHUP: nothing to reload (no --crypttab)"),
                    }
                }
            })?;
        Ok(Reloader {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Re-read the crypttab: close the volumes whose line is gone or changed
/// (unless clients have them open: kept, and tried again at the next
/// SIGHUP), then open the new and changed lines.
pub fn reload(service: &Service, ct: &mut CrypttabSource) {
    notify(&[
        NotifyState::Reloading,
        NotifyState::monotonic_usec_now().unwrap_or(NotifyState::MonotonicUsec(0)),
    ]);
    let status = match reload_once(service, ct) {
        Ok(s) => {
            tracing::info!("SIGHUP: {}: {s}", ct.path.display());
            s
        }
        Err(e) => {
            tracing::error!("SIGHUP: {}: {e}; nothing changed", ct.path.display());
            format!("reload failed: {e}")
        }
    };
    notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
}

fn reload_once(service: &Service, ct: &mut CrypttabSource) -> Result<String, String> {
    let text = std::fs::read_to_string(&ct.path).map_err(|e| format!("cannot read it: {e}"))?;
    let entries = crate::luks::crypttab::parse(&text, &ct.path).map_err(|e| e.to_string())?;
    let wanted: HashMap<String, String> = entries
        .iter()
        .map(|e| (e.name.clone(), normalised_line(&text, e.line)))
        .collect();
    let (mut closed, mut kept, mut opened, mut failed) = (0, 0, 0, 0);
    let gone: Vec<String> = ct
        .lines
        .iter()
        .filter(|(n, l)| wanted.get(*n) != Some(l))
        .map(|(n, _)| n.clone())
        .collect();
    for name in gone {
        match service.deactivate(&name) {
            Ok(()) => {
                ct.lines.remove(&name);
                for l in ct.lower.remove(&name).unwrap_or_default().iter().rev() {
                    if let Err(e) = service.deactivate(l) {
                        tracing::warn!("SIGHUP: '{l}' (under '{name}') left open: {e}");
                    }
                }
                closed += 1;
            }
            Err(e) => {
                tracing::warn!("SIGHUP: '{name}' left open: {e}");
                kept += 1;
            }
        }
    }
    for e in &entries {
        if ct.lines.contains_key(&e.name) {
            continue;
        }
        if service.devices().info(&e.name).is_ok() {
            tracing::warn!(
                "SIGHUP: line {} ({}): a device of that name exists (not from the crypttab); \
                 skipped",
                e.line,
                e.name
            );
            failed += 1;
            continue;
        }
        let r = e
            .devices(ct.no_kdf_limit, ct.allow_weak_cipher)
            .map_err(|x| x.to_string())
            .and_then(|devs| activate_all(service, devs, e.read_only));
        match r {
            Ok(lower) => {
                ct.lines.insert(e.name.clone(), wanted[&e.name].clone());
                ct.lower.insert(e.name.clone(), lower);
                opened += 1;
            }
            Err(x) => {
                tracing::error!("SIGHUP: line {} ({}): {x}", e.line, e.name);
                failed += 1;
            }
        }
    }
    Ok(format!(
        "reloaded: {opened} opened, {closed} closed, {kept} kept open (in use), {failed} failed; \
         {} crypttab volume(s) served",
        ct.lines.len()
    ))
}

/// Create a volume's devices, lowest first; on a failure, remove those
/// already created. Returns the names under the volume's own device.
fn activate_all(
    service: &Service,
    devs: Vec<crate::luks::crypttab::LineDevice>,
    read_only: bool,
) -> Result<Vec<String>, String> {
    let mut made: Vec<String> = Vec::new();
    for d in devs {
        let name = d.name;
        if let Err(e) = service.activate(&name, d.table, read_only || d.read_only) {
            for m in made.iter().rev() {
                let _ = service.deactivate(m);
            }
            return Err(format!("{name}: {e}"));
        }
        made.push(name);
    }
    made.pop();
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_each_export_and_the_tls_scheme() {
        let u = Bound::Unix(PathBuf::from("/run/udm/nbd.sock"));
        assert_eq!(
            uris(&u, &["a".into(), "b".into()], false),
            [
                "nbd+unix:///a?socket=/run/udm/nbd.sock",
                "nbd+unix:///b?socket=/run/udm/nbd.sock"
            ]
        );
        let t = Bound::Tcp("127.0.0.1:10809".parse().unwrap());
        assert_eq!(uris(&t, &[], true), ["nbds://127.0.0.1:10809/"]);
    }

    /// A live process that is not a udm server (pid 1, a `sleep`) does not
    /// hold the pidfile: a stale or planted number never stops a start.
    #[test]
    fn a_pid_that_is_no_udm_server_is_replaced_garbage_too() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("udm.pid");
        let mut sleep = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        for planted in ["1".to_string(), sleep.id().to_string()] {
            std::fs::write(&p, format!("{planted}\n")).unwrap();
            let r = Pidfile::claim(&p);
            assert!(r.is_ok(), "pid {planted} (not udm) refused: {r:?}");
        }
        let _ = sleep.kill();
        let _ = sleep.wait();
        std::fs::write(&p, "not a pid\n").unwrap();
        assert!(Pidfile::claim(&p).is_ok());
    }

    /// What tells a server: its `comm` and an argument (this process with
    /// its own argv[0] stands in for `udm serve`).
    #[test]
    fn a_server_is_told_by_comm_and_argument() {
        let me = comm_of("self").unwrap();
        let arg0 = std::env::args().next().unwrap();
        assert!(runs(std::process::id() as i32, &me, &arg0));
        assert!(!runs(1, &me, &arg0));
        assert!(!runs(std::process::id() as i32, &me, "serve"));
    }

    #[test]
    fn our_pid_is_written_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("udm.pid");
        std::fs::write(&p, "not a pid\n").unwrap();
        let mut f = Pidfile::claim(&p).unwrap();
        f.write().unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            std::process::id().to_string()
        );
        drop(f);
        assert!(!p.exists(), "the pidfile is removed on drop");
    }

    /// A symlink planted at `PATH.udm-tmp` (to a file root would ruin) is
    /// removed, not followed: the victim keeps its bytes and the pidfile
    /// holds our pid.
    #[test]
    fn a_symlink_planted_beside_the_pidfile_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious\n").unwrap();
        let p = dir.path().join("udm.pid");
        let tmp = p.with_extension("udm-tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let mut f = Pidfile::claim(&p).unwrap();
        f.write().unwrap();
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"precious\n",
            "victim written"
        );
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            std::process::id().to_string()
        );
        assert!(!p.is_symlink(), "the pidfile is a symlink");
        assert!(
            std::fs::symlink_metadata(&tmp).is_err(),
            "the planted name stays"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
    }

    /// A pidfile in a directory anyone may write to (no sticky bit) is
    /// refused, naming the directory and the fix; a sticky one passes.
    #[test]
    fn a_pidfile_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Pidfile::claim(&open.join("udm.pid")).unwrap_err();
        assert!(
            e.contains("others may write to") && e.contains(&open.display().to_string()),
            "{e}"
        );
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(Pidfile::claim(&open.join("udm.pid")).is_ok());
    }

    #[test]
    fn lines_compare_without_whitespace_differences() {
        let t = "# c\nvol  /dev/x   none\tluks\n";
        assert_eq!(normalised_line(t, 2), "vol /dev/x none luks");
        assert_eq!(normalised_line(t, 9), "");
    }
}
