//! The thin pool's metadata as dm-thin-metadata.c lays it out: a superblock
//! at block 0 (magic 27022010), a device details btree (dev id → mapped
//! blocks, transaction, creation and snapshot times), and a two-level
//! mapping btree (dev id → subtree root; virtual block → `data block << 24
//! | time`). A snapshot shares its origin's subtree root, which is why it
//! costs one reference count whatever the device's size.
//!
//! Commit protocol: the data device is flushed, then the device details and
//! both space maps are written into fresh blocks, all of them flushed, and
//! only then the superblock, which switches the pool to the new
//! transaction in one 4 KiB write.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::pdata::block::Node;
use super::pdata::block::{get32, get64, put32, put64, seal, verify, Block, SUPERBLOCK_XOR};
use super::pdata::btree;
use super::pdata::space_map::{SmDisk, SmRoot, MAX_META_BITMAPS, PER_BITMAP};
use super::pdata::tm::{zero_counts, Pending, RefCounts, Tm, Vk};
use crate::core::BlockDevice;
use crate::mem::Budget;

const MAGIC: u64 = 27_022_010;
const VERSION: u32 = 2;
const NEEDS_CHECK: u32 = 1;

/// One thin device's details (`struct disk_device_details`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Details {
    pub mapped: u64,
    pub trans_id: u64,
    pub creation_time: u32,
    pub snap_time: u32,
}

impl Details {
    fn decode(v: &[u8]) -> Details {
        Details {
            mapped: get64(v, 0),
            trans_id: get64(v, 8),
            creation_time: get32(v, 16),
            snap_time: get32(v, 20),
        }
    }

    fn encode(&self) -> [u8; 24] {
        let mut v = [0u8; 24];
        put64(&mut v, 0, self.mapped);
        put64(&mut v, 8, self.trans_id);
        put32(&mut v, 16, self.creation_time);
        put32(&mut v, 20, self.snap_time);
        v
    }
}

/// The pool's metadata, open and writable.
pub struct Metadata {
    pub tm: Tm,
    pub time: u32,
    pub trans_id: u64,
    pub held_root: u64,
    flags: u32,
    /// Data block size in 512-byte sectors.
    pub block_sectors: u32,
    mapping_root: u64,
    details_root: u64,
    pub devs: BTreeMap<u64, Details>,
    /// Devices whose details changed (or were deleted) since the commit.
    changed: BTreeMap<u64, bool>,
    dsm: SmDisk,
    msm: SmDisk,
    /// A superblock field changed (transaction id) since the commit.
    sb_dirty: bool,
}

fn all_zero(b: &Block) -> bool {
    b.iter().all(|&x| x == 0)
}

