//! The crypt hot path: a read decrypts and a write encrypts each part of a
//! request on the thread that took it (see [`super::split`]), straight
//! between the caller's buffer and the lower device's memory when that
//! device offers direct access, else in place (owned buffers) or into
//! bounce pages from one bulk mempool allocation (borrowed buffers).

use super::split::{cipher_parts, part, CryptIo};
use super::{Crypt, Mode};
use crate::core::device::{whole_units, write_zeroes_by_writing, Transform};
use crate::core::{
    extents_of, AsyncIo, BlockDevice, DevError, DevResult, Extent, Limits, WriteBuf,
};
use crate::crypto::SectorCrypt;

/// Largest piece of a borrowed write encrypted into one bounce buffer.
const BOUNCE_MAX: usize = 1 << 20;

/// Largest request submitted asynchronously (see `Crypt::submit`): its
/// cipher work runs on the submitting thread (a connection's event loop),
/// the store's writer or its completion thread instead of a worker, so
/// its size bounds how long one such request may hold up that thread
/// (the cost per size is in docs/BENCHMARKS.md).
const SUBMIT_MAX: usize = 1 << 20;

/// Smallest read decrypted straight out of a resident page cache
/// ([`BlockDevice::resident`]): below it the `mincore` asked per request
/// costs about what the saved copy does, and small reads are answered by
/// the ring within its submission anyway (measured both ways: see
/// docs/BENCHMARKS.md).
const RESIDENT_MIN: usize = 64 << 10;

/// Smallest write encrypted straight into a resident page cache
/// ([`BlockDevice::resident_for_write`]): every write of a page or more,
/// since what it saves (a `pwrite`, its copy and the filesystem's work
/// per page) costs more than the `mincore` even at 4 KiB (LUKS 4 KiB
/// random writes on ext4 took less server CPU per request this way than
/// with a 64 KiB threshold, same run; docs/BENCHMARKS.md). A disk
/// file offers its pages only with `UDM_FILE_WRITE_MAP=1` (why:
/// `FileStore::write_transformed`); a tmpfs file's mapping always.
const WRITE_RESIDENT_MIN: usize = 4 << 10;

/// The environment variable for the A/B of encrypting a submitted write
/// on the lower device's writer thread: `0` keeps it on the submitter.
pub const DEFER_ENV: &str = "UDM_CRYPT_DEFER";

/// Whether submitted writes leave their encryption to a lower device that
/// runs it on its writer thread ([`BlockDevice::takes_prepare`]). Why: the
/// submitter is the connection's reader, and every microsecond it spends
/// in the cipher is one the client's next payload waits in the socket
/// (LUKS 1 MiB writes at QD16 on ext4 gained from it in paired runs;
/// docs/BENCHMARKS.md). Read once.
fn defer_writes() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(DEFER_ENV).is_none_or(|v| v != "0"))
}

/// A request's buffer, moved into its completion.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the buffer is used by one thread at a time: the submitter before
// `submit`, the completion after the lower device finished with it
// (`BlockDevice::submit`'s contract).
unsafe impl Send for SendPtr {}

impl BlockDevice for Crypt {
    fn size(&self) -> u64 {
        self.len
    }

    fn limits(&self) -> Limits {
        let ss = self.opts.sector_size;
        Limits {
            logical_block_size: ss,
            optimal_io_size: ss,
            max_io_size: u32::MAX,
            discard: self.opts.allow_discards,
            write_zeroes: false,
            read_only: false,
            queue_depth: 0,
            io_boundary: 0,
        }
        .stack(self.area.dev.limits())
    }

