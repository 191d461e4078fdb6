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
//! - a large request is cut into one part per crypto thread (ordered
//!   parallel encryption); each
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
//! - `integrity:<bytes>:aead`: authenticated encryption (`aead_io`), the
//!   tags and random IVs kept by the integrity device below, as in the
//!   kernel; `integrity:<bytes>:none` is refused.
//!
//! Key hygiene: the key bytes and the cipher schedules live on pages of
//! their own that are locked into RAM where permitted and wiped on drop
//! (`mem::secret`); `table` prints the key only when asked; it never
//! appears in logs, errors or Debug output.
//!
//! Messages, as dm-crypt's `crypt_message`, and only while the device is
//! suspended (its requests held, none in flight): `key wipe` drops the
//! key and the cipher schedules (their pages are wiped as they go), so
//! nothing in memory can decrypt the volume and the device refuses to
//! resume; `key set <hex>` installs a key of the same length again (what
//! `cryptsetup luksSuspend`/`luksResume` do). The key and the cipher keyed
//! with it sit behind one atomic pointer, so the hot path pays one load
//! per request and a swap never races a request.
//!
//! Where things are: this file holds the target type, the constructor and
//! the `table` output; [`args`] parses the arguments and feature options;
//! [`split`] cuts a request into per-thread parts and runs them; `io`
//! is the hot path (read, write, the cipher as a direct-access transform).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;

use super::{parse_number, parse_sectors, resolve_area, Area, Target, TargetArgs, TargetError};
use crate::core::{DevError, DevResult};
use crate::crypto::pool::CryptPool;
use crate::crypto::{aead, SectorAead, SectorCrypt};
use crate::mem::blockpool::BlockPool;
use crate::mem::{mempool, Budget, MemPool, PageList, SecretBytes};

mod aead_io;
#[cfg(test)]
mod aead_tests;
mod args;
mod io;
mod params;
mod split;
#[cfg(test)]
mod tests;

pub use args::CryptOptions;
use args::{parse_key, parse_options};
pub use params::{mask_key, CryptParams};
use split::CryptIo;

/// The key and the cipher keyed with it, replaced as one by `key set` and
/// dropped as one by `key wipe`.
pub(super) struct Keyed {
    /// Kept only for `table --showkeys`; on locked pages, wiped on drop.
    key: SecretBytes,
    pub(super) mode: Mode,
}

/// The keyed cipher: a plain sector transform, or an AEAD whose tags live
/// on the integrity device below (`integrity:<bytes>:aead`).
pub(super) enum Mode {
    Sector(SectorCrypt),
    Aead(SectorAead),
}

impl Keyed {
    /// The plain sector transform, or `None` for an AEAD.
    pub(super) fn sector(&self) -> Option<&SectorCrypt> {
        match &self.mode {
            Mode::Sector(sc) => Some(sc),
            Mode::Aead(_) => None,
        }
    }
}

/// A `crypt` segment.
pub struct Crypt {
    cipher: String,
    /// Bytes of the key (`key set` must give as many; `table` prints that
    /// many zeros while the key is wiped).
    key_len: usize,
    /// None while the key is wiped (`key wipe`).
    keyed: ArcSwapOption<Keyed>,
    /// Between dm's postsuspend and resume: key messages are allowed.
    suspended: AtomicBool,
    iv_offset: u64,
    area: Area,
    len: u64,
    opts: CryptOptions,
    /// Crypto threads asked for (0 = one per core; 1 = none, the
    /// submitting thread does all the work).
    threads: usize,
    /// The helper threads that split a large request, started by the first
    /// request that is split (see [`Crypt::helpers`]); `None` inside when
    /// they could not be started or are not wanted.
    pool: OnceLock<Option<Arc<CryptPool>>>,
    bounce_pool: OnceLock<Arc<MemPool>>,
    /// Per-request state of split requests, from a fixed-size block pool
    /// (free list threaded through the free blocks) instead of the general
    /// allocator.
    io_pool: BlockPool<CryptIo>,
    /// Bounce pages in one bulk mempool allocation or one at a time (the
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
            .field("offset", &self.area.table_offset())
            .field("options", &self.opts)
            .finish()
    }
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
pub fn new(a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    Ok(Arc::new(construct(a)?))
}

