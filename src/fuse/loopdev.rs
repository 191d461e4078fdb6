//! The loop driver's ioctls (loop(4)), for the block nodes of
//! `serve --mapper-block`: a free loop device bound to an open file, its
//! capacity read again after a resize, and its release, which tells
//! whether someone else still holds the device open.
//!
//! The kernel's structures are written out here because libc has none of
//! them; the numbers are those of `<linux/loop.h>`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;

const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` (LOOP_CONFIGURE, Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

impl LoopInfo64 {
    fn zeroed() -> LoopInfo64 {
        LoopInfo64 {
            device: 0,
            inode: 0,
            rdevice: 0,
            offset: 0,
            sizelimit: 0,
            number: 0,
            encrypt_type: 0,
            encrypt_key_size: 0,
            flags: 0,
            file_name: [0; 64],
            crypt_name: [0; 64],
            encrypt_key: [0; 32],
            init: [0; 2],
        }
    }
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The node of loop device `n`.
pub fn node(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

/// Bind a free loop device to `file` (read-only if asked; its logical
/// block size `block_size`, 512 or more). Another process may take the
/// free device between the two ioctls, so a device found taken is
/// skipped for the next free one.
pub fn attach(file: &File, read_only: bool, block_size: u32) -> io::Result<u32> {
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last = io::Error::from_raw_os_error(libc::EBUSY);
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument; the descriptor is
        // open for the call.
        let n = check(unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) })? as u32;
        let dev = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(node(n))?;
        let mut info = LoopInfo64::zeroed();
        if read_only {
            info.flags |= LO_FLAGS_READ_ONLY;
        }
        let cfg = LoopConfig {
            fd: file.as_raw_fd() as u32,
            block_size: block_size.max(512),
            info,
            reserved: [0; 8],
        };
        // SAFETY: `cfg` is a valid `struct loop_config` that lives across
        // the call; the kernel only reads it.
        match check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg) }) {
            Ok(_) => return Ok(n),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// The loop device `n` reads its file's size again (after a resize).
pub fn set_capacity(n: u32) -> io::Result<()> {
    let dev = File::open(node(n))?;
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_CAPACITY, 0) })?;
    Ok(())
}

/// The loop device's size in bytes, from sysfs.
pub fn size(n: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/sys/block/loop{n}/size")).ok()?;
    s.trim().parse::<u64>().ok().map(|sectors| sectors * 512)
}

/// The file loop device `n` is bound to, if it is bound.
pub fn backing_file(n: u32) -> Option<PathBuf> {
    let s = std::fs::read_to_string(format!("/sys/block/loop{n}/loop/backing_file")).ok()?;
    Some(PathBuf::from(s.trim_end_matches('\n')))
}

/// Every bound loop device and its file.
pub fn bound() -> Vec<(u32, PathBuf)> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let n = name.to_str()?.strip_prefix("loop")?.parse::<u32>().ok()?;
        Some((n, backing_file(n)?))
    })
    .collect()
}

/// How a release went.
#[derive(Debug, PartialEq, Eq)]
pub enum Released {
    /// The device is free; its file is let go.
    Done,
    /// Someone else holds it open: it is left bound (`autoclear` false) or
    /// goes when its last opener closes it (`autoclear` true).
    Busy,
}

/// Let loop device `n` go. The kernel only marks a device that others
/// hold open for release at their last close, so whether it went shows
/// after our own descriptor closes; a busy device is then bound again for
/// good unless `autoclear` asks for the release at that last close (dm's
/// deferred remove, or a forced one).
pub fn release(n: u32, autoclear: bool) -> io::Result<Released> {
    let dev = match File::open(node(n)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Released::Done),
        Err(e) => return Err(e),
    };
    // SAFETY: LOOP_CLR_FD takes no argument.
    match check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD, 0) }) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(Released::Done),
        Err(e) => return Err(e),
    }
    drop(dev);
    if backing_file(n).is_none() {
        return Ok(Released::Done);
    }
    if !autoclear {
        set_autoclear(n, false)?;
        // Its last other opener may have closed it meanwhile.
        if backing_file(n).is_none() {
            return Ok(Released::Done);
        }
    }
    Ok(Released::Busy)
}

/// Turn the loop device's release at last close on or off.
pub fn set_autoclear(n: u32, on: bool) -> io::Result<()> {
    let dev = match File::open(node(n)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut info = LoopInfo64::zeroed();
    // SAFETY: `info` is a writable `struct loop_info64` that lives across
    // the call.
    match check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, &mut info) }) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(()),
        Err(e) => return Err(e),
    }
    if on {
        info.flags |= LO_FLAGS_AUTOCLEAR;
    } else {
        info.flags &= !LO_FLAGS_AUTOCLEAR;
    }
    // SAFETY: `info` is a valid `struct loop_info64`, read by the kernel.
    match check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64, &info) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `file` (a loop device's backing file, as sysfs names it) lies
/// in `dir`.
pub fn is_under(file: &Path, dir: &Path) -> bool {
    file.starts_with(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn files_under_a_directory() {
        assert!(is_under(
            Path::new("/run/x/files/v"),
            Path::new("/run/x/files")
        ));
        assert!(!is_under(
            Path::new("/run/x/filesv"),
            Path::new("/run/x/files")
        ));
        assert_eq!(node(7), PathBuf::from("/dev/loop7"));
    }
}
