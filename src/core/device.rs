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
//! one (and none at all over a device with direct access, below). Because both variants are plain slices, a target can split one
//! request's CPU work across cores with `split_at_mut`, without copying.
//!
//! Direct access ([`Transform`], [`BlockDevice::read_transformed`],
//! [`BlockDevice::write_transformed`]) is the userspace analogue of the
//! kernel's DAX `direct_access`: a device whose data lives in memory lets
//! the caller's transform move the bytes between the caller's buffer and
//! that memory. Why: an out-of-place cipher pass costs the same as an
//! in-place one, so a crypt target over an in-memory store can encrypt
//! straight into the store (and decrypt straight out of it) instead of
//! running the cipher *and* a memcpy over every byte.

use std::io::IoSlice;

use super::error::{DevError, DevResult};

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
    /// Requests the device needs in flight at once to reach its speed, for
    /// a device whose calls wait on a network round trip (an RBD image, a
    /// remote NBD export); 0 for a device that completes in the caller's
    /// time (memory, a local file). Calls stay synchronous: the engine
    /// gives such a device this many workers of its own and never runs its
    /// requests on a connection's reader, so a slow round trip costs a
    /// sleeping thread, not the client's queue depth.
    pub queue_depth: u32,
    /// Bytes a request may not cross a multiple of, counted from the
    /// device's own offset 0; 0 for none. This is dm's `max_io_len`
    /// (dm-stripe sets it to its chunk): the dm core (`dm::Routes`) cuts
    /// every request at these boundaries before it reaches the device, so
    /// a target maps pieces that never cross one, and cutting is written
    /// once for all targets. A device that declares one may refuse a
    /// request that crosses it. It is in the device's own offsets, so
    /// [`Limits::stack`] does not carry it up: a device below cuts its
    /// own requests, or its upper one is routed through the dm core.
    pub io_boundary: u64,
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
            queue_depth: 0,
            io_boundary: 0,
        }
    }
}

