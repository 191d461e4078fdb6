//! `crypt <cipher> <key> <iv_offset> <device> <offset> [<#opt_params> <opt_params>...]`:
//! dm-crypt-compatible transparent encryption of a device area.
//!
//! The bytes on the device are exactly those Linux dm-crypt writes for the
//! same table, so a volume moves between udm and the kernel unchanged. The
//! constructor follows `crypt_ctr` (options parsed first, the same checks and
//! the same canonical `table` output), the I/O path follows `crypt_map` with
//! userspace in mind:
//! - when the lower device offers direct access (an in-memory store or a
//!   file on tmpfs, also through linear segments; [`BlockDevice::direct_access`]), the cipher
//!   itself moves the bytes: a write encrypts from the caller's buffer
//!   straight into the store's memory, a read decrypts from the store's
//!   memory straight into the caller's buffer. An out-of-place cipher pass
//!   costs what an in-place one does, so this removes the lower device's
//!   memcpy from every byte — and a borrowed write needs no bounce buffer
//!   (the caller's bytes are only read);
//! - otherwise (files on disk, anything else) reads read into the caller's buffer
//!   and decrypt in place; writes of an engine-owned buffer encrypt in place
//!   and pass it down; a borrowed buffer is never modified and is encrypted
//!   into a bounce buffer (one function, `Crypt::bounce`, so the
//!   allocation policy lives in one place);
//! - a large request is cut into one part per crypto thread (seed 002); each
//!   thread encrypts its part and writes it down (or reads its part and
//!   decrypts it) — with direct access, encrypts its part into the store —
//!   so both the cipher and the lower device's copy run in parallel, and
//!   the request completes only when every part has: one QD1
//!   stream uses every core, and no write is reordered against a later
//!   request (the next request is not accepted before this one completes);
//! - discards pass down only with `allow_discards`; write-zeroes is emulated
//!   by encrypting zeros (dm-crypt does not pass it down either); flush and
//!   FUA pass down.
//!
//! Options and their meaning in udm:
//! - `allow_discards`: as in the kernel (discards reach the device).
//! - `sector_size:N`, `iv_large_sectors`: as in the kernel.
//! - `same_cpu_crypt`: encryption stays on the submitting thread (never
//!   split across the pool), which is what it means in the kernel.
//! - `no_read_workqueue` / `no_write_workqueue`: decryption / encryption
//!   runs only in the submitting thread's context (no offload to the pool),
//!   the userspace analogue of bypassing kcryptd.
//! - `submit_from_crypt_cpus`: accepted, no userspace meaning: udm always
//!   submits a write from the thread that received it, after encryption.
//! - `high_priority`: accepted, no userspace meaning: udm's threads run at
//!   the server's scheduling priority.
//!
//! Key hygiene: the key bytes and the cipher schedules live on pages of
//! their own that are locked into RAM where permitted and wiped on drop
//! (`mem::secret`); `table` prints the key only when asked; it never
//! appears in logs, errors or Debug output.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use zeroize::Zeroizing;

use super::{parse_sectors, resolve_area, Area, Target, TargetArgs, TargetError};
use crate::core::device::{whole_units, write_zeroes_by_writing, Transform};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::crypto::pool::CryptPool;
use crate::crypto::SectorCrypt;
use crate::mem::blockpool::BlockPool;
use crate::mem::{mempool, Budget, MemPool, PageList, SecretBytes};

/// Requests at least this large are split across the worker pool.
const SPLIT_MIN: usize = 128 << 10;
/// Smallest share of a request given to one thread.
const PART_MIN: usize = 64 << 10;
/// Largest piece of a borrowed write encrypted into one bounce buffer.
const BOUNCE_MAX: usize = 1 << 20;
/// Most parts one request is split into (bounds the per-request state).
const MAX_PARTS: usize = 64;

/// Optional parameters (dm-crypt feature args).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CryptOptions {
    pub allow_discards: bool,
    pub same_cpu_crypt: bool,
    pub high_priority: bool,
    pub submit_from_crypt_cpus: bool,
    pub no_read_workqueue: bool,
    pub no_write_workqueue: bool,
    pub sector_size: u32,
    pub iv_large_sectors: bool,
}

