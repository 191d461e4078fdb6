//! One snapshot's state, shared by every target that uses its COW device:
//! the `snapshot` target reading and writing it, the `snapshot-origin`
//! targets of its origin copying chunks into it before they change, and a
//! `snapshot-merge` target moving its chunks back.
//!
//! Chunks are guarded by striped locks: anyone who reads a chunk of the
//! origin on the snapshot's behalf, or the COW copy of a chunk, holds its
//! stripe shared; anyone who creates or removes an exception (a copy
//! before an origin write, a snapshot write, a merge step) holds it
//! exclusively. So an origin write never overwrites a chunk a snapshot is
//! still reading from the origin, and a second write to a chunk being
//! copied waits for the copy. Lock order: stripe, then store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::store::{Kind, Opened, Store};
use crate::core::{BlockDevice, DevError, DevResult, WriteBuf};

const STRIPES: usize = 64;

pub struct Snap {
    pub origin: Arc<dyn BlockDevice>,
    pub cow: Arc<dyn BlockDevice>,
    /// The origin as the registry knows it (see `registry::key`).
    pub origin_key: String,
    pub cow_key: String,
    /// Chunk size in bytes.
    pub chunk: u64,
    /// Bytes of the origin the snapshot covers (its table length).
    pub len: u64,
    /// `PO`: a snapshot write that finds the COW full fails and marks the
    /// snapshot `Overflow` instead of invalidating it.
    pub overflow_ok: bool,
    store: Mutex<Store>,
    stripes: Vec<RwLock<()>>,
    valid: AtomicBool,
    overflowed: AtomicBool,
    pub merge_failed: AtomicBool,
    /// A merge runs (or ran) on this state: origin writes pass it by, and
    /// the `snapshot` target refuses writes.
    pub merging: AtomicBool,
    /// The merging device is suspended: the merge waits (shared here so a
    /// reloaded `snapshot-merge` table pauses the one merge thread).
    pub merge_paused: AtomicBool,
    /// Raised on invalidation and at the end of a merge (`dmsetup wait`).
    events: Mutex<Vec<crate::targets::EventHook>>,
}

/// What a snapshot's constructor gives [`Snap::open`].
pub struct SnapSpec {
    pub origin: Arc<dyn BlockDevice>,
    pub cow: Arc<dyn BlockDevice>,
    pub origin_key: String,
    pub cow_key: String,
    pub kind: Kind,
    pub chunk_sectors: u64,
    pub len: u64,
    pub overflow_ok: bool,
    /// An (empty) reservation of the server's pinned memory, which the
    /// store grows by what it keeps.
    pub pinned: crate::mem::Pinned,
}

/// Largest buffer a chunk is copied through: chunks may be up to 1 GiB,
/// and a copy runs under each of the 64 stripes at once.
const COPY_PIECE: u64 = 1 << 20;

