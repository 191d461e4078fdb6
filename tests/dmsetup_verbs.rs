//! `udm dmsetup` against a running `udm serve --control`: every verb with
//! dmsetup's syntax, output and exit codes; the argv[0] symlink; tables
//! reading back as written; `status --json` against the documented
//! schema; a peer of another uid refused.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::dm::DmServer;
use common::*;

fn hex_key(n: usize) -> String {
    bytes(7, n).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_verb_against_a_running_server() {
    let d = scratch("udm-dm-");
    let a = sparse(d.path(), "a.img", 32 << 20);
    let b = sparse(d.path(), "b.img", 32 << 20);
    let srv = DmServer::start(d.path(), &[]);
    let (a, b) = (a.display().to_string(), b.display().to_string());

    // An empty server: no devices, dmsetup's words.
    assert_eq!(srv.ok(&["ls"]), "No devices found\n");
    assert_eq!(srv.ok(&["info"]), "No devices found\n");

    // create: --table, a file, stdin, --notable, -u, --readonly.
    srv.ok(&["create", "l1", "--table", &format!("0 32768 linear {a} 0")]);
    let tf = write_file(
        d.path(),
        "l2.table",
        format!("0 32768 linear {b} 0\n").as_bytes(),
    );
    srv.ok(&["create", "l2", tf.to_str().unwrap(), "-u", "UDM-l2"]);
    let o = srv.run_stdin(
        &["create", "s"],
        "0 65536 striped 2 8 @l1 0 /dev/mapper/l2 0\n",
    );
    assert!(o.status.success(), "{}", show(&o));
    srv.ok(&["create", "top", "--table", "0 65536 linear @s 0"]);
    srv.ok(&["create", "empty", "--notable"]);
    srv.ok(&["create", "ro", "--readonly", "--table", "0 64 zero"]);
    assert!(srv
        .fails(&["create", "l1", "--table", "0 8 zero"])
        .contains("already exists"));
    let e = srv.fails(&["create", "bad", "--table", "0 8 linear @nosuch 0"]);
    assert!(
        e.contains("no device named 'nosuch'") && e.contains("Command failed."),
        "{e}"
    );
    assert!(srv
        .fails(&["info", "bad"])
        .contains("Device does not exist."));

    // ls, ls --target, ls --tree.
    assert_eq!(
        srv.ok(&["ls"]),
        "empty\t(0:4)\nl1\t(0:0)\nl2\t(0:1)\nro\t(0:5)\ns\t(0:2)\ntop\t(0:3)\n"
    );
    assert_eq!(srv.ok(&["ls", "--target", "striped"]), "s\t(0, 2)\n");
    let tree = srv.ok(&["ls", "--tree"]);
    assert!(
        tree.contains(&format!(
            "top (0:3)\n `-s (0:2)\n    |-l1 (0:0)\n    |  `- ({a})\n    `-l2 (0:1)\n       `- ({b})\n"
        )),
        "{tree}"
    );

    // info, info -c.
    let info = srv.ok(&["info", "l2"]);
    assert_eq!(
        info,
        "Name:              l2\nState:             ACTIVE\nRead Ahead:        256\n\
         Tables present:    LIVE\n\
         Open count:        0\nEvent number:      0\nMajor, minor:      0, 1\n\
         Number of targets: 1\nUUID: UDM-l2\n\n"
    );
    assert!(srv
        .ok(&["info", "empty"])
        .contains("Tables present:    None"));
    assert!(srv
        .ok(&["info", "ro"])
        .contains("State:             ACTIVE (READ-ONLY)"));
    let cols = srv.ok(&["info", "-c", "l1", "ro"]);
    let mut lines = cols.lines();
    assert_eq!(
        lines.next().unwrap().trim_end(),
        "Name             Maj Min Stat Open Targ Event  UUID"
    );
    assert_eq!(
        lines.next().unwrap().trim_end(),
        "l1                 0   0 L--w    0    1      0"
    );
    assert_eq!(
        lines.next().unwrap().trim_end(),
        "ro                 0   5 L--r    0    1      0"
    );
    assert_eq!(
        srv.ok(&[
            "info",
            "-c",
            "--noheadings",
            "--separator",
            ":",
            "-o",
            "name,attr,segments",
            "l1"
        ]),
        "l1:L--w:1\n"
    );

    // table and status, one device and all.
    assert_eq!(srv.ok(&["table", "top"]), "0 65536 linear @s 0\n");
    assert_eq!(
        srv.ok(&["status", "s"]),
        "0 65536 striped 2 @l1 /dev/mapper/l2 1 AA\n"
    );
    assert_eq!(srv.ok(&["status", "l1"]), "0 32768 linear \n");
    let all = srv.ok(&["table"]);
    assert!(
        all.contains("s: 0 65536 striped 2 8 @l1 0 /dev/mapper/l2 0\n"),
        "{all}"
    );
    assert!(all.contains("empty: \n"), "{all}");
    assert_eq!(srv.ok(&["table", "--target", "zero"]), "ro: 0 64 zero \n");
    assert_eq!(
        srv.ok(&["status", "--target", "striped"]),
        "s: 0 65536 striped 2 @l1 /dev/mapper/l2 1 AA\n"
    );

    // deps.
    assert_eq!(srv.ok(&["deps", "s"]), "2 dependencies\t: (0, 0) (0, 1)\n");
    assert_eq!(
        srv.ok(&["deps", "-o", "devname", "s"]),
        "2 dependencies\t: (l1) (l2)\n"
    );
    assert_eq!(
        srv.ok(&["deps", "l1"]),
        format!("1 dependencies\t: ({a})\n")
    );

    // targets, version.
    let t = srv.ok(&["targets"]);
    for l in [
        "striped          v1.7.0",
        "linear           v1.5.0",
        "crypt ",
        "zero ",
        "error ",
    ] {
        assert!(t.contains(l), "{t}");
    }
    assert!(srv.ok(&["version"]).contains("Driver version:"));

    // Data through the stack lands where dm puts it.
    let data = fast_bytes(11, 1 << 20);
    let src = write_file(d.path(), "src.bin", &data);
    run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("top")]));
    assert!(
        pread(Path::new(&a), 0, 4096) == data[..4096],
        "chunk 0 on leg 0"
    );
    assert!(
        pread(Path::new(&b), 0, 4096) == data[4096..8192],
        "chunk 1 on leg 1"
    );

    // load/reload, the inactive slot, clear.
    srv.ok(&["load", "l1", "--table", &format!("0 32768 linear {a} 8")]);
    assert!(srv
        .ok(&["info", "l1"])
        .contains("Tables present:    LIVE & INACTIVE"));
    assert_eq!(
        srv.ok(&["info", "-c", "--noheadings", "-o", "attr", "l1"])
            .trim(),
        "LI-w"
    );
    assert_eq!(
        srv.ok(&["table", "--inactive", "l1"]),
        format!("0 32768 linear {a} 8\n")
    );
    srv.ok(&["clear", "l1"]);
    assert!(srv
        .ok(&["info", "l1"])
        .contains("Tables present:    LIVE\n"));
    let o = srv.run_stdin(&["reload", "l1"], &format!("0 32768 linear {a} 0\n"));
    assert!(o.status.success(), "{}", show(&o));

    // wait: returns once the event counter passes the number given (the
    // next table change here).
    let ev: u32 = srv.status_json("l1")["event_nr"].as_u64().unwrap() as u32;
    let mut waiter = srv
        .cmd()
        .args(["wait", "l1", &ev.to_string()])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(waiter.try_wait().unwrap().is_none(), "wait returned early");

    // suspend, resume (swaps the reloaded table in; a stacked device is
    // re-compiled over it).
    srv.ok(&["suspend", "l1"]);
    assert!(srv
        .ok(&["info", "l1"])
        .contains("State:             SUSPENDED"));
    assert_eq!(
        srv.ok(&["info", "-c", "--noheadings", "-o", "attr", "l1"])
            .trim(),
        "LIsw"
    );
    srv.ok(&["resume", "l1"]);
    assert!(waiter.wait().unwrap().success());
    assert!(srv
        .ok(&["info", "l1"])
        .contains("State:             ACTIVE"));
    assert!(srv.status_json("l1")["event_nr"].as_u64().unwrap() > ev as u64);
    srv.ok(&["suspend", "--noflush", "s"]);
    srv.ok(&["resume", "s"]);

    // message: dm-stats' @stats_clear, and a target that takes none.
    srv.ok(&["message", "top", "0", "@stats_clear"]);
    assert_eq!(srv.status_json("top")["stats"]["write"]["ios"], 0);
    assert!(srv
        .fails(&["message", "s", "0", "hello"])
        .contains("accepts no messages"));
    srv.ok(&["stats", "clear", "top"]);
    assert!(srv
        .ok(&["stats", "print", "top"])
        .contains("top: in_flight 0"));

    // rename (refused for a device another names), remove, remove_all.
    assert!(srv
        .fails(&["rename", "l1", "x"])
        .contains("named in the table"));
    srv.ok(&["rename", "ro", "ro2"]);
    assert!(srv.ok(&["ls"]).contains("ro2\t(0:5)"));
    assert!(srv.fails(&["remove", "s"]).contains("in use by top"));
    srv.ok(&["remove", "ro2"]);
    srv.ok(&["wipe_table", "top"]);
    assert_eq!(srv.ok(&["table", "top"]), "0 65536 error \n");
    srv.ok(&["remove_all"]);
    assert_eq!(srv.ok(&["ls"]), "No devices found\n");

    // Unknown verbs and bad options: usage errors, exit code 1.
    assert_eq!(srv.run(&["frobnicate"]).status.code(), Some(1));
    assert_eq!(srv.run(&["--bogus", "ls"]).status.code(), Some(1));
    assert_eq!(srv.serve.stop(), Some(0));
}

