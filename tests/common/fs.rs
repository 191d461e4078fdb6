//! A real filesystem on an NBD export: nbdfuse exposes the export as a
//! file, `mount -o loop` turns that file into a block device. Both are
//! undone on drop (unmount first), so a failing test leaves no mount.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use super::{need, run, wait_for};

/// Tools the filesystem tests need.
pub fn need_fs_tools(extra: &[&str]) {
    for t in ["nbdfuse", "fusermount3", "mount", "umount"]
        .iter()
        .chain(extra)
    {
        need(t);
    }
}

/// An NBD export as a file, through nbdfuse.
pub struct FuseDisk {
    dir: PathBuf,
    child: Option<Child>,
}

impl FuseDisk {
    /// Serve `uri` as `<dir>/disk` (dir is created).
    pub fn start(dir: &Path, uri: &str) -> FuseDisk {
        std::fs::create_dir_all(dir).unwrap();
        let pidfile = dir.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(dir.join("disk"))
            .arg(uri)
            .spawn()
            .expect("start nbdfuse");
        wait_for("nbdfuse", Duration::from_secs(30), || pidfile.exists());
        FuseDisk {
            dir: dir.to_path_buf(),
            child: Some(child),
        }
    }

    pub fn disk(&self) -> PathBuf {
        self.dir.join("disk")
    }

    /// Unmount the FUSE file system and wait for nbdfuse to end (its NBD
    /// connection closes, so the server may stop cleanly afterwards).
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.dir)
                .status();
            let _ = c.wait();
        }
    }
}

impl Drop for FuseDisk {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A loop mount of an image file, unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn new(image: &Path, dir: &Path, opts: &str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let o = if opts.is_empty() {
            "loop".to_string()
        } else {
            format!("loop,{opts}")
        };
        run(Command::new("mount").args(["-o", &o]).arg(image).arg(dir));
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    pub fn unmount(mut self) {
        run(Command::new("umount").arg(&self.dir));
        self.mounted = false;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// fsync a file or directory by path.
pub fn fsync(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}
