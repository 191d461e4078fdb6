//! `verity <version> <data_dev> <hash_dev> <data_block_size>
//! <hash_block_size> <num_data_blocks> <hash_start_block> <algorithm>
//! <root_digest> <salt> [<#opt_params> <opt_params>]`: dm-verity, a
//! read-only device whose every block is checked, on every read, against
//! a hash tree whose root digest the table gives. What the tree says is
//! what the device returns, or the read fails: a changed byte anywhere
//! below the root is an EIO for the request that meets it.
//!
//! Verified hash blocks are cached ([`cache`]) under a memory budget, so
//! a read usually costs one hash of its data blocks. A corrupt block fails
//! its request with EIO (the rest of the device keeps working), marks the
//! status `C` instead of `V` and raises a `dmsetup wait` event (up to 100,
//! as the kernel's uevents). `ignore_corruption` logs and returns the data;
//! `restart_on_corruption` and `panic_on_corruption`, which reboot a
//! kernel, fail the whole device here until its table is reloaded.
//!
//! With `use_fec_from_device` ([`repair`]), a block that fails its hash
//! is first rebuilt from the Reed–Solomon parity and re-checked against
//! the tree; only a block the parity cannot rebuild counts as corrupt.
//! The status then ends with the number of blocks repaired.
//!
//! Accepted and printed back, but not acted on (said in a warning when the
//! table is loaded): `root_hash_sig_key_desc` (udm does not check the root
//! hash's signature: the root digest in the table is trusted as given, so
//! whoever writes the table decides what is verified).

pub mod build;
pub mod cache;
pub mod fec;
pub mod params;
mod repair;
pub mod rs;
pub mod tree;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{Target, TargetArgs, TargetError, TargetOptions};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use cache::HashCache;
use params::{Mode, VerityParams};
use tree::Geometry;

/// The kernel stops reporting corrupt blocks after this many.
const MAX_CORRUPTED_ERRS: u64 = 100;
/// The largest `check_at_most_once` bitmap udm allocates (8 TiB of 4 KiB
/// blocks); the kernel would try and fail with ENOMEM.
const MAX_BITMAP_BYTES: u64 = 256 << 20;
/// The largest digest (sha512).
const MAX_DIGEST: usize = 64;

/// Requests a verity device with FEC may have running on workers of its
/// own ([`Limits::queue_depth`]): repairs hold these, and only these.
const FEC_QUEUE_DEPTH: u32 = 4;

/// The `verity` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "verity",
    version: [1, 9, 0],
    new,
    args: params::ARGS,
    more_args: None,
};

pub struct Verity {
    p: VerityParams,
    geo: Geometry,
    data: Arc<dyn BlockDevice>,
    hash: Arc<dyn BlockDevice>,
    len: u64,
    cache: HashCache,
    /// The digest of an all-zero block, with `ignore_zero_blocks`.
    zero_digest: Option<Vec<u8>>,
    /// With `check_at_most_once`, the bitmap's 64-bit words: one bit per
    /// data block already verified. Allocated at the first read, so that
    /// `udm table check` over placeholder devices allocates nothing.
    verified_words: Option<usize>,
    verified: OnceLock<Box<[AtomicU64]>>,
    /// A corrupt block was seen (status `C`).
    hash_failed: AtomicBool,
    /// `restart_on_corruption` / `panic_on_corruption` tripped.
    dead: AtomicBool,
    corrupted_errs: AtomicU64,
    /// `use_fec_from_device`: the parity that repairs corrupt blocks.
    fec: Option<repair::FecDev>,
    options: TargetOptions,
}

fn resolve(
    a: &mut TargetArgs<'_>,
    idx: usize,
    name: &str,
    block: u32,
) -> Result<Arc<dyn BlockDevice>, TargetError> {
    let dev = a
        .resolver
        .resolve(name)
        .map_err(|e| TargetError::at(idx, e))?;
    let lbs = dev.limits().logical_block_size;
    if block < lbs {
        return Err(TargetError::at(
            idx,
            format!("{name} has {lbs}-byte blocks, larger than the verity block size {block}"),
        ));
    }
    Ok(dev)
}