    /// Each part is decrypted by the thread that owns it: straight out of
    /// the device's memory with direct access, else read from the device
    /// and decrypted in place; either way the data movement and the cipher
    /// of different parts run in parallel.
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len())?;
        tracing::trace!(offset, len = buf.len(), "crypt read");
        let keyed = self.keyed.load();
        let Some(k) = keyed.as_deref() else {
            return Err(self.wiped());
        };
        let sc = match &k.mode {
            Mode::Sector(sc) => sc,
            Mode::Aead(a) => return self.read_aead(a, offset, buf),
        };
        let (mut per, mut n) = self.plan(buf.len(), !self.opts.no_read_workqueue);
        let direct = self.area.dev.direct_access();
        if n > 1 && self.queued() {
            let at = self.area.offset + offset;
            if !direct && self.area.dev.resident(at, buf.len()) {
                return self.read_parts(sc, offset, buf, (per, n), true);
            }
            if !direct {
                self.area.dev.read(self.area.offset + offset, buf)?;
                let pool = self.pool.get().and_then(Option::as_deref);
                return cipher_parts(pool, sc, buf, self.cc_sector(offset), (per, n), false);
            }
            (per, n) = (buf.len(), 1);
        }
        self.read_parts(sc, offset, buf, (per, n), direct)
    }

    /// Each part is encrypted and written down by the thread that owns it:
    /// with direct access straight from the caller's buffer (owned or
    /// borrowed, never modified) into the device's memory; otherwise in
    /// place for an owned buffer, or into a bounce buffer for a borrowed
    /// one. The call returns when all parts are on the device (with FUA
    /// each part is durable).
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.check(offset, data.len())?;
        tracing::trace!(offset, len = data.len(), fua, "crypt write");
        let keyed = self.keyed.load();
        let Some(k) = keyed.as_deref() else {
            return Err(self.wiped());
        };
        let sc = match &k.mode {
            Mode::Sector(sc) => sc,
            Mode::Aead(a) => return self.write_aead(a, offset, data, fua),
        };
        let (mut per, mut n) = self.plan(data.len(), !self.opts.no_write_workqueue);
        let queued = self.queued();
        let direct = self.area.dev.direct_access();
        let in_memory = !direct && queued && self.in_memory(offset, data.len(), fua);
        if queued && !in_memory && (!matches!(data, WriteBuf::Owned(_)) || direct) {
            // Only an owned buffer is encrypted in place before its one
            // write; otherwise each part would do its own I/O.
            (per, n) = (data.len(), 1);
        }
        if direct || in_memory {
            return self.write_parts(sc, offset, data.as_slice(), (per, n), fua);
        }
        match data {
            WriteBuf::Owned(buf) if n > 1 && queued => {
                let pool = self.pool.get().and_then(Option::as_deref);
                cipher_parts(pool, sc, buf, self.cc_sector(offset), (per, n), true)?;
                let at = self.area.offset + offset;
                self.area.dev.write(at, WriteBuf::Owned(buf), fua)
            }
            WriteBuf::Owned(buf) => {
                let io = self.io_pool.alloc(CryptIo::new(buf, per));
                self.run_parts(n, &|i| {
                    let Some(p) = io.take(i) else {
                        return Ok(());
                    };
                    let at = offset + (i * per) as u64;
                    sc.encrypt(p, self.cc_sector(at));
                    self.area
                        .dev
                        .write(self.area.offset + at, WriteBuf::Owned(p), fua)
                })
            }
            WriteBuf::Borrowed(src) => self.run_parts(n, &|i| {
                let r = part(i, per, src.len());
                self.write_borrowed(sc, offset + r.start as u64, &src[r], fua)
            }),
        }
    }

    fn can_submit(&self) -> bool {
        self.opts.integrity_tag == 0 && self.area.dev.can_submit() && !self.area.dev.direct_access()
    }

    /// A request of up to 1 MiB over a device that takes submissions
    /// (RBD, a file through io_uring) is submitted too, so LUKS saves the
    /// same thread switches as the raw image: a write is encrypted in
    /// place here, on the submitting thread, and handed down, or, over a
    /// device whose writer thread runs it ([`BlockDevice::takes_prepare`]),
    /// handed down with its encryption left to that thread; a read is
    /// decrypted in place in the completion; from 128 KiB either is cut
    /// over the crypto threads (LUKS 1 MiB reads on ext4 fell well behind
    /// nbdkit with the whole decryption on one thread). Larger
    /// requests are declined and run on the engine's workers, which
    /// spread their cipher work over the cores (here it would all land on
    /// one connection's reader, or on the store's one callback thread, for
    /// milliseconds).
    unsafe fn submit(&self, io: AsyncIo) {
        if io.len > SUBMIT_MAX || self.check(io.offset, io.len).is_err() {
            return io.decline();
        }
        // A wiped key: declined, the synchronous path reports it.
        let Some(keyed) = self.keyed.load_full() else {
            return io.decline();
        };
        // An AEAD's tags go through the tagged calls, never a submission;
        // a step left by a layer above is not stacked on ours.
        if keyed.sector().is_none() || io.prepare.is_some() {
            return io.decline();
        }
        let sector = self.cc_sector(io.offset);
        let at = self.area.offset + io.offset;
        let (buf, len, write) = (io.buf, io.len, io.write);
        // A large request's cipher work is cut over the crypto threads
        // (the I/O stays one entry): on one thread 1 MiB would hold up
        // the submitting thread or the store's one completion thread.
        let no_split = if write {
            self.opts.no_write_workqueue
        } else {
            self.opts.no_read_workqueue
        };
        let parts = self.plan(len, !no_split);
        let pool = (parts.1 > 1)
            .then(|| self.pool.get().cloned().flatten())
            .flatten();
        // A large read whose pages are all in memory (a disk file's page
        // cache, mapped): decrypted straight out of them here, cut over
        // the crypto threads, with no copy into the buffer first; the two
        // passes over 1 MiB were half of the reader's CPU (`resident`).
        if !write && len >= RESIDENT_MIN && self.area.dev.resident(at, len) {
            if let Some(sc) = keyed.sector() {
                // SAFETY: the caller's buffer, valid for writes and ours
                // alone until `done` (the contract).
                let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                let r = self.read_parts(sc, io.offset, b, parts, true);
                return (io.done)(Some(r));
            }
        }
        // A write of a page or more whose pages are all in the page
        // cache: encrypted straight into them here (a large one cut over
        // the crypto threads), with no pass in place and no `pwrite` copy
        // after it (the writer's copy was half of the server's CPU per
        // 1 MiB LUKS write on ext4).
        if write && self.in_memory(io.offset, len, io.fua) {
            if let Some(sc) = keyed.sector() {
                // SAFETY: the caller's buffer, valid for reads until
                // `done` (the contract); only read here.
                let b = unsafe { std::slice::from_raw_parts(buf, len) };
                let r = self.write_parts(sc, io.offset, b, parts, false);
                return (io.done)(Some(r));
            }
        }
        let done = io.done;
        let plain = SendPtr(buf);
        // A write to a device whose writer thread runs it is encrypted
        // there (`prepare`), so this thread, the connection's reader,
        // goes back to the socket at once.
        let defer = write && defer_writes() && self.area.dev.takes_prepare();
        let mut prepare: Option<crate::core::Prepare> = None;
        if let (true, Some(sc)) = (write, keyed.sector()) {
            if defer {
                let (keyed, pool) = (keyed.clone(), pool.clone());
                prepare = Some(Box::new(move |b: &mut [u8]| match keyed.sector() {
                    Some(sc) => cipher_parts(pool.as_deref(), sc, b, sector, parts, true),
                    None => Err(DevError::Target("crypt: key mode changed".into())),
                }));
            } else {
                // SAFETY: the caller's buffer, valid for reads and writes and
                // ours alone until `done` (the contract): an engine-owned
                // payload, encrypted in place as an owned write.
                let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                if let Err(e) = cipher_parts(pool.as_deref(), sc, b, sector, parts, true) {
                    return done(Some(Err(e)));
                }
            }
        }
        let io = AsyncIo {
            offset: at,
            done: Box::new(move |r: Option<DevResult<()>>| {
                let plain = plain;
                // SAFETY: still the caller's buffer: `done` below has not
                // run, and the lower device is finished with it.
                let b = unsafe { std::slice::from_raw_parts_mut(plain.0, len) };
                let r = match (r, write, keyed.sector()) {
                    // Read: decrypt what arrived.
                    (Some(Ok(())), false, Some(sc)) => {
                        Some(cipher_parts(pool.as_deref(), sc, b, sector, parts, false))
                    }
                    // Not taken below: give the plaintext back for the
                    // synchronous retry, which encrypts it again.
                    (None, true, Some(sc)) => {
                        if !defer {
                            sc.decrypt(b, sector);
                        }
                        None
                    }
                    (r, ..) => r,
                };
                done(r)
            }),
            prepare,
            ..io
        };
        // SAFETY: the caller's guarantee on the buffer is passed on; the
        // completion above touches it only before calling `done`.
        unsafe { self.area.dev.submit(io) }
    }

    fn flush(&self) -> DevResult<()> {
        self.area.dev.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if !self.opts.allow_discards {
            return Err(DevError::NotSupported(
                "discard (the crypt table has no allow_discards option)",
            ));
        }
        self.check(offset, len as usize)?;
        self.area.dev.discard(self.area.offset + offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        // Zeros must be stored encrypted: write encrypted zeros.
        write_zeroes_by_writing(self, offset, len, fua)
    }

    /// The backing's holes are holes here too (nothing stored), but they
    /// do not read as zeros: a hole reads as zero *ciphertext*, which
    /// decrypts to noise. So holes keep the hole flag and lose the zero
    /// flag, and nothing is ever reported as zero.
    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        extents_of(
            self.area.dev.as_ref(),
            self.area.offset + offset,
            len,
            &mut |e| {
                out(Extent {
                    len: e.len,
                    hole: e.hole,
                    zero: false,
                })
            },
        )
        .map(|_| ())
    }
}

