//! Space maps on disk: reference counts of 2 bits per block in bitmap
//! blocks (3 means "look in the ref-count btree"), an index of the bitmaps
//! (a btree for the data device, one block for the metadata device), and a
//! btree of the counts above 2. In memory every count is a plain `u32`
//! ([`super::tm::RefCounts`]); a commit writes the bitmaps whose counts
//! changed to fresh blocks and updates the index and the count tree.

use std::collections::{BTreeMap, BTreeSet};

use super::block::{get32, get64, put32, put64, seal, verify, Block, BITMAP_XOR, INDEX_XOR};
use super::btree;
use super::tm::{Tm, Vk};

/// Entries in one bitmap block: 2 bits each after a 16-byte header.
pub const PER_BITMAP: u64 = (4096 - 16) * 4;
/// Bitmaps one metadata index block holds (so the metadata device's limit).
pub const MAX_META_BITMAPS: u64 = 255;

/// `struct disk_sm_root`, 32 of the 128 bytes the superblock gives it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmRoot {
    pub nr_blocks: u64,
    pub nr_allocated: u64,
    pub bitmap_root: u64,
    pub ref_count_root: u64,
}

impl SmRoot {
    pub fn decode(b: &[u8]) -> SmRoot {
        SmRoot {
            nr_blocks: get64(b, 0),
            nr_allocated: get64(b, 8),
            bitmap_root: get64(b, 16),
            ref_count_root: get64(b, 24),
        }
    }

    pub fn encode(&self, b: &mut [u8]) {
        put64(b, 0, self.nr_blocks);
        put64(b, 8, self.nr_allocated);
        put64(b, 16, self.bitmap_root);
        put64(b, 24, self.ref_count_root);
    }
}

/// `struct disk_index_entry`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexEntry {
    pub blocknr: u64,
    pub nr_free: u32,
    pub none_free_before: u32,
}

impl IndexEntry {
    fn decode(b: &[u8]) -> IndexEntry {
        IndexEntry {
            blocknr: get64(b, 0),
            nr_free: get32(b, 8),
            none_free_before: get32(b, 12),
        }
    }

    fn encode(&self) -> [u8; 16] {
        let mut v = [0u8; 16];
        put64(&mut v, 0, self.blocknr);
        put32(&mut v, 8, self.nr_free);
        put32(&mut v, 12, self.none_free_before);
        v
    }
}

/// Where one space map lives on disk, and what its count tree holds.
pub struct SmDisk {
    pub metadata: bool,
    pub entries: Vec<IndexEntry>,
    /// Index btree root (data) or index block (metadata); 0 before format.
    pub index: u64,
    pub rc_root: u64,
    pub rc: BTreeMap<u64, u32>,
    /// Bitmaps that must be written in this commit.
    need: BTreeSet<usize>,
}

fn nr_bitmaps(nr_blocks: u64) -> usize {
    nr_blocks.div_ceil(PER_BITMAP) as usize
}

impl SmDisk {
    /// A space map not on disk yet: every bitmap is written at the first commit.
    pub fn fresh(tm: &mut Tm, metadata: bool, nr_blocks: u64) -> Result<SmDisk, String> {
        let n = nr_bitmaps(nr_blocks);
        let index = if metadata { 0 } else { btree::empty(tm, 16)? };
        Ok(SmDisk {
            metadata,
            entries: vec![IndexEntry::default(); n],
            index,
            rc_root: btree::empty(tm, 4)?,
            rc: BTreeMap::new(),
            need: (0..n).collect(),
        })
    }

