//! An in-memory store for tests and benchmarks: the cheapest possible
//! bottom, so a benchmark over it measures the layers above.
//!
//! Concurrent access to overlapping ranges is a data race in the memory
//! model only if two calls touch the same bytes at once; the engine orders
//! overlapping requests, and the store itself guards every access with a
//! set of region locks so that even unordered callers stay sound.
//!
//! It offers direct access ([`BlockDevice::read_transformed`] /
//! [`BlockDevice::write_transformed`]): the caller's transform (crypt's
//! cipher) reads the caller's buffer and writes straight into the store's
//! memory, or the reverse, under the region locks, so an encrypted write
//! costs one cipher pass instead of a cipher pass plus a memcpy.
//! [`MemStore::without_direct_access`] builds a store that does not
//! advertise it, for the ablation benchmarks (the old path: transform, then
//! copy).
//!
//! The same store also serves a file's mapped pages
//! ([`MemStore::map_file`], used by `FileStore` for files on tmpfs): the
//! region locks and direct access are the same whatever the memory is.
//!
//! Regions are 256 KiB. A direct-access write holds its region's lock while
//! the cipher runs, so regions must be small enough that the parts of one
//! split request (a 1 MiB request on two threads: two 512 KiB halves) take
//! different locks; and large enough that the per-region cost (a lock and a
//! cipher call, whose setup is fixed) stays small: 256 KiB regions brought
//! the crypt target closer to the bare cipher than 64 KiB ones
//! (benches/crypto_target.rs; docs/BENCHMARKS.md).

use std::sync::RwLock;

use super::filemap::FileMap;
use crate::core::device::{
    read_transformed_by_reading, whole_units, write_transformed_by_writing, Transform,
};
use crate::core::{BlockDevice, DevError, DevResult, Lent, Limits, WriteBuf};

/// Memory-backed block device.
pub struct MemStore {
    /// Start of the memory, `len` bytes, owned by `backing`.
    base: *mut u8,
    len: usize,
    backing: Backing,
    // One lock per 256 KiB region (regions past `MAX_LOCKS` share locks
    // round-robin, so a huge mapped file costs no more than 4096 locks); a
    // request takes the locks of the regions it spans one after the other
    // (never two at once), so requests on different regions never meet and
    // sharing a lock can only delay, never deadlock.
    locks: Box<[RwLock<()>]>,
    /// Whether `direct_access()` says so (off only for ablations).
    direct: bool,
}

const REGION_SHIFT: u32 = 18;
const REGION: usize = 1 << REGION_SHIFT;
const MAX_LOCKS: usize = 4096;

/// Who owns the memory.
enum Backing {
    /// Ours, zero-filled at creation: a leaked boxed slice (so that no Box
    /// asserts uniqueness over memory that `base` points into), freed in
    /// `Drop`.
    Heap,
    /// A file's pages.
    File(FileMap),
}

// SAFETY: all access to the memory goes through `each_region` callers, which hold
// the region lock covering the accessed bytes (shared for reads, exclusive for
// writes), so no two threads access the same byte with one of them writing.
unsafe impl Sync for MemStore {}
// SAFETY: the store owns its memory; moving it between threads is fine.
unsafe impl Send for MemStore {}

impl MemStore {
    /// A zero-filled store of `size` bytes.
    pub fn new(size: u64) -> MemStore {
        let zeroed: Box<[u8]> = vec![0u8; size as usize].into_boxed_slice();
        let len = zeroed.len();
        let base = Box::into_raw(zeroed) as *mut u8;
        MemStore::over(base, len, Backing::Heap)
    }

    /// The pages of a mapped file as a store (see `FileStore`).
    pub(crate) fn map_file(map: FileMap) -> MemStore {
        MemStore::over(map.ptr(), map.len(), Backing::File(map))
    }

    fn over(base: *mut u8, len: usize, backing: Backing) -> MemStore {
        let regions = ((len >> REGION_SHIFT) + 1).min(MAX_LOCKS);
        MemStore {
            base,
            len,
            backing,
            locks: (0..regions).map(|_| RwLock::new(())).collect(),
            direct: true,
        }
    }

    /// SIGBUS faults taken in a mapped file's pages (always 0 on the heap).
    pub(crate) fn faults(&self) -> u64 {
        match &self.backing {
            Backing::Heap => 0,
            Backing::File(m) => m.faults(),
        }
    }

