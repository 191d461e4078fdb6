//! The `thin_metadata` driver: a thin-pool over an in-memory metadata
//! device built from the input (superblock, btree nodes, space maps) and
//! a small data device, a thin device on it, a few reads, writes,
//! discards, messages and commits, then the pool reopened over what it
//! committed.
//!
//! Input: `ops`, `data` (data blocks: 1 to 64 of 64 KiB), `dev` (which
//! thin id: seeds use 0, 1 and 7), `features` (`error_if_no_space` is
//! always on; 0x80 keeps the checksums as given, see [`reseal`]), then the metadata device
//! as [`super::sparse_input`] reads a disk (its size cut to 16 MiB).

use std::collections::HashMap;
use std::sync::Arc;

use super::foreign::sparse_input;
use super::verity::Named;
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::{Target, TargetArgs, TargetOptions};

/// The metadata device is cut to this size.
const MAX_META: u64 = 16 << 20;
/// 64 KiB data blocks, the seeds' (and the kernel's smallest).
const BLOCK_SECTORS: u64 = 128;
/// The thin device's length.
const THIN_LEN: u64 = 4 << 20;

fn build(
    ty: &crate::targets::TargetType,
    line: &str,
    len: u64,
    r: &mut Named,
) -> Option<Arc<dyn Target>> {
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    (ty.new)(TargetArgs {
        args: &args,
        len,
        resolver: r,
        options: &TargetOptions::default(),
    })
    .ok()
}

/// Every metadata block is checksummed, so almost every mutation would
/// stop at the first check: a non-zero block whose checksum matches no
/// block type is sealed again (location and checksum), as the type its
/// bytes suggest: block 0 the superblock, a btree node flag a node, else a
/// bitmap (an index block when the first byte's low bits are 3).
fn reseal(meta: &mut [u8]) {
    use crate::targets::thin::pdata::block::{self, BLOCK_SIZE};
    const SALTS: [u32; 4] = [
        block::SUPERBLOCK_XOR,
        block::BTREE_XOR,
        block::BITMAP_XOR,
        block::INDEX_XOR,
    ];
    for (i, b) in meta.chunks_exact_mut(BLOCK_SIZE).enumerate() {
        if b.iter().all(|&x| x == 0) {
            continue;
        }
        let stored = block::get32(b, 0);
        if SALTS.iter().any(|&s| block::checksum(&b[4..], s) == stored) {
            continue;
        }
        let salt = if i == 0 {
            block::SUPERBLOCK_XOR
        } else if matches!(block::get32(b, 4), 1 | 2) {
            block::BTREE_XOR
        } else if b[0] & 3 == 3 {
            block::INDEX_XOR
        } else {
            block::BITMAP_XOR
        };
        let b: &mut [u8; BLOCK_SIZE] = b.try_into().expect("a whole block");
        block::seal(b, i as u64, salt);
    }
}

/// Runs one input; true if the pool and the thin device opened.
pub fn thin_metadata(input: &[u8]) -> bool {
    let Some((head, sparse, _)) = sparse_input(input) else {
        return false;
    };
    let [ops, data_sel, dev_sel, feat] = head;
    let size = sparse.size().min(MAX_META) / 4096 * 4096;
    if size == 0 {
        return false;
    }
    let meta = Arc::new(MemStore::new(size));
    let mut b = vec![0u8; size as usize];
    if sparse.read(0, &mut b).is_err() {
        return false;
    }
    if feat & 0x80 == 0 {
        reseal(&mut b);
    }
    if meta.write(0, WriteBuf::Borrowed(&b), false).is_err() {
        return false;
    }
    drop(b);
    let data_blocks = 1 + u64::from(data_sel % 64);
    let data = Arc::new(MemStore::new(data_blocks * BLOCK_SECTORS * 512));
    let id = [0u64, 1, 7, 2][usize::from(dev_sel & 3)];
    let mut features: Vec<&str> = Vec::new();
    for (bit, w) in [
        (0x01, "skip_block_zeroing"),
        (0x02, "ignore_discard"),
        (0x04, "no_discard_passdown"),
        (0x08, "read_only"),
    ] {
        if feat & bit != 0 {
            features.push(w);
        }
    }
    // Without it a write to a full pool waits (60 s by default) for the
    // data device to grow.
    features.push("error_if_no_space");
    let line = format!(
        "meta data {BLOCK_SECTORS} 0 {} {}",
        features.len(),
        features.join(" ")
    );
    let mut opened = false;
    // Twice: the second pool opens what the first committed.
    for round in 0..2 {
        let mut r = Named(HashMap::from([
            ("meta", meta.clone() as Arc<dyn BlockDevice>),
            ("data", data.clone() as Arc<dyn BlockDevice>),
        ]));
        let pool_len = data_blocks * BLOCK_SECTORS * 512;
        let Some(pool) = build(&crate::targets::thin::pool::TYPE, &line, pool_len, &mut r) else {
            return opened;
        };
        let _ = pool.status();
        let msg = |m: &str| {
            let argv: Vec<String> = m.split_whitespace().map(String::from).collect();
            let _ = pool.message(&argv);
        };
        if round == 0 {
            if ops & 0x01 != 0 {
                msg("create_thin 3");
            }
            if ops & 0x02 != 0 {
                msg(&format!("create_snap 4 {id}"));
            }
            if ops & 0x04 != 0 {
                msg("reserve_metadata_snap");
            }
            if ops & 0x08 != 0 {
                msg("set_transaction_id 0 1");
            }
        }
        r.0.insert("pool", pool.clone() as Arc<dyn BlockDevice>);
        if let Some(thin) = build(
            &crate::targets::thin::dev::TYPE,
            &format!("pool {id}"),
            THIN_LEN,
            &mut r,
        ) {
            opened = true;
            let mut buf = vec![0u8; 4096];
            for vb in [0u64, 3, 50, u64::from(ops >> 4)] {
                let at = (vb * BLOCK_SECTORS * 512) % THIN_LEN;
                let _ = thin.read(at, &mut buf);
            }
            if round == 0 {
                let w: Vec<u8> = (0..4096).map(|i| (i % 251) as u8 ^ ops).collect();
                for vb in [1u64, 2, u64::from(ops >> 5)] {
                    let at = (vb * BLOCK_SECTORS * 512 + 8192) % THIN_LEN;
                    let _ = thin.write(at, WriteBuf::Borrowed(&w), false);
                }
                let _ = thin.discard(0, BLOCK_SECTORS * 512);
                let _ = thin.flush();
            }
            let _ = thin.status();
            drop(thin);
        }
        if round == 0 && ops & 0x04 != 0 {
            msg("release_metadata_snap");
        }
        if ops & 0x80 != 0 {
            msg(&format!("delete {id}"));
        }
        let _ = pool.flush();
        let _ = pool.status();
        drop(r);
        drop(pool);
    }
    opened
}