impl Crypt {
    /// Whether a write of `len` bytes at target offset `offset` goes
    /// straight into the lower device's pages in memory
    /// ([`BlockDevice::resident_for_write`]). Not for FUA writes: each part
    /// would make the file durable on its own.
    fn in_memory(&self, offset: u64, len: usize, fua: bool) -> bool {
        !fua && len >= WRITE_RESIDENT_MIN
            && self
                .area
                .dev
                .resident_for_write(self.area.offset + offset, len)
    }

    /// Write `src` at target offset `offset` cut into `n` parts of `per`
    /// bytes over the crypto threads, each part encrypted by the thread
    /// that took it straight into the device's memory
    /// (`write_transformed`).
    fn write_parts(
        &self,
        sc: &SectorCrypt,
        offset: u64,
        src: &[u8],
        (per, n): (usize, usize),
        fua: bool,
    ) -> DevResult<()> {
        self.run_parts(n, &|i| {
            let r = part(i, per, src.len());
            if r.is_empty() {
                return Ok(());
            }
            let at = offset + r.start as u64;
            let t = self.cipher(sc, at, true);
            self.area
                .dev
                .write_transformed(self.area.offset + at, &src[r], fua, &t)
        })
    }

    /// Read `buf` at target offset `offset` cut into `n` parts of `per`
    /// bytes over the crypto threads, each part decrypted by the thread
    /// that took it: straight out of the device's memory when `direct`
    /// (`read_transformed`), else read into the part and decrypted there.
    fn read_parts(
        &self,
        sc: &SectorCrypt,
        offset: u64,
        buf: &mut [u8],
        (per, n): (usize, usize),
        direct: bool,
    ) -> DevResult<()> {
        let io = self.io_pool.alloc(CryptIo::new(buf, per));
        self.run_parts(n, &|i| {
            let Some(p) = io.take(i) else {
                return Ok(());
            };
            let at = offset + (i * per) as u64;
            if direct {
                let t = self.cipher(sc, at, false);
                return self.area.dev.read_transformed(self.area.offset + at, p, &t);
            }
            self.area.dev.read(self.area.offset + at, p)?;
            sc.decrypt(p, self.cc_sector(at));
            Ok(())
        })
    }

