//! The persistent-data block format shared by every metadata block: 4096
//! bytes, a crc32c over all but the checksum word xored with a salt that
//! says what kind of block it is (so a bitmap read where a btree node was
//! expected fails its check), and the btree node layout.

use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::mem::RawBlockPool;

/// Metadata block size: the kernel's block manager fixes it at 4 KiB.
pub const BLOCK_SIZE: usize = 4096;

/// Salts of the per-block-type checksums (persistent-data and
/// dm-thin-metadata constants).
pub const SUPERBLOCK_XOR: u32 = 160_774;
pub const BTREE_XOR: u32 = 121_107;
pub const BITMAP_XOR: u32 = 240_779;
pub const INDEX_XOR: u32 = 160_478;

const NODE_HEADER: usize = 32;
const INTERNAL_NODE: u32 = 1;
const LEAF_NODE: u32 = 2;

/// One block's bytes.
pub type Block = Box<[u8; BLOCK_SIZE]>;

pub fn zeroed() -> Block {
    Box::new([0u8; BLOCK_SIZE])
}

/// The kernel's `dm_bm_checksum`: crc32c seeded with all ones and not
/// inverted at the end, xored with the block type's salt.
/// The `crc32c` crate keeps the register inverted, and uses the CPU's
/// CRC32 instruction: a commit seals every shadowed node.
pub fn checksum(data: &[u8], salt: u32) -> u32 {
    !crc32c::crc32c(data) ^ salt
}

/// Stamp a block's location and checksum, as the kernel's validators do
/// before a block is written. The location word is at byte 8 in every
/// block type.
pub fn seal(b: &mut [u8; BLOCK_SIZE], loc: u64, salt: u32) {
    put64(b, 8, loc);
    let c = checksum(&b[4..], salt);
    put32(b, 0, c);
}

/// Check what [`seal`] wrote; the error names the block and what is wrong.
pub fn verify(b: &[u8; BLOCK_SIZE], loc: u64, salt: u32, what: &str) -> Result<(), String> {
    let want = checksum(&b[4..], salt);
    if get32(b, 0) != want {
        return Err(format!(
            "thin metadata block {loc} ({what}) has a bad checksum: run thin_check / thin_repair"
        ));
    }
    if get64(b, 8) != loc {
        return Err(format!(
            "thin metadata block {loc} ({what}) says it is block {}: run thin_check / thin_repair",
            get64(b, 8)
        ));
    }
    Ok(())
}

/// Little-endian fields; bytes past the end read as zero, never a panic.
pub fn get32(b: &[u8], at: usize) -> u32 {
    let v = b.get(at..at + 4).and_then(|s| s.try_into().ok());
    u32::from_le_bytes(v.unwrap_or([0; 4]))
}
pub fn get64(b: &[u8], at: usize) -> u64 {
    let v = b.get(at..at + 8).and_then(|s| s.try_into().ok());
    u64::from_le_bytes(v.unwrap_or([0; 8]))
}
pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The kernel's `calc_max_entries`: as many key/value pairs as fit, rounded
/// down to a multiple of 3 (so a split and a merge of thirds come out even).
pub fn max_entries(value_size: usize) -> usize {
    let n = (BLOCK_SIZE - NODE_HEADER) / (8 + value_size);
    n / 3 * 3
}

/// The process's pool of 4 KiB metadata buffers (the kernel's dm-bufio
/// takes its buffers from a slab the same way): every node a pool caches
/// or changes lives in one, so the cache costs one O(1) pop per block and
/// never the general allocator. Chunks stay with the pool once grown, as
/// in dmapool; what a pool holds is bounded by the budget its cache is
/// charged to, not here.
fn node_pool() -> &'static RawBlockPool {
    static P: OnceLock<RawBlockPool> = OnceLock::new();
    P.get_or_init(|| match RawBlockPool::new(BLOCK_SIZE, BLOCK_SIZE) {
        Some(p) => p,
        // 4096 bytes aligned to 4096 is always a valid layout.
        None => unreachable!("a 4 KiB block pool layout is valid"),
    })
}

/// One 4 KiB buffer of [`node_pool`], owned; returned to the pool on drop.
pub struct NodeBuf(NonNull<u8>);