/// A symlink named `dmsetup` runs udm as dmsetup (argv[0] dispatch), with
/// the server found through $UDM_CONTROL.
#[test]
fn a_symlink_named_dmsetup_runs_it() {
    let d = scratch("udm-dm-");
    let srv = DmServer::start(d.path(), &[]);
    let link = d.path().join("dmsetup");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_udm"), &link).unwrap();
    let o = Command::new(&link)
        .args(["create", "z", "--table", "0 8 zero"])
        .env("UDM_CONTROL", &srv.ctl)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let o = Command::new(&link)
        .args(["ls"])
        .env("UDM_CONTROL", &srv.ctl)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "z\t(0:0)\n");
    let o = Command::new(&link)
        .args(["remove", "nosuch"])
        .env("UDM_CONTROL", &srv.ctl)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).ends_with("Command failed.\n"));
}

/// `dmsetup table --showkeys` prints back exactly the tables that created
/// the devices (in the kernel's canonical form), and masks keys without
/// --showkeys.
#[test]
fn table_output_reads_back_as_the_table_that_created_it() {
    let d = scratch("udm-dm-");
    let f = sparse(d.path(), "f.img", 32 << 20);
    let g = sparse(d.path(), "g w.img", 32 << 20);
    let srv = DmServer::start(d.path(), &[]);
    let (f, g) = (f.display().to_string(), g.display().to_string());
    let gq = g.replace(' ', "\\ ");
    let key = hex_key(64);
    let key2 = hex_key(32);
    let tables = [
        ("lin", format!("0 2048 linear {f} 0\n2048 2048 linear {gq} 4096\n")),
        ("str", format!("0 8192 striped 2 16 {f} 8192 {gq} 8192\n")),
        ("mix", "0 8 zero \n8 8 error \n".to_string()),
        (
            "cr",
            format!(
                "0 16384 crypt aes-xts-plain64 {key} 0 {f} 32768 2 allow_discards sector_size:4096\n"
            ),
        ),
        ("cr2", format!("0 4096 crypt aes-cbc-essiv:sha256 {key2} 7 @lin 0\n")),
    ];
    for (name, t) in &tables {
        let o = srv.run_stdin(&["create", name], t);
        assert!(o.status.success(), "{name}: {}", show(&o));
    }
    for (name, t) in &tables {
        assert_eq!(&srv.ok(&["table", "--showkeys", name]), t, "{name}");
    }
    let masked = srv.ok(&["table", "cr"]);
    assert!(
        !masked.contains(&key) && masked.contains(&"0".repeat(128)),
        "{masked}"
    );
    // Round trip through the tool itself: table output fed to create.
    let again = srv.ok(&["table", "--showkeys", "cr2"]);
    let o = srv.run_stdin(&["create", "cr3"], &again);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(srv.ok(&["table", "--showkeys", "cr3"]), again);
}

