//! The server at scale and under hostile clients (issue 13's "must show"
//! tests), against the real `udm serve` binary:
//! - 10 000 idle Unix connections cost no thread each: a normal client's
//!   4 KiB read still completes at once and the server stays below 64
//!   threads;
//! - a client silent in the handshake is closed at the handshake deadline,
//!   and at the connection cap the oldest unfinished handshake makes room
//!   for a real client;
//! - a client that never reads its replies is dropped at the reply
//!   deadline while another client's latency stays within 2x;
//! - a greedy client cannot starve a second one under a small memory
//!   budget: both progress at a fair share;
//! - the event loops' busy polling (`--poll-us`) stops when requests stop:
//!   an idle server sleeps even with a long poll window.
//!
//! The timing checks are coarse on purpose (a shared 2-core machine): they
//! catch the failures the issue describes (a read waiting 119 s, a client
//! starved outright), not small regressions, which bench/ measures.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::nbd::{handshake, request};
use common::*;

fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

fn serve(dir: &Path, size: u64, extra: &[&str]) -> UdmServe {
    let img = sparse(dir, "disk.img", size);
    let mut args: Vec<String> = vec!["--file".into(), format!("disk={}", img.display())];
    args.extend(extra.iter().map(|s| s.to_string()));
    UdmServe::start(&dir.join("s.sock"), &args)
}

fn client(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    handshake(&mut s);
    s
}

/// One 4 KiB read, answered with a simple reply; returns its latency.
fn read4k(s: &mut UnixStream, cookie: u64, off: u64) -> Duration {
    let t = Instant::now();
    s.write_all(&request(0, cookie, off, 4096)).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(&h[4..8], &[0, 0, 0, 0], "read failed");
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), cookie);
    let mut d = [0u8; 4096];
    s.read_exact(&mut d).unwrap();
    t.elapsed()
}

fn p99(s: &mut UnixStream, n: usize) -> Duration {
    let mut v: Vec<Duration> = (0..n)
        .map(|i| read4k(s, i as u64, (i as u64 % 256) * 4096))
        .collect();
    v.sort();
    v[n * 99 / 100]
}

#[test]
fn ten_thousand_idle_connections_cost_no_threads() {
    let limit = raise_nofile();
    assert!(
        limit >= 10_300,
        "this test needs 10 300 descriptors (ulimit -Hn is {limit})"
    );
    let d = scratch("udm-scale-");
    let srv = serve(d.path(), 64 << 20, &["--max-connections", "12000"]);
    let t0 = Instant::now();
    let idle: Vec<UnixStream> = (0..10_000)
        .map(|i| {
            UnixStream::connect(&srv.sock).unwrap_or_else(|e| panic!("connection {i} refused: {e}"))
        })
        .collect();
    println!("10 000 connections opened in {:?}", t0.elapsed());
    // Every one was accepted and greeted: sample some.
    for mut s in idle.iter().step_by(997) {
        let mut g = [0u8; 18];
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.read_exact(&mut g).unwrap();
        assert_eq!(&g[..8], b"NBDMAGIC");
    }
    let t = Instant::now();
    let mut c = client(&srv.sock);
    let lat = read4k(&mut c, 1, 0);
    let total = t.elapsed();
    let threads = srv.threads();
    println!(
        "with 10 000 idle connections: connect+handshake+4 KiB read {total:?} (read {lat:?}), \
         server threads {threads}"
    );
    assert!(
        total < Duration::from_secs(1),
        "a normal client waited {total:?}"
    );
    assert!(threads < 64, "the server runs {threads} threads");
    drop(idle);
    drop(c);
    assert_eq!(srv.stop(), Some(0));
}

#[test]
fn silent_handshake_is_closed_at_the_deadline() {
    let d = scratch("udm-scale-");
    let srv = serve(d.path(), 1 << 20, &["--handshake-timeout", "1"]);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    // Say nothing: the server must hang up at its deadline.
    let mut b = [0u8; 1];
    let n = s.read(&mut b).unwrap_or(0);
    let waited = t.elapsed();
    assert_eq!(n, 0, "expected end of stream");
    println!("silent client closed after {waited:?} (deadline 1 s)");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "closed after {waited:?}"
    );
    // A prompt client is not affected.
    let mut c = client(&srv.sock);
    read4k(&mut c, 1, 0);
    drop(c);
    assert_eq!(srv.stop(), Some(0));
}

