//! The `verity` driver: a hash device image (veritysetup's superblock,
//! then the tree) and a data device, opened as a verity target and read;
//! and its seeds.
//!
//! Input: `flags`, `fec`, then a little-endian u16 giving the data
//! device's length in 512-byte sectors (cut to what the input holds), the
//! data, and the rest as the hash device. The root digest is the digest
//! of the top hash block as the image holds it (unless flag 0x02 asks for
//! an all-zero root), so mutations below the top reach every level of the
//! tree instead of stopping at the root.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cli::veritysetup::superblock::{Superblock, SB_SIZE};
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::verity::tree::{Geometry, HashAlg};
use crate::targets::{DeviceResolver, TargetArgs, TargetOptions};

/// Devices by fixed name, for drivers that build their devices first.
pub struct Named(pub HashMap<&'static str, Arc<dyn BlockDevice>>);

impl DeviceResolver for Named {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        self.0
            .get(spec)
            .cloned()
            .ok_or_else(|| format!("{spec}: no such device"))
    }
}

/// A zero-filled in-memory device of at least `min` bytes (whole sectors)
/// holding `bytes` at its start.
pub fn mem_dev(bytes: &[u8], min: u64) -> Arc<MemStore> {
    let size = (bytes.len() as u64).max(min).max(512).div_ceil(512) * 512;
    let m = MemStore::new(size);
    if !bytes.is_empty() {
        m.write(0, WriteBuf::Borrowed(bytes), false)
            .expect("a write inside a fresh store");
    }
    Arc::new(m)
}

/// The largest segment the driver maps (reads stay cheap).
const MAX_LEN: u64 = 1 << 20;

/// Runs one input; true if the target was built and the whole device
/// read back (every block verified).
pub fn verity(input: &[u8]) -> bool {
    let [flags, fec, l0, l1, rest @ ..] = input else {
        return false;
    };
    let dlen = (usize::from(u16::from_le_bytes([*l0, *l1])) * 512).min(rest.len());
    let (data, hash) = rest.split_at(dlen);
    let sb = if flags & 0x01 == 0 {
        let Some(b) = hash.get(..SB_SIZE) else {
            return false;
        };
        match Superblock::parse(b.try_into().expect("512 bytes"), "hash") {
            Ok(sb) => sb,
            Err(_) => return false,
        }
    } else {
        // --no-superblock: veritysetup's defaults over the data given.
        Superblock {
            hash_type: 1,
            uuid: [0; 16],
            alg: HashAlg::Sha256,
            data_block_size: 512,
            hash_block_size: 512,
            data_blocks: (data.len() / 512) as u64,
            salt: Vec::new(),
        }
    };
    // The tree starts one hash block after the superblock (veritysetup's
    // layout), or at block 0 without one.
    let hash_start = u64::from(flags & 0x01 == 0);
    let Ok(geo) = Geometry::new(
        sb.hash_type,
        sb.data_block_size,
        sb.hash_block_size,
        sb.data_blocks,
        hash_start,
        sb.alg,
    ) else {
        return false;
    };
    let dbs = u64::from(sb.data_block_size);
    let hbs = u64::from(sb.hash_block_size);
    let len = sb
        .data_blocks
        .saturating_mul(dbs)
        .min(data.len() as u64 / dbs * dbs)
        .min(MAX_LEN / dbs * dbs);
    if len == 0 {
        return false;
    }
    let hash_dev = mem_dev(hash, 0);
    let data_dev = mem_dev(data, 0);
    let mut root = vec![0u8; sb.alg.digest_size()];
    if flags & 0x02 == 0 {
        // The top level's single block, or the only data block.
        let mut top = vec![0u8; if geo.levels() == 0 { dbs } else { hbs } as usize];
        let read = match geo.level_start.last() {
            Some(&b) => b.checked_mul(hbs).map(|at| hash_dev.read(at, &mut top)),
            None => Some(data_dev.read(0, &mut top)),
        };
        if !matches!(read, Some(Ok(()))) {
            return false;
        }
        sb.alg.block_digest(sb.hash_type, &sb.salt, &top, &mut root);
    }
    let salt = if sb.salt.is_empty() {
        "-".to_string()
    } else {
        hex::encode(&sb.salt)
    };
    let mut opts: Vec<String> = Vec::new();
    for (bit, word) in [
        (0x04, "ignore_zero_blocks"),
        (0x08, "check_at_most_once"),
        (0x10, "ignore_corruption"),
        (0x20, "restart_on_corruption"),
        (0x40, "restart_on_error"),
    ] {
        if flags & bit != 0 {
            opts.push(word.into());
        }
    }
    if flags & 0x80 != 0 {
        // FEC parity after the tree, on the hash device, as veritysetup
        // writes it with --fec-device=<hash image>.
        let covered = sb.data_blocks.saturating_add(geo.hash_blocks());
        let extra = u64::from(fec & 0x0f);
        for w in [
            "use_fec_from_device".to_string(),
            "hash".into(),
            "fec_roots".into(),
            (2 + u32::from(fec >> 4) % 23).to_string(),
            "fec_blocks".into(),
            covered.saturating_add(extra).to_string(),
            "fec_start".into(),
            geo.end.to_string(),
        ] {
            opts.push(w);
        }
    }
    let mut line = format!(
        "{} data hash {} {} {} {hash_start} {} {} {salt}",
        sb.hash_type,
        sb.data_block_size,
        sb.hash_block_size,
        sb.data_blocks,
        sb.alg.name(),
        hex::encode(&root),
    );
    if !opts.is_empty() {
        line.push_str(&format!(" {} {}", opts.len(), opts.join(" ")));
    }
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    let mut resolver = Named(HashMap::from([
        ("data", data_dev as Arc<dyn BlockDevice>),
        ("hash", hash_dev as Arc<dyn BlockDevice>),
    ]));
    let options = TargetOptions::default();
    let Ok(t) = (crate::targets::verity::TYPE.new)(TargetArgs {
        args: &args,
        len,
        resolver: &mut resolver,
        options: &options,
    }) else {
        return false;
    };
    // Every block, one at a time, then the whole device in one request
    // (a second pass meets the cache and check_at_most_once's bitmap).
    let mut b = vec![0u8; dbs as usize];
    for at in (0..len).step_by(dbs as usize) {
        let _ = t.read(at, &mut b);
    }
    let mut all = vec![0u8; len as usize];
    let verified = t.read(0, &mut all).is_ok();
    let _ = t.read(len - 512, &mut b[..512]);
    assert!(
        t.write(0, WriteBuf::Borrowed(&b[..512]), false).is_err(),
        "verity accepted a write"
    );
    let _ = t.status();
    let printed = t.table_params(false);
    assert_eq!(printed.split_whitespace().count(), args.len());
    verified
}

/// Seed inputs for [`verity`] from images `veritysetup format` wrote:
/// `flags`, `fec`, data length, data, hash image.
pub fn verity_seed(flags: u8, fec: u8, data: &[u8], hash: &[u8]) -> Vec<u8> {
    let mut v = vec![flags, fec];
    v.extend_from_slice(&((data.len() / 512) as u16).to_le_bytes());
    v.extend_from_slice(data);
    v.extend_from_slice(hash);
    v
}
