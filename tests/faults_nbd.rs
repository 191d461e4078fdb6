//! Faults seen from an NBD client: a failing leg of a striped table fails
//! exactly the requests that touch it (EIO), while the connection, the
//! server and other exports go on — a concurrent fio job with verify on
//! another export finishes with 0 errors; a delayed leg holds only its own
//! requests (no head-of-line blocking with two workers); dust's bad
//! blocks, set by messages, fail reads until written.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;

fn table(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(format!("{name}.table"));
    std::fs::write(&p, text).unwrap();
    format!("{name}={}", p.display())
}

#[test]
fn a_failing_leg_fails_only_its_requests_and_fio_on_another_export_is_clean() {
    need_python_module("nbd", "python3-libnbd");
    need("fio");
    let d = scratch("udm-faults-");
    let p = d.path();
    let leg0 = sparse(p, "leg0.img", 8 << 20);
    let leg1 = sparse(p, "leg1.img", 8 << 20);
    let other = sparse(p, "other.img", 64 << 20);
    let key = "ab".repeat(32);
    let sock = p.join("s.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--threads",
            "2",
            "--table",
            // Always down (up 0 s), no features: every request fails.
            &table(
                p,
                "fl",
                &format!("0 16384 flakey {} 0 0 1\n", leg1.display()),
            ),
            "--table",
            &table(
                p,
                "st",
                &format!("0 32768 striped 2 8 {} 0 @fl 0\n", leg0.display()),
            ),
            "--table",
            &table(
                p,
                "other",
                &format!(
                    "0 131072 crypt aes-xts-plain64 {key} 0 {} 0\n",
                    other.display()
                ),
            ),
        ],
    );
    // fio with verify on the other export, running while the failing leg
    // is hammered.
    let work = tempfile::tempdir().unwrap();
    let fio = Command::new("fio")
        .current_dir(work.path())
        .args([
            "--name=other",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri("other")),
            "--rw=randwrite",
            "--bs=4k",
            "--bsrange=4k-64k",
            "--size=16m",
            "--numjobs=2",
            "--offset_increment=16m",
            "--iodepth=8",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--do_verify=1",
            "--group_reporting",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start fio");
    let py = std::thread::spawn({
        let sock = sock.clone();
        move || {
            python(
                "faults/isolate.py",
                &[sock.to_str().unwrap(), "flakey", "st"],
            )
        }
    });
    let out = py.join().unwrap();
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    let fio = fio.wait_with_output().expect("wait for fio");
    let text = String::from_utf8_lossy(&fio.stdout);
    assert!(fio.status.success(), "fio failed:\n{}", show(&fio));
    assert!(text.contains("err= 0"), "fio reported errors:\n{text}");
    assert!(!text.contains("verify: bad"), "{text}");
    println!("fio on the other export: err= 0, verify clean");
    // The final flush at shutdown reaches the failing leg too, so the
    // server says so with exit status 1 (a flush it could not do), but it
    // exits.
    assert_eq!(
        srv.stop(),
        Some(1),
        "the server stops; its last flush failed"
    );
}

#[test]
fn a_delayed_leg_holds_only_its_own_requests() {
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-delay-");
    let p = d.path();
    let leg0 = sparse(p, "leg0.img", 8 << 20);
    let leg1 = sparse(p, "leg1.img", 8 << 20);
    let sock = p.join("s.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--threads",
            "2",
            "--table",
            &table(
                p,
                "dl",
                &format!("0 16384 delay {} 0 2000\n", leg1.display()),
            ),
            "--table",
            &table(
                p,
                "st",
                &format!("0 32768 striped 2 8 {} 0 @dl 0\n", leg0.display()),
            ),
        ],
    );
    let out = python(
        "faults/isolate.py",
        &[sock.to_str().unwrap(), "delay", "st"],
    );
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(srv.stop(), Some(0));
}

