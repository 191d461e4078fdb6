//! `udm serve --mapper-dir FILES --mapper-block DIR`: every device also
//! as DIR/NAME, a symlink to a loop device on its file, as /dev/mapper is
//! on a udev system. Driven by real tools (blockdev, dd) and plain calls:
//! the node is a block device when create replies, reads the device's
//! bytes, follows a resize, makes a remove busy while open, and goes with
//! the remove; a server that stops or is killed leaves no loop device.
//! Needs root, /dev/fuse and the loop driver.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// Loop devices bound to a file under `dir`, from sysfs.
fn loops_under(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(f) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(f.trim_end()).starts_with(dir) {
            out.push((name, f.trim_end().to_string()));
        }
    }
    out
}

/// Releases what a failing test leaves: loop devices on the files, the
/// files' mount.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (dev, _) in loops_under(&self.0) {
            let _ = Command::new("losetup")
                .args(["-d", &format!("/dev/{dev}")])
                .status();
        }
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

struct Server {
    dir: tempfile::TempDir,
    files: PathBuf,
    block: PathBuf,
    ctl: PathBuf,
    srv: Option<UdmServe>,
    _cleanup: Cleanup,
}

impl Server {
    fn start(tag: &str) -> Server {
        need("blockdev");
        need("losetup");
        let dir = scratch(tag);
        let d = dir.path().canonicalize().unwrap();
        let (files, block, ctl) = (d.join("files"), d.join("block"), d.join("ctl"));
        let cleanup = Cleanup(files.clone());
        let srv = start_server(&d, &files, &block, &ctl, &[]);
        Server {
            dir,
            files,
            block,
            ctl,
            srv: Some(srv),
            _cleanup: cleanup,
        }
    }

    fn dmsetup(&self, args: &[&str]) -> std::process::Output {
        udm()
            .arg("dmsetup")
            .args(args)
            .env("UDM_CONTROL", &self.ctl)
            .output()
            .unwrap()
    }

    fn node(&self, name: &str) -> PathBuf {
        self.block.join(name)
    }
}

fn start_server(d: &Path, files: &Path, block: &Path, ctl: &Path, more: &[String]) -> UdmServe {
    let mut args = vec![
        "--control".to_string(),
        ctl.display().to_string(),
        "--mapper-dir".to_string(),
        files.display().to_string(),
        "--mapper-block".to_string(),
        block.display().to_string(),
    ];
    args.extend(more.iter().cloned());
    let sock = d.join(format!("nbd{}.sock", more.len()));
    let srv = UdmServe::start(&sock, &args);
    wait_for("the control socket", Duration::from_secs(10), || {
        ctl.exists()
    });
    srv
}

fn is_block(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

fn size64(p: &Path) -> u64 {
    run_text(Command::new("blockdev").arg("--getsize64").arg(p))
        .trim()
        .parse()
        .unwrap()
}

fn ok(o: std::process::Output) {
    assert!(o.status.success(), "{}", show(&o));
}

#[test]
fn a_node_follows_its_device_from_create_to_remove() {
    let mut s = Server::start("mapper-block");
    let d = s.dir.path().to_path_buf();
    let data = fast_bytes(7, 8 << 20);
    let img = write_file(&d, "disk.img", &data);
    let table = |mib: u64| format!("0 {} linear {} 0", mib * 2048, img.display());
    ok(s.dmsetup(&["create", "v", "--table", &table(4)]));
    // Right when create replies: a symlink to a block device.
    let node = s.node("v");
    assert!(node.is_symlink(), "{} is not a symlink", node.display());
    let target = std::fs::read_link(&node).unwrap();
    assert!(
        target.to_string_lossy().starts_with("/dev/loop"),
        "{target:?}"
    );
    assert!(is_block(&node), "not a block device");
    assert_eq!(size64(&node), 4 << 20);
    let out = d.join("out");
    run(Command::new("dd")
        .arg(format!("if={}", node.display()))
        .arg(format!("of={}", out.display()))
        .args(["bs=64k", "status=none"]));
    assert!(std::fs::read(&out).unwrap() == data[..4 << 20], "dd read");

    // A resize shows on the node.
    ok(s.dmsetup(&["load", "v", "--table", &table(8)]));
    ok(s.dmsetup(&["suspend", "v"]));
    ok(s.dmsetup(&["resume", "v"]));
    assert_eq!(size64(&node), 8 << 20, "the node kept the old size");
    let info = String::from_utf8_lossy(&s.dmsetup(&["info", "v"]).stdout).into_owned();
    assert!(info.contains("Open count:        0"), "{info}");

    // Open, the node makes a remove busy, as an open dm device does.
    let held = std::fs::File::open(&node).unwrap();
    let o = s.dmsetup(&["remove", "v"]);
    assert!(!o.status.success(), "removed while open");
    assert!(is_block(&node), "the node went with a failed remove");
    drop(held);
    ok(s.dmsetup(&["remove", "v"]));
    assert!(
        !node.exists() && !node.is_symlink(),
        "the node outlived the device"
    );
    assert!(loops_under(&s.files).is_empty(), "loop devices left");

    // A read-only device gets a read-only node.
    ok(s.dmsetup(&["create", "r", "--readonly", "--table", &table(4)]));
    let ro = run_text(Command::new("blockdev").arg("--getro").arg(s.node("r")));
    assert_eq!(ro.trim(), "1");
    let code = s.srv.take().unwrap().stop();
    assert_eq!(code, Some(0));
    assert!(
        loops_under(&s.files).is_empty(),
        "loop devices left at stop"
    );
    assert!(!s.node("r").is_symlink(), "a link left at stop");
}

#[test]
fn a_killed_servers_loop_devices_go_at_the_next_start() {
    let mut s = Server::start("mapper-block-kill");
    let d = s.dir.path().canonicalize().unwrap();
    let img = write_file(&d, "disk.img", &fast_bytes(3, 1 << 20));
    let table = format!("0 2048 linear {} 0", img.display());
    ok(s.dmsetup(&["create", "v", "--table", &table]));
    assert!(is_block(&s.node("v")));
    s.srv.take().unwrap().kill9();
    assert_eq!(loops_under(&s.files).len(), 1, "the loop should be left");

    let file = format!("w={}", img.display());
    let srv = start_server(&d, &s.files, &s.block, &s.ctl, &["--file".into(), file]);
    wait_for("the new node", Duration::from_secs(10), || {
        is_block(&s.node("w"))
    });
    assert!(!s.node("v").is_symlink(), "the old link is still there");
    let left = loops_under(&s.files);
    assert_eq!(left.len(), 1, "old and new loop devices: {left:?}");
    assert!(left[0].1.ends_with("/w"), "{left:?}");
    assert_eq!(srv.stop(), Some(0));
    assert!(loops_under(&s.files).is_empty(), "loop devices left");
}