    /// Whether every page of `[offset, offset+len)` is in memory (always
    /// for the heap; for a mapped file, no page of the range is a hole or
    /// swapped out), asked with `mincore`.
    pub(crate) fn resident(&self, offset: u64, len: usize) -> bool {
        if let Backing::Heap = self.backing {
            return true;
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > self.size())
        {
            return false;
        }
        const CHUNK: usize = 1024; // pages per mincore call
        let page = super::filemap::page_size();
        let start = offset as usize & !(page - 1);
        let end = offset as usize + len;
        let mut vec = [0u8; CHUNK];
        let mut at = start;
        while at < end {
            let n = (end - at).min(CHUNK * page);
            // SAFETY: `[at, at+n)` lies inside the mapping (checked above,
            // `at` page-aligned and the mapping page-aligned), and `vec`
            // has room for one byte per page of it.
            let rc = unsafe {
                libc::mincore(self.base.add(at) as *mut libc::c_void, n, vec.as_mut_ptr())
            };
            if rc != 0 || vec[..n.div_ceil(page)].iter().any(|&b| b & 1 == 0) {
                return false;
            }
            at += n;
        }
        true
    }

    fn lock(&self, off: u64) -> &RwLock<()> {
        &self.locks[(off >> REGION_SHIFT) as usize % self.locks.len()]
    }

    /// A zero-filled store that does not advertise direct access, so a crypt
    /// target over it transforms in its own buffers and the store copies
    /// (the ablation of the direct path; the calls still work).
    pub fn without_direct_access(size: u64) -> MemStore {
        let mut m = MemStore::new(size);
        m.direct = false;
        m
    }

    /// Whether the pieces of `[offset, offset+len)` cut at region
    /// boundaries are whole units of `t`: true when the request is aligned
    /// to the granularity and the granularity divides the region size.
    fn pieces_fit(offset: u64, len: usize, t: &dyn Transform) -> bool {
        let g = t.granularity();
        whole_units(t, 0, len) && REGION % g == 0 && offset % g as u64 == 0
    }

    /// Call `f(offset, index_in_request, len)` for each piece of the range
    /// that lies in one lock region.
    fn each_region(&self, offset: u64, len: usize, mut f: impl FnMut(u64, usize, usize)) {
        let mut at = 0usize;
        while at < len {
            let off = offset + at as u64;
            let region_end = ((off >> REGION_SHIFT) + 1) << REGION_SHIFT;
            let n = ((region_end - off) as usize).min(len - at);
            f(off, at, n);
            at += n;
        }
    }

    /// Pointer to byte `offset` (`offset < size`), derived from the whole
    /// slice so that it may be used for a run of bytes.
    fn ptr(&self, offset: u64) -> *mut u8 {
        debug_assert!(offset < self.size());
        // SAFETY: callers pass an offset inside the memory (their range was
        // checked), so the pointer stays in the allocation.
        unsafe { self.base.add(offset as usize) }
    }

    /// Lend `[offset, offset+len)` (inside the store, `len > 0`) to `f`
    /// under the shared locks of its regions, so that no write through
    /// the store changes the bytes meanwhile (nor may `f`'s copy take a
    /// region lock again: it copies under these). `lost` is the error of a
    /// copy that finds a mapped file's pages gone. `false` without calling
    /// `f` for a range over more regions than there are locks.
    pub(crate) fn lend_range(
        &self,
        offset: u64,
        len: usize,
        lost: &dyn Fn() -> DevError,
        f: &mut dyn FnMut(&dyn Lent),
    ) -> bool {
        let first = offset >> REGION_SHIFT;
        let last = (offset + len as u64 - 1) >> REGION_SHIFT;
        if last - first >= self.locks.len() as u64 {
            return false;
        }
        let lent = MemLent {
            store: self,
            offset,
            len,
            lost,
        };
        self.holding(first, last, &mut || f(&lent));
        true
    }

    /// Run `f` holding the shared locks of regions `r..=last` (taken in
    /// ascending order, as writers take theirs one at a time: no cycle).
    fn holding(&self, r: u64, last: u64, f: &mut dyn FnMut()) {
        let _g = self
            .lock(r << REGION_SHIFT)
            .read()
            .unwrap_or_else(|p| p.into_inner());
        if r < last {
            self.holding(r + 1, last, f)
        } else {
            f()
        }
    }

    fn check(&self, offset: u64, len: u64) -> DevResult<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size()) {
            return Err(DevError::OutOfRange {
                offset,
                len,
                size: self.size(),
            });
        }
        Ok(())
    }
}

/// A range of a [`MemStore`] lent for one call ([`MemStore::lend_range`]).
struct MemLent<'a> {
    store: &'a MemStore,
    offset: u64,
    len: usize,
    lost: &'a dyn Fn() -> DevError,
}

