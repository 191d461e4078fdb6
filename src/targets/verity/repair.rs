//! Repair on read: a block that fails its hash is rebuilt from the FEC
//! parity (`use_fec_from_device`), checked against the tree again, and
//! returned; only a block the parity cannot rebuild fails the read. As
//! the kernel, a first attempt treats every symbol as possibly wrong (up
//! to roots/2 bad bytes per codeword); a second one first finds which
//! data blocks of the round fail their own hashes and passes them as
//! erasures (up to `roots` whole bad blocks per round).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::fec::{self, Layout};
use super::params::{Fec, VerityParams};
use super::tree::Geometry;
use super::{Verity, MAX_DIGEST};
use crate::core::{BlockDevice, DevResult};
use crate::targets::{TargetArgs, TargetError};

pub struct FecDev {
    pub dev: Arc<dyn BlockDevice>,
    pub layout: Layout,
    /// Byte offset of the parity on `dev`.
    pub start: u64,
    /// Blocks repaired since the table was loaded.
    pub corrected: AtomicU64,
}

/// The FEC device of the table, checked as the kernel checks it (and
/// against the sizes of the devices, which the kernel checks loosely).
pub fn open(
    a: &mut TargetArgs<'_>,
    p: &VerityParams,
    geo: &Geometry,
    hash: &dyn BlockDevice,
    f: &Fec,
) -> Result<FecDev, TargetError> {
    let bad = |m: String| TargetError::line(format!("use_fec_from_device {}: {m}", f.dev));
    if p.data_block_size != p.hash_block_size {
        return Err(bad("block sizes must match to use FEC".into()));
    }
    let bs = u64::from(p.data_block_size);
    let need = p.data_blocks + geo.hash_blocks();
    if f.blocks < need {
        return Err(bad(format!(
            "fec_blocks {} is fewer than the {} data and hash blocks it must cover",
            f.blocks, need
        )));
    }
    let covered_end = (p.hash_start + f.blocks - p.data_blocks).saturating_mul(bs);
    if hash.size() < covered_end {
        return Err(bad(format!(
            "hash device {} has {} bytes, fec_blocks {} covers it up to byte {covered_end}",
            p.hash_dev,
            hash.size(),
            f.blocks
        )));
    }
    let dev = a.resolver.resolve(&f.dev).map_err(|e| bad(e.to_string()))?;
    let layout = Layout::new(f.roots, p.data_block_size, f.blocks);
    let start = f.start.saturating_mul(bs);
    let end = start.saturating_add(layout.parity_blocks().saturating_mul(bs));
    if dev.size() < end {
        return Err(bad(format!(
            "the device has {} bytes, the parity (fec_start {}, {} blocks) ends at byte {end}",
            dev.size(),
            f.start,
            layout.parity_blocks()
        )));
    }
    Ok(FecDev {
        dev,
        layout,
        start,
        corrected: AtomicU64::new(0),
    })
}

impl Verity {
    /// Reads covered block `m` (data blocks, then hash blocks from the
    /// tree's start); `false` if it cannot be read.
    fn read_covered(&self, m: u64, buf: &mut [u8]) -> bool {
        let bs = u64::from(self.p.data_block_size);
        let r = if m < self.p.data_blocks {
            self.data.read(m * bs, buf)
        } else {
            let hb = m - self.p.data_blocks + self.p.hash_start;
            self.hash.read(hb * bs, buf)
        };
        r.is_ok()
    }

    /// Covered block `idx` rebuilt from the parity, if the result has the
    /// digest `want`. `kind` and `block` name it in the log.
    pub(super) fn fec_repair(
        &self,
        kind: &str,
        block: u64,
        idx: u64,
        want: &[u8],
    ) -> Option<Box<[u8]>> {
        let f = self.fec.as_ref()?;
        let l = &f.layout;
        let (round, _) = l.place(idx);
        let mut par = vec![0u8; l.round_parity_len()];
        let plen = par.len() as u64;
        f.dev.read(f.start + round * plen, &mut par).ok()?;
        let mut read = |m: u64, b: &mut [u8]| -> Result<bool, ()> { Ok(self.read_covered(m, b)) };
        let matches = |out: &[u8]| {
            let mut got = [0u8; MAX_DIGEST];
            let got = &mut got[..want.len()];
            self.p
                .alg
                .block_digest(self.p.version, &self.p.salt, out, got);
            got == want
        };
        let mut fixed = fec::repair(l, idx, &mut read, &par, &[])
            .ok()
            .flatten()
            .filter(|o| matches(o));
        if fixed.is_none() {
            let eras = self.erasures(round);
            fixed = fec::repair(l, idx, &mut read, &par, &eras)
                .ok()
                .flatten()
                .filter(|o| matches(o));
        }
        let out = fixed?;
        let n = f.corrected.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            "verity {}: FEC repaired {kind} block {block} ({n} repaired so far)",
            self.p.data_dev
        );
        Some(out.into_boxed_slice())
    }

    /// The data blocks of a round that fail their hashes (the tree read
    /// without repairs), as symbol indexes.
    fn erasures(&self, round: u64) -> Vec<usize> {
        let Some(f) = &self.fec else {
            return Vec::new();
        };
        let l = &f.layout;
        let ds = self.p.alg.digest_size();
        let mut buf = vec![0u8; l.block_size as usize];
        let mut out = Vec::new();
        for i in 0..l.rsn() {
            let m = round + i as u64 * l.rounds;
            if m >= self.p.data_blocks {
                break;
            }
            let mut want = [0u8; MAX_DIGEST];
            if self.want_digest_no_repair(m, &mut want[..ds]).is_err() {
                continue;
            }
            if self.zero_digest.as_deref() == Some(&want[..ds]) {
                continue;
            }
            let mut got = [0u8; MAX_DIGEST];
            let bad = !self.read_covered(m, &mut buf) || {
                self.p
                    .alg
                    .block_digest(self.p.version, &self.p.salt, &buf, &mut got[..ds]);
                got[..ds] != want[..ds]
            };
            if bad && out.len() < l.roots as usize {
                out.push(i);
            }
        }
        out
    }

    /// Blocks repaired so far, for the status line (`None` without FEC).
    pub(super) fn fec_corrected(&self) -> Option<u64> {
        self.fec
            .as_ref()
            .map(|f| f.corrected.load(Ordering::Relaxed))
    }

    fn want_digest_no_repair(&self, block: u64, out: &mut [u8]) -> DevResult<()> {
        self.want_digest_with(block, out, false)
    }
}