fn construct(mut a: TargetArgs<'_>) -> Result<Crypt, TargetError> {
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
    let iv_offset = parse_number(a.args, 2, "a decimal number of 512-byte sectors")?;
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
    let mode = keyed_mode(&cipher, &key, &opts, a.args.len())?;
    if key.is_empty() && a.args[1] != "-" {
        return Err(TargetError::at(
            1,
            "empty key: write '-' for a key of size 0",
        ));
    }
    let len = a.len;
    let area = resolve_area(&mut a, 3, len)?;
    if let Mode::Aead(ae) = &mode {
        aead_io::check_layout(&area, ae)?;
    }
    let threads = if opts.same_cpu_crypt || (opts.no_read_workqueue && opts.no_write_workqueue) {
        1
    } else {
        a.options.crypt_threads
    };
    tracing::debug!(
        cipher = %cipher,
        key_bits = key.len() * 8,
        sector_size = ss,
        iv_offset,
        device = %area.name,
        vector_kernel = match &mode {
            Mode::Sector(sc) => sc.vector_kernel().unwrap_or("portable"),
            Mode::Aead(_) => "aead",
        },
        threads,
        "crypt target created"
    );
    Ok(Crypt {
        cipher,
        key_len: key.len(),
        keyed: ArcSwapOption::from_pointee(Keyed { key, mode }),
        suspended: AtomicBool::new(false),
        iv_offset,
        area,
        len,
        opts,
        threads,
        pool: OnceLock::new(),
        bounce_pool: OnceLock::new(),
        io_pool: BlockPool::new(),
        bulk_bounce: mempool::bulk_bounce_default(),
    })
}

/// Key the cipher of a line: an AEAD when the line has
/// `integrity:<bytes>:aead`, else a sector transform (an AEAD spec without
/// that option is refused, as the kernel cannot allocate it as a skcipher).
fn keyed_mode(
    cipher: &str,
    key: &[u8],
    opts: &CryptOptions,
    nargs: usize,
) -> Result<Mode, TargetError> {
    let at = |e: crate::crypto::CryptoError| {
        TargetError::at(if e.about_key() { 1 } else { 0 }, e.to_string())
    };
    if opts.integrity_tag == 0 {
        if aead::is_aead_spec(cipher) {
            return Err(TargetError::at(
                0,
                format!(
                    "'{cipher}' is an authenticated cipher: the line needs the option \
                     integrity:<bytes>:aead over an integrity device"
                ),
            ));
        }
        let sc =
            SectorCrypt::new(cipher, key, opts.sector_size, opts.iv_large_sectors).map_err(at)?;
        return Ok(Mode::Sector(sc));
    }
    if !opts.integrity_aead {
        return Err(TargetError::at(
            nargs - 1,
            "integrity:<bytes>:none (a stored IV without authentication) is not supported by \
             udm; use an AEAD cipher with integrity:<bytes>:aead",
        ));
    }
    let a = SectorAead::new(
        cipher,
        key,
        opts.integrity_tag as usize,
        opts.sector_size,
        opts.iv_large_sectors,
    )
    .map_err(at)?;
    Ok(Mode::Aead(a))
}

impl Crypt {
    /// The options this target was built with.
    pub fn options(&self) -> CryptOptions {
        self.opts
    }