/// Dust's bad blocks come from messages; until `udm dmsetup message`
/// exists the test builds the device in-process and sends the messages to
/// the target itself, then serves it with udm's server.
#[test]
fn dust_bad_blocks_set_by_messages_fail_reads_over_nbd() {
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-dust-");
    let img = sparse(d.path(), "d.img", 4 << 20);
    let lines = udm::core::table::parse(&format!("0 8192 dust {} 0 512\n", img.display())).unwrap();
    let dev = udm::mapper::build(&lines, &mut Files, &Default::default()).unwrap();
    let t = &dev.segments()[0].target;
    for b in 8..16 {
        assert_eq!(t.message(&["addbadblock".into(), b.to_string()]), Ok(None));
    }
    assert_eq!(t.message(&["enable".into()]), Ok(None));
    assert_eq!(
        t.status(),
        format!("{} fail_read_on_bad_block verbose", img.display())
    );
    let dev: Arc<dyn udm::core::BlockDevice> = Arc::new(dev);
    let srv = nbd::Server::start(vec![nbd::export("dust", dev, false)], 2);
    let out = python(
        "faults/isolate.py",
        &[srv.socket.to_str().unwrap(), "dust", "dust"],
    );
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    srv.stop().unwrap();
}

/// The same targets driven as dmsetup users drive them, through `udm
/// dmsetup` on a running server: table and status lines as the kernel
/// prints them, dust's messages (with their replies), log-writes marks,
/// a flakey table reloaded from up to down (`drop_writes`) and back.
#[test]
fn fault_targets_through_udm_dmsetup() {
    use common::dm::DmServer;
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-dmfault-");
    let p = d.path();
    let disk = sparse(p, "disk.img", 4 << 20);
    let logf = sparse(p, "log.img", 8 << 20);
    let disk = disk.to_str().unwrap();
    let srv = DmServer::start(p, &[]);

    // dust: the documentation's walk-through.
    srv.ok(&[
        "create",
        "dust1",
        "--table",
        &format!("0 8192 dust {disk} 0 512"),
    ]);
    assert!(srv
        .ok(&["table", "dust1"])
        .contains(&format!("dust {disk} 0 512")));
    assert!(srv
        .ok(&["status", "dust1"])
        .contains(&format!("dust {disk} bypass verbose")));
    for b in ["60", "67", "72"] {
        srv.ok(&["message", "dust1", "0", "addbadblock", b]);
    }
    let e = srv.fails(&["message", "dust1", "0", "addbadblock", "60"]);
    assert!(e.contains("already in badblocklist"), "{e}");
    srv.ok(&["message", "dust1", "0", "enable"]);
    assert!(srv
        .ok(&["status", "dust1"])
        .contains("fail_read_on_bad_block verbose"));
    assert!(srv
        .ok(&["message", "dust1", "0", "countbadblocks"])
        .contains("countbadblocks: 3 badblock(s) found"));
    assert_eq!(
        srv.ok(&["message", "dust1", "0", "listbadblocks"]).trim(),
        "60\n67\n72"
    );
    assert!(srv
        .ok(&["message", "dust1", "0", "queryblock", "67"])
        .contains("block 67 found in badblocklist"));
    let e = srv.fails(&["message", "dust1", "0", "removebadblock", "87"]);
    assert!(e.contains("not found in badblocklist"), "{e}");
    srv.ok(&["message", "dust1", "0", "quiet"]);
    assert!(srv
        .ok(&["status", "dust1"])
        .contains("fail_read_on_bad_block quiet"));
    assert!(srv
        .ok(&["message", "dust1", "0", "clearbadblocks"])
        .contains("badblocks cleared"));
    srv.ok(&["message", "dust1", "0", "disable"]);

    // log-writes: a mark by message, entries in the status.
    srv.ok(&[
        "create",
        "lw",
        "--table",
        &format!("0 8192 log-writes {disk} {}", logf.display()),
    ]);
    srv.ok(&["message", "lw", "0", "mark", "mkfs"]);
    let st = srv.ok(&["status", "lw"]);
    assert!(st.contains("log-writes 1 1"), "{st}");
    let e = srv.fails(&["message", "lw", "0", "bogus", "x"]);
    assert!(e.contains("Unrecognised"), "{e}");
    srv.ok(&["remove", "lw"]);
    let found = run_text(
        udm()
            .args(["replay-log", "--find", "--end-mark", "mkfs", "--log"])
            .arg(&logf),
    );
    assert_eq!(found.trim(), "0");
    let listed = run_text(udm().args(["replay-log", "--list", "--log"]).arg(&logf));
    assert!(listed.contains("mark 'dm-log-writes-end'"), "{listed}");

    // delay and flakey: tables and status as the kernel prints them.
    srv.ok(&[
        "create",
        "dl",
        "--table",
        &format!("0 4096 delay {disk} 0 0 {disk} 8 0"),
    ]);
    assert!(srv
        .ok(&["table", "dl"])
        .contains(&format!("delay {disk} 0 0 {disk} 8 0")));
    assert!(srv.ok(&["status", "dl"]).contains("delay 0 0 0"));
    srv.ok(&[
        "create",
        "fl",
        "--table",
        &format!("0 8192 flakey {disk} 0 3600 0"),
    ]);
    assert!(srv.ok(&["table", "fl"]).contains(&format!(
        "flakey {disk} 0 3600 0 2 error_reads error_writes"
    )));
    // Reload to always down with drop_writes, write, reload back up: the
    // write was acknowledged and is not there.
    let swap_and_check = |table: String, expect: &str| {
        srv.ok(&["reload", "fl", "--table", &table]);
        srv.ok(&["suspend", "fl"]);
        srv.ok(&["resume", "fl"]);
        let out = python(
            "faults/isolate.py",
            &[srv.serve.sock.to_str().unwrap(), expect, "fl"],
        );
        println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    };
    swap_and_check(
        format!("0 8192 flakey {disk} 0 0 3600 1 drop_writes"),
        "dropped",
    );
    swap_and_check(format!("0 8192 flakey {disk} 0 3600 0"), "kept");
}