/// `status --json` validates against docs/control-status.schema.json
/// (with python3-jsonschema), with histograms on and off.
#[test]
fn status_json_follows_the_documented_schema() {
    need_python_module("jsonschema", "python3-jsonschema");
    let d = scratch("udm-dm-");
    let f = sparse(d.path(), "f.img", 8 << 20);
    let srv = DmServer::start(d.path(), &[]);
    srv.ok(&[
        "create",
        "lin",
        "--table",
        &format!("0 16384 linear {} 0", f.display()),
    ]);
    srv.ok(&[
        "create",
        "st",
        "--table",
        &format!("0 8192 striped 2 8 {} 0 @lin 0", f.display()),
    ]);
    srv.ok(&["create", "z", "--table", "0 8 zero\n8 8 error"]);
    let data = fast_bytes(5, 1 << 20);
    let src = write_file(d.path(), "src.bin", &data);
    run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("st")]));
    srv.ok(&["message", "z", "0", "@stats_histograms", "off"]);
    let out = srv.ok(&["status", "--json"]);
    let json = write_file(d.path(), "status.json", out.as_bytes());
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/control-status.schema.json");
    run(Command::new(PYTHON).args([
        "-c",
        "import json,sys,jsonschema\n\
         s=json.load(open(sys.argv[1])); d=json.load(open(sys.argv[2]))\n\
         jsonschema.validate(d, s, cls=jsonschema.Draft202012Validator)\n\
         print('valid', len(d['devices']))",
        schema.to_str().unwrap(),
        json.to_str().unwrap(),
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let st = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "st")
        .unwrap();
    assert!(st["stats"]["write"]["ios"].as_u64().unwrap() > 0);
    assert_eq!(st["stats"]["write"]["errors"], 0);
    assert!(st["stats"]["write"]["latency"]["p99_ns"].as_u64().unwrap() > 0);
    assert_eq!(
        st["targets"][0]["status"],
        format!("2 {} @lin 1 AA", f.display())
    );
    let z = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "z")
        .unwrap();
    assert!(z["stats"]["read"].get("latency").is_none());
}