/// A `crypt` segment.
pub struct Crypt {
    cipher: String,
    /// Kept only for `table --showkeys`; on locked pages, wiped on drop.
    key: SecretBytes,
    iv_offset: u64,
    area: Area,
    len: u64,
    opts: CryptOptions,
    sc: SectorCrypt,
    pool: Option<Arc<CryptPool>>,
    bounce_pool: OnceLock<Arc<MemPool>>,
    /// Per-request state of split requests, from a fixed-size block pool
    /// (seed 004) instead of the general allocator.
    io_pool: BlockPool<CryptIo>,
    /// Bounce pages in one bulk call (seed 000) or one at a time (the
    /// ablation; see `mem::mempool::set_bulk_bounce_default`).
    bulk_bounce: bool,
}

impl std::fmt::Debug for Crypt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crypt")
            .field("cipher", &self.cipher)
            .field("key", &"<hidden>")
            .field("iv_offset", &self.iv_offset)
            .field("device", &self.area.name)
            .field("offset", &(self.area.offset / 512))
            .field("options", &self.opts)
            .finish()
    }
}

/// Parse the feature args group starting at `args[5]`.
fn parse_options(args: &[String]) -> Result<CryptOptions, TargetError> {
    let mut o = CryptOptions {
        sector_size: 512,
        ..Default::default()
    };
    let Some(count) = args.get(5) else {
        return Ok(o);
    };
    let n: usize = count
        .parse()
        .ok()
        .filter(|n: &usize| *n <= 9 && count.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            TargetError::at(
                5,
                format!("invalid number of optional parameters '{count}' (0 to 9)"),
            )
        })?;
    let have = args.len() - 6;
    if n != have {
        return Err(TargetError::at(
            5,
            format!("{n} optional parameters announced but {have} given"),
        ));
    }
    for (i, word) in args[6..].iter().enumerate() {
        let idx = 6 + i;
        let lower = word.to_ascii_lowercase();
        match lower.as_str() {
            "allow_discards" => o.allow_discards = true,
            "same_cpu_crypt" => o.same_cpu_crypt = true,
            "high_priority" => o.high_priority = true,
            "submit_from_crypt_cpus" => o.submit_from_crypt_cpus = true,
            "no_read_workqueue" => o.no_read_workqueue = true,
            "no_write_workqueue" => o.no_write_workqueue = true,
            "iv_large_sectors" => o.iv_large_sectors = true,
            s if s.starts_with("sector_size:") => {
                let v = &s["sector_size:".len()..];
                o.sector_size = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| {
                        (512..=4096).contains(n)
                            && n.is_power_of_two()
                            && v.bytes().all(|b| b.is_ascii_digit())
                    })
                    .ok_or_else(|| {
                        TargetError::at(
                            idx,
                            format!(
                                "invalid sector_size '{v}' (a power of two from 512 to 4096)"
                            ),
                        )
                    })?;
            }
            s if s.starts_with("integrity:") || s.starts_with("integrity_key_size:") => {
                return Err(TargetError::at(
                    idx,
                    format!(
                        "'{word}': authenticated encryption (dm-integrity) is not supported by udm"
                    ),
                ));
            }
            _ => {
                return Err(TargetError::at(
                    idx,
                    format!(
                        "unknown optional parameter '{word}' (allow_discards, same_cpu_crypt, high_priority, \
                         submit_from_crypt_cpus, no_read_workqueue, no_write_workqueue, sector_size:N, iv_large_sectors)"
                    ),
                ))
            }
        }
    }
    Ok(o)
}

