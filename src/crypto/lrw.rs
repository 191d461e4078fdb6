//! LRW (Liskov-Rivest-Wagner), as the kernel's `lrw` template runs it for
//! dm-crypt's `aes-lrw-plain64` / `-benbi`: the key is the block cipher's
//! key followed by a 16-byte tweak key K2; a sector's IV is the 128-bit
//! big-endian index I of its first block, block j of the sector is
//! `C = E(P ^ T) ^ T` with `T = K2 * (I + j)` in GF(2^128) (the kernel's
//! "bbe" order: the block read as a big-endian integer, bit k the
//! coefficient of x^k, reduced by x^128 + x^7 + x^2 + x + 1).
//!
//! The tweaks of consecutive blocks are found as the kernel does: going
//! from I to I+1 flips the low t+1 bits (t = trailing ones of I), so
//! `T(I+1) = T(I) ^ K2 * (2^(t+1) - 1)`, a table of 128 entries made once
//! per key. One full multiplication per sector remains.

use zeroize::Zeroize;

use super::block::{as_blocks, Block, BlockCipher};
use super::spec::Alg;
use super::CryptoError;

/// Multiply by x in the bbe representation.
#[inline(always)]
fn mul_x(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

/// Full GF(2^128) product, bbe representation.
fn gf_mul(a: u128, b: u128) -> u128 {
    let mut r = 0u128;
    for i in (0..128).rev() {
        r = mul_x(r);
        r ^= a & 0u128.wrapping_sub((b >> i) & 1);
    }
    r
}

/// A keyed LRW transform: the block cipher, K2 and K2's increment table.
pub struct Lrw {
    cipher: BlockCipher,
    k2: u128,
    /// `mulinc[t] = K2 * (2^(t+1) - 1)`.
    mulinc: Box<[u128; 128]>,
}

impl Drop for Lrw {
    fn drop(&mut self) {
        self.k2.zeroize();
        self.mulinc.zeroize();
    }
}

/// Tweaks held at once: one 4096-byte sector.
const TW: usize = 256;

impl Lrw {
    /// `key` is the cipher key followed by the 16-byte tweak key.
    pub fn new(alg: Alg, key: &[u8]) -> Result<Lrw, CryptoError> {
        if key.len() <= 16 {
            return Err(CryptoError::key(format!(
                "an LRW key is the cipher key plus 16 tweak-key bytes; {} bits is too short",
                key.len() * 8
            )));
        }
        let (ck, tk) = key.split_at(key.len() - 16);
        let cipher = BlockCipher::new(alg, ck).map_err(|e| {
            CryptoError::key(format!(
                "LRW key of {} bits, less the 128-bit tweak key: {e}",
                key.len() * 8
            ))
        })?;
        let mut k2b = [0u8; 16];
        k2b.copy_from_slice(tk);
        let k2 = u128::from_be_bytes(k2b);
        k2b.zeroize();
        let mut mulinc = Box::new([0u128; 128]);
        let mut ones = 0u128;
        for (t, m) in mulinc.iter_mut().enumerate() {
            ones |= 1 << t;
            *m = gf_mul(k2, ones);
        }
        Ok(Lrw { cipher, k2, mulinc })
    }

    /// One sector (`data`, whole blocks, at most 4096 bytes) whose first
    /// block has index `iv`.
    pub fn sector(&self, data: &mut [u8], iv: &Block, encrypt: bool) {
        let mut idx = u128::from_be_bytes(iv.0);
        let mut t = gf_mul(self.k2, idx);
        let mut tw = [[0u8; 16]; TW];
        let blocks = as_blocks(data);
        for chunk in blocks.chunks_mut(TW) {
            for w in tw[..chunk.len()].iter_mut() {
                *w = t.to_be_bytes();
                let step = (idx.trailing_ones() as usize).min(127);
                t ^= self.mulinc[step];
                idx = idx.wrapping_add(1);
            }
            let xor = |chunk: &mut [Block], tw: &[[u8; 16]]| {
                for (b, w) in chunk.iter_mut().zip(tw) {
                    b.0.iter_mut().zip(w).for_each(|(x, y)| *x ^= y);
                }
            };
            xor(chunk, &tw[..]);
            if encrypt {
                self.cipher.encrypt_blocks(chunk);
            } else {
                self.cipher.decrypt_blocks(chunk);
            }
            xor(chunk, &tw[..]);
        }
        tw.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// The first LRW-32-AES vector of the IEEE P1619 LRW draft (index 1,
    /// so the tweak is K2 itself: the same bytes in any bit order).
    #[test]
    fn draft_vector_one() {
        let key = h("4562ac25f828176d4c268414b5680185258e2a05e73e9d03ee5a830ccc094c87");
        let l = Lrw::new(Alg::Aes, &key).unwrap();
        let mut d = h("30313233343536373839414243444546");
        let iv = Block::from(1u128.to_be_bytes());
        l.sector(&mut d, &iv, true);
        assert_eq!(hex::encode(&d), "f1b273cd65a3df5fe95d489254634eb8");
        l.sector(&mut d, &iv, false);
        assert_eq!(hex::encode(&d), "30313233343536373839414243444546");
    }

    #[test]
    fn increments_match_full_multiplication() {
        let key: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        let l = Lrw::new(Alg::Aes, &key).unwrap();
        let start = u128::MAX - 5; // crosses the 128-bit wrap and long carries
        let mut d = vec![0u8; 16 * 300];
        l.sector(&mut d, &Block::from(start.to_be_bytes()), true);
        // With zero plaintext, block j is E(T_j) ^ T_j: check it from T_j.
        for (j, b) in d.chunks(16).enumerate() {
            let t = gf_mul(l.k2, start.wrapping_add(j as u128)).to_be_bytes();
            let mut want = [Block::from(t)];
            l.cipher.encrypt_blocks(&mut want);
            want[0].0.iter_mut().zip(&t).for_each(|(x, y)| *x ^= y);
            assert_eq!(b, &want[0].0[..], "block {j}");
        }
        assert_eq!(gf_mul(1, 0x1234), 0x1234);
        assert_eq!(gf_mul(2, 1 << 127), 0x87);
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(Lrw::new(Alg::Aes, &[0u8; 16]).is_err());
        let e = Lrw::new(Alg::Aes, &[0u8; 36]).err().unwrap();
        assert!(e.about_key() && e.to_string().contains("tweak"), "{e}");
    }
}
