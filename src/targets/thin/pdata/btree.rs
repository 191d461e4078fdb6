//! The persistent-data btree: lookups, ordered walks, and copy-on-write
//! insert and remove. Every changed node is a shadow (see
//! [`Tm::shadow`]), so the committed tree stays readable until the
//! superblock points at the new root. Removal keeps every node but the root
//! at least a third full, as the kernel does and thin_check requires.
//!
//! Nothing here trusts the tree's shape: every descent counts its levels
//! against [`MAX_DEPTH`] (a node that names itself or an ancestor is a
//! loop that would otherwise recurse or spin for ever), walks keep their
//! own stack, and every node's value size is checked against what the
//! tree holds before a value is read or written.

use std::collections::HashSet;
use std::ops::ControlFlow;

use super::block::Node;
use super::tm::{Tm, Vk};

/// Levels a descent may pass through before the tree counts as damaged.
/// Every node but the root of a tree the kernel (or udm) writes is at
/// least a third full: 84 entries for the 8-byte values of internal nodes
/// (`max_entries(8) / 3`). The largest metadata device holds 255 bitmaps
/// of 16320 blocks, under 2^22 blocks, and 84^4 > 2^22, so no real tree
/// has more than 5 levels (a root, at most 4 more). 16 is the kernel's own
/// bound on a btree cursor's depth (`DM_BTREE_CURSOR_MAX_DEPTH`), far
/// above that, and small enough that a loop is found after 16 reads.
pub const MAX_DEPTH: usize = 16;

/// The error of a descent past [`MAX_DEPTH`].
fn too_deep(what: &str, root: u64, at: u64) -> String {
    format!(
        "thin metadata: the {what} btree (root block {root}) goes deeper than {MAX_DEPTH} levels \
         at block {at}: a node names itself or an ancestor, a loop; run thin_check / thin_repair"
    )
}

/// A leaf whose values are not the size this tree holds.
fn check_leaf(n: &Node, b: u64, vs: usize, what: &str) -> Result<(), String> {
    if n.value_size() != vs {
        return Err(format!(
            "thin metadata block {b} is a leaf of the {what} btree with {}-byte values, \
             where that tree holds {vs}-byte values: run thin_check / thin_repair",
            n.value_size()
        ));
    }
    Ok(())
}

/// A new, empty tree; its root.
pub fn empty(tm: &mut Tm, value_size: usize) -> Result<u64, String> {
    tm.new_node(Node::empty(true, value_size))
}

/// The value of `key` in a tree of `vs`-byte values.
pub fn lookup(tm: &Tm, root: u64, key: u64, vs: usize) -> Result<Option<Vec<u8>>, String> {
    let mut b = root;
    for _ in 0..MAX_DEPTH {
        let n = tm.node(b)?;
        if n.leaf() {
            check_leaf(&n, b, vs, "metadata")?;
            return Ok(n.search(key).ok().map(|i| n.val(i).to_vec()));
        }
        match n.lower_bound(key) {
            Some(i) => b = n.val64(i),
            None => return Ok(None),
        }
    }
    Err(too_deep("metadata", root, b))
}

/// A lookup of an 8-byte value: one cached node per level, searched where
/// it lies, no copy and no reference taken.
pub fn lookup64(tm: &Tm, root: u64, key: u64) -> Result<Option<u64>, String> {
    let mut b = root;
    for _ in 0..MAX_DEPTH {
        let step = tm.with_node(b, |n| {
            if n.leaf() {
                if n.value_size() != 8 {
                    return ControlFlow::Break(Err(n.value_size()));
                }
                return ControlFlow::Break(Ok(n.search(key).ok().map(|i| n.val64(i))));
            }
            match n.lower_bound(key) {
                Some(i) => ControlFlow::Continue(n.val64(i)),
                None => ControlFlow::Break(Ok(None)),
            }
        })?;
        match step {
            ControlFlow::Continue(child) => b = child,
            ControlFlow::Break(Ok(found)) => return Ok(found),
            ControlFlow::Break(Err(vs)) => {
                return Err(format!(
                    "thin metadata block {b} is a mapping leaf with {vs}-byte values, where \
                     mappings are 8 bytes: run thin_check / thin_repair"
                ))
            }
        }
    }
    Err(too_deep("mapping", root, b))
}

