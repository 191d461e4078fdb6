//! Positioned I/O on the metadata and data devices. Every write goes through
//! here so that tests can cut the write sequence short and prove the ordering
//! of header updates is crash safe.

use super::error::LuksError;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A metadata or data device (an image file or a block device).
#[derive(Debug)]
pub struct Disk {
    file: File,
    path: PathBuf,
    /// Writes allowed before a simulated crash (None = unlimited).
    writes_left: Option<usize>,
}

impl Disk {
    /// Open `path` read-only or read-write.
    pub fn open(path: &Path, write: bool) -> Result<Disk, LuksError> {
        Self::open_with(path, OpenOptions::new().read(true).write(write))
    }

    /// Open, creating the file if missing (format).
    pub fn create(path: &Path) -> Result<Disk, LuksError> {
        Self::open_with(
            path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
        )
    }

    fn open_with(path: &Path, opts: &OpenOptions) -> Result<Disk, LuksError> {
        let file = opts
            .open(path)
            .map_err(|e| LuksError::io(format!("cannot open {}", path.display()), e))?;
        Ok(Disk {
            file,
            path: path.to_path_buf(),
            writes_left: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes (works for block devices too).
    pub fn size(&self) -> Result<u64, LuksError> {
        let mut f = &self.file;
        f.seek(SeekFrom::End(0))
            .map_err(|e| LuksError::io(format!("cannot size {}", self.path.display()), e))
    }

    /// Grow a regular file to `len` bytes (never shrinks).
    pub fn grow_to(&self, len: u64) -> Result<(), LuksError> {
        if self.size()? < len {
            self.file
                .set_len(len)
                .map_err(|e| LuksError::io(format!("cannot resize {}", self.path.display()), e))?;
        }
        Ok(())
    }

    /// Read exactly `buf.len()` bytes at `off`.
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<(), LuksError> {
        self.file.read_exact_at(buf, off).map_err(|e| {
            LuksError::io(
                format!(
                    "cannot read {} bytes at offset {off} of {}",
                    buf.len(),
                    self.path.display()
                ),
                e,
            )
        })
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
        self.file.write_all_at(data, off).map_err(|e| {
            LuksError::io(
                format!(
                    "cannot write {} bytes at offset {off} of {}",
                    data.len(),
                    self.path.display()
                ),
                e,
            )
        })
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
        self.file
            .sync_data()
            .map_err(|e| LuksError::io(format!("cannot sync {}", self.path.display()), e))
    }
}
