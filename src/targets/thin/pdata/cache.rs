//! Clean metadata nodes kept under the pool's memory budget, so a lookup
//! of a mapped block walks nodes in memory instead of reading the metadata
//! device (the kernel keeps them in dm-bufio for the same reason).
//!
//! Eviction is a clock: each hit marks its node, and a node is dropped
//! when the hand passes it unmarked, so a scan (a `thin_dump`-like walk, a
//! commit's space-map work) cannot flush the nodes every lookup uses.
//! Every held node is charged to the [`Budget`] (4 KiB each), together
//! with the transaction's dirty nodes, which the transaction manager pins
//! and charges itself: when the sum passes the limit, clean nodes go
//! first; if that is not enough a new node is simply not kept (lookups
//! stay correct, only slower). The lock is held for a map operation, never
//! across I/O.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use super::block::{Node, BLOCK_SIZE};
use crate::mem::Budget;

const NODE_BYTES: u64 = BLOCK_SIZE as u64;

/// Hashes a block number with one multiplication (Fibonacci hashing):
/// block numbers are not chosen by anyone who could aim at collisions, and
/// a lookup of a mapped block hashes once per tree level, where SipHash
/// cost more than the binary search of the node.
#[derive(Default)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by metadata block number.
pub type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

pub struct NodeCache {
    budget: Arc<Budget>,
    inner: Mutex<Clock>,
}

#[derive(Default)]
struct Clock {
    map: BlockMap<Slot>,
    /// The hand's order (front next); may hold blocks no longer cached.
    ring: VecDeque<u64>,
}

struct Slot {
    node: Arc<Node>,
    hit: bool,
}

impl NodeCache {
    pub fn new(budget: Arc<Budget>) -> NodeCache {
        NodeCache {
            budget,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Clock> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    pub fn get(&self, b: u64) -> Option<Arc<Node>> {
        let mut c = self.lock();
        let s = c.map.get_mut(&b)?;
        s.hit = true;
        Some(s.node.clone())
    }

    /// `f` of the cached node at `b`, if there is one, under the cache's
    /// lock: a lookup's step (a binary search) needs no reference of its
    /// own, so it costs no reference-count traffic.
    pub fn with<R>(&self, b: u64, f: &mut impl FnMut(&Node) -> R) -> Option<R> {
        let mut c = self.lock();
        let s = c.map.get_mut(&b)?;
        s.hit = true;
        Some(f(&s.node))
    }

    /// Keep a clean node (replacing what was cached for `b`), evicting
    /// unmarked ones while the budget is over.
    pub fn insert(&self, b: u64, node: Arc<Node>) {
        let mut c = self.lock();
        if let Some(s) = c.map.get_mut(&b) {
            s.node = node;
            return;
        }
        if !self.make_room(&mut c) {
            return;
        }
        self.budget.force_charge(NODE_BYTES);
        c.map.insert(b, Slot { node, hit: false });
        c.ring.push_back(b);
        if c.ring.len() > 2 * c.map.len() + 64 {
            let Clock { map, ring } = &mut *c;
            ring.retain(|b| map.contains_key(b));
        }
    }

    /// Evict until one more node fits; false if it cannot (the budget is
    /// taken by pinned nodes or is smaller than a node).
    fn make_room(&self, c: &mut Clock) -> bool {
        let Some(limit) = self.budget.limit() else {
            return true;
        };
        // Two turns of the hand clear every mark and evict every node.
        let mut turns = 2 * c.ring.len() + 1;
        while self.budget.used_approx() + NODE_BYTES > limit {
            if turns == 0 {
                return false;
            }
            turns -= 1;
            let Some(b) = c.ring.pop_front() else {
                return false;
            };
            let Some(s) = c.map.get_mut(&b) else {
                continue;
            };
            if s.hit {
                s.hit = false;
                c.ring.push_back(b);
                continue;
            }
            c.map.remove(&b);
            self.budget.uncharge(NODE_BYTES);
        }
        true
    }

    /// Forget `b` (it was freed and is about to hold something else).
    pub fn remove(&self, b: u64) {
        if self.lock().map.remove(&b).is_some() {
            self.budget.uncharge(NODE_BYTES);
        }
    }

    /// Nodes held now.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for NodeCache {
    fn drop(&mut self) {
        let n = self
            .inner
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len();
        self.budget.uncharge(n as u64 * NODE_BYTES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(k: u64) -> Arc<Node> {
        let mut n = Node::empty(true, 8);
        n.insert_at(0, k, &k.to_le_bytes());
        Arc::new(n)
    }

    #[test]
    fn stays_under_its_budget_and_keeps_what_is_used() {
        let budget = Budget::with_batch(8 * NODE_BYTES, 1, 1);
        let c = NodeCache::new(budget.clone());
        for b in 0..8 {
            c.insert(b, node(b));
        }
        assert_eq!(c.len(), 8);
        // Block 3 is in use; twenty more blocks pass through.
        for b in 100..120 {
            assert!(c.get(3).is_some(), "a node hit between inserts stays");
            c.insert(b, node(b));
            assert!(budget.used_exact() <= 8 * NODE_BYTES as i64);
        }
        assert_eq!(c.len(), 8);
        assert!(c.get(0).is_none(), "an unused node was evicted");
        assert_eq!(c.get(119).unwrap().key(0), 119);
        c.remove(119);
        assert!(c.get(119).is_none());
        drop(c);
        assert_eq!(
            budget.used_exact(),
            0,
            "dropping the cache gives it all back"
        );
    }

    #[test]
    fn pinned_bytes_take_the_room_of_clean_nodes() {
        let budget = Budget::with_batch(4 * NODE_BYTES, 1, 1);
        let c = NodeCache::new(budget.clone());
        for b in 0..4 {
            c.insert(b, node(b));
        }
        // A transaction's dirty nodes are charged by their owner.
        budget.force_charge(3 * NODE_BYTES);
        c.insert(9, node(9));
        assert_eq!(c.len(), 1, "clean nodes made room for the pinned ones");
        budget.force_charge(NODE_BYTES);
        c.insert(10, node(10));
        assert!(
            c.is_empty(),
            "nothing is kept while pinned nodes fill the budget"
        );
        budget.uncharge(4 * NODE_BYTES);
        drop(c);
        assert_eq!(budget.used_exact(), 0);
    }
}