/// Every entry of a tree of `vs`-byte values (the `what` tree, for
/// errors), in key order. Iterative, at most [`MAX_DEPTH`] levels, and each
/// node at most once: a node reached twice is a loop or a node shared
/// inside one tree, both damage.
pub fn walk(
    tm: &Tm,
    root: u64,
    vs: usize,
    what: &str,
    f: &mut dyn FnMut(u64, &[u8]),
) -> Result<(), String> {
    let mut seen = HashSet::new();
    let mut stack = vec![(root, 1usize)];
    while let Some((b, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(too_deep(what, root, b));
        }
        if !seen.insert(b) {
            return Err(format!(
                "thin metadata: block {b} is reached twice in the {what} btree (root block \
                 {root}): a loop or a damaged node; run thin_check / thin_repair"
            ));
        }
        let n = tm.node(b)?;
        if n.leaf() {
            check_leaf(&n, b, vs, what)?;
            for i in 0..n.len() {
                f(n.key(i), n.val(i));
            }
        } else {
            // Last child first on the stack, so the first comes off first.
            for i in (0..n.len()).rev() {
                stack.push((n.val64(i), depth + 1));
            }
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
    let at = Descent { root, depth: 1 };
    let (nb, split) = insert_in(tm, root, key, val, vk, drop_old, &mut added, at)?;
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

/// Where a recursive change stands: the tree's root and this level, so
/// that a loop ends in an error after [`MAX_DEPTH`] levels.
#[derive(Clone, Copy)]
struct Descent {
    root: u64,
    depth: usize,
}

impl Descent {
    fn check(self, b: u64) -> Result<(), String> {
        if self.depth > MAX_DEPTH {
            return Err(too_deep("metadata", self.root, b));
        }
        Ok(())
    }

    fn down(self) -> Descent {
        Descent {
            depth: self.depth + 1,
            ..self
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn insert_in(
    tm: &mut Tm,
    b: u64,
    key: u64,
    val: &[u8],
    vk: Vk,
    drop_old: bool,
    added: &mut bool,
    at: Descent,
) -> Result<(u64, Split), String> {
    at.check(b)?;
    // The leaf's value size first, before the shadow: a node of another
    // tree must not take a value that is not its size.
    {
        let n = tm.node(b)?;
        if n.leaf() {
            check_leaf(&n, b, val.len(), "metadata")?;
        }
    }
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
    let (c2, split) = insert_in(tm, child, key, val, vk, drop_old, added, at.down())?;
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
        Vk::Subtree => del(tm, super::block::get64(v, 0), Vk::Data, 8),
    }
}

/// Drop one reference to the tree at `root` (of `vs`-byte values); what
/// only it held goes too.
pub fn del(tm: &mut Tm, root: u64, vk: Vk, vs: usize) -> Result<(), String> {
    del_in(tm, root, vk, vs, Descent { root, depth: 1 })
}

fn del_in(tm: &mut Tm, b: u64, vk: Vk, vs: usize, at: Descent) -> Result<(), String> {
    at.check(b)?;
    if tm.msm.get(b) > 1 {
        tm.msm.dec(b);
        return Ok(());
    }
    let n = tm.node(b)?;
    if n.leaf() {
        check_leaf(&n, b, vs, "metadata")?;
    }
    for i in 0..n.len() {
        if n.leaf() {
            drop_value(tm, vk, n.val(i))?;
        } else {
            del_in(tm, n.val64(i), vk, vs, at.down())?;
        }
    }
    tm.forget(b);
    Ok(())
}

/// Remove `key` from a tree of `vs`-byte values; the new root and the
/// removed value (its reference dropped), or the same root and `None` when
/// the key is absent.
pub fn remove(
    tm: &mut Tm,
    root: u64,
    key: u64,
    vk: Vk,
    vs: usize,
) -> Result<(u64, Option<Vec<u8>>), String> {
    // The lookup checks the path's depth and its leaf's value size first.
    let Some(old) = lookup(tm, root, key, vs)? else {
        return Ok((root, None));
    };
    let mut nb = remove_in(tm, root, key, vk, Descent { root, depth: 1 })?;
    // A root left with one child gives way to it.
    for _ in 0..MAX_DEPTH {
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

fn remove_in(tm: &mut Tm, b: u64, key: u64, vk: Vk, at: Descent) -> Result<u64, String> {
    at.check(b)?;
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
    let c2 = remove_in(tm, child_b, key, vk, at.down())?;
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
    // Siblings of one tree have one kind and one layout; anything else
    // would be moved across with the wrong offsets.
    if left.leaf() != right.leaf() || left.value_size() != right.value_size() {
        return Err(format!(
            "thin metadata blocks {pl} and {pr} are siblings in a btree but differ in kind or \
             value size: run thin_check / thin_repair"
        ));
    }
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
        walk(tm, root, 8, "test", &mut |k, x| {
            v.push((k, super::super::block::get64(x, 0)))
        })
        .unwrap();
        v
    }

    /// A node that names itself: every descent, walk and change ends in
    /// an error naming the block, after at most [`MAX_DEPTH`] levels.
    #[test]
    fn a_node_that_names_itself_is_an_error_everywhere() {
        let mut t = tm(64);
        let b = t.new_node(Node::empty(false, 8)).unwrap();
        t.node_mut(b).insert_at(0, 0, &b.to_le_bytes());
        let deep = |e: String| {
            assert!(
                e.contains("deeper than 16") && e.contains(&format!("block {b}")),
                "{e}"
            )
        };
        deep(lookup64(&t, b, 5).unwrap_err());
        deep(lookup(&t, b, 5, 8).unwrap_err());
        deep(insert(&mut t, b, 5, &5u64.to_le_bytes(), Vk::Plain, true).unwrap_err());
        let e = walk(&t, b, 8, "test", &mut |_, _| {}).unwrap_err();
        assert!(
            e.contains("reached twice") && e.contains("test btree"),
            "{e}"
        );
    }

    /// A leaf of another tree's value size is refused before a value of
    /// this tree's size is read from it or written into it.
    #[test]
    fn a_leaf_of_another_value_size_is_refused() {
        let mut t = tm(64);
        let root = empty(&mut t, 16).unwrap();
        let e = insert(&mut t, root, 3, &3u64.to_le_bytes(), Vk::Plain, true).unwrap_err();
        assert!(e.contains("16-byte values"), "{e}");
        let e = lookup64(&t, root, 3).unwrap_err();
        assert!(e.contains("16-byte values"), "{e}");
        let e = remove(&mut t, root, 3, Vk::Plain, 8).unwrap_err();
        assert!(e.contains("16-byte values"), "{e}");
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
            let (r, old) = remove(&mut t, root, k, Vk::Plain, 8).unwrap();
            assert_eq!(old.map(|o| super::super::block::get64(&o, 0)), Some(k + 1));
            root = r;
        }
        let got = all(&t, root);
        assert_eq!(got.len(), 1001);
        assert!(got.iter().all(|&(k, _)| k % 3 == 0));
        assert_eq!(lookup64(&t, root, 77).unwrap(), None);
    }
}
