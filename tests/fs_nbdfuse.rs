//! A real filesystem on a udm device: nbdfuse exposes the NBD export as a
//! file, the kernel's loop driver turns it into a block device, and ext4
//! is made, mounted, filled, checked with e2fsck and read back.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tool(name: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "required tool '{name}' is missing: run scripts/test.sh, which installs it"
    );
}

fn ok(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Cleanup(Vec<Box<dyn FnMut()>>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for f in self.0.iter_mut().rev() {
            f();
        }
    }
}

#[test]
fn ext4_on_a_udm_stack_through_nbdfuse_and_loop() {
    for t in [
        "nbdfuse",
        "fusermount3",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
    ] {
        tool(t);
    }
    let d = tempfile::Builder::new()
        .prefix("udm-fs-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let p = d.path();
    for i in 0..2 {
        std::fs::File::create(p.join(format!("leg{i}.img")))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
    }
    let table = p.join("st.table");
    std::fs::write(
        &table,
        format!(
            "0 {} striped 2 128 {} 0 {} 0\n",
            (128u64 << 20) / 512,
            p.join("leg0.img").display(),
            p.join("leg1.img").display()
        ),
    )
    .unwrap();
    let sock = p.join("s.sock");
    let mut cleanup = Cleanup(Vec::new());
    let mut server = Command::new(env!("CARGO_BIN_EXE_udm"))
        .args(["serve", "--socket", sock.to_str().unwrap()])
        .args(["--table", &format!("disk={}", table.display())])
        .env("UDM_LOG", "warn")
        .spawn()
        .unwrap();
    wait_for("udm serve", || UnixStream::connect(&sock).is_ok());

    let fuse_dir = p.join("fuse");
    std::fs::create_dir(&fuse_dir).unwrap();
    let pidfile = p.join("nbdfuse.pid");
    let mut fuse = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(fuse_dir.join("disk"))
        .arg(format!("nbd+unix:///disk?socket={}", sock.display()))
        .spawn()
        .unwrap();
    wait_for("nbdfuse", || pidfile.exists());
    let fd = fuse_dir.clone();
    cleanup.0.push(Box::new(move || {
        let _ = Command::new("fusermount3").arg("-u").arg(&fd).status();
        let _ = fuse.wait();
        let _ = server.kill();
        let _ = server.wait();
    }));
    let disk = fuse_dir.join("disk");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 128 << 20);

    ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk));
    let mnt = p.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    ok(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&disk)
        .arg(&mnt));
    let m = mnt.clone();
    cleanup.0.push(Box::new(move || {
        let _ = Command::new("umount").arg(&m).status();
    }));
    // A few files with distinct contents, then unmount (flushes through NBD).
    let mut want = Vec::new();
    for i in 0..8u32 {
        let data: Vec<u8> = (0..(1u32 << 20) + i * 4099)
            .map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 13) as u8)
            .collect();
        std::fs::write(mnt.join(format!("f{i}")), &data).unwrap();
        want.push(data);
    }
    ok(Command::new("umount").arg(&mnt));
    ok(Command::new("e2fsck").args(["-f", "-n"]).arg(&disk));
    ok(Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(&disk)
        .arg(&mnt));
    for (i, data) in want.iter().enumerate() {
        let back = std::fs::read(mnt.join(format!("f{i}"))).unwrap();
        assert!(back == *data, "file f{i} differs after remount");
    }
    assert!(Path::new(&mnt).join("lost+found").is_dir());
}