/// The data and hash devices, checked to hold the segment and the tree.
fn devices(
    a: &mut TargetArgs<'_>,
    p: &VerityParams,
    geo: &Geometry,
) -> Result<[Arc<dyn BlockDevice>; 2], TargetError> {
    let data = resolve(a, 1, &p.data_dev, p.data_block_size)?;
    if data.size() < a.len {
        return Err(TargetError::at(
            1,
            format!(
                "{} has {} sectors, fewer than the segment's {}",
                p.data_dev,
                data.size() / 512,
                a.len / 512
            ),
        ));
    }
    let hash = resolve(a, 2, &p.hash_dev, p.hash_block_size)?;
    let need = geo.end * u64::from(p.hash_block_size);
    if hash.size() < need {
        return Err(TargetError::at(
            2,
            format!(
                "hash device {} has {} bytes, the tree ends at byte {need}",
                p.hash_dev,
                hash.size()
            ),
        ));
    }
    Ok([data, hash])
}

/// Says plainly, once per table load, what udm accepts in the table but
/// does not do (the root hash signature check).
fn warn_unacted(p: &VerityParams) {
    if let Some(k) = &p.opts.root_hash_sig_key_desc {
        tracing::warn!(
            "verity on {}: udm does not check root hash signatures (root_hash_sig_key_desc {k}); \
             the root digest in the table is trusted as given",
            p.data_dev
        );
    }
}

pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    let p = VerityParams::parse(a.args)?;
    let geo = Geometry::new(
        p.version,
        p.data_block_size,
        p.hash_block_size,
        p.data_blocks,
        p.hash_start,
        p.alg,
    )
    .map_err(|e| TargetError::at(6, e))?;
    let dbs = u64::from(p.data_block_size);
    if a.len > p.data_blocks * dbs {
        return Err(TargetError::at(
            5,
            format!(
                "the segment has {} sectors but {} data blocks cover only {}",
                a.len / 512,
                p.data_blocks,
                p.data_blocks * dbs / 512
            ),
        ));
    }
    let [data, hash] = devices(&mut a, &p, &geo)?;
    warn_unacted(&p);
    let fec = match &p.opts.fec {
        Some(f) => Some(repair::open(&mut a, &p, &geo, &*hash, f)?),
        None => None,
    };
    let zero_digest = p.opts.ignore_zero_blocks.then(|| {
        let mut d = vec![0; p.alg.digest_size()];
        let zeros = vec![0; p.data_block_size as usize];
        p.alg.block_digest(p.version, &p.salt, &zeros, &mut d);
        d
    });
    let words = (a.len / dbs).div_ceil(64);
    if p.opts.check_at_most_once && words > MAX_BITMAP_BYTES / 8 {
        return Err(TargetError::line(format!(
            "check_at_most_once would need a {} MiB bitmap for {} data blocks (udm's limit is \
             {} MiB): use a larger data block size or leave the option out",
            (words * 8) >> 20,
            a.len / dbs,
            MAX_BITMAP_BYTES >> 20
        )));
    }
    let verified_words = p.opts.check_at_most_once.then_some(words as usize);
    let budget = crate::mem::per_device_budget(crate::mem::default_total_budget(), 1, false);
    Ok(Arc::new(Verity {
        geo,
        data,
        hash,
        len: a.len,
        cache: HashCache::new(crate::mem::Budget::new(budget)),
        zero_digest,
        verified_words,
        verified: OnceLock::new(),
        hash_failed: AtomicBool::new(false),
        dead: AtomicBool::new(false),
        corrupted_errs: AtomicU64::new(0),
        fec,
        options: a.options.clone(),
        p,
    }))
}

