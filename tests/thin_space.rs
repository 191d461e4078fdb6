//! dm-thin out of data space, both ways the kernel offers: with
//! `error_if_no_space` a write that finds no free block fails at once;
//! without it the write waits (`UDM_THIN_NO_SPACE_TIMEOUT`, the kernel's
//! `no_space_timeout`, set short here) and fails when that runs out, or
//! completes when a reload grows the data device meanwhile: onto a bigger
//! copy, or the same file grown in place. While writes wait, the other
//! devices of the server (and reads of the same thin device) go on.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::*;

/// 64 KiB data blocks.
const BLOCK: u64 = 65536;
/// Seconds a queued write waits for space in this test.
const TIMEOUT: &str = "2";

/// Write one whole block `vb` (filled with `vb + 1`) and flush; exit 0
/// and print `ok`, or exit 1 with the error.
const WRITE: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
vb = int(sys.argv[2])
try:
    h.pwrite(bytes([vb + 1]) * 65536, vb * 65536)
    h.flush()
except nbd.Error as e:
    sys.exit(f"error: {e}")
print("ok")
"#;

fn writer(uri: &str, vb: u64) -> Child {
    Command::new(PYTHON)
        .args(["-c", WRITE, uri, &vb.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Write block `vb`; whether it succeeded, the output, and how long it took.
fn write_block(uri: &str, vb: u64) -> (bool, String, Duration) {
    let t = Instant::now();
    let o = writer(uri, vb).wait_with_output().unwrap();
    (o.status.success(), show(&o), t.elapsed())
}

fn pool_line(meta: &Path, data: &Path, blocks: u64, error: bool) -> String {
    let features = if error { "1 error_if_no_space" } else { "0" };
    format!(
        "0 {} thin-pool {} {} {} 0 {features}",
        blocks * BLOCK / 512,
        meta.display(),
        data.display(),
        BLOCK / 512
    )
}

/// A pool of 4 data blocks, all used by thin device 0 (16 blocks long),
/// served as `t`.
fn full_pool(dir: &Path, error: bool) -> (DmServer, String) {
    let meta = sparse(dir, "meta", 4 << 20);
    let data = sparse(dir, "data", 4 * BLOCK);
    let srv = DmServer::start(dir, &[]);
    srv.ok(&[
        "create",
        "pool",
        "--table",
        &pool_line(&meta, &data, 4, error),
    ]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    let thin = format!("0 {} thin @pool 0", 16 * BLOCK / 512);
    srv.ok(&["create", "t", "--table", &thin]);
    let uri = srv.uri("t");
    for vb in 0..4 {
        let (ok, out, _) = write_block(&uri, vb);
        assert!(ok, "block {vb} fits: {out}");
    }
    let st = srv.ok(&["status", "pool"]);
    assert!(st.contains(" 4/4 - out_of_data_space "), "{st}");
    (srv, uri)
}

/// Move the pool to a bigger data device, `data.big` (`blocks` long,
/// what `data` holds first), with a reload.
fn grow(srv: &DmServer, dir: &Path, blocks: u64, error: bool) {
    let data = dir.join("data.big");
    std::fs::copy(dir.join("data"), &data).unwrap();
    reload_onto(srv, dir, &data, blocks, blocks, error);
}

/// Grow the pool's own data file in place (`truncate -s +N`) and reload
/// the very table it was created with (4 blocks long): the pool must see
/// the file's new size.
fn grow_in_place(srv: &DmServer, dir: &Path, blocks: u64, error: bool) {
    reload_onto(srv, dir, &dir.join("data"), blocks, 4, error);
}

/// Make `data` `blocks` long, reload the pool onto it with a table of
/// `table_blocks` and resume; the pool must then count `blocks`.
fn reload_onto(
    srv: &DmServer,
    dir: &Path,
    data: &Path,
    blocks: u64,
    table_blocks: u64,
    error: bool,
) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(data)
        .unwrap()
        .set_len(blocks * BLOCK)
        .unwrap();
    let line = pool_line(&dir.join("meta"), data, table_blocks, error);
    srv.ok(&["reload", "pool", "--table", &line]);
    srv.ok(&["resume", "pool"]);
    let st = srv.ok(&["status", "pool"]);
    assert!(
        st.contains(&format!("/{blocks} ")),
        "grown to {blocks} blocks: {st}"
    );
}

/// Start a write of block `vb` that must wait for space, and check it
/// still waits.
fn queued_writer(uri: &str, vb: u64) -> Child {
    let mut w = writer(uri, vb);
    std::thread::sleep(Duration::from_millis(700));
    assert!(w.try_wait().unwrap().is_none(), "the write waits for space");
    w
}

/// The queued write `w` completes once `grow` has grown the pool.
fn completes_after(w: Child, grow: impl FnOnce()) {
    grow();
    let o = w.wait_with_output().unwrap();
    assert!(o.status.success(), "the reload completes it: {}", show(&o));
}

/// Held by each test while its servers run: they inherit
/// `UDM_THIN_NO_SPACE_TIMEOUT` from this process, which each test sets.
static SERIAL: Mutex<()> = Mutex::new(());

fn set_timeout(secs: &str) -> std::sync::MutexGuard<'static, ()> {
    need_python_module("nbd", "python3-libnbd");
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("UDM_THIN_NO_SPACE_TIMEOUT", secs);
    g
}

#[test]
fn out_of_space_errors_at_once_or_queues_until_a_reload_grows_it() {
    let _serial = set_timeout(TIMEOUT);
    // error_if_no_space: ENOSPC at once, and a reload lets it write.
    let d = scratch("thin-enospc");
    let (srv, uri) = full_pool(d.path(), true);
    let (ok, out, took) = write_block(&uri, 4);
    assert!(!ok, "a full pool with error_if_no_space refuses: {out}");
    assert!(took < Duration::from_secs(1), "at once, not after {took:?}");
    grow(&srv, d.path(), 8, true);
    let (ok, out, _) = write_block(&uri, 4);
    assert!(ok, "after the reload: {out}");
    srv.ok(&["remove", "--retry", "t"]);
    srv.ok(&["remove", "pool"]);
    srv.serve.stop();

    // Queueing: the write waits; a reload during the wait completes it.
    let d = scratch("thin-queue");
    let (srv, uri) = full_pool(d.path(), false);
    let w = queued_writer(&uri, 4);
    completes_after(w, || grow(&srv, d.path(), 8, false));
    let data = std::fs::read(d.path().join("data.big")).unwrap();
    let at = data
        .chunks(BLOCK as usize)
        .position(|b| b.iter().all(|&x| x == 5));
    assert!(at.is_some(), "block 4's data is on the data device");
    // Full again: the wait runs out and the write fails.
    for vb in 5..8 {
        let (ok, out, _) = write_block(&uri, vb);
        assert!(ok, "block {vb} fits: {out}");
    }
    let (ok, out, took) = write_block(&uri, 8);
    assert!(!ok, "the timeout fails it: {out}");
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(10),
        "after about {TIMEOUT} s, not {took:?}"
    );
    srv.ok(&["remove", "--retry", "t"]);
    srv.ok(&["remove", "pool"]);
    srv.serve.stop();
    need("thin_check");
    let o = Command::new("thin_check")
        .arg(d.path().join("meta"))
        .output()
        .unwrap();
    assert!(o.status.success(), "thin_check: {}", show(&o));

    // The data file itself grown (truncate -s +N) under a queued write:
    // a reload of the same table, but for its length, completes it.
    let d = scratch("thin-inplace");
    let (srv, uri) = full_pool(d.path(), false);
    let w = queued_writer(&uri, 4);
    completes_after(w, || grow_in_place(&srv, d.path(), 6, false));
    let (ok, out, _) = write_block(&uri, 5);
    assert!(ok, "the sixth block fits: {out}");
    let data = std::fs::read(d.path().join("data")).unwrap();
    for vb in [4u8, 5] {
        assert!(
            data.chunks(BLOCK as usize)
                .any(|b| b.iter().all(|&x| x == vb + 1)),
            "block {vb}'s data is in the grown file"
        );
    }
    srv.ok(&["remove", "--retry", "t"]);
    srv.ok(&["remove", "pool"]);
    srv.serve.stop();
    let o = Command::new("thin_check")
        .arg(d.path().join("meta"))
        .output()
        .unwrap();
    assert!(o.status.success(), "thin_check: {}", show(&o));
}

/// For `SECS` seconds: write and read back 4 KiB at a time (or only
/// read); print the count and the slowest round trip in seconds. Killed
/// 10 s after that, stuck or not.
const PROMPT: &str = r#"
import nbd, signal, sys, time
secs, write = float(sys.argv[2]), sys.argv[3] == "rw"
signal.alarm(int(secs) + 10)
h = nbd.NBD()
h.connect_uri(sys.argv[1])
buf = b"\x5a" * 4096
worst, n = 0.0, 0
end = time.monotonic() + secs
while time.monotonic() < end:
    t = time.monotonic()
    at = (n % 16) * 4096
    if write:
        h.pwrite(buf, at)
        if h.pread(4096, at) != buf:
            sys.exit("read back other bytes")
    else:
        h.pread(4096, at)
    worst = max(worst, time.monotonic() - t)
    n += 1
print(n, worst)
"#;

/// Run [`PROMPT`] against `uri` for `secs`: each round trip must stay
/// under a second, and there must be many.
fn stays_prompt(uri: &str, secs: u64, write: bool) {
    let t = Instant::now();
    let o = Command::new(PYTHON)
        .args(["-c", PROMPT, uri, &secs.to_string()])
        .arg(if write { "rw" } else { "r" })
        .output()
        .unwrap();
    assert!(o.status.success(), "{uri}: {}", show(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let mut f = out.split_whitespace();
    let n: u64 = f.next().unwrap().parse().unwrap();
    let worst: f64 = f.next().unwrap().parse().unwrap();
    assert!(n >= 20, "{uri}: only {n} round trips in {secs} s");
    assert!(worst < 1.0, "{uri}: a round trip took {worst} s");
    assert!(
        t.elapsed() < Duration::from_secs(secs + 5),
        "{uri}: connecting took {:?}",
        t.elapsed()
    );
}

/// Writes queued for space wait on threads of their thin device's own:
/// meanwhile a linear device of the same server, served to other clients,
/// reads and writes as promptly as ever, and the thin device's mapped
/// blocks can still be read; the writes complete after the grow.
#[test]
fn queued_writes_hold_up_no_other_device() {
    let _serial = set_timeout("0");
    let d = scratch("thin-queue-others");
    let lin = sparse(d.path(), "lin", 1 << 20);
    let (srv, uri) = full_pool(d.path(), false);
    let line = format!("0 {} linear {} 0", (1 << 20) / 512, lin.display());
    srv.ok(&["create", "lin", "--table", &line]);
    // More waiting writers than a server has event loops (one a core).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let waiting: Vec<Child> = (0..cores as u64 + 1).map(|i| writer(&uri, 4 + i)).collect();
    std::thread::sleep(Duration::from_millis(700));
    let t = Instant::now();
    stays_prompt(&srv.uri("lin"), 5, true);
    stays_prompt(&uri, 1, false);
    assert!(t.elapsed() >= Duration::from_secs(5));
    let mut waiting = waiting;
    for w in &mut waiting {
        assert!(w.try_wait().unwrap().is_none(), "the write waits for space");
    }
    let blocks = 4 + waiting.len() as u64;
    grow(&srv, d.path(), blocks, false);
    for (i, w) in waiting.into_iter().enumerate() {
        let o = w.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "writer {i} after the grow: {}",
            show(&o)
        );
    }
    let data = std::fs::read(d.path().join("data.big")).unwrap();
    for vb in 4..blocks {
        assert!(
            data.chunks(BLOCK as usize)
                .any(|b| b.iter().all(|&x| x as u64 == vb + 1)),
            "block {vb}'s data is on the data device"
        );
    }
    srv.ok(&["remove", "--retry", "t"]);
    srv.ok(&["remove", "pool"]);
    srv.serve.stop();
}
