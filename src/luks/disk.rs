//! Positioned I/O on the metadata and data devices. Every write goes through
//! here so that tests can cut the write sequence short and prove the ordering
//! of header updates is crash safe.
//!
//! A path may also name a remote image (`rbd:POOL/IMAGE`, `nbd://…`): the
//! header is then read and written through the store's block device, at any
//! byte offset (reads and writes are widened to its block size here).

use super::error::LuksError;
use crate::core::{BlockDevice, WriteBuf};
use crate::store::{Location, OpenFlags};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

enum Backing {
    File(File),
    Device(Arc<dyn BlockDevice>),
}

/// A metadata or data device (an image file, a block device, or a remote
/// image).
pub struct Disk {
    backing: Backing,
    path: PathBuf,
    /// Writes allowed before a simulated crash (None = unlimited).
    writes_left: Option<usize>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("path", &self.path).finish()
    }
}

fn dev_err(what: String, e: crate::core::DevError) -> LuksError {
    LuksError::io(what, std::io::Error::other(e.to_string()))
}

impl Disk {
    /// A disk over an already opened device (`name` is for messages).
    pub fn from_device(dev: Arc<dyn BlockDevice>, name: &str) -> Disk {
        Disk {
            backing: Backing::Device(dev),
            path: PathBuf::from(name),
            writes_left: None,
        }
    }

    /// Open a remote image named by `path`, if it names one.
    fn open_remote(path: &Path, write: bool) -> Result<Option<Disk>, LuksError> {
        let Some(spec) = path.to_str().filter(|s| Location::is_remote(s)) else {
            return Ok(None);
        };
        let flags = OpenFlags {
            read_only: !write,
            ..OpenFlags::default()
        };
        let dev = crate::store::open(spec, flags)
            .map_err(|e| LuksError::io(format!("cannot open {spec}"), std::io::Error::other(e)))?;
        Ok(Some(Disk::from_device(dev, spec)))
    }

    /// Open `path` read-only or read-write.
    pub fn open(path: &Path, write: bool) -> Result<Disk, LuksError> {
        if let Some(d) = Disk::open_remote(path, write)? {
            return Ok(d);
        }
        Self::open_file(path, OpenOptions::new().read(true).write(write))
    }