    /// Read a space map of a device of `dev_blocks` blocks: its counts,
    /// and where it lives. Its size is checked against the device before
    /// anything is allocated for it.
    pub fn load(
        tm: &mut Tm,
        root: &SmRoot,
        metadata: bool,
        dev_blocks: u64,
    ) -> Result<(Vec<u32>, SmDisk), String> {
        let what = if metadata {
            "metadata space map"
        } else {
            "data space map"
        };
        let dev = if metadata { "metadata" } else { "data" };
        if root.nr_blocks > dev_blocks {
            return Err(format!(
                "the thin pool's {what} counts {} blocks, but the {dev} device holds {dev_blocks}: \
                 the metadata belongs to a larger device or is damaged; run thin_check",
                root.nr_blocks
            ));
        }
        if root.nr_allocated > root.nr_blocks {
            return Err(format!(
                "the thin pool's {what} says {} of its {} blocks are allocated: run thin_check",
                root.nr_allocated, root.nr_blocks
            ));
        }
        let n = nr_bitmaps(root.nr_blocks);
        if metadata && n as u64 > MAX_META_BITMAPS {
            return Err(format!(
                "thin metadata space map has {n} bitmaps, more than {MAX_META_BITMAPS}"
            ));
        }
        let mut entries = Vec::new();
        entries
            .try_reserve_exact(n)
            .map_err(|_| format!("the thin pool's {what}: {n} bitmaps do not fit in memory"))?;
        entries.resize(n, IndexEntry::default());
        if metadata {
            let blk = tm.read_raw(root.bitmap_root)?;
            verify(
                &blk,
                root.bitmap_root,
                INDEX_XOR,
                "metadata space map index",
            )?;
            for (i, e) in entries.iter_mut().enumerate() {
                *e = IndexEntry::decode(&blk[16 + 16 * i..]);
            }
        } else {
            btree::walk(
                tm,
                root.bitmap_root,
                16,
                "data space map index",
                &mut |k, v| {
                    if let Some(e) = entries.get_mut(k as usize) {
                        *e = IndexEntry::decode(v);
                    }
                },
            )?;
        }
        let mut counts = super::tm::zero_counts(root.nr_blocks, dev)?;
        for (i, e) in entries.iter().enumerate() {
            let blk = tm.read_raw(e.blocknr)?;
            verify(&blk, e.blocknr, BITMAP_XOR, "space map bitmap")?;
            let base = i * PER_BITMAP as usize;
            let end = (base + PER_BITMAP as usize).min(counts.len());
            decode_bitmap(&blk, &mut counts[base..end]);
        }
        let mut rc = BTreeMap::new();
        btree::walk(
            tm,
            root.ref_count_root,
            4,
            "space map reference count",
            &mut |k, v| {
                rc.insert(k, get32(v, 0));
            },
        )?;
        for (&b, &c) in &rc {
            if let Some(x) = counts.get_mut(b as usize) {
                if *x == 3 {
                    *x = c;
                }
            }
        }
        let disk = SmDisk {
            metadata,
            entries,
            index: root.bitmap_root,
            rc_root: root.ref_count_root,
            rc,
            need: BTreeSet::new(),
        };
        Ok((counts, disk))
    }

    /// A bigger data device: its new bitmaps are written at the next commit.
    pub fn grow(&mut self, nr_blocks: u64) {
        let n = nr_bitmaps(nr_blocks);
        while self.entries.len() < n {
            self.need.insert(self.entries.len());
            self.entries.push(IndexEntry::default());
        }
    }
}

fn decode_bitmap(blk: &Block, counts: &mut [u32]) {
    for (i, c) in counts.iter_mut().enumerate() {
        let word = get64(&blk[..], 16 + 8 * (i / 32));
        let bit = 2 * (i % 32);
        let hi = (word >> bit) & 1;
        let lo = (word >> (bit + 1)) & 1;
        *c = ((hi << 1) | lo) as u32;
    }
}

/// A bitmap block for `counts` (at most [`PER_BITMAP`]), and its index entry.
fn encode_bitmap(counts: &[u32], loc: u64) -> (Block, IndexEntry) {
    let mut blk = super::block::zeroed();
    let mut words = vec![0u64; (PER_BITMAP / 32) as usize];
    let mut nr_free = 0u32;
    let mut first_free = None;
    for (i, &c) in counts.iter().enumerate() {
        let v = u64::from(c.min(3));
        if c == 0 {
            nr_free += 1;
            first_free.get_or_insert(i as u32);
        }
        let bit = 2 * (i % 32);
        words[i / 32] |= ((v >> 1) << bit) | ((v & 1) << (bit + 1));
    }
    for (i, w) in words.iter().enumerate() {
        put64(&mut blk[..], 16 + 8 * i, *w);
    }
    seal(&mut blk, loc, BITMAP_XOR);
    let e = IndexEntry {
        blocknr: loc,
        nr_free,
        none_free_before: first_free.unwrap_or(counts.len() as u32),
    };
    (blk, e)
}

fn counts_of(tm: &Tm, metadata: bool) -> &[u32] {
    if metadata {
        &tm.msm.cur
    } else {
        &tm.dsm.cur
    }
}

fn changed_of(tm: &Tm, metadata: bool) -> Vec<u64> {
    let c = if metadata {
        &tm.msm.changed
    } else {
        &tm.dsm.changed
    };
    c.iter().copied().collect()
}

