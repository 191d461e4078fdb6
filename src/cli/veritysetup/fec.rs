//! `--fec-device`, `--fec-roots`, `--fec-offset`: the Reed–Solomon parity
//! veritysetup writes beside the tree (byte for byte the same), checked by
//! `verify` when the tree does not match, and handed to the target by
//! `open`. The layout itself is in [`crate::targets::verity::fec`].

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::args::Args;
use super::files::{open_dev, same_file, size_of, Setup};
use super::{Fail, Outcome};
use crate::targets::verity::fec::{self, Check, Layout, MAX_ROOTS, MIN_ROOTS};

/// The FEC options of the command line.
pub(super) struct FecOpts {
    pub path: String,
    pub roots: u32,
    /// Byte offset of the parity on the FEC device.
    pub offset: u64,
}

/// veritysetup's default `--fec-roots`.
const DEFAULT_ROOTS: u64 = 2;

pub(super) fn options(a: &Args) -> Result<Option<FecOpts>, Fail> {
    let Some(path) = a.str("fec-device") else {
        return Ok(None);
    };
    let roots = a.u64("fec-roots")?.unwrap_or(DEFAULT_ROOTS);
    if !(u64::from(MIN_ROOTS)..=u64::from(MAX_ROOTS)).contains(&roots) {
        return Err(Fail::usage("Invalid number of parity bytes."));
    }
    let offset = a.u64("fec-offset")?.unwrap_or(0);
    if offset % 512 != 0 {
        return Err(Fail::usage("Unsupported VERITY FEC offset."));
    }
    Ok(Some(FecOpts {
        path: path.to_string(),
        roots: roots as u32,
        offset,
    }))
}

/// How FEC sits beside a tree: what `format`, `dump` and `open` print or
/// pass on.
pub(super) struct FecPlan {
    pub layout: Layout,
    /// The parity is on the hash device (after the tree).
    pub on_hash_device: bool,
    /// `--fec-offset`.
    pub offset: u64,
}

/// The blocks FEC covers, as veritysetup counts them: the data, then the
/// hash device from the tree's first block to its end, or to the FEC
/// area when that is on the hash device too.
pub(super) fn plan(s: &Setup, f: &FecOpts, hash: &File, hash_path: &str) -> Result<FecPlan, Fail> {
    if s.data_block_size != s.hash_block_size {
        return Err(Fail::usage("Block sizes must match for FEC."));
    }
    let on_hash_device = same_file(hash_path, &f.path);
    let end = if on_hash_device {
        f.offset
    } else {
        size_of(hash, hash_path)?
    };
    let mut blocks = end / u64::from(s.data_block_size);
    if blocks > 0 {
        blocks = blocks.saturating_sub(s.hash_start());
    }
    Ok(FecPlan {
        layout: Layout::new(f.roots, s.data_block_size, blocks + s.data_blocks),
        on_hash_device,
        offset: f.offset,
    })
}

/// Reads covered block `m` from the data or the hash device.
fn read_covered<'a>(
    s: &'a Setup,
    data: &'a File,
    hash: &'a File,
) -> impl FnMut(u64, &mut [u8]) -> Result<bool, Fail> + 'a {
    let bs = u64::from(s.data_block_size);
    move |m, b| {
        let (f, at, what) = if m < s.data_blocks {
            (data, m * bs, "data")
        } else {
            (hash, (m - s.data_blocks + s.hash_start()) * bs, "hash")
        };
        f.read_exact_at(b, at)
            .map_err(|e| Fail::usage(format!("Cannot read {what} device for FEC: {e}.")))?;
        Ok(true)
    }
}

/// `format`: writes the parity (creating the FEC file if need be), after
/// the tree is on the hash device.
pub(super) fn write_parity(
    s: &Setup,
    f: &FecOpts,
    data: &File,
    hash: &File,
    hash_path: &str,
) -> Result<FecPlan, Fail> {
    let p = plan(s, f, hash, hash_path)?;
    if s.data_blocks * u64::from(s.data_block_size) == 0 {
        return Err(Fail::usage("Invalid FEC segment length."));
    }
    let out = open_dev(&f.path, true)?;
    let mut at = f.offset;
    let mut write = |par: &[u8]| -> Result<(), Fail> {
        out.write_all_at(par, at)
            .map_err(|e| Fail::usage(format!("Cannot write to FEC device {}: {e}.", f.path)))?;
        at += par.len() as u64;
        Ok(())
    };
    fec::encode(&p.layout, &mut read_covered(s, data, hash), &mut write)?;
    out.sync_all()
        .map_err(|e| Fail::usage(format!("Cannot write to FEC device {}: {e}.", f.path)))?;
    Ok(p)
}

/// `verify` after the tree did not match (`failed`): as veritysetup, the
/// parity decides. Every codeword decodes: the errors are repairable and
/// `verify` succeeds, saying how many; otherwise the original failure
/// stands.
pub(super) fn verify_after_failure(
    s: &Setup,
    f: &FecOpts,
    data: &File,
    hash: &File,
    hash_path: &str,
    failed: Fail,
) -> Outcome {
    let p = plan(s, f, hash, hash_path)?;
    let fecf = open_dev(&f.path, false)?;
    let plen = p.layout.round_parity_len() as u64;
    let mut parity = |n: u64, b: &mut [u8]| -> Result<(), Fail> {
        fecf.read_exact_at(b, f.offset + n * plen)
            .map_err(|e| Fail::usage(format!("Failed to read parity for RS block {n}: {e}.")))
    };
    match fec::check(&p.layout, &mut read_covered(s, data, hash), &mut parity)? {
        Check::Repairable(n) => {
            let mut msg = failed.msg;
            if n > 0 {
                msg.push_str(&format!("\nFound {n} repairable errors with FEC device."));
            }
            // A root hash that did not match stays a failure: the repair
            // cannot be trusted then.
            if failed.code == 1 {
                return Err(Fail::new(2, msg));
            }
            eprintln!("{msg}");
            Ok(())
        }
        Check::Unrepairable(round) => Err(Fail::new(
            2,
            format!(
                "{}\nFailed to repair parity for block {round}.\n\
                 Errors cannot be repaired with FEC device.",
                failed.msg
            ),
        )),
    }
}