// SAFETY: the buffer is owned memory of a pool that lives for the whole
// process; only this value reaches it (like a `Box<[u8; 4096]>`).
unsafe impl Send for NodeBuf {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for NodeBuf {}

impl NodeBuf {
    pub fn zeroed() -> NodeBuf {
        let p = node_pool().alloc();
        // SAFETY: a fresh pool block of BLOCK_SIZE bytes, ours alone.
        unsafe { std::ptr::write_bytes(p.as_ptr(), 0, BLOCK_SIZE) };
        NodeBuf(p)
    }

    pub fn bytes(&self) -> &[u8; BLOCK_SIZE] {
        // SAFETY: the pointer is a live, 4096-byte block of the pool owned
        // by this value, initialised when it was made (zeroed or copied).
        unsafe { &*(self.0.as_ptr() as *const [u8; BLOCK_SIZE]) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8; BLOCK_SIZE] {
        // SAFETY: as in `bytes`; `&mut self` makes the access unique.
        unsafe { &mut *(self.0.as_ptr() as *mut [u8; BLOCK_SIZE]) }
    }
}

impl Clone for NodeBuf {
    fn clone(&self) -> NodeBuf {
        let p = node_pool().alloc();
        // SAFETY: both are BLOCK_SIZE-byte pool blocks; the new one is ours
        // alone, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.0.as_ptr(), p.as_ptr(), BLOCK_SIZE) };
        NodeBuf(p)
    }
}

impl Drop for NodeBuf {
    fn drop(&mut self) {
        // SAFETY: the block came from `node_pool().alloc()` and is freed
        // once, here; nobody uses it afterwards.
        unsafe { node_pool().free(self.0) }
    }
}

/// A btree node kept in its on-disk layout in a pool buffer: a lookup
/// binary-searches the keys where the block was read, a shadow is one
/// 4 KiB copy, and writing it only stamps the checksum. Every method but
/// [`Node::insert_at`] keeps the layout valid; that one needs a free slot.
#[derive(Clone)]
pub struct Node {
    buf: NodeBuf,
}

impl Node {
    pub fn empty(leaf: bool, value_size: usize) -> Node {
        let mut buf = NodeBuf::zeroed();
        let b = buf.bytes_mut();
        put32(b, 4, if leaf { LEAF_NODE } else { INTERNAL_NODE });
        put32(b, 20, max_entries(value_size) as u32);
        put32(b, 24, value_size as u32);
        Node { buf }
    }

    fn b(&self) -> &[u8; BLOCK_SIZE] {
        self.buf.bytes()
    }

    pub fn leaf(&self) -> bool {
        get32(self.b(), 4) == LEAF_NODE
    }

    pub fn value_size(&self) -> usize {
        get32(self.b(), 24) as usize
    }

    pub fn len(&self) -> usize {
        get32(self.b(), 16) as usize
    }