impl Verity {
    /// dm-verity's `verity_handle_err`: counts and reports a corrupt block
    /// (data block or hash block number), then decides by the mode whether
    /// the read goes on (`Ok`) or fails.
    fn corrupt(&self, kind: &str, block: u64) -> DevResult<()> {
        self.hash_failed.store(true, Ordering::Relaxed);
        let n = self.corrupted_errs.fetch_add(1, Ordering::Relaxed);
        if n < MAX_CORRUPTED_ERRS {
            tracing::error!(
                "verity {}: {kind} block {block} is corrupted",
                self.p.data_dev
            );
            if n + 1 == MAX_CORRUPTED_ERRS {
                tracing::error!("verity {}: reached maximum errors", self.p.data_dev);
            }
            self.options.raise_event();
        }
        match self.p.opts.mode {
            Mode::Ignore => return Ok(()),
            Mode::Restart | Mode::Panic => self.dead.store(true, Ordering::Relaxed),
            Mode::Eio => {}
        }
        Err(DevError::Target(format!(
            "verity: {kind} block {block} of {} does not match its hash tree",
            self.p.data_dev
        )))
    }

    /// The digest data block `block` must have, taken down the tree from
    /// the root through verified (or cached) hash blocks.
    fn want_digest(&self, block: u64, out: &mut [u8]) -> DevResult<()> {
        self.want_digest_with(block, out, true)
    }

    /// [`Self::want_digest`]; with `repair` false a corrupt hash block is
    /// neither repaired nor reported, only an error (FEC's own search
    /// for bad blocks reads the tree that way, so it never recurses).
    fn want_digest_with(&self, block: u64, out: &mut [u8], repair: bool) -> DevResult<()> {
        out.copy_from_slice(&self.p.root);
        let hbs = self.p.hash_block_size as usize;
        let ds = out.len();
        let mut next = [0u8; MAX_DIGEST];
        for level in (0..self.geo.levels()).rev() {
            let (hb, at) = self.geo.hash_at_level(block, level);
            if !self.cache.copy_out(hb, at, &mut next[..ds]) {
                let mut buf = vec![0u8; hbs].into_boxed_slice();
                self.hash.read(hb * hbs as u64, &mut buf)?;
                let mut got = [0u8; MAX_DIGEST];
                self.p
                    .alg
                    .block_digest(self.p.version, &self.p.salt, &buf, &mut got[..ds]);
                let mut good = got[..ds] == *out;
                if !good {
                    if !repair {
                        return Err(DevError::Target(format!(
                            "verity: metadata block {hb} of {} is corrupt",
                            self.p.data_dev
                        )));
                    }
                    let idx = hb - self.p.hash_start + self.p.data_blocks;
                    match self.fec_repair("metadata", hb, idx, out) {
                        Some(fixed) => {
                            buf = fixed;
                            good = true;
                        }
                        None => {
                            self.corrupt("metadata", hb)?;
                        }
                    }
                }
                next[..ds].copy_from_slice(&buf[at..at + ds]);
                if good {
                    self.cache.insert(hb, buf);
                }
            }
            out.copy_from_slice(&next[..ds]);
        }
        Ok(())
    }

    /// The `check_at_most_once` bitmap, if the table asks for one.
    fn bitmap(&self) -> Option<&[AtomicU64]> {
        let n = self.verified_words?;
        Some(
            self.verified
                .get_or_init(|| (0..n).map(|_| AtomicU64::new(0)).collect()),
        )
    }

    fn is_verified(&self, block: u64) -> bool {
        self.bitmap().is_some_and(|v| {
            v[(block / 64) as usize].load(Ordering::Relaxed) & (1 << (block % 64)) != 0
        })
    }

