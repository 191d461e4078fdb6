//! The transaction manager: metadata blocks read through a cache, btree
//! nodes shadowed (copied to a fresh block) before their first change in a
//! transaction, and the reference counts of both space maps kept in memory.
//!
//! A block freed in the running transaction is not handed out again until
//! the transaction commits: the last committed superblock may still point
//! at it, and a crash must find it unchanged.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::block::{Block, Node, BLOCK_SIZE};
use crate::core::BlockDevice;

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
/// last committed one's.
pub struct RefCounts {
    pub cur: Vec<u32>,
    pub old: Vec<u32>,
    /// Blocks whose count changed in this transaction.
    pub changed: BTreeSet<u64>,
    hint: u64,
}

impl RefCounts {
    pub fn new(cur: Vec<u32>) -> RefCounts {
        RefCounts {
            old: cur.clone(),
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
        if let Some(c) = self.cur.get_mut(b as usize) {
            if *c != v {
                *c = v;
                self.changed.insert(b);
            }
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
        if n == 0 {
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
        self.cur.iter().filter(|&&c| c > 0).count() as u64
    }

    /// Blocks that could be allocated in this transaction.
    pub fn free_now(&self) -> u64 {
        self.cur
            .iter()
            .zip(&self.old)
            .filter(|(c, o)| **c == 0 && **o == 0)
            .count() as u64
    }

    /// Grow to `n` blocks (a bigger data device).
    pub fn grow(&mut self, n: u64) {
        if n as usize > self.cur.len() {
            self.cur.resize(n as usize, 0);
            self.old.resize(n as usize, 0);
        }
    }

    pub fn commit(&mut self) {
        for &b in &self.changed {
            self.old[b as usize] = self.cur[b as usize];
        }
        self.changed.clear();
    }
}

pub struct Tm {
    dev: Arc<dyn BlockDevice>,
    clean: HashMap<u64, Arc<Node>>,
    /// Nodes written in this transaction (shadows and new nodes).
    dirty: HashMap<u64, Arc<Node>>,
    /// Sealed non-node blocks of this commit (bitmaps, the index).
    raw: HashMap<u64, Block>,
    /// Most clean nodes kept (the device's share of the memory budget).
    cache_cap: usize,
    pub msm: RefCounts,
    pub dsm: RefCounts,
}

impl Tm {
    pub fn new(dev: Arc<dyn BlockDevice>, msm: RefCounts, dsm: RefCounts, cache_cap: usize) -> Tm {
        Tm {
            dev,
            clean: HashMap::new(),
            dirty: HashMap::new(),
            raw: HashMap::new(),
            cache_cap: cache_cap.max(64),
            msm,
            dsm,
        }
    }

    pub fn nr_blocks(&self) -> u64 {
        self.dev.size() / BLOCK_SIZE as u64
    }

    pub fn read_raw(&self, b: u64) -> Result<Block, String> {
        let mut blk = super::block::zeroed();
        self.dev
            .read(b * BLOCK_SIZE as u64, &mut blk[..])
            .map_err(|e| format!("reading thin metadata block {b}: {e}"))?;
        Ok(blk)
    }

    pub fn node(&mut self, b: u64) -> Result<Arc<Node>, String> {
        if let Some(n) = self.dirty.get(&b) {
            return Ok(n.clone());
        }
        if let Some(n) = self.clean.get(&b) {
            return Ok(n.clone());
        }
        if b >= self.nr_blocks() {
            return Err(format!(
                "thin metadata points at block {b}, past the metadata device's {} blocks: run thin_check",
                self.nr_blocks()
            ));
        }
        let n = Arc::new(Node::decode(&*self.read_raw(b)?, b)?);
        if self.clean.len() >= self.cache_cap {
            self.clean.clear();
        }
        self.clean.insert(b, n.clone());
        Ok(n)
    }

    /// The node at `b`, which must be a shadow of this transaction.
    pub fn node_mut(&mut self, b: u64) -> &mut Node {
        let n = self
            .dirty
            .entry(b)
            .or_insert_with(|| Arc::new(Node::empty(true, 8)));
        Arc::make_mut(n)
    }

    pub fn is_shadow(&self, b: u64) -> bool {
        self.dirty.contains_key(&b)
    }

    pub fn alloc_meta(&mut self) -> Result<u64, String> {
        self.msm.alloc().ok_or_else(|| {
            "the thin pool's metadata device is full: give the pool a bigger metadata device".into()
        })
    }

    pub fn new_node(&mut self, n: Node) -> Result<u64, String> {
        let b = self.alloc_meta()?;
        self.dirty.insert(b, Arc::new(n));
        Ok(b)
    }

    /// Drop a node this transaction made (its contents moved elsewhere).
    pub fn forget(&mut self, b: u64) {
        self.dirty.remove(&b);
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
        self.dirty.insert(nb, Arc::new((*n).clone()));
        Ok(nb)
    }

    fn inc_children(&mut self, n: &Node, vk: Vk) {
        for i in 0..n.len() {
            if !n.leaf {
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

    /// Write every block of the transaction and wait for them to be
    /// durable; the superblock goes after this.
    pub fn write_all(&mut self) -> Result<(), String> {
        let mut blocks: Vec<u64> = self.dirty.keys().chain(self.raw.keys()).copied().collect();
        blocks.sort_unstable();
        for b in blocks {
            let enc;
            let bytes: &[u8] = match self.raw.get(&b) {
                Some(r) => &r[..],
                None => {
                    enc = self.dirty[&b].encode(b);
                    &enc[..]
                }
            };
            self.dev
                .write(
                    b * BLOCK_SIZE as u64,
                    crate::core::WriteBuf::Borrowed(bytes),
                    false,
                )
                .map_err(|e| format!("writing thin metadata block {b}: {e}"))?;
        }
        self.dev
            .flush()
            .map_err(|e| format!("flushing the thin metadata device: {e}"))?;
        self.raw.clear();
        for (b, n) in self.dirty.drain() {
            if self.clean.len() < self.cache_cap {
                self.clean.insert(b, n);
            }
        }
        self.msm.commit();
        self.dsm.commit();
        Ok(())
    }

    pub fn write_super(&mut self, blk: &Block) -> Result<(), String> {
        self.clean.remove(&0);
        self.dev
            .write(0, crate::core::WriteBuf::Borrowed(&blk[..]), true)
            .map_err(|e| format!("writing the thin superblock: {e}"))?;
        self.dev
            .flush()
            .map_err(|e| format!("flushing the thin superblock: {e}"))
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty() || !self.msm.changed.is_empty() || !self.dsm.changed.is_empty()
    }
}
