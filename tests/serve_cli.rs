//! `udm serve` end to end against real NBD clients: nbdinfo, nbdcopy,
//! qemu-img and fio. Every tool is required; a missing one fails the test
//! with the package to install (scripts/test.sh installs them).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tool(name: &str) -> &str {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "required tool '{name}' is missing: run scripts/test.sh, which installs it"
    );
    name
}

/// A scratch directory in tmpfs when there is one (fast), else /tmp.
fn scratch() -> tempfile::TempDir {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    tempfile::Builder::new()
        .prefix("udm-test-")
        .tempdir_in(base)
        .unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), fast enough for 256 MiB.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

struct Server {
    child: Child,
    sock: PathBuf,
}

impl Server {
    fn start(dir: &Path, args: &[&str]) -> Server {
        let sock = dir.join("udm.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_udm"))
            .arg("serve")
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .env("UDM_LOG", "warn")
            .spawn()
            .expect("start udm serve");
        let t = Instant::now();
        while UnixStream::connect(&sock).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "udm serve did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, sock }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    /// SIGTERM and wait; returns the exit code.
    fn stop(mut self) -> Option<i32> {
        // SAFETY: kill(2) with a pid we own and a valid signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "udm serve ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn make_file(path: &Path, size: u64) {
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

#[test]
fn linear_table_round_trips_256_mib_with_nbdcopy() {
    let d = scratch();
    let backing = d.path().join("backing.img");
    make_file(&backing, 300 << 20);
    let size: u64 = 256 << 20;
    let table = d.path().join("lin.table");
    std::fs::write(
        &table,
        format!(
            "# 256 MiB at 1 MiB into the file\n0 {} linear {} 2048\n",
            size / 512,
            backing.display()
        ),
    )
    .unwrap();
    let srv = Server::start(d.path(), &["--table", &format!("lin={}", table.display())]);

    let info = run(Command::new(tool("nbdinfo")).args(["--size", &srv.uri("lin")]));
    assert_eq!(info.trim(), size.to_string(), "nbdinfo size");
    // The first export is also the default one.
    let info = run(Command::new("nbdinfo").args(["--size", &srv.uri("")]));
    assert_eq!(info.trim(), size.to_string());

    let data = pattern(size as usize, 7);
    let src = d.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    run(Command::new(tool("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("lin")]));
    let dst = d.path().join("dst.bin");
    run(Command::new("nbdcopy").args([&srv.uri("lin"), dst.to_str().unwrap()]));
    let back = std::fs::read(&dst).unwrap();
    assert!(back == data, "nbdcopy round trip differs");
    // And the bytes sit 1 MiB into the backing file.
    let raw = std::fs::read(&backing).unwrap();
    assert!(
        raw[1 << 20..(1 << 20) + size as usize] == data[..],
        "linear offset"
    );
    // qemu-img agrees, through its own NBD client.
    run(Command::new(tool("qemu-img")).args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        src.to_str().unwrap(),
        &srv.uri("lin"),
    ]));
    assert_eq!(srv.stop(), Some(0), "SIGTERM exits 0");
}

#[test]
fn striped_three_legs_land_at_dm_stripe_offsets() {
    let d = scratch();
    let chunk: u64 = 128; // sectors
    let leg_off = [0u64, 8, 2048]; // sectors
    let width: u64 = 32 << 20; // bytes per leg
    let mut legs = Vec::new();
    for (i, off) in leg_off.iter().enumerate() {
        let p = d.path().join(format!("leg{i}.img"));
        make_file(&p, width + off * 512);
        legs.push(p);
    }
    let size = 3 * width;
    let table = d.path().join("st.table");
    std::fs::write(
        &table,
        format!(
            "0 {} striped 3 {chunk} {} {} {} {} {} {}\n",
            size / 512,
            legs[0].display(),
            leg_off[0],
            legs[1].display(),
            leg_off[1],
            legs[2].display(),
            leg_off[2]
        ),
    )
    .unwrap();
    let srv = Server::start(d.path(), &["--table", &format!("st={}", table.display())]);
    let data = pattern(size as usize, 11);
    let src = d.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    run(Command::new(tool("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("st")]));
    run(Command::new("nbdcopy").args([
        "--flush",
        &srv.uri("st"),
        d.path().join("back.bin").to_str().unwrap(),
    ]));
    assert!(std::fs::read(d.path().join("back.bin")).unwrap() == data);
    // Compute dm-stripe's placement independently and check every chunk.
    let leg_data: Vec<Vec<u8>> = legs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let cb = (chunk * 512) as usize;
    for (c, piece) in data.chunks(cb).enumerate() {
        let leg = c % 3;
        let row = c / 3;
        let at = (leg_off[leg] * 512) as usize + row * cb;
        assert!(
            leg_data[leg][at..at + cb] == *piece,
            "chunk {c} not on leg {leg} row {row}"
        );
    }
    assert_eq!(srv.stop(), Some(0));
}

fn fio_verify(uri: &str, size_per_job_mib: u64) {
    let out = run(Command::new(tool("fio")).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=64k",
        "--iodepth=8",
        "--numjobs=4",
        &format!("--size={size_per_job_mib}M"),
        &format!("--offset_increment={size_per_job_mib}M"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]));
    assert!(out.contains("err= 0"), "fio reported errors:\n{out}");
    assert!(!out.contains("verify: bad"), "fio verify failed:\n{out}");
}

#[test]
fn fio_verify_on_linear_and_striped() {
    let d = scratch();
    let a = d.path().join("a.img");
    let b = d.path().join("b.img");
    make_file(&a, 64 << 20);
    make_file(&b, 64 << 20);
    let lin = d.path().join("lin.table");
    std::fs::write(
        &lin,
        format!("0 {} linear {} 0\n", (64 << 20) / 512, a.display()),
    )
    .unwrap();
    let st = d.path().join("st.table");
    std::fs::write(
        &st,
        format!(
            "0 {} striped 2 16 {} 0 {} 0\n",
            (128u64 << 20) / 512,
            a.display(),
            b.display()
        ),
    )
    .unwrap();
    // Two servers: the striped table reuses the linear one's file.
    let d2 = scratch();
    let s1 = Server::start(d.path(), &["--table", &format!("lin={}", lin.display())]);
    fio_verify(&s1.uri("lin"), 16);
    drop(s1);
    let s2 = Server::start(d2.path(), &["--table", &format!("st={}", st.display())]);
    fio_verify(&s2.uri("st"), 32);
}

#[test]
fn list_exports_and_stacking() {
    let d = scratch();
    let f = d.path().join("f.img");
    make_file(&f, 8 << 20);
    let base = d.path().join("base.table");
    std::fs::write(&base, format!("0 16384 linear {} 0\n", f.display())).unwrap();
    let top = d.path().join("top.table");
    std::fs::write(&top, "0 8192 linear @base 8192\n4096 8 zero\n").unwrap();
    // A malformed table is refused with its line and field.
    let out = Command::new(env!("CARGO_BIN_EXE_udm"))
        .args([
            "serve",
            "--socket",
            d.path().join("x.sock").to_str().unwrap(),
        ])
        .args(["--table", &format!("top={}", top.display())])
        .args(["--table", &format!("base={}", base.display())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("overlap"), "{err}");

    std::fs::write(&top, "0 8192 linear @base 8192\n8192 8192 zero\n").unwrap();
    let srv = Server::start(
        d.path(),
        &[
            "--table",
            &format!("top={}", top.display()),
            "--table",
            &format!("base={}", base.display()),
            "--file",
            &format!("raw={}", f.display()),
        ],
    );
    let list = run(Command::new(tool("nbdinfo")).args([
        "--list",
        "--json",
        &format!("nbd+unix://?socket={}", srv.sock.display()),
    ]));
    for name in ["\"top\"", "\"base\"", "\"raw\""] {
        assert!(list.contains(name), "export {name} missing from {list}");
    }
    // Write through the stacked device, read through the file.
    let mut child = Command::new(tool("nbdcopy"))
        .args(["-", &srv.uri("top")])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let data = pattern(8 << 20, 3);
    child.stdin.take().unwrap().write_all(&data).unwrap();
    assert!(child.wait().unwrap().success());
    let raw = std::fs::read(&f).unwrap();
    assert!(
        raw[8192 * 512..] == data[..4 << 20],
        "stacked linear lands at base offset"
    );
}

#[test]
fn table_check_and_show() {
    let d = scratch();
    let f = d.path().join("f.img");
    make_file(&f, 1 << 20);
    let t = d.path().join("t.table");
    std::fs::write(
        &t,
        format!("0 1024 linear {} 1024\n1024 1024 zero\n", f.display()),
    )
    .unwrap();
    let out =
        run(Command::new(env!("CARGO_BIN_EXE_udm")).args(["table", "check", t.to_str().unwrap()]));
    assert!(out.contains("2 segment(s), 2048 sectors"), "{out}");
    let out =
        run(Command::new(env!("CARGO_BIN_EXE_udm")).args(["table", "show", t.to_str().unwrap()]));
    assert_eq!(
        out,
        format!("0 1024 linear {} 1024\n1024 1024 zero \n", f.display())
    );
    std::fs::write(&t, "0 1024 striped 2 x\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_udm"))
        .args(["table", "show", t.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 1") && err.contains("chunk_size"),
        "{err}"
    );
}
