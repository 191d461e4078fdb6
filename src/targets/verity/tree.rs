//! The hash tree's shape and its hash, as dm-verity and veritysetup lay
//! it out: the target that checks reads and the `veritysetup` that writes
//! the tree must agree on every offset, so both take them from here.
//!
//! The tree is stored top level first, from `hash_start` (in hash blocks)
//! on the hash device; level 0 holds the digests of the data blocks. Each
//! hash block holds `1 << per_block_bits` digests (the largest power of
//! two that fits); in format 1 each takes an equal slot of the block
//! (zero-padded), in format 0 they are packed.

use sha2::Digest;

/// A digest algorithm a verity tree can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashAlg {
    Sha1,
    Sha256,
    Sha512,
}

impl HashAlg {
    /// The algorithm by its kernel crypto name (`sha256`), case as given
    /// by veritysetup's superblock (lower case).
    pub fn from_name(name: &str) -> Option<HashAlg> {
        match name {
            "sha1" => Some(HashAlg::Sha1),
            "sha256" => Some(HashAlg::Sha256),
            "sha512" => Some(HashAlg::Sha512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha1 => "sha1",
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha512 => "sha512",
        }
    }

    pub fn digest_size(self) -> usize {
        match self {
            HashAlg::Sha1 => 20,
            HashAlg::Sha256 => 32,
            HashAlg::Sha512 => 64,
        }
    }

    /// The digest of one block: format 1 hashes the salt first, format 0
    /// (Chromium OS) after the block. `out` must be `digest_size` long.
    pub fn block_digest(self, version: u32, salt: &[u8], block: &[u8], out: &mut [u8]) {
        fn run<D: Digest>(version: u32, salt: &[u8], block: &[u8], out: &mut [u8]) {
            let mut h = D::new();
            if version >= 1 {
                h.update(salt);
                h.update(block);
            } else {
                h.update(block);
                h.update(salt);
            }
            out.copy_from_slice(&h.finalize());
        }
        match self {
            HashAlg::Sha1 => run::<sha1::Sha1>(version, salt, block, out),
            HashAlg::Sha256 => run::<sha2::Sha256>(version, salt, block, out),
            HashAlg::Sha512 => run::<sha2::Sha512>(version, salt, block, out),
        }
    }
}

/// Where every level of a tree lies. Block numbers are in hash blocks,
/// counted from the start of the hash device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub version: u32,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    pub data_blocks: u64,
    pub digest_size: usize,
    /// log2 of the digests one hash block holds.
    pub per_block_bits: u32,
    /// First hash block of each level, level 0 (the data blocks' digests)
    /// first; the top level is stored first on the device.
    pub level_start: Vec<u64>,
    /// Hash blocks of each level.
    pub level_blocks: Vec<u64>,
    /// One past the last hash block of the tree.
    pub end: u64,
}

impl Geometry {
    /// The tree over `data_blocks` blocks whose top level starts at hash
    /// block `hash_start`. Errors say which value is out of range.
    pub fn new(
        version: u32,
        data_block_size: u32,
        hash_block_size: u32,
        data_blocks: u64,
        hash_start: u64,
        alg: HashAlg,
    ) -> Result<Geometry, String> {
        let digest_size = alg.digest_size();
        if (hash_block_size as usize) < digest_size * 2 {
            return Err(format!(
                "hash block size {hash_block_size} holds fewer than two {} digests",
                alg.name()
            ));
        }
        let per_block_bits = (hash_block_size as usize / digest_size).ilog2();
        let mut levels = 0usize;
        if data_blocks > 0 {
            while (per_block_bits as usize) * levels < 64
                && (data_blocks - 1) >> (per_block_bits as usize * levels) != 0
            {
                levels += 1;
            }
        }
        let mut level_start = vec![0; levels];
        let mut level_blocks = vec![0; levels];
        let mut pos = hash_start;
        for i in (0..levels).rev() {
            let shift = (i as u32 + 1) * per_block_bits;
            let s = if shift >= 64 {
                1
            } else {
                data_blocks.div_ceil(1u64 << shift)
            };
            level_start[i] = pos;
            level_blocks[i] = s;
            pos = pos
                .checked_add(s)
                .filter(|p| p.checked_mul(u64::from(hash_block_size)).is_some())
                .ok_or("the hash tree's end overflows a 64-bit byte offset")?;
        }
        Ok(Geometry {
            version,
            data_block_size,
            hash_block_size,
            data_blocks,
            digest_size,
            per_block_bits,
            level_start,
            level_blocks,
            end: pos,
        })
    }

