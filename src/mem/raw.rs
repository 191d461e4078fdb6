//! Page-aligned, zero-initialised heap buffers: the unit every pool hands out.
//!
//! Why not `Vec<u8>`: pool buffers are page aligned (crypt sectors never
//! straddle a page, and an `O_DIRECT` store can take them as they are), they
//! never change size, and a pool moves them between its lists by value
//! without touching the allocator. Zero-initialisation makes every byte a
//! valid `u8` (no uninitialised memory is ever exposed), and for large sizes
//! the allocator serves it from fresh zero pages, so it costs no memset and
//! no resident memory until written.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// Alignment of every pool buffer: 4 KiB, the largest crypt sector and
/// `O_DIRECT` unit. Not necessarily the host's page size; what must cover
/// whole pages (locked key memory) uses [`page_size`].
pub const PAGE_SIZE: usize = 4096;

/// The host's page size, asked once: `mlock` and `MADV_DONTDUMP` act on
/// whole pages, which are 16 or 64 KiB on some arm64 and ppc64 kernels, so
/// locked memory sized by a 4 KiB guess would share its pages.
pub fn page_size() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p)
            .ok()
            .filter(|p| p.is_power_of_two() && *p >= PAGE_SIZE)
            .unwrap_or(PAGE_SIZE)
    })
}

/// An owned, page-aligned byte buffer of fixed size (> 0).
pub struct RawBuf {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: RawBuf uniquely owns its allocation (like Box<[u8]>); moving it to
// another thread or sharing `&RawBuf` (read-only bytes) is sound.
unsafe impl Send for RawBuf {}
// SAFETY: see above; `&RawBuf` only gives `&[u8]`.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    /// Allocate `size` zeroed bytes aligned to [`PAGE_SIZE`]. `size` 0 is
    /// rounded up to 1 so the layout is never zero-sized.
    pub fn new(size: usize) -> RawBuf {
        let size = size.max(1);
        let layout = Self::layout(size);
        // SAFETY: layout has non-zero size (size >= 1).
        let p = unsafe { alloc_zeroed(layout) };
        match NonNull::new(p) {
            Some(ptr) => RawBuf { ptr, size },
            None => handle_alloc_error(layout),
        }
    }

    fn layout(size: usize) -> Layout {
        match Layout::from_size_align(size, PAGE_SIZE) {
            Ok(l) => l,
            // Only for sizes near usize::MAX, which no pool requests.
            Err(_) => panic!("buffer size {size} overflows a layout"),
        }
    }

    /// Size in bytes.
    #[inline]
    pub fn size(&self) -> usize {
        self.size
    }

    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `size` initialised bytes (zeroed at
        // allocation, only ever written as bytes) and uniquely owned; the
        // borrow of self prevents mutation for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated by alloc_zeroed with exactly this layout
        // and is freed once (Drop runs once).
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.size)) }
    }
}

impl std::fmt::Debug for RawBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuf").field("size", &self.size).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_is_the_hosts() {
        // SAFETY: sysconf has no memory-safety preconditions.
        let host = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(page_size(), host);
        assert!(page_size().is_power_of_two() && page_size() >= PAGE_SIZE);
    }

    #[test]
    fn aligned_zeroed_and_writable() {
        for size in [0usize, 1, 4096, 5000, 1 << 20] {
            let mut b = RawBuf::new(size);
            assert_eq!(b.size(), size.max(1));
            assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(0xa5);
            assert!(b.as_slice().iter().all(|&x| x == 0xa5));
        }
    }
}
