//! Clean shutdown: in-flight requests finish and are answered, every
//! export is flushed after the last write, and the server returns Ok —
//! both for the stop flag and for a real SIGTERM delivered to `serve`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::nbd::*;
use common::*;
use udm::core::{BlockDevice, DevResult, Limits, WriteBuf};
use udm::nbd::{serve, Listen, ServerConfig};
use udm::store::mem::MemStore;

/// A memory device whose writes take 100 ms, recording when the last write
/// finished and when the last flush happened (in a shared sequence).
struct Slow {
    inner: MemStore,
    seq: AtomicU64,
    started: AtomicU64,
    last_write_done: AtomicU64,
    last_flush: AtomicU64,
}

impl BlockDevice for Slow {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
        self.started.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        let r = self.inner.write(o, d, f);
        let n = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.last_write_done.fetch_max(n, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> DevResult<()> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.last_flush.store(n, Ordering::SeqCst);
        Ok(())
    }
    fn discard(&self, o: u64, l: u64) -> DevResult<()> {
        self.inner.discard(o, l)
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool) -> DevResult<()> {
        self.inner.write_zeroes(o, l, f)
    }
}

fn slow() -> Arc<Slow> {
    Arc::new(Slow {
        inner: MemStore::new(1 << 20),
        seq: AtomicU64::new(0),
        started: AtomicU64::new(0),
        last_write_done: AtomicU64::new(0),
        last_flush: AtomicU64::new(0),
    })
}

fn connect(path: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    handshake(&mut s);
    s
}

/// Send 4 writes of 4 KiB at distinct offsets (they run in parallel).
fn send_writes(s: &mut UnixStream) {
    for i in 0..4u64 {
        s.write_all(&request(1, i, i * 4096, 4096)).unwrap();
        s.write_all(&[i as u8 + 1; 4096]).unwrap();
    }
}

/// Read replies until the server closes; returns the cookies answered OK.
fn replies_until_eof(s: &mut UnixStream) -> Vec<u64> {
    let mut ok = Vec::new();
    let mut r = [0u8; 16];
    while s.read_exact(&mut r).is_ok() {
        assert_eq!(&r[4..8], &[0, 0, 0, 0], "a write failed during shutdown");
        ok.push(u64::from_be_bytes(r[8..16].try_into().unwrap()));
    }
    ok
}

fn wait_started(dev: &Slow) {
    wait_for("the writes to start", Duration::from_secs(10), || {
        dev.started.load(Ordering::SeqCst) > 0
    });
}

fn check_after(dev: &Slow, answered: &[u64]) {
    assert!(!answered.is_empty(), "in-flight writes were not answered");
    for &c in answered {
        let mut b = [0u8; 4096];
        dev.inner.read(c * 4096, &mut b).unwrap();
        assert_eq!(
            b,
            [c as u8 + 1; 4096],
            "answered write {c} not on the device"
        );
    }
    assert!(
        dev.last_flush.load(Ordering::SeqCst) > dev.last_write_done.load(Ordering::SeqCst),
        "no flush after the last write"
    );
}

#[test]
fn stop_flag_finishes_in_flight_requests_and_flushes() {
    let dev = slow();
    let srv = Server::start(vec![export("s", dev.clone(), false)], 4);
    let mut s = connect(&srv.socket);
    send_writes(&mut s);
    wait_started(&dev);
    let stopper = std::thread::spawn(move || srv.stop());
    let answered = replies_until_eof(&mut s);
    stopper
        .join()
        .unwrap()
        .expect("server did not stop cleanly");
    check_after(&dev, &answered);
}

#[test]
fn sigterm_finishes_in_flight_requests_flushes_and_returns_ok() {
    let dev = slow();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sig.sock");
    let cfg = ServerConfig {
        listen: Listen::Unix(sock.clone()),
        exports: vec![export("s", dev.clone(), false)],
        threads: 4,
    };
    let t = std::thread::spawn(move || serve(cfg));
    wait_for("the server to listen", Duration::from_secs(10), || {
        sock.exists()
    });
    let mut s = connect(&sock);
    send_writes(&mut s);
    wait_started(&dev);
    // SAFETY: kill(2) on our own pid with a valid signal; `serve` has
    // installed its handler (the socket exists only after that).
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
    let answered = replies_until_eof(&mut s);
    t.join()
        .unwrap()
        .expect("serve did not return Ok after SIGTERM");
    check_after(&dev, &answered);
    assert!(!sock.exists(), "socket file left behind");
}
