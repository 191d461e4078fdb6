//! `udm serve` as a service: socket activation through
//! systemd-socket-activate, sd_notify readiness on a NOTIFY_SOCKET the
//! test binds, `--pidfile`, `--print-uri`, and the crypttab re-read on
//! SIGHUP.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::luks::{cryptsetup, FAST_PBKDF};
use common::*;

/// A child killed on drop (a failing test leaves no server behind).
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kid {
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with the pid of a child we own and a valid signal.
        unsafe { libc::kill(self.0.id() as i32, sig) };
    }

    /// SIGTERM and the exit code.
    fn stop(&mut self) -> Option<i32> {
        self.signal(libc::SIGTERM);
        let t = Instant::now();
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                return st.code();
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn size_of(uri: &str) -> Option<u64> {
    let o = Command::new(need("nbdinfo"))
        .args(["--size", uri])
        .output()
        .unwrap();
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().parse().unwrap())
}

fn udm_at(ctl: &Path) -> Command {
    let mut c = udm();
    c.env("UDM_CONTROL", ctl);
    c
}

#[test]
fn systemd_socket_activate_passes_the_nbd_and_control_sockets() {
    let d = scratch("udm-svc-");
    let img = sparse(d.path(), "disk.img", 8 << 20);
    let sock = d.path().join("nbd.sock");
    let ctl = d.path().join("control");
    let log = std::fs::File::create(d.path().join("log")).unwrap();
    let mut kid = Kid(Command::new(need("systemd-socket-activate"))
        .arg("-l")
        .arg(&sock)
        .arg("-l")
        .arg(&ctl)
        .arg("--fdname=nbd:control")
        .arg(env!("CARGO_BIN_EXE_udm"))
        .args(["serve", "--file"])
        .arg(format!("raw={}", img.display()))
        .env("UDM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap());
    wait_for("the activation socket", Duration::from_secs(20), || {
        UnixStream::connect(&sock).is_ok()
    });
    // The first connection starts udm, which answers on the passed socket.
    let uri = format!("nbd+unix:///raw?socket={}", sock.display());
    assert_eq!(size_of(&uri), Some(8 << 20));
    // The control socket came from the manager too: a device created
    // through it is served on the NBD socket.
    let o = run(udm_at(&ctl).args(["dmsetup", "create", "z", "--table", "0 2048 zero"]));
    assert!(o.status.success());
    let uri_z = format!("nbd+unix:///z?socket={}", sock.display());
    assert_eq!(size_of(&uri_z), Some(1 << 20));
    assert_eq!(kid.stop(), Some(0));
    let text = std::fs::read_to_string(d.path().join("log")).unwrap();
    assert!(text.contains("control socket on"), "{text}");
    // The manager's socket files are left to the manager.
    assert!(sock.exists() && ctl.exists(), "socket files removed");
}

#[test]
fn socket_activation_takes_a_tcp_socket() {
    let d = scratch("udm-svc-");
    let img = sparse(d.path(), "disk.img", 4 << 20);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(d.path().join("log")).unwrap();
    let _kid = Kid(Command::new(need("systemd-socket-activate"))
        .arg("-l")
        .arg(format!("127.0.0.1:{port}"))
        .arg(env!("CARGO_BIN_EXE_udm"))
        .args(["serve", "--no-control", "--file"])
        .arg(format!("raw={}", img.display()))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap());
    wait_for("the activation socket", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert_eq!(
        size_of(&format!("nbd://127.0.0.1:{port}/raw")),
        Some(4 << 20)
    );
}

/// Datagrams on a NOTIFY_SOCKET, each split into lines.
struct Notify(UnixDatagram, PathBuf);

impl Notify {
    fn bind(dir: &Path) -> Notify {
        let p = dir.join("notify.sock");
        let s = UnixDatagram::bind(&p).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Notify(s, p)
    }

    /// The next message, within `limit` (none: `None`).
    fn next(&self, limit: Duration) -> Option<String> {
        let t = Instant::now();
        let mut buf = [0u8; 4096];
        while t.elapsed() < limit {
            if let Ok(n) = self.0.recv(&mut buf) {
                return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        None
    }
}

#[test]
fn ready_comes_after_the_devices_answer_with_pidfile_and_uris() {
    let d = scratch("udm-svc-");
    let n = Notify::bind(d.path());
    let key = write_file(d.path(), "key", b"service passphrase");
    let vol = sparse(d.path(), "vol.img", 32 << 20);
    run(cryptsetup()
        .args(["luksFormat", "-q", "--type", "luks2"])
        .args(FAST_PBKDF)
        .arg("--key-file")
        .arg(&key)
        .arg(&vol));
    let sock = d.path().join("nbd.sock");
    let pid = d.path().join("udm.pid");
    let mut kid = Kid(udm()
        .args(["serve", "--no-control", "--print-uri", "--socket"])
        .arg(&sock)
        .arg("--pidfile")
        .arg(&pid)
        .arg("--luks")
        .arg(format!("vol={}", vol.display()))
        .arg("--key-file")
        .arg(&key)
        .args([
            "--table",
            &format!("z={}", {
                let t = d.path().join("z.table");
                std::fs::write(&t, "0 4096 zero\n").unwrap();
                t.display().to_string()
            }),
        ])
        .env("NOTIFY_SOCKET", &n.1)
        .env("UDM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap());
    let msg = n
        .next(Duration::from_secs(60))
        .expect("no sd_notify message");
    assert!(msg.lines().any(|l| l == "READY=1"), "first message: {msg}");
    // READY=1 means every device answers now, with no polling.
    let vol_uri = format!("nbd+unix:///vol?socket={}", sock.display());
    assert_eq!(size_of(&vol_uri), Some((32 << 20) - (16 << 20)));
    assert_eq!(
        size_of(&format!("nbd+unix:///z?socket={}", sock.display())),
        Some(2 << 20)
    );
    assert!(msg.contains("STATUS=serving 2 device(s)"), "{msg}");
    // The pidfile holds the server's pid, and the URIs were printed.
    assert_eq!(
        std::fs::read_to_string(&pid).unwrap().trim(),
        kid.0.id().to_string()
    );
    let mut out = BufReader::new(kid.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), vol_uri);
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        format!("nbd+unix:///z?socket={}", sock.display())
    );
    // A second server on the same pidfile is refused while this one runs.
    let o = udm()
        .args(["serve", "--no-control", "--socket"])
        .arg(d.path().join("other.sock"))
        .arg("--pidfile")
        .arg(&pid)
        .arg("--table")
        .arg(format!("z={}", d.path().join("z.table").display()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--pidfile") && err.contains("is running"),
        "{err}"
    );

    kid.signal(libc::SIGTERM);
    let msg = n.next(Duration::from_secs(20)).expect("no STOPPING=1");
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg}");
    assert_eq!(kid.stop(), Some(0));
    assert!(!pid.exists(), "pidfile left behind");
}

fn luks_volume(dir: &Path, name: &str, key: &Path) -> PathBuf {
    let vol = sparse(dir, &format!("{name}.img"), 20 << 20);
    run(cryptsetup()
        .args(["luksFormat", "-q", "--type", "luks2"])
        .args(FAST_PBKDF)
        .arg("--key-file")
        .arg(key)
        .arg(&vol));
    vol
}

#[test]
fn sighup_rereads_the_crypttab_and_keeps_volumes_in_use() {
    let d = scratch("udm-svc-");
    let key = write_file(d.path(), "key", b"crypttab passphrase");
    let a = luks_volume(d.path(), "a", &key);
    let b = luks_volume(d.path(), "b", &key);
    let ct = d.path().join("crypttab");
    let line = |n: &str, img: &Path| format!("{n} {} {} luks\n", img.display(), key.display());
    std::fs::write(&ct, line("a", &a)).unwrap();
    let sock = d.path().join("nbd.sock");
    let ctl = d.path().join("control");
    let n = Notify::bind(d.path());
    let mut kid = Kid(udm()
        .args(["serve", "--socket"])
        .arg(&sock)
        .arg("--control")
        .arg(&ctl)
        .arg("--crypttab")
        .arg(&ct)
        .env("NOTIFY_SOCKET", &n.1)
        .env("UDM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.path().join("log")).unwrap())
        .spawn()
        .unwrap());
    assert!(n
        .next(Duration::from_secs(60))
        .is_some_and(|m| m.contains("READY=1")));
    let uri = |name: &str| format!("nbd+unix:///{name}?socket={}", sock.display());
    assert_eq!(size_of(&uri("a")), Some(4 << 20));

    // A client holds `a` (the default export); `a` leaves the file and
    // `b` comes in.
    let mut held = UnixStream::connect(&sock).unwrap();
    common::nbd::handshake(&mut held);
    wait_for(
        "the client in transmission",
        Duration::from_secs(10),
        || run_text(udm_at(&ctl).args(["dmsetup", "info", "a"])).contains("Open count:        1"),
    );
    std::fs::write(&ct, line("b", &b)).unwrap();
    kid.signal(libc::SIGHUP);
    let reloading = n.next(Duration::from_secs(30)).expect("RELOADING=1");
    assert!(reloading.contains("RELOADING=1"), "{reloading}");
    let done = n
        .next(Duration::from_secs(30))
        .expect("READY=1 after reload");
    assert!(
        done.contains("READY=1") && done.contains("1 opened, 0 closed, 1 kept open"),
        "{done}"
    );
    assert_eq!(size_of(&uri("b")), Some(4 << 20));
    assert_eq!(size_of(&uri("a")), Some(4 << 20), "a client still has a");

    // Once its client has gone, the next SIGHUP closes it.
    drop(held);
    wait_for("the client gone", Duration::from_secs(10), || {
        run_text(udm_at(&ctl).args(["dmsetup", "info", "a"])).contains("Open count:        0")
    });
    kid.signal(libc::SIGHUP);
    let _ = n.next(Duration::from_secs(30));
    let done = n
        .next(Duration::from_secs(30))
        .expect("READY=1 after reload");
    assert!(done.contains("0 opened, 1 closed, 0 kept open"), "{done}");
    assert_eq!(size_of(&uri("a")), None, "a is closed");
    let ls = run_text(udm_at(&ctl).args(["dmsetup", "ls"]));
    let names: Vec<&str> = ls
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["b"], "{ls}");
    // A broken file changes nothing.
    std::fs::write(&ct, "b /nonexistent none luks,bogus-option\n").unwrap();
    kid.signal(libc::SIGHUP);
    let _ = n.next(Duration::from_secs(30));
    let done = n
        .next(Duration::from_secs(30))
        .expect("READY=1 after reload");
    assert!(done.contains("reload failed"), "{done}");
    assert_eq!(size_of(&uri("b")), Some(4 << 20));
    assert_eq!(kid.stop(), Some(0));
}

/// contrib/systemd's units pass `systemd-analyze verify` with no warning
/// (an unknown key is only a warning there, so stderr must be empty), with
/// ExecStart pointed at the binary under test.
#[test]
fn contrib_systemd_units_verify_clean() {
    let d = scratch("udm-units-");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let mut units = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("/usr/local/bin/udm", env!("CARGO_BIN_EXE_udm"));
        // A template is verified as one of its instances.
        let name = name.replace("@.", "@data.");
        std::fs::write(d.path().join(&name), text).unwrap();
        units.push(name);
    }
    units.sort();
    assert_eq!(
        units,
        [
            "udm-control.socket",
            "udm-crypttab@data.service",
            "udm-mapper.service",
            "udm.service",
            "udm.socket"
        ]
    );
    let o = Command::new(need("systemd-analyze"))
        .args(["verify", "--man=no"])
        .args(&units)
        .current_dir(d.path())
        .output()
        .unwrap();
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "systemd-analyze verify: {}",
        show(&o)
    );
}

/// Each service of contrib/systemd scores at most 5.0 ("OK") in
/// `systemd-analyze security`, and every exposure it still reports
/// (a line marked ✗) is explained by a comment in the unit naming the
/// setting.
#[test]
fn contrib_systemd_services_are_hardened_and_explain_what_is_left() {
    let d = scratch("udm-security-");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    for (file, name) in [
        ("udm.service", "udm.service"),
        ("udm-mapper.service", "udm-mapper.service"),
        ("udm-crypttab@.service", "udm-crypttab@data.service"),
    ] {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        let unit = d.path().join(name);
        std::fs::write(&unit, &text).unwrap();
        let o = Command::new(need("systemd-analyze"))
            .args(["security", "--offline=yes", "--no-pager"])
            .arg(&unit)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let overall = out
            .lines()
            .find_map(|l| l.split_once(&format!("level for {name}: ")))
            .map(|(_, r)| r.to_string())
            .unwrap_or_else(|| panic!("no overall level for {name}: {}", show(&o)));
        let score: f64 = overall.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            score <= 5.0 && overall.contains("OK"),
            "{name}: exposure {overall}\n{out}"
        );
        let comments: String = text
            .lines()
            .filter(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        for l in out.lines().filter(|l| l.starts_with('✗')) {
            let setting = l
                .trim_start_matches('✗')
                .trim()
                .split(['=', '/'])
                .next()
                .unwrap()
                .to_string();
            assert!(
                comments.contains(&format!("{setting}=")),
                "{name}: the exposure '{}' is not explained by a comment naming {setting}=",
                l.trim()
            );
        }
    }
}