    fn set_len(&mut self, n: usize) {
        put32(self.buf.bytes_mut(), 16, n as u32);
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn max(&self) -> usize {
        get32(self.b(), 20) as usize
    }

    fn vals_at(&self) -> usize {
        NODE_HEADER + 8 * self.max()
    }

    pub fn key(&self, i: usize) -> u64 {
        get64(self.b(), NODE_HEADER + 8 * i)
    }

    pub fn set_key(&mut self, i: usize, k: u64) {
        put64(self.buf.bytes_mut(), NODE_HEADER + 8 * i, k);
    }

    pub fn last_key(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }

    /// Binary search of the keys, as `slice::binary_search`.
    pub fn search(&self, key: u64) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    pub fn val(&self, i: usize) -> &[u8] {
        let vs = self.value_size();
        let at = self.vals_at() + i * vs;
        &self.b()[at..at + vs]
    }

    pub fn val64(&self, i: usize) -> u64 {
        get64(self.val(i), 0)
    }

    /// Overwrite value `i`. The btree checks a leaf's value size against
    /// the value before it gets here; a shorter `v` (a node read from a
    /// damaged image) fills what it has and zeroes the rest, never panics.
    pub fn set_val(&mut self, i: usize, v: &[u8]) {
        let vs = self.value_size();
        let at = self.vals_at() + i * vs;
        fill_val(&mut self.buf.bytes_mut()[at..at + vs], v);
    }

    /// Insert at `i`; the node must have a free slot (`len() < max()`).
    /// As in [`Node::set_val`], `v` is expected to be the node's value size.
    pub fn insert_at(&mut self, i: usize, key: u64, v: &[u8]) {
        let (n, vs, va) = (self.len(), self.value_size(), self.vals_at());
        debug_assert!(n < self.max(), "insert into a full btree node");
        debug_assert_eq!(v.len(), vs, "a value of another size than the node's");
        let b = self.buf.bytes_mut();
        let k0 = NODE_HEADER + 8 * i;
        b.copy_within(k0..NODE_HEADER + 8 * n, k0 + 8);
        put64(b, k0, key);
        let v0 = va + vs * i;
        b.copy_within(v0..va + vs * n, v0 + vs);
        fill_val(&mut b[v0..v0 + vs], v);
        self.set_len(n + 1);
    }

    pub fn remove_at(&mut self, i: usize) {
        let (n, vs, va) = (self.len(), self.value_size(), self.vals_at());
        let b = self.buf.bytes_mut();
        let k0 = NODE_HEADER + 8 * i;
        b.copy_within(k0 + 8..NODE_HEADER + 8 * n, k0);
        b[NODE_HEADER + 8 * (n - 1)..NODE_HEADER + 8 * n].fill(0);
        let v0 = va + vs * i;
        b.copy_within(v0 + vs..va + vs * n, v0);
        b[va + vs * (n - 1)..va + vs * n].fill(0);
        self.set_len(n - 1);
    }

    /// Move the entries from `i` on into a new node of the same kind.
    pub fn split_off(&mut self, i: usize) -> Node {
        let mut right = Node::empty(self.leaf(), self.value_size());
        let (n, vs, va) = (self.len(), self.value_size(), self.vals_at());
        let m = n - i;
        {
            let (src, dst) = (self.buf.bytes(), right.buf.bytes_mut());
            dst[NODE_HEADER..NODE_HEADER + 8 * m]
                .copy_from_slice(&src[NODE_HEADER + 8 * i..NODE_HEADER + 8 * n]);
            dst[va..va + vs * m].copy_from_slice(&src[va + vs * i..va + vs * n]);
        }
        right.set_len(m);
        let b = self.buf.bytes_mut();
        b[NODE_HEADER + 8 * i..NODE_HEADER + 8 * n].fill(0);
        b[va + vs * i..va + vs * n].fill(0);
        self.set_len(i);
        right
    }

    /// Move every entry of `other` (all with larger keys) to the end of
    /// this node; they must fit.
    pub fn append(&mut self, other: &mut Node) {
        let (n, m, vs, va) = (self.len(), other.len(), self.value_size(), self.vals_at());
        debug_assert!(n + m <= self.max(), "btree node overflow on append");
        {
            let (src, dst) = (other.buf.bytes(), self.buf.bytes_mut());
            dst[NODE_HEADER + 8 * n..NODE_HEADER + 8 * (n + m)]
                .copy_from_slice(&src[NODE_HEADER..NODE_HEADER + 8 * m]);
            dst[va + vs * n..va + vs * (n + m)].copy_from_slice(&src[va..va + vs * m]);
        }
        self.set_len(n + m);
        *other = Node::empty(other.leaf(), vs);
    }

    /// Index of the last key `<= key`, if any (the child to descend into,
    /// or the exact entry in a leaf when its key matches).
    pub fn lower_bound(&self, key: u64) -> Option<usize> {
        match self.search(key) {
            Ok(i) => Some(i),
            Err(0) => None,
            Err(i) => Some(i - 1),
        }
    }

    /// A node read from disk into `buf`, checked: checksum, location,
    /// header, key order.
    pub fn from_buf(buf: NodeBuf, loc: u64) -> Result<Node, String> {
        let b = buf.bytes();
        verify(b, loc, BTREE_XOR, "btree node")?;
        let flags = get32(b, 4);
        let n = get32(b, 16) as usize;
        let max = get32(b, 20) as usize;
        let vs = get32(b, 24) as usize;
        let bad = |why: &str| {
            format!("thin metadata block {loc} is a bad btree node ({why}): run thin_check")
        };
        if flags != INTERNAL_NODE && flags != LEAF_NODE {
            return Err(bad("flags"));
        }
        if vs == 0 || vs > 64 || max != max_entries(vs) || n > max {
            return Err(bad("entry counts"));
        }
        if flags == INTERNAL_NODE && vs != 8 {
            return Err(bad("internal value size"));
        }
        // Neither the kernel nor thin_restore writes an internal node
        // without children; a descent into one would read a slot past
        // its entries.
        if flags == INTERNAL_NODE && n == 0 {
            return Err(bad("internal node with no entries"));
        }
        let node = Node { buf };
        if (1..n).any(|i| node.key(i - 1) >= node.key(i)) {
            return Err(bad("keys out of order"));
        }
        Ok(node)
    }

    pub fn decode(b: &[u8; BLOCK_SIZE], loc: u64) -> Result<Node, String> {
        let mut buf = NodeBuf::zeroed();
        buf.bytes_mut().copy_from_slice(b);
        Node::from_buf(buf, loc)
    }

    /// The block to write at `loc`: the node's bytes, stamped and sealed.
    pub fn encode(&self, loc: u64) -> Block {
        let mut b = zeroed();
        b.copy_from_slice(self.b());
        put32(&mut b[..], 28, 0);
        seal(&mut b, loc, BTREE_XOR);
        b
    }
}

/// `v` into the value slot `dst`, zero-filled past `v`'s end.
fn fill_val(dst: &mut [u8], v: &[u8]) {
    let k = dst.len().min(v.len());
    dst[..k].copy_from_slice(&v[..k]);
    dst[k..].fill(0);
}

impl PartialEq for Node {
    fn eq(&self, o: &Node) -> bool {
        let n = self.len();
        self.leaf() == o.leaf()
            && self.value_size() == o.value_size()
            && n == o.len()
            && (0..n).all(|i| self.key(i) == o.key(i) && self.val(i) == o.val(i))
    }
}

impl Eq for Node {}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("leaf", &self.leaf())
            .field("value_size", &self.value_size())
            .field(
                "keys",
                &(0..self.len()).map(|i| self.key(i)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The standard crc32c of "123456789" is 0xe3069283; the kernel's
        // form is its complement.
        assert_eq!(!checksum(b"123456789", 0), 0xe306_9283);
    }

    #[test]
    fn node_round_trips_and_catches_corruption() {
        let mut n = Node::empty(true, 8);
        for k in [3u64, 9, 27] {
            n.insert_at(n.len(), k, &(k * 2).to_le_bytes());
        }
        let mut b = n.encode(42);
        assert_eq!(Node::decode(&b, 42).unwrap(), n);
        assert!(Node::decode(&b, 43).unwrap_err().contains("block 43"));
        b[100] ^= 1;
        assert!(Node::decode(&b, 42).unwrap_err().contains("checksum"));
        assert_eq!(max_entries(8), 252);
        assert_eq!(max_entries(24), 126);
    }

    #[test]
    fn in_place_edits_keep_keys_and_values_together() {
        let mut n = Node::empty(true, 24);
        for k in 0..n.max() as u64 {
            let i = n.search(k * 2).unwrap_err();
            n.insert_at(i, k * 2, &[k as u8; 24]);
        }
        assert_eq!(n.len(), 126);
        n.remove_at(5);
        assert_eq!((n.key(5), n.val(5)), (12, &[6u8; 24][..]));
        let mut r = n.split_off(60);
        assert_eq!((n.len(), r.len(), r.key(0)), (60, 65, 122));
        assert_eq!(r.val(0), &[61u8; 24][..]);
        assert_eq!(n.search(13), Err(6));
        n.append(&mut r);
        assert!(r.is_empty());
        assert_eq!(n.len(), 125);
        assert_eq!(n.last_key(), Some(250));
        assert_eq!(n.lower_bound(251), Some(124));
        assert_eq!(Node::decode(&n.encode(7), 7).unwrap(), n);
    }
}