/// F3: the text of an error chunk is fixed per error number; the
/// failure's detail (backing paths, upstream addresses) stays in the
/// server's log. On the starting code the client got the target's error,
/// which named the backing file.
#[test]
fn error_chunks_tell_clients_no_server_detail() {
    use std::io::{Read, Write};
    let d = scratch("udm-dust-");
    let img = sparse(d.path(), "d.img", 4 << 20);
    let lines = udm::core::table::parse(&format!("0 8192 dust {} 0 512\n", img.display())).unwrap();
    let dev = udm::mapper::build(&lines, &mut Files, &Default::default()).unwrap();
    let t = &dev.segments()[0].target;
    assert_eq!(t.message(&["addbadblock".into(), "8".into()]), Ok(None));
    assert_eq!(t.message(&["enable".into()]), Ok(None));
    let dev: Arc<dyn udm::core::BlockDevice> = Arc::new(dev);
    let srv = nbd::Server::start(vec![nbd::export("dust", dev, false)], 2);
    let mut s = std::os::unix::net::UnixStream::connect(&srv.socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let option = |s: &mut std::os::unix::net::UnixStream, opt: u32, data: &[u8]| {
        let mut m = 0x4948_4156_454F_5054u64.to_be_bytes().to_vec();
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        s.write_all(&m).unwrap();
    };
    option(&mut s, 8, &[]); // STRUCTURED_REPLY
    let mut rep = [0u8; 20];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(
        u32::from_be_bytes(rep[12..16].try_into().unwrap()),
        1,
        "ACK"
    );
    option(&mut s, 1, b"dust"); // EXPORT_NAME
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    s.write_all(&nbd::request(0, 7, 8 * 512, 512)).unwrap();
    let mut head = [0u8; 20];
    s.read_exact(&mut head).unwrap();
    assert_eq!(
        u16::from_be_bytes([head[6], head[7]]),
        0x8001,
        "an error chunk"
    );
    let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    assert_eq!(u32::from_be_bytes(body[0..4].try_into().unwrap()), 5, "EIO");
    let msg = String::from_utf8_lossy(&body[6..]).into_owned();
    assert_eq!(msg, "I/O error");
    assert!(!msg.contains(&d.path().display().to_string()), "{msg}");
    drop(s);
    srv.stop().unwrap();
}