/// Decode a dm-crypt key argument: hex (key size = length / 2, a trailing
/// odd digit ignored as the kernel does), or `-` for an empty key. Errors
/// never quote the key.
fn parse_key(arg: &str) -> Result<Zeroizing<Vec<u8>>, TargetError> {
    if arg == "-" {
        return Ok(Zeroizing::new(Vec::new()));
    }
    if arg.starts_with(':') {
        return Err(TargetError::at(
            1,
            "kernel keyring keys (':<size>:<type>:<description>') are not supported by udm; give the key in hex",
        ));
    }
    let n = arg.len() / 2;
    let mut key = Zeroizing::new(vec![0u8; n]);
    hex::decode_to_slice(&arg.as_bytes()[..2 * n], &mut key[..]).map_err(|_| {
        TargetError::at(
            1,
            format!(
                "the key is not valid hexadecimal ({} characters; the key is not shown)",
                arg.len()
            ),
        )
    })?;
    Ok(key)
}

fn parse_u64(args: &[String], idx: usize, what: &str) -> Result<u64, TargetError> {
    let s = args
        .get(idx)
        .ok_or_else(|| TargetError::at(idx, format!("missing {what}")))?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::at(
            idx,
            format!("invalid {what} '{s}' (a decimal number of 512-byte sectors)"),
        ));
    }
    s.parse()
        .map_err(|_| TargetError::at(idx, format!("{what} '{s}' is too large")))
}

/// The `crypt` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "crypt",
    version: [1, 29, 0],
    new,
    args: &[
        "cipher",
        "key",
        "iv_offset",
        "device",
        "offset",
        "#opt_params",
    ],
    more_args: None,
};

/// Constructor, as dm-crypt's `crypt_ctr`.
pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    if a.args.len() < 5 {
        return Err(TargetError::line(format!(
            "expected at least 5 arguments (<cipher> <key> <iv_offset> <device> <offset> \
             [<#opt_params> <opt_params>...]), got {}",
            a.args.len()
        )));
    }
    // Options first: sector_size drives the checks below.
    let opts = parse_options(a.args)?;
    let ss = opts.sector_size;
    let step = u64::from(ss / 512);
    if a.len % u64::from(ss) != 0 {
        return Err(TargetError::line(format!(
            "segment length {} sectors is not a multiple of sector_size {ss}",
            a.len / 512
        )));
    }
    let key = parse_key(&a.args[1])?;
    let key = SecretBytes::new(&key).ok_or_else(|| {
        TargetError::at(
            1,
            format!(
                "a key of {} bits is longer than udm supports ({} bits)",
                key.len() * 8,
                crate::mem::secret::SECRET_MAX * 8
            ),
        )
    })?;
    let iv_offset = parse_u64(a.args, 2, "iv_offset")?;
    if iv_offset % step != 0 {
        return Err(TargetError::at(
            2,
            format!("iv_offset {iv_offset} is not a multiple of sector_size {ss} (in 512-byte sectors: {step})"),
        ));
    }
    let offset = parse_sectors(a.args, 4)?;
    if offset % step != 0 {
        return Err(TargetError::at(
            4,
            format!("offset {offset} is not a multiple of sector_size {ss} (in 512-byte sectors: {step})"),
        ));
    }
    let cipher = a.args[0].clone();
    let sc = SectorCrypt::new(&cipher, &key, ss, opts.iv_large_sectors)
        .map_err(|e| TargetError::at(if e.about_key() { 1 } else { 0 }, e.to_string()))?;
    if key.is_empty() && a.args[1] != "-" {
        return Err(TargetError::at(
            1,
            "empty key: write '-' for a key of size 0",
        ));
    }
    let len = a.len;
    let area = resolve_area(&mut a, 3, len)?;
    let threads = a.options.crypt_threads;
    let pool = if opts.same_cpu_crypt || (opts.no_read_workqueue && opts.no_write_workqueue) {
        None
    } else {
        CryptPool::new(threads, "udm-crypt")
    };
    tracing::debug!(
        cipher = %cipher,
        key_bits = key.len() * 8,
        sector_size = ss,
        iv_offset,
        device = %area.name,
        vector_kernel = sc.uses_vector_kernel(),
        threads = pool.as_ref().map_or(1, |p| p.parallelism()),
        "crypt target created"
    );
    Ok(Arc::new(Crypt {
        cipher,
        key,
        iv_offset,
        area,
        len,
        opts,
        sc,
        pool,
        bounce_pool: OnceLock::new(),
        io_pool: BlockPool::new(),
        bulk_bounce: mempool::bulk_bounce_default(),
    }))
}

