//! A regular file or block device, accessed by offset with positional
//! syscalls so that any number of threads share one descriptor without a
//! lock. Flush is `fdatasync`; FUA is a write followed by `fdatasync`.
//!
//! A file on tmpfs is also mapped (unless the caller says not to), which
//! gives it direct access: the crypt target encrypts straight into the
//! file's pages instead of into a buffer that `pwrite` then copies (see
//! `filemap.rs` for why only tmpfs, and how SIGBUS is kept from crashing
//! udm). Plain reads and writes use the mapping too (a memcpy instead of
//! a `pread`/`pwrite`, and no inode lock): 1 MiB NBD reads of a linear
//! table got faster and 1 MiB writes cheaper in server CPU per byte
//! (docs/BENCHMARKS.md). Reads take the mapping only where every page is
//! in memory (see `mapped_for_read`).

use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::file_io::{self, FileIo, IoReport, Registered};
use super::filemap::{on_tmpfs, FileMap};
use super::uring::{Op, Ring};
use super::writers::{Writers, Writes};
use super::MemStore;
use crate::core::device::{read_transformed_by_reading, write_transformed_by_writing, Transform};
use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Extent, Lent, Limits, WriteBuf};

/// Requests a store whose calls can block (a file on a disk filesystem, a
/// block device) asks the engine to keep in flight
/// ([`Limits::queue_depth`]): that many workers of its own for the pwrite
/// path, that many submissions at once for the io_uring path. Sized from
/// the queue depth clients keep (fio and the kernel's NBD client use up to
/// 32 per connection), not from the core count: a worker blocked in
/// writeback throttling uses no core, and two of them (one per core)
/// ran well behind nbdkit's thread pool for 4 KiB random writes on ext4.
pub const FILE_QUEUE_DEPTH: u32 = 32;

/// The environment variable that turns the mapping of disk files off
/// (`0`), for an A/B of the crypt path over them.
pub const READ_MAP_ENV: &str = "UDM_FILE_READ_MAP";

/// The environment variable that makes that mapping writable (`1`), so
/// crypt encrypts writes straight into cached pages instead of `pwrite`:
/// off by default, kept for the A/B (see `FileStore::write_transformed`).
pub const WRITE_MAP_ENV: &str = "UDM_FILE_WRITE_MAP";

/// A file or block device as a [`BlockDevice`].
pub struct FileStore {
    /// The io_uring path (declared before `file`: the ring is dropped, its
    /// thread stopped, before the file closes). `None`: the syscalls.
    ring: Option<Ring>,
    /// Buffered writes the ring would hand to io-wq one at a time (see
    /// `writers.rs`); dropped before the file, as the ring.
    writes: Writes,
    file: File,
    path: PathBuf,
    size: u64,
    read_only: bool,
    block_device: bool,
    direct: bool,
    /// Zeroing is O(1) here: punched holes on a filesystem that has them,
    /// or a block device with write-zeroes (so FAST_ZERO is honest).
    fast_zero: bool,
    /// The file's pages, mapped, when it lives on tmpfs: direct access.
    /// Abandoned (for the syscalls) after the first SIGBUS in it.
    map: Option<MemStore>,
    /// A disk file's pages mapped, for ranges already in the page cache:
    /// crypt decrypts out of them (`resident`, `read_transformed`) instead
    /// of copying into its buffer first, and reads are lent from them.
    /// With `UDM_FILE_WRITE_MAP=1` (and a writable store) it is writable
    /// and crypt encrypts straight into cached pages
    /// (`resident_for_write`, `write_transformed`) instead of encrypting
    /// in its buffer and copying that with `pwrite`; off by default, as a
    /// page fault there can cost a whole large folio's work (see
    /// `write_transformed`). Plain writes always keep the syscalls,
    /// where the filesystem allocates and reports errors as such (through
    /// the mapping only pages already in the cache are written, and a
    /// fault there that cannot be served, a full filesystem filling a
    /// cached hole or a file shrunk meanwhile, is the SIGBUS of
    /// `filemap`: that request fails and the mapping is abandoned).
    /// `UDM_FILE_READ_MAP=0` turns it off (for the A/B).
    page_map: Option<MemStore>,
    /// Whether `page_map` is writable.
    map_writes: bool,
    /// The first failed `fdatasync`, latched: Linux reports a writeback
    /// error once per open file, so the next `fdatasync` would succeed over
    /// writes that were lost (PostgreSQL's "fsyncgate"). Once set, every
    /// flush and FUA write fails until the store is reopened.
    sync_failed: OnceLock<String>,
    /// Whether a call can block (not tmpfs): such a store asks for
    /// [`FILE_QUEUE_DEPTH`] requests in flight instead of inline runs.
    can_block: bool,
    /// This store's line in `dmsetup status --json` while it is open.
    registered: Registered,
    /// Test seam: the `fdatasync` to call instead of the real one, so
    /// tests can make it fail.
    #[cfg(test)]
    sync_fn: Option<fn(&File) -> std::io::Result<()>>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("read_only", &self.read_only)
            .field("direct", &self.direct)
            .field("mapped", &self.mapped().is_some())
            .field("uring", &self.ring.is_some())
            .field("writes", &self.writes)
            .finish()
    }
}

/// How to open a [`FileStore`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenFlags {
    pub read_only: bool,
    /// O_DIRECT: bypass the page cache. Buffers and offsets must then be
    /// aligned to the logical block size, which the engine guarantees.
    pub direct: bool,
    /// Never map the file, even on tmpfs (keep `pread`/`pwrite` for
    /// everything; for ablations and the cautious).
    pub no_map: bool,
}

impl FileStore {
    /// Open `path`, which must exist: a regular file or a block device;
    /// its I/O path is the process default ([`file_io::default_io`]).
    pub fn open(path: &Path, flags: OpenFlags) -> std::io::Result<FileStore> {
        FileStore::open_with(path, flags, file_io::default_io())
    }

    /// Open `path` with the I/O path `io`. io_uring is used only where a
    /// call can block (not on tmpfs, which is mapped or fast anyway) and
    /// the kernel gives a ring; otherwise the store falls back to the
    /// syscalls and logs why.
    pub fn open_with(path: &Path, flags: OpenFlags, io: FileIo) -> std::io::Result<FileStore> {
        let map_writes = std::env::var(WRITE_MAP_ENV).is_ok_and(|v| v == "1");
        FileStore::open_inner(path, flags, io, map_writes)
    }

