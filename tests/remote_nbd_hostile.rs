//! udm's NBD client against hostile upstream servers written here, in
//! process: a server that answers reads with chunks covering nothing, one
//! that floods `GO` with INFO replies, and one that accepts requests and
//! never answers. Each must give the caller a clean error in bounded time,
//! never stale bytes as data and never a hang.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use udm::core::{BlockDevice, WriteBuf};
use udm::protocol::nbd::{
    chunk_header, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT, INFO_EXPORT, NBD_MAGIC, OPT_GO,
    OPT_REPLY_MAGIC, OPT_STRUCTURED_REPLY, REPLY_FLAG_DONE, REPLY_TYPE_NONE, REP_ACK, REP_INFO,
    TF_HAS_FLAGS, TF_SEND_FLUSH,
};
use udm::store::{Location, NbdStore};

const SIZE: u64 = 1 << 20;

#[derive(Clone, Copy)]
enum Mode {
    /// Reads get one `NONE|DONE` chunk: success with no data.
    EmptyReads,
    /// `GO` gets INFO replies for ever.
    InfoFlood,
    /// Requests are read and never answered.
    Silent,
}

fn opt_reply(s: &mut TcpStream, opt: u32, ty: u32, data: &[u8]) -> std::io::Result<()> {
    let mut b = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b)
}

fn info_export() -> Vec<u8> {
    let mut d = INFO_EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&SIZE.to_be_bytes());
    d.extend_from_slice(&(TF_HAS_FLAGS | TF_SEND_FLUSH).to_be_bytes());
    d
}

/// Negotiates (structured replies, `GO`); `Ok(false)` when the mode ended
/// the connection during the handshake.
fn negotiate(s: &mut TcpStream, mode: Mode) -> std::io::Result<bool> {
    let mut greet = NBD_MAGIC.to_be_bytes().to_vec();
    greet.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greet.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greet)?;
    let mut cflags = [0u8; 4];
    s.read_exact(&mut cflags)?;
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        match (opt, mode) {
            (OPT_STRUCTURED_REPLY, _) => opt_reply(s, opt, REP_ACK, &[])?,
            (OPT_GO, Mode::InfoFlood) => loop {
                opt_reply(s, opt, REP_INFO, &info_export())?;
            },
            (OPT_GO, _) => {
                opt_reply(s, opt, REP_INFO, &info_export())?;
                opt_reply(s, opt, REP_ACK, &[])?;
                return Ok(true);
            }
            _ => return Ok(false),
        }
    }
}

fn serve_one(mut s: TcpStream, mode: Mode) -> std::io::Result<()> {
    if !negotiate(&mut s, mode)? {
        return Ok(());
    }
    let mut held = Vec::new();
    loop {
        let mut h = [0u8; 28];
        s.read_exact(&mut h)?;
        let ty = u16::from_be_bytes([h[6], h[7]]);
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[24..28].try_into().unwrap());
        if ty == 1 {
            let mut payload = vec![0u8; len as usize];
            s.read_exact(&mut payload)?;
        }
        match mode {
            Mode::Silent => held.push(cookie),
            _ => s.write_all(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0))?,
        }
    }
}

/// Starts a server thread; returns the `nbd://` location of its export.
fn hostile(mode: Mode) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            thread::spawn(move || serve_one(s, mode));
        }
    });
    format!("nbd://127.0.0.1:{port}/x")
}

fn connect(uri: &str) -> Result<NbdStore, String> {
    let Location::Nbd(spec) = Location::parse(uri).unwrap() else {
        panic!("{uri} not parsed as NBD")
    };
    NbdStore::connect(spec, false)
}

#[test]
fn a_read_answered_with_no_data_fails_instead_of_returning_stale_bytes() {
    let store = connect(&hostile(Mode::EmptyReads))
        .unwrap()
        .with_retry_window(Duration::from_millis(200));
    assert!(store.structured_replies());
    let mut buf = vec![0xa5u8; 4096];
    let e = store.read(0, &mut buf).unwrap_err().to_string();
    assert!(
        e.contains("Input/output error") || e.contains("os error 5"),
        "{e}"
    );
    // Writes and flushes legitimately end with NONE|DONE.
    store
        .write(0, WriteBuf::Borrowed(&[1u8; 4096]), false)
        .unwrap();
    store.flush().unwrap();
}

#[test]
fn endless_info_replies_end_the_handshake_quickly() {
    let t = Instant::now();
    let e = connect(&hostile(Mode::InfoFlood)).err().unwrap();
    assert!(e.contains("replies") && e.contains("GO"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn a_silent_server_gives_eio_after_the_request_timeout() {
    let store = connect(&hostile(Mode::Silent))
        .unwrap()
        .with_request_timeout(Duration::from_millis(500))
        .with_retry_window(Duration::from_millis(200));
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let e = store.read(0, &mut buf).unwrap_err().to_string();
    assert!(e.contains("no reply within 500 ms"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The next request reconnects and is bounded the same way.
    let t = Instant::now();
    let e = store.flush().unwrap_err().to_string();
    assert!(e.contains("no reply within"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// `udm serve` over a silent upstream still exits on SIGTERM: its final
/// flush of that export fails after the request timeout (30 s) instead
/// of waiting for ever.
#[test]
fn serve_exits_on_sigterm_with_a_silent_upstream() {
    let dir = common::scratch("udm-hostile-serve");
    let sock = dir.path().join("s.sock");
    let up = hostile(Mode::Silent);
    let serve = common::UdmServe::start(&sock, &["--file".to_string(), format!("h={up}")]);
    // SAFETY: kill(2) with the pid of a child we own and a valid signal.
    unsafe { libc::kill(serve.pid() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let gone = || {
        // A reaped-or-zombie check without taking the child from `serve`.
        let st = std::fs::read_to_string(format!("/proc/{}/stat", serve.pid()));
        st.map_or(true, |s| s.split(' ').nth(2) == Some("Z"))
    };
    while !gone() {
        assert!(
            t.elapsed() < Duration::from_secs(75),
            "udm serve still running {:?} after SIGTERM with a silent upstream",
            t.elapsed()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(sock.with_extension("log")).unwrap_or_default();
    assert!(log.contains("no reply within"), "udm log:\n{log}");
}
