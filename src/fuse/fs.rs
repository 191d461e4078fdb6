//! The FUSE operations of the mapper directory. Metadata comes from
//! [`Files`]; every data operation of an open file becomes an
//! `engine::Request` on the export's queue ([`Front`]), exactly as an NBD
//! command does: read, write (`O_SYNC`/`O_DSYNC` → FUA), fsync/fdatasync
//! (flush), fallocate PUNCH_HOLE (trim) and ZERO_RANGE (write zeroes),
//! lseek SEEK_DATA/SEEK_HOLE (extents).
//!
//! Files are opened with `FOPEN_DIRECT_IO`: the device is shared with NBD
//! clients and other front ends, so the kernel must not keep a page cache
//! of it that would go stale (a loop device or a filesystem above caches
//! anyway); `FOPEN_PARALLEL_DIRECT_WRITES` lets writes of one file run in
//! parallel instead of under the inode lock.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

use super::files::{admits, Files, ROOT};
use super::io::{Call, Front, Pending};
use super::tuning::Tuning;
use crate::core::Extent;
use crate::engine::Op;
use crate::nbd::export::ConnectionGuard;
use crate::nbd::Exported;

/// Attributes and entries are never cached: a resize, a removal or a new
/// device shows at the next `stat`.
const NO_CACHE: Duration = Duration::ZERO;

/// Pieces of a long fallocate (each one engine request).
const FALLOCATE_PIECE: u64 = 1 << 30;

/// Extents asked for per lseek round.
const SEEK_EXTENTS: u32 = 64;

/// One open file.
struct Handle {
    export: Arc<Exported>,
    /// Counts the open file as a client of the export, so `dmsetup
    /// remove` finds the device busy, as the kernel does for an open
    /// block device; `remove --force` closes it.
    _guard: ConnectionGuard,
    closed: Arc<AtomicBool>,
    writable: bool,
    sync: bool,
}

pub(super) struct MapperFs {
    files: Files,
    front: Front,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    tuning: Tuning,
}

fn errno(n: i32) -> Errno {
    Errno::from_i32(n)
}

impl MapperFs {
    pub(super) fn new(files: Files, front: Front, tuning: Tuning) -> MapperFs {
        MapperFs {
            files,
            front,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            tuning,
        }
    }