impl Lent for MemLent<'_> {
    fn iov(&self) -> (*const u8, usize) {
        (self.store.ptr(self.offset), self.len)
    }

    /// A SIGBUS during the copy (a mapped file truncated under udm) is
    /// caught by the store's handler and counted: the copy then reports
    /// the loss instead of handing on the zeros that replaced the page.
    fn copy_to(&self, skip: usize, dst: &mut [u8]) -> DevResult<()> {
        if skip.checked_add(dst.len()).is_none_or(|e| e > self.len) {
            return Err(DevError::Target(
                "internal error: a copy past the end of lent bytes".into(),
            ));
        }
        if dst.is_empty() {
            return Ok(());
        }
        let before = self.store.faults();
        // SAFETY: `[offset+skip, +dst.len())` lies inside the lent range,
        // which is inside the memory; `lend_range` holds the shared locks
        // of its regions for the whole loan, so no writer of the store
        // touches these bytes during the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.store.ptr(self.offset + skip as u64),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        if self.store.faults() != before {
            return Err((self.lost)());
        }
        Ok(())
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        if let Backing::Heap = self.backing {
            // SAFETY: `base`/`len` came from `Box::into_raw` of a boxed
            // slice of exactly `len` bytes in `new`, freed only here.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base, self.len)) });
        }
        // A file mapping unmaps itself when `backing` drops.
    }
}

impl BlockDevice for MemStore {
    fn size(&self) -> u64 {
        self.len as u64
    }

    fn limits(&self) -> Limits {
        Limits::default()
    }

    /// Memory has no holes; pages that are all zeros are reported as data
    /// that reads as zeros (one pass over the range, under the region
    /// locks), which lets a copy skip them.
    fn extents(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(crate::core::Extent) -> bool,
    ) -> DevResult<()> {
        self.check(offset, len)?;
        const PAGE: u64 = 4096;
        let mut run: Option<crate::core::Extent> = None;
        let mut more = true;
        let mut pos = offset;
        let end = offset + len;
        while pos < end && more {
            let n = (PAGE - pos % PAGE).min(end - pos);
            let zero = {
                let _g = self.lock(pos).read().unwrap_or_else(|p| p.into_inner());
                // SAFETY: `[pos, pos+n)` is inside the memory (checked
                // above) and the shared region lock excludes writers.
                let s = unsafe { std::slice::from_raw_parts(self.ptr(pos), n as usize) };
                s.iter().all(|&b| b == 0)
            };
            match &mut run {
                Some(r) if r.zero == zero => r.len += n,
                _ => {
                    if let Some(r) = run.take() {
                        more = out(r);
                    }
                    run = Some(crate::core::Extent {
                        len: n,
                        hole: false,
                        zero,
                    });
                }
            }
            pos += n;
        }
        if let (true, Some(r)) = (more, run) {
            out(r);
        }
        Ok(())
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.each_region(offset, buf.len(), |off, at, n| {
            let _g = self.lock(off).read().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the range is inside the memory (checked above) and the
            // shared region lock excludes concurrent writers of these bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr(off), buf[at..].as_mut_ptr(), n) };
        });
        Ok(())
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, _fua: bool) -> DevResult<()> {
        let src = data.as_slice();
        self.check(offset, src.len() as u64)?;
        if src.is_empty() {
            return Ok(());
        }
        self.each_region(offset, src.len(), |off, at, n| {
            let _g = self.lock(off).write().unwrap_or_else(|p| p.into_inner());
            // SAFETY: in bounds (checked) and the exclusive region lock
            // excludes every other access to these bytes.
            unsafe { std::ptr::copy_nonoverlapping(src[at..].as_ptr(), self.ptr(off), n) };
        });
        Ok(())
    }

    fn lends(&self) -> bool {
        true
    }