    /// [`FileStore::open_with`], `map_writes` saying whether crypt may
    /// write a disk file's cached pages through its mapping.
    fn open_inner(
        path: &Path,
        flags: OpenFlags,
        io: FileIo,
        map_writes: bool,
    ) -> std::io::Result<FileStore> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(!flags.read_only);
        if flags.direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display()))
        })?;
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        let size = if block_device {
            block_device_size(&file)?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        };
        let map = if !block_device && !flags.direct && !flags.no_map && on_tmpfs(&file) {
            usize::try_from(size)
                .ok()
                .and_then(|len| FileMap::new(&file, len, !flags.read_only).ok().flatten())
                .map(MemStore::map_file)
        } else {
            None
        };
        let map_writes = map_writes && !flags.read_only;
        let page_map = (!block_device
            && !flags.direct
            && !flags.no_map
            && map.is_none()
            && std::env::var(READ_MAP_ENV).map_or(true, |v| v != "0"))
        .then(|| usize::try_from(size).ok())
        .flatten()
        .and_then(|len| FileMap::new(&file, len, map_writes).ok().flatten())
        .map(MemStore::map_file);
        let map_writes = map_writes && page_map.is_some();
        let fast_zero = if block_device {
            block_device_zeroes(&file)
        } else {
            punches_holes(&file)
        };
        let can_block = block_device || !on_tmpfs(&file);
        let ring = (io == FileIo::Uring && can_block && map.is_none())
            .then(|| match Ring::new(file.as_raw_fd()) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(
                        "{}: io_uring unavailable ({e}); using pread/pwrite",
                        path.display()
                    );
                    None
                }
            })
            .flatten();
        let writes = if ring.is_some() && !block_device && !flags.direct && !flags.read_only {
            Writes::for_file(&file, path)
        } else {
            Writes::Ring
        };
        let report = IoReport {
            path: path.display().to_string(),
            io: if map.is_some() {
                "mmap"
            } else if ring.is_some() {
                "uring"
            } else {
                "pwrite"
            }
            .into(),
            fixed_file: ring.as_ref().is_some_and(Ring::fixed_file),
            queue_depth: if can_block { FILE_QUEUE_DEPTH } else { 0 },
            direct: flags.direct,
            writers: writes.threads() as u32,
            sole_client_inline: matches!(&writes, Writes::Threads(w) if w.sole_inline()),
            lent_reads: 0,
            mapped_writes: 0,
            prepared_writes: 0,
        };
        Ok(FileStore {
            ring,
            writes,
            can_block,
            registered: file_io::register(report),
            file,
            path: path.to_path_buf(),
            size,
            read_only: flags.read_only,
            block_device,
            direct: flags.direct,
            fast_zero,
            map,
            page_map,
            map_writes,
            sync_failed: OnceLock::new(),
            #[cfg(test)]
            sync_fn: None,
        })
    }

    /// The mapping, while it has taken no fault.
    fn mapped(&self) -> Option<&MemStore> {
        self.map.as_ref().filter(|m| m.faults() == 0)
    }

    /// The mapping, for a read of `[offset, offset+len)`: when it has
    /// taken no fault and every page of the range is in memory. Reading a
    /// hole through a mapping of a tmpfs file allocates a page for it (even
    /// a read-only or private mapping), so a sparse image read end to end
    /// would fill memory with zeros; `pread` returns zeros without
    /// allocating. `mincore` tells, at a cost proportional to the range
    /// (`lseek(SEEK_HOLE)` would scan to the next hole, i.e. to the end of
    /// a full file, on every call).
    fn mapped_for_read(&self, offset: u64, len: usize) -> Option<&MemStore> {
        let m = self.mapped()?;
        m.resident(offset, len).then_some(m)
    }

    /// The read-only mapping of a disk file, for a read of a range whose
    /// pages are all in the page cache (so no access through it waits for
    /// the disk), while it has taken no fault.
    fn read_mapped(&self, offset: u64, len: usize) -> Option<&MemStore> {
        let m = self.page_map.as_ref().filter(|m| m.faults() == 0)?;
        m.resident(offset, len).then_some(m)
    }

    /// The writable mapping of a disk file, for a write of a range whose
    /// pages are all in the page cache, while it has taken no fault.
    fn write_mapped(&self, offset: u64, len: usize) -> Option<&MemStore> {
        if !self.map_writes {
            return None;
        }
        self.read_mapped(offset, len)
    }

    /// Run one access through the mapping: a SIGBUS during it (counted by
    /// the handler) fails the call whatever `f` returned, and a FUA write
    /// is made durable after it.
    fn on_map<T>(
        &self,
        m: &MemStore,
        fua: bool,
        f: impl FnOnce(&MemStore) -> DevResult<T>,
    ) -> DevResult<T> {
        let res = f(m);
        if m.faults() != 0 {
            return Err(self.lost_pages());
        }
        let v = res?;
        if fua {
            self.sync()?;
        }
        Ok(v)
    }

    /// The request that saw a SIGBUS in the mapping fails with this.
    fn lost_pages(&self) -> DevError {
        DevError::Io(std::io::Error::other(format!(
            "{}: pages of the file vanished under udm while it was mapped (another \
             program truncated it, or its filesystem is full); the request failed and udm \
             uses read/write calls on it from now on; free space on the filesystem \
             or stop whatever shrinks the file",
            self.path.display()
        )))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check_writable(&self) -> DevResult<()> {
        if self.read_only {
            Err(DevError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// `fdatasync`, failing for good once it has failed (see
    /// `sync_failed`).
    fn sync(&self) -> DevResult<()> {
        let latched = |first: &str| {
            DevError::Io(std::io::Error::other(format!(
                "{}: an earlier flush failed ({first}), so writes acknowledged before it \
                 may be lost; every flush fails until the device is reopened: check the \
                 disk and its kernel log, then restart the device",
                self.path.display()
            )))
        };
        if let Some(first) = self.sync_failed.get() {
            return Err(latched(first));
        }
        match self.fdatasync() {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::error!("{}: flush failed: {e}", self.path.display());
                let _ = self.sync_failed.set(e.to_string());
                Err(DevError::Io(e))
            }
        }
    }

    fn fdatasync(&self) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(f) = self.sync_fn {
            return f(&self.file);
        }
        match &self.ring {
            // SAFETY: an fdatasync refers to no memory.
            Some(r) => ring_result(unsafe { r.run(Op::Fdatasync, 0) }).map(drop),
            None => self.file.sync_data(),
        }
    }

    /// Which I/O path this store uses: `mmap`, `uring` or `pwrite`.
    pub fn io_path(&self) -> &'static str {
        if self.mapped().is_some() {
            "mmap"
        } else if self.ring.is_some() {
            "uring"
        } else {
            "pwrite"
        }
    }

    /// Read `buf` at `offset` to the end, through the ring or `pread`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let Some(r) = &self.ring else {
            return self.file.read_exact_at(buf, offset);
        };
        let mut done = 0;
        while done < buf.len() {
            let part = &mut buf[done..];
            let len = part.len().min(1 << 30) as u32;
            let op = Op::Read {
                buf: part.as_mut_ptr(),
                len,
            };
            // SAFETY: `part` is borrowed for the call, which waits.
            let n = ring_result(unsafe { r.run(op, offset + done as u64) })?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{}: read past the end of the file", self.path.display()),
                ));
            }
            done += n;
        }
        Ok(())
    }

    /// Write `data` at `offset` to the end, through the ring or `pwrite`.
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let Some(r) = &self.ring else {
            return self.file.write_all_at(data, offset);
        };
        let mut done = 0;
        while done < data.len() {
            let part = &data[done..];
            let len = part.len().min(1 << 30) as u32;
            let op = Op::Write {
                buf: part.as_ptr(),
                len,
            };
            // SAFETY: `part` is borrowed for the call, which waits.
            let n = ring_result(unsafe { r.run(op, offset + done as u64) })?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            done += n;
        }
        Ok(())
    }

    /// One `pwritev`, or its io_uring entry: bytes written.
    fn writev_at(&self, iov: &[libc::iovec], pos: u64) -> std::io::Result<usize> {
        if let Some(r) = &self.ring {
            let op = Op::Writev {
                iov: iov.as_ptr(),
                n: iov.len() as u32,
            };
            // SAFETY: the list and the slices it points into are borrowed
            // for the call, which waits.
            return ring_result(unsafe { r.run(op, pos) });
        }
        // SAFETY: `iov` points into live borrowed slices that outlive the
        // call; pwritev only reads from them.
        let rc = unsafe {
            libc::pwritev(
                self.file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as i32,
                pos as libc::off_t,
            )
        };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(rc as usize)
        }
    }

    /// `fallocate(mode)` over the range, through the ring when there is one.
    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
        if let Some(r) = &self.ring {
            // SAFETY: a fallocate refers to no memory.
            return ring_result(unsafe { r.run(Op::Fallocate { mode, len }, offset) }).map(drop);
        }
        // SAFETY: plain syscall on an open descriptor with integer arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Zero `[offset, offset+len)` of a mapped tmpfs file: holes are
    /// skipped (they read as zeros), the first few data pages are cleared
    /// through the mapping, and only what follows a denser run is punched.
    /// Why not always punch: a punch unmaps the range from the mapping (a
    /// page-table walk and a TLB flush on every core running the server)
    /// and frees pages that the next write faults back in. A thin pool
    /// zeroes each new block this way, and a reused block typically holds
    /// one page of its last owner's data among holes. `SEEK_DATA` only,
    /// never `SEEK_HOLE`, which would scan a dense file to its next hole.
    /// False when the file cannot say where its data is (then the caller
    /// zeroes another way).
    fn zero_mapped(&self, m: &MemStore, offset: u64, len: u64) -> DevResult<bool> {
        /// Pages cleared by hand before the rest is punched.
        const CLEAR_PAGES: usize = 4;
        let page = super::filemap::page_size() as u64;
        let end = offset.saturating_add(len);
        let mut pos = offset;
        for _ in 0..CLEAR_PAGES {
            // SAFETY: plain syscall on an open descriptor with integer arguments.
            let d =
                unsafe { libc::lseek(self.file.as_raw_fd(), pos as libc::off_t, libc::SEEK_DATA) };
            if d < 0 {
                let no_data = std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
                return Ok(no_data);
            }
            let d = (d as u64).max(pos);
            if d >= end {
                return Ok(true);
            }
            let next = ((d / page + 1) * page).min(end);
            self.on_map(m, false, |m| m.write_zeroes(d, next - d, false))?;
            pos = next;
            if pos >= end {
                return Ok(true);
            }
        }
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        Ok(self.fallocate(punch, pos, end - pos).is_ok())
    }

    /// The completion of a submitted read or write: a short transfer (a
    /// write cut by a signal, a read at the end of a shrunk file) is
    /// finished with the syscalls; an error is reported as it came.
    fn finish_submitted(&self, io: &PendingIo, res: i32) -> DevResult<()> {
        let n = ring_result(res)?;
        if n >= io.len {
            return Ok(());
        }
        let at = io.offset + n as u64;
        // SAFETY: the submitter's buffer, valid until `done` runs (the
        // contract of `submit`), which is after this.
        unsafe {
            if io.write {
                let rest = std::slice::from_raw_parts(io.buf.add(n), io.len - n);
                self.file.write_all_at(rest, at)?;
            } else {
                let rest = std::slice::from_raw_parts_mut(io.buf.add(n), io.len - n);
                self.file.read_exact_at(rest, at)?;
            }
        }
        Ok(())
    }
}