#[test]
fn at_the_cap_the_oldest_unfinished_handshake_makes_room() {
    let d = scratch("udm-scale-");
    let srv = serve(d.path(), 1 << 20, &["--max-connections", "40"]);
    let idle: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(&srv.sock).unwrap())
        .collect();
    // Let the server take them all.
    std::thread::sleep(Duration::from_millis(300));
    let mut c = client(&srv.sock);
    read4k(&mut c, 1, 0);
    // The oldest silent one was shed for it.
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // It may be shed before or after its greeting was written (a loaded
    // server can accept all 41 before it greets the first): either way the
    // stream ends, with at most the 18-byte greeting in it.
    let mut got = Vec::new();
    first
        .read_to_end(&mut got)
        .expect("oldest idle client still open");
    assert!(
        got.is_empty() || got.len() == 18,
        "{} bytes before the end",
        got.len()
    );
    // With every connection past its handshake, a newcomer is refused
    // rather than an active client dropped.
    let mut active: Vec<UnixStream> = Vec::new();
    drop(idle);
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..39 {
        active.push(client(&srv.sock));
    }
    let mut extra = UnixStream::connect(&srv.sock).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut g = [0u8; 18];
    assert!(
        extra.read_exact(&mut g).is_err(),
        "a client past the cap was served while all others were active"
    );
    read4k(&mut c, 2, 0);
    for a in active.iter_mut() {
        read4k(a, 3, 4096);
    }
    drop(active);
    drop(c);
    assert_eq!(srv.stop(), Some(0));
}

#[test]
fn a_client_that_never_reads_is_dropped_and_others_keep_their_latency() {
    let d = scratch("udm-scale-");
    let srv = serve(
        d.path(),
        256 << 20,
        &["--reply-timeout", "2", "--max-inflight-bytes", "8M"],
    );
    let mut b = client(&srv.sock);
    // Warm up, then the quiet figure.
    p99(&mut b, 500);
    let quiet = p99(&mut b, 2000);
    // The hostile client: 64 reads of 1 MiB, never reading a byte back.
    let mut a = client(&srv.sock);
    a.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    for i in 0..64u64 {
        if a.write_all(&request(0, i, i << 20, 1 << 20)).is_err() {
            break; // the server stopped reading it: back-pressure
        }
    }
    let t_hostile = Instant::now();
    let loaded = p99(&mut b, 2000);
    let quiet2 = {
        std::thread::sleep(Duration::from_secs(3).saturating_sub(t_hostile.elapsed()));
        p99(&mut b, 2000)
    };
    // By now (more than 2 s without progress) the hostile client is gone:
    // what it can read is what was in flight, then the end.
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let mut got = 0usize;
    let end = loop {
        match a.read(&mut sink) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(_) => break true,
        }
        if got > 200 << 20 {
            break false;
        }
    };
    assert!(end, "the non-reading client was not dropped");
    let base = quiet.max(quiet2).max(Duration::from_millis(1));
    println!(
        "4 KiB read p99: quiet {quiet:?} / {quiet2:?}, beside a non-reading client {loaded:?}; \
         the hostile client got {got} bytes before being dropped"
    );
    assert!(
        loaded <= base * 2,
        "p99 {loaded:?} beside a non-reading client, quiet {quiet:?}/{quiet2:?}"
    );
    // The server still serves, and its budget came back.
    read4k(&mut b, 7, 0);
    drop(b);
    assert_eq!(srv.stop(), Some(0));
}

