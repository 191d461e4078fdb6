//! A failed flush stays failed (security 32.7, "fsyncgate"): Linux reports
//! a writeback error once per open file, so without a latch a second NBD
//! FLUSH would succeed over writes that never reached the disk. The disk
//! here is a loop device over a file on a 1 MiB tmpfs: writes land in the
//! page cache, and writeback to the full tmpfs fails for real. Needs root
//! (mount, losetup), as the CI runs.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::nbd::request;
use common::*;

const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;

/// A tmpfs mount and a loop device over a file on it, undone on drop.
struct FullDisk {
    mnt: PathBuf,
    dev: String,
}

impl FullDisk {
    fn new(dir: &Path) -> FullDisk {
        let mnt = dir.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let o = run(Command::new(need("mount"))
            .args(["-t", "tmpfs", "-o", "size=1M", "tmpfs"])
            .arg(&mnt));
        assert!(o.status.success(), "mount a 1 MiB tmpfs: {}", show(&o));
        let back = mnt.join("back");
        std::fs::File::create(&back)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let mut disk = FullDisk {
            mnt,
            dev: String::new(),
        };
        let o = run(Command::new(need("losetup"))
            .args(["-f", "--show"])
            .arg(&back));
        assert!(o.status.success(), "losetup: {}", show(&o));
        disk.dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        disk
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        if !self.dev.is_empty() {
            let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        }
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// Fixed newstyle, NBD_OPT_EXPORT_NAME `name`, no zeroes.
fn connect(sock: &Path, name: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = Vec::new();
    opt.extend_from_slice(b"IHAVEOPT");
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&(name.len() as u32).to_be_bytes());
    opt.extend_from_slice(name.as_bytes());
    s.write_all(&opt).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    s
}

/// Send one request and return the error of its simple reply.
fn call(s: &mut UnixStream, cmd: u16, cookie: u64, len: u32, payload: &[u8]) -> u32 {
    s.write_all(&request(cmd, cookie, 0, len)).unwrap();
    s.write_all(payload).unwrap();
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), cookie);
    u32::from_be_bytes(r[4..8].try_into().unwrap())
}

#[test]
fn a_second_flush_after_a_failed_one_still_fails() {
    let dir = scratch("udm-flush-latch");
    let disk = FullDisk::new(dir.path());
    let sock = dir.path().join("nbd.sock");
    let file = format!("d={}", disk.dev);
    let srv = UdmServe::start(&sock, &["--file", &file, "--no-control"]);
    let mut s = connect(&srv.sock, "d");
    let data = vec![0x55u8; 4 << 20];
    assert_eq!(call(&mut s, CMD_WRITE, 1, data.len() as u32, &data), 0);
    let first = call(&mut s, CMD_FLUSH, 2, 0, &[]);
    assert_ne!(first, 0, "writeback to a full tmpfs must fail the flush");
    // The kernel has reported its error now; only the latch remembers it.
    let second = call(&mut s, CMD_FLUSH, 3, 0, &[]);
    assert_ne!(second, 0, "a second FLUSH reported success for lost writes");
    let mut other = connect(&srv.sock, "d");
    let third = call(&mut other, CMD_FLUSH, 4, 0, &[]);
    assert_ne!(third, 0, "another connection's FLUSH must fail too");
    drop(s);
    drop(other);
    srv.kill9();
}
