//! One device's failure is that device's alone, through the real server:
//! a panic injected (test-only hook, `UDM_TEST_PANIC`) at each place where
//! a device's own code runs — its request path, its metadata commit, a
//! message, a table load and a background job — fails that device (EIO,
//! `status` says `Fail` and why, `info` too), while another export's
//! 4 KiB reads keep a p99 under 100 ms, `dmsetup ls` answers throughout,
//! and the process, its event loops and the control socket go on.
//!
//! One test in this file: it sets `UDM_TEST_PANIC` for the servers it
//! starts, which no other test may inherit.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::nbd::{handshake_named, request};
use common::{bytes, show, sparse};

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;
const EIO: u32 = 5;
const BLOCK: u64 = 65536;
const LIN: usize = 16 << 20;

fn connect(sock: &Path, export: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    handshake_named(&mut s, export);
    s
}

/// The error of a simple reply to `cookie`, reading `data` after it on
/// success.
fn reply(s: &mut UnixStream, cookie: u64, data: &mut [u8]) -> u32 {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).expect("the request is answered");
    assert_eq!(&h[8..16], &cookie.to_be_bytes());
    let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
    if err == 0 {
        s.read_exact(data).unwrap();
    }
    err
}

fn read(s: &mut UnixStream, off: u64, buf: &mut [u8]) -> u32 {
    s.write_all(&request(CMD_READ, 1, off, buf.len() as u32))
        .unwrap();
    reply(s, 1, buf)
}

fn write(s: &mut UnixStream, off: u64, data: &[u8]) -> u32 {
    let mut m = request(CMD_WRITE, 2, off, data.len() as u32).to_vec();
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
    reply(s, 2, &mut [])
}

fn flush(s: &mut UnixStream) -> u32 {
    s.write_all(&request(CMD_FLUSH, 3, 0, 0)).unwrap();
    reply(s, 3, &mut [])
}

/// What keeps running beside the victim: 4 KiB reads of export `lin`
/// (checked against its contents) and `dmsetup ls`, until stopped.
struct Bystanders {
    stop: Arc<AtomicBool>,
    reads: std::thread::JoinHandle<Vec<Duration>>,
    ls: std::thread::JoinHandle<(usize, Duration)>,
}