    /// Open, creating the file if missing (format). A new file is made
    /// readable by its owner only, as cryptsetup makes a detached header:
    /// it holds the keyslots. A remote image must exist already (create it
    /// with its own tools: `rbd create`).
    pub fn create(path: &Path) -> Result<Disk, LuksError> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(d) = Disk::open_remote(path, true)? {
            return Ok(d);
        }
        Self::open_file(
            path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600),
        )
    }

    fn open_file(path: &Path, opts: &OpenOptions) -> Result<Disk, LuksError> {
        let file = opts
            .open(path)
            .map_err(|e| LuksError::io(format!("cannot open {}", path.display()), e))?;
        Ok(Disk {
            backing: Backing::File(file),
            path: path.to_path_buf(),
            writes_left: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes (works for block devices too).
    pub fn size(&self) -> Result<u64, LuksError> {
        match &self.backing {
            Backing::File(f) => {
                let mut f = f;
                f.seek(SeekFrom::End(0))
                    .map_err(|e| LuksError::io(format!("cannot size {}", self.path.display()), e))
            }
            Backing::Device(d) => Ok(d.size()),
        }
    }

    /// Grow a regular file to `len` bytes (never shrinks). A remote image
    /// is not grown: it must be made large enough with its own tools.
    pub fn grow_to(&self, len: u64) -> Result<(), LuksError> {
        let size = self.size()?;
        if size < len {
            match &self.backing {
                Backing::File(f) => f.set_len(len).map_err(|e| {
                    LuksError::io(format!("cannot resize {}", self.path.display()), e)
                })?,
                Backing::Device(_) => {
                    return Err(LuksError::io(
                        format!("cannot grow {}", self.path.display()),
                        std::io::Error::other(format!(
                            "it has {size} bytes and {len} are needed; resize the image first (e.g. `rbd resize`)"
                        )),
                    ))
                }
            }
        }
        Ok(())
    }

    /// The block-aligned range covering `[off, off+len)` on a device.
    fn widen(d: &dyn BlockDevice, off: u64, len: usize) -> (u64, usize) {
        let bs = u64::from(d.limits().logical_block_size.max(1));
        let start = off / bs * bs;
        let end = (off + len as u64).div_ceil(bs) * bs;
        (
            start,
            (end.min(d.size().max(off + len as u64)) - start) as usize,
        )
    }

    /// Read exactly `buf.len()` bytes at `off`.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<(), LuksError> {
        let blen = buf.len();
        let what = || {
            format!(
                "cannot read {blen} bytes at offset {off} of {}",
                self.path.display()
            )
        };
        let d = match &self.backing {
            Backing::File(f) => {
                return f
                    .read_exact_at(buf, off)
                    .map_err(|e| LuksError::io(what(), e))
            }
            Backing::Device(d) => d,
        };
        if off
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > d.size())
        {
            return Err(LuksError::io(
                what(),
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        let (start, n) = Disk::widen(d.as_ref(), off, buf.len());
        if start == off && n == buf.len() {
            return d.read(off, buf).map_err(|e| dev_err(what(), e));
        }
        let mut tmp = vec![0u8; n];
        d.read(start, &mut tmp).map_err(|e| dev_err(what(), e))?;
        let at = (off - start) as usize;
        buf.copy_from_slice(&tmp[at..at + buf.len()]);
        Ok(())
    }

    /// Allow `n` more writes, then fail every write (test hook for crash safety).
    pub fn set_write_budget(&mut self, n: Option<usize>) {
        self.writes_left = n;
    }

    fn spend(&mut self) -> Result<(), LuksError> {
        match &mut self.writes_left {
            Some(0) => Err(LuksError::io(
                format!("write to {}", self.path.display()),
                std::io::Error::other("simulated crash: write budget exhausted"),
            )),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Write all of `data` at `off`.
    pub fn write_at(&mut self, off: u64, data: &[u8]) -> Result<(), LuksError> {
        self.spend()?;
        let what = || {
            format!(
                "cannot write {} bytes at offset {off} of {}",
                data.len(),
                self.path.display()
            )
        };
        let d = match &self.backing {
            Backing::File(f) => {
                return f
                    .write_all_at(data, off)
                    .map_err(|e| LuksError::io(what(), e))
            }
            Backing::Device(d) => d,
        };
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > d.size())
        {
            return Err(LuksError::io(
                what(),
                std::io::Error::other(format!("beyond the end of the image ({} bytes)", d.size())),
            ));
        }
        let (start, n) = Disk::widen(d.as_ref(), off, data.len());
        if start == off && n == data.len() {
            return d
                .write(off, WriteBuf::Borrowed(data), false)
                .map_err(|e| dev_err(what(), e));
        }
        // Read-modify-write of the blocks the write touches partly.
        let mut tmp = vec![0u8; n];
        d.read(start, &mut tmp).map_err(|e| dev_err(what(), e))?;
        let at = (off - start) as usize;
        tmp[at..at + data.len()].copy_from_slice(data);
        d.write(start, WriteBuf::Owned(&mut tmp), false)
            .map_err(|e| dev_err(what(), e))
    }

    /// Write `len` zero bytes at `off`, in bounded chunks; `progress` gets bytes done.
    pub fn zero(
        &mut self,
        off: u64,
        len: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), LuksError> {
        let chunk = vec![0u8; 1 << 20];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.write_at(off + done, &chunk[..n])?;
            done += n as u64;
            progress(done);
        }
        Ok(())
    }

    /// Make written data durable.
    pub fn sync(&mut self) -> Result<(), LuksError> {
        self.spend()?;
        let what = || format!("cannot sync {}", self.path.display());
        match &self.backing {
            Backing::File(f) => f.sync_data().map_err(|e| LuksError::io(what(), e)),
            Backing::Device(d) => d.flush().map_err(|e| dev_err(what(), e)),
        }
    }
}
