//! The persistent-data btree: lookups, ordered walks, and copy-on-write
//! insert and remove. Every changed node is a shadow (see
//! [`Tm::shadow`]), so the committed tree stays readable until the
//! superblock points at the new root. Removal keeps every node but the root
//! at least a third full, as the kernel does and thin_check requires.

use std::ops::ControlFlow;

use super::block::Node;
use super::tm::{Tm, Vk};

/// A new, empty tree; its root.
pub fn empty(tm: &mut Tm, value_size: usize) -> Result<u64, String> {
    tm.new_node(Node::empty(true, value_size))
}

pub fn lookup(tm: &Tm, root: u64, key: u64) -> Result<Option<Vec<u8>>, String> {
    let mut b = root;
    loop {
        let n = tm.node(b)?;
        if n.leaf() {
            return Ok(n.search(key).ok().map(|i| n.val(i).to_vec()));
        }
        match n.lower_bound(key) {
            Some(i) => b = n.val64(i),
            None => return Ok(None),
        }
    }
}

/// A lookup of an 8-byte value: one cached node per level, searched where
/// it lies, no copy and no reference taken.
pub fn lookup64(tm: &Tm, root: u64, key: u64) -> Result<Option<u64>, String> {
    let mut b = root;
    loop {
        let step = tm.with_node(b, |n| {
            if n.leaf() {
                return ControlFlow::Break(n.search(key).ok().map(|i| n.val64(i)));
            }
            match n.lower_bound(key) {
                Some(i) => ControlFlow::Continue(n.val64(i)),
                None => ControlFlow::Break(None),
            }
        })?;
        match step {
            ControlFlow::Continue(child) => b = child,
            ControlFlow::Break(found) => return Ok(found),
        }
    }
}

/// Every entry in key order.
pub fn walk(tm: &Tm, root: u64, f: &mut dyn FnMut(u64, &[u8])) -> Result<(), String> {
    let n = tm.node(root)?;
    for i in 0..n.len() {
        if n.leaf() {
            f(n.key(i), n.val(i));
        } else {
            walk(tm, n.val64(i), f)?;
        }
    }
    Ok(())
}

/// Insert or overwrite `key`; the new root, and whether `key` is new (not
/// an overwrite), so a caller that counts entries needs no lookup first.
/// An overwritten value's reference is dropped when `drop_old` (a subtree
/// root replaced by its own shadow was dropped by the shadowing already).
pub fn insert(
    tm: &mut Tm,
    root: u64,
    key: u64,
    val: &[u8],
    vk: Vk,
    drop_old: bool,
) -> Result<(u64, bool), String> {
    let mut added = false;
    let (nb, split) = insert_in(tm, root, key, val, vk, drop_old, &mut added)?;
    let Some((rk, rb)) = split else {
        return Ok((nb, added));
    };
    let lk = tm.node(nb)?.key(0);
    let mut top = Node::empty(false, 8);
    top.insert_at(0, lk, &nb.to_le_bytes());
    top.insert_at(1, rk, &rb.to_le_bytes());
    Ok((tm.new_node(top)?, added))
}

type Split = Option<(u64, u64)>;

fn insert_in(
    tm: &mut Tm,
    b: u64,
    key: u64,
    val: &[u8],
    vk: Vk,
    drop_old: bool,
    added: &mut bool,
) -> Result<(u64, Split), String> {
    let nb = tm.shadow(b, vk)?;
    let n = tm.node(nb)?;
    if n.leaf() {
        return match n.search(key) {
            Ok(i) => {
                let old = n.val(i).to_vec();
                drop(n);
                if old != val {
                    tm.node_mut(nb).set_val(i, val);
                    if drop_old {
                        drop_value(tm, vk, &old)?;
                    }
                }
                Ok((nb, None))
            }
            Err(i) => {
                drop(n);
                *added = true;
                place(tm, nb, i, key, val)
            }
        };
    }
    let i = n.lower_bound(key).unwrap_or(0);
    let child = n.val64(i);
    drop(n);
    let (c2, split) = insert_in(tm, child, key, val, vk, drop_old, added)?;
    let node = tm.node_mut(nb);
    if node.key(i) > key {
        node.set_key(i, key);
    }
    node.set_val(i, &c2.to_le_bytes());
    match split {
        Some((rk, rb)) => place(tm, nb, i + 1, rk, &rb.to_le_bytes()),
        None => Ok((nb, None)),
    }
}

/// Put an entry at `i` of the shadow `nb`, splitting it first when it is
/// full (a node has no room past its maximum); the new right half, if any.
fn place(tm: &mut Tm, nb: u64, i: usize, key: u64, val: &[u8]) -> Result<(u64, Split), String> {
    let node = tm.node_mut(nb);
    if node.len() < node.max() {
        node.insert_at(i, key, val);
        return Ok((nb, None));
    }
    let half = node.len() / 2;
    let mut right = node.split_off(half);
    if i <= half {
        node.insert_at(i, key, val);
    } else {
        right.insert_at(i - half, key, val);
    }
    let rk = right.key(0);
    let rb = tm.new_node(right)?;
    Ok((nb, Some((rk, rb))))
}

/// Drop the reference a removed or overwritten leaf value held.
pub fn drop_value(tm: &mut Tm, vk: Vk, v: &[u8]) -> Result<(), String> {
    match vk {
        Vk::Plain => Ok(()),
        Vk::Data => {
            tm.dsm.dec(super::block::get64(v, 0) >> 24);
            Ok(())
        }
        Vk::Subtree => del(tm, super::block::get64(v, 0), Vk::Data),
    }
}

