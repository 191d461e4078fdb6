//! Block nodes for the devices (`serve --mapper-dir FILES --mapper-block
//! DIR`): each device's file gets a loop device, and DIR/NAME is a
//! symlink to it, as /dev/mapper/NAME is a symlink to ../dm-N on a udev
//! system. Scripts that test `[ -b /dev/mapper/NAME ]`, run `blockdev` or
//! open the device `O_DIRECT` then find a block device.
//!
//! The node follows the device: it is there before the create or resume
//! that exported the device replies, its size follows a resize
//! (LOOP_SET_CAPACITY), and it goes before a remove completes; a node
//! someone holds open makes the remove fail as busy, as an open dm device
//! does. The loop device holds the file open, so it is one of the
//! export's openers; [`BlockNodes::holds`] tells it apart from clients.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::loopdev::{self, Released};
use crate::nbd::ExportSet;

/// The loop devices of one mapper directory's files, with their symlinks.
pub struct BlockNodes {
    /// Where the symlinks go.
    dir: PathBuf,
    /// The FUSE mount holding the files.
    files: PathBuf,
    exports: Arc<ExportSet>,
    /// Device name → loop device number.
    loops: Mutex<HashMap<String, u32>>,
}

/// How long a remove waits for the loop device's hold on the file to end
/// (the kernel sends FUSE's release after the loop lets the file go).
const RELEASE_WAIT: Duration = Duration::from_secs(5);

