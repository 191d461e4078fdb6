//! Attacks on the connections of a running `udm serve` over TCP (second
//! review): one address that takes every slot with connections that
//! negotiate and then sit must not lock out a client from another address
//! (F7); a flood of TLS handshakes must not slow an established client
//! (F26). Loopback only: 127.0.0.1 attacks, 127.0.0.2 and 127.0.0.3 are
//! the other clients (Linux routes all of 127/8 to lo).

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::io::FromRawFd;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::nbd::request;
use common::*;

/// The tests of this file run one at a time: the p99 test compares
/// latencies, and another test's clients on the same two cores would be
/// measured as the flood's doing.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

struct Serve {
    child: Child,
    port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_tcp(dir: &Path, extra: &[&str]) -> Serve {
    let img = sparse(dir, "d.img", 8 << 20);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let child = udm()
        .args([
            "serve",
            "--no-control",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--file")
        .arg(format!("d={}", img.display()))
        .args(extra)
        .env("UDM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut s = Serve { child, port };
    let t = Instant::now();
    // Probe from an address no test uses, so the probe costs no slot that
    // matters (it closes at once anyway).
    while connect_from([127, 0, 0, 9], port).is_err() {
        if let Some(st) = s.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            panic!("udm serve exited ({st}): {log}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "udm serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

/// A TCP connection to 127.0.0.1:`port` from source address `src`.
fn connect_from(src: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    let sin = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(Ipv4Addr::from(ip)).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket(2) with constant arguments; the descriptor is owned
    // by the TcpStream below (closed on every error path by it).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket that nothing else owns.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let (a, b) = (sin(src, 0), sin([127, 0, 0, 1], port));
    // SAFETY: bind/connect read `len` bytes of the live sockaddr_in.
    let r = unsafe {
        if libc::bind(fd, &a as *const _ as *const libc::sockaddr, len) != 0 {
            -1
        } else {
            libc::connect(fd, &b as *const _ as *const libc::sockaddr, len)
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// Negotiate export `d` (fixed newstyle, EXPORT_NAME, no zeroes).
fn negotiate(s: &mut TcpStream) -> std::io::Result<()> {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello)?;
    s.write_all(&3u32.to_be_bytes())?;
    let mut opt = Vec::new();
    opt.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.push(b'd');
    s.write_all(&opt)?;
    let mut info = [0u8; 10];
    s.read_exact(&mut info)
}

/// Connect from `src`, negotiate, read 4 KiB: how long it all took.
fn served_from(src: [u8; 4], port: u16) -> Duration {
    let t = Instant::now();
    let mut s = connect_from(src, port).unwrap();
    negotiate(&mut s).expect("the newcomer is served");
    s.write_all(&request(0, 7, 4096, 4096)).unwrap();
    let mut reply = vec![0u8; 16 + 4096];
    s.read_exact(&mut reply).expect("the read is answered");
    assert_eq!(&reply[4..8], &[0, 0, 0, 0], "the read succeeded");
    t.elapsed()
}

/// `n` connections from 127.0.0.1 that negotiate and then sit; those the
/// server refuses are left out.
fn squatters(port: u16, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        if let Ok(mut s) = connect_from([127, 0, 0, 1], port) {
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            if negotiate(&mut s).is_ok() {
                held.push(s);
            }
        }
    }
    held
}

fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// One address holds at most a quarter of `--max-connections` by default,
/// so the rest stay for others. On the code before the fix all 40
/// squatters got in and 127.0.0.2 was refused.
#[test]
fn one_address_cannot_take_every_slot() {
    let _serial = one_at_a_time();
    let d = scratch("udm-slots-");
    let srv = serve_tcp(d.path(), &["--max-connections", "40"]);
    let held = squatters(srv.port, 40);
    assert_eq!(
        held.len(),
        10,
        "127.0.0.1 holds {} slots, not a quarter",
        held.len()
    );
    let took = served_from([127, 0, 0, 2], srv.port);
    println!(
        "127.0.0.2 served in {took:?} while 127.0.0.1 holds {}",
        held.len()
    );
    assert!(took < Duration::from_secs(1), "127.0.0.2 waited {took:?}");
}

/// With the per-address cap as high as the table, a full table of idle
/// connections from one address gives up its oldest idle one to a
/// newcomer from another address. On the code before the fix the
/// newcomer was refused.
#[test]
fn a_full_table_sheds_the_oldest_idle_connection_of_the_biggest_holder() {
    let _serial = one_at_a_time();
    let d = scratch("udm-slots-");
    let srv = serve_tcp(
        d.path(),
        &[
            "--max-connections",
            "40",
            "--max-connections-per-client",
            "40",
        ],
    );
    let mut held = squatters(srv.port, 40);
    assert_eq!(held.len(), 40);
    // Idle past the shedding threshold (1 s) and a sweep (250 ms).
    std::thread::sleep(Duration::from_millis(1600));
    let took = served_from([127, 0, 0, 2], srv.port);
    println!("127.0.0.2 served in {took:?} with the table full of idle connections");
    assert!(took < Duration::from_secs(1), "127.0.0.2 waited {took:?}");
    assert!(
        closed_by_server(&mut held[0]),
        "the oldest idle connection is still open"
    );
    // The newest squatter was not the one to go.
    held[39]
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(held[39].read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut),
        "the newest connection was closed instead of the oldest"
    );
    let took = served_from([127, 0, 0, 3], srv.port);
    assert!(took < Duration::from_secs(1), "127.0.0.3 waited {took:?}");
}

/// A self-signed RSA-3072 server certificate (a signature costs the server
/// milliseconds) in the layout `--tls-certificates` reads.
fn rsa_certs(dir: &Path) -> std::path::PathBuf {
    let certs = dir.join("certs");
    std::fs::create_dir(&certs).unwrap();
    run(std::process::Command::new(need("openssl"))
        .current_dir(&certs)
        .args([
            "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=localhost", "-keyout", "server-key.pem"])
        .args(["-out", "server-cert.pem"]));
    std::fs::copy(certs.join("server-cert.pem"), certs.join("ca-cert.pem")).unwrap();
    certs
}

/// A TLS 1.3 ClientHello, recorded once and sent by every flooding
/// connection: the server makes a fresh key share and signature for each,
/// the attacker pays nothing.
fn client_hello() -> Vec<u8> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut c =
        rustls::ClientConnection::new(std::sync::Arc::new(cfg), "localhost".try_into().unwrap())
            .unwrap();
    let mut hello = Vec::new();
    c.write_tls(&mut hello).unwrap();
    hello
}

/// One flooding handshake: greeting, STARTTLS, the recorded ClientHello,
/// wait for the server's flight (so the server did the work), close.
fn flood_once(port: u16, hello: &[u8]) -> std::io::Result<()> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut g = [0u8; 18];
    s.read_exact(&mut g)?;
    s.write_all(&3u32.to_be_bytes())?;
    let mut opt = Vec::new();
    opt.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    opt.extend_from_slice(&5u32.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt)?;
    let mut ack = [0u8; 20];
    s.read_exact(&mut ack)?;
    s.write_all(hello)?;
    let mut flight = [0u8; 512];
    let _ = s.read(&mut flight)?;
    Ok(())
}

/// The attacker's own CPU is not the server's doing: its threads run at
/// the lowest priority, as if it were another machine.
fn nice_thread() {
    // SAFETY: setpriority on the calling thread's id only.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

/// The 99th percentile of `n` back-to-back 4 KiB reads on `s`.
fn p99(s: &mut TcpStream, n: usize) -> Duration {
    let mut v: Vec<Duration> = (0..n as u64)
        .map(|i| {
            let t = Instant::now();
            s.write_all(&request(0, i, (i % 1024) * 4096, 4096))
                .unwrap();
            let mut reply = vec![0u8; 16 + 4096];
            s.read_exact(&mut reply).expect("the read is answered");
            assert_eq!(&reply[4..8], &[0, 0, 0, 0], "the read succeeded");
            t.elapsed()
        })
        .collect();
    v.sort();
    v[n * 99 / 100]
}

/// F26: TLS handshakes (an RSA-3072 signature each) used to run on the
/// event loops that serve established clients, so a flood of ClientHellos
/// queued their requests behind signatures. Now a handshake thread at a
/// low priority runs them: an established client's p99 under the flood
/// stays within twice its quiet figure (the best of three alternating
/// windows each; the quiet one counted as at least 1 ms: sub-millisecond
/// p99s are noise on a shared VM).
#[test]
fn a_tls_handshake_flood_does_not_slow_established_clients() {
    let _serial = one_at_a_time();
    let d = scratch("udm-slots-");
    let certs = rsa_certs(d.path());
    let srv = serve_tcp(
        d.path(),
        &["--tls", "on", "--tls-certificates", certs.to_str().unwrap()],
    );
    let hello = client_hello();
    flood_once(srv.port, &hello).expect("a handshake gets the server's flight");
    let mut good = connect_from([127, 0, 0, 2], srv.port).unwrap();
    negotiate(&mut good).unwrap();
    p99(&mut good, 300);
    use std::sync::atomic::Ordering::Relaxed;
    let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (paused, stop, done) = (paused.clone(), stop.clone(), done.clone());
            let (hello, port) = (hello.clone(), srv.port);
            std::thread::spawn(move || {
                nice_thread();
                while !stop.load(Relaxed) {
                    if paused.load(Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    } else if flood_once(port, &hello).is_ok() {
                        done.fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    // Quiet and flooded windows alternate, and each side keeps its best:
    // a flood that slows the server does so in every flooded window, while
    // other work on a shared VM comes and goes over both.
    let (mut quiet, mut loaded) = (Duration::MAX, Duration::MAX);
    let mut flooded = Duration::ZERO;
    for _ in 0..3 {
        quiet = quiet.min(p99(&mut good, 500));
        paused.store(false, Relaxed);
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        loaded = loaded.min(p99(&mut good, 500));
        flooded += t.elapsed();
        paused.store(true, Relaxed);
        // Handshakes already queued drain before the next quiet window.
        std::thread::sleep(Duration::from_millis(300));
    }
    let rate = done.load(Relaxed) as f64 / flooded.as_secs_f64();
    stop.store(true, Relaxed);
    for f in flood {
        f.join().unwrap();
    }
    println!(
        "4 KiB read p99: quiet {quiet:?}, under a TLS handshake flood ({rate:.0}/s) {loaded:?}"
    );
    assert!(rate > 0.0, "the flood never reached the server");
    let base = quiet.max(Duration::from_millis(1));
    assert!(
        loaded <= base * 2,
        "p99 {loaded:?} under a handshake flood, quiet {quiet:?}"
    );
}