/// Keep `qd` writes of `len` bytes in flight on `s` until `stop`; count
/// completed bytes in `done`.
fn writer(mut s: UnixStream, len: usize, qd: usize, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let mut r = s.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let mut h = [0u8; 16];
        while r.read_exact(&mut h).is_ok() {
            assert_eq!(&h[4..8], &[0, 0, 0, 0], "write failed");
            if tx.send(()).is_err() {
                break;
            }
        }
    });
    let payload = vec![0x5au8; len];
    let mut outstanding = 0;
    let mut cookie = 0u64;
    while !stop.load(Ordering::Relaxed) {
        while outstanding < qd {
            let off = (cookie % 64) * len as u64;
            s.write_all(&request(1, cookie, off, len as u32)).unwrap();
            s.write_all(&payload).unwrap();
            cookie += 1;
            outstanding += 1;
        }
        if rx.recv_timeout(Duration::from_secs(10)).is_err() {
            panic!("no write completed for 10 s");
        }
        outstanding -= 1;
        done.fetch_add(len as u64, Ordering::Relaxed);
    }
    while outstanding > 0 && rx.recv_timeout(Duration::from_secs(10)).is_ok() {
        outstanding -= 1;
    }
    s.shutdown(std::net::Shutdown::Both).unwrap();
    let _ = reader.join();
}

#[test]
fn a_greedy_client_cannot_starve_another() {
    let d = scratch("udm-scale-");
    let srv = serve(
        d.path(),
        256 << 20,
        &["--memory-budget", "8M", "--threads", "2"],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let greedy_done = Arc::new(AtomicU64::new(0));
    let modest_done = Arc::new(AtomicU64::new(0));
    let greedy = {
        let (s, stop, done) = (client(&srv.sock), stop.clone(), greedy_done.clone());
        std::thread::spawn(move || writer(s, 2 << 20, 64, stop, done))
    };
    std::thread::sleep(Duration::from_millis(300));
    let modest = {
        let (s, stop, done) = (client(&srv.sock), stop.clone(), modest_done.clone());
        std::thread::spawn(move || writer(s, 1 << 20, 2, stop, done))
    };
    let start_g = greedy_done.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(3));
    let g = greedy_done.load(Ordering::Relaxed) - start_g;
    let m = modest_done.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    greedy.join().unwrap();
    modest.join().unwrap();
    println!(
        "3 s under an 8 MiB budget: greedy (QD64 x 2 MiB) {} MiB, modest (QD2 x 1 MiB) {} MiB",
        g >> 20,
        m >> 20
    );
    assert!(g > 0 && m > 0, "a client made no progress");
    // Fair share: the modest client, which never has more than 2 MiB in
    // flight, still moves at least a quarter of what the greedy one does
    // (1:1 when the machine is quiet; loose because a shared machine
    // skews 3 s windows).
    assert!(
        m * 4 >= g,
        "the modest client got {} MiB against the greedy one's {} MiB",
        m >> 20,
        g >> 20
    );
    assert_eq!(srv.stop(), Some(0));
}

/// CPU time (user + system) the process has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ')'.
    let rest = &st[st.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn busy_polling_stops_when_requests_stop() {
    let d = scratch("udm-scale-");
    // A poll window of 20 ms, 400 times the default, so that a loop that
    // kept polling would show plainly in the idle second below.
    let srv = serve(d.path(), 1 << 20, &["--poll-us", "20000"]);
    let mut c = client(&srv.sock);
    let busy0 = cpu_ticks(srv.pid());
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < Duration::from_millis(500) {
        read4k(&mut c, n, (n % 256) * 4096);
        n += 1;
    }
    let busy = cpu_ticks(srv.pid()) - busy0;
    // Past the window the loops must sleep (connection still open).
    std::thread::sleep(Duration::from_millis(200));
    let idle0 = cpu_ticks(srv.pid());
    std::thread::sleep(Duration::from_secs(1));
    let idle = cpu_ticks(srv.pid()) - idle0;
    println!(
        "--poll-us 20000: {n} reads in 0.5 s used {busy} ticks; the next idle second used {idle}"
    );
    assert!(n > 100, "only {n} reads in half a second");
    // One second is 100 ticks on one core; a loop polling on would use
    // ~100, the idle sweep (4 per second) none to speak of.
    assert!(idle <= 5, "the idle server used {idle} ticks in one second");
    // And polling off still serves.
    std::fs::create_dir(d.path().join("b")).unwrap();
    let srv0 = serve(&d.path().join("b"), 1 << 20, &["--poll-us", "0"]);
    let mut c0 = client(&srv0.sock);
    read4k(&mut c0, 1, 0);
    drop((c, c0));
    assert_eq!(srv.stop(), Some(0));
    assert_eq!(srv0.stop(), Some(0));
}
