//! udm stacked on remote NBD exports (`nbd+unix://…`, `nbd://…` as device
//! paths): fio with verification through udm over nbdkit's memory plugin
//! and over qemu-nbd, the latter killed and restarted while fio runs; the
//! client store directly against a server that goes away for good and
//! comes back.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use udm::core::{BlockDevice, WriteBuf};
use udm::store::{Location, OpenFlags};

/// A peer server process, killed on drop.
struct Peer {
    child: Child,
    sock: PathBuf,
}

impl Peer {
    fn spawn(cmd: &mut Command, sock: &Path) -> Peer {
        let _ = std::fs::remove_file(sock);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut p = Peer {
            child,
            sock: sock.to_path_buf(),
        };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            if let Some(st) = p.child.try_wait().unwrap() {
                panic!("{cmd:?} exited: {st}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{cmd:?} did not come up"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        p
    }

    fn nbdkit_memory(sock: &Path, size: &str) -> Peer {
        Peer::spawn(
            Command::new(need("nbdkit"))
                .args(["-f", "-U"])
                .arg(sock)
                .args(["memory", size]),
            sock,
        )
    }

    fn qemu_nbd(sock: &Path, file: &Path) -> Peer {
        Peer::spawn(
            Command::new(need("qemu-nbd"))
                .args(["-f", "raw", "--persistent", "--cache=writeback", "-k"])
                .arg(sock)
                .arg(file),
            sock,
        )
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fio_verify(uri: &str, size: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(need("fio"));
    c.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--bsrange=4k-128k",
        &format!("--size={size}"),
        "--numjobs=2",
        &format!("--offset_increment={size}"),
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--do_verify=1",
        "--group_reporting",
    ])
    .args(extra);
    c
}

fn assert_fio_clean(out: &std::process::Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio failed:\n{}", show(out));
    assert!(text.contains("err= 0"), "fio reported errors:\n{text}");
    assert!(!text.contains("verify: bad"), "{text}");
}

/// Linear and crypt tables over an nbdkit memory export, fio verify through
/// udm, then the bytes compared on the remote itself.
#[test]
fn udm_over_nbdkit_memory_fio_verify() {
    let dir = scratch("udm-remote-nbd");
    let kit = Peer::nbdkit_memory(&dir.path().join("kit.sock"), "96M");
    // 32 MiB linear at the start, 32 MiB crypt after it, same remote.
    let lin = write_file(
        dir.path(),
        "lin.table",
        format!("0 65536 linear {} 0\n", kit.uri()).as_bytes(),
    );
    let key = hex::encode(bytes(7, 64));
    let sec = write_file(
        dir.path(),
        "sec.table",
        format!(
            "0 65536 crypt aes-xts-plain64 {key} 0 {} 65536 1 sector_size:4096\n",
            kit.uri()
        )
        .as_bytes(),
    );
    let sock = dir.path().join("udm.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--table".to_string(),
            format!("lin={}", lin.display()),
            "--table".to_string(),
            format!("sec={}", sec.display()),
            "--file".to_string(),
            format!("whole={}", kit.uri()),
        ],
    );
    assert_fio_clean(&run(&mut fio_verify(&srv.uri("lin"), "16m", &[])));
    assert_fio_clean(&run(&mut fio_verify(&srv.uri("sec"), "16m", &[])));
    // What udm's linear device shows is what the remote holds.
    need("qemu-img");
    run(Command::new("qemu-img").args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        &format!("{}?socket={}", "nbd+unix:///lin", sock.display()),
        &format!(
            "json:{{\"driver\":\"raw\",\"size\":{},\"file\":{{\"driver\":\"nbd\",\"path\":\"{}\"}}}}",
            32 << 20,
            kit.sock.display()
        ),
    ]));
    // The whole remote through a --file export: the crypt half is
    // ciphertext, so it differs from what `sec` shows.
    let plain = run(Command::new(need("nbdcopy")).args([&srv.uri("sec"), "-"])).stdout;
    let raw = run(Command::new("nbdcopy").args([&srv.uri("whole"), "-"])).stdout;
    assert_eq!(raw.len(), 96 << 20);
    assert_eq!(plain.len(), 32 << 20);
    assert_ne!(&raw[32 << 20..64 << 20], &plain[..]);
    assert_eq!(srv.stop(), Some(0));
    drop(kit);
}