impl Bystanders {
    fn start(srv: &DmServer, lin: Arc<Vec<u8>>) -> Bystanders {
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sock) = (stop.clone(), srv.serve.sock.clone());
        let reads = std::thread::spawn(move || {
            let mut s = connect(&sock, "lin");
            let mut took = Vec::new();
            let mut buf = vec![0u8; 4096];
            let mut i = 0u64;
            while !st.load(Ordering::Relaxed) {
                let off = (i.wrapping_mul(2654435761) % (LIN as u64 / 4096)) * 4096;
                let t = Instant::now();
                assert_eq!(read(&mut s, off, &mut buf), 0, "lin read at {off}");
                took.push(t.elapsed());
                assert_eq!(&buf[..], &lin[off as usize..off as usize + 4096]);
                i += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            took
        });
        let (st, ctl) = (stop.clone(), srv.ctl.clone());
        let ls = std::thread::spawn(move || {
            let (mut n, mut worst) = (0, Duration::ZERO);
            while !st.load(Ordering::Relaxed) {
                let t = Instant::now();
                let o = common::udm()
                    .args(["dmsetup", "--control"])
                    .arg(&ctl)
                    .arg("ls")
                    .output()
                    .unwrap();
                assert!(o.status.success(), "dmsetup ls: {}", show(&o));
                let out = String::from_utf8_lossy(&o.stdout);
                assert!(out.contains("lin"), "{out}");
                worst = worst.max(t.elapsed());
                n += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            (n, worst)
        });
        Bystanders { stop, reads, ls }
    }

    /// Stop them and check what they saw.
    fn check(self, point: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let mut took = self
            .reads
            .join()
            .expect("the bystander's reads all succeeded");
        let (n, worst) = self.ls.join().expect("dmsetup ls answered throughout");
        assert!(took.len() >= 50, "{point}: only {} reads", took.len());
        took.sort();
        let p99 = took[took.len() * 99 / 100];
        eprintln!(
            "{point}: {} bystander reads, p99 {p99:?}; {n} dmsetup ls, worst {worst:?}",
            took.len()
        );
        assert!(p99 < Duration::from_millis(100), "{point}: p99 {p99:?}");
        assert!(n >= 3, "{point}: dmsetup ls ran {n} times");
        assert!(worst < Duration::from_secs(5), "{point}: ls took {worst:?}");
    }
}

/// A server with a linear export `lin`, a thin pool `pool` and thin device
/// `t` (device 0), started with `point` armed: it fires only once the
/// arming file exists, so the setup runs clean.
fn setup(dir: &Path, point: &str) -> (DmServer, Arc<Vec<u8>>, std::path::PathBuf) {
    let lin = Arc::new(bytes(7, LIN));
    let lin_img = common::write_file(dir, "lin.img", &lin);
    let meta = sparse(dir, "meta", 4 << 20);
    let data = sparse(dir, "data", 64 * BLOCK);
    let arm = dir.join("armed");
    std::env::set_var("UDM_TEST_PANIC", point);
    std::env::set_var("UDM_TEST_PANIC_ARM", &arm);
    let srv = DmServer::start(dir, &[]);
    std::env::remove_var("UDM_TEST_PANIC");
    std::env::remove_var("UDM_TEST_PANIC_ARM");
    let line = format!("0 {} linear {} 0", LIN / 512, lin_img.display());
    srv.ok(&["create", "lin", "--table", &line]);
    let pool = format!(
        "0 {} thin-pool {} {} {} 0",
        64 * BLOCK / 512,
        meta.display(),
        data.display(),
        BLOCK / 512
    );
    srv.ok(&["create", "pool", "--table", &pool]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    srv.ok(&["create", "t", "--table", &thin_line()]);
    // The victim works before the fault.
    let mut s = connect(&srv.serve.sock, "t");
    assert_eq!(write(&mut s, 0, &[9u8; 4096]), 0);
    assert_eq!(flush(&mut s), 0);
    (srv, lin, arm)
}

fn thin_line() -> String {
    format!("0 {} thin @pool 0", 32 * BLOCK / 512)
}

/// `name` has failed: `status --json` says why, `status` reads `Fail`,
/// `info` has the reason.
fn failed(srv: &DmServer, name: &str, point: &str) -> String {
    let mut why = String::new();
    common::wait_for(&format!("{name} failed"), Duration::from_secs(10), || {
        let st = srv.status_json(name);
        why = st["failed"].as_str().unwrap_or_default().to_string();
        !why.is_empty()
    });
    assert!(why.contains("panicked"), "{point}: {why}");
    assert!(why.contains("injected panic"), "{point}: {why}");
    let st = srv.ok(&["status", name]);
    assert!(st.contains(" Fail"), "{point}: status of {name}: {st}");
    let info = srv.ok(&["info", name]);
    assert!(info.contains("Failed:"), "{point}: {info}");
    why
}

#[test]
fn a_panic_in_one_device_fails_that_device_alone() {
    let points = [
        "thin.io",
        "thin.commit",
        "message:thin-pool",
        "load:thin",
        "thin.timed_commit",
    ];
    for point in points {
        let dir = tempfile::Builder::new()
            .prefix("udm-fault-")
            .tempdir_in("/dev/shm")
            .unwrap();
        let (srv, lin, arm) = setup(dir.path(), point);
        let by = Bystanders::start(&srv, lin);
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&arm, b"").unwrap();
        let victim = match point {
            "thin.io" => {
                let mut s = connect(&srv.serve.sock, "t");
                let mut buf = vec![0u8; 4096];
                assert_eq!(read(&mut s, 0, &mut buf), EIO, "{point}");
                // Every later request of the device fails at once.
                assert_eq!(write(&mut s, 8192, &[1u8; 4096]), EIO, "{point}");
                "t"
            }
            "thin.commit" => {
                let mut s = connect(&srv.serve.sock, "t");
                assert_eq!(write(&mut s, BLOCK, &[3u8; 4096]), 0, "{point}");
                assert_eq!(flush(&mut s), EIO, "{point}");
                "t"
            }
            "message:thin-pool" => {
                let o = srv.run(&["message", "pool", "0", "create_thin", "1"]);
                assert!(!o.status.success(), "{point}: {}", show(&o));
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(err.contains("panicked"), "{point}: {err}");
                "pool"
            }
            "load:thin" => {
                let o = srv.run(&["load", "t", "--table", &thin_line()]);
                assert!(!o.status.success(), "{point}: {}", show(&o));
                "t"
            }
            "thin.timed_commit" => {
                // A write leaves the metadata dirty; the pool's timed
                // commit (a background job) then panics.
                let mut s = connect(&srv.serve.sock, "t");
                assert_eq!(write(&mut s, 2 * BLOCK, &[5u8; 4096]), 0, "{point}");
                "pool"
            }
            _ => unreachable!(),
        };
        let why = failed(&srv, victim, point);
        eprintln!("{point}: {victim} failed: {why}");
        // The failed device refuses further messages with the reason.
        if victim == "pool" {
            let e = srv.fails(&["message", "pool", "0", "create_thin", "2"]);
            assert!(e.contains("has failed"), "{point}: {e}");
        }
        // Keep the bystanders running past the failure.
        std::thread::sleep(Duration::from_millis(700));
        by.check(point);
        // The control socket still changes things, and a new device works.
        srv.ok(&["create", "again", "--table", "0 8 zero"]);
        let mut s = connect(&srv.serve.sock, "again");
        let mut buf = [1u8; 4096];
        assert_eq!(read(&mut s, 0, &mut buf), 0);
        assert_eq!(buf, [0u8; 4096]);
        // The failed device can be removed, as dmsetup would.
        srv.ok(&["remove", "--force", "t"]);
        srv.ok(&["remove", "--force", "pool"]);
        assert!(
            srv.serve.stop().is_some(),
            "{point}: the server exits cleanly"
        );
    }
}