impl Limits {
    /// Limits of a device stacked on `lower`: the coarser block size, the
    /// smaller maximum, and capabilities both have; no I/O boundary (each
    /// is in its own device's offsets, see [`Limits::io_boundary`]).
    pub fn stack(self, lower: Limits) -> Limits {
        Limits {
            logical_block_size: self.logical_block_size.max(lower.logical_block_size),
            optimal_io_size: self.optimal_io_size.max(lower.optimal_io_size),
            max_io_size: self.max_io_size.min(lower.max_io_size),
            discard: self.discard && lower.discard,
            write_zeroes: self.write_zeroes && lower.write_zeroes,
            read_only: self.read_only || lower.read_only,
            queue_depth: self.queue_depth.max(lower.queue_depth),
            io_boundary: 0,
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

/// A byte transform applied while data moves between a caller's buffer and
/// a device's memory (direct access). The crypt target implements it with
/// its cipher: encryption for writes, decryption for reads.
///
/// A device may cut a request into pieces (at its own lock or page
/// boundaries) and call the transform once per piece; `at` is the piece's
/// byte offset within the request. Every piece's `at` and length are
/// multiples of [`Transform::granularity`] — a device that cannot honour
/// that for a request must not call `apply` with such a piece (it falls back
/// to [`read_transformed_by_reading`] / [`write_transformed_by_writing`],
/// whose pieces always are whole units).
pub trait Transform {
    /// The unit the transform must see whole (the crypt sector size); a
    /// power of two.
    fn granularity(&self) -> usize;

    /// Transform `src` into `dst` (same length; they never overlap).
    fn apply(&self, at: usize, src: &[u8], dst: &mut [u8]) -> DevResult<()>;

    /// Transform `buf` in place (used by the fallbacks, which have no
    /// second buffer).
    fn apply_in_place(&self, at: usize, buf: &mut [u8]) -> DevResult<()>;
}

/// Whether a piece at `at` of `len` bytes is whole units of `t`.
#[inline]
pub fn whole_units(t: &dyn Transform, at: usize, len: usize) -> bool {
    let g = t.granularity();
    g != 0 && at % g == 0 && len % g == 0
}

/// Largest piece [`write_transformed_by_writing`] transforms at once; it
/// lives on the stack, so the fallback allocates nothing.
const FALLBACK_BOUNCE: usize = 16 << 10;

/// The generic `read_transformed`: read the bytes into `buf`, then apply the
/// transform in place. Correct for every device; no faster than a plain
/// read followed by the transform.
pub fn read_transformed_by_reading(
    dev: &(impl BlockDevice + ?Sized),
    offset: u64,
    buf: &mut [u8],
    t: &dyn Transform,
) -> DevResult<()> {
    if !whole_units(t, 0, buf.len()) {
        return Err(DevError::Misaligned {
            offset,
            len: buf.len() as u64,
            align: t.granularity() as u32,
        });
    }
    dev.read(offset, buf)?;
    t.apply_in_place(0, buf)
}

/// The generic `write_transformed`: transform `src` piece by piece into a
/// stack buffer and write each piece (with `fua` on every piece, so the
/// whole range is durable on return when asked). Correct for every device,
/// allocates nothing; slower than a device's own direct access.
pub fn write_transformed_by_writing(
    dev: &(impl BlockDevice + ?Sized),
    offset: u64,
    src: &[u8],
    fua: bool,
    t: &dyn Transform,
) -> DevResult<()> {
    let g = t.granularity();
    if !whole_units(t, 0, src.len()) || g > FALLBACK_BOUNCE {
        return Err(DevError::Misaligned {
            offset,
            len: src.len() as u64,
            align: g as u32,
        });
    }
    let mut bounce = [0u8; FALLBACK_BOUNCE];
    let step = FALLBACK_BOUNCE - FALLBACK_BOUNCE % g;
    for (k, piece) in src.chunks(step).enumerate() {
        let at = k * step;
        let dst = &mut bounce[..piece.len()];
        t.apply(at, piece, dst)?;
        dev.write(offset + at as u64, WriteBuf::Borrowed(dst), fua)?;
    }
    Ok(())
}

/// The allocation state of a run of bytes (NBD's `base:allocation`): a
/// `hole` has no storage behind it, and `zero` bytes read as zeros. Data
/// is `hole: false`; "not known to be zero" is always a safe answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub hole: bool,
    pub zero: bool,
}

impl Extent {
    /// Allocated data, not known to read as zeros.
    pub fn data(len: u64) -> Extent {
        Extent {
            len,
            hole: false,
            zero: false,
        }
    }
}

/// Ask `dev` for the extents of `[offset, offset+len)` and pass them to
/// `out`, clipped to the range and completed (as data) if the device
/// reported less without being stopped. Returns whether `out` wants more
/// (false: it stopped the walk). Devices that forward to lower devices
/// call this, so a lower device's mistake cannot put a reply out of
/// range.
pub fn extents_of(
    dev: &(impl BlockDevice + ?Sized),
    offset: u64,
    len: u64,
    out: &mut dyn FnMut(Extent) -> bool,
) -> DevResult<bool> {
    let mut seen = 0u64;
    let mut more = true;
    dev.extents(offset, len, &mut |e| {
        let n = e.len.min(len - seen);
        if n == 0 {
            return seen < len;
        }
        seen += n;
        more = out(Extent { len: n, ..e });
        more && seen < len
    })?;
    if more && seen < len {
        more = out(Extent::data(len - seen));
    }
    Ok(more)
}

/// Bytes a device lends where they lie, for the length of one call
/// ([`BlockDevice::lend`]).
///
/// Why not a slice: the bytes are a file's pages, and a page may vanish
/// under udm (another program truncates the file). The kernel, copying
/// from [`Lent::iov`] into a socket, then fails the call (`EFAULT`); a copy
/// in user space must go through [`Lent::copy_to`], which catches the
/// fault and reports it.
pub trait Lent {
    /// The bytes' address and length, for system calls that copy from
    /// them (`writev`); never to be read from user space.
    fn iov(&self) -> (*const u8, usize);

    /// Copy the bytes from `skip` on into `dst` (`dst.len()` of them), as
    /// a read would: an error when pages vanished meanwhile.
    fn copy_to(&self, skip: usize, dst: &mut [u8]) -> DevResult<()>;
}

/// One read or write handed to [`BlockDevice::submit`]: the device starts
/// it and returns at once; `done` receives the result later, on whatever
/// thread the device completes on.
///
/// Why a second, asynchronous way in: a store that waits on a network
/// (RBD) completes from its library's callback thread anyway. Run
/// synchronously, every request costs two thread switches in the server
/// (wake a worker to submit, wake it again from the callback to reply) on
/// top of the library's own; submitted from the connection's reader and
/// completed in the callback, it costs none. Only the simplest stacks
/// offer it (a store, with linear layers and mapped devices forwarding);
/// everything else, and every request a device does not take, runs the
/// synchronous way on a worker.
pub struct AsyncIo {
    /// Read into, or write from, `buf[..len]`.
    pub write: bool,
    /// Durable on completion (writes).
    pub fua: bool,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
    /// Called exactly once: `Some(result)` when the I/O finished, `None`
    /// when the device did not take the request (it was not started and
    /// the caller runs it the synchronous way). May run on the submitting
    /// thread, before `submit` returns, or on any other thread.
    pub done: Box<dyn FnOnce(Option<DevResult<()>>) + Send>,
    /// A write's last step before its bytes go down, left to the thread
    /// that does the write ([`AsyncIo::ready`]).
    pub prepare: Option<Prepare>,
}

/// Work a layer leaves to the device that does a write: run once on
/// `buf[..len]` just before the bytes go down, on whatever thread does
/// them. Why: a crypt layer over a file store with a writer thread
/// encrypts there, so the connection's reader goes back to the socket at
/// once instead of spending the cipher's pass first.
pub type Prepare = Box<dyn FnOnce(&mut [u8]) -> DevResult<()> + Send>;

impl AsyncIo {
    /// Run the pending [`AsyncIo::prepare`], if any, on this thread. A
    /// device calls it once it has taken the write (it will complete it
    /// with `Some`, never decline it after this), before it reads the
    /// buffer.
    pub fn ready(&mut self) -> DevResult<()> {
        match self.prepare.take() {
            Some(f) => {
                // SAFETY: the submit contract: `buf[..len]` is valid and
                // ours until `done`.
                let b = unsafe { std::slice::from_raw_parts_mut(self.buf, self.len) };
                f(b)
            }
            None => Ok(()),
        }
    }

    /// The same request at another offset (a linear layer's shift).
    pub fn at(mut self, offset: u64) -> AsyncIo {
        self.offset = offset;
        self
    }

    /// Refuse it: `done(None)`.
    pub fn decline(self) {
        (self.done)(None)
    }
}

/// Test helper: submit one request to `dev` and wait for its completion;
/// `None` when the device declined it.
#[cfg(test)]
pub(crate) fn submit_and_wait(
    dev: &dyn BlockDevice,
    write: bool,
    offset: u64,
    buf: &mut [u8],
    prepare: Option<Prepare>,
) -> Option<DevResult<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let io = AsyncIo {
        write,
        fua: false,
        offset,
        buf: buf.as_mut_ptr(),
        len: buf.len(),
        prepare,
        done: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    };
    // SAFETY: `buf` outlives the call and is not touched until the
    // completion has run, which `recv_timeout` waits for (a device that
    // never completes fails the test; a dropped `done` too).
    unsafe { dev.submit(io) };
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the device called `done`")
}

/// Drop `a` where dropping the last reference cannot run inside a storage
/// library's completion callback: if this is the last reference, the value
/// is dropped on a thread of its own. Why: closing an RBD image waits for
/// librbd's own threads, so a completion that held the last reference to
/// the image (through a queue or a table) and closed it there would wait
/// for itself. Only the last reference pays the thread.
pub fn drop_outside_callback<T: Send + 'static>(a: std::sync::Arc<T>) {
    if let Some(v) = std::sync::Arc::into_inner(a) {
        let spawned = std::thread::Builder::new()
            .name("udm-release".into())
            .spawn(move || drop(v));
        if let Err(e) = spawned {
            // Not dropping it is the safe failure (a leak, not a hang).
            tracing::warn!("cannot start a thread to release a device: {e}");
        }
    }
}

