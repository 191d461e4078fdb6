//! The transaction manager: metadata blocks read through a cache, btree
//! nodes shadowed (copied to a fresh block) before their first change in a
//! transaction, and the reference counts of both space maps kept in memory.
//!
//! A block freed in the running transaction is not handed out again until
//! the transaction commits: the last committed superblock may still point
//! at it, and a crash must find it unchanged.
//!
//! Clean nodes live in a [`NodeCache`] under the pool's memory budget;
//! the transaction's own nodes (shadows and new ones) are pinned here
//! until the commit has written them, and charged to the same budget, so
//! the two together stay near the limit and clean nodes make room first.
//! Lookups take `&self`: many readers walk the trees at once while the
//! cache's own lock is held only for a map operation.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::block::{Block, Node, NodeBuf, BLOCK_SIZE};
use super::cache::{BlockMap, NodeCache};
use crate::core::BlockDevice;
use crate::mem::Budget;

const NODE_BYTES: u64 = BLOCK_SIZE as u64;

/// What the values of a btree's leaves refer to, so that sharing a node
/// (shadowing one whose count is above 1) or dropping one adjusts the
/// counts of what it points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vk {
    /// Plain data: device details, space-map entries.
    Plain,
    /// `data block << 24 | time`: a reference to a data block.
    Data,
    /// The root of a mapping subtree (whose leaves are [`Vk::Data`]).
    Subtree,
}

/// Reference counts of one space map: the running transaction's and the
/// last committed one's, with the number of blocks in use and of blocks
/// free in both kept up to date, so a provisioning write and a status
/// line never count the whole device.
pub struct RefCounts {
    pub cur: Vec<u32>,
    pub old: Vec<u32>,
    /// Blocks whose count changed in this transaction.
    pub changed: BTreeSet<u64>,
    hint: u64,
    used: u64,
    free: u64,
}

/// `n` zero counts, for a space map of `n` blocks of `what`. `n` comes
/// from the device's size or from a space map already checked against it,
/// yet a large device still costs 4 bytes a block (twice: see
/// [`RefCounts`]): the memory is asked for, not assumed, so a refusal is
/// an error naming the device rather than an abort of the process.
pub fn zero_counts(n: u64, what: &str) -> Result<Vec<u32>, String> {
    let too_big = || {
        format!(
            "the thin pool's {what} has {n} blocks: their reference counts ({} MiB) do not fit \
             in memory; use a larger data block size or a smaller device",
            n.saturating_mul(4) >> 20
        )
    };
    let len = usize::try_from(n).map_err(|_| too_big())?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| too_big())?;
    v.resize(len, 0);
    Ok(v)
}

impl RefCounts {
    /// Counts of a small map (tests, an empty map before loading).
    pub fn new(cur: Vec<u32>) -> RefCounts {
        RefCounts::with_old(cur.clone(), cur)
    }

    /// As [`RefCounts::new`], with the committed copy's memory asked for
    /// ([`zero_counts`]), for counts sized by a device.
    pub fn try_new(cur: Vec<u32>, what: &str) -> Result<RefCounts, String> {
        let mut old = zero_counts(cur.len() as u64, what)?;
        old.copy_from_slice(&cur);
        Ok(RefCounts::with_old(old, cur))
    }

