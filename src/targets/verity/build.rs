//! Building a hash tree from data, and comparing one on disk with what it
//! should be: what `veritysetup format` and `verify` do in userspace. The
//! bytes are veritysetup's: each level's digests in their slots, the
//! slots' and the last block's spare bytes zero.
//!
//! Levels are built in memory, one after the other (level 0 is the
//! largest: 1/128 of the data for sha256 and 4 KiB blocks).

use super::tree::{Geometry, HashAlg};

/// Reads block `n` (of the data, or of the level below) into the buffer.
pub type ReadBlock<'a, E> = dyn FnMut(u64, &mut [u8]) -> Result<(), E> + 'a;

/// A tree: its levels (level 0 first, each `level_blocks[i]` hash blocks)
/// and the root digest.
pub struct Tree {
    pub levels: Vec<Vec<u8>>,
    pub root: Vec<u8>,
}

/// Hashes `count` blocks of `size` bytes, read by `read`, into a level of
/// hash blocks as `geo` lays them out.
fn level_over<E>(
    geo: &Geometry,
    alg: HashAlg,
    salt: &[u8],
    count: u64,
    size: usize,
    read: &mut ReadBlock<'_, E>,
) -> Result<Vec<u8>, E> {
    let per = 1u64 << geo.per_block_bits;
    let hbs = geo.hash_block_size as usize;
    let mut out = vec![0u8; count.div_ceil(per) as usize * hbs];
    let mut block = vec![0u8; size];
    let ds = geo.digest_size;
    for j in 0..count {
        read(j, &mut block)?;
        let at = (j / per) as usize * hbs + (j % per) as usize * geo.slot();
        alg.block_digest(geo.version, salt, &block, &mut out[at..at + ds]);
    }
    Ok(out)
}

/// The tree over the data blocks `read(block, buf)` returns.
pub fn build<E>(
    geo: &Geometry,
    alg: HashAlg,
    salt: &[u8],
    read: &mut ReadBlock<'_, E>,
) -> Result<Tree, E> {
    let hbs = geo.hash_block_size as usize;
    let dbs = geo.data_block_size as usize;
    let mut levels: Vec<Vec<u8>> = Vec::with_capacity(geo.levels());
    for i in 0..geo.levels() {
        let level = if i == 0 {
            level_over(geo, alg, salt, geo.data_blocks, dbs, read)?
        } else {
            let below = &levels[i - 1];
            let mut from = |j: u64, b: &mut [u8]| -> Result<(), E> {
                b.copy_from_slice(&below[j as usize * hbs..(j as usize + 1) * hbs]);
                Ok(())
            };
            level_over(geo, alg, salt, geo.level_blocks[i - 1], hbs, &mut from)?
        };
        levels.push(level);
    }
    let mut root = vec![0u8; geo.digest_size];
    match levels.last() {
        Some(top) => alg.block_digest(geo.version, salt, &top[..hbs], &mut root),
        None => {
            let mut block = vec![0u8; dbs];
            read(0, &mut block)?;
            alg.block_digest(geo.version, salt, &block, &mut root);
        }
    }
    Ok(Tree { levels, root })
}

/// Where a tree on disk first differs from the one built from the data,
/// in veritysetup's words and order (level 0 first).
#[derive(Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// The digest of the block at this byte offset (of the data device
    /// for level 0, else of the hash device) is not the one stored.
    Digest(u64),
    /// Spare bytes that should be zero are not, at this hash device offset.
    Spare(u64),
}

/// Compares `level` of `built` with the same level as stored (`disk`):
/// digest slots first, then the spare bytes, block by block.
pub fn compare_level(geo: &Geometry, built: &Tree, level: usize, disk: &[u8]) -> Option<Mismatch> {
    let hbs = geo.hash_block_size as usize;
    let per = 1usize << geo.per_block_bits;
    let ds = geo.digest_size;
    let want = &built.levels[level];
    let count = if level == 0 {
        geo.data_blocks as usize
    } else {
        geo.level_blocks[level - 1] as usize
    };
    let (src_size, src_start) = if level == 0 {
        (u64::from(geo.data_block_size), 0)
    } else {
        (hbs as u64, geo.level_start[level - 1] * hbs as u64)
    };
    let base = geo.level_start[level] * hbs as u64;
    for (b, (w, d)) in want.chunks(hbs).zip(disk.chunks(hbs)).enumerate() {
        let mut end = 0;
        for k in 0..per.min(count - b * per) {
            let at = k * geo.slot();
            if w[at..at + ds] != d[at..at + ds] {
                return Some(Mismatch::Digest(
                    src_start + (b * per + k) as u64 * src_size,
                ));
            }
            if geo.version != 0 && d[at + ds..at + geo.slot()].iter().any(|&x| x != 0) {
                return Some(Mismatch::Spare(base + (b * hbs + at + ds) as u64));
            }
            end = at + geo.slot();
        }
        if d[end..].iter().any(|&x| x != 0) {
            return Some(Mismatch::Spare(base + (b * hbs + end) as u64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(blocks: usize, bs: usize) -> Vec<u8> {
        (0..blocks * bs).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn levels_chain_up_to_the_root() {
        let g = Geometry::new(1, 4096, 4096, 256, 1, HashAlg::Sha256).unwrap();
        let d = data(256, 4096);
        let t = build::<()>(&g, HashAlg::Sha256, b"salt", &mut |j, b| {
            b.copy_from_slice(&d[j as usize * 4096..][..4096]);
            Ok(())
        })
        .unwrap();
        assert_eq!(t.levels[0].len(), 2 * 4096);
        assert_eq!(t.levels[1].len(), 4096);
        let mut want = [0u8; 32];
        HashAlg::Sha256.block_digest(1, b"salt", &d[4096 * 200..][..4096], &mut want);
        assert_eq!(&t.levels[0][4096 + 72 * 32..][..32], &want);
        HashAlg::Sha256.block_digest(1, b"salt", &t.levels[0][4096..8192], &mut want);
        assert_eq!(&t.levels[1][32..64], &want);
        HashAlg::Sha256.block_digest(1, b"salt", &t.levels[1], &mut want);
        assert_eq!(t.root, want);
        assert!(t.levels[1][64..].iter().all(|&x| x == 0));

        assert_eq!(compare_level(&g, &t, 0, &t.levels[0]), None);
        let mut bad = t.levels[0].clone();
        bad[4096 + 5 * 32] ^= 1;
        assert_eq!(
            compare_level(&g, &t, 0, &bad),
            Some(Mismatch::Digest(133 * 4096))
        );
        let mut bad = t.levels[1].clone();
        bad[4000] = 1;
        assert_eq!(
            compare_level(&g, &t, 1, &bad),
            Some(Mismatch::Spare(4096 + 64))
        );
        bad[4000] = 0;
        bad[1] ^= 1;
        assert_eq!(
            compare_level(&g, &t, 1, &bad),
            Some(Mismatch::Digest(2 * 4096))
        );
    }

    #[test]
    fn one_block_is_its_own_root() {
        let g = Geometry::new(1, 4096, 4096, 1, 0, HashAlg::Sha1).unwrap();
        let d = data(1, 4096);
        let t = build::<()>(&g, HashAlg::Sha1, b"", &mut |_, b| {
            b.copy_from_slice(&d);
            Ok(())
        })
        .unwrap();
        let mut want = [0u8; 20];
        HashAlg::Sha1.block_digest(1, b"", &d, &mut want);
        assert_eq!((t.levels.len(), &t.root[..]), (0, &want[..]));
    }
}
