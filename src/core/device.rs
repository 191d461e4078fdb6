//! The one trait every device implements: backing stores, targets and mapped
//! devices alike, so that any of them can sit under any other (stacking).
//!
//! Requests are synchronous calls on byte offsets. Concurrency comes from the
//! engine running many requests at once on worker threads, so every
//! implementation is `Send + Sync` and must tolerate concurrent calls; the
//! ordering of overlapping requests is the engine's job, not the device's.
//!
//! Buffer ownership is explicit in [`WriteBuf`]: a write either *borrows* the
//! caller's bytes (which must not change) or *hands over* a buffer the engine
//! owns (an NBD payload). A transforming target such as `crypt` encrypts a
//! handed-over buffer in place and needs a bounce buffer only for a borrowed
//! one. Because both variants are plain slices, a target can split one
//! request's CPU work across cores with `split_at_mut`, without copying.

use std::io::IoSlice;

use super::error::DevResult;

/// Sizes and capabilities a device advertises. Stacked devices combine the
/// limits of what is below them with their own ([`Limits::stack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Smallest unit a request may address, in bytes (512 for most devices,
    /// the crypt `sector_size` for a crypt target). Requests must be aligned
    /// to it; the NBD layer does read-modify-write for clients that ignore it.
    pub logical_block_size: u32,
    /// Preferred I/O unit (chunk size, crypt sector size, page size).
    pub optimal_io_size: u32,
    /// Largest single request, in bytes, the device accepts in one call.
    pub max_io_size: u32,
    /// Whether `discard` does something (else it is accepted as a no-op or
    /// refused, per target semantics).
    pub discard: bool,
    /// Whether `write_zeroes` is efficient (not emulated by writing zeros).
    pub write_zeroes: bool,
    /// Whether the device refuses writes.
    pub read_only: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            logical_block_size: 512,
            optimal_io_size: 4096,
            max_io_size: 32 << 20,
            discard: true,
            write_zeroes: true,
            read_only: false,
        }
    }
}

impl Limits {
    /// Limits of a device stacked on `lower`: the coarser block size, the
    /// smaller maximum, and capabilities both have.
    pub fn stack(self, lower: Limits) -> Limits {
        Limits {
            logical_block_size: self.logical_block_size.max(lower.logical_block_size),
            optimal_io_size: self.optimal_io_size.max(lower.optimal_io_size),
            max_io_size: self.max_io_size.min(lower.max_io_size),
            discard: self.discard && lower.discard,
            write_zeroes: self.write_zeroes && lower.write_zeroes,
            read_only: self.read_only || lower.read_only,
        }
    }
}

/// The data of a write, with its ownership stated.
#[derive(Debug)]
pub enum WriteBuf<'a> {
    /// The caller's bytes; they must reach the device unchanged and must not
    /// be modified (a target that transforms data needs its own buffer).
    Borrowed(&'a [u8]),
    /// A buffer whose contents the caller gives up: the callee may transform
    /// it in place (encrypt) before passing it down. Its contents after the
    /// call are unspecified.
    Owned(&'a mut [u8]),
}

impl<'a> WriteBuf<'a> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            WriteBuf::Borrowed(b) => b,
            WriteBuf::Owned(b) => b,
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Split into `[0, mid)` and `[mid, len)` keeping the ownership kind;
    /// used to cut a request at a chunk or segment boundary without copying.
    pub fn split_at(self, mid: usize) -> (WriteBuf<'a>, WriteBuf<'a>) {
        match self {
            WriteBuf::Borrowed(b) => {
                let (x, y) = b.split_at(mid);
                (WriteBuf::Borrowed(x), WriteBuf::Borrowed(y))
            }
            WriteBuf::Owned(b) => {
                let (x, y) = b.split_at_mut(mid);
                (WriteBuf::Owned(x), WriteBuf::Owned(y))
            }
        }
    }

    /// Reborrow for a call that should not consume `self`.
    pub fn reborrow(&mut self) -> WriteBuf<'_> {
        match self {
            WriteBuf::Borrowed(b) => WriteBuf::Borrowed(b),
            WriteBuf::Owned(b) => WriteBuf::Owned(b),
        }
    }
}

/// A block device: anything that serves reads and writes by byte offset.
///
/// Contract for implementors:
/// - `offset + len` of every call has been checked against `size()` by the
///   caller (mapped devices and the NBD layer check; targets may assume it),
///   and data calls are aligned to `limits().logical_block_size`.
/// - Calls may run concurrently from many threads.
/// - A call that returns `Ok` for a write with `fua = true` has made the data
///   durable; `flush` makes every write that returned before it durable.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// Advertised limits.
    fn limits(&self) -> Limits;

    /// Read `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()>;

    /// Write `data` at `offset`; durable on return when `fua`.
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()>;

    /// Write several buffers back to back starting at `offset` (a scatter
    /// list, e.g. the pages of a crypt bounce buffer). The default writes
    /// them one by one; stores override it with one vectored syscall.
    fn write_vectored(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        let mut pos = offset;
        for (i, b) in bufs.iter().enumerate() {
            let last = i + 1 == bufs.len();
            self.write(pos, WriteBuf::Borrowed(b), fua && last)?;
            pos += b.len() as u64;
        }
        Ok(())
    }

    /// Make every completed write durable.
    fn flush(&self) -> DevResult<()>;

    /// Hint that `[offset, offset+len)` is unused; contents afterwards are
    /// unspecified.
    fn discard(&self, offset: u64, len: u64) -> DevResult<()>;

    /// Make `[offset, offset+len)` read back as zeros.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()>;
}

/// Write zeros through ordinary writes, for devices that have no cheaper
/// way (crypt: zeros must be encrypted). Uses one reusable zero buffer.
pub fn write_zeroes_by_writing(
    dev: &dyn BlockDevice,
    offset: u64,
    len: u64,
    fua: bool,
) -> DevResult<()> {
    const CHUNK: usize = 1 << 20;
    let mut buf = vec![0u8; (len as usize).min(CHUNK)];
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let n = ((end - pos) as usize).min(CHUNK);
        // Owned: the target may encrypt in place, so re-zero each round.
        buf[..n].fill(0);
        dev.write(
            pos,
            WriteBuf::Owned(&mut buf[..n]),
            fua && pos + n as u64 == end,
        )?;
        pos += n as u64;
    }
    Ok(())
}
