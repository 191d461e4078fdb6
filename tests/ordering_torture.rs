//! Seed 002's promise under load: 4 clients pipelining overlapping writes,
//! unaligned writes, reads and flushes against a stacked device, 100 runs in
//! a row, every read checked against a sequential model
//! (tests/torture/ordering.py, driven through python3-libnbd).

use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn ordering_torture_100_runs() {
    let py = "/usr/bin/python3";
    let has_nbd = Command::new(py)
        .args(["-c", "import nbd"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        has_nbd,
        "python3-libnbd is missing: run scripts/test.sh, which installs it"
    );
    let d = tempfile::Builder::new()
        .prefix("udm-torture-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let p = d.path();
    for i in 0..2 {
        std::fs::File::create(p.join(format!("leg{i}.img")))
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
    }
    let sectors = (64u64 << 20) / 512;
    std::fs::write(
        p.join("striped.table"),
        format!(
            "0 {sectors} striped 2 16 {} 0 {} 0\n",
            p.join("leg0.img").display(),
            p.join("leg1.img").display()
        ),
    )
    .unwrap();
    let key: String = (0..64)
        .map(|i| format!("{:02x}", (i * 7 + 3) & 0xff))
        .collect();
    std::fs::write(
        p.join("crypt.table"),
        format!("0 {sectors} crypt aes-xts-plain64 {key} 0 @striped 0 1 sector_size:4096\n"),
    )
    .unwrap();
    let sock = p.join("s.sock");
    let mut server = Command::new(env!("CARGO_BIN_EXE_udm"))
        .args([
            "serve",
            "--socket",
            sock.to_str().unwrap(),
            "--threads",
            "4",
        ])
        .arg("--table")
        .arg(format!("secure={}", p.join("crypt.table").display()))
        .arg("--table")
        .arg(format!("striped={}", p.join("striped.table").display()))
        .env("UDM_LOG", "warn")
        .spawn()
        .unwrap();
    let t = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        if let Some(st) = server.try_wait().unwrap() {
            panic!("udm serve exited: {st}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "udm serve did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new(py)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/torture/ordering.py"
        ))
        .arg(format!("nbd+unix:///secure?socket={}", sock.display()))
        .args(["100", "4", "200", "1"])
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("100 passed, 0 failed"),
        "torture failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