/// How a device that keeps per-sector metadata lays it out: `tag_size`
/// bytes beside every `sector_size` bytes of data. Why it exists: dm-crypt
/// with `integrity:<bytes>:<type>` (authenticated LUKS2) stores each
/// sector's authentication tag and random IV in the tag area of the
/// dm-integrity device below it; the kernel passes them as the bio's
/// integrity payload, udm as the `tags` slice of [`BlockDevice::read_tagged`]
/// and [`BlockDevice::write_tagged`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagLayout {
    /// Data bytes covered by one tag (the integrity sector size).
    pub sector_size: u32,
    /// Tag bytes per sector.
    pub tag_size: u32,
}

impl TagLayout {
    /// Tag bytes that go with `data_len` bytes of data, or `None` when
    /// `data_len` is not whole sectors.
    pub fn tags_for(&self, data_len: usize) -> Option<usize> {
        let s = self.sector_size as usize;
        (s != 0 && data_len % s == 0).then(|| data_len / s * self.tag_size as usize)
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

    /// Whether this device implements [`read_transformed`] and
    /// [`write_transformed`] by direct access to its memory, i.e. calling
    /// them is cheaper than a plain read/write plus the transform. Callers
    /// (crypt) use them only when this is true.
    ///
    /// Why a method and not a [`Limits`] field: limits are copied and
    /// stacked by wrapping devices (`..lower.limits()`); a capability that
    /// needs an implementation must not be inherited by a wrapper that does
    /// not forward the calls. Only a device that overrides the two methods
    /// says `true`; every other device keeps the default `false`.
    ///
    /// [`read_transformed`]: BlockDevice::read_transformed
    /// [`write_transformed`]: BlockDevice::write_transformed
    fn direct_access(&self) -> bool {
        false
    }

    /// Whether [`BlockDevice::read_transformed`] of `[offset, offset+len)`
    /// would be served from memory right now, with no wait for a disk or
    /// a network: a file whose pages for the range are in the page cache
    /// and mapped into udm. A crypt target then decrypts straight out of
    /// those pages on the thread that has the request, instead of a read
    /// that copies them into its buffer first (one pass over the data
    /// instead of two). The answer may be stale by the time of the read
    /// (pages evicted meanwhile): the read then waits for the disk, which
    /// is correct, only slower. Default `false`.
    fn resident(&self, offset: u64, len: usize) -> bool {
        let _ = (offset, len);
        false
    }

    /// Whether [`BlockDevice::write_transformed`] of `[offset,
    /// offset+len)` would write straight into pages in memory, with no wait
    /// for a disk: a file whose pages for the range are in the page cache
    /// and mapped writable into udm. A crypt target then encrypts straight
    /// into those pages (one pass, no `pwrite`) on the thread that has the
    /// request, cut over its crypto threads, instead of encrypting in its
    /// buffer and handing that to the store's writer. As with `resident`,
    /// the answer may be stale; the write is then correct, only slower.
    /// Default `false`.
    fn resident_for_write(&self, offset: u64, len: usize) -> bool {
        let _ = (offset, len);
        false
    }

    /// Lend `[offset, offset+len)` to `f` where the bytes lie, for the
    /// length of the call: a file's pages in the page cache, mapped into
    /// udm. A front end then sends them from there, one copy (into the
    /// socket) where a read into its buffer and a send of that buffer make
    /// two; for a 1 MiB read that first copy and its page-cache lookups
    /// were a large share of the server's CPU. Returns `false` without calling `f`
    /// when the device cannot: the range is not all in memory now, it is
    /// cut across devices, or the device transforms what it stores. The
    /// caller holds the range as for a read (no conflicting write runs
    /// during the call). Default `false`.
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        let _ = (offset, len, f);
        false
    }

