//! The persistent-data block format shared by every metadata block: 4096
//! bytes, a crc32c over all but the checksum word xored with a salt that
//! says what kind of block it is (so a bitmap read where a btree node was
//! expected fails its check), and the btree node layout.

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

fn crc_table() -> &'static [u32; 256] {
    static T: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    })
}

/// The kernel's `dm_bm_checksum`: crc32c seeded with all ones and not
/// inverted at the end, xored with the block type's salt.
pub fn checksum(data: &[u8], salt: u32) -> u32 {
    let t = crc_table();
    let mut c = !0u32;
    for &b in data {
        c = t[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    c ^ salt
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

/// A btree node, decoded. Values are kept as raw little-endian bytes of
/// `value_size` each; internal nodes hold child block numbers (8 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub leaf: bool,
    pub value_size: usize,
    pub keys: Vec<u64>,
    pub vals: Vec<u8>,
}

impl Node {
    pub fn empty(leaf: bool, value_size: usize) -> Node {
        Node {
            leaf,
            value_size,
            keys: Vec::new(),
            vals: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn max(&self) -> usize {
        max_entries(self.value_size)
    }

    pub fn val(&self, i: usize) -> &[u8] {
        &self.vals[i * self.value_size..(i + 1) * self.value_size]
    }

    pub fn val64(&self, i: usize) -> u64 {
        get64(self.val(i), 0)
    }

    pub fn set_val(&mut self, i: usize, v: &[u8]) {
        let vs = self.value_size;
        self.vals[i * vs..(i + 1) * vs].copy_from_slice(v);
    }

    pub fn insert_at(&mut self, i: usize, key: u64, v: &[u8]) {
        self.keys.insert(i, key);
        let at = i * self.value_size;
        self.vals.splice(at..at, v.iter().copied());
    }

    pub fn remove_at(&mut self, i: usize) {
        self.keys.remove(i);
        let at = i * self.value_size;
        self.vals.drain(at..at + self.value_size);
    }

    /// Move the entries from `i` on into a new node of the same kind.
    pub fn split_off(&mut self, i: usize) -> Node {
        Node {
            leaf: self.leaf,
            value_size: self.value_size,
            keys: self.keys.split_off(i),
            vals: self.vals.split_off(i * self.value_size),
        }
    }

    pub fn append(&mut self, other: &mut Node) {
        self.keys.append(&mut other.keys);
        self.vals.append(&mut other.vals);
    }

    /// Index of the last key `<= key`, if any (the child to descend into,
    /// or the exact entry in a leaf when its key matches).
    pub fn lower_bound(&self, key: u64) -> Option<usize> {
        match self.keys.binary_search(&key) {
            Ok(i) => Some(i),
            Err(0) => None,
            Err(i) => Some(i - 1),
        }
    }

    pub fn decode(b: &[u8; BLOCK_SIZE], loc: u64) -> Result<Node, String> {
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
        let keys: Vec<u64> = (0..n).map(|i| get64(b, NODE_HEADER + 8 * i)).collect();
        if keys.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad("keys out of order"));
        }
        let vo = NODE_HEADER + 8 * max;
        Ok(Node {
            leaf: flags == LEAF_NODE,
            value_size: vs,
            keys,
            vals: b[vo..vo + n * vs].to_vec(),
        })
    }

    pub fn encode(&self, loc: u64) -> Block {
        let mut b = zeroed();
        let max = self.max();
        put32(
            &mut b[..],
            4,
            if self.leaf { LEAF_NODE } else { INTERNAL_NODE },
        );
        put32(&mut b[..], 16, self.keys.len() as u32);
        put32(&mut b[..], 20, max as u32);
        put32(&mut b[..], 24, self.value_size as u32);
        for (i, k) in self.keys.iter().enumerate() {
            put64(&mut b[..], NODE_HEADER + 8 * i, *k);
        }
        let vo = NODE_HEADER + 8 * max;
        b[vo..vo + self.vals.len()].copy_from_slice(&self.vals);
        seal(&mut b, loc, BTREE_XOR);
        b
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
}