/// fio verify through udm over qemu-nbd, with qemu-nbd killed (SIGKILL)
/// and started again twice while fio runs: requests in flight are resent
/// on the new connection and fio sees no error and no bad block.
#[test]
fn udm_over_qemu_nbd_restarted_mid_run() {
    let dir = scratch("udm-remote-restart");
    let img = sparse(dir.path(), "disk.img", 64 << 20);
    let qsock = dir.path().join("q.sock");
    let peer = Peer::qemu_nbd(&qsock, &img);
    let uri = peer.uri();
    let sock = dir.path().join("udm.sock");
    let srv = UdmServe::start(&sock, &["--file".to_string(), format!("r={uri}")]);
    let t0 = Instant::now();
    // Rate-limited so that the run spans both restarts.
    let fio = fio_verify(&srv.uri("r"), "12m", &["--rate_iops=1500"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut peer = Some(peer);
    for at in [800u64, 2600] {
        while t0.elapsed() < Duration::from_millis(at) {
            std::thread::sleep(Duration::from_millis(10));
        }
        peer.take().unwrap().kill();
        std::thread::sleep(Duration::from_millis(300));
        peer = Some(Peer::qemu_nbd(&qsock, &img));
    }
    let out = fio.wait_with_output().unwrap();
    assert!(
        t0.elapsed() > Duration::from_millis(2600),
        "fio finished before the second restart; the test proves nothing:\n{}",
        show(&out)
    );
    assert_fio_clean(&out);
    let log = std::fs::read_to_string(sock.with_extension("log")).unwrap_or_default();
    assert_eq!(srv.stop(), Some(0));
    drop(peer);
    // udm logged the breaks at warn level.
    assert!(log.contains("connection lost"), "udm log:\n{log}");
}

/// The client store on its own: reads and writes of every alignment the
/// engine sends, a server that goes away for longer than the retry window
/// (requests fail with an I/O error naming the export), and one that comes
/// back (the next request reconnects and succeeds).
#[test]
fn client_store_fails_cleanly_and_recovers() {
    let dir = scratch("udm-remote-client");
    let ksock = dir.path().join("kit.sock");
    let kit = Peer::nbdkit_memory(&ksock, "8M");
    let Location::Nbd(spec) =
        Location::parse(&format!("nbd+unix:///?socket={}", ksock.display())).unwrap()
    else {
        panic!("not parsed as NBD")
    };
    let store = udm::store::NbdStore::connect(spec, false)
        .unwrap()
        .with_retry_window(Duration::from_millis(600));
    assert!(
        store.structured_replies(),
        "nbdkit agrees to structured replies"
    );
    assert_eq!(store.size(), 8 << 20);
    assert!(store.limits().queue_depth > 1);
    let data = bytes(3, 1 << 20);
    store.write(4096, WriteBuf::Borrowed(&data), true).unwrap();
    let mut back = vec![0u8; 1 << 20];
    store.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    // Parallel callers, many requests in flight on one connection.
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0..32u64 {
                    let off = (t * 32 + i) * 8192;
                    let d = bytes(t * 100 + i, 8192);
                    store.write(off, WriteBuf::Borrowed(&d), false).unwrap();
                    let mut b = vec![0u8; 8192];
                    store.read(off, &mut b).unwrap();
                    assert_eq!(b, d);
                }
            });
        }
    });
    store.write_zeroes(0, 65536, false).unwrap();
    store.read(0, &mut back[..65536]).unwrap();
    assert!(back[..65536].iter().all(|&b| b == 0));
    store.flush().unwrap();

    kit.kill();
    let t = Instant::now();
    let e = store.read(0, &mut back[..4096]).unwrap_err().to_string();
    assert!(e.contains("unreachable") && e.contains("kit.sock"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // A new server (empty memory) on the same socket: used again.
    let _kit = Peer::nbdkit_memory(&ksock, "8M");
    store.read(0, &mut back[..4096]).unwrap();
    store
        .write(0, WriteBuf::Borrowed(&data[..4096]), false)
        .unwrap();
    // A changed size is refused rather than used.
    drop(_kit);
    let _kit = Peer::nbdkit_memory(&ksock, "4M");
    let e = store.read(0, &mut back[..4096]).unwrap_err().to_string();
    assert!(e.contains("size"), "{e}");
}

/// A bad URI or an unreachable server stops `udm serve` with a message
/// naming the device path.
#[test]
fn bad_remote_paths_are_refused_clearly() {
    let dir = scratch("udm-remote-bad");
    let o = udm()
        .args(["serve", "--socket"])
        .arg(dir.path().join("s.sock"))
        .args(["--file", "x=nbd+unix:///e?socket=/nonexistent/sock"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/sock"), "{err}");
    let o = udm()
        .args(["serve", "--socket"])
        .arg(dir.path().join("s.sock"))
        .args(["--file", "x=nbd+unix:///e"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("socket=PATH"), "{err}");
    let _ = OpenFlags::default();
}

/// `--luks NAME=nbd+unix://…`: the LUKS header is read through the NBD
/// client store, and the volume holds the same plaintext as when served
/// from the local file.
#[test]
fn luks_volume_on_a_remote_nbd_export() {
    let dir = scratch("udm-remote-luks");
    let img = sparse(dir.path(), "luks.img", 24 << 20);
    let key = write_file(dir.path(), "key", b"remote passphrase");
    run(common::luks::cryptsetup()
        .args(["luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&key)
        .arg(&img));
    let qsock = dir.path().join("q.sock");
    let peer = Peer::qemu_nbd(&qsock, &img);
    let sock = dir.path().join("udm.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--luks".to_string(),
            format!("v={}", peer.uri()),
            "--key-file".to_string(),
            key.display().to_string(),
        ],
    );
    let data = fast_bytes(11, 8 << 20);
    let input = write_file(dir.path(), "in", &data);
    run(Command::new(need("nbdcopy"))
        .arg(&input)
        .arg(srv.uri("v"))
        .arg("--flush"));
    assert_eq!(srv.stop(), Some(0));
    drop(peer);
    // The same volume from the local file.
    let sock2 = dir.path().join("udm2.sock");
    let local = UdmServe::start(
        &sock2,
        &[
            "--luks".to_string(),
            format!("v={}", img.display()),
            "--key-file".to_string(),
            key.display().to_string(),
        ],
    );
    let back = run(Command::new("nbdcopy").arg(local.uri("v")).arg("-")).stdout;
    assert_eq!(
        back.len(),
        8 << 20,
        "24 MiB image less the 16 MiB LUKS2 header"
    );
    assert!(back == data, "plaintext differs");
    assert_eq!(local.stop(), Some(0));
}
