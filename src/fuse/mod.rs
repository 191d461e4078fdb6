//! The second front end: every device of the server as a regular file in
//! a mapper directory (`udm serve --mapper-dir DIR`), served over FUSE.
//!
//! Layout, each file using only those before it: [`mount`] (the mount
//! point: stale mounts, detaching), `io` (file operations into the engine
//! as `engine::Request`s, and the `Sink` that answers them), `files` (what
//! the directory shows: inodes, sizes, modes from the allow rules), `fs`
//! (the FUSE operations); `tuning` (the FUSE choices, each a `UDM_FUSE_*`
//! knob so a benchmark can turn it off) uses none of them. With
//! `--mapper-block`, [`block`] gives each file a loop device (`loopdev`,
//! the loop driver's ioctls) and a symlink to it.
//!
//! It sits above `nbd` because the export set it shows (names, devices,
//! allow rules, the connection count that makes `dmsetup remove` see a
//! device busy) lives there; it uses the export set only, never an NBD
//! connection, and requests go straight from the FUSE session to the
//! engine.

pub mod block;
mod files;
mod fs;
mod io;
mod loopdev;
pub mod mount;
mod tuning;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::nbd::ExportSet;

pub use tuning::MAX_IO;

/// A mounted mapper directory. Dropping it detaches the mount and waits
/// for the requests in flight, so the server drops it before its final
/// flush (`cli/serve.rs`, on `ServerEvent::Stopping`).
pub struct MapperDir {
    dir: PathBuf,
    unmounter: fuser::SessionUnmounter,
    engine: Arc<crate::engine::Engine>,
    replies: Arc<io::Replies>,
    session: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    block: Option<Arc<block::BlockNodes>>,
}

/// How long shutdown waits for the file requests in flight (a store that
/// stopped answering must not keep the server from exiting).
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

impl MapperDir {
    /// Mount the files of `exports` at `dir` (created if missing; a dead
    /// mount from a killed server is detached first), and with `block`
    /// give every device a loop device linked from `block/NAME`.
    pub fn mount(
        dir: &Path,
        exports: Arc<ExportSet>,
        block: Option<&Path>,
    ) -> Result<MapperDir, String> {
        if let Some(b) = block {
            block::BlockNodes::clear_stale(dir, b)?;
        }
        mount::prepare(dir)?;
        let engine = exports.engine().clone();
        let front = io::Front::new(engine.clone());
        let replies = front.replies();
        let tuning = tuning::Tuning::from_env()
            .map_err(|e| format!("--mapper-dir {}: {e}", dir.display()))?;
        if !tuning.changed().is_empty() {
            tracing::info!("FUSE tuning (UDM_FUSE_*): {}", tuning.changed().join(" "));
        }
        let (threads, clone_fd) = (tuning.threads, tuning.clone_fd);
        let fs = fs::MapperFs::new(files::Files::new(exports.clone()), front, tuning);
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName(mount::FS_SOURCE.into()),
            fuser::MountOption::Subtype("udm".into()),
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
            fuser::MountOption::NoExec,
        ];
        // SAFETY: geteuid cannot fail and touches no memory.
        let root = unsafe { libc::geteuid() } == 0;
        // As root, other users reach the files; otherwise only the
        // server's user, as FUSE allows without `user_allow_other` in
        // /etc/fuse.conf. No `default_permissions`: the allow rules, not
        // the mode bits, decide who opens a file (`fs.rs`'s open and
        // access), since mode bits cannot say `uid:1000,uid:1001`.
        config.acl = if root {
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        };
        config.n_threads = Some(threads);
        config.clone_fd = clone_fd;
        let mut session =
            fuser::Session::new(fs, dir, &config).map_err(|e| mount_error(dir, &e))?;
        let unmounter = session.unmount_callable();
        let thread = std::thread::Builder::new()
            .name("udm-fuse".into())
            .spawn(move || session.run())
            .map_err(|e| format!("--mapper-dir {}: {e}", dir.display()))?;
        tracing::info!("device files in {}", dir.display());
        let mut m = MapperDir {
            dir: dir.to_path_buf(),
            unmounter,
            engine,
            replies,
            session: Some(thread),
            block: None,
        };
        if let Some(b) = block {
            let nodes = Arc::new(block::BlockNodes::new(dir, b, exports));
            // Dropped with `m` on failure: the nodes made so far go too.
            m.block = Some(nodes.clone());
            nodes.present_all()?;
            tracing::info!("block nodes in {}", b.display());
        }
        Ok(m)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The block nodes (`--mapper-block`), for the control service.
    pub fn block_nodes(&self) -> Option<&Arc<block::BlockNodes>> {
        self.block.as_ref()
    }
}

fn mount_error(dir: &Path, e: &std::io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENODEV) => {
            " (no /dev/fuse: load the fuse module, or as a non-root user install \
             fuse3 for fusermount3)"
        }
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (not permitted: run as root, or install fuse3 so fusermount3 can mount for you)"
        }
        _ => "",
    };
    format!(
        "--mapper-dir {}: cannot mount the device files: {e}{hint}",
        dir.display()
    )
}

impl Drop for MapperDir {
    fn drop(&mut self) {
        // The loop devices first: each holds its file open, which would
        // keep the mount busy.
        if let Some(b) = self.block.take() {
            b.release_all();
        }
        // A plain unmount first; a file still open (a loop device) makes
        // it busy, and then the mount is detached from the namespace.
        if self.unmounter.unmount().is_err() {
            if let Err(e) = mount::detach(&self.dir) {
                tracing::warn!("--mapper-dir {}: unmount failed: {e}", self.dir.display());
            }
        }
        // A file still open keeps sending requests after a detach: from
        // here they fail, and those already taken finish, so the flush
        // that follows covers every write a process saw succeed. Requests
        // parked behind a suspended device are let go first, as the NBD
        // side's shutdown does, or they would never finish.
        self.engine.release_all();
        if !self.replies.close(DRAIN_LIMIT) {
            tracing::warn!(
                "--mapper-dir {}: requests still running after {DRAIN_LIMIT:?}; \
                 the final flush may not cover them",
                self.dir.display()
            );
        }
        let Some(s) = self.session.take() else {
            return;
        };
        // The session ends when the kernel closes the connection: at once
        // unless a file is still open (a loop device), and then when the
        // process exits and its /dev/fuse descriptor closes.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(s.join().is_ok());
        });
        if rx.recv_timeout(Duration::from_secs(2)).is_err() {
            tracing::info!(
                "--mapper-dir {}: files are still open; they fail once the server exits",
                self.dir.display()
            );
        }
    }
}
