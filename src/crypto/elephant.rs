//! BitLocker's Elephant diffuser (`aes-cbc-elephant`), as dm-crypt runs
//! it. The key's second half keys an AES "sector key" cipher Ks; the first
//! half is the data cipher's key. For a sector at byte offset `o` (IV
//! sector times sector size), the 32-byte sector key is
//! `Ks(le128(o)) || Ks(le128(o) with byte 15 = 0x80)`. A write XORs it
//! over every 32 bytes of the plaintext, runs diffuser A then diffuser B
//! over the sector as little-endian 32-bit words, and CBC-encrypts with
//! the `eboiv` IV; a read undoes the three steps in reverse order.
//!
//! Both diffusers add (mod 2^32) to each word d[i] the XOR of two other
//! words, one of them rotated by an amount that depends on i mod 4. A
//! decrypt pass walks i upwards and adds; an encrypt pass walks downwards
//! and subtracts, which undoes it exactly (each step reads only words it
//! does not write). Diffuser A: 5 passes, partners i-2 and i-5, rotations
//! (9, 0, 13, 0). Diffuser B: 3 passes, partners i+2 and i+5, rotations
//! (0, 10, 0, 25). Indexes wrap modulo the word count.

use super::block::{Block, BlockCipher};
use super::spec::Alg;
use super::CryptoError;

/// One diffuser: passes, partner offsets (as +n modular steps) and the
/// left rotation of the second partner by i mod 4.
struct Diffuser {
    passes: usize,
    /// Offsets added to i (mod n) for the two partners.
    p2: isize,
    p3: isize,
    rot: [u32; 4],
}

const A: Diffuser = Diffuser {
    passes: 5,
    p2: -2,
    p3: -5,
    rot: [9, 0, 13, 0],
};

const B: Diffuser = Diffuser {
    passes: 3,
    p2: 2,
    p3: 5,
    rot: [0, 10, 0, 25],
};

impl Diffuser {
    fn term(&self, d: &[u32], i: usize) -> u32 {
        let n = d.len() as isize;
        let at = |off: isize| d[((i as isize + off).rem_euclid(n)) as usize];
        at(self.p2) ^ at(self.p3).rotate_left(self.rot[i % 4])
    }

    /// The direction BitLocker calls decryption (used after CBC decrypt).
    fn decrypt(&self, d: &mut [u32]) {
        for _ in 0..self.passes {
            for i in 0..d.len() {
                let t = self.term(d, i);
                d[i] = d[i].wrapping_add(t);
            }
        }
    }

    fn encrypt(&self, d: &mut [u32]) {
        for _ in 0..self.passes {
            for i in (0..d.len()).rev() {
                let t = self.term(d, i);
                d[i] = d[i].wrapping_sub(t);
            }
        }
    }
}

/// The Elephant sector-key cipher of one volume.
pub struct Elephant {
    ks: BlockCipher,
}

fn to_words(sector: &[u8], w: &mut [u32]) {
    for (x, c) in w.iter_mut().zip(sector.chunks_exact(4)) {
        *x = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

fn from_words(w: &[u32], sector: &mut [u8]) {
    for (x, c) in w.iter().zip(sector.chunks_exact_mut(4)) {
        c.copy_from_slice(&x.to_le_bytes());
    }
}

impl Elephant {
    /// `key` is the second half of the dm-crypt key (AES, at most 256 bits).
    pub fn new(key: &[u8]) -> Result<Elephant, CryptoError> {
        let ks = BlockCipher::new(Alg::Aes, key).map_err(|e| {
            CryptoError::key(format!(
                "elephant: the key's second half is its AES key: {e}"
            ))
        })?;
        Ok(Elephant { ks })
    }

    fn sector_key(&self, offset: u64) -> [u8; 32] {
        let mut es = [0u8; 16];
        es[..8].copy_from_slice(&offset.to_le_bytes());
        let mut b = [Block::from(es), Block::from(es)];
        b[1].0[15] = 0x80;
        self.ks.encrypt_blocks(&mut b);
        let mut k = [0u8; 32];
        k[..16].copy_from_slice(&b[0].0);
        k[16..].copy_from_slice(&b[1].0);
        k
    }

    fn xor_key(&self, sector: &mut [u8], offset: u64) {
        let mut k = self.sector_key(offset);
        for c in sector.chunks_exact_mut(32) {
            c.iter_mut().zip(&k).for_each(|(x, y)| *x ^= y);
        }
        zeroize::Zeroize::zeroize(&mut k);
    }

    /// Before CBC encryption: sector key, diffuser A, diffuser B.
    pub fn encrypt(&self, sector: &mut [u8], offset: u64) {
        self.xor_key(sector, offset);
        let mut w = [0u32; 1024];
        let w = &mut w[..sector.len() / 4];
        to_words(sector, w);
        A.encrypt(w);
        B.encrypt(w);
        from_words(w, sector);
        zeroize::Zeroize::zeroize(w);
    }

    /// After CBC decryption: diffuser B, diffuser A, sector key.
    pub fn decrypt(&self, sector: &mut [u8], offset: u64) {
        let mut w = [0u32; 1024];
        let w = &mut w[..sector.len() / 4];
        to_words(sector, w);
        B.decrypt(w);
        A.decrypt(w);
        from_words(w, sector);
        zeroize::Zeroize::zeroize(w);
        self.xor_key(sector, offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffusers_invert_and_spread() {
        let orig: Vec<u32> = (0..128u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        for d in [&A, &B] {
            let mut w = orig.clone();
            d.encrypt(&mut w);
            assert_ne!(w, orig);
            d.decrypt(&mut w);
            assert_eq!(w, orig);
        }
        // One flipped bit reaches every word after both diffusers.
        let mut a = orig.clone();
        let mut b = orig.clone();
        b[77] ^= 1;
        for w in [&mut a, &mut b] {
            A.encrypt(w);
            B.encrypt(w);
        }
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }

    /// Diffuser A's first decrypt step on word 0 reads words n-2 and n-5
    /// (rotated by 9): the partner layout of the BitLocker paper.
    #[test]
    fn partner_layout() {
        let mut w = vec![0u32; 128];
        w[126] = 0x10;
        w[123] = 1;
        assert_eq!(A.term(&w, 0), 0x10 ^ (1 << 9));
        let mut w = vec![0u32; 128];
        w[3] = 0x10;
        w[6] = 1;
        assert_eq!(B.term(&w, 1), 0x10 ^ (1 << 10));
        assert_eq!(B.term(&w, 0), 0);
    }

    #[test]
    fn sector_round_trip_depends_on_offset() {
        let e = Elephant::new(&[3u8; 16]).unwrap();
        let plain: Vec<u8> = (0..512u32).map(|i| i as u8).collect();
        let mut d = plain.clone();
        e.encrypt(&mut d, 512 * 9);
        let mut f = plain.clone();
        e.encrypt(&mut f, 512 * 10);
        assert_ne!(d, f);
        e.decrypt(&mut d, 512 * 9);
        assert_eq!(d, plain);
        assert!(Elephant::new(&[0u8; 20]).is_err());
    }
}