    /// Whether [`BlockDevice::lend`] may ever lend (a method, as
    /// [`BlockDevice::direct_access`]): the engine offers reads only to a
    /// device that says so, so a crypt read pays nothing for the offer.
    /// Only a device that implements or forwards `lend` says `true`.
    fn lends(&self) -> bool {
        false
    }

    /// Whether [`BlockDevice::submit`] may take requests. Like
    /// [`BlockDevice::direct_access`] a method, not a limit: only a device
    /// that implements `submit` (or forwards it to one that does) says
    /// `true`. The engine asks it to choose the path of a request; a
    /// device that says `true` may still decline a given request.
    fn can_submit(&self) -> bool {
        false
    }

    /// Whether [`BlockDevice::submit`] runs a write's
    /// [`AsyncIo::prepare`] on the thread that does the write rather than
    /// on the submitter's: a file store whose writes go to its writer
    /// thread (layers forward it). Only then does a layer leave work
    /// there; a device that says `true` runs the step before it reads the
    /// buffer and, once it has, completes the write (never declines it).
    fn takes_prepare(&self) -> bool {
        false
    }

    /// Start `io` and return without waiting; `io.done` gets the result
    /// (see [`AsyncIo`]). The default declines.
    ///
    /// # Safety
    ///
    /// `io.buf[..io.len]` must be valid for reads (a write) or writes (a
    /// read), not be accessed by anyone else, and stay allocated until
    /// `io.done` has been called; the device must not touch it after
    /// calling `done`. The caller keeps `self` alive until then too (a
    /// layer may refer to itself from the completion).
    unsafe fn submit(&self, io: AsyncIo) {
        io.decline()
    }

