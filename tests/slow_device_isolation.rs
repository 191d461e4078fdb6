//! A device whose requests are slow by design must not slow the others:
//! a damaged verity image with FEC (each 4 KiB block rebuilt from a whole
//! Reed–Solomon round) read by one client, while another client reads a
//! plain export on the same server, with one event loop so both share it.
//! The bystander's 4 KiB reads must stay fast and the repairs correct.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::nbd::{handshake_named, request};
use common::{fast_bytes, need, run_text, scratch, show, udm};

const DATA: usize = 8 << 20;
/// Blocks damaged from the start: with 24 roots a round has 231 members
/// and 8 MiB (plus its tree) has at least 9 rounds, so each round gets at
/// most 8 bad blocks, which the parity rebuilds (at most 12).
const BAD: usize = 72;

fn connect(sock: &Path, export: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    handshake_named(&mut s, export);
    s
}

fn read(s: &mut UnixStream, off: u64, buf: &mut [u8]) -> u32 {
    s.write_all(&request(0, 7, off, buf.len() as u32)).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).expect("the read is answered");
    let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
    if err == 0 {
        s.read_exact(buf).unwrap();
    }
    err
}

#[test]
fn fec_repairs_on_one_export_do_not_hold_up_another() {
    need("veritysetup");
    let dir = scratch("udm-slowdev");
    let d = dir.path();
    let data = fast_bytes(44, DATA);
    std::fs::write(d.join("data"), &data).unwrap();
    std::fs::write(d.join("hash"), b"").unwrap();
    std::fs::write(d.join("fec"), b"").unwrap();
    let lin = fast_bytes(45, 16 << 20);
    std::fs::write(d.join("lin"), &lin).unwrap();
    let out = run_text(
        Command::new("veritysetup")
            .current_dir(d)
            .args(["format", "data", "hash", "--fec-device", "fec"])
            .args(["--fec-roots", "24"]),
    );
    let root = out
        .lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .expect("veritysetup prints the root hash")
        .trim()
        .to_string();
    // Damage after formatting: every byte of the first BAD blocks.
    let mut bad = data.clone();
    for (i, b) in bad[..BAD * 4096].iter_mut().enumerate() {
        *b ^= (i as u8) | 1;
    }
    std::fs::write(d.join("data"), &bad).unwrap();

    let lin_file = format!("lin={}", d.join("lin").display());
    let srv = DmServer::start(d, &["--net-threads", "1", "--file", &lin_file]);
    let o = udm()
        .env("UDM_CONTROL", &srv.ctl)
        .current_dir(d)
        .args(["veritysetup", "open", "data", "vfec", "hash", &root])
        .args(["--fec-device", "fec", "--fec-roots", "24"])
        .output()
        .unwrap();
    assert!(o.status.success(), "veritysetup open: {}", show(&o));

    // Two clients read 64 KiB of damaged blocks (16 repairs each) over and
    // over; every read must come back repaired.
    let stop = Arc::new(AtomicBool::new(false));
    let repaired = Arc::new(AtomicUsize::new(0));
    let data = Arc::new(data);
    let attackers: Vec<_> = (0..2u64)
        .map(|k| {
            let (stop, repaired, data) = (stop.clone(), repaired.clone(), data.clone());
            let sock = srv.serve.sock.clone();
            std::thread::spawn(move || {
                let mut s = connect(&sock, "vfec");
                let mut buf = vec![0u8; 65536];
                let mut off = k * 65536;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(read(&mut s, off, &mut buf), 0, "vfec read at {off}");
                    assert!(buf[..] == data[off as usize..off as usize + 65536]);
                    repaired.fetch_add(1, Ordering::Relaxed);
                    off = (off + 2 * 65536) % (BAD as u64 * 4096 / 65536 * 65536);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));

    let mut s = connect(&srv.serve.sock, "lin");
    let mut buf = vec![0u8; 4096];
    let (mut worst, mut n) = (Duration::ZERO, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) || repaired.load(Ordering::Relaxed) < 2 {
        assert!(t0.elapsed() < Duration::from_secs(300), "no repaired read");
        let off = (n.wrapping_mul(2654435761) % (lin.len() as u64 / 4096)) * 4096;
        let t = Instant::now();
        assert_eq!(read(&mut s, off, &mut buf), 0, "lin read at {off}");
        worst = worst.max(t.elapsed());
        assert!(buf[..] == lin[off as usize..off as usize + 4096]);
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().expect("every repaired read matched the data");
    }
    eprintln!(
        "{n} bystander reads, worst {worst:?}; {} repaired 64 KiB reads",
        repaired.load(Ordering::Relaxed)
    );
    assert!(n >= 50, "only {n} bystander reads in 5 s");
    assert!(
        worst < Duration::from_secs(1),
        "a 4 KiB read of another export waited {worst:?} behind FEC repairs"
    );
    let status = srv.ok(&["status", "vfec"]);
    assert!(status.contains(" V "), "{status}");
}