/// Drop one reference to the tree at `root`; what only it held goes too.
pub fn del(tm: &mut Tm, root: u64, vk: Vk) -> Result<(), String> {
    if tm.msm.get(root) > 1 {
        tm.msm.dec(root);
        return Ok(());
    }
    let n = tm.node(root)?;
    for i in 0..n.len() {
        if n.leaf() {
            drop_value(tm, vk, n.val(i))?;
        } else {
            del(tm, n.val64(i), vk)?;
        }
    }
    tm.forget(root);
    Ok(())
}

/// Remove `key`; the new root and the removed value (its reference
/// dropped), or the same root and `None` when the key is absent.
pub fn remove(tm: &mut Tm, root: u64, key: u64, vk: Vk) -> Result<(u64, Option<Vec<u8>>), String> {
    let Some(old) = lookup(tm, root, key)? else {
        return Ok((root, None));
    };
    let mut nb = remove_in(tm, root, key, vk)?;
    // A root left with one child gives way to it.
    loop {
        let n = tm.node(nb)?;
        if n.leaf() || n.len() != 1 {
            break;
        }
        let child = n.val64(0);
        tm.forget(nb);
        nb = child;
    }
    drop_value(tm, vk, &old)?;
    Ok((nb, Some(old)))
}

fn remove_in(tm: &mut Tm, b: u64, key: u64, vk: Vk) -> Result<u64, String> {
    let nb = tm.shadow(b, vk)?;
    let n = tm.node(nb)?;
    if n.leaf() {
        if let Ok(i) = n.search(key) {
            drop(n);
            tm.node_mut(nb).remove_at(i);
        }
        return Ok(nb);
    }
    let Some(i) = n.lower_bound(key) else {
        return Ok(nb);
    };
    let (child_b, siblings) = (n.val64(i), n.len());
    drop(n);
    let c2 = remove_in(tm, child_b, key, vk)?;
    tm.node_mut(nb).set_val(i, &c2.to_le_bytes());
    let child = tm.node(c2)?;
    if child.len() < child.max() / 3 && siblings > 1 {
        rebalance(tm, nb, i, vk)?;
    }
    Ok(nb)
}

/// Merge child `i` of `parent` with a neighbour, or share their entries
/// evenly when both do not fit in one node.
fn rebalance(tm: &mut Tm, parent: u64, i: usize, vk: Vk) -> Result<(), String> {
    let p = tm.node(parent)?;
    let l = if i + 1 < p.len() { i } else { i - 1 };
    let (pl, pr) = (p.val64(l), p.val64(l + 1));
    drop(p);
    let lb = tm.shadow(pl, vk)?;
    let rb = tm.shadow(pr, vk)?;
    {
        let pm = tm.node_mut(parent);
        pm.set_val(l, &lb.to_le_bytes());
        pm.set_val(l + 1, &rb.to_le_bytes());
    }
    let mut left = (*tm.node(lb)?).clone();
    let mut right = (*tm.node(rb)?).clone();
    let total = left.len() + right.len();
    if total <= left.max() {
        left.append(&mut right);
        *tm.node_mut(lb) = left;
        tm.forget(rb);
        tm.node_mut(parent).remove_at(l + 1);
        return Ok(());
    }
    // Both nodes are fixed-size blocks: move the difference across.
    let want = total / 2;
    if left.len() < want {
        let tail = right.split_off(want - left.len());
        left.append(&mut right);
        right = tail;
    } else {
        let mut moved = left.split_off(want);
        moved.append(&mut right);
        right = moved;
    }
    let rk = right.key(0);
    *tm.node_mut(lb) = left;
    *tm.node_mut(rb) = right;
    tm.node_mut(parent).set_key(l + 1, rk);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::block::BLOCK_SIZE;
    use super::super::tm::RefCounts;
    use super::*;
    use std::sync::Arc;

    fn tm(blocks: usize) -> Tm {
        let dev = Arc::new(crate::store::MemStore::new((blocks * BLOCK_SIZE) as u64));
        Tm::new(
            dev,
            RefCounts::new(vec![0; blocks]),
            RefCounts::new(vec![0; 64]),
            crate::mem::Budget::unlimited(),
        )
    }

    fn all(tm: &Tm, root: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        walk(tm, root, &mut |k, x| {
            v.push((k, super::super::block::get64(x, 0)))
        })
        .unwrap();
        v
    }

    #[test]
    fn inserts_and_removes_keep_order_and_balance() {
        let mut t = tm(4096);
        let mut root = empty(&mut t, 8).unwrap();
        let keys: Vec<u64> = (0..3000u64).map(|i| (i * 7919) % 3001).collect();
        for &k in &keys {
            let (r, added) = insert(&mut t, root, k, &k.to_le_bytes(), Vk::Plain, true).unwrap();
            assert!(added, "{k} is new");
            root = r;
        }
        // Overwrites: not new.
        for &k in &keys {
            let (r, added) =
                insert(&mut t, root, k, &(k + 1).to_le_bytes(), Vk::Plain, true).unwrap();
            assert!(!added, "{k} was there");
            root = r;
        }
        let got = all(&t, root);
        assert_eq!(got.len(), 3000);
        assert!(got.iter().all(|&(k, v)| v == k + 1));
        assert_eq!(lookup64(&t, root, 77).unwrap(), Some(78));
        for &k in keys.iter().filter(|k| *k % 3 != 0) {
            let (r, old) = remove(&mut t, root, k, Vk::Plain).unwrap();
            assert_eq!(old.map(|o| super::super::block::get64(&o, 0)), Some(k + 1));
            root = r;
        }
        let got = all(&t, root);
        assert_eq!(got.len(), 1001);
        assert!(got.iter().all(|&(k, _)| k % 3 == 0));
        assert_eq!(lookup64(&t, root, 77).unwrap(), None);
    }
}