impl Crypt {
    /// The options this target was built with.
    pub fn options(&self) -> CryptOptions {
        self.opts
    }

    /// The bounce pages for `len` bytes of a borrowed write. The single place
    /// that decides where encryption buffers come from: dm-crypt's page
    /// mempool (reserve of 256 pages, per-device budget), all pages in one
    /// bulk call (seed 000) unless the one-at-a-time ablation is selected.
    fn bounce(&self, len: usize) -> PageList {
        let pool = self.bounce_pool.get_or_init(|| {
            let budget =
                crate::mem::per_device_budget(crate::mem::default_total_budget(), 1, false);
            MemPool::pages(Budget::new(budget))
        });
        let n = len.div_ceil(pool.elem_size());
        if self.bulk_bounce {
            pool.alloc_bulk(n)
        } else {
            pool.alloc_each(n)
        }
    }

    fn check(&self, offset: u64, len: usize) -> DevResult<()> {
        let ss = u64::from(self.opts.sector_size);
        if offset % ss != 0 || len as u64 % ss != 0 {
            return Err(DevError::Misaligned {
                offset,
                len: len as u64,
                align: self.opts.sector_size,
            });
        }
        Ok(())
    }

    /// dm-crypt cc_sector of the byte at target offset `offset`.
    fn cc_sector(&self, offset: u64) -> u64 {
        (offset / 512).wrapping_add(self.iv_offset)
    }

    /// How a request of `len` bytes is cut for the pool: (bytes per part,
    /// number of parts). One part when the pool is off for this direction
    /// or the request is small.
    fn plan(&self, len: usize, may_split: bool) -> (usize, usize) {
        let threads = match &self.pool {
            Some(p) if may_split && len >= SPLIT_MIN => p.parallelism(),
            _ => 1,
        };
        let ss = self.opts.sector_size as usize;
        let parts = threads.min(len / PART_MIN).clamp(1, MAX_PARTS);
        let per = (len / ss).div_ceil(parts).max(1) * ss;
        (per, len.div_ceil(per).max(1))
    }

