//! dmsetup's smaller details through `udm dmsetup`, compared with the
//! formats of dmsetup itself (the installed binary's where it works
//! without the kernel's device-mapper: `version`'s library line,
//! `splitname`, `info -c -o help`).

mod common;

use std::process::Command;

use common::dm::DmServer;
use common::*;

fn real_dmsetup(args: &[&str]) -> std::process::Output {
    Command::new(need("dmsetup"))
        .args(args)
        .output()
        .expect("run dmsetup")
}

#[test]
fn version_lines_are_dmsetups_with_a_driver_scripts_accept() {
    let d = scratch("udm-dmd-");
    let srv = DmServer::start(d.path(), &[]);
    let out = srv.ok(&["version"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    // The same label and layout as dmsetup's library line.
    let real = String::from_utf8_lossy(&real_dmsetup(&["version"]).stdout).into_owned();
    let real_lib = real.lines().next().unwrap();
    assert_eq!(lines[0][..19], real_lib[..19], "{out}\n{real}");
    // A script's check: the third word of the Driver line is ≥ 4.x.
    let drv = lines[1]
        .strip_prefix("Driver version:    ")
        .expect(lines[1]);
    let major: u32 = drv.split('.').next().unwrap().parse().unwrap();
    assert!(major >= 4 && drv.split('.').count() == 3, "{drv}");
    assert!(srv.ok(&["-v", "version"]).contains("control protocol"));
}

#[test]
fn splitname_and_field_help_match_dmsetup() {
    let d = scratch("udm-dmd-");
    let srv = DmServer::start(d.path(), &[]);
    for args in [
        &["splitname", "vg-lv_da--ta"][..],
        &[
            "splitname",
            "vg-lv-layer",
            "LVM",
            "--noheadings",
            "--separator",
            ":",
        ],
        &["splitname", "a-b", "CRYPT"],
    ] {
        let ours = srv.ok(args);
        let real = real_dmsetup(args);
        assert!(real.status.success(), "{}", show(&real));
        assert_eq!(ours, String::from_utf8_lossy(&real.stdout), "{args:?}");
    }
    // `-o help` goes to stderr, as dmsetup's; every field udm reports is
    // listed there in dmsetup's words.
    let o = srv.run(&["info", "-c", "-o", "help"]);
    assert!(o.status.success(), "{}", show(&o));
    let ours = String::from_utf8_lossy(&o.stderr).into_owned();
    let real =
        String::from_utf8_lossy(&real_dmsetup(&["info", "-c", "-o", "help"]).stderr).into_owned();
    for line in ours.lines().filter(|l| l.starts_with("  ")) {
        assert!(real.lines().any(|r| r == line), "not dmsetup's: {line:?}");
    }
    assert!(ours.lines().filter(|l| l.starts_with("  ")).count() >= 30);
}

#[test]
fn fields_read_ahead_concise_exec_and_repeats() {
    let d = scratch("udm-dmd-");
    let srv = DmServer::start(d.path(), &[]);
    let img = sparse(d.path(), "disk.img", 4 << 20);
    srv.ok(&[
        "create",
        "vg-base",
        "-u",
        "LVM-abc",
        "--table",
        &format!("0 8192 linear {} 0", img.display()),
    ]);
    srv.ok(&[
        "create",
        "top",
        "--table",
        "0 4096 linear /dev/mapper/vg-base 0",
    ]);
    // info: the Read Ahead line, after State, as dmsetup.
    let info = srv.ok(&["info", "top"]);
    let lines: Vec<&str> = info.lines().collect();
    assert_eq!(lines[1], "State:             ACTIVE");
    assert_eq!(lines[2], "Read Ahead:        256");
    // The relationship and name-component fields.
    let row = srv.ok(&[
        "info",
        "-c",
        "--noheadings",
        "--separator",
        "|",
        "-o",
        "name,subsystem,vg_name,lv_name,names_using_dev,device_ref_count,blkdevs_used,read_ahead",
        "vg-base",
    ]);
    assert_eq!(
        row.trim(),
        format!("vg-base|LVM|vg|base|top|1|{}|256", img.display())
    );
    let e = srv.fails(&["info", "-c", "-o", "name,read_count"]);
    assert!(e.contains("read_count"), "{e}");
    let pre = srv.ok(&[
        "info",
        "-c",
        "--noheadings",
        "--nameprefixes",
        "--unquoted",
        "-o",
        "name,open",
        "top",
    ]);
    assert_eq!(pre.trim(), "DM_NAME=top DM_OPEN=0");

    // table --concise, and create --concise from it.
    let concise = srv.ok(&["table", "--concise", "top"]);
    assert_eq!(
        concise,
        format!("top,,1,rw,0 4096 linear /dev/mapper/vg-base 0\n")
    );
    srv.ok(&[
        "create",
        "--concise",
        "c1,,,ro,0 8 zero,8 8 error;c2,CRYPT-x,,rw,0 16 zero",
    ]);
    let t = srv.ok(&["table", "c1"]);
    assert_eq!(t, "0 8 zero \n8 8 error \n", "{t}");
    assert!(srv.ok(&["info", "c1"]).contains("(READ-ONLY)"));
    assert!(srv.ok(&["info", "c2"]).contains("UUID: CRYPT-x"));
    let e = srv.fails(&["create", "--concise", "c3,,7,rw,0 8 zero"]);
    assert!(e.contains("minor"), "{e}");

    // ls --exec runs the command per device with its /dev/mapper path.
    let log = d.path().join("exec.log");
    let script = d.path().join("rec.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$1 $2\" >> {}\n", log.display()),
    )
    .unwrap();
    run(Command::new("chmod").arg("+x").arg(&script));
    let out = srv
        .cmd()
        .env("DM_DEV_DIR", "/devx")
        .args(["ls", "--exec", &format!("{} arg", script.display())])
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        show(&out)
    );
    let mut seen: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "arg /devx/mapper/c1",
            "arg /devx/mapper/c2",
            "arg /devx/mapper/top",
            "arg /devx/mapper/vg-base"
        ]
    );

    // --count: the report that many times.
    let twice = srv.ok(&[
        "info",
        "-c",
        "--noheadings",
        "-o",
        "name",
        "--count",
        "2",
        "--interval",
        "0",
        "top",
    ]);
    assert_eq!(twice, "top             \ntop             \n");
    let e = srv.fails(&["remove", "--count", "2", "top"]);
    assert!(e.contains("--count"), "{e}");
    // -v after a change shows the device, as dmsetup.
    assert!(srv
        .ok(&["-v", "suspend", "top"])
        .contains("State:             SUSPENDED"));
    srv.ok(&["resume", "top"]);
}

