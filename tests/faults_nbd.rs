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