    /// The open file `fh`, unless its device was closed under it.
    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        let h = self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)?;
        if h.closed.load(Ordering::Acquire) {
            // `dmsetup remove --force`: the device is gone for its users.
            return Err(Errno::ENODEV);
        }
        Ok(h)
    }

    /// Whether the caller may enter the directory: the mode shown (0700
    /// unless an export admits other users) is enforced here, since the
    /// mount has no `default_permissions` (the rules, not mode bits,
    /// decide).
    fn enter_root(&self, req: &Request) -> Result<(), Errno> {
        if req.uid() == self.files.uid || self.files.root_open() {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    fn open_file(&self, req: &Request, ino: u64, flags: OpenFlags) -> Result<u64, Errno> {
        let e = self.files.by_ino(ino).ok_or(Errno::ENOENT)?;
        let writable = flags.acc_mode() != OpenAccMode::O_RDONLY;
        if writable && e.export.is_read_only() {
            return Err(errno(libc::EROFS));
        }
        if !admits(&e, req.uid(), self.files.uid) {
            return Err(Errno::EACCES);
        }
        let closed = Arc::new(AtomicBool::new(false));
        let c = closed.clone();
        let guard = e.connect_closable(Box::new(move || c.store(true, Ordering::Release)));
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let h = Handle {
            export: e,
            _guard: guard,
            closed,
            writable,
            sync: flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0,
        };
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(h));
        Ok(fh)
    }

    /// `fallocate`: PUNCH_HOLE (with KEEP_SIZE, as the kernel requires)
    /// trims, ZERO_RANGE writes zeroes; the size never changes, as for a
    /// block device, so every other mode is refused.
    fn fallocate_range(&self, h: &Handle, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let op = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            libc::FALLOC_FL_PUNCH_HOLE if mode == PUNCH => Op::Trim,
            libc::FALLOC_FL_ZERO_RANGE => Op::WriteZeroes,
            _ => return Err(errno(libc::EOPNOTSUPP)),
        };
        if !h.writable {
            return Err(Errno::EBADF);
        }
        let size = h.export.export.device.size();
        let end = offset.checked_add(len).ok_or(errno(libc::EINVAL))?;
        if end > size {
            return Err(errno(libc::ENOSPC));
        }
        if op == Op::Trim && !h.export.export.device.limits().discard {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let mut at = offset;
        while at < end {
            let n = (end - at).min(FALLOCATE_PIECE);
            let call = Call {
                op,
                offset: at,
                len: n,
                fua: false,
                data: None,
            };
            let (r, _) = self.front.run(&h.export.queue, call);
            r.map_err(|e| super::io::errno_of(&e, true))?;
            at += n;
        }
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE from the device's extents: a hole is what the
    /// device reports as one (zeroed but allocated data is data); the end
    /// of the file is a hole.
    fn seek(&self, h: &Handle, offset: i64, whence: i32) -> Result<i64, Errno> {
        let want_data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Err(errno(libc::EINVAL)),
        };
        let size = h.export.export.device.size();
        let mut pos = u64::try_from(offset).map_err(|_| errno(libc::ENXIO))?;
        if pos >= size {
            return Err(errno(libc::ENXIO));
        }
        while pos < size {
            let call = Call {
                op: Op::Extents { max: SEEK_EXTENTS },
                offset: pos,
                len: (size - pos).min(u64::from(u32::MAX) & !4095),
                fua: false,
                data: None,
            };
            let (r, extents) = self.front.run(&h.export.queue, call);
            r.map_err(|e| super::io::errno_of(&e, false))?;
            match first_of(&extents, pos, want_data) {
                Found::At(p) => return Ok(p.min(size) as i64),
                Found::Past(p) if p > pos => pos = p,
                Found::Past(_) => break,
            }
        }
        if want_data {
            Err(errno(libc::ENXIO))
        } else {
            Ok(size as i64)
        }
    }
}

enum Found {
    At(u64),
    /// Not in these extents, which end here.
    Past(u64),
}

/// The first offset from `pos` in `extents` (which start at `pos`) that is
/// data (`want_data`) or a hole.
fn first_of(extents: &[Extent], pos: u64, want_data: bool) -> Found {
    let mut at = pos;
    for x in extents {
        if x.hole != want_data {
            return Found::At(at);
        }
        at += x.len;
    }
    Found::Past(at)
}