#[test]
fn options_that_cannot_work_are_refused_by_name() {
    let d = scratch("udm-dmd-");
    let srv = DmServer::start(d.path(), &[]);
    for (args, name) in [
        (
            &["create", "x", "--readahead", "512", "--table", "0 8 zero"][..],
            "--readahead",
        ),
        (
            &["create", "x", "--addnodeoncreate", "--table", "0 8 zero"],
            "--addnodeoncreate",
        ),
        (&["resume", "--addnodeonresume", "x"], "--addnodeonresume"),
        (&["--checks", "ls"], "--checks"),
        (&["--manglename", "hex", "ls"], "--manglename"),
        (&["-v", "ls"], "-v"),
    ] {
        let e = srv.fails(args);
        assert!(e.contains(name), "{args:?}: {e}");
    }
    // Those whose request is what udm does anyway are taken.
    srv.ok(&["create", "x", "--noudevsync", "--table", "0 8 zero"]);
    srv.ok(&["suspend", "--nolockfs", "x"]);
    srv.ok(&["resume", "x"]);
    srv.ok(&["remove", "--retry", "x"]);
    let cookie = srv.ok(&["udevcreatecookie"]);
    assert!(
        cookie.trim().len() == 10 && cookie.starts_with("0x0D4D"),
        "{cookie}"
    );
    srv.ok(&["udevreleasecookie", cookie.trim()]);
    // dmstats' group commands do not exist in udm: said, not ignored.
    let e = srv.fails(&["stats", "group", "x"]);
    assert!(e.contains("stats group") && e.contains("create"), "{e}");
}
