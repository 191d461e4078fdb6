//! Attacks on the connection slots of a running `udm serve` over TCP
//! (second review, F7): one address that takes every slot with
//! connections that negotiate and then sit must not lock out a client
//! from another address. Loopback only: 127.0.0.1 attacks, 127.0.0.2 and
//! 127.0.0.3 are the other clients (Linux routes all of 127/8 to lo).

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::io::FromRawFd;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::nbd::request;
use common::*;

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
    let img = sparse(dir, "d.img", 4 << 20);
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
