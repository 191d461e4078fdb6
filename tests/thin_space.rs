//! dm-thin out of data space, both ways the kernel offers: with
//! `error_if_no_space` a write that finds no free block fails at once;
//! without it the write waits (`UDM_THIN_NO_SPACE_TIMEOUT`, the kernel's
//! `no_space_timeout`, set short here) and fails when that runs out, or
//! completes when a reload grows the data device meanwhile: onto a bigger
//! copy, or the same file grown in place.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
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

fn set_timeout() {
    need_python_module("nbd", "python3-libnbd");
    // This test binary's only test that starts servers sets it: the
    // servers inherit it.
    std::env::set_var("UDM_THIN_NO_SPACE_TIMEOUT", TIMEOUT);
}

#[test]
fn out_of_space_errors_at_once_or_queues_until_a_reload_grows_it() {
    set_timeout();
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
    let mut w = writer(&uri, 4);
    std::thread::sleep(Duration::from_millis(700));
    assert!(w.try_wait().unwrap().is_none(), "the write waits for space");
    grow(&srv, d.path(), 8, false);
    let o = w.wait_with_output().unwrap();
    assert!(o.status.success(), "the reload completes it: {}", show(&o));
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
    let mut w = writer(&uri, 4);
    std::thread::sleep(Duration::from_millis(700));
    assert!(w.try_wait().unwrap().is_none(), "the write waits for space");
    grow_in_place(&srv, d.path(), 6, false);
    let o = w.wait_with_output().unwrap();
    assert!(o.status.success(), "the reload completes it: {}", show(&o));
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