    /// Read `buf.len()` bytes at `offset` through `t`: `buf` receives the
    /// transform of the stored bytes (`apply(at, stored, buf_piece)`).
    /// `buf.len()` is a multiple of `t.granularity()`. The default reads
    /// into `buf` and transforms in place ([`read_transformed_by_reading`]),
    /// so it is correct for every device.
    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        read_transformed_by_reading(self, offset, buf, t)
    }

    /// Write the transform of `src` at `offset` (`apply(at, src_piece,
    /// stored)`); `src` is not modified; durable on return when `fua`.
    /// `src.len()` is a multiple of `t.granularity()`. The default goes
    /// through a stack bounce buffer ([`write_transformed_by_writing`]).
    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        write_transformed_by_writing(self, offset, src, fua, t)
    }

    /// The per-sector metadata this device keeps, if any ([`TagLayout`]).
    /// A method, not a [`Limits`] field, for the reason given at
    /// [`BlockDevice::direct_access`]: only a device that implements the
    /// tagged calls (or forwards them whole) may say `Some`.
    fn tag_layout(&self) -> Option<TagLayout> {
        None
    }

    /// Read `buf.len()` bytes at `offset` and the tags that go with them
    /// into `tags` (`tag_layout().tags_for(buf.len())` bytes). The default
    /// refuses: the device keeps no tags.
    fn read_tagged(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> DevResult<()> {
        let _ = (offset, buf, tags);
        Err(DevError::NotSupported(
            "tagged read: the device keeps no integrity tags",
        ))
    }

    /// Write `data` at `offset` with its tags, both durable on return when
    /// `fua`. Data and tags of a sector must never be seen out of step
    /// after a crash (the integrity target's journal gives that).
    fn write_tagged(&self, offset: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        let _ = (offset, data, tags, fua);
        Err(DevError::NotSupported(
            "tagged write: the device keeps no integrity tags",
        ))
    }

    /// Make every completed write durable.
    fn flush(&self) -> DevResult<()>;

    /// Hint that `[offset, offset+len)` is unused; contents afterwards are
    /// unspecified.
    fn discard(&self, offset: u64, len: u64) -> DevResult<()>;

    /// Make `[offset, offset+len)` read back as zeros.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()>;

    /// Report the allocation of `[offset, offset+len)` as consecutive
    /// extents in order, through `out`, which returns false once it has
    /// enough (the walk may then stop early). Why: a client copying a
    /// sparse image (`nbdcopy`, `qemu-img convert`) skips what is reported
    /// as holes or zeros, so the copy costs the data, not the size. The
    /// default says "all data" — always correct, never fast — so a device
    /// that cannot tell keeps working unchanged.
    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        let _ = offset;
        out(Extent::data(len));
        Ok(())
    }
}