/// Bring the count tree and the set of bitmaps to write up to date with the
/// blocks in `blocks`; true if anything was done.
fn sync_blocks(tm: &mut Tm, d: &mut SmDisk, blocks: &[u64]) -> Result<(), String> {
    for &b in blocks {
        d.need.insert((b / PER_BITMAP) as usize);
        let c = counts_of(tm, d.metadata)
            .get(b as usize)
            .copied()
            .unwrap_or(0);
        let want = (c >= 3).then_some(c);
        if d.rc.get(&b).copied() == want {
            continue;
        }
        match want {
            Some(c) => {
                d.rc_root = btree::insert(tm, d.rc_root, b, &c.to_le_bytes(), Vk::Plain, true)?.0;
                d.rc.insert(b, c);
            }
            None => {
                d.rc_root = btree::remove(tm, d.rc_root, b, Vk::Plain, 4)?.0;
                d.rc.remove(&b);
            }
        }
    }
    Ok(())
}

/// Move the bitmaps in `need` to fresh blocks (their old blocks freed).
fn shadow_bitmaps(
    tm: &mut Tm,
    d: &mut SmDisk,
    done: &mut BTreeMap<usize, u64>,
) -> Result<(), String> {
    let todo: Vec<usize> = d
        .need
        .iter()
        .copied()
        .filter(|i| !done.contains_key(i))
        .collect();
    for i in todo {
        let loc = tm.alloc_meta()?;
        let old = d.entries[i].blocknr;
        if old != 0 {
            tm.msm.dec(old);
        }
        done.insert(i, loc);
    }
    Ok(())
}

/// Write the space map's changes of this transaction; its new root. The
/// data map goes first: writing the metadata map changes only metadata
/// counts, which this one then settles (its own writes change them too, so
/// it repeats until nothing moves).
pub fn store(tm: &mut Tm, d: &mut SmDisk) -> Result<SmRoot, String> {
    let mut done = BTreeMap::new();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    if d.metadata {
        let idx = tm.alloc_meta()?;
        if d.index != 0 {
            tm.msm.dec(d.index);
        }
        d.index = idx;
    }
    loop {
        let counts = counts_of(tm, d.metadata);
        let pending: Vec<u64> = changed_of(tm, d.metadata)
            .into_iter()
            .filter(|b| seen.get(b) != counts.get(*b as usize))
            .collect();
        let fresh_need = d.need.iter().any(|i| !done.contains_key(i));
        if pending.is_empty() && !fresh_need {
            break;
        }
        for &b in &pending {
            seen.insert(b, counts_of(tm, d.metadata)[b as usize]);
        }
        sync_blocks(tm, d, &pending)?;
        shadow_bitmaps(tm, d, &mut done)?;
        if !d.metadata {
            // The data map's own writes change only metadata counts.
            break;
        }
    }
    for (&i, &loc) in &done {
        let counts = counts_of(tm, d.metadata);
        let base = i * PER_BITMAP as usize;
        let end = (base + PER_BITMAP as usize).min(counts.len());
        let (blk, e) = encode_bitmap(&counts[base..end], loc);
        tm.put_raw(loc, blk);
        d.entries[i] = e;
        if !d.metadata {
            d.index = btree::insert(tm, d.index, i as u64, &e.encode(), Vk::Plain, true)?.0;
        }
    }
    if d.metadata {
        let mut blk = super::block::zeroed();
        for (i, e) in d.entries.iter().enumerate() {
            blk[16 + 16 * i..32 + 16 * i].copy_from_slice(&e.encode());
        }
        seal(&mut blk, d.index, INDEX_XOR);
        tm.put_raw(d.index, blk);
    }
    d.need.clear();
    let counts = counts_of(tm, d.metadata);
    Ok(SmRoot {
        nr_blocks: counts.len() as u64,
        nr_allocated: counts.iter().filter(|&&c| c > 0).count() as u64,
        bitmap_root: d.index,
        ref_count_root: d.rc_root,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_round_trips_counts_up_to_three() {
        let counts: Vec<u32> = (0..PER_BITMAP as u32).map(|i| i % 5).collect();
        let (blk, e) = encode_bitmap(&counts, 9);
        let mut back = vec![0u32; counts.len()];
        decode_bitmap(&blk, &mut back);
        assert!(back.iter().zip(&counts).all(|(b, c)| *b == (*c).min(3)));
        assert_eq!(e.nr_free as u64, PER_BITMAP / 5);
        assert_eq!(e.none_free_before, 0);
        assert!(verify(&blk, 9, BITMAP_XOR, "bitmap").is_ok());
    }
}