    fn cipher<'a>(&self, sc: &'a SectorCrypt, at: u64, encrypt: bool) -> Cipher<'a> {
        Cipher {
            sc,
            first: self.cc_sector(at),
            encrypt,
        }
    }

    /// Encrypt a borrowed piece into bounce pages and write it at target
    /// offset `at` with one vectored write per piece of at most 1 MiB.
    fn write_borrowed(&self, sc: &SectorCrypt, at: u64, src: &[u8], fua: bool) -> DevResult<()> {
        let mut done = 0usize;
        for piece in src.chunks(BOUNCE_MAX) {
            let pos = at + done as u64;
            let mut pages = self.bounce(piece.len());
            let page = pages.pool().elem_size();
            let per_page = (page / 512) as u64;
            let first = self.cc_sector(pos);
            for (i, (dst, s)) in pages.iter_mut().zip(piece.chunks(page)).enumerate() {
                let sector = first.wrapping_add(i as u64 * per_page);
                sc.encrypt_to(s, &mut dst[..s.len()], sector);
            }
            self.area.dev.write_vectored(
                self.area.offset + pos,
                &pages.io_slices(piece.len()),
                fua,
            )?;
            done += piece.len();
        }
        Ok(())
    }
}

/// The cipher as a direct-access transform over one part of a request, so
/// a device with direct access runs it between the caller's buffer and its
/// memory. `first` is the dm-crypt cc_sector of the part's first byte; a
/// piece at byte `at` of the part starts at cc_sector `first + at / 512`.
pub(super) struct Cipher<'a> {
    pub(super) sc: &'a SectorCrypt,
    pub(super) first: u64,
    pub(super) encrypt: bool,
}

impl Cipher<'_> {
    /// The cc_sector of a piece, refusing pieces that are not whole sectors
    /// (a device bug; the cipher must never see part of a sector).
    fn sector(&self, at: usize, len: usize) -> DevResult<u64> {
        if !whole_units(self, at, len) {
            return Err(DevError::Target(format!(
                "crypt: the lower device passed a piece [{at}, +{len}) that is not whole {}-byte sectors",
                self.sc.sector_size()
            )));
        }
        Ok(self.first.wrapping_add((at / 512) as u64))
    }
}

impl Transform for Cipher<'_> {
    fn granularity(&self) -> usize {
        self.sc.sector_size() as usize
    }

    fn apply(&self, at: usize, src: &[u8], dst: &mut [u8]) -> DevResult<()> {
        let sector = self.sector(at, src.len())?;
        if src.len() != dst.len() {
            return Err(DevError::Target(format!(
                "crypt: the lower device passed buffers of {} and {} bytes",
                src.len(),
                dst.len()
            )));
        }
        if self.encrypt {
            self.sc.encrypt_to(src, dst, sector);
        } else {
            self.sc.decrypt_to(src, dst, sector);
        }
        Ok(())
    }

    fn apply_in_place(&self, at: usize, buf: &mut [u8]) -> DevResult<()> {
        let sector = self.sector(at, buf.len())?;
        if self.encrypt {
            self.sc.encrypt(buf, sector);
        } else {
            self.sc.decrypt(buf, sector);
        }
        Ok(())
    }
}