impl BlockNodes {
    /// Clear what a killed server left for `files` and `dir` (loop devices
    /// on files under `files`, symlinks in `dir` to loop devices), and
    /// make `dir` if it is missing. Runs before the files are mounted:
    /// sysfs names the dead mount's files by their old paths only while
    /// the mount is still in place.
    pub fn clear_stale(files: &Path, dir: &Path) -> Result<(), String> {
        let shown = dir.display();
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("--mapper-block {shown}: cannot create it: {e}"))?;
        let files = canonical(files);
        for (n, file) in loopdev::bound() {
            if loopdev::is_under(&file, &files) {
                match loopdev::release(n, true) {
                    Ok(_) => tracing::info!(
                        "--mapper-block: released /dev/loop{n} of an earlier server ({})",
                        file.display()
                    ),
                    Err(e) => tracing::warn!("--mapper-block: /dev/loop{n}: {e}"),
                }
            }
        }
        let entries = std::fs::read_dir(dir).map_err(|e| format!("--mapper-block {shown}: {e}"))?;
        for e in entries.flatten() {
            let is_loop = std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/dev/loop"));
            if is_loop {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(())
    }

    pub fn new(files: &Path, dir: &Path, exports: Arc<ExportSet>) -> BlockNodes {
        BlockNodes {
            dir: dir.to_path_buf(),
            files: canonical(files),
            exports,
            loops: Mutex::default(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn loops(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.loops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The loop device of `name`, while it is still bound to one of our
    /// files (a device that let its file go may be another program's by
    /// now: its number is free for anyone).
    fn loop_of(&self, name: &str) -> Option<u32> {
        let mut loops = self.loops();
        let n = *loops.get(name)?;
        if loopdev::backing_file(n).is_some_and(|f| loopdev::is_under(&f, &self.files)) {
            return Some(n);
        }
        loops.remove(name);
        let _ = std::fs::remove_file(self.dir.join(name));
        None
    }

    /// The device `name` is exported: give it a node, or bring its node's
    /// size to the device's.
    pub fn present(&self, name: &str) -> Result<(), String> {
        let Some(e) = self.exports.find(name.as_bytes()) else {
            return Ok(());
        };
        if !super::files::listable(name) {
            return Ok(());
        }
        let size = e.export.device.size();
        if let Some(n) = self.loop_of(name) {
            if loopdev::size(n) != Some(size) {
                loopdev::set_capacity(n)
                    .map_err(|err| format!("/dev/loop{n} of '{name}': cannot resize it: {err}"))?;
            }
            return Ok(());
        }
        let ro = e.export.is_read_only();
        let block = e.export.device.limits().logical_block_size;
        drop(e);
        let path = self.files.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(!ro)
            .open(&path)
            .map_err(|err| format!("'{name}': cannot open {}: {err}", path.display()))?;
        let n = loopdev::attach(&file, ro, block).map_err(|err| {
            format!(
                "'{name}': no loop device for its block node: {err} (is the loop driver loaded?)"
            )
        })?;
        drop(file);
        let link = self.dir.join(name);
        let _ = std::fs::remove_file(&link);
        if let Err(err) = std::os::unix::fs::symlink(loopdev::node(n), &link) {
            let _ = loopdev::release(n, true);
            return Err(format!("'{name}': cannot make {}: {err}", link.display()));
        }
        self.loops().insert(name.to_string(), n);
        tracing::debug!("{} -> /dev/loop{n}", link.display());
        Ok(())
    }

    /// Every exported device gets its node (the devices of the command
    /// line, exported before the files were mounted).
    pub fn present_all(&self) -> Result<(), String> {
        for e in self.exports.list() {
            self.present(&e.export.name)?;
        }
        Ok(())
    }

    /// How many openers of `name`'s file are its node (0 or 1).
    pub fn holds(&self, name: &str) -> usize {
        self.loop_of(name).is_some() as usize
    }

    /// The node of `name` goes (the device is about to be removed). A node
    /// someone holds open stays and the answer is why, unless `force`
    /// (then it goes when they close it, and their I/O fails meanwhile).
    /// Returns once the loop device has let the file go.
    pub fn release(&self, name: &str, force: bool) -> Result<(), String> {
        let Some(n) = self.loop_of(name) else {
            return Ok(());
        };
        let before = self
            .exports
            .find(name.as_bytes())
            .map_or(0, |e| e.connections());
        match loopdev::release(n, force) {
            Ok(Released::Done) => {}
            Ok(Released::Busy) if force => {}
            Ok(Released::Busy) => {
                return Err(format!(
                    "device '{name}' is open: its block node /dev/loop{n} is in use"
                ))
            }
            Err(e) => return Err(format!("'{name}': cannot release /dev/loop{n}: {e}")),
        }
        self.loops().remove(name);
        let _ = std::fs::remove_file(self.dir.join(name));
        self.wait_for_file_release(name, before);
        Ok(())
    }

    /// Mark `name`'s node to go when its last opener closes it (dm's
    /// deferred remove): the file is then let go, and the device with it.
    pub fn release_when_closed(&self, name: &str) -> Result<(), String> {
        let Some(n) = self.loop_of(name) else {
            return Ok(());
        };
        match loopdev::release(n, true) {
            Ok(Released::Done) => {
                self.loops().remove(name);
                let _ = std::fs::remove_file(self.dir.join(name));
                Ok(())
            }
            Ok(Released::Busy) => Ok(()),
            Err(e) => Err(format!("'{name}': cannot release /dev/loop{n}: {e}")),
        }
    }

    /// The deferred remove was cancelled: the node stays after its last
    /// close.
    pub fn keep(&self, name: &str) {
        if let Some(n) = self.loop_of(name) {
            if let Err(e) = loopdev::set_autoclear(n, false) {
                tracing::warn!("'{name}': /dev/loop{n}: {e}");
            }
        }
    }

    /// The loop device let the file go; FUSE's release of it comes after,
    /// and the export's openers count it until then.
    fn wait_for_file_release(&self, name: &str, before: usize) {
        let start = Instant::now();
        while start.elapsed() < RELEASE_WAIT {
            let now = self
                .exports
                .find(name.as_bytes())
                .map_or(0, |e| e.connections());
            if now < before || now == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        tracing::warn!("'{name}': its file was not released after {RELEASE_WAIT:?}");
    }

    /// The device was renamed: so is its node.
    pub fn renamed(&self, old: &str, new: &str) {
        let Some(n) = self.loops().remove(old) else {
            return;
        };
        let _ = std::fs::remove_file(self.dir.join(old));
        if super::files::listable(new) {
            let link = self.dir.join(new);
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(loopdev::node(n), &link) {
                tracing::warn!("cannot make {}: {e}", link.display());
            }
        }
        self.loops().insert(new.to_string(), n);
    }

    /// Release every node (the server stops): a node still open goes when
    /// it is closed.
    pub fn release_all(&self) {
        let names: Vec<String> = self.loops().keys().cloned().collect();
        for name in names {
            let Some(n) = self.loop_of(&name) else {
                continue;
            };
            self.loops().remove(&name);
            let _ = std::fs::remove_file(self.dir.join(&name));
            if let Err(e) = loopdev::release(n, true) {
                tracing::warn!("'{name}': cannot release /dev/loop{n}: {e}");
            }
        }
    }
}

/// `p` with its parent's links resolved: the mount point itself may be a
/// dead FUSE mount that cannot be looked at.
fn canonical(p: &Path) -> PathBuf {
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => dir
            .canonicalize()
            .map(|d| d.join(name))
            .unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    }
}
