//! A regular file or block device, accessed by offset with positional
//! syscalls so that any number of threads share one descriptor without a
//! lock. Flush is `fdatasync`; FUA is a write followed by `fdatasync`.

use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

/// A file or block device as a [`BlockDevice`].
#[derive(Debug)]
pub struct FileStore {
    file: File,
    path: PathBuf,
    size: u64,
    read_only: bool,
    block_device: bool,
    direct: bool,
}

/// How to open a [`FileStore`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenFlags {
    pub read_only: bool,
    /// O_DIRECT: bypass the page cache. Buffers and offsets must then be
    /// aligned to the logical block size, which the engine guarantees.
    pub direct: bool,
}

impl FileStore {
    /// Open `path`, which must exist: a regular file or a block device.
    pub fn open(path: &Path, flags: OpenFlags) -> std::io::Result<FileStore> {
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
        Ok(FileStore {
            file,
            path: path.to_path_buf(),
            size,
            read_only: flags.read_only,
            block_device,
            direct: flags.direct,
        })
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

    fn sync(&self) -> DevResult<()> {
        self.file.sync_data().map_err(DevError::Io)
    }
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
            write_zeroes: true,
            read_only: self.read_only,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.file.read_exact_at(buf, offset).map_err(DevError::Io)
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.check_writable()?;
        self.file.write_all_at(data.as_slice(), offset)?;
        if fua {
            self.sync()?;
        }
        Ok(())
    }

    fn write_vectored(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        self.check_writable()?;
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
            // SAFETY: `iov[..n]` points into live borrowed slices that outlive
            // the call; pwritev only reads from them.
            let rc = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov.as_ptr(),
                    n as i32,
                    pos as libc::off_t,
                )
            };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(DevError::Io(e));
            }
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
        // SAFETY: plain syscall on an open descriptor with integer arguments.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.check_writable()?;
        if !self.block_device {
            // SAFETY: plain syscall on an open descriptor with integer arguments.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            };
            if rc == 0 {
                if fua {
                    self.sync()?;
                }
                return Ok(());
            }
        }
        crate::core::device::write_zeroes_by_writing(self, offset, len, fua)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn read_only_refuses_writes() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.as_file().set_len(4096).unwrap();
        let s = FileStore::open(
            tmp.path(),
            OpenFlags {
                read_only: true,
                direct: false,
            },
        )
        .unwrap();
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
}
