//! A device stacked on another reaches it no more once the lower one has
//! failed (issue 44): `up` (`linear @low`) and `top` (`linear @up`), built
//! while `low` worked and with a client connected, get EIO for every kind
//! of request after a panic fails `low` — whether the stack is compiled
//! flat (`up`'s routes go straight to `low`'s file) or not
//! (`--no-flatten`) — and `low`'s file is not written after the failure.
//! `up` itself is not failed (its own code did not fail) but `info` and
//! `status --json` name `low` as the cause; an unrelated export keeps
//! serving and `dmsetup ls` answers.
//!
//! One test in this file: it sets `UDM_TEST_PANIC` for the servers it
//! starts, which no other test may inherit.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::bytes;
use common::dm::DmServer;
use common::nbd::{handshake_named, request};

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const EIO: u32 = 5;
const SIZE: usize = 1 << 20;

fn connect(sock: &Path, export: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    handshake_named(&mut s, export);
    s
}

/// Send one request (with `data` for a write) and return the error of its
/// reply, reading `into` after it on a successful read.
fn cmd(s: &mut UnixStream, cmd: u16, off: u64, len: u32, data: &[u8], into: &mut [u8]) -> u32 {
    let mut m = request(cmd, 7, off, len).to_vec();
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).expect("the request is answered");
    assert_eq!(&h[8..16], &7u64.to_be_bytes());
    let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
    if err == 0 && cmd == CMD_READ {
        s.read_exact(into).unwrap();
    }
    err
}

fn read(s: &mut UnixStream, off: u64, buf: &mut [u8]) -> u32 {
    cmd(s, CMD_READ, off, buf.len() as u32, &[], buf)
}

fn write(s: &mut UnixStream, off: u64, data: &[u8]) -> u32 {
    cmd(s, CMD_WRITE, off, data.len() as u32, data, &mut [])
}

fn run(flatten: bool) {
    let mode = if flatten { "flattened" } else { "--no-flatten" };
    let dir = tempfile::Builder::new()
        .prefix("udm-fault-stacked-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let dir = dir.path();
    let low_img = common::write_file(dir, "low.img", &bytes(11, SIZE));
    let other = bytes(12, SIZE);
    let other_img = common::write_file(dir, "other.img", &other);
    // A message to a linear target panics: only `low` is sent one.
    std::env::set_var("UDM_TEST_PANIC", "message:linear");
    let extra: &[&str] = if flatten { &[] } else { &["--no-flatten"] };
    let srv = DmServer::start(dir, extra);
    std::env::remove_var("UDM_TEST_PANIC");
    let sectors = SIZE / 512;
    let line = |what: &str| format!("0 {sectors} linear {what} 0");
    srv.ok(&[
        "create",
        "low",
        "--table",
        &line(&low_img.display().to_string()),
    ]);
    srv.ok(&["create", "up", "--table", &line("@low")]);
    srv.ok(&["create", "top", "--table", &line("@up")]);
    srv.ok(&[
        "create",
        "other",
        "--table",
        &line(&other_img.display().to_string()),
    ]);

    // The stack works, and its clients stay connected through the failure.
    let mut up = connect(&srv.serve.sock, "up");
    let mut top = connect(&srv.serve.sock, "top");
    let mut buf = vec![0u8; 4096];
    assert_eq!(write(&mut up, 0, &[0xa5; 4096]), 0, "{mode}");
    assert_eq!(cmd(&mut up, CMD_FLUSH, 0, 0, &[], &mut []), 0, "{mode}");
    assert_eq!(read(&mut top, 0, &mut buf), 0, "{mode}");
    assert_eq!(buf, [0xa5; 4096], "{mode}");
    let before = std::fs::read(&low_img).unwrap();
    assert_eq!(
        &before[..4096],
        &[0xa5; 4096],
        "{mode}: up writes low's file"
    );

    let e = srv.fails(&["message", "low", "0", "anything"]);
    assert!(e.contains("panicked"), "{mode}: {e}");
    let why = srv.status_json("low")["failed"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("injected panic"), "{mode}: low failed: {why}");

    // Every kind of request through the devices over `low` fails.
    let data = [0x5a; 4096];
    for (dev, s) in [("up", &mut up), ("top", &mut top)] {
        assert_eq!(write(s, 8192, &data), EIO, "{mode}: write through {dev}");
        assert_eq!(read(s, 0, &mut buf), EIO, "{mode}: read through {dev}");
        assert_eq!(
            cmd(s, CMD_WRITE_ZEROES, 0, 4096, &[], &mut []),
            EIO,
            "{mode}: write-zeroes through {dev}"
        );
        assert_eq!(
            cmd(s, CMD_TRIM, 0, 65536, &[], &mut []),
            EIO,
            "{mode}: discard through {dev}"
        );
        assert_eq!(
            cmd(s, CMD_FLUSH, 0, 0, &[], &mut []),
            EIO,
            "{mode}: flush through {dev}"
        );
    }
    // A client connecting now gets the same.
    let mut late = connect(&srv.serve.sock, "up");
    assert_eq!(read(&mut late, 4096, &mut buf), EIO, "{mode}: late read");
    assert_eq!(write(&mut late, 0, &data), EIO, "{mode}: late write");
    let after = std::fs::read(&low_img).unwrap();
    assert!(
        before == after,
        "{mode}: low's file was written after low failed"
    );

    // `up` has not failed itself, but says which device under it has.
    let st = srv.status_json("up");
    assert!(st["failed"].is_null(), "{mode}: up is not failed: {st}");
    let lower = st["lower_failed"].as_str().unwrap_or_default();
    assert!(
        lower.contains("'low'") && lower.contains("injected panic"),
        "{mode}: up's status names low: {st}"
    );
    let st = srv.status_json("top");
    assert!(st["failed"].is_null(), "{mode}: top is not failed: {st}");
    let lower = st["lower_failed"].as_str().unwrap_or_default();
    assert!(lower.contains("has failed"), "{mode}: top: {st}");
    let info = srv.ok(&["info", "up"]);
    assert!(
        info.contains("Lower failed:") && info.contains("'low'"),
        "{mode}: {info}"
    );

    // The rest of the server goes on.
    let mut s = connect(&srv.serve.sock, "other");
    assert_eq!(read(&mut s, 12288, &mut buf), 0, "{mode}: other");
    assert_eq!(&buf[..], &other[12288..16384], "{mode}: other's bytes");
    assert_eq!(write(&mut s, 0, &data), 0, "{mode}: other takes writes");
    let ls = srv.ok(&["ls"]);
    for n in ["low", "up", "top", "other"] {
        assert!(ls.contains(n), "{mode}: ls: {ls}");
    }
    // The stack is taken down from the top, as dmsetup would.
    for n in ["top", "up", "low"] {
        srv.ok(&["remove", "--force", n]);
    }
    drop((up, top, late, s));
    let o = srv.serve.stop();
    assert!(o.is_some(), "{mode}: the server exits cleanly: {o:?}");
}

#[test]
fn a_device_over_a_failed_device_gets_its_errors() {
    run(true);
    run(false);
}