    /// Run `f(i)` for parts `0..n`, on the pool when there is more than one;
    /// the first error wins. Returns only when every part has finished, so
    /// a request completes as a whole (seed 002: no reordering).
    fn run_parts(&self, n: usize, f: &(dyn Fn(usize) -> DevResult<()> + Sync)) -> DevResult<()> {
        let pool = match &self.pool {
            Some(p) if n > 1 => p,
            _ => {
                for i in 0..n {
                    f(i)?;
                }
                return Ok(());
            }
        };
        let first_err: Mutex<Option<DevError>> = Mutex::new(None);
        let ok = pool.run(n, &|i| {
            if let Err(e) = f(i) {
                first_err
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        });
        if let Some(e) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        if !ok {
            return Err(DevError::Target(
                "crypt: a worker thread failed while processing the request".into(),
            ));
        }
        Ok(())
    }

    /// Encrypt a borrowed piece into bounce pages and write it at target
    /// offset `at` with one vectored write per piece of at most 1 MiB.
    fn write_borrowed(&self, at: u64, src: &[u8], fua: bool) -> DevResult<()> {
        let mut done = 0usize;
        for piece in src.chunks(BOUNCE_MAX) {
            let pos = at + done as u64;
            let mut pages = self.bounce(piece.len());
            let page = pages.pool().elem_size();
            let per_page = (page / 512) as u64;
            let first = self.cc_sector(pos);
            for (i, (dst, s)) in pages.iter_mut().zip(piece.chunks(page)).enumerate() {
                let sector = first.wrapping_add(i as u64 * per_page);
                self.sc.encrypt_to(s, &mut dst[..s.len()], sector);
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
struct Cipher<'a> {
    sc: &'a SectorCrypt,
    first: u64,
    encrypt: bool,
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

/// The per-request state of a split request: where its buffer lies and
/// which parts have been handed to a thread. It lives in the target's
/// block pool for the duration of one request.
struct CryptIo {
    base: *mut u8,
    len: usize,
    per: usize,
    taken: [AtomicBool; MAX_PARTS],
}

// SAFETY: `base` points into the buffer of the request that owns this
// descriptor; the request outlives every use (run_parts returns only when
// all parts are done), and `take` hands each disjoint part out at most
// once, so sharing the descriptor between the request's threads is sound.
unsafe impl Send for CryptIo {}
// SAFETY: as above; the only shared mutation is through the atomics.
unsafe impl Sync for CryptIo {}

impl CryptIo {
    fn new(buf: &mut [u8], per: usize) -> CryptIo {
        CryptIo {
            base: buf.as_mut_ptr(),
            len: buf.len(),
            per,
            taken: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// Part `i` (bytes `[i*per, min((i+1)*per, len))`), the first time it is
    /// asked for; `None` after that or past the end.
    // Handing out `&mut` from `&self` is the point: each part exactly once.
    #[allow(clippy::mut_from_ref)]
    fn take(&self, i: usize) -> Option<&mut [u8]> {
        let start = i.checked_mul(self.per)?;
        if i >= MAX_PARTS || start >= self.len || self.taken[i].swap(true, Ordering::AcqRel) {
            return None;
        }
        let n = self.per.min(self.len - start);
        // SAFETY: `[start, start + n)` lies inside the buffer `base..base+len`
        // that the request borrows mutably for longer than `&self` (the
        // descriptor is dropped before the request returns); parts are
        // disjoint and the swap above hands each out only once, so no two
        // live `&mut` overlap.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.add(start), n) })
    }
}

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
        let (per, n) = self.plan(buf.len(), !self.opts.no_read_workqueue);
        let direct = self.area.dev.direct_access();
        let io = self.io_pool.alloc(CryptIo::new(buf, per));
        self.run_parts(n, &|i| {
            let Some(p) = io.take(i) else {
                return Ok(());
            };
            let at = offset + (i * per) as u64;
            if direct {
                let t = Cipher {
                    sc: &self.sc,
                    first: self.cc_sector(at),
                    encrypt: false,
                };
                return self.area.dev.read_transformed(self.area.offset + at, p, &t);
            }
            self.area.dev.read(self.area.offset + at, p)?;
            self.sc.decrypt(p, self.cc_sector(at));
            Ok(())
        })
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
        let (per, n) = self.plan(data.len(), !self.opts.no_write_workqueue);
        if self.area.dev.direct_access() {
            let src = data.as_slice();
            return self.run_parts(n, &|i| {
                let start = (i * per).min(src.len());
                let end = (start + per).min(src.len());
                if start == end {
                    return Ok(());
                }
                let at = offset + start as u64;
                let t = Cipher {
                    sc: &self.sc,
                    first: self.cc_sector(at),
                    encrypt: true,
                };
                self.area
                    .dev
                    .write_transformed(self.area.offset + at, &src[start..end], fua, &t)
            });
        }
        match data {
            WriteBuf::Owned(buf) => {
                let io = self.io_pool.alloc(CryptIo::new(buf, per));
                self.run_parts(n, &|i| {
                    let Some(p) = io.take(i) else {
                        return Ok(());
                    };
                    let at = offset + (i * per) as u64;
                    self.sc.encrypt(p, self.cc_sector(at));
                    self.area
                        .dev
                        .write(self.area.offset + at, WriteBuf::Owned(p), fua)
                })
            }
            WriteBuf::Borrowed(src) => self.run_parts(n, &|i| {
                let start = (i * per).min(src.len());
                let end = (start + per).min(src.len());
                self.write_borrowed(offset + start as u64, &src[start..end], fua)
            }),
        }
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
}

impl Target for Crypt {
    fn type_name(&self) -> &'static str {
        "crypt"
    }

    /// dm-crypt's STATUSTYPE_TABLE order: cipher, key, iv_offset, device,
    /// offset, then the feature args in the kernel's canonical order.
    fn table_params(&self, show_keys: bool) -> String {
        let key = if self.key.is_empty() {
            "-".to_string()
        } else if show_keys {
            hex::encode(&self.key[..])
        } else {
            "0".repeat(self.key.len() * 2)
        };
        let mut s = format!(
            "{} {} {} {} {}",
            crate::core::table::escape_arg(&self.cipher),
            key,
            self.iv_offset,
            self.area.table_name(),
            self.area.offset / 512
        );
        let o = &self.opts;
        let mut feats: Vec<String> = Vec::new();
        for (on, name) in [
            (o.allow_discards, "allow_discards"),
            (o.same_cpu_crypt, "same_cpu_crypt"),
            (o.high_priority, "high_priority"),
            (o.submit_from_crypt_cpus, "submit_from_crypt_cpus"),
            (o.no_read_workqueue, "no_read_workqueue"),
            (o.no_write_workqueue, "no_write_workqueue"),
        ] {
            if on {
                feats.push(name.into());
            }
        }
        if o.sector_size != 512 {
            feats.push(format!("sector_size:{}", o.sector_size));
        }
        if o.iv_large_sectors {
            feats.push("iv_large_sectors".into());
        }
        if !feats.is_empty() {
            s.push_str(&format!(" {} {}", feats.len(), feats.join(" ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use crate::targets::{DeviceResolver, TargetOptions};

    struct One(Arc<dyn BlockDevice>);
    impl DeviceResolver for One {
        fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
            if spec == "mem" {
                Ok(self.0.clone())
            } else {
                Err(format!("no device '{spec}'"))
            }
        }
    }

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                       202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

    fn build(line: &str, len: u64, threads: usize) -> Result<Arc<dyn Target>, TargetError> {
        let store: Arc<dyn BlockDevice> = Arc::new(MemStore::new(8 << 20));
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        new(TargetArgs {
            args: &args,
            len,
            resolver: &mut One(store),
            options: &TargetOptions {
                crypt_threads: threads,
            },
        })
    }

    #[test]
    fn table_output_is_canonical_and_hides_the_key() {
        let t = build(
            &format!(
                "aes-xts-plain64 {KEY} 16 mem 8 6 iv_large_sectors SECTOR_SIZE:4096 no_write_workqueue allow_discards same_cpu_crypt high_priority"
            ),
            1 << 20,
            1,
        )
        .unwrap();
        let shown = t.table_params(true);
        let hidden = t.table_params(false);
        assert_eq!(
            shown,
            format!("aes-xts-plain64 {KEY} 16 mem 8 6 allow_discards same_cpu_crypt high_priority no_write_workqueue sector_size:4096 iv_large_sectors")
        );
        assert_eq!(hidden, shown.replace(KEY, &"0".repeat(128)));
        let plain = build(
            &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:512"),
            1 << 20,
            1,
        )
        .unwrap();
        assert_eq!(
            plain.table_params(false),
            format!("aes-xts-plain64 {} 0 mem 0", "0".repeat(128))
        );
        let null = build("cipher_null-ecb - 0 mem 0", 1 << 20, 1).unwrap();
        assert_eq!(null.table_params(true), "cipher_null-ecb - 0 mem 0");
    }

    #[test]
    fn constructor_errors_name_the_argument() {
        for (line, arg, word) in [
            ("aes-xts-plain64 zz 0 mem 0", Some(1), "hexadecimal"),
            ("aes-xts-plain64 :64:logon:foo 0 mem 0", Some(1), "keyring"),
            (
                &format!("aes-xts-plain64 {KEY} x mem 0") as &str,
                Some(2),
                "iv_offset",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 1 mem 0 1 sector_size:4096"),
                Some(2),
                "multiple",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 1 1 sector_size:4096"),
                Some(4),
                "multiple",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:1000"),
                Some(6),
                "sector_size",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 0 1 bogus"),
                Some(6),
                "bogus",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 0 2 allow_discards"),
                Some(5),
                "announced",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 0 10"),
                Some(5),
                "0 to 9",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 0 1 integrity:28:aead"),
                Some(6),
                "integrity",
            ),
            (&format!("aes-cbc-lmk {KEY} 0 mem 0"), Some(0), "lmk"),
            (
                &format!("aes-xts-plain64 {KEY} 0 nodev 0"),
                Some(3),
                "nodev",
            ),
            (
                &format!("aes-xts-plain64 {KEY} 0 mem 99999999"),
                Some(4),
                "does not fit",
            ),
            ("aes-xts-plain64 - 0 mem 0", Some(1), "key"),
            (&format!("aes-xts-plain64 {KEY} 0 mem"), None, "at least 5"),
        ] {
            let e = build(line, 1 << 20, 1)
                .err()
                .unwrap_or_else(|| panic!("accepted: {line}"));
            assert_eq!(e.arg, arg, "{line}: {}", e.msg);
            assert!(e.msg.contains(word), "{line}: {}", e.msg);
            assert!(!e.msg.contains("0102030405"), "key leaked: {}", e.msg);
        }
        let e = build(
            &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:4096"),
            512 * 9,
            1,
        )
        .err()
        .unwrap();
        assert!(e.msg.contains("not a multiple of sector_size"), "{}", e.msg);
    }

    #[test]
    fn io_round_trip_alignment_discard_and_zeroes() {
        for threads in [1usize, 3] {
            let t = build(
                &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:4096"),
                4 << 20,
                threads,
            )
            .unwrap();
            assert_eq!(t.limits().logical_block_size, 4096);
            assert!(!t.limits().discard);
            let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
            t.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
            let mut owned = data.clone();
            t.write(2 << 20, WriteBuf::Owned(&mut owned), true).unwrap();
            for at in [4096u64, 2 << 20] {
                let mut back = vec![0u8; data.len()];
                t.read(at, &mut back).unwrap();
                assert!(back == data, "threads {threads} at {at}");
            }
            assert!(matches!(
                t.read(512, &mut [0u8; 4096]),
                Err(DevError::Misaligned { .. })
            ));
            assert!(matches!(t.discard(0, 4096), Err(DevError::NotSupported(_))));
            t.write_zeroes(4096, 8192, false).unwrap();
            let mut z = vec![1u8; 8192];
            t.read(4096, &mut z).unwrap();
            assert!(z.iter().all(|&b| b == 0));
            t.flush().unwrap();
        }
    }

    /// Forwards to a store and counts the plain data calls, to show which
    /// path the target took.
    struct Spy(MemStore, std::sync::atomic::AtomicUsize);
    impl BlockDevice for Spy {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn limits(&self) -> Limits {
            self.0.limits()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.read(offset, buf)
        }
        fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.write(offset, data, fua)
        }
        fn write_vectored(
            &self,
            offset: u64,
            bufs: &[std::io::IoSlice<'_>],
            fua: bool,
        ) -> DevResult<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.write_vectored(offset, bufs, fua)
        }
        fn direct_access(&self) -> bool {
            self.0.direct_access()
        }
        fn read_transformed(
            &self,
            offset: u64,
            buf: &mut [u8],
            t: &dyn Transform,
        ) -> DevResult<()> {
            self.0.read_transformed(offset, buf, t)
        }
        fn write_transformed(
            &self,
            offset: u64,
            src: &[u8],
            fua: bool,
            t: &dyn Transform,
        ) -> DevResult<()> {
            self.0.write_transformed(offset, src, fua, t)
        }
        fn flush(&self) -> DevResult<()> {
            self.0.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
            self.0.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
            self.0.write_zeroes(offset, len, fua)
        }
    }

    /// The direct path (cipher straight into / out of the store) must put
    /// on the store exactly the bytes the copying path puts there, and read
    /// them back, for every cipher family, sector size, iv_offset, thread
    /// count, buffer ownership, and requests across the store's regions.
    #[test]
    fn direct_access_stores_the_same_bytes_as_the_copying_path() {
        const STORE: u64 = 3 << 20;
        const LEN: u64 = (3 << 20) - 8192;
        let keys =
            |n: usize| -> String { (0..n).map(|i| format!("{:02x}", i * 37 % 256)).collect() };
        for (spec, klen) in [
            ("aes-xts-plain64", 64),
            ("aes-xts-plain64", 32),
            ("aes-cbc-essiv:sha256", 32),
            ("serpent-xts-plain64", 64),
            ("twofish-cbc-plain64be", 32),
            ("aes:4-cbc-plain", 64),
        ] {
            for ss in [512u32, 4096] {
                for iv_offset in [0u64, 24] {
                    for threads in [1usize, 2] {
                        let line = format!(
                            "{spec} {} {iv_offset} mem 16 1 sector_size:{ss}",
                            keys(klen)
                        );
                        let direct = Arc::new(Spy(MemStore::new(STORE), Default::default()));
                        let copying = Arc::new(MemStore::without_direct_access(STORE));
                        let mk = |d: Arc<dyn BlockDevice>| {
                            let args: Vec<String> =
                                line.split_whitespace().map(String::from).collect();
                            new(TargetArgs {
                                args: &args,
                                len: LEN,
                                resolver: &mut One(d),
                                options: &TargetOptions {
                                    crypt_threads: threads,
                                },
                            })
                            .unwrap()
                        };
                        let (td, tc) = (mk(direct.clone()), mk(copying.clone()));
                        let what =
                            format!("{spec} ss {ss} iv_offset {iv_offset} threads {threads}");
                        let data: Vec<u8> = (0..LEN as usize)
                            .map(|i| (i * 7 + i / 4099) as u8)
                            .collect();
                        // (offset, length, owned): whole device, pieces over
                        // region boundaries, a small one.
                        for (off, len, owned) in [
                            (0usize, LEN as usize, true),
                            (60 << 10, 200 << 10, false),
                            ((1 << 20) - 4096, (1 << 20) + 8192, false),
                            (8192, 4096, true),
                            ((2 << 20) + 4096, 300 << 10, true),
                        ] {
                            for t in [&td, &tc] {
                                let src = data[off..off + len].to_vec();
                                let mut own = src.clone();
                                if owned {
                                    t.write(off as u64, WriteBuf::Owned(&mut own), false)
                                        .unwrap();
                                } else {
                                    t.write(off as u64, WriteBuf::Borrowed(&own), false)
                                        .unwrap();
                                    assert!(own == src, "{what}: borrowed buffer modified");
                                }
                                let mut back = vec![0u8; len];
                                t.read(off as u64, &mut back).unwrap();
                                assert!(back == src, "{what}: read back at {off}+{len}");
                            }
                            let (mut a, mut b) =
                                (vec![0u8; STORE as usize], vec![0u8; STORE as usize]);
                            direct.0.read(0, &mut a).unwrap();
                            copying.read(0, &mut b).unwrap();
                            assert!(a == b, "{what}: stores differ after {off}+{len}");
                        }
                        assert_eq!(
                            direct.1.load(Ordering::Relaxed),
                            0,
                            "{what}: the direct store saw plain reads or writes"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn cipher_transform_refuses_partial_sectors() {
        let key = hex::decode(KEY).unwrap();
        let sc = SectorCrypt::new("aes-xts-plain64", &key, 4096, false).unwrap();
        let t = Cipher {
            sc: &sc,
            first: 0,
            encrypt: true,
        };
        let src = vec![0u8; 8192];
        let mut dst = vec![0u8; 8192];
        assert!(t.apply(512, &src[..4096], &mut dst[..4096]).is_err());
        assert!(t.apply(0, &src[..1024], &mut dst[..1024]).is_err());
        assert!(t.apply(0, &src, &mut dst[..4096]).is_err());
        assert!(t.apply_in_place(4096, &mut dst[..100]).is_err());
        // A piece at 4096 is the sector with cc_sector 8.
        t.apply(4096, &src[..4096], &mut dst[..4096]).unwrap();
        let mut want = vec![0u8; 4096];
        sc.encrypt(&mut want, 8);
        assert_eq!(dst[..4096], want[..]);
    }
}