/// Only the server's user and root may use the control socket: a peer
/// running as `nobody` is refused, first by the socket's mode, and, once
/// the mode would let it in, by its SO_PEERCRED uid.
#[test]
fn a_peer_of_another_uid_is_refused() {
    let d = scratch("udm-dm-");
    let zt = write_file(d.path(), "z.table", b"0 8 zero\n");
    let srv = DmServer::start(d.path(), &["--table", &format!("z={}", zt.display())]);
    let _ = srv.ok(&["ls"]);
    let mode = std::fs::metadata(&srv.ctl).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "control socket mode");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new(need("setpriv"))
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_udm"))
            .arg("dmsetup")
            .arg("--control")
            .arg(&srv.ctl)
            .args(args)
            .output()
            .unwrap()
    };
    let o = as_nobody(&["ls"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        show(&o)
    );
    std::fs::set_permissions(&srv.ctl, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody(&["remove_all", "--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("permission denied") && err.contains("uid 65534"),
        "{}",
        show(&o)
    );
    // Nothing happened; the owner still may.
    assert!(srv.ok(&["ls"]).starts_with("z\t"));
}

/// `udm serve --metrics HOST:PORT` serves every device's counters as
/// Prometheus text.
#[test]
fn metrics_are_served_as_prometheus_text() {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = scratch("udm-dm-");
    let addr = format!("127.0.0.1:{port}");
    let srv = DmServer::start(d.path(), &["--metrics", &addr]);
    srv.ok(&["create", "z", "--table", "0 2048 zero"]);
    // --no-extents: the zero target reports a hole, which nbdcopy would skip.
    run(Command::new(need("nbdcopy")).args(["--no-extents", &srv.uri("z"), "null:"]));
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    assert!(body.contains("# TYPE udm_requests_total counter"), "{body}");
    let reads = body
        .lines()
        .find(|l| l.starts_with("udm_requests_total{device=\"z\",op=\"read\"}"))
        .unwrap_or_else(|| panic!("no read counter for z:\n{body}"));
    assert!(
        reads.split(' ').nth(1).unwrap().parse::<u64>().unwrap() > 0,
        "{reads}"
    );
    assert!(body.contains("udm_latency_seconds{device=\"z\",op=\"read\",quantile=\"0.99\"}"));
}

/// A client is counted in the open count before it can read the reply that
/// ends its handshake: a `remove` issued the moment the client is through
/// finds the device in use, never removes it under the client.
#[test]
fn a_client_just_through_the_handshake_keeps_its_device() {
    let d = scratch("udm-dm-");
    let srv = DmServer::start(d.path(), &[]);
    for round in 0..5 {
        srv.ok(&["create", "a", "--table", "0 2048 zero"]);
        let mut s = std::os::unix::net::UnixStream::connect(&srv.serve.sock).unwrap();
        assert_eq!(common::nbd::handshake_named(&mut s, "a"), 2048 * 512);
        let e = srv.fails(&["remove", "a"]);
        assert!(e.contains("is open: 1 NBD client"), "round {round}: {e}");
        drop(s);
        wait_for(
            "the client to detach",
            std::time::Duration::from_secs(10),
            || srv.ok(&["info", "a"]).contains("Open count:        0"),
        );
        srv.ok(&["remove", "a"]);
    }
}