/// Copy `len` bytes from `from` at `src` to `to` at `dst`, a piece at a
/// time (the pieces land in order; durability is the caller's flush).
pub fn copy_range(
    from: &dyn BlockDevice,
    src: u64,
    to: &dyn BlockDevice,
    dst: u64,
    len: u64,
) -> DevResult<()> {
    let mut buf = vec![0u8; len.min(COPY_PIECE) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(COPY_PIECE) as usize;
        from.read(src + done, &mut buf[..n])?;
        to.write(dst + done, WriteBuf::Borrowed(&buf[..n]), false)?;
        done += n as u64;
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Snap {
    pub fn open(s: SnapSpec) -> Result<Snap, String> {
        let (store, opened) = Store::open_pinned(s.cow.clone(), s.kind, s.chunk_sectors, s.pinned)?;
        if opened == Opened::Invalid {
            tracing::warn!("snapshot on {} is marked invalid in its header", s.cow_key);
        }
        Ok(Snap {
            chunk: store.chunk_bytes(),
            origin: s.origin,
            cow: s.cow,
            origin_key: s.origin_key,
            cow_key: s.cow_key,
            len: s.len,
            overflow_ok: s.overflow_ok,
            store: Mutex::new(store),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            valid: AtomicBool::new(opened != Opened::Invalid),
            overflowed: AtomicBool::new(false),
            merge_failed: AtomicBool::new(false),
            merging: AtomicBool::new(false),
            merge_paused: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
        })
    }

    pub fn add_event_hook(&self, h: Option<crate::targets::EventHook>) {
        if let Some(h) = h {
            lock(&self.events).push(h);
        }
    }

    fn raise(&self) {
        for h in lock(&self.events).iter() {
            h.raise();
        }
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub fn shared(&self, chunk: u64) -> RwLockReadGuard<'_, ()> {
        self.stripes[(chunk as usize) % STRIPES]
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn exclusive(&self, chunk: u64) -> RwLockWriteGuard<'_, ()> {
        self.stripes[(chunk as usize) % STRIPES]
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }

    /// The kernel's status line: `Invalid`, `Merge failed`, `Overflow`, or
    /// `<sectors_allocated>/<total_sectors> <metadata_sectors>`.
    pub fn status(&self) -> String {
        if !self.is_valid() {
            return "Invalid".into();
        }
        if self.merge_failed.load(Ordering::Acquire) {
            return "Merge failed".into();
        }
        if self.overflowed.load(Ordering::Acquire) {
            return "Overflow".into();
        }
        let (a, t, m) = self.store().usage();
        format!("{a}/{t} {m}")
    }

    /// Drop the snapshot: reads and writes fail from now on, the header
    /// says so, the origin goes on (the kernel's `__invalidate_snapshot`).
    pub fn invalidate(&self, why: &str) {
        if !self.valid.swap(false, Ordering::AcqRel) {
            return;
        }
        tracing::error!("snapshot on {}: invalidating snapshot: {why}", self.cow_key);
        if let Err(e) = self.store().invalidate() {
            tracing::warn!(
                "snapshot on {}: cannot mark the header invalid: {e}",
                self.cow_key
            );
        }
        self.raise();
    }

    pub fn finished_merge(&self) {
        self.raise();
    }

    pub fn invalid_error(&self) -> DevError {
        DevError::Target(format!(
            "snapshot on {} is invalid (its COW device overflowed or failed): remove it; \
             it cannot be made valid again",
            self.cow_key
        ))
    }

    /// The bytes of chunk `c` of the origin that exist (the last chunk of
    /// an origin whose size is no multiple of the chunk is short).
    pub fn chunk_len(&self, c: u64) -> u64 {
        self.chunk
            .min(self.origin.size().saturating_sub(c * self.chunk))
    }

    /// Copy origin chunk `c` into COW chunk `new`.
    pub fn copy_chunk(&self, c: u64, new: u64) -> DevResult<()> {
        copy_range(
            &*self.origin,
            c * self.chunk,
            &*self.cow,
            new * self.chunk,
            self.chunk_len(c),
        )
    }

    /// Before the origin's chunk `c` changes: give it an exception unless
    /// it has one. Called with the stripe held exclusively. A full or
    /// failing COW invalidates the snapshot; the origin write goes on.
    pub fn copy_out_locked(&self, c: u64) {
        if !self.is_valid()
            || self.merging.load(Ordering::Acquire)
            || c * self.chunk >= self.len
            || self.store().lookup(c).is_some()
        {
            return;
        }
        let Ok(new) = self.store().allocate() else {
            self.invalidate("the COW device is full (Unable to allocate exception)");
            return;
        };
        let r = self
            .copy_chunk(c, new)
            .and_then(|()| self.store().commit(c, new));
        if let Err(e) = r {
            self.invalidate(&format!("copying chunk {c} to the COW device failed: {e}"));
        }
    }

    /// The snapshot's view of `[offset, +buf.len())`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.each_piece(offset, buf.len() as u64, |c, within, at, n| {
            if !self.is_valid() {
                return Err(self.invalid_error());
            }
            let piece = &mut buf[at as usize..(at + n) as usize];
            let _g = self.shared(c);
            let mapped = self.store().lookup(c);
            match mapped {
                Some(new) => self.cow.read(new * self.chunk + within, piece),
                None => self.origin.read(c * self.chunk + within, piece),
            }
        })
    }

    /// A write to the snapshot: the chunk gets its exception first (the
    /// origin's data copied, unless the write covers the whole chunk).
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> DevResult<()> {
        if self.merging.load(Ordering::Acquire) {
            return Err(DevError::Target(format!(
                "snapshot on {} is being merged into its origin: write to the origin",
                self.cow_key
            )));
        }
        self.each_piece(offset, data.len() as u64, |c, within, at, n| {
            let piece = &data[at as usize..(at + n) as usize];
            let _g = self.exclusive(c);
            if !self.is_valid() {
                return Err(self.invalid_error());
            }
            let mapped = self.store().lookup(c);
            let new = match mapped {
                Some(new) => new,
                None => self.new_exception(c, within, piece)?,
            };
            self.cow
                .write(new * self.chunk + within, WriteBuf::Borrowed(piece), fua)
        })
    }

    /// An exception for a snapshot write to chunk `c`: a whole-chunk write
    /// needs no copy of the origin; the data is written by the caller
    /// after the commit either way (rewriting it is harmless).
    fn new_exception(&self, c: u64, within: u64, piece: &[u8]) -> DevResult<u64> {
        let alloc = self.store().allocate();
        let Ok(new) = alloc else {
            if self.overflow_ok {
                if !self.overflowed.swap(true, Ordering::AcqRel) {
                    tracing::error!("snapshot on {}: Snapshot overflowed", self.cow_key);
                    self.raise();
                }
                return Err(DevError::Target(format!(
                    "snapshot on {} overflowed: its COW device is full (grow it)",
                    self.cow_key
                )));
            }
            self.invalidate("the COW device is full (Unable to allocate exception)");
            return Err(self.invalid_error());
        };
        let whole = within == 0 && piece.len() as u64 == self.chunk_len(c);
        let r = if whole {
            self.cow
                .write(new * self.chunk, WriteBuf::Borrowed(piece), false)
        } else {
            self.copy_chunk(c, new)
        };
        if let Err(e) = r.and_then(|()| self.store().commit(c, new)) {
            self.invalidate(&format!("writing chunk {c} to the COW device failed: {e}"));
            return Err(self.invalid_error());
        }
        Ok(new)
    }

    /// Run `f(chunk, offset in chunk, offset in request, length)` for each
    /// chunk-sized piece of `[offset, +len)`.
    pub fn each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(u64, u64, u64, u64) -> DevResult<()>,
    ) -> DevResult<()> {
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let c = pos / self.chunk;
            let within = pos % self.chunk;
            let n = (self.chunk - within).min(end - pos);
            f(c, within, pos - offset, n)?;
            pos += n;
        }
        Ok(())
    }
}