    fn with_old(old: Vec<u32>, cur: Vec<u32>) -> RefCounts {
        let used = cur.iter().filter(|&&c| c > 0).count() as u64;
        RefCounts {
            old,
            free: cur.len() as u64 - used,
            used,
            cur,
            changed: BTreeSet::new(),
            hint: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.cur.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.cur.is_empty()
    }

    pub fn get(&self, b: u64) -> u32 {
        self.cur.get(b as usize).copied().unwrap_or(0)
    }

    pub fn set(&mut self, b: u64, v: u32) {
        let i = b as usize;
        let Some(&c) = self.cur.get(i) else {
            return;
        };
        if c == v {
            return;
        }
        let was_free = c == 0 && self.old[i] == 0;
        self.cur[i] = v;
        self.changed.insert(b);
        match (c > 0, v > 0) {
            (false, true) => self.used += 1,
            (true, false) => self.used -= 1,
            _ => {}
        }
        // Only a block free in both transactions counts as free.
        let now_free = v == 0 && self.old[i] == 0;
        match (was_free, now_free) {
            (true, false) => self.free -= 1,
            (false, true) => self.free += 1,
            _ => {}
        }
    }

    pub fn inc(&mut self, b: u64) {
        let v = self.get(b).saturating_add(1);
        self.set(b, v);
    }

    pub fn dec(&mut self, b: u64) {
        let v = self.get(b).saturating_sub(1);
        self.set(b, v);
    }

    /// A block free now and in the committed transaction, with count 1.
    pub fn alloc(&mut self) -> Option<u64> {
        let n = self.cur.len();
        if n == 0 || self.free == 0 {
            return None;
        }
        let start = (self.hint as usize) % n;
        let found = (start..n)
            .chain(0..start)
            .find(|&i| self.cur[i] == 0 && self.old[i] == 0)?;
        self.hint = found as u64 + 1;
        self.set(found as u64, 1);
        Some(found as u64)
    }

    /// Blocks in use now.
    pub fn allocated(&self) -> u64 {
        self.used
    }

    /// Blocks that could be allocated in this transaction.
    pub fn free_now(&self) -> u64 {
        self.free
    }

    /// Grow to `n` blocks (a bigger data device).
    /// Grow to `n` blocks (a bigger data device); the memory is asked
    /// for first, as in [`zero_counts`].
    pub fn grow(&mut self, n: u64) -> Result<(), String> {
        let have = self.cur.len() as u64;
        if n > have {
            let more = usize::try_from(n - have).map_err(|_| format!("{n} blocks"))?;
            let refuse = |_| {
                format!(
                    "the thin pool's data device grew to {n} blocks: their reference counts do \
                     not fit in memory; use a larger data block size"
                )
            };
            self.cur.try_reserve_exact(more).map_err(refuse)?;
            self.old.try_reserve_exact(more).map_err(refuse)?;
            self.free += n - have;
            self.cur.resize(have as usize + more, 0);
            self.old.resize(have as usize + more, 0);
        }
        Ok(())
    }

    pub fn commit(&mut self) {
        for &b in &self.changed {
            let i = b as usize;
            let was_free = self.cur[i] == 0 && self.old[i] == 0;
            self.old[i] = self.cur[i];
            if self.cur[i] == 0 && !was_free {
                self.free += 1;
            }
        }
        self.changed.clear();
    }
}

pub struct Tm {
    dev: Arc<dyn BlockDevice>,
    cache: NodeCache,
    /// Nodes written in this transaction (shadows and new nodes), pinned
    /// until the commit writes them.
    dirty: BlockMap<Arc<Node>>,
    /// Sealed non-node blocks of this commit (bitmaps, the index).
    raw: HashMap<u64, Block>,
    pub msm: RefCounts,
    pub dsm: RefCounts,
}

/// What a commit writes: taken under the metadata lock, written without
/// it (lookups go on meanwhile), then [`Tm::finish`] under it again.
pub struct Pending {
    nodes: Vec<(u64, Arc<Node>)>,
    raw: Vec<(u64, Block)>,
    sb: Block,
}

impl Pending {
    /// Write every block, make them durable, then the superblock (FUA),
    /// which switches the pool to the new transaction.
    pub fn write(&self, dev: &dyn BlockDevice) -> Result<(), String> {
        for (b, n) in &self.nodes {
            write_block(dev, *b, &n.encode(*b)[..])?;
        }
        for (b, blk) in &self.raw {
            write_block(dev, *b, &blk[..])?;
        }
        dev.flush()
            .map_err(|e| format!("flushing the thin metadata device: {e}"))?;
        dev.write(0, crate::core::WriteBuf::Borrowed(&self.sb[..]), true)
            .map_err(|e| format!("writing the thin superblock: {e}"))?;
        dev.flush()
            .map_err(|e| format!("flushing the thin superblock: {e}"))
    }
}

fn write_block(dev: &dyn BlockDevice, b: u64, bytes: &[u8]) -> Result<(), String> {
    dev.write(
        b * NODE_BYTES,
        crate::core::WriteBuf::Borrowed(bytes),
        false,
    )
    .map_err(|e| format!("writing thin metadata block {b}: {e}"))
}

impl Tm {
    /// `budget` bounds the cached and pinned nodes together.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        msm: RefCounts,
        dsm: RefCounts,
        budget: Arc<Budget>,
    ) -> Tm {
        Tm {
            dev,
            cache: NodeCache::new(budget),
            dirty: BlockMap::default(),
            raw: HashMap::new(),
            msm,
            dsm,
        }
    }