impl FileStore {
    /// A submitted write, queued to the writer threads.
    ///
    /// # Safety
    ///
    /// As [`BlockDevice::submit`].
    unsafe fn write_on(&self, w: &Writers, io: AsyncIo) {
        let pending = PendingIo {
            write: true,
            offset: io.offset,
            buf: io.buf,
            len: io.len,
            store: self,
        };
        let (done, prepare) = (io.done, io.prepare);
        let len = io.len;
        w.run(
            len,
            Box::new(move || {
                let p = pending;
                // SAFETY: the caller keeps the store and the buffer alive and
                // the buffer ours until `done` ran (the submit contract).
                let (store, data) =
                    unsafe { (&*p.store, std::slice::from_raw_parts_mut(p.buf, p.len)) };
                // The layer above's last step (a cipher), here on the
                // writer rather than on the connection's reader.
                if let Some(f) = prepare {
                    if let Err(e) = f(data) {
                        return done(Some(Err(e)));
                    }
                    store.registered.prepared_write();
                }
                let r = store
                    .file
                    .write_all_at(data, p.offset)
                    .map_err(DevError::Io);
                done(Some(r))
            }),
        );
    }
}

/// A completion's result as `io::Result`: bytes, or the errno.
fn ring_result(res: i32) -> std::io::Result<usize> {
    if res < 0 {
        Err(std::io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// What a submitted request's completion needs to finish it.
struct PendingIo {
    write: bool,
    offset: u64,
    buf: *mut u8,
    len: usize,
    store: *const FileStore,
}

// SAFETY: the pointers are the submitter's buffer and the store, both kept
// valid by the caller of `submit` until `done` runs, on whichever thread.
unsafe impl Send for PendingIo {}

/// Whether the file's filesystem punches holes that read back as zeros in
/// O(1): tmpfs, ext4, xfs, btrfs (their `statfs` magic numbers).
fn punches_holes(file: &File) -> bool {
    const TMPFS: i64 = 0x0102_1994;
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    // SAFETY: fstatfs writes one statfs struct into the zeroed local.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open and `st` is a live, writable struct.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    matches!(st.f_type as i64, TMPFS | EXT4 | XFS | BTRFS)
}

/// Whether a block device zeroes without writing (its queue reports a
/// write-zeroes limit: the device unmaps or has WRITE ZEROES/WRITE SAME).
fn block_device_zeroes(file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = file.metadata() else {
        return false;
    };
    let rdev = m.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!(
        "/sys/dev/block/{major}:{minor}/queue/write_zeroes_max_bytes"
    ))
    .ok()
    .and_then(|v| v.trim().parse::<u64>().ok())
    .is_some_and(|n| n > 0)
}

fn block_device_size(file: &File) -> std::io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: the ioctl writes one u64 through the pointer, which points to a
    // live, properly aligned u64 on our stack; the descriptor is open.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
}

impl BlockDevice for FileStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn limits(&self) -> Limits {
        Limits {
            logical_block_size: if self.direct { 4096 } else { 512 },
            optimal_io_size: 4096,
            max_io_size: 32 << 20,
            discard: true,
            write_zeroes: self.fast_zero,
            read_only: self.read_only,
            // A store that may block gets requests in flight (workers or
            // ring submissions); one that cannot (tmpfs, mapped or not)
            // keeps inline runs on the connection's reader.
            queue_depth: if self.can_block && self.mapped().is_none() {
                FILE_QUEUE_DEPTH
            } else {
                0
            },
            io_boundary: 0,
        }
    }

    fn can_submit(&self) -> bool {
        self.ring.is_some()
    }

    /// Writes handed to the writer threads run a layer's last step (the
    /// cipher) there (`prepared_writes` in the status).
    fn takes_prepare(&self) -> bool {
        self.ring.is_some() && !self.read_only && matches!(self.writes, Writes::Threads(_))
    }

    /// A read, or a plain write, as one ring entry completed on the ring's
    /// thread (or on this one, when the page cache answered at once): no
    /// worker waits for the disk. FUA writes are declined (the worker's
    /// path writes and then syncs, with the latched-failure rule), as are
    /// writes to a read-only store (the synchronous path refuses them).
    unsafe fn submit(&self, mut io: AsyncIo) {
        let Some(ring) = &self.ring else {
            return io.decline();
        };
        if (io.write && (io.fua || self.read_only)) || io.len > u32::MAX as usize {
            return io.decline();
        }
        if io.write {
            match &self.writes {
                Writes::Ring => {
                    if let Err(e) = io.ready() {
                        return (io.done)(Some(Err(e)));
                    }
                }
                // SAFETY: the caller's guarantees, passed on.
                Writes::Threads(w) => return unsafe { self.write_on(w, io) },
            }
        }
        let pending = PendingIo {
            write: io.write,
            offset: io.offset,
            buf: io.buf,
            len: io.len,
            store: self,
        };
        let op = if io.write {
            Op::Write {
                buf: io.buf,
                len: io.len as u32,
            }
        } else {
            Op::Read {
                buf: io.buf,
                len: io.len as u32,
            }
        };
        let done = io.done;
        let finish = Box::new(move |res: i32| {
            let pending = pending;
            // SAFETY: the caller keeps the store alive until `done` ran.
            let store = unsafe { &*pending.store };
            let r = store.finish_submitted(&pending, res);
            done(Some(r))
        });
        // SAFETY: the buffer stays valid and ours until `done` (the
        // caller's contract), which the completion calls last.
        unsafe { ring.start(op, io.offset, finish) }
    }

    /// Through the mapping when the range has no hole (one copy, no
    /// syscall besides the hole check); else `pread`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        if let Some(m) = self.mapped_for_read(offset, buf.len()) {
            return self.on_map(m, false, |m| m.read(offset, buf));
        }
        self.read_at(buf, offset).map_err(DevError::Io)
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.check_writable()?;
        if let Some(m) = self.mapped() {
            return self.on_map(m, fua, |m| {
                m.write(offset, WriteBuf::Borrowed(data.as_slice()), false)
            });
        }
        self.write_at(data.as_slice(), offset)?;
        if fua {
            self.sync()?;
        }
        Ok(())
    }

    fn write_vectored(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        self.check_writable()?;
        if let Some(m) = self.mapped() {
            return self.on_map(m, fua, |m| {
                let mut pos = offset;
                for b in bufs {
                    m.write(pos, WriteBuf::Borrowed(b), false)?;
                    pos += b.len() as u64;
                }
                Ok(())
            });
        }
        let mut pos = offset;
        // pwritev may write partially; walk the list until everything is out.
        let mut idx = 0usize;
        let mut skip = 0usize; // bytes of bufs[idx] already written
        while idx < bufs.len() {
            let mut iov: [libc::iovec; 64] = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 64];
            let mut n = 0;
            for (k, b) in bufs[idx..].iter().take(64).enumerate() {
                let s = if k == 0 { &b[skip..] } else { &b[..] };
                iov[n] = libc::iovec {
                    iov_base: s.as_ptr() as *mut libc::c_void,
                    iov_len: s.len(),
                };
                n += 1;
            }
            let rc = match self.writev_at(&iov[..n], pos) {
                Ok(rc) => rc,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(DevError::Io(e)),
            };
            if rc == 0 {
                return Err(DevError::Io(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                )));
            }
            let mut done = rc as usize;
            pos += done as u64;
            while done > 0 {
                let left = bufs[idx].len() - skip;
                if done >= left {
                    done -= left;
                    idx += 1;
                    skip = 0;
                } else {
                    skip += done;
                    done = 0;
                }
            }
            while idx < bufs.len() && bufs[idx].len() == skip {
                idx += 1;
                skip = 0;
            }
        }
        if fua {
            self.sync()?;
        }
        Ok(())
    }

    fn direct_access(&self) -> bool {
        self.mapped().is_some()
    }

    /// Through the mapping when there is one and the range has no hole:
    /// the transform reads the file's pages. Any SIGBUS during the call
    /// fails it.
    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        let len = buf.len();
        let Some(m) = self
            .mapped_for_read(offset, len)
            .or_else(|| self.read_mapped(offset, len))
        else {
            return read_transformed_by_reading(self, offset, buf, t);
        };
        self.on_map(m, false, |m| m.read_transformed(offset, buf, t))
    }

    fn resident(&self, offset: u64, len: usize) -> bool {
        self.mapped_for_read(offset, len).is_some() || self.read_mapped(offset, len).is_some()
    }

    fn resident_for_write(&self, offset: u64, len: usize) -> bool {
        self.mapped().is_some() || self.write_mapped(offset, len).is_some()
    }

    fn lends(&self) -> bool {
        self.mapped().is_some() || self.page_map.is_some()
    }

    /// A range whose pages are in memory, lent out of the mapping (a
    /// tmpfs file's, or a disk file's read-only one).
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        if len == 0 {
            return false;
        }
        let Some(m) = self
            .mapped_for_read(offset, len)
            .or_else(|| self.read_mapped(offset, len))
        else {
            return false;
        };
        let lent = m.lend_range(offset, len, &|| self.lost_pages(), f);
        if lent {
            self.registered.lent();
        }
        lent
    }

    /// Through the mapping when there is one (a tmpfs file's), or, with
    /// `UDM_FILE_WRITE_MAP=1`, when a disk file's pages for the range are
    /// all in the page cache: the transform writes the file's pages, then
    /// `fdatasync` if FUA. Any SIGBUS during the call fails it. Otherwise
    /// the transform writes into a buffer that `pwrite` copies.
    ///
    /// Why not through a disk file's mapping by default: every page not
    /// yet writable in this process's mapping (never written through it,
    /// only read, or written back since) takes a fault, and ext4 answers
    /// one (`ext4_page_mkwrite`) with work over the whole folio, which
    /// since large folios can be 2 MiB for each 4 KiB page; `pwrite` pays
    /// that once per folio it touches. On a fresh mapping of small folios
    /// the mapping won (less server CPU per LUKS 1 MiB write on ext4);
    /// after a sequential read it lost clearly, same run, with the faults
    /// a large share of the CPU (docs/BENCHMARKS.md). `pwrite` does not
    /// depend on what came before. (`MADV_POPULATE_WRITE` first takes the
    /// same faults.)
    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.check_writable()?;
        if let Some(m) = self.mapped() {
            return self.on_map(m, fua, |m| m.write_transformed(offset, src, false, t));
        }
        if let Some(m) = self.write_mapped(offset, src.len()) {
            self.registered.mapped_write();
            return self.on_map(m, fua, |m| m.write_transformed(offset, src, false, t));
        }
        write_transformed_by_writing(self, offset, src, fua, t)
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only {
            return Ok(());
        }
        self.sync()
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.check_writable()?;
        if self.block_device {
            // BLKDISCARD = _IO(0x12, 119); a failure only loses the hint.
            const BLKDISCARD: libc::c_ulong = 0x1277;
            let range: [u64; 2] = [offset, len];
            // SAFETY: the ioctl reads two u64 from a live stack array.
            unsafe { libc::ioctl(self.file.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
            return Ok(());
        }
        // Punching a hole reads back as zeros on files; a filesystem that
        // cannot punch simply keeps the data (discard is a hint).
        let _ = self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        );
        Ok(())
    }

    /// Holes from `SEEK_DATA`/`SEEK_HOLE` (files; tmpfs, ext4, xfs and
    /// btrfs answer them from their extent maps): a hole reads as zeros.
    /// Block devices, and filesystems that cannot say, report data.
    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        if self.block_device {
            out(Extent::data(len));
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let end = offset.saturating_add(len);
        let mut pos = offset;
        let seek = |at: u64, whence: libc::c_int| -> Result<u64, i32> {
            // SAFETY: plain syscall on an open descriptor with integer arguments.
            let r = unsafe { libc::lseek(fd, at as libc::off_t, whence) };
            if r < 0 {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            } else {
                Ok(r as u64)
            }
        };
        let hole = |n: u64| Extent {
            len: n,
            hole: true,
            zero: true,
        };
        while pos < end {
            let data = match seek(pos, libc::SEEK_DATA) {
                Ok(d) => d,
                // No data at or after `pos`: a hole to the end.
                Err(libc::ENXIO) => {
                    out(hole(end - pos));
                    return Ok(());
                }
                // The filesystem cannot tell: data.
                Err(_) => {
                    out(Extent::data(end - pos));
                    return Ok(());
                }
            };
            if data > pos {
                let n = data.min(end) - pos;
                if !out(hole(n)) {
                    return Ok(());
                }
                pos += n;
                continue;
            }
            let h = seek(pos, libc::SEEK_HOLE).unwrap_or(end).max(pos + 1);
            let n = h.min(end) - pos;
            if !out(Extent::data(n)) {
                return Ok(());
            }
            pos += n;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.check_writable()?;
        let fd = self.file.as_raw_fd();
        let done = if self.block_device {
            // BLKZEROOUT = _IO(0x12, 127); the kernel unmaps or uses the
            // device's write-zeroes where it has one.
            const BLKZEROOUT: libc::c_ulong = 0x127f;
            let range: [u64; 2] = [offset, len];
            // SAFETY: the ioctl reads two u64 from a live stack array.
            self.fast_zero && unsafe { libc::ioctl(fd, BLKZEROOUT, range.as_ptr()) } == 0
        } else if let Some(m) = self.mapped() {
            self.zero_mapped(m, offset, len)?
        } else {
            // Zero the range in place, or (tmpfs has no ZERO_RANGE) punch
            // it: a hole reads back as zeros. Both are O(1) in the data.
            // On tmpfs (`!can_block`) straight to the punch: a thin pool
            // zeroes every new block this way, and the refused call cost
            // a syscall each time.
            let zero = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            let modes: &[i32] = if self.can_block {
                &[zero, punch]
            } else {
                &[punch]
            };
            modes
                .iter()
                .any(|&mode| self.fallocate(mode, offset, len).is_ok())
        };
        if done {
            if fua {
                self.sync()?;
            }
            return Ok(());
        }
        crate::core::device::write_zeroes_by_writing(self, offset, len, fua)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::device::submit_and_wait;

    #[test]
    fn vectored_write_lands_contiguously() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.as_file().set_len(1 << 20).unwrap();
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        let pages: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 4096]).collect();
        let iov: Vec<IoSlice> = pages.iter().map(|p| IoSlice::new(p)).collect();
        s.write_vectored(4096, &iov, true).unwrap();
        let mut back = vec![0u8; 100 * 4096];
        s.read(4096, &mut back).unwrap();
        for (i, c) in back.chunks(4096).enumerate() {
            assert!(c.iter().all(|&b| b == i as u8), "page {i}");
        }
    }

    /// A submitted write's deferred step (a layer's cipher) runs before
    /// the bytes go down: on the writer thread where writes go to one
    /// (ext4), so the submitter is free at once; inline on the ring path
    /// (XFS, btrfs, `UDM_FILE_WRITERS=ring`), which says it does not take
    /// the step off the submitter.
    #[test]
    fn a_deferred_step_runs_before_the_write_and_off_the_submitter() {
        let tmp = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        tmp.as_file().set_len(1 << 20).unwrap();
        let s = FileStore::open_with(tmp.path(), OpenFlags::default(), FileIo::Uring).unwrap();
        assert_eq!(s.io_path(), "uring", "/var/tmp must be a disk filesystem");
        let threads = matches!(s.writes, Writes::Threads(_));
        assert_eq!(s.takes_prepare(), threads);
        let mut buf = vec![0x11u8; 64 << 10];
        let (ttx, trx) = std::sync::mpsc::channel();
        let step: crate::core::Prepare = Box::new(move |b: &mut [u8]| {
            b.iter_mut().for_each(|x| *x ^= 0x5a);
            ttx.send(std::thread::current().id()).unwrap();
            Ok(())
        });
        let r = submit_and_wait(&s, true, 8192, &mut buf, Some(step));
        assert!(matches!(r, Some(Ok(()))), "{r:?}");
        let ran_on = trx.recv().unwrap();
        assert_eq!(ran_on != std::thread::current().id(), threads);
        assert!(
            buf.iter().all(|&b| b == 0x11 ^ 0x5a),
            "transformed in place"
        );
        let mut back = vec![0u8; 64 << 10];
        tmp.as_file().read_exact_at(&mut back, 8192).unwrap();
        assert!(back == buf, "the step ran before the write");
        // A failing step fails the write and writes nothing.
        let mut buf = vec![0x22u8; 4096];
        let step: crate::core::Prepare =
            Box::new(|_: &mut [u8]| Err(DevError::Target("step failed".into())));
        let r = submit_and_wait(&s, true, 0, &mut buf, Some(step));
        assert!(matches!(r, Some(Err(_))), "{r:?}");
        let mut head = vec![0xffu8; 4096];
        tmp.as_file().read_exact_at(&mut head, 0).unwrap();
        assert!(head.iter().all(|&b| b == 0), "nothing written");
    }

    /// The same I/O on both paths, on a disk filesystem: the ring is
    /// really used when asked for (its status says so), submissions
    /// complete, and both read back what the other wrote.
    #[test]
    fn both_paths_agree_and_submissions_complete() {
        let tmp = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        tmp.as_file().set_len(4 << 20).unwrap();
        assert!(
            !on_tmpfs(tmp.as_file()),
            "/var/tmp must be a disk filesystem"
        );
        let open = |io| FileStore::open_with(tmp.path(), OpenFlags::default(), io).unwrap();
        let (u, p) = (open(FileIo::Uring), open(FileIo::Pwrite));
        assert_eq!(u.io_path(), "uring");
        assert_eq!(p.io_path(), "pwrite");
        assert!(u.can_submit() && !p.can_submit());
        assert_eq!(u.limits().queue_depth, FILE_QUEUE_DEPTH);
        assert_eq!(
            p.limits().queue_depth,
            FILE_QUEUE_DEPTH,
            "a disk file can block"
        );
        let path = tmp.path().display().to_string();
        let shown: Vec<String> = file_io::reports_for(&path)
            .into_iter()
            .map(|r| r.io)
            .collect();
        assert_eq!(shown, ["uring", "pwrite"]);
        // ext4 cannot take a buffered write without blocking: the ring
        // path writes on a thread of the store (writers.rs); XFS and
        // btrfs keep writes on the ring.
        // SAFETY: fstatfs writes one statfs struct into the zeroed local.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open and `st` is a live, writable struct.
        let rc = unsafe { libc::fstatfs(tmp.as_file().as_raw_fd(), &mut st) };
        assert_eq!(rc, 0);
        if st.f_type as i64 == 0xEF53 {
            let writers: Vec<u32> = file_io::reports_for(&path)
                .into_iter()
                .map(|r| r.writers)
                .collect();
            assert_eq!(writers, [super::super::writers::DEFAULT_WRITERS as u32, 0]);
            if std::env::var_os(super::super::writers::ENV).is_none() {
                let sole: Vec<bool> = file_io::reports_for(&path)
                    .into_iter()
                    .map(|r| r.sole_client_inline)
                    .collect();
                assert_eq!(sole, [true, false]);
            }
            assert!(matches!(u.writes, Writes::Threads(_)), "{u:?}");
        }
        let data: Vec<u8> = (0..(256 << 10)).map(|i| (i % 253) as u8).collect();
        u.write(8192, WriteBuf::Borrowed(&data), true).unwrap();
        let mut back = vec![0u8; data.len()];
        p.read(8192, &mut back).unwrap();
        assert!(back == data);
        p.write_zeroes(8192, 4096, false).unwrap();
        u.discard(12288, 4096).unwrap();
        u.read(8192, &mut back).unwrap();
        assert!(back[..8192].iter().all(|&b| b == 0));
        assert!(back[8192..] == data[8192..]);
        u.flush().unwrap();
        // A submitted write, then a submitted read, completed by the ring.
        for write in [true, false] {
            let mut buf = if write {
                vec![0xc3u8; 65536]
            } else {
                vec![0u8; 65536]
            };
            let r = submit_and_wait(&u, write, 1 << 20, &mut buf, None);
            assert!(matches!(r, Some(Ok(()))), "write {write}: {r:?}");
            assert!(buf.iter().all(|&b| b == 0xc3));
        }
        // Past the end: an error, not a hang or a short success.
        let mut big = vec![0u8; 8192];
        assert!(u.read((4 << 20) - 4096, &mut big).is_err());
    }

    #[test]
    fn a_failed_flush_is_latched_until_reopen() {
        fn eio(_: &File) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        }
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(1 << 20).unwrap();
        let mut s = FileStore::open(f.path(), OpenFlags::default()).unwrap();
        s.flush().unwrap();
        s.sync_fn = Some(eio);
        let first = s.flush().unwrap_err();
        assert_eq!(first.nbd_errno(true), 5, "{first}");
        // The kernel would now report success: the latch must not.
        s.sync_fn = None;
        let second = s.flush().unwrap_err();
        assert!(
            second.to_string().contains("earlier flush failed"),
            "{second}"
        );
        assert!(second.to_string().contains(&*f.path().to_string_lossy()));
        let fua = s.write(0, WriteBuf::Borrowed(&[1; 512]), true);
        assert!(fua.is_err(), "a FUA write needs a flush too");
        let reopened = FileStore::open(f.path(), OpenFlags::default()).unwrap();
        reopened.flush().unwrap();
    }

    #[test]
    fn read_only_refuses_writes() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.as_file().set_len(4096).unwrap();
        let s = open_flags(tmp.path(), |f| f.read_only = true);
        assert!(matches!(
            s.write(0, WriteBuf::Borrowed(&[0u8; 512]), false),
            Err(DevError::ReadOnly)
        ));
    }

    #[test]
    fn write_zeroes_zeroes() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.as_file().set_len(65536).unwrap();
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        s.write(0, WriteBuf::Borrowed(&[0xAA; 65536]), false)
            .unwrap();
        s.write_zeroes(4096, 8192, false).unwrap();
        let mut b = vec![0u8; 65536];
        s.read(0, &mut b).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0xAA));
        assert!(b[4096..12288].iter().all(|&x| x == 0));
        assert!(b[12288..].iter().all(|&x| x == 0xAA));
    }

    /// A scratch file on tmpfs (the mapped path); Linux always has
    /// /dev/shm, and a test that cannot reach the mapped path must fail.
    /// `path` opened with the default flags as `set` changes them.
    fn open_flags(path: &Path, set: impl FnOnce(&mut OpenFlags)) -> FileStore {
        let mut f = OpenFlags::default();
        set(&mut f);
        FileStore::open(path, f).unwrap()
    }

    fn shm_file(len: u64) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new_in("/dev/shm")
            .expect("these tests need a tmpfs at /dev/shm");
        assert!(on_tmpfs(f.as_file()), "/dev/shm is not tmpfs");
        f.as_file().set_len(len).unwrap();
        f
    }

    #[test]
    fn tmpfs_files_are_mapped_and_agree_with_the_syscalls() {
        use crate::core::device::testing::{xored, Xor};
        let tmp = shm_file(1 << 20);
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        assert!(s.direct_access(), "a tmpfs file is mapped");
        let data: Vec<u8> = (0..(600 << 10)).map(|i| (i % 251) as u8).collect();
        let t = Xor::new(4096);
        s.write_transformed(64 << 10, &data, true, &t).unwrap();
        // What the mapping wrote, the syscalls (and other programs) see.
        let mut plain = vec![0u8; data.len()];
        s.read(64 << 10, &mut plain).unwrap();
        assert!(plain == xored(&data));
        let mut back = vec![0u8; data.len()];
        s.read_transformed(64 << 10, &mut back, &t).unwrap();
        assert!(back == data);
        // And the reverse: a pwrite is visible through the mapping.
        s.write(0, WriteBuf::Borrowed(&xored(&data[..8192])), false)
            .unwrap();
        let mut b = vec![0u8; 8192];
        s.read_transformed(0, &mut b, &t).unwrap();
        assert!(b == data[..8192]);

        // Not mapped: when told not to, off tmpfs, read-only writes refused.
        let no = open_flags(tmp.path(), |f| f.no_map = true);
        assert!(!no.direct_access());
        let disk = tempfile::NamedTempFile::new().unwrap();
        disk.as_file().set_len(1 << 20).unwrap();
        if !on_tmpfs(disk.as_file()) {
            let d = FileStore::open(disk.path(), OpenFlags::default()).unwrap();
            assert!(!d.direct_access());
        }
        let ro = open_flags(tmp.path(), |f| f.read_only = true);
        assert!(ro.direct_access());
        let mut b = vec![0u8; 8192];
        ro.read_transformed(0, &mut b, &t).unwrap();
        assert!(b == data[..8192]);
        assert!(matches!(
            ro.write_transformed(0, &b, false, &t),
            Err(DevError::ReadOnly)
        ));
    }

    /// A disk file is mapped: a range whose pages are in the page cache is
    /// `resident` and read through the transform from them; a hole, a
    /// range evicted from the cache, or a store told not to map is not;
    /// plain writes never go through the mapping.
    #[test]
    fn disk_files_read_resident_pages_through_the_mapping() {
        use crate::core::device::testing::{xored, Xor};
        let tmp = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        assert!(
            !on_tmpfs(tmp.as_file()),
            "/var/tmp must be a disk filesystem"
        );
        tmp.as_file().set_len(4 << 20).unwrap();
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        assert!(!s.direct_access(), "writes keep the syscalls");
        let data: Vec<u8> = (0..(512 << 10)).map(|i| (i % 251) as u8).collect();
        s.write(1 << 20, WriteBuf::Borrowed(&xored(&data)), false)
            .unwrap();
        assert!(s.resident(1 << 20, data.len()), "just written: cached");
        assert!(!s.resident(3 << 20, 64 << 10), "a hole is never cached");
        assert!(!s.resident(4 << 20, 4096), "past the end");
        // Written back and dropped from the cache (nothing mapped it yet):
        // no longer resident, and a read takes the syscalls.
        s.flush().unwrap();
        // SAFETY: advice on an open descriptor; no memory is passed.
        let rc = unsafe {
            libc::posix_fadvise(tmp.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
        };
        assert_eq!(rc, 0);
        assert!(!s.resident(1 << 20, data.len()), "evicted");
        let t = Xor::new(4096);
        let mut again = vec![0u8; data.len()];
        s.read_transformed(1 << 20, &mut again, &t).unwrap();
        assert!(again == data);
        // That read brought the pages back: now through the mapping.
        assert!(s.resident(1 << 20, data.len()));
        let mut back = vec![0u8; data.len()];
        s.read_transformed(1 << 20, &mut back, &t).unwrap();
        assert!(back == data);
        // Cached pages are lent as they lie (and counted); a hole is not.
        let mut lent = vec![0u8; data.len()];
        let mut at = 0;
        assert!(s.lend(1 << 20, data.len(), &mut |d| {
            at = d.iov().1;
            d.copy_to(0, &mut lent).unwrap();
        }));
        assert_eq!(at, data.len());
        assert!(xored(&lent) == data);
        assert!(!s.lend(3 << 20, 64 << 10, &mut |_| panic!("a hole was lent")));
        let path = tmp.path().display().to_string();
        let shown = file_io::reports_for(&path);
        assert_eq!(shown.iter().map(|r| r.lent_reads).sum::<u64>(), 1);
        let no = open_flags(tmp.path(), |f| f.no_map = true);
        let mut b = vec![0u8; 4096];
        no.read(1 << 20, &mut b).unwrap();
        assert!(!no.resident(1 << 20, 4096), "--no-mmap maps nothing");
        assert!(!no.lend(1 << 20, 4096, &mut |_| panic!("--no-mmap lent")));
        assert!(s.lends() && !no.lends());
    }

    /// A transformed write of a disk file's range that is all in the page
    /// cache goes straight into the mapped pages (counted), and lands in
    /// the file as `pwrite` would put it; a range not in the cache, a FUA
    /// write's durability, a read-only store and a store told not to map
    /// keep the syscalls. A file shrunk under the mapping fails the write
    /// that touches the lost pages with an error naming the file, and the
    /// store goes on with the syscalls.
    #[test]
    fn disk_files_take_transformed_writes_of_cached_pages_through_the_mapping() {
        use crate::core::device::testing::{xored, Xor};
        let tmp = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
        assert!(
            !on_tmpfs(tmp.as_file()),
            "/var/tmp must be a disk filesystem"
        );
        tmp.as_file().set_len(4 << 20).unwrap();
        let path = tmp.path().display().to_string();
        let mapped_writes = || {
            file_io::reports_for(&path)
                .iter()
                .map(|r| r.mapped_writes)
                .sum::<u64>()
        };
        // Off by default: through the mapping only when asked.
        let plain = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        plain
            .write(0, WriteBuf::Borrowed(&[0u8; 4096]), false)
            .unwrap();
        assert!(!plain.resident_for_write(0, 4096));
        drop(plain);
        let s = FileStore::open_inner(
            tmp.path(),
            OpenFlags::default(),
            file_io::default_io(),
            true,
        )
        .unwrap();
        let t = Xor::new(4096);
        let len = 256 << 10;
        assert!(!s.resident_for_write(1 << 20, len), "a hole is not cached");
        let zeros = vec![0u8; len];
        s.write(1 << 20, WriteBuf::Borrowed(&zeros), false).unwrap();
        assert!(s.resident_for_write(1 << 20, len), "just written: cached");
        let data: Vec<u8> = (0..len).map(|i| (i % 249) as u8).collect();
        s.write_transformed(1 << 20, &data, false, &t).unwrap();
        assert_eq!(mapped_writes(), 1);
        // What the file holds, read past udm's mapping: the transform's
        // output, as a buffered write would have left it.
        let mut on_disk = vec![0u8; len];
        tmp.as_file().read_exact_at(&mut on_disk, 1 << 20).unwrap();
        assert!(on_disk == xored(&data));
        // With FUA: through the mapping, then the file's flush.
        s.write_transformed(1 << 20, &data, true, &t).unwrap();
        assert_eq!(mapped_writes(), 2);
        let mut back = vec![0u8; len];
        s.read_transformed(1 << 20, &mut back, &t).unwrap();
        assert!(back == data);
        // Written with `pwrite`, written back and dropped from the cache
        // (never mapped): not resident, so the syscalls (not counted).
        s.write(2 << 20, WriteBuf::Borrowed(&zeros), false).unwrap();
        s.flush().unwrap();
        // SAFETY: advice on an open descriptor; no memory is passed.
        let rc = unsafe {
            libc::posix_fadvise(
                tmp.as_file().as_raw_fd(),
                2 << 20,
                len as i64,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        assert_eq!(rc, 0);
        assert!(!s.resident_for_write(2 << 20, len), "evicted");
        s.write_transformed(2 << 20, &data, false, &t).unwrap();
        assert_eq!(mapped_writes(), 2);
        tmp.as_file().read_exact_at(&mut on_disk, 2 << 20).unwrap();
        assert!(on_disk == xored(&data));
        let ro = open_flags(tmp.path(), |f| f.read_only = true);
        let no = open_flags(tmp.path(), |f| f.no_map = true);
        let mut b = vec![0u8; len];
        ro.read(1 << 20, &mut b).unwrap();
        assert!(!ro.resident_for_write(1 << 20, len), "read-only");
        assert!(!no.resident_for_write(1 << 20, len), "--no-mmap");
        no.write_transformed(1 << 20, &data, false, &t).unwrap();
        assert_eq!(mapped_writes(), 2);
        // Shrunk under the mapping, with the lost pages still mapped: the
        // write that touches them fails, naming the file; udm lives on.
        s.write(3 << 20, WriteBuf::Borrowed(&zeros), false).unwrap();
        s.write_transformed(3 << 20, &data, false, &t).unwrap();
        assert_eq!(mapped_writes(), 3);
        tmp.as_file().set_len(2 << 20).unwrap();
        // The range is gone from the cache, so the mapping is not even
        // tried; forcing it through (as a request that raced the
        // truncation would) takes the SIGBUS.
        assert!(!s.resident_for_write(3 << 20, len));
        let m = s.page_map.as_ref().unwrap();
        let e = s
            .on_map(m, false, |m| m.write_transformed(3 << 20, &data, false, &t))
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated") && e.contains(&path), "{e}");
        assert!(
            !s.resident_for_write(1 << 20, len),
            "the mapping is abandoned"
        );
        s.write_transformed(1 << 20, &data, false, &t).unwrap();
        tmp.as_file().read_exact_at(&mut on_disk, 1 << 20).unwrap();
        assert!(on_disk == xored(&data));
    }

    /// Reading never-written parts of a sparse tmpfs file must not fill
    /// them in: a read through the mapping would allocate a page per hole,
    /// so holes are read with `pread` (zeros, no allocation).
    #[test]
    fn reading_holes_allocates_nothing() {
        use crate::core::device::testing::{xored, Xor};
        use std::os::unix::fs::MetadataExt;
        let tmp = shm_file(8 << 20);
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        assert!(s.direct_access());
        let t = Xor::new(4096);
        // One written stretch in the middle; the rest is hole.
        let data = vec![0x5au8; 1 << 20];
        s.write_transformed(4 << 20, &data, false, &t).unwrap();
        let blocks = || tmp.as_file().metadata().unwrap().blocks();
        let before = blocks();
        let mut buf = vec![1u8; 8 << 20];
        s.read_transformed(0, &mut buf, &t).unwrap();
        assert!(buf[..4 << 20] == xored(&[0u8; 4 << 20][..]));
        s.read(0, &mut buf).unwrap();
        assert!(buf[..4 << 20].iter().all(|&b| b == 0));
        assert_eq!(blocks(), before, "reads allocated pages for holes");
        // The written stretch alone is read through the mapping, and the
        // same bytes come back.
        let mut back = vec![0u8; 1 << 20];
        s.read_transformed(4 << 20, &mut back, &t).unwrap();
        assert!(back == data);
    }

    /// Write-zeroes on a mapped tmpfs file: a range of holes stays holes
    /// (nothing allocated), a few data pages among holes are cleared in
    /// place (still allocated, zeros), and a dense range is punched; every
    /// byte of each range reads as zeros and nothing outside changes.
    #[test]
    fn zeroing_a_mapped_file_skips_holes_and_clears_sparse_pages() {
        use std::os::unix::fs::MetadataExt;
        let tmp = shm_file(1 << 20);
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        assert!(s.direct_access());
        let kib = || tmp.as_file().metadata().unwrap().blocks() / 2;
        let page = [0xabu8; 4096];
        let put = |at: u64| s.write(at, WriteBuf::Borrowed(&page), false).unwrap();
        // Just before and after each range: must survive.
        for at in [60 << 10, 128 << 10, 252 << 10, 320 << 10] {
            put(at);
        }
        // [64K, 128K): holes only.
        let before = kib();
        s.write_zeroes(64 << 10, 64 << 10, false).unwrap();
        assert_eq!(kib(), before, "zeroing holes allocated pages");
        // [192K, 256K) minus the guard at 252K: two pages among holes.
        put(200 << 10);
        put(236 << 10);
        let before = kib();
        s.write_zeroes(192 << 10, 60 << 10, false).unwrap();
        assert_eq!(kib(), before, "sparse pages cleared in place");
        // [256K, 320K): dense, punched.
        s.write(256 << 10, WriteBuf::Borrowed(&[0xcd; 64 << 10]), false)
            .unwrap();
        let before = kib();
        s.write_zeroes(256 << 10, 64 << 10, false).unwrap();
        assert!(kib() < before, "a dense range is punched");
        let mut b = vec![1u8; 1 << 20];
        s.read(0, &mut b).unwrap();
        for (i, &x) in b.iter().enumerate() {
            let guard = [60, 128, 252, 320].iter().any(|&g| (i >> 10) / 4 == g / 4);
            assert_eq!(x, if guard { 0xab } else { 0 }, "byte {i}");
        }
    }

    /// Another program truncates the file under a mapped store: the next
    /// access to the lost pages fails with an error that says what
    /// happened (instead of the SIGBUS killing udm), and the store goes on
    /// with the syscalls.
    #[test]
    fn truncation_under_a_mapping_is_an_error_not_a_crash() {
        use crate::core::device::testing::Xor;
        let tmp = shm_file(1 << 20);
        let s = FileStore::open(tmp.path(), OpenFlags::default()).unwrap();
        assert!(s.direct_access());
        let t = Xor::new(512);
        let data = vec![7u8; 64 << 10];
        s.write_transformed(0, &data, false, &t).unwrap();
        tmp.as_file().set_len(256 << 10).unwrap();
        // Below the new end: still fine.
        s.write_transformed(0, &data, false, &t).unwrap();
        let e = s
            .write_transformed(512 << 10, &data, false, &t)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("truncated") && e.contains(&tmp.path().display().to_string()),
            "{e}"
        );
        assert!(!s.direct_access(), "the mapping is abandoned");
        // The syscall path: the file is shorter than the device now, so a
        // read past its end fails cleanly too.
        let mut b = vec![0u8; 4096];
        assert!(s.read_transformed(768 << 10, &mut b, &t).is_err());
        s.read_transformed(0, &mut b, &t).unwrap();
    }

    /// udm's SIGBUS handler must not swallow faults that are not in its
    /// mappings: a program's own bad mapping still kills it, as without
    /// udm. Run in a child process (the test binary again, one test).
    #[test]
    fn foreign_sigbus_still_kills() {
        use std::os::unix::process::ExitStatusExt;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "store::file::tests::foreign_sigbus_child",
                "--nocapture",
            ])
            .env("UDM_FOREIGN_SIGBUS", "1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "child: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("handler installed"));
    }

    #[test]
    #[ignore = "run by foreign_sigbus_still_kills in a child process"]
    fn foreign_sigbus_child() {
        if std::env::var_os("UDM_FOREIGN_SIGBUS").is_none() {
            return;
        }
        let ours = shm_file(1 << 20);
        let s = FileStore::open(ours.path(), OpenFlags::default()).unwrap();
        assert!(s.direct_access());
        // Unlinked now (the store keeps it open): nothing is left behind
        // when this process dies.
        drop(ours);
        println!("handler installed");
        let theirs = tempfile::tempfile_in("/dev/shm").unwrap();
        theirs.set_len(1 << 20).unwrap();
        // SAFETY: a fresh shared mapping of our own scratch file; touching it
        // after the truncation is the point of the test (the process must
        // die of SIGBUS).
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                theirs.as_raw_fd(),
                0,
            ) as *mut u8;
            assert!(p as *mut libc::c_void != libc::MAP_FAILED);
            theirs.set_len(0).unwrap();
            std::ptr::write_volatile(p.add(4096), 1);
        }
        unreachable!("the write above raises SIGBUS");
    }
}
