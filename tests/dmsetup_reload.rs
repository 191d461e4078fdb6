//! Live reload under load: while fio writes and verifies three devices
//! over NBD, each gets a new table through load + suspend + resume — a
//! linear device grows, a striped leg moves to a copy of its data, a crypt
//! device moves to a copy of its ciphertext under the same key. fio must
//! finish with no I/O error and no verify failure (requests running at the
//! swap finished on the old table, held ones ran on the new), a client
//! connected throughout must still be served, and a new client must see
//! the new size.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::dm::DmServer;
use common::*;

/// A client that connects, prints the size it was told, and on each
/// line of stdin reads the last 4 KiB of that size and prints the size
/// again: proof that one connection lives through the reloads.
const HOLDER: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = h.get_size()
print(size, flush=True)
for line in sys.stdin:
    if line.strip() == "quit":
        break
    try:
        h.pread(4096, size - 4096)
        print("read", h.get_size(), flush=True)
    except nbd.Error as e:
        print("error", e, flush=True)
"#;

#[test]
fn reload_under_fio_verify_keeps_clients_and_data() {
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-reload-");
    let mib = 1u64 << 20;
    let a = sparse(d.path(), "a.img", 64 * mib);
    let b1 = sparse(d.path(), "b1.img", 16 * mib);
    let b2 = sparse(d.path(), "b2.img", 16 * mib);
    let c = sparse(d.path(), "c.img", 32 * mib);
    let b2c = d.path().join("b2-copy.img");
    let cc = d.path().join("c-copy.img");
    let key: String = bytes(9, 64).iter().map(|b| format!("{b:02x}")).collect();
    let srv = DmServer::start(d.path(), &["--threads", "2"]);
    let p = |x: &std::path::Path| x.display().to_string();
    srv.ok(&[
        "create",
        "lin",
        "--table",
        &format!("0 65536 linear {} 0", p(&a)),
    ]);
    srv.ok(&[
        "create",
        "st",
        "--table",
        &format!("0 65536 striped 2 16 {} 0 {} 0", p(&b1), p(&b2)),
    ]);
    srv.ok(&[
        "create",
        "cr",
        "--table",
        &format!("0 65536 crypt aes-xts-plain64 {key} 0 {} 0", p(&c)),
    ]);

    let mut holder = Command::new(PYTHON)
        .args(["-c", HOLDER, &srv.uri("lin")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut hin = holder.stdin.take().unwrap();
    let mut hout = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    hout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), (32 * mib).to_string());

    let mut fio = Command::new(need("fio"));
    fio.args([
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bsrange=4k-64k",
        "--iodepth=8",
        "--size=16M",
        "--rate=3m",
        "--verify=crc32c",
        "--verify_backlog=64",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
    for dev in ["lin", "st", "cr"] {
        fio.arg(format!("--name={dev}"))
            .arg(format!("--uri={}", srv.uri(dev)));
    }
    let mut fio = fio
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Wait until every device is being written.
    wait_for("fio writing every device", Duration::from_secs(60), || {
        ["lin", "st", "cr"].iter().all(|n| {
            srv.status_json(n)["stats"]["write"]["ios"]
                .as_u64()
                .unwrap_or(0)
                > 20
        })
    });

    // 1. Grow the linear device (the new part of the file is free).
    srv.ok(&[
        "load",
        "lin",
        "--table",
        &format!("0 98304 linear {} 0", p(&a)),
    ]);
    srv.ok(&["suspend", "lin"]);
    srv.ok(&["resume", "lin"]);
    let size = run_text(Command::new(need("nbdinfo")).args(["--size", &srv.uri("lin")]));
    assert_eq!(
        size.trim(),
        (48 * mib).to_string(),
        "a new client sees the new size"
    );
    // Shrinking below what the connected clients address is refused.
    let e = srv.fails(&[
        "load",
        "lin",
        "--table",
        &format!("0 32768 linear {} 0", p(&a)),
    ]);
    assert!(e.contains("--force") && e.contains("connected"), "{e}");
    assert!(srv
        .ok(&["info", "lin"])
        .contains("Tables present:    LIVE\n"));

    // 2. Move a striped leg to a copy of its data.
    std::thread::sleep(Duration::from_millis(300));
    srv.ok(&["suspend", "st"]);
    std::fs::copy(&b2, &b2c).unwrap();
    srv.ok(&[
        "load",
        "st",
        "--table",
        &format!("0 65536 striped 2 16 {} 0 {} 0", p(&b1), p(&b2c)),
    ]);
    srv.ok(&["resume", "st"]);
    // Scribbling on the old leg now must not matter.
    std::fs::write(&b2, vec![0xEEu8; 16 << 20]).unwrap();

    // 3. Move the crypt device to a copy of its ciphertext, same key.
    std::thread::sleep(Duration::from_millis(300));
    srv.ok(&["suspend", "cr"]);
    std::fs::copy(&c, &cc).unwrap();
    srv.ok(&[
        "load",
        "cr",
        "--table",
        &format!("0 65536 crypt aes-xts-plain64 {key} 0 {} 0", p(&cc)),
    ]);
    srv.ok(&["resume", "cr"]);
    std::fs::write(&c, vec![0xEEu8; 32 << 20]).unwrap();
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio must still be running after the last swap, or nothing was tested"
    );

    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio failed:\n{}", show(&out));
    assert_eq!(text.matches("err= 0").count(), 3, "fio errors:\n{text}");
    assert!(!text.contains("verify: bad"), "fio verify failed:\n{text}");

    // The client connected before the reloads is still served.
    writeln!(hin, "read").unwrap();
    line.clear();
    hout.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        format!("read {}", 32 * mib),
        "old client keeps its size"
    );
    for n in ["lin", "st", "cr"] {
        let s = srv.status_json(n);
        assert_eq!(s["event_nr"], 1, "{n}: one table change");
        assert_eq!(s["stats"]["write"]["errors"], 0, "{n}");
        assert_eq!(s["stats"]["read"]["errors"], 0, "{n}");
    }
    assert!(srv.ok(&["table", "st"]).contains("b2-copy.img"));

    // Removing a device with a client attached is refused, --force works
    // and the client's next request fails instead of hanging.
    let e = srv.fails(&["remove", "lin"]);
    assert!(e.contains("1 NBD client(s) attached"), "{e}");
    srv.ok(&["remove", "--force", "lin"]);
    writeln!(hin, "read").unwrap();
    line.clear();
    let _ = hout.read_line(&mut line);
    assert!(
        !line.starts_with("read"),
        "a removed device served a read: {line}"
    );
    drop(hin);
    let _ = holder.wait();
    assert!(!srv.ok(&["ls"]).contains("lin"));
    assert_eq!(srv.serve.stop(), Some(0));
}

/// `remove --deferred` with a client attached: the device goes when the
/// client leaves; `info` says so meanwhile.
#[test]
fn deferred_remove_waits_for_the_last_client() {
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-reload-");
    let srv = DmServer::start(d.path(), &[]);
    srv.ok(&["create", "z", "--table", "0 64 zero"]);
    let mut holder = Command::new(PYTHON)
        .args(["-c", HOLDER, &srv.uri("z")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut hin = holder.stdin.take().unwrap();
    let mut hout = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    hout.read_line(&mut line).unwrap();
    srv.ok(&["remove", "--deferred", "z"]);
    assert!(srv.ok(&["info", "z"]).contains("(DEFERRED REMOVE)"));
    writeln!(hin, "quit").unwrap();
    drop(hin);
    holder.wait().unwrap();
    wait_for("deferred removal", Duration::from_secs(10), || {
        srv.ok(&["ls"]) == "No devices found\n"
    });
}