    pub fn dev(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    pub fn nr_blocks(&self) -> u64 {
        self.dev.size() / NODE_BYTES
    }

    /// The block at `b`, unchecked (a bitmap, an index, a superblock);
    /// `b` is checked against the device first, so a damaged pointer is
    /// an error, not an offset that wraps.
    pub fn read_raw(&self, b: u64) -> Result<Block, String> {
        self.check_block(b)?;
        let mut blk = super::block::zeroed();
        self.dev
            .read(b * NODE_BYTES, &mut blk[..])
            .map_err(|e| format!("reading thin metadata block {b}: {e}"))?;
        Ok(blk)
    }

    fn check_block(&self, b: u64) -> Result<(), String> {
        if b >= self.nr_blocks() {
            return Err(format!(
                "thin metadata points at block {b}, past the metadata device's {} blocks: run thin_check",
                self.nr_blocks()
            ));
        }
        Ok(())
    }

    /// The node at `b` as this transaction sees it, or read and checked
    /// without entering the cache: a walk of the whole metadata (the
    /// activation check) must not push out what lookups use.
    pub fn node_uncached(&self, b: u64) -> Result<Arc<Node>, String> {
        if let Some(n) = self.dirty.get(&b) {
            return Ok(n.clone());
        }
        if let Some(n) = self.cache.get(b) {
            return Ok(n);
        }
        self.check_block(b)?;
        let mut buf = NodeBuf::zeroed();
        self.dev
            .read(b * NODE_BYTES, &mut buf.bytes_mut()[..])
            .map_err(|e| format!("reading thin metadata block {b}: {e}"))?;
        Ok(Arc::new(Node::from_buf(buf, b)?))
    }

    /// The node at `b`: this transaction's, a cached one, or read from the
    /// device straight into a pool buffer and cached.
    pub fn node(&self, b: u64) -> Result<Arc<Node>, String> {
        if let Some(n) = self.dirty.get(&b) {
            return Ok(n.clone());
        }
        if let Some(n) = self.cache.get(b) {
            return Ok(n);
        }
        self.check_block(b)?;
        let mut buf = NodeBuf::zeroed();
        self.dev
            .read(b * NODE_BYTES, &mut buf.bytes_mut()[..])
            .map_err(|e| format!("reading thin metadata block {b}: {e}"))?;
        let n = Arc::new(Node::from_buf(buf, b)?);
        self.cache.insert(b, n.clone());
        Ok(n)
    }

    /// `f` of the node at `b`, borrowed where it lies (this transaction's
    /// or the cache's) rather than cloned out: a lookup's step.
    pub fn with_node<R>(&self, b: u64, mut f: impl FnMut(&Node) -> R) -> Result<R, String> {
        if let Some(n) = self.dirty.get(&b) {
            return Ok(f(n));
        }
        if let Some(r) = self.cache.with(b, &mut f) {
            return Ok(r);
        }
        Ok(f(&*self.node(b)?))
    }

    /// The node at `b`, which must be a shadow of this transaction. A
    /// caller that still holds an `Arc` of it makes this copy it: drop it
    /// first.
    pub fn node_mut(&mut self, b: u64) -> &mut Node {
        let budget = self.cache.budget();
        let n = match self.dirty.entry(b) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                budget.force_charge(NODE_BYTES);
                e.insert(Arc::new(Node::empty(true, 8)))
            }
        };
        Arc::make_mut(n)
    }

    /// Pin `n` as this transaction's node at `b`.
    fn pin(&mut self, b: u64, n: Node) {
        // A cached node of an earlier life of `b` must not come back.
        self.cache.remove(b);
        if self.dirty.insert(b, Arc::new(n)).is_none() {
            self.cache.budget().force_charge(NODE_BYTES);
        }
    }

    pub fn is_shadow(&self, b: u64) -> bool {
        self.dirty.contains_key(&b)
    }

    /// The pinned nodes take more than half the budget: time to commit.
    pub fn pinned_over_budget(&self) -> bool {
        let limit = self.cache.budget().limit().unwrap_or(u64::MAX);
        self.dirty.len() as u64 * NODE_BYTES > limit / 2
    }

    /// Nodes held in memory: cached clean ones and pinned dirty ones.
    pub fn nodes_held(&self) -> (usize, usize) {
        (self.cache.len(), self.dirty.len())
    }

    /// Bytes held as `(cached, pinned, budget)`, for the pool's status.
    pub fn memory(&self) -> (u64, u64, u64) {
        let (cached, pinned) = self.nodes_held();
        let budget = self.cache.budget().limit().unwrap_or(0);
        (
            cached as u64 * NODE_BYTES,
            pinned as u64 * NODE_BYTES,
            budget,
        )
    }

    pub fn alloc_meta(&mut self) -> Result<u64, String> {
        self.msm.alloc().ok_or_else(|| {
            "the thin pool's metadata device is full: give the pool a bigger metadata device".into()
        })
    }

    pub fn new_node(&mut self, n: Node) -> Result<u64, String> {
        let b = self.alloc_meta()?;
        self.pin(b, n);
        Ok(b)
    }

    /// Drop a node this transaction made (its contents moved elsewhere).
    pub fn forget(&mut self, b: u64) {
        if self.dirty.remove(&b).is_some() {
            self.cache.budget().uncharge(NODE_BYTES);
        }
        self.msm.dec(b);
    }

    /// Copy-on-write: the block to change instead of `b`. A node shared by
    /// several parents (count above 1) gives each of its children one more
    /// reference, since both copies now point at them.
    pub fn shadow(&mut self, b: u64, vk: Vk) -> Result<u64, String> {
        if self.dirty.contains_key(&b) {
            return Ok(b);
        }
        let n = self.node(b)?;
        if self.msm.get(b) > 1 {
            self.inc_children(&n, vk);
        }
        self.msm.dec(b);
        let nb = self.alloc_meta()?;
        self.pin(nb, (*n).clone());
        Ok(nb)
    }

    fn inc_children(&mut self, n: &Node, vk: Vk) {
        for i in 0..n.len() {
            if !n.leaf() {
                self.msm.inc(n.val64(i));
            } else {
                self.inc_value(vk, n.val64(i));
            }
        }
    }

    pub fn inc_value(&mut self, vk: Vk, v: u64) {
        match vk {
            Vk::Plain => {}
            Vk::Data => self.dsm.inc(v >> 24),
            Vk::Subtree => self.msm.inc(v),
        }
    }

    /// Put a sealed non-node block into this commit.
    pub fn put_raw(&mut self, b: u64, blk: Block) {
        self.raw.insert(b, blk);
    }

    /// Everything this transaction writes, with its superblock `sb`; the
    /// nodes stay pinned (and readable) until [`Tm::finish`].
    pub fn take_pending(&mut self, sb: Block) -> Pending {
        let mut nodes: Vec<(u64, Arc<Node>)> =
            self.dirty.iter().map(|(b, n)| (*b, n.clone())).collect();
        nodes.sort_unstable_by_key(|(b, _)| *b);
        let mut raw: Vec<(u64, Block)> = self.raw.drain().collect();
        raw.sort_unstable_by_key(|(b, _)| *b);
        Pending { nodes, raw, sb }
    }

    /// After [`Pending::write`]: the written nodes become clean cached
    /// ones, and the counts the committed transaction's.
    pub fn finish(&mut self) {
        let budget = self.cache.budget().clone();
        for (b, n) in self.dirty.drain() {
            budget.uncharge(NODE_BYTES);
            self.cache.insert(b, n);
        }
        self.msm.commit();
        self.dsm.commit();
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty() || !self.msm.changed.is_empty() || !self.dsm.changed.is_empty()
    }
}

impl Drop for Tm {
    fn drop(&mut self) {
        let pinned = self.dirty.len() as u64;
        self.cache.budget().uncharge(pinned * NODE_BYTES);
    }
}
