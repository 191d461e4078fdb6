//! dm-verity's forward error correction layout, shared by `veritysetup
//! format` (which writes the parity) and the target (which repairs a
//! block that fails its hash with it).
//!
//! FEC covers `blocks` blocks: the data blocks, then the hash device's
//! blocks from the tree's first block on (the tree, and whatever follows
//! it up to the covered end); blocks past `blocks` count as zeros. Each
//! byte of a block belongs to a different RS(255, rsn) codeword, and a
//! codeword's rsn symbols come from blocks `rounds` apart (block `n + i ·
//! rounds` gives symbol `i` of round `n`), so a burst of bad blocks costs
//! each codeword only one symbol. The parity of round `n`, byte `b` is at
//! `(n · block_size + b) · roots` in the FEC area.

use super::rs::Rs;

/// The largest and smallest number of parity bytes per codeword (the
/// kernel's and veritysetup's limits).
pub const MIN_ROOTS: u32 = 2;
pub const MAX_ROOTS: u32 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub roots: u32,
    pub block_size: u32,
    /// Blocks covered (data, then hash area).
    pub blocks: u64,
    pub rounds: u64,
}

impl Layout {
    pub fn new(roots: u32, block_size: u32, blocks: u64) -> Layout {
        Layout {
            roots,
            block_size,
            blocks,
            rounds: blocks.div_ceil(u64::from(255 - roots)),
        }
    }

    pub fn rsn(&self) -> usize {
        255 - self.roots as usize
    }

    /// Blocks of parity the FEC area takes (veritysetup's "FEC blocks").
    pub fn parity_blocks(&self) -> u64 {
        self.rounds * u64::from(self.roots)
    }

    /// Parity bytes of one round: `roots` for each byte of a block.
    pub fn round_parity_len(&self) -> usize {
        self.block_size as usize * self.roots as usize
    }

    /// The round and symbol index of covered block `block`.
    pub fn place(&self, block: u64) -> (u64, usize) {
        (block % self.rounds, (block / self.rounds) as usize)
    }
}

/// Reads covered block `n` into the buffer; `Ok(false)` when it cannot
/// be read (the repair then treats it as an erasure).
pub type ReadBlock<'a, E> = dyn FnMut(u64, &mut [u8]) -> Result<bool, E> + 'a;

/// The rsn member blocks of round `n`, one after the other (zeros past
/// the covered blocks), and the symbols that could not be read.
fn read_round<E>(
    l: &Layout,
    n: u64,
    read: &mut ReadBlock<'_, E>,
) -> Result<(Vec<u8>, Vec<usize>), E> {
    let bs = l.block_size as usize;
    let mut buf = vec![0u8; l.rsn() * bs];
    let mut bad = Vec::new();
    for (i, b) in buf.chunks_mut(bs).enumerate() {
        let m = n + i as u64 * l.rounds;
        if m < l.blocks && !read(m, b)? {
            bad.push(i);
        }
    }
    Ok((buf, bad))
}

/// The parity of every round, in order, handed to `write` one round at a
/// time (`round_parity_len` bytes each).
pub fn encode<E>(
    l: &Layout,
    read: &mut ReadBlock<'_, E>,
    write: &mut dyn FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let rs = Rs::new(l.roots as usize);
    let (bs, roots, rsn) = (l.block_size as usize, l.roots as usize, l.rsn());
    let mut cw = vec![0u8; rsn];
    let mut out = vec![0u8; l.round_parity_len()];
    for n in 0..l.rounds {
        let (buf, _) = read_round(l, n, read)?;
        for (b, par) in out.chunks_mut(roots).enumerate() {
            for (i, c) in cw.iter_mut().enumerate() {
                *c = buf[i * bs + b];
            }
            rs.encode(&cw, par);
        }
        write(&out)?;
    }
    Ok(())
}

/// Reads round `n`'s parity into the buffer.
pub type ReadParity<'a, E> = dyn FnMut(u64, &mut [u8]) -> Result<(), E> + 'a;

/// How decoding every codeword went, as veritysetup's `verify` reports it.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// All codewords decode; this many symbols were wrong.
    Repairable(u64),
    /// A codeword of this round has more errors than the code corrects.
    Unrepairable(u64),
}