impl Filesystem for MapperFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let t = &self.tuning;
        let _ = config.set_max_write(t.max_write);
        let _ = config.set_max_readahead(t.max_write);
        // Each only where the kernel offers it: parallel direct I/O of one
        // file (libaio, io_uring), parallel lookups, an O_TRUNC open that
        // does not truncate a device, mmap of a direct-I/O file, requests
        // past 128 KiB. The benchmark knobs (`tuning.rs`) leave some out.
        for (on, cap) in [
            (t.async_dio, InitFlags::FUSE_ASYNC_DIO),
            (true, InitFlags::FUSE_PARALLEL_DIROPS),
            (true, InitFlags::FUSE_ATOMIC_O_TRUNC),
            (true, InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP),
            (t.max_pages, InitFlags::FUSE_MAX_PAGES),
        ] {
            if on {
                let _ = config.add_capabilities(cap);
            }
        }
        // Background requests (async direct I/O) in flight at once.
        let _ = config.set_max_background(t.max_background);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // A name the caller may not open does not exist for them.
        let e = (parent.0 == ROOT)
            .then(|| {
                name.to_str()
                    .and_then(|n| self.files.by_name_for(n, req.uid()))
            })
            .flatten();
        match e {
            Some(e) => reply.entry(&NO_CACHE, &self.files.file_attr(&e), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == ROOT {
            return reply.attr(&NO_CACHE, &self.files.root_attr());
        }
        match self.files.by_ino(ino.0) {
            Some(e) => reply.attr(&NO_CACHE, &self.files.file_attr(&e)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(e) = self.files.by_ino(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        // A device's size, owner and mode come from the server: a
        // truncate to its own size and time stamps are accepted (tools
        // set them), anything else is refused.
        let a = self.files.file_attr(&e);
        if mode.is_some() || uid.is_some() || gid.is_some() || size.is_some_and(|s| s != a.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&NO_CACHE, &a);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if ino.0 == ROOT {
            return match self.enter_root(req) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        let Some(e) = self.files.by_ino(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let write = mask.bits() & libc::W_OK != 0;
        let exec = mask.bits() & libc::X_OK != 0;
        if !admits(&e, req.uid(), self.files.uid) || exec {
            reply.error(Errno::EACCES);
        } else if write && e.export.is_read_only() {
            reply.error(errno(libc::EROFS));
        } else {
            reply.ok();
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(req, ino.0, flags) {
            Ok(fh) => {
                let mut f = FopenFlags::empty();
                if self.tuning.direct_io {
                    f |= FopenFlags::FOPEN_DIRECT_IO;
                }
                if self.tuning.parallel_writes {
                    f |= FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
                }
                reply.opened(FileHandle(fh), f)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let dev = h.export.export.device.size();
        let len = u64::from(size).min(dev.saturating_sub(offset));
        if len == 0 {
            // At or past the end: end of file.
            return reply.data(&[]);
        }
        let call = Call {
            op: Op::Read,
            offset,
            len,
            fua: false,
            data: None,
        };
        self.front
            .submit(&h.export.queue, call, Pending::Read(reply));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        if !h.writable {
            return reply.error(Errno::EBADF);
        }
        // As a block device: a write that starts at the end has no room,
        // one that crosses it is cut there.
        let dev = h.export.export.device.size();
        let len = (data.len() as u64).min(dev.saturating_sub(offset));
        if len == 0 {
            return reply.error(errno(libc::ENOSPC));
        }
        let call = Call {
            op: Op::Write,
            offset,
            len,
            fua: h.sync || flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0,
            data: Some(&data[..len as usize]),
        };
        self.front
            .submit(&h.export.queue, call, Pending::Write(reply, len as u32));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(): as for a block device, nothing is made durable here
        // (fsync does that).
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let call = Call {
            op: Op::Flush,
            offset: 0,
            len: 0,
            fua: false,
            data: None,
        };
        self.front
            .submit(&h.export.queue, call, Pending::Done(reply));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        match self.enter_root(req) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries = vec![
            (ROOT, fuser::FileType::Directory, ".".to_string()),
            (ROOT, fuser::FileType::Directory, "..".to_string()),
        ];
        entries.extend(
            self.files
                .list_for(req.uid())
                .into_iter()
                .map(|(i, n)| (i, fuser::FileType::RegularFile, n)),
        );
        for (k, (i, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), (k + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Sizes and counts of the caller's files only.
        let list = self.files.visible(req.uid());
        let bytes: u64 = list.iter().map(|e| e.export.device.size()).sum();
        let files = list.len() as u64;
        reply.statfs(bytes / 4096, 0, 0, files, 0, 4096, 255, 4096);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self
            .handle(fh)
            .and_then(|h| self.fallocate_range(&h, offset, length, mode))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(errno(libc::ENODATA));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Block device ioctls (BLKGETSIZE64 and the like) are for block
        // devices; a regular file answers none, as on any file system.
        reply.error(errno(libc::ENOTTY));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.handle(fh).and_then(|h| self.seek(&h, offset, whence)) {
            Ok(p) => reply.offset(p),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(len: u64, hole: bool) -> Extent {
        Extent {
            len,
            hole,
            zero: hole,
        }
    }

    #[test]
    fn seek_finds_the_first_extent_of_the_kind_asked() {
        let l = [ext(4096, false), ext(8192, true), ext(4096, false)];
        assert!(matches!(first_of(&l, 100, true), Found::At(100)));
        assert!(matches!(first_of(&l, 100, false), Found::At(4196)));
        let holes = [ext(4096, true)];
        assert!(matches!(first_of(&holes, 0, true), Found::Past(4096)));
    }
}