/// Zeros to write from, shared by every caller: a static in the zero
/// page-backed .bss, so reading it costs no memory at all.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Write zeros through ordinary writes, for devices that have no cheaper
/// way (crypt: zeros must be encrypted). The zeros are *borrowed* from a
/// static buffer, so nothing is allocated on the request path: a
/// transforming device encrypts them into its own (budgeted) bounce
/// memory, as for any borrowed write.
pub fn write_zeroes_by_writing(
    dev: &dyn BlockDevice,
    offset: u64,
    len: u64,
    fua: bool,
) -> DevResult<()> {
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let n = ((end - pos) as usize).min(ZEROS.len());
        dev.write(
            pos,
            WriteBuf::Borrowed(&ZEROS[..n]),
            fua && pos + n as u64 == end,
        )?;
        pos += n as u64;
    }
    Ok(())
}

/// A device that refuses every I/O with `why`: what `udm table check`
/// builds over. The mapper's placeholder for each device a check does not
/// open is one, unlimited in size so that any area fits ([`unopened`]);
/// so are the targets a check builds without their devices (the thin
/// targets' stand-ins), which keep their table line in `line`.
pub struct Refusing<L = ()> {
    pub size: u64,
    pub why: &'static str,
    pub line: L,
}

impl<L: Send + Sync> Refusing<L> {
    fn refuse<T>(&self) -> DevResult<T> {
        Err(DevError::NotSupported(self.why))
    }
}

impl<L: Send + Sync> BlockDevice for Refusing<L> {
    fn size(&self) -> u64 {
        self.size
    }
    fn limits(&self) -> Limits {
        Limits::default()
    }
    fn read(&self, _: u64, _: &mut [u8]) -> DevResult<()> {
        self.refuse()
    }
    fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
        self.refuse()
    }
    fn flush(&self) -> DevResult<()> {
        self.refuse()
    }
    fn discard(&self, _: u64, _: u64) -> DevResult<()> {
        self.refuse()
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
        self.refuse()
    }
}

/// Whether `dev` is a table check's placeholder for a device it did not
/// open (a [`Refusing`] device of unlimited size): a constructor given one
/// checks its line and reads nothing from the device.
pub fn unopened(dev: &dyn BlockDevice) -> bool {
    dev.size() == u64::MAX
}

/// A position-dependent test transform, shared by the unit tests of the
/// devices that implement direct access.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// XOR with a keystream that depends on the byte's position in the
    /// request, so a piece passed with a wrong `at` gives wrong bytes.
    pub struct Xor {
        pub g: usize,
        pub calls: std::cell::Cell<usize>,
    }
    impl Xor {
        pub fn new(g: usize) -> Xor {
            Xor {
                g,
                calls: std::cell::Cell::new(0),
            }
        }
        pub fn ks(pos: usize) -> u8 {
            (pos as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2]
        }
    }
    impl Transform for Xor {
        fn granularity(&self) -> usize {
            self.g
        }
        fn apply(&self, at: usize, src: &[u8], dst: &mut [u8]) -> DevResult<()> {
            assert_eq!(src.len(), dst.len());
            assert!(whole_units(self, at, src.len()), "piece {at}+{}", src.len());
            self.calls.set(self.calls.get() + 1);
            for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                *d = s ^ Self::ks(at + i);
            }
            Ok(())
        }
        fn apply_in_place(&self, at: usize, buf: &mut [u8]) -> DevResult<()> {
            assert!(whole_units(self, at, buf.len()));
            for (i, b) in buf.iter_mut().enumerate() {
                *b ^= Self::ks(at + i);
            }
            Ok(())
        }
    }

    pub fn xored(data: &[u8]) -> Vec<u8> {
        data.iter()
            .enumerate()
            .map(|(i, b)| b ^ Xor::ks(i))
            .collect()
    }
}

#[cfg(test)]
mod tag_tests {
    use super::TagLayout;

    #[test]
    fn tags_go_with_whole_sectors_only() {
        let l = TagLayout {
            sector_size: 4096,
            tag_size: 28,
        };
        assert_eq!(l.tags_for(3 * 4096), Some(3 * 28));
        assert_eq!(l.tags_for(0), Some(0));
        assert_eq!(l.tags_for(4096 + 512), None);
        let bad = TagLayout {
            sector_size: 0,
            tag_size: 28,
        };
        assert_eq!(bad.tags_for(4096), None);
    }
}
