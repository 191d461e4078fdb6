//! An in-memory store for tests and benchmarks: the cheapest possible
//! bottom, so a benchmark over it measures the layers above.
//!
//! Concurrent access to overlapping ranges is a data race in the memory
//! model only if two calls touch the same bytes at once; the engine orders
//! overlapping requests, and the store itself guards every access with a
//! set of region locks so that even unordered callers stay sound.

use std::cell::UnsafeCell;
use std::sync::RwLock;

use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

/// Memory-backed block device.
pub struct MemStore {
    data: Box<[UnsafeCell<u8>]>,
    // One lock per 1 MiB region; a request takes the locks of the regions it
    // spans in ascending order, so readers of different regions never meet.
    locks: Box<[RwLock<()>]>,
}

const REGION_SHIFT: u32 = 20;

// SAFETY: all access to `data` goes through `each_region` callers, which hold
// the region lock covering the accessed bytes (shared for reads, exclusive for
// writes), so no two threads access the same byte with one of them writing.
unsafe impl Sync for MemStore {}
// SAFETY: the store owns its memory; moving it between threads is fine.
unsafe impl Send for MemStore {}

impl MemStore {
    /// A zero-filled store of `size` bytes.
    pub fn new(size: u64) -> MemStore {
        let zeroed: Box<[u8]> = vec![0u8; size as usize].into_boxed_slice();
        // SAFETY: UnsafeCell<u8> is repr(transparent) over u8, so the slice
        // layout is identical; ownership moves from one box to the other.
        let data: Box<[UnsafeCell<u8>]> =
            unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [UnsafeCell<u8>]) };
        let regions = (size >> REGION_SHIFT) as usize + 1;
        MemStore {
            data,
            locks: (0..regions).map(|_| RwLock::new(())).collect(),
        }
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

    fn ptr(&self, offset: u64) -> *mut u8 {
        self.data[offset as usize].get()
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

impl BlockDevice for MemStore {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    fn limits(&self) -> Limits {
        Limits::default()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.each_region(offset, buf.len(), |off, at, n| {
            let _g = self.locks[(off >> REGION_SHIFT) as usize]
                .read()
                .unwrap_or_else(|p| p.into_inner());
            // SAFETY: the range is inside `data` (checked above) and the
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
            let _g = self.locks[(off >> REGION_SHIFT) as usize]
                .write()
                .unwrap_or_else(|p| p.into_inner());
            // SAFETY: in bounds (checked) and the exclusive region lock
            // excludes every other access to these bytes.
            unsafe { std::ptr::copy_nonoverlapping(src[at..].as_ptr(), self.ptr(off), n) };
        });
        Ok(())
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
            let _g = self.locks[(off >> REGION_SHIFT) as usize]
                .write()
                .unwrap_or_else(|p| p.into_inner());
            // SAFETY: in bounds (checked) and exclusively locked.
            unsafe { std::ptr::write_bytes(self.ptr(off), 0, n) };
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