    /// Memory is always in memory; a mapped file's range only when its
    /// pages are (a hole would be allocated by the access).
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        if len == 0 || self.check(offset, len as u64).is_err() || !self.resident(offset, len) {
            return false;
        }
        let lost = || DevError::Io(std::io::Error::other("mapped pages vanished during a read"));
        self.lend_range(offset, len, &lost, f)
    }

    fn direct_access(&self) -> bool {
        self.direct
    }

    /// The transform reads the store's memory (under the shared region lock)
    /// and writes `buf`: no copy besides the transform's own pass.
    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        if !Self::pieces_fit(offset, buf.len(), t) {
            return read_transformed_by_reading(self, offset, buf, t);
        }
        let mut res = Ok(());
        self.each_region(offset, buf.len(), |off, at, n| {
            if res.is_err() {
                return;
            }
            let _g = self.lock(off).read().unwrap_or_else(|p| p.into_inner());
            // SAFETY: `[off, off+n)` is inside the memory (checked above); the
            // shared region lock excludes writers of these bytes for the
            // life of the slice, and `buf` is a distinct allocation.
            let stored = unsafe { std::slice::from_raw_parts(self.ptr(off) as *const u8, n) };
            res = t.apply(at, stored, &mut buf[at..at + n]);
        });
        res
    }

    /// The transform reads `src` and writes the store's memory (under the
    /// exclusive region lock): one pass instead of transform plus memcpy.
    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.check(offset, src.len() as u64)?;
        if !Self::pieces_fit(offset, src.len(), t) {
            return write_transformed_by_writing(self, offset, src, fua, t);
        }
        let mut res = Ok(());
        self.each_region(offset, src.len(), |off, at, n| {
            if res.is_err() {
                return;
            }
            let _g = self.lock(off).write().unwrap_or_else(|p| p.into_inner());
            // SAFETY: `[off, off+n)` is inside the memory (checked above); the
            // exclusive region lock excludes every other access to these
            // bytes for the life of the slice, and `src` is a distinct
            // allocation (a caller cannot hold a slice of the store's
            // memory).
            let stored = unsafe { std::slice::from_raw_parts_mut(self.ptr(off), n) };
            res = t.apply(at, &src[at..at + n], stored);
        });
        res
    }

    fn flush(&self) -> DevResult<()> {
        Ok(())
    }

    fn discard(&self, _offset: u64, _len: u64) -> DevResult<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> DevResult<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.each_region(offset, len as usize, |off, _at, n| {
            let _g = self.lock(off).write().unwrap_or_else(|p| p.into_inner());
            // SAFETY: in bounds (checked) and exclusively locked.
            unsafe { std::ptr::write_bytes(self.ptr(off), 0, n) };
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::device::testing::{xored, Xor};

    #[test]
    fn transformed_io_matches_plain_io_across_regions() {
        let data: Vec<u8> = (0..(3 * REGION + 4096)).map(|i| (i % 253) as u8).collect();
        for (offset, g) in [
            (0u64, 512usize),
            (REGION as u64 - 4096, 4096),
            (7 * 512, 512),
            (3 * 512, 4096), // misaligned for the unit: generic fallback
        ] {
            let m = MemStore::new(8 * REGION as u64);
            assert!(m.direct_access());
            let len = data.len() - data.len() % g;
            let t = Xor::new(g);
            m.write_transformed(offset, &data[..len], false, &t)
                .unwrap();
            if offset % g as u64 == 0 {
                // One call per region piece: direct access was used.
                let pieces = (offset as usize + len).div_ceil(REGION) - offset as usize / REGION;
                assert_eq!(t.calls.get(), pieces, "offset {offset}");
            }
            let mut plain = vec![0u8; len];
            m.read(offset, &mut plain).unwrap();
            assert!(plain == xored(&data[..len]), "offset {offset} g {g}");
            let mut back = vec![0u8; len];
            m.read_transformed(offset, &mut back, &t).unwrap();
            assert!(back == data[..len], "offset {offset} g {g}");
        }
        // The ablation store: same bytes, but it does not advertise it.
        let m = MemStore::without_direct_access(REGION as u64 * 2);
        assert!(!m.direct_access());
        m.write_transformed(512, &data[..REGION], false, &Xor::new(512))
            .unwrap();
        let mut plain = vec![0u8; REGION];
        m.read(512, &mut plain).unwrap();
        assert!(plain == xored(&data[..REGION]));
    }

    #[test]
    fn transformed_io_refuses_bad_ranges_and_partial_units() {
        let m = MemStore::new(REGION as u64);
        let t = Xor::new(512);
        let mut buf = vec![0u8; 1024];
        assert!(matches!(
            m.read_transformed(REGION as u64 - 512, &mut buf, &t),
            Err(DevError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.write_transformed(0, &buf[..100], false, &t),
            Err(DevError::Misaligned { .. })
        ));
        assert!(matches!(
            m.read_transformed(0, &mut buf[..700], &t),
            Err(DevError::Misaligned { .. })
        ));
        // Granularity 0 or larger than the fallback's bounce: an error.
        assert!(m.write_transformed(0, &buf, false, &Xor::new(0)).is_err());
        let big = vec![0u8; 1 << 15];
        let m = MemStore::new(1 << 20);
        assert!(m
            .write_transformed(512, &big, false, &Xor::new(1 << 15))
            .is_err());
    }

    #[test]
    fn round_trip_and_bounds() {
        let m = MemStore::new(3 << 20);
        let data: Vec<u8> = (0..(2 << 20)).map(|i| i as u8).collect();
        m.write(512 << 10, WriteBuf::Borrowed(&data), false)
            .unwrap();
        let mut back = vec![0u8; data.len()];
        m.read(512 << 10, &mut back).unwrap();
        assert_eq!(back, data);
        assert!(m.read(3 << 20, &mut [0u8; 1]).is_err());
    }
}
