//! Verified hash blocks, kept so that a read checks its data block
//! against a cached digest instead of re-reading and re-hashing the path
//! to the root (dm-verity keeps them in dm-bufio for the same reason).
//!
//! Only a block that matched its parent's digest is ever inserted, and a
//! parent is only read through the cache or verified itself, so whatever
//! the cache returns is as good as the root hash. Memory is charged to a
//! [`Budget`]: when the budget refuses, the shard's oldest blocks go; if
//! that is not enough the block is simply not kept (reads stay correct,
//! only slower).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::mem::Budget;

const SHARDS: usize = 16;

pub struct HashCache {
    budget: Arc<Budget>,
    shards: Vec<Mutex<Shard>>,
}

#[derive(Default)]
struct Shard {
    blocks: HashMap<u64, Box<[u8]>>,
    /// Insertion order, for eviction (oldest first).
    order: VecDeque<u64>,
}

impl HashCache {
    pub fn new(budget: Arc<Budget>) -> HashCache {
        HashCache {
            budget,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, block: u64) -> MutexGuard<'_, Shard> {
        self.shards[(block % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Copies `out.len()` bytes at `at` of cached hash block `block` into
    /// `out`; false if the block is not cached.
    pub fn copy_out(&self, block: u64, at: usize, out: &mut [u8]) -> bool {
        let s = self.shard(block);
        match s.blocks.get(&block) {
            Some(b) => {
                out.copy_from_slice(&b[at..at + out.len()]);
                true
            }
            None => false,
        }
    }

    /// Keeps a verified hash block, if the budget allows (evicting this
    /// shard's oldest blocks to make room).
    pub fn insert(&self, block: u64, data: Box<[u8]>) {
        let len = data.len() as u64;
        let mut s = self.shard(block);
        if s.blocks.contains_key(&block) {
            return;
        }
        if self.budget.limit().is_some_and(|l| l < len) {
            return;
        }
        while !self.fits(len) {
            let Some(old) = s.order.pop_front() else {
                return;
            };
            if let Some(b) = s.blocks.remove(&old) {
                self.budget.uncharge(b.len() as u64);
            }
        }
        self.budget.force_charge(len);
        s.blocks.insert(block, data);
        s.order.push_back(block);
    }

    /// Whether `len` more bytes stay within the budget (approximately:
    /// shards racing may overshoot by a block each).
    fn fits(&self, len: u64) -> bool {
        self.budget
            .limit()
            .is_none_or(|l| self.budget.used_approx() + len <= l)
    }

    /// Blocks held now.
    pub fn blocks(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).blocks.len())
            .sum()
    }
}

impl Drop for HashCache {
    fn drop(&mut self) {
        for s in &self.shards {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            for b in s.blocks.values() {
                self.budget.uncharge(b.len() as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_its_budget_and_evicts_the_oldest() {
        let budget = Budget::with_batch(4 * 4096, 1, 1);
        let c = HashCache::new(budget.clone());
        // Blocks 0, 16, 32, ... all land in shard 0.
        for i in 0..8u64 {
            c.insert(i * 16, vec![i as u8; 4096].into_boxed_slice());
        }
        assert_eq!(c.blocks(), 4);
        assert!(budget.used_exact() <= 4 * 4096);
        let mut out = [0u8; 4];
        assert!(!c.copy_out(0, 0, &mut out), "the oldest block was evicted");
        assert!(c.copy_out(7 * 16, 100, &mut out));
        assert_eq!(out, [7; 4]);
        drop(c);
        assert_eq!(
            budget.used_exact(),
            0,
            "dropping the cache gives it all back"
        );
    }

    #[test]
    fn a_block_larger_than_the_budget_is_not_kept() {
        let budget = Budget::with_batch(1000, 1, 1);
        let c = HashCache::new(budget.clone());
        c.insert(1, vec![0; 4096].into_boxed_slice());
        assert_eq!(c.blocks(), 0);
        assert_eq!(budget.used_exact(), 0);
    }
}
