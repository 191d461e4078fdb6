//! udm on Ceph RBD images, against a real single-node cluster started by
//! `scripts/ceph-dev.sh` (installs Debian's Ceph packages if missing, so
//! these tests fail — never skip — where Ceph cannot be had):
//! linear, striped and crypt-over-striped tables over RBD images (data
//! checked on the cluster with `rbd export`), LUKS1/LUKS2 interop with
//! librbd's own encryption (`rbd encryption format`, read and written
//! through qemu's rbd driver with `encrypt.format`), and an OSD that goes
//! away mid-run.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ceph-dev.sh")
}

/// A throwaway cluster, stopped on drop.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    fn start(store: &str) -> Cluster {
        let tmp = tempfile::Builder::new()
            .prefix("udm-ceph")
            .tempdir_in("/tmp")
            .unwrap();
        let dir = tmp.path().join("c");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .env("STORE", store)
            .output()
            .unwrap();
        let c = Cluster {
            conf: dir.join("ceph.conf"),
            dir,
            _tmp: tmp,
        };
        assert!(
            out.status.success(),
            "scripts/ceph-dev.sh start failed (Ceph packages: ceph-mon ceph-osd ceph-common librbd-dev librados-dev):\n{}",
            show(&out)
        );
        c
    }

    fn rbd(&self) -> Command {
        let mut c = Command::new(need("rbd"));
        c.arg("-c").arg(&self.conf);
        c
    }

    fn create(&self, image: &str, size: &str) {
        run(self
            .rbd()
            .args(["create", "--size", size, &format!("rbd/{image}")]));
    }

    /// The image as a udm device path.
    fn path(&self, image: &str) -> String {
        format!("rbd:rbd/{image}:conf={}", self.conf.display())
    }

    fn export(&self, image: &str) -> Vec<u8> {
        run(self
            .rbd()
            .args(["export", "--no-progress", &format!("rbd/{image}"), "-"]))
        .stdout
    }

    fn osd(&self, verb: &str) {
        run(Command::new("bash").arg(script()).arg(verb).arg(&self.dir));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// qemu-img and qemu-nbd with qemu's rbd driver (scripts/ceph-dev.sh qemu).
fn qemu_rbd_bin() -> PathBuf {
    let out = run(Command::new("bash")
        .arg(script())
        .arg("qemu")
        .arg("/tmp/udm-qemu-rbd"));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn table(dir: &Path, name: &str, text: &str) -> String {
    let p = write_file(dir, name, text.as_bytes());
    p.display().to_string()
}

fn nbdcopy(from: &str, to: &str) {
    run(Command::new(need("nbdcopy")).args([from, to, "--flush"]));
}

fn nbd_read(uri: &str) -> Vec<u8> {
    run(Command::new(need("nbdcopy")).args([uri, "-"])).stdout
}

/// Linear and striped tables over RBD images round-trip data written
/// through NBD, and the bytes on the cluster (`rbd export`) are where
/// dm-linear and dm-stripe put them; a crypt-over-striped volume over four
/// more images passes fio's verification.
#[test]
fn linear_striped_and_crypt_over_striped_on_rbd() {
    let cl = Cluster::start("memstore");
    let work = scratch("udm-rbd-tables");
    let d = work.path();
    cl.create("lin", "32M");
    cl.create("enc", "32M");
    cl.create("lv", "32M");
    for i in 0..4 {
        cl.create(&format!("s{i}"), "16M");
        cl.create(&format!("c{i}"), "16M");
    }
    let legs = |p: &str| {
        (0..4)
            .map(|i| format!("{} 0", cl.path(&format!("{p}{i}"))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let lin = table(d, "lin", &format!("0 65536 linear {} 0\n", cl.path("lin")));
    let lv = table(d, "lv", &format!("0 65536 linear {} 0\n", cl.path("lv")));
    let str_ = table(d, "str", &format!("0 131072 striped 4 128 {}\n", legs("s")));
    let cstr = table(
        d,
        "cstr",
        &format!("0 131072 striped 4 128 {}\n", legs("c")),
    );
    let key = hex::encode(bytes(5, 64));
    let sec = table(
        d,
        "sec",
        &format!("0 131072 crypt aes-xts-plain64 {key} 0 @cstr 0 1 sector_size:4096\n"),
    );
    let enc = table(
        d,
        "enc",
        &format!(
            "0 65536 crypt aes-xts-plain64 {key} 0 {} 0 1 sector_size:4096\n",
            cl.path("enc")
        ),
    );
    let sock = d.join("udm.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--table",
            &format!("enc={enc}"),
            "--table",
            &format!("lv={lv}"),
            "--table",
            &format!("lin={lin}"),
            "--table",
            &format!("str={str_}"),
            "--table",
            &format!("cstr={cstr}"),
            "--table",
            &format!("sec={sec}"),
        ],
    );
    let lin_data = fast_bytes(1, 32 << 20);
    let str_data = fast_bytes(2, 64 << 20);
    let lin_file = write_file(d, "lin.in", &lin_data);
    let str_file = write_file(d, "str.in", &str_data);
    nbdcopy(&lin_file.display().to_string(), &srv.uri("lin"));
    nbdcopy(&str_file.display().to_string(), &srv.uri("str"));
    // Read back through udm and compare with qemu-img, as a client would.
    for (exp, file) in [("lin", &lin_file), ("str", &str_file)] {
        run(Command::new(need("qemu-img")).args([
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &file.display().to_string(),
            &format!("nbd+unix:///{exp}?socket={}", sock.display()),
        ]));
    }
    // crypt over striped over four RBD images (run on workers), linear
    // over one image and crypt straight over one (submitted, completed
    // from librbd's callback; overlapping ones wait for each other), many
    // requests in flight.
    for (exp, size, jobs) in [("sec", "24m", "2"), ("lv", "12m", "2"), ("enc", "12m", "2")] {
        let fio = run(Command::new(need("fio")).current_dir(d).args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri(exp)),
            "--rw=randwrite",
            "--bsrange=4k-256k",
            &format!("--size={size}"),
            &format!("--numjobs={jobs}"),
            &format!("--offset_increment={size}"),
            "--iodepth=32",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--do_verify=1",
            "--group_reporting",
        ]));
        let text = String::from_utf8_lossy(&fio.stdout);
        assert!(
            text.contains("err= 0") && !text.contains("verify: bad"),
            "{exp}: {text}"
        );
    }
    // crypt over RBD: what 4 KiB requests wrote (submitted, encrypted on
    // the reader) reads back through 4 MiB requests (run on workers,
    // decrypted there), and the other way round: both paths store the
    // same ciphertext.
    let out = d.join("enc.out");
    for (seed, w, r) in [(3, "4096", "4194304"), (4, "4194304", "4096")] {
        let enc_data = fast_bytes(seed, 32 << 20);
        let enc_file = write_file(d, "enc.in", &enc_data);
        run(Command::new("nbdcopy").args([
            &format!("--request-size={w}"),
            &enc_file.display().to_string(),
            &srv.uri("enc"),
        ]));
        run(Command::new("nbdcopy").args([
            &format!("--request-size={r}"),
            &srv.uri("enc"),
            &out.display().to_string(),
        ]));
        assert!(
            std::fs::read(&out).unwrap() == enc_data,
            "crypt over RBD: written with {w}-byte requests, read with {r}"
        );
    }
    assert_eq!(srv.stop(), Some(0));

    // On the cluster itself: the linear image holds the data as written.
    assert!(cl.export("lin") == lin_data, "rbd export of lin differs");
    // dm-stripe's layout: chunk k (64 KiB) on leg k % 4 at (k / 4) chunks.
    let legs: Vec<Vec<u8>> = (0..4).map(|i| cl.export(&format!("s{i}"))).collect();
    let chunk = 64 << 10;
    for (k, c) in str_data.chunks(chunk).enumerate() {
        let (leg, at) = (k % 4, (k / 4) * chunk);
        assert!(
            legs[leg][at..at + chunk] == *c,
            "stripe chunk {k} not on leg {leg}"
        );
    }
}

/// A qemu-nbd serving an RBD image through librbd's own LUKS layer
/// (qemu's rbd driver with `encrypt.format`), killed on drop.
struct QemuLuks {
    child: Child,
    sock: PathBuf,
}

impl QemuLuks {
    fn start(cl: &Cluster, image: &str, format: &str, pass: &Path, sock: &Path) -> QemuLuks {
        let bin = qemu_rbd_bin();
        let _ = std::fs::remove_file(sock);
        let log = std::fs::File::create(sock.with_extension("log")).unwrap();
        let mut child = Command::new(bin.join("qemu-nbd"))
            .args(["-t", "-k"])
            .arg(sock)
            .arg("--object")
            .arg(format!("secret,id=sec0,file={}", pass.display()))
            .arg("--image-opts")
            .arg(format!(
                "driver=rbd,pool=rbd,image={image},conf={},encrypt.format={format},encrypt.key-secret=sec0",
                cl.conf.display()
            ))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            if let Some(st) = child.try_wait().unwrap() {
                let err = std::fs::read_to_string(sock.with_extension("log")).unwrap_or_default();
                panic!("qemu-nbd (rbd, encrypt.format={format}) exited: {st}\n{err}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "qemu-nbd did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        QemuLuks {
            child,
            sock: sock.to_path_buf(),
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
}

impl Drop for QemuLuks {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid with a valid signal.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// LUKS on RBD both ways, for LUKS2 and LUKS1: an image formatted by
/// `rbd encryption format` and written through librbd's encryption opens
/// in udm with the same plaintext; an image formatted and written by udm
/// reads back the same through librbd's encryption.
#[test]
fn luks_interop_with_rbd_encryption() {
    let cl = Cluster::start("memstore");
    let work = scratch("udm-rbd-luks");
    let d = work.path();
    let pass = write_file(d, "pass", b"rbd interop passphrase");
    let key_arg = pass.display().to_string();
    // udm's `--luks` and qemu's encrypt.format names per LUKS version.
    for (ver, qfmt, plain_size) in [("luks2", "luks2", 48u64 << 20), ("luks1", "luks", 60 << 20)] {
        // 1. Ceph formats, librbd writes, udm reads.
        let img = format!("ceph-{ver}");
        cl.create(&img, "64M");
        run(cl
            .rbd()
            .args(["encryption", "format", &format!("rbd/{img}"), ver])
            .arg(&pass));
        let data = fast_bytes(ver.len() as u64 + 9, 8 << 20);
        let input = write_file(d, "in", &data);
        {
            let q = QemuLuks::start(&cl, &img, qfmt, &pass, &d.join("q.sock"));
            nbdcopy(&input.display().to_string(), &q.uri());
            assert_eq!(
                nbd_read(&q.uri()).len() as u64,
                plain_size,
                "librbd's {ver} plaintext size"
            );
        }
        let sock = d.join("u.sock");
        let srv = UdmServe::start(
            &sock,
            &[
                "--luks",
                &format!("v={}", cl.path(&img)),
                "--key-file",
                &key_arg,
            ],
        );
        let back = nbd_read(&srv.uri("v"));
        assert_eq!(
            back.len() as u64,
            plain_size,
            "udm sees librbd's {ver} plaintext size"
        );
        assert!(
            back[..data.len()] == data[..],
            "{ver} by rbd: udm reads other plaintext"
        );
        assert_eq!(srv.stop(), Some(0));

        // 2. udm formats (through the RBD store), udm writes, librbd reads.
        let img = format!("udm-{ver}");
        cl.create(&img, "64M");
        run(udm()
            .args(["luks", "format", "-q", "--type", ver, "--pbkdf", "pbkdf2"])
            .args(["--pbkdf-force-iterations", "1000", "--key-file", &key_arg])
            .arg(cl.path(&img)));
        let srv = UdmServe::start(
            &sock,
            &[
                "--luks",
                &format!("v={}", cl.path(&img)),
                "--key-file",
                &key_arg,
            ],
        );
        let data = fast_bytes(ver.len() as u64 + 19, 8 << 20);
        let input = write_file(d, "in", &data);
        nbdcopy(&input.display().to_string(), &srv.uri("v"));
        let udm_size = nbd_read(&srv.uri("v")).len();
        assert_eq!(srv.stop(), Some(0));
        let q = QemuLuks::start(&cl, &img, qfmt, &pass, &d.join("q.sock"));
        let back = nbd_read(&q.uri());
        assert_eq!(
            back.len(),
            udm_size,
            "librbd sees udm's {ver} plaintext size"
        );
        assert!(
            back[..data.len()] == data[..],
            "{ver} by udm: librbd reads other plaintext"
        );
    }
}

/// Read `len` bytes at 0 of `uri` with libnbd; returns (ok, error text,
/// seconds taken).
fn timed_read(uri: &str, len: usize) -> (bool, String, f64) {
    need_python_module("nbd", "python3-libnbd");
    let t = Instant::now();
    let o = Command::new(PYTHON)
        .args([
            "-c",
            "import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\ntry:\n    h.pread(int(sys.argv[2]), 0)\n    print('ok')\nexcept nbd.Error as e:\n    print('error', e.errno, e.string)\n",
            uri,
            &len.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (
        text == "ok",
        format!("{text} {}", String::from_utf8_lossy(&o.stderr)),
        t.elapsed().as_secs_f64(),
    )
}

/// The OSD goes away mid-run: requests for the image fail with EIO within
/// the op timeout set in the path (5 s here; udm's default is 30 s) instead
/// of hanging, an export on a local file keeps answering meanwhile, and
/// once the OSD is back new requests succeed with the data intact.
#[test]
fn osd_stop_gives_bounded_eio_and_restart_recovers() {
    const TIMEOUT: u64 = 5;
    let cl = Cluster::start("bluestore");
    let work = scratch("udm-rbd-osd");
    let d = work.path();
    cl.create("t", "32M");
    let local = sparse(d, "local.img", 8 << 20);
    let sock = d.join("udm.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--file".to_string(),
            format!("r={}:rados_osd_op_timeout={TIMEOUT}", cl.path("t")),
            "--file".to_string(),
            format!("loc={}", local.display()),
        ],
    );
    let data = fast_bytes(4, 4 << 20);
    let input = write_file(d, "in", &data);
    nbdcopy(&input.display().to_string(), &srv.uri("r"));

    cl.osd("osd-stop");
    let uri = srv.uri("r");
    let stalled = std::thread::spawn(move || timed_read(&uri, 1 << 20));
    // The server is not hung: the local export answers during the stall.
    std::thread::sleep(Duration::from_millis(500));
    let (ok, err, _) = timed_read(&srv.uri("loc"), 1 << 20);
    assert!(ok, "local export during the OSD outage: {err}");
    let (ok, err, secs) = stalled.join().unwrap();
    assert!(!ok, "read with the OSD down succeeded?");
    assert!(err.contains("error EIO"), "EIO expected: {err}");
    // Bounded by the op timeout (plus client start-up and a loaded box).
    assert!(secs < (TIMEOUT + 25) as f64, "stalled {secs:.1} s");
    eprintln!("read with the OSD down: EIO after {secs:.1} s (op timeout {TIMEOUT} s)");

    cl.osd("osd-start");
    // New requests succeed once the OSD is up again (it takes a few
    // seconds to boot and be marked up).
    let t = Instant::now();
    loop {
        let (ok, err, _) = timed_read(&srv.uri("r"), 1 << 20);
        if ok {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "OSD back, requests still fail: {err}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        nbd_read(&srv.uri("r"))[..data.len()] == data[..],
        "data after the OSD restart"
    );
    assert_eq!(srv.stop(), Some(0));
}