    pub fn levels(&self) -> usize {
        self.level_start.len()
    }

    /// Hash blocks of the tree (all levels).
    pub fn hash_blocks(&self) -> u64 {
        self.level_blocks.iter().sum()
    }

    /// Bytes between two digests in a hash block.
    pub fn slot(&self) -> usize {
        if self.version == 0 {
            self.digest_size
        } else {
            self.hash_block_size as usize >> self.per_block_bits
        }
    }

    /// The hash block holding the digest of `block` (of the level below)
    /// at `level`, and the digest's byte offset in it.
    pub fn hash_at_level(&self, block: u64, level: usize) -> (u64, usize) {
        let bits = self.per_block_bits as usize;
        let position = block.checked_shr((level * bits) as u32).unwrap_or(0);
        let hb = self.level_start[level] + (position >> bits);
        let idx = (position & ((1 << bits) - 1)) as usize;
        (hb, idx * self.slot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_match_veritysetup_for_the_usual_shapes() {
        // 1 MiB of 4 KiB blocks, sha256, superblock in block 0: veritysetup
        // reports 3 hash blocks (one top block over two level-0 blocks).
        let g = Geometry::new(1, 4096, 4096, 256, 1, HashAlg::Sha256).unwrap();
        assert_eq!(g.per_block_bits, 7);
        assert_eq!(g.level_start, [2, 1]);
        assert_eq!(g.level_blocks, [2, 1]);
        assert_eq!(g.hash_blocks(), 3);
        assert_eq!(g.hash_at_level(200, 0), (3, (200 - 128) * 32));
        assert_eq!(g.hash_at_level(200, 1), (1, 32));
        // sha1, 1 KiB data, 512-byte hash blocks, format 0: 69 hash blocks.
        let g = Geometry::new(0, 1024, 512, 1024, 0, HashAlg::Sha1).unwrap();
        assert_eq!((g.per_block_bits, g.slot()), (4, 20));
        assert_eq!(g.hash_blocks(), 69);
        assert_eq!(g.levels(), 3);
    }

    #[test]
    fn a_single_block_has_no_tree_and_no_block_has_none() {
        let g = Geometry::new(1, 4096, 4096, 1, 0, HashAlg::Sha512).unwrap();
        assert_eq!((g.levels(), g.hash_blocks(), g.end), (0, 0, 0));
        assert_eq!(g.slot(), 64);
        let g = Geometry::new(1, 4096, 4096, 0, 5, HashAlg::Sha256).unwrap();
        assert_eq!((g.levels(), g.end), (0, 5));
    }

    #[test]
    fn huge_trees_are_refused_not_overflowed() {
        assert!(Geometry::new(1, 4096, 512, u64::MAX, u64::MAX - 2, HashAlg::Sha512).is_err());
        let g = Geometry::new(1, 4096, 4096, 1 << 40, 1, HashAlg::Sha256).unwrap();
        assert_eq!(g.levels(), 6);
        assert_eq!((g.level_blocks[5], g.level_blocks[0]), (1, 1 << 33));
        assert!(Geometry::new(1, 512, 32, 8, 0, HashAlg::Sha256).is_err());
    }

    #[test]
    fn salt_goes_first_in_format_1_and_last_in_format_0() {
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        HashAlg::Sha256.block_digest(1, b"s", b"data", &mut a);
        HashAlg::Sha256.block_digest(0, b"s", b"data", &mut b);
        assert_eq!(a, <[u8; 32]>::from(sha2::Sha256::digest(b"sdata")));
        assert_eq!(b, <[u8; 32]>::from(sha2::Sha256::digest(b"datas")));
    }
}
