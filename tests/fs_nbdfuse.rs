//! A real filesystem on a udm device: nbdfuse exposes the NBD export as a
//! file, the kernel's loop driver turns it into a block device, and ext4
//! is made, mounted, filled, checked with e2fsck and read back.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

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
        need(t);
    }
    let d = scratch("udm-fs-");
    let p = d.path();
    for i in 0..2 {
        sparse(p, &format!("leg{i}.img"), 64 << 20);
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
    let mut server = Some(UdmServe::start(
        &sock,
        &["--table", &format!("disk={}", table.display())],
    ));

    let fuse_dir = p.join("fuse");
    std::fs::create_dir(&fuse_dir).unwrap();
    let pidfile = p.join("nbdfuse.pid");
    let mut fuse = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(fuse_dir.join("disk"))
        .arg(server.as_ref().unwrap().uri("disk"))
        .spawn()
        .unwrap();
    wait_for("nbdfuse", Duration::from_secs(30), || pidfile.exists());
    let fd = fuse_dir.clone();
    cleanup.0.push(Box::new(move || {
        let _ = Command::new("fusermount3").arg("-u").arg(&fd).status();
        let _ = fuse.wait();
        drop(server.take());
    }));
    let disk = fuse_dir.join("disk");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 128 << 20);

    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk));
    let mnt = p.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount")
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
    run(Command::new("umount").arg(&mnt));
    run(Command::new("e2fsck").args(["-f", "-n"]).arg(&disk));
    run(Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(&disk)
        .arg(&mnt));
    for (i, data) in want.iter().enumerate() {
        let back = std::fs::read(mnt.join(format!("f{i}"))).unwrap();
        assert!(back == *data, "file f{i} differs after remount");
    }
    assert!(Path::new(&mnt).join("lost+found").is_dir());
}
