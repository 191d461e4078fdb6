//! Hostile control clients — garbage, a 1 GiB length prefix, half a
//! request then silence, a wrong version, 1 000 connections at once —
//! get error replies or are closed, and the server keeps serving its NBD
//! exports (and, once they are gone, its control socket) throughout.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::*;

/// Read one reply frame; its JSON.
fn reply(s: &mut UnixStream) -> serde_json::Value {
    let mut h = [0u8; 12];
    s.read_exact(&mut h).expect("a reply header");
    assert_eq!(&h[0..4], b"UDMC");
    let jl = u32::from_be_bytes(h[4..8].try_into().unwrap()) as usize;
    let pl = u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize;
    let mut j = vec![0u8; jl];
    s.read_exact(&mut j).unwrap();
    let mut p = vec![0u8; pl];
    s.read_exact(&mut p).unwrap();
    serde_json::from_slice(&j).unwrap()
}

fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn frame(json: &[u8], payload_len: u32) -> Vec<u8> {
    let mut v = b"UDMC".to_vec();
    v.extend_from_slice(&(json.len() as u32).to_be_bytes());
    v.extend_from_slice(&payload_len.to_be_bytes());
    v.extend_from_slice(json);
    v
}

#[test]
fn hostile_control_clients_leave_the_server_serving() {
    // 1 000 sockets and more: make sure this process may hold them.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a live rlimit struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        if lim.rlim_cur < 4096 {
            lim.rlim_cur = lim.rlim_max.min(4096);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    let d = scratch("udm-hostile-");
    let data = fast_bytes(21, 4 << 20);
    let f = write_file(d.path(), "data.img", &data);
    let t = write_file(
        d.path(),
        "lin.table",
        format!("0 8192 linear {} 0\n", f.display()).as_bytes(),
    );
    let srv = DmServer::start(d.path(), &["--table", &format!("lin={}", t.display())]);
    let check_nbd = || {
        let out = d.path().join("out.img");
        let _ = std::fs::remove_file(&out);
        run(Command::new(need("nbdcopy")).args([&srv.uri("lin"), out.to_str().unwrap()]));
        assert!(
            std::fs::read(&out).unwrap() == data,
            "export serves its data"
        );
    };
    let connect = || UnixStream::connect(&srv.ctl).unwrap();

    // Garbage: an error naming the problem, then the connection closes.
    let mut s = connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r = reply(&mut s);
    assert_eq!(r["code"], "EPROTO");
    assert!(r["error"]
        .as_str()
        .unwrap()
        .contains("not a udm control message"));
    assert!(closed(&mut s));

    // A 1 GiB payload announced: refused from the header, nothing read.
    let mut s = connect();
    s.write_all(&frame(b"{\"v\":1,\"op\":\"ls\"}", 1 << 30))
        .unwrap();
    let r = reply(&mut s);
    assert_eq!(r["code"], "EPROTO");
    assert!(r["error"].as_str().unwrap().contains("over the"), "{r}");

    // Valid framing, bad JSON; a wrong version; an unknown operation.
    let mut s = connect();
    s.write_all(&frame(b"{not json", 0)).unwrap();
    assert!(reply(&mut s)["error"]
        .as_str()
        .unwrap()
        .contains("malformed"));
    let mut s = connect();
    s.write_all(&frame(b"{\"v\":99,\"op\":\"ls\"}", 0)).unwrap();
    assert!(reply(&mut s)["error"]
        .as_str()
        .unwrap()
        .contains("version 99"));
    let mut s = connect();
    s.write_all(&frame(b"{\"v\":1,\"op\":\"format_disk\"}", 0))
        .unwrap();
    let r = reply(&mut s);
    assert_eq!(r["code"], "ENOSYS");
    // That connection stays usable after an operation error.
    s.write_all(&frame(b"{\"v\":1,\"op\":\"ls\"}", 0)).unwrap();
    assert_eq!(reply(&mut s)["ok"], true);

    // Half a request, then silence: dropped at the message deadline, and
    // the exports serve meanwhile.
    let mut half = connect();
    let full = frame(b"{\"v\":1,\"op\":\"remove_all\",\"force\":true}", 0);
    half.write_all(&full[..20]).unwrap();
    let t0 = Instant::now();
    check_nbd();
    let r = reply(&mut half);
    assert!(r["error"].as_str().unwrap().contains("incomplete"), "{r}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert!(
        srv.ok(&["ls"]).contains("lin"),
        "the half request did nothing"
    );

    // 1 000 connections at once, held open and silent: past the limit
    // they are told to retry and closed; the exports keep serving.
    let mut many = Vec::new();
    let mut refused = 0;
    for _ in 0..1000 {
        let s = connect();
        many.push(s);
    }
    check_nbd();
    for s in many.iter_mut() {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut h = [0u8; 4];
        if s.read(&mut h).is_ok_and(|n| n > 0) {
            refused += 1;
        }
    }
    assert!(refused >= 900, "only {refused} of 1000 told to retry");
    drop(many);
    // With them gone the control socket answers again.
    wait_for("control socket answering", Duration::from_secs(30), || {
        srv.run(&["ls"]).status.success()
    });
    check_nbd();
    assert_eq!(srv.serve.stop(), Some(0));
}