/// Decodes every codeword against the parity (`parity(n, buf)` reads
/// round `n`'s), without writing anything back.
pub fn check<E>(
    l: &Layout,
    read: &mut ReadBlock<'_, E>,
    parity: &mut ReadParity<'_, E>,
) -> Result<Check, E> {
    let rs = Rs::new(l.roots as usize);
    let mut par = vec![0u8; l.round_parity_len()];
    let mut errors = 0u64;
    for n in 0..l.rounds {
        let (buf, _) = read_round(l, n, read)?;
        parity(n, &mut par)?;
        for b in 0..l.block_size as usize {
            let mut cw = codeword(l, &buf, &par, b);
            match rs.decode(&mut cw, &[]) {
                Some(k) => errors += k as u64,
                None => return Ok(Check::Unrepairable(n)),
            }
        }
    }
    Ok(Check::Repairable(errors))
}

/// Byte `b` of each member block, then its parity: one codeword.
fn codeword(l: &Layout, buf: &[u8], par: &[u8], b: usize) -> Vec<u8> {
    let (bs, roots) = (l.block_size as usize, l.roots as usize);
    let mut cw: Vec<u8> = (0..l.rsn()).map(|i| buf[i * bs + b]).collect();
    cw.extend_from_slice(&par[b * roots..(b + 1) * roots]);
    cw
}

/// Covered block `block` as the codewords of its round say it should
/// be, with `erasures` (symbol indexes, i.e. member blocks known bad)
/// besides those that could not be read. `None`: some codeword has more
/// errors than the code can correct. The caller must still check the
/// result against the hash tree.
pub fn repair<E>(
    l: &Layout,
    block: u64,
    read: &mut ReadBlock<'_, E>,
    par: &[u8],
    erasures: &[usize],
) -> Result<Option<Vec<u8>>, E> {
    let rs = Rs::new(l.roots as usize);
    let (n, target) = l.place(block);
    let (buf, mut bad) = read_round(l, n, read)?;
    bad.extend_from_slice(erasures);
    bad.sort_unstable();
    bad.dedup();
    if bad.len() > l.roots as usize {
        return Ok(None);
    }
    let mut out = vec![0u8; l.block_size as usize];
    for (b, o) in out.iter_mut().enumerate() {
        let mut cw = codeword(l, &buf, par, b);
        if rs.decode(&mut cw, &bad).is_none() {
            return Ok(None);
        }
        *o = cw[target];
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(count: u64, bs: usize) -> Vec<Vec<u8>> {
        (0..count)
            .map(|j| {
                (0..bs)
                    .map(|i| (i as u64 * 13 + j * 7 + i as u64 / 5) as u8)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn repairs_a_damaged_block_from_the_parity_it_wrote() {
        let l = Layout::new(2, 512, 300);
        assert_eq!((l.rounds, l.parity_blocks()), (2, 4));
        let data = blocks(300, 512);
        let mut parity = Vec::new();
        encode::<()>(
            &l,
            &mut |m, b| {
                b.copy_from_slice(&data[m as usize]);
                Ok(true)
            },
            &mut |p| {
                parity.extend_from_slice(p);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(parity.len(), 4 * 512);
        let mut bad = data.clone();
        bad[201][7] ^= 0x55;
        bad[201][300] ^= 1;
        let mut read = |m: u64, b: &mut [u8]| -> Result<bool, ()> {
            b.copy_from_slice(&bad[m as usize]);
            Ok(true)
        };
        let (n, _) = l.place(201);
        let par = &parity[n as usize * 1024..][..1024];
        let fixed = repair(&l, 201, &mut read, par, &[]).unwrap().unwrap();
        assert_eq!(fixed, data[201]);
        let mut pr = |n: u64, b: &mut [u8]| -> Result<(), ()> {
            b.copy_from_slice(&parity[n as usize * 1024..][..1024]);
            Ok(())
        };
        assert_eq!(check(&l, &mut read, &mut pr), Ok(Check::Repairable(2)));
        // Two whole blocks of a round wrong are beyond 2 roots without
        // erasures, but within them when both are known bad.
        bad[201].fill(0xee);
        bad[203].fill(0x11);
        let mut read = |m: u64, b: &mut [u8]| -> Result<bool, ()> {
            b.copy_from_slice(&bad[m as usize]);
            Ok(true)
        };
        let guess = repair(&l, 201, &mut read, par, &[]).unwrap();
        assert_ne!(guess.as_ref(), Some(&data[201]));
        let eras = [l.place(201).1, l.place(203).1];
        let fixed = repair(&l, 201, &mut read, par, &eras).unwrap().unwrap();
        assert_eq!(fixed, data[201]);
    }
}
