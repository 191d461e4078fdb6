//! Which I/O path file stores take (io_uring or pread/pwrite), chosen once
//! per process, and the list of open file stores with the path each took,
//! which `dmsetup status --json` shows.
//!
//! Why a process-wide choice and not an open flag: every file a server
//! opens (table lines, `--file`, LUKS headers, devices created later over
//! the control socket) should take the same path, and the choice belongs
//! to whoever runs the server (`udm serve --file-io`) or the test suite
//! (`UDM_FILE_IO`), not to each caller that opens a path.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};

/// A file store's I/O path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileIo {
    /// `pread`/`pwrite`/`fdatasync`/`fallocate`, on the engine's workers.
    Pwrite,
    /// One io_uring per store; falls back to `Pwrite` (with a logged
    /// reason) where the kernel gives no ring.
    Uring,
}

impl std::str::FromStr for FileIo {
    type Err = String;
    fn from_str(s: &str) -> Result<FileIo, String> {
        match s {
            "pwrite" => Ok(FileIo::Pwrite),
            "uring" | "io_uring" => Ok(FileIo::Uring),
            _ => Err(format!(
                "file I/O path '{s}': give 'uring' (io_uring, the default) or 'pwrite' \
                 (pread/pwrite syscalls)"
            )),
        }
    }
}

/// The environment variable that picks the default path when no caller
/// set one: `pwrite` or `uring` (the test suite runs on both).
pub const ENV: &str = "UDM_FILE_IO";

/// 0: not chosen yet; 1: pwrite; 2: uring.
static DEFAULT: AtomicU8 = AtomicU8::new(0);

/// Set the path file stores opened from now on take.
pub fn set_default_io(io: FileIo) {
    DEFAULT.store(
        match io {
            FileIo::Pwrite => 1,
            FileIo::Uring => 2,
        },
        Ordering::Relaxed,
    );
}

/// The path set by [`set_default_io`], else `UDM_FILE_IO`, else io_uring.
/// An unreadable `UDM_FILE_IO` is reported once and ignored.
pub fn default_io() -> FileIo {
    match DEFAULT.load(Ordering::Relaxed) {
        1 => return FileIo::Pwrite,
        2 => return FileIo::Uring,
        _ => {}
    }
    let io = match std::env::var(ENV) {
        Ok(v) => v.parse().unwrap_or_else(|e| {
            tracing::warn!("{ENV}: {e}; using io_uring");
            FileIo::Uring
        }),
        Err(_) => FileIo::Uring,
    };
    set_default_io(io);
    io
}

/// One open file store, as `dmsetup status --json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoReport {
    /// The path as the table (or option) named it.
    pub path: String,
    /// `uring`, `pwrite` or `mmap` (a tmpfs file, mapped).
    pub io: String,
    /// Whether the file is registered with the ring (io_uring only).
    pub fixed_file: bool,
    /// Requests the engine keeps in flight for it (workers for `pwrite`,
    /// submissions for `uring`); 0: it cannot block, requests run inline.
    pub queue_depth: u32,
    /// Opened with O_DIRECT.
    pub direct: bool,
    /// Threads of its own that run its buffered writes (`uring` on a
    /// filesystem that cannot take them without blocking); 0: none.
    #[serde(default)]
    pub writers: u32,
    /// Those writes run on the event loop itself when it reads for one
    /// client only (`core::sole`): no hand-off to the writer threads.
    #[serde(default)]
    pub sole_client_inline: bool,
    /// Reads answered from its pages in memory, lent where they lie
    /// (`BlockDevice::lend`: sent from the mapping, no copy into a buffer
    /// first), since it was opened.
    #[serde(default)]
    pub lent_reads: u64,
    /// Transformed writes (crypt's ciphertext) written straight into its
    /// pages in memory through the mapping (`BlockDevice::write_transformed`
    /// of a range `resident_for_write` found in the page cache), since it
    /// was opened.
    #[serde(default)]
    pub mapped_writes: u64,
    /// Writes whose layer left its last step (crypt's cipher:
    /// `AsyncIo::prepare`) to the store's write job, run just before its
    /// `pwrite` on the writer thread (or, for a small write of a lone
    /// client, on its event loop), since it was opened.
    #[serde(default)]
    pub prepared_writes: u64,
}

/// A store's report and its live counters.
#[derive(Debug)]
struct Entry {
    report: IoReport,
    lent: AtomicU64,
    mapped_writes: AtomicU64,
    prepared_writes: AtomicU64,
}

static OPEN: Mutex<Vec<Weak<Entry>>> = Mutex::new(Vec::new());

/// A store's entry in the list; it leaves the list when dropped.
#[derive(Debug)]
pub struct Registered(Arc<Entry>);

impl Registered {
    /// Count a read the store lent.
    pub fn lent(&self) {
        self.0.lent.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a write made through the mapping.
    pub fn mapped_write(&self) {
        self.0.mapped_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a write whose deferred step ran on the writer thread.
    pub fn prepared_write(&self) {
        self.0.prepared_writes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Add a store's report to the list of open stores.
pub fn register(report: IoReport) -> Registered {
    let a = Arc::new(Entry {
        report,
        lent: AtomicU64::new(0),
        mapped_writes: AtomicU64::new(0),
        prepared_writes: AtomicU64::new(0),
    });
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    open.retain(|w| w.strong_count() > 0);
    open.push(Arc::downgrade(&a));
    Registered(a)
}

/// The open file stores named `path` (one per open; a path opened twice
/// is listed twice).
pub fn reports_for(path: &str) -> Vec<IoReport> {
    OPEN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|e| e.report.path == path)
        .map(|e| IoReport {
            lent_reads: e.lent.load(Ordering::Relaxed),
            mapped_writes: e.mapped_writes.load(Ordering::Relaxed),
            prepared_writes: e.prepared_writes.load(Ordering::Relaxed),
            ..e.report.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_reports_leave_with_their_store() {
        assert_eq!("uring".parse::<FileIo>(), Ok(FileIo::Uring));
        assert_eq!("pwrite".parse::<FileIo>(), Ok(FileIo::Pwrite));
        let e = "aio".parse::<FileIo>().unwrap_err();
        assert!(e.contains("'aio'") && e.contains("pwrite"), "{e}");
        let r = IoReport {
            path: "/no/such/file-io-test".into(),
            io: "uring".into(),
            fixed_file: true,
            queue_depth: 32,
            direct: false,
            writers: 1,
            sole_client_inline: true,
            lent_reads: 0,
            mapped_writes: 0,
            prepared_writes: 0,
        };
        let reg = register(r.clone());
        assert_eq!(reports_for(&r.path), vec![r.clone()]);
        reg.lent();
        assert_eq!(reports_for(&r.path)[0].lent_reads, 1);
        reg.mapped_write();
        reg.mapped_write();
        assert_eq!(reports_for(&r.path)[0].mapped_writes, 2);
        reg.prepared_write();
        assert_eq!(reports_for(&r.path)[0].prepared_writes, 1);
        drop(reg);
        assert!(reports_for(&r.path).is_empty());
    }
}
