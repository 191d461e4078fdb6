//! The `integrity` driver: the integrity target over an in-memory device
//! whose first bytes are the input (superblock, journal, bitmap, tags):
//! reads, writes, a flush and a discard, then the device opened again
//! (journal replay, bitmap recovery) and read.
//!
//! Input: `mode` (J, B, D or R), `line` (which of a few table lines: tag
//! size and internal hash, block size, interleave), `opts` (optional
//! arguments added), `ops`, then the device as [`super::sparse_input`]
//! reads a disk (its size cut to 8 MiB). An all-zero device is formatted
//! at the first open, as the kernel does.

use std::collections::HashMap;
use std::sync::Arc;

use super::foreign::sparse_input;
use super::verity::Named;
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::integrity::superblock::Superblock;
use crate::targets::{Target, TargetArgs, TargetOptions};

/// The device is cut to this size.
const MAX_DEV: u64 = 8 << 20;
/// The mapping's length when the superblock does not say.
const DEFAULT_LEN: u64 = 1 << 20;

/// Tag size and the options every line has.
pub const LINES: [&str; 6] = [
    "4 fix_padding internal_hash:crc32c",
    "32 fix_padding journal_sectors:64 internal_hash:sha256",
    "4 block_size:4096 fix_padding journal_sectors:64 internal_hash:crc32c",
    "4 internal_hash:crc32c",
    "8 fix_padding interleave_sectors:256 internal_hash:crc32c",
    "4 fix_padding journal_sectors:64 sectors_per_bit:8 internal_hash:crc32c",
];

fn open(line: &str, len: u64, r: &mut Named) -> Result<Arc<dyn Target>, String> {
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    crate::targets::integrity::new(TargetArgs {
        args: &args,
        len,
        resolver: r,
        options: &TargetOptions::default(),
    })
    .map_err(|e| format!("{line}: {}", e.msg))
}

fn mode_of(mode: u8) -> &'static str {
    ["J", "B", "D", "R"][usize::from(mode & 3)]
}

/// The table line the control bytes choose.
fn line_for(mode: u8, line_sel: u8, opts: u8) -> String {
    let base = LINES[usize::from(line_sel) % LINES.len()];
    let mut words: Vec<&str> = base.split_whitespace().skip(1).collect();
    for (bit, w) in [
        (0x01, "allow_discards"),
        (0x02, "recalculate"),
        (0x04, "journal_watermark:0"),
        (0x08, "commit_time:1"),
        (0x10, "bitmap_flush_interval:1"),
    ] {
        if opts & bit != 0 {
            words.push(w);
        }
    }
    let tag = base.split_whitespace().next().unwrap_or("4");
    format!(
        "d 0 {tag} {} {} {}",
        mode_of(mode),
        words.len(),
        words.join(" ")
    )
}

/// The target the control bytes choose over `m`, mapping
/// [`DEFAULT_LEN`] (for making seeds: a zeroed `m` is formatted).
pub fn integrity_open(
    m: &Arc<MemStore>,
    mode: u8,
    line_sel: u8,
    opts: u8,
) -> Result<Arc<dyn Target>, String> {
    let mut r = Named(HashMap::from([("d", m.clone() as Arc<dyn BlockDevice>)]));
    open(&line_for(mode, line_sel, opts), DEFAULT_LEN, &mut r)
}

/// Runs one input; true if the target opened.
pub fn integrity(input: &[u8]) -> bool {
    let Some((head, sparse, _)) = sparse_input(input) else {
        return false;
    };
    let [mode, line_sel, opts, ops] = head;
    let size = sparse.size().min(MAX_DEV) / 4096 * 4096;
    if size == 0 {
        return false;
    }
    let dev = Arc::new(MemStore::new(size));
    let mut b = vec![0u8; size as usize];
    if sparse.read(0, &mut b).is_err() || dev.write(0, WriteBuf::Borrowed(&b), false).is_err() {
        return false;
    }
    // What the superblock says the device provides, if it says.
    let provided = Superblock::parse(&b[..512])
        .ok()
        .flatten()
        .map(|sb| sb.provided_data_sectors * 512);
    drop(b);
    let len = provided.unwrap_or(DEFAULT_LEN).clamp(4096, DEFAULT_LEN) / 4096 * 4096;
    let line = line_for(mode, line_sel, opts);
    let mode = mode_of(mode);
    let mut opened = false;
    for round in 0..2 {
        let mut r = Named(HashMap::from([("d", dev.clone() as Arc<dyn BlockDevice>)]));
        let Ok(t) = open(&line, len, &mut r) else {
            return opened;
        };
        opened = true;
        let mut buf = vec![0u8; 4096];
        for at in (0..len.min(64 << 10)).step_by(4096) {
            let _ = t.read(at, &mut buf);
        }
        let _ = t.read(len - 4096, &mut buf);
        if round == 0 && mode != "R" {
            // In range and aligned: targets may assume their callers checked.
            let w: Vec<u8> = (0..4096).map(|i| (i % 251) as u8 ^ ops).collect();
            for k in [0u64, u64::from(ops >> 4), 7] {
                let at = (k * 8192) % len / 4096 * 4096;
                let _ = t.write(at, WriteBuf::Borrowed(&w), ops & 0x01 != 0);
            }
            if ops & 0x02 != 0 {
                let _ = t.flush();
            }
            if ops & 0x04 != 0 {
                let _ = t.discard(0, 4096);
            }
        }
        let _ = t.status();
        drop(t);
    }
    opened
}
