//! Which disk a partition belongs to, from sysfs.
//!
//! TrueCrypt's system encryption keeps its header in the boot track of
//! the whole drive (sector 62), not in the encrypted partition, and the
//! partition's data starts at its own sector 0 while the IVs count from
//! the drive's start. So opening a system *partition* means reading the
//! header from its parent disk, as cryptsetup does. Without udev there may
//! be no `/dev/block/MAJ:MIN` links, so the parent is named from its sysfs
//! directory (`/sys/dev/block/MAJ:MIN` resolves to `.../loop0/loop0p3`,
//! whose parent directory is the disk `loop0`, i.e. `/dev/loop0`).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A partition block device and the disk it is part of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The whole disk's device node.
    pub disk: PathBuf,
    /// Where the partition starts on the disk, in 512-byte sectors.
    pub start: u64,
}

/// `path`'s partition facts if it is a partition block device; `None` for
/// files, whole disks, or when sysfs does not say.
pub fn of(path: &Path) -> Option<Partition> {
    from_sysfs(&sysfs_dir(path)?, Path::new("/dev"))
}

/// A block device's sysfs directory (`/sys/dev/block/MAJ:MIN`); `None`
/// for anything that is not a block device.
fn sysfs_dir(path: &Path) -> Option<PathBuf> {
    let md = std::fs::metadata(path).ok()?;
    if !md.file_type().is_block_device() {
        return None;
    }
    let rdev = md.rdev();
    Some(PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    )))
}

/// The partition of whole-disk `disk` that starts at sector `start` and
/// is `size` sectors long, as cryptsetup looks for a TrueCrypt system
/// partition when given the drive.
pub fn find(disk: &Path, start: u64, size: u64) -> Option<PathBuf> {
    find_in(&sysfs_dir(disk)?, start, size).map(|n| Path::new("/dev").join(n))
}

/// [`find`] on a sysfs-shaped directory: the name of the child with
/// that start and size.
fn find_in(sys: &Path, start: u64, size: u64) -> Option<std::ffi::OsString> {
    let num = |p: PathBuf| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    std::fs::read_dir(sys).ok()?.flatten().find_map(|e| {
        let p = e.path();
        let hit = p.join("partition").exists()
            && num(p.join("start")) == Some(start)
            && num(p.join("size")) == Some(size);
        hit.then(|| e.file_name())
    })
}

/// The lookup itself, on a sysfs-shaped directory `sys` (tests use a
/// fake one) with device nodes under `dev`.
fn from_sysfs(sys: &Path, dev: &Path) -> Option<Partition> {
    // Only partitions have a `partition` attribute.
    std::fs::metadata(sys.join("partition")).ok()?;
    let start = std::fs::read_to_string(sys.join("start"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let real = std::fs::canonicalize(sys).ok()?;
    let disk = real.parent()?.file_name()?;
    Some(Partition {
        disk: dev.join(disk),
        start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_names_its_disk_and_start() {
        let d = tempfile::tempdir().unwrap();
        let part = d.path().join("devices/block/loop7/loop7p3");
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("partition"), "3\n").unwrap();
        std::fs::write(part.join("start"), "67584\n").unwrap();
        let link = d.path().join("259:2");
        std::os::unix::fs::symlink(&part, &link).unwrap();
        assert_eq!(
            from_sysfs(&link, Path::new("/dev")),
            Some(Partition {
                disk: PathBuf::from("/dev/loop7"),
                start: 67584
            })
        );
    }

    #[test]
    fn the_partition_with_that_start_and_size_is_found() {
        let d = tempfile::tempdir().unwrap();
        for (name, start, size) in [("loop7p1", 2048, 32768), ("loop7p3", 67584, 32768)] {
            let p = d.path().join(name);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("partition"), "1\n").unwrap();
            std::fs::write(p.join("start"), format!("{start}\n")).unwrap();
            std::fs::write(p.join("size"), format!("{size}\n")).unwrap();
        }
        std::fs::create_dir_all(d.path().join("queue")).unwrap();
        assert_eq!(find_in(d.path(), 67584, 32768), Some("loop7p3".into()));
        assert_eq!(find_in(d.path(), 67584, 100), None);
    }

    #[test]
    fn a_whole_disk_or_a_file_is_not_a_partition() {
        let d = tempfile::tempdir().unwrap();
        let disk = d.path().join("devices/block/loop7");
        std::fs::create_dir_all(&disk).unwrap();
        std::fs::write(disk.join("size"), "100\n").unwrap();
        assert_eq!(from_sysfs(&disk, Path::new("/dev")), None);
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(of(&f), None);
    }
}