impl Metadata {
    /// Open the metadata on `dev`, or format it when its superblock is all
    /// zeros (as the kernel does for a new pool).
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        data_blocks: u64,
        block_sectors: u32,
        budget: Arc<Budget>,
    ) -> Result<Metadata, String> {
        let nr = (dev.size() / 4096).min(MAX_META_BITMAPS * PER_BITMAP);
        if nr < 16 {
            return Err(
                "the thin pool's metadata device is under 64 KiB: give it at least a few MiB"
                    .into(),
            );
        }
        let mut tm = Tm::new(
            dev,
            RefCounts::new(Vec::new()),
            RefCounts::new(Vec::new()),
            budget,
        );
        let sb = tm.read_raw(0)?;
        if all_zero(&sb) {
            return Self::format(tm, nr, data_blocks, block_sectors);
        }
        verify(&sb, 0, SUPERBLOCK_XOR, "superblock")?;
        if get64(&sb[..], 32) != MAGIC {
            return Err(
                "the thin pool's metadata device has no thin superblock (bad magic): \
                        zero its first 4 KiB to format a new pool"
                    .into(),
            );
        }
        let version = get32(&sb[..], 40);
        if !(1..=2).contains(&version) {
            return Err(format!(
                "thin metadata version {version} is not supported (1 or 2)"
            ));
        }
        let ms = SmRoot::decode(&sb[192..]);
        let ds = SmRoot::decode(&sb[64..]);
        let meta_blocks = tm.nr_blocks();
        let (mc, msm) = SmDisk::load(&mut tm, &ms, true, meta_blocks)?;
        let (dc, dsm) = SmDisk::load(&mut tm, &ds, false, data_blocks)?;
        tm.msm = RefCounts::try_new(mc, "metadata device")?;
        tm.dsm = RefCounts::try_new(dc, "data device")?;
        let mut m = Metadata {
            tm,
            time: get32(&sb[..], 44),
            trans_id: get64(&sb[..], 48),
            held_root: get64(&sb[..], 56),
            flags: get32(&sb[..], 4),
            block_sectors: get32(&sb[..], 336),
            mapping_root: get64(&sb[..], 320),
            details_root: get64(&sb[..], 328),
            devs: BTreeMap::new(),
            changed: BTreeMap::new(),
            dsm,
            msm,
            sb_dirty: false,
        };
        if m.block_sectors != block_sectors {
            return Err(format!(
                "the pool's metadata has a data block size of {} sectors, the table says {block_sectors}",
                m.block_sectors
            ));
        }
        let mut devs = BTreeMap::new();
        btree::walk(&m.tm, m.details_root, 24, "device details", &mut |k, v| {
            devs.insert(k, Details::decode(v));
        })?;
        m.devs = devs;
        m.validate(ds.nr_blocks)?;
        m.grow_data(data_blocks)?;
        Ok(m)
    }

    fn format(
        mut tm: Tm,
        nr: u64,
        data_blocks: u64,
        block_sectors: u32,
    ) -> Result<Metadata, String> {
        tm.msm = RefCounts::try_new(zero_counts(nr, "metadata device")?, "metadata device")?;
        tm.dsm = RefCounts::try_new(zero_counts(data_blocks, "data device")?, "data device")?;
        tm.msm.set(0, 1);
        let msm = SmDisk::fresh(&mut tm, true, nr)?;
        let dsm = SmDisk::fresh(&mut tm, false, data_blocks)?;
        let mapping_root = btree::empty(&mut tm, 8)?;
        let details_root = btree::empty(&mut tm, 24)?;
        let mut m = Metadata {
            tm,
            time: 0,
            trans_id: 0,
            held_root: 0,
            flags: 0,
            block_sectors,
            mapping_root,
            details_root,
            devs: BTreeMap::new(),
            changed: BTreeMap::new(),
            dsm,
            msm,
            sb_dirty: false,
        };
        m.commit()?;
        Ok(m)
    }

    /// The activation check, what thin_check checks of the structure: the
    /// device details and the top-level mapping tree name the same
    /// devices, every mapping tree keeps within [`btree::MAX_DEPTH`] levels
    /// and holds 8-byte values, and every mapped data block lies inside the
    /// data space map (`data_sm_blocks`, already checked against the data
    /// device) and is counted there as used (a block counted free would be
    /// handed to another device). Node checksums, entry counts and key
    /// order are checked as each node is read ([`Node::from_buf`]).
    ///
    /// One pass, iterative: a subtree node shared by snapshots is checked
    /// once, by the first device that reaches it (marked only when
    /// everything under it is checked, so a loop is still met on its own
    /// path and stopped by the depth bound); a node reached twice inside
    /// one device's tree is damage. Nodes are read past the cache, which
    /// they would only churn. Time and memory follow the metadata space
    /// map's size (4 bytes a block, at most 255 bitmaps' worth).
    fn validate(&self, data_sm_blocks: u64) -> Result<(), String> {
        let mut subs: Vec<(u64, u64)> = Vec::new();
        btree::walk(
            &self.tm,
            self.mapping_root,
            8,
            "top-level mapping",
            &mut |dev, v| subs.push((dev, get64(v, 0))),
        )?;
        if subs.len() != self.devs.len() || subs.iter().any(|(d, _)| !self.devs.contains_key(d)) {
            return Err(format!(
                "thin metadata: the device details name {} devices and the mapping tree {}, not \
                 the same ones: run thin_check / thin_repair",
                self.devs.len(),
                subs.len()
            ));
        }
        // Every node lies inside the metadata space map, which was checked
        // against the device: its size bounds the marks.
        let meta_blocks = self.tm.msm.len();
        // Which device (its index in `subs`, plus 1) checked each node.
        let mut owner = zero_counts(meta_blocks, "metadata device")?;
        // (block, level, its children already pushed)
        let mut stack: Vec<(u64, usize, bool)> = Vec::new();
        for (k, (dev, root)) in subs.into_iter().enumerate() {
            let me = u32::try_from(k + 1).map_err(|_| "too many thin devices".to_string())?;
            stack.push((root, 1, false));
            while let Some((b, depth, expanded)) = stack.pop() {
                if b >= meta_blocks {
                    return Err(format!(
                        "thin device {dev}'s mapping btree (root block {root}) points at block \
                         {b}, past the metadata space map's {meta_blocks} blocks: run thin_check"
                    ));
                }
                if expanded {
                    owner[b as usize] = me;
                    continue;
                }
                match owner[b as usize] {
                    0 => {}
                    o if o == me => {
                        return Err(format!(
                            "thin device {dev}'s mapping btree (root block {root}) reaches block \
                             {b} twice: a damaged node; run thin_check / thin_repair"
                        ))
                    }
                    // Shared with a snapshot, and checked with it.
                    _ => continue,
                }
                if depth > btree::MAX_DEPTH {
                    return Err(format!(
                        "thin device {dev}'s mapping btree (root block {root}) goes deeper than \
                         {} levels at block {b}: a node names itself or an ancestor, a loop; \
                         run thin_check / thin_repair",
                        btree::MAX_DEPTH
                    ));
                }
                let n = self.tm.node_uncached(b)?;
                stack.push((b, depth, true));
                if n.leaf() {
                    self.check_mappings(dev, b, &n, data_sm_blocks)?;
                } else {
                    for i in (0..n.len()).rev() {
                        stack.push((n.val64(i), depth + 1, false));
                    }
                }
            }
        }
        Ok(())
    }

    /// One leaf of device `dev`'s mapping tree, at block `b`.
    fn check_mappings(
        &self,
        dev: u64,
        b: u64,
        n: &Node,
        data_sm_blocks: u64,
    ) -> Result<(), String> {
        if n.value_size() != 8 {
            return Err(format!(
                "thin metadata block {b} is a leaf of device {dev}'s mappings with {}-byte \
                 values, where mappings are 8 bytes: run thin_check / thin_repair",
                n.value_size()
            ));
        }
        for i in 0..n.len() {
            let (vb, db) = (n.key(i), n.val64(i) >> 24);
            if db >= data_sm_blocks {
                return Err(format!(
                    "thin device {dev} maps block {vb} to data block {db}, past the data \
                     device's {data_sm_blocks} blocks (metadata block {b}): run thin_check"
                ));
            }
            if self.tm.dsm.get(db) == 0 {
                return Err(format!(
                    "thin device {dev} maps block {vb} to data block {db}, which the data space \
                     map counts free (metadata block {b}): run thin_check / thin_repair"
                ));
            }
        }
        Ok(())
    }

    /// A bigger data device (a reload): more blocks to hand out.
    pub fn grow_data(&mut self, data_blocks: u64) -> Result<(), String> {
        let have = self.tm.dsm.len();
        if data_blocks < have {
            return Err(format!(
                "the data device holds {data_blocks} blocks, fewer than the {have} the pool's metadata \
                 has: the data device cannot shrink"
            ));
        }
        if data_blocks > have {
            self.tm.dsm.grow(data_blocks)?;
            self.dsm.grow(data_blocks);
            // The new blocks count as changed, so the commit writes them.
            self.tm.dsm.changed.insert(have);
            self.tm.dsm.changed.insert(data_blocks - 1);
        }
        Ok(())
    }

    pub fn needs_check(&self) -> bool {
        self.flags & NEEDS_CHECK != 0
    }

    /// Set `needs_check` in the superblock on disk, as the kernel does when
    /// a pool finds its metadata damaged: the last committed superblock,
    /// flag added, rewritten in place. The running transaction is not
    /// committed (it may hold the damage); the caller stops committing.
    pub fn persist_needs_check(&mut self) -> Result<(), String> {
        self.flags |= NEEDS_CHECK;
        let mut sb = self.tm.read_raw(0)?;
        verify(&sb, 0, SUPERBLOCK_XOR, "superblock")?;
        let flags = get32(&sb[..], 4) | NEEDS_CHECK;
        put32(&mut sb[..], 4, flags);
        seal(&mut sb, 0, SUPERBLOCK_XOR);
        let dev = self.tm.dev().clone();
        dev.write(0, crate::core::WriteBuf::Borrowed(&sb[..]), true)
            .map_err(|e| format!("writing needs_check to the thin superblock: {e}"))?;
        dev.flush()
            .map_err(|e| format!("flushing the thin superblock: {e}"))
    }

    pub fn data_blocks(&self) -> u64 {
        self.tm.dsm.len()
    }

    /// The subtree root of a device's mappings.
    fn subtree(&self, dev: u64) -> Result<u64, String> {
        btree::lookup64(&self.tm, self.mapping_root, dev)?
            .ok_or_else(|| format!("thin device {dev} does not exist in the pool"))
    }

    /// Where virtual block `vb` of device `dev` lives: `(data block, time)`.
    /// A data block past the data device is damage, never an offset: the
    /// caller multiplies it by the block size.
    pub fn lookup(&self, dev: u64, vb: u64) -> Result<Option<(u64, u32)>, String> {
        let sub = self.subtree(dev)?;
        let Some(v) = btree::lookup64(&self.tm, sub, vb)? else {
            return Ok(None);
        };
        let db = v >> 24;
        if db >= self.data_blocks() {
            return Err(format!(
                "thin device {dev} maps block {vb} to data block {db}, past the data device's {} \
                 blocks: the metadata is damaged; run thin_check",
                self.data_blocks()
            ));
        }
        Ok(Some((db, (v & 0xff_ffff) as u32)))
    }

    /// The highest mapped virtual block of a device.
    pub fn highest(&self, dev: u64) -> Result<Option<u64>, String> {
        let root = self.subtree(dev)?;
        let mut b = root;
        for _ in 0..btree::MAX_DEPTH {
            let n = self.tm.node(b)?;
            let Some(k) = n.last_key() else {
                return Ok(None);
            };
            if n.leaf() {
                return Ok(Some(k));
            }
            b = n.val64(n.len() - 1);
        }
        Err(format!(
            "thin device {dev}'s mapping btree (root block {root}) goes deeper than {} levels at \
             block {b}: a loop; run thin_check / thin_repair",
            btree::MAX_DEPTH
        ))
    }

    /// Map `vb` to data block `db` (which holds one reference for it).
    pub fn insert(&mut self, dev: u64, vb: u64, db: u64) -> Result<(), String> {
        let sub = self.subtree_to_change(dev)?;
        let v = (db << 24) | u64::from(self.time & 0xff_ffff);
        let (nsub, added) = btree::insert(&mut self.tm, sub, vb, &v.to_le_bytes(), Vk::Data, true)?;
        self.set_subtree(dev, sub, nsub)?;
        if added {
            self.bump(dev, 1);
        }
        Ok(())
    }

    /// Unmap `vb`; true if it was mapped.
    pub fn remove(&mut self, dev: u64, vb: u64) -> Result<bool, String> {
        let sub = self.subtree_to_change(dev)?;
        let (nsub, old) = btree::remove(&mut self.tm, sub, vb, Vk::Data, 8)?;
        self.set_subtree(dev, sub, nsub)?;
        if old.is_some() {
            self.bump(dev, -1);
        }
        Ok(old.is_some())
    }

    /// The subtree root of `dev`, about to change. While a metadata
    /// snapshot is held the top-level tree is shared, and shadowing it is
    /// what counts each subtree under it as shared; so, as the kernel's
    /// two-level insert does (top level first), its path to `dev` is
    /// shadowed before the subtree is. Shadowed the other way round, the
    /// subtree looked unshared, its data blocks lost the reference the
    /// snapshot's copy holds, and after `release_metadata_snap` a discard
    /// or a new allocation reused blocks the device still mapped.
    fn subtree_to_change(&mut self, dev: u64) -> Result<u64, String> {
        let sub = self.subtree(dev)?;
        if self.held_root != 0 {
            let v = sub.to_le_bytes();
            self.mapping_root =
                btree::insert(&mut self.tm, self.mapping_root, dev, &v, Vk::Subtree, false)?.0;
        }
        Ok(sub)
    }

    fn set_subtree(&mut self, dev: u64, old: u64, new: u64) -> Result<(), String> {
        if old != new {
            self.mapping_root = btree::insert(
                &mut self.tm,
                self.mapping_root,
                dev,
                &new.to_le_bytes(),
                Vk::Subtree,
                false,
            )?
            .0;
        }
        Ok(())
    }

    fn bump(&mut self, dev: u64, by: i64) {
        if let Some(d) = self.devs.get_mut(&dev) {
            d.mapped = d.mapped.saturating_add_signed(by);
            self.changed.insert(dev, true);
        }
    }

    /// A data block free in this and the committed transaction.
    pub fn alloc_data(&mut self) -> Option<u64> {
        self.tm.dsm.alloc()
    }

    /// Whether a mapping of `dev` made at `time` may share its data block.
    /// As in the kernel, a mapping older than the device's last snapshot
    /// may be shared even though the block's count says 1: the count of a
    /// block under a shared btree node rises only when that node is
    /// shadowed. A false "shared" costs one copy, never data.
    pub fn shared(&self, dev: u64, db: u64, time: u32) -> bool {
        let snap = self.devs.get(&dev).map_or(0, |d| d.snap_time);
        time < snap || self.tm.dsm.get(db) > 1
    }

    pub fn create_thin(&mut self, dev: u64) -> Result<(), String> {
        self.check_new(dev)?;
        let sub = btree::empty(&mut self.tm, 8)?;
        self.insert_subtree(dev, sub)?;
        let d = Details {
            creation_time: self.time,
            snap_time: self.time,
            ..Details::default()
        };
        self.devs.insert(dev, d);
        self.changed.insert(dev, true);
        Ok(())
    }

    /// Hang device `dev`'s mapping subtree (root block `sub`) in the
    /// top-level mapping tree.
    fn insert_subtree(&mut self, dev: u64, sub: u64) -> Result<(), String> {
        self.mapping_root = btree::insert(
            &mut self.tm,
            self.mapping_root,
            dev,
            &sub.to_le_bytes(),
            Vk::Subtree,
            false,
        )?
        .0;
        Ok(())
    }

    fn check_new(&self, dev: u64) -> Result<(), String> {
        if dev >= 1 << 24 {
            return Err(format!(
                "thin device id {dev} is too large (ids are below 2^24)"
            ));
        }
        if self.devs.contains_key(&dev) {
            return Err(format!("thin device {dev} already exists in the pool"));
        }
        Ok(())
    }

    /// A snapshot shares the origin's subtree: one reference, whatever its size.
    pub fn create_snap(&mut self, dev: u64, origin: u64) -> Result<(), String> {
        self.check_new(dev)?;
        let od = *self.devs.get(&origin).ok_or_else(|| {
            format!("the snapshot's origin, thin device {origin}, does not exist")
        })?;
        let sub = self.subtree(origin)?;
        self.tm.msm.inc(sub);
        self.insert_subtree(dev, sub)?;
        self.time += 1;
        let t = self.time;
        self.devs.insert(
            dev,
            Details {
                mapped: od.mapped,
                trans_id: self.trans_id,
                creation_time: t,
                snap_time: t,
            },
        );
        if let Some(o) = self.devs.get_mut(&origin) {
            o.snap_time = t;
        }
        self.changed.insert(dev, true);
        self.changed.insert(origin, true);
        Ok(())
    }

    pub fn delete(&mut self, dev: u64) -> Result<(), String> {
        if !self.devs.contains_key(&dev) {
            return Err(format!("thin device {dev} does not exist in the pool"));
        }
        let (root, _) = btree::remove(&mut self.tm, self.mapping_root, dev, Vk::Subtree, 8)?;
        self.mapping_root = root;
        self.devs.remove(&dev);
        self.changed.insert(dev, false);
        Ok(())
    }

    pub fn dirty(&self) -> bool {
        self.sb_dirty || self.tm.has_changes() || !self.changed.is_empty()
    }

    /// Write the transaction (see the module doc for the order).
    pub fn commit(&mut self) -> Result<(), String> {
        let p = self.prepare_commit()?;
        p.write(&**self.tm.dev())?;
        self.finish_commit();
        Ok(())
    }

    /// The first half of a commit, under the metadata lock: the device
    /// details and both space maps go into the transaction, and its
    /// blocks and superblock are gathered. The caller writes them (the
    /// lock may be let go meanwhile, so lookups go on, as long as nothing
    /// changes the metadata), then calls [`Metadata::finish_commit`].
    pub fn prepare_commit(&mut self) -> Result<Pending, String> {
        let changed = std::mem::take(&mut self.changed);
        for (dev, live) in changed {
            if live {
                let v = self.devs[&dev].encode();
                self.details_root =
                    btree::insert(&mut self.tm, self.details_root, dev, &v, Vk::Plain, true)?.0;
            } else {
                self.details_root =
                    btree::remove(&mut self.tm, self.details_root, dev, Vk::Plain, 24)?.0;
            }
        }
        let ds = super::pdata::space_map::store(&mut self.tm, &mut self.dsm)?;
        let ms = super::pdata::space_map::store(&mut self.tm, &mut self.msm)?;
        let sb = self.superblock(&ds, &ms);
        Ok(self.tm.take_pending(sb))
    }

    /// The second half, once the [`Pending`] blocks are durable.
    pub fn finish_commit(&mut self) {
        self.tm.finish();
        self.sb_dirty = false;
    }

    /// Where the metadata lives, for writing a [`Pending`] commit.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.tm.dev().clone()
    }

    /// `reserve_metadata_snap`: a copy of the superblock, committed, that
    /// holds a reference to the mapping and details trees as they are now,
    /// so userspace (thin_dump -m, thin_ls -m) can read a consistent view
    /// of a live pool. Its space map roots are zeroed, as the kernel's.
    pub fn reserve_snap(&mut self) -> Result<(), String> {
        if self.held_root != 0 {
            return Err(
                "reserve_metadata_snap: a metadata snapshot is already held; release it first"
                    .into(),
            );
        }
        self.commit()?;
        let h = self.tm.alloc_meta()?;
        self.tm.msm.inc(self.mapping_root);
        self.tm.msm.inc(self.details_root);
        let mut copy = self.superblock(&SmRoot::default(), &SmRoot::default());
        seal(&mut copy, h, SUPERBLOCK_XOR);
        self.tm.put_raw(h, copy);
        self.held_root = h;
        self.sb_dirty = true;
        self.commit()
    }

    /// `release_metadata_snap`: drop the held copy and what only it kept.
    pub fn release_snap(&mut self) -> Result<(), String> {
        let h = self.held_root;
        if h == 0 {
            return Err("release_metadata_snap: no metadata snapshot is held".into());
        }
        let b = self.tm.read_raw(h)?;
        verify(&b, h, SUPERBLOCK_XOR, "held metadata snapshot")?;
        btree::del(&mut self.tm, get64(&b[..], 320), Vk::Subtree, 8)?;
        btree::del(&mut self.tm, get64(&b[..], 328), Vk::Plain, 24)?;
        self.tm.msm.dec(h);
        self.held_root = 0;
        self.sb_dirty = true;
        self.commit()
    }

    /// `set_transaction_id <cur> <new>`: userspace's own counter (LVM's).
    pub fn set_trans_id(&mut self, cur: u64, new: u64) -> Result<(), String> {
        if self.trans_id != cur {
            return Err(format!(
                "set_transaction_id: the current transaction id is {}, not {cur}",
                self.trans_id
            ));
        }
        self.trans_id = new;
        self.sb_dirty = true;
        Ok(())
    }

    fn superblock(&self, ds: &SmRoot, ms: &SmRoot) -> Block {
        let mut b = super::pdata::block::zeroed();
        put32(&mut b[..], 4, self.flags);
        put64(&mut b[..], 32, MAGIC);
        put32(&mut b[..], 40, VERSION);
        put32(&mut b[..], 44, self.time);
        put64(&mut b[..], 48, self.trans_id);
        put64(&mut b[..], 56, self.held_root);
        ds.encode(&mut b[64..]);
        ms.encode(&mut b[192..]);
        put64(&mut b[..], 320, self.mapping_root);
        put64(&mut b[..], 328, self.details_root);
        put32(&mut b[..], 336, self.block_sectors);
        put32(&mut b[..], 340, 8);
        put64(&mut b[..], 344, self.tm.msm.len());
        seal(&mut b, 0, SUPERBLOCK_XOR);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dev: &Arc<crate::store::MemStore>, budget: &Arc<Budget>) -> Metadata {
        let d: Arc<dyn BlockDevice> = dev.clone();
        Metadata::open(d, 1 << 16, 128, budget.clone()).unwrap()
    }

    /// A small budget bounds the cached nodes after a commit (the pinned
    /// ones of a transaction may pass it until then), every mapping still
    /// reads back, and the charge is gone with the pool.
    #[test]
    fn the_node_cache_stays_in_its_budget_and_returns_its_charge() {
        let dev = Arc::new(crate::store::MemStore::new(8 << 20));
        let budget = Budget::with_batch(16 * 4096, 1, 1);
        let mut m = open(&dev, &budget);
        m.create_thin(0).unwrap();
        for vb in 0..20_000u64 {
            let db = m.alloc_data().unwrap();
            m.insert(0, vb * 3, db).unwrap();
        }
        assert!(m.tm.nodes_held().1 > 16, "a transaction pins its nodes");
        m.commit().unwrap();
        let (cached, pinned) = m.tm.nodes_held();
        assert_eq!(pinned, 0);
        assert!(cached <= 16, "{cached} nodes cached over a 16-node budget");
        assert!(budget.used_exact() <= 16 * 4096);
        for vb in (0..20_000u64).step_by(7) {
            assert!(m.lookup(0, vb * 3).unwrap().is_some(), "block {vb} lost");
            assert!(m.lookup(0, vb * 3 + 1).unwrap().is_none());
        }
        assert!(budget.used_exact() <= 16 * 4096, "lookups evict as they go");
        drop(m);
        assert_eq!(budget.used_exact(), 0, "the pool's charge returns to zero");
        // The same metadata opens again and maps the same blocks.
        let m = open(&dev, &budget);
        assert_eq!(m.devs[&0].mapped, 20_000);
        assert_eq!(m.highest(0).unwrap(), Some(59_997));
        drop(m);
        assert_eq!(budget.used_exact(), 0);
    }

    /// Every data block's count equals the number of distinct leaf nodes
    /// (of every device, and of a held metadata snapshot) that map it:
    /// persistent-data counts a block once per node that points at it.
    fn counts_match(m: &Metadata, devs: &[u64], at: &str) {
        let mut want = std::collections::BTreeMap::<u64, u32>::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut todo: Vec<u64> = devs.iter().map(|&d| m.subtree(d).unwrap()).collect();
        if m.held_root != 0 {
            let b = m.tm.read_raw(m.held_root).unwrap();
            btree::walk(
                &m.tm,
                get64(&b[..], 320),
                8,
                "held mapping tree",
                &mut |_, v| todo.push(get64(v, 0)),
            )
            .unwrap();
        }
        while let Some(b) = todo.pop() {
            if !seen.insert(b) {
                continue;
            }
            let n = m.tm.node(b).unwrap();
            for i in 0..n.len() {
                if n.leaf() {
                    *want.entry(n.val64(i) >> 24).or_default() += 1;
                } else {
                    todo.push(n.val64(i));
                }
            }
        }
        for db in 0..m.tm.dsm.len() {
            let (have, w) = (m.tm.dsm.get(db), want.get(&db).copied().unwrap_or(0));
            assert_eq!(
                have, w,
                "{at}: data block {db} counted {have}, in {w} leaves"
            );
        }
    }

    /// A metadata snapshot reserved and released between a thin snapshot's
    /// writes leaves every shared data block counted for each device that
    /// maps it, so a later discard of one device never frees the other's.
    #[test]
    fn releasing_a_metadata_snapshot_keeps_shared_blocks_counted() {
        let dev = Arc::new(crate::store::MemStore::new(8 << 20));
        let budget = Budget::with_batch(1 << 20, 1, 1);
        let mut m = open(&dev, &budget);
        m.create_thin(0).unwrap();
        for vb in 0..12 {
            let db = m.alloc_data().unwrap();
            m.insert(0, vb, db).unwrap();
        }
        m.commit().unwrap();
        m.create_snap(1, 0).unwrap();
        m.commit().unwrap();
        counts_match(&m, &[0, 1], "after the snapshot");
        for (d, vb) in [(0, 1), (1, 2)] {
            let db = m.alloc_data().unwrap();
            m.insert(d, vb, db).unwrap();
        }
        m.commit().unwrap();
        counts_match(&m, &[0, 1], "after writes to both");
        m.reserve_snap().unwrap();
        counts_match(&m, &[0, 1], "after reserve");
        for vb in [4, 5] {
            let db = m.alloc_data().unwrap();
            m.insert(1, vb, db).unwrap();
        }
        m.commit().unwrap();
        counts_match(&m, &[0, 1], "after writes under the held snapshot");
        m.release_snap().unwrap();
        counts_match(&m, &[0, 1], "after release");
        m.commit().unwrap();
        drop(m);
        let m = open(&dev, &budget);
        counts_match(&m, &[0, 1], "after reopen");
    }
}