    /// The bounce pages for `len` bytes of a borrowed write. The single place
    /// that decides where encryption buffers come from: dm-crypt's page
    /// mempool (reserve of 256 pages, per-device budget), all pages in one
    /// bulk mempool allocation unless the one-at-a-time ablation is selected.
    pub(super) fn bounce(&self, len: usize) -> PageList {
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

    pub(super) fn check(&self, offset: u64, len: usize) -> DevResult<()> {
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
    pub(super) fn cc_sector(&self, offset: u64) -> u64 {
        (offset / 512).wrapping_add(self.iv_offset)
    }

    /// The error of a request that meets a wiped key. Requests only get
    /// here if something bypassed the suspend a wipe needs; they fail
    /// instead of touching data.
    #[cold]
    pub(super) fn wiped(&self) -> DevError {
        DevError::Target(format!(
            "crypt over {}: the key is wiped (`key wipe`); set it with `key set` \
             (cryptsetup luksResume) before resuming",
            self.area.name
        ))
    }

    /// `key set <hex>`: a key of the same length, keyed into a new cipher
    /// before anything changes, so a bad key leaves the old state.
    fn set_key(&self, hex_key: &str) -> Result<(), String> {
        let key = parse_key(hex_key).map_err(|e| format!("key set: {}", e.msg))?;
        if key.len() != self.key_len || (key.is_empty() && hex_key != "-") {
            return Err(format!(
                "key set: the key has {} bits, the table's {}; the key size may not change",
                key.len() * 8,
                self.key_len * 8
            ));
        }
        let secret = SecretBytes::new(&key)
            .ok_or_else(|| "key set: the key is longer than udm supports".to_string())?;
        let mode = keyed_mode(&self.cipher, &secret, &self.opts, 6)
            .map_err(|e| format!("key set: {}", e.msg))?;
        self.keyed
            .store(Some(Arc::new(Keyed { key: secret, mode })));
        Ok(())
    }
}

impl Target for Crypt {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }

    /// dm-crypt's STATUSTYPE_TABLE order: cipher, key, iv_offset, device,
    /// offset, then the feature args in the kernel's canonical order.
    ///
    /// With `show_keys` the key is written straight into a zeroizing
    /// buffer of exactly the line's size, then handed over without a copy
    /// (the caller wipes it): a temporary hex copy, or a buffer that grew,
    /// would free key bytes unwiped.
    fn table_params(&self, show_keys: bool) -> String {
        use std::fmt::Write;
        let keyed = self.keyed.load();
        let cipher = crate::core::table::escape_arg(&self.cipher);
        // Everything after the key holds no secret: rendered first, so
        // the buffer's size is known exactly.
        let mut tail = format!(
            " {} {} {}",
            self.iv_offset,
            self.area.table_name(),
            self.area.table_offset()
        );
        let feats = self.opts.words();
        if !feats.is_empty() {
            let _ = write!(tail, " {} {}", feats.len(), feats.join(" "));
        }
        let key_len = if self.key_len == 0 {
            1
        } else {
            2 * self.key_len
        };
        let mut s = zeroize::Zeroizing::new(String::with_capacity(
            cipher.len() + 1 + key_len + tail.len(),
        ));
        s.push_str(&cipher);
        s.push(' ');
        // A wiped key prints as zeros, as the kernel's zeroed key does.
        match keyed.as_deref() {
            _ if self.key_len == 0 => s.push('-'),
            Some(k) if show_keys => {
                for b in k.key.iter() {
                    let _ = write!(s, "{b:02x}");
                }
            }
            _ => s.extend(std::iter::repeat_n('0', self.key_len * 2)),
        }
        s.push_str(&tail);
        std::mem::take(&mut *s)
    }

    /// dm-crypt's messages: `key wipe` and `key set <key>`, only while
    /// suspended (the kernel's rule: no request may see a key change).
    fn message(&self, argv: &[String]) -> Result<Option<String>, String> {
        let words: Vec<&str> = argv.iter().map(String::as_str).collect();
        let is = |w: &str, want: &str| w.eq_ignore_ascii_case(want);
        match words.as_slice() {
            [k, op, ..] if is(k, "key") => {
                if !self.suspended.load(Ordering::SeqCst) {
                    return Err(
                        "key messages are accepted only while the device is suspended \
                         (dmsetup suspend first)"
                            .into(),
                    );
                }
                match words.as_slice() {
                    [_, _] if is(op, "wipe") => {
                        // The last reference goes here: the locked pages of
                        // the key and the schedules are wiped as they drop.
                        drop(self.keyed.swap(None));
                        tracing::debug!(device = %self.area.name, "crypt key wiped");
                        Ok(None)
                    }
                    [_, _, key] if is(op, "set") => {
                        self.set_key(key)?;
                        tracing::debug!(device = %self.area.name, "crypt key set");
                        Ok(None)
                    }
                    _ => Err(format!(
                        "unrecognised crypt key message (\"key wipe\" or \"key set <key>\"; \
                         got {} words)",
                        words.len()
                    )),
                }
            }
            // The words are not quoted back: a mistyped message may hold a key.
            _ => Err(format!(
                "unrecognised crypt message of {} words (crypt accepts \"key wipe\" and \
                 \"key set <key>\")",
                words.len()
            )),
        }
    }

    fn postsuspend(&self) {
        self.suspended.store(true, Ordering::SeqCst);
    }

    fn preresume(&self) -> Result<(), String> {
        if self.keyed.load().is_none() {
            return Err(format!(
                "aborting resume: the crypt key over {} is not set (wiped by `key wipe`; \
                 restore it with `key set`, e.g. cryptsetup luksResume)",
                self.area.name
            ));
        }
        Ok(())
    }

    fn resume(&self) {
        self.suspended.store(false, Ordering::SeqCst);
    }
}