    /// Checks (and with `ignore_zero_blocks` possibly zeroes) data block
    /// `block`, whose bytes are in `data`.
    fn check_block(&self, block: u64, data: &mut [u8]) -> DevResult<()> {
        if self.is_verified(block) {
            return Ok(());
        }
        let ds = self.p.alg.digest_size();
        let mut want = [0u8; MAX_DIGEST];
        self.want_digest(block, &mut want[..ds])?;
        if self.zero_digest.as_deref() == Some(&want[..ds]) {
            data.fill(0);
            return Ok(());
        }
        let mut got = [0u8; MAX_DIGEST];
        self.p
            .alg
            .block_digest(self.p.version, &self.p.salt, data, &mut got[..ds]);
        if got[..ds] != want[..ds] {
            // A repaired block is not marked verified: the bytes on disk
            // are still wrong, and the next read must repair them again.
            return match self.fec_repair("data", block, block, &want[..ds]) {
                Some(fixed) => {
                    data.copy_from_slice(&fixed);
                    Ok(())
                }
                None => self.corrupt("data", block),
            };
        }
        if let Some(v) = self.bitmap() {
            v[(block / 64) as usize].fetch_or(1 << (block % 64), Ordering::Relaxed);
        }
        Ok(())
    }
}

impl BlockDevice for Verity {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        let own = Limits {
            logical_block_size: self.p.data_block_size,
            optimal_io_size: self.p.data_block_size,
            read_only: true,
            discard: false,
            write_zeroes: false,
            ..Limits::default()
        };
        let mut l = own.stack(self.data.limits()).stack(self.hash.limits());
        if self.fec.is_some() {
            // A block that fails its hash is rebuilt from a whole FEC
            // round (hundreds of blocks read, thousands of codewords
            // decoded): a 4 KiB read of a damaged image can cost a
            // second. Such a read must not run on an event loop, where it
            // would hold up every other export's clients on that loop:
            // workers of this device's own take it instead.
            l.queue_depth = l.queue_depth.max(FEC_QUEUE_DEPTH);
        }
        l
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let len = buf.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(DevError::OutOfRange {
                offset,
                len,
                size: self.len,
            });
        }
        let dbs = self.p.data_block_size;
        if offset % u64::from(dbs) != 0 || len % u64::from(dbs) != 0 {
            return Err(DevError::Misaligned {
                offset,
                len,
                align: dbs,
            });
        }
        if self.dead.load(Ordering::Relaxed) {
            return Err(DevError::Target(format!(
                "verity on {}: failed after a corrupt block (restart_on_corruption); \
                 reload the table to read it again",
                self.p.data_dev
            )));
        }
        if let Err(e) = self.data.read(offset, buf) {
            // With FEC a block that cannot be read is repaired like a
            // corrupt one: read block by block, the failing ones zeroed.
            if self.fec.is_none() {
                if self.p.opts.on_error != Mode::Eio {
                    // restart_on_error / panic_on_error: as a corrupt block.
                    self.dead.store(true, Ordering::Relaxed);
                    self.options.raise_event();
                }
                return Err(e);
            }
            for (i, b) in buf.chunks_mut(dbs as usize).enumerate() {
                if self
                    .data
                    .read(offset + (i as u64) * u64::from(dbs), b)
                    .is_err()
                {
                    b.fill(0);
                }
            }
        }
        let first = offset / u64::from(dbs);
        for (i, block) in buf.chunks_mut(dbs as usize).enumerate() {
            self.check_block(first + i as u64, block)?;
        }
        Ok(())
    }
    fn write(&self, _offset: u64, _data: WriteBuf<'_>, _fua: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
}

impl Target for Verity {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        self.p.table_args()
    }
    fn status(&self) -> String {
        let v = if self.hash_failed.load(Ordering::Relaxed) {
            "C"
        } else {
            "V"
        };
        // With FEC, the blocks it repaired follow (as the kernel's
        // proposed `fec_corrected` count).
        match self.fec_corrected() {
            Some(n) => format!("{v} {n}"),
            None => v.into(),
        }
    }
}

#[cfg(test)]
mod tests;
