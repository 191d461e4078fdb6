//! Table-driven Twofish (Schneier et al., 1998) with the key-dependent
//! S-boxes folded into the MDS multiply at key setup, as the spec's "full
//! keying" option describes.
//!
//! Why not the `twofish` crate: it evaluates the S-box chain and the MDS
//! multiply in GF(2^8) for every byte of every round, which makes a
//! twofish volume unusable. With four 256-entry tables per key each round
//! is four lookups per g() (the rates are in docs/BENCHMARKS.md). Like
//! every table-based Twofish
//! (including the kernel's generic one) the lookups are key- and
//! data-dependent; the constant-time `aes` path is unaffected.
//!
//! Checked against the `twofish` crate (random keys of every size) in the
//! unit tests and against libgcrypt in tests/crypt_compat.rs.

use zeroize::Zeroize;

/// The 4-bit tables t0..t3 that build q0 and q1 (spec section 4.3.5).
const Q0_T: [[u8; 16]; 4] = [
    [8, 1, 7, 13, 6, 15, 3, 2, 0, 11, 5, 9, 14, 12, 10, 4],
    [14, 12, 11, 8, 1, 2, 3, 5, 15, 4, 10, 6, 7, 0, 9, 13],
    [11, 10, 5, 14, 6, 13, 9, 0, 12, 8, 15, 3, 2, 4, 7, 1],
    [13, 7, 15, 4, 1, 2, 6, 14, 9, 11, 3, 0, 8, 5, 12, 10],
];
const Q1_T: [[u8; 16]; 4] = [
    [2, 8, 11, 13, 15, 7, 6, 14, 3, 1, 9, 4, 0, 10, 12, 5],
    [1, 14, 2, 11, 4, 12, 3, 7, 6, 13, 10, 5, 15, 9, 0, 8],
    [4, 12, 7, 5, 1, 6, 9, 10, 0, 14, 13, 8, 2, 11, 3, 15],
    [11, 9, 5, 1, 12, 3, 13, 14, 6, 4, 7, 15, 2, 0, 8, 10],
];

fn ror4(x: u8) -> u8 {
    ((x >> 1) | (x << 3)) & 15
}

fn q_perm(t: &[[u8; 16]; 4], x: u8) -> u8 {
    let (a0, b0) = (x >> 4, x & 15);
    let a1 = a0 ^ b0;
    let b1 = a0 ^ ror4(b0) ^ ((a0 << 3) & 15);
    let (a2, b2) = (t[0][a1 as usize], t[1][b1 as usize]);
    let a3 = a2 ^ b2;
    let b3 = a2 ^ ror4(b2) ^ ((a2 << 3) & 15);
    let (a4, b4) = (t[2][a3 as usize], t[3][b3 as usize]);
    (b4 << 4) | a4
}

fn q_tables() -> ([u8; 256], [u8; 256]) {
    let mut q0 = [0u8; 256];
    let mut q1 = [0u8; 256];
    for x in 0..256usize {
        q0[x] = q_perm(&Q0_T, x as u8);
        q1[x] = q_perm(&Q1_T, x as u8);
    }
    (q0, q1)
}

/// Multiply in GF(2^8) modulo `poly` (low 8 bits of the polynomial).
fn gf_mul(mut a: u8, mut b: u8, poly: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        let hi = a & 0x80;
        a <<= 1;
        if hi != 0 {
            a ^= poly;
        }
        b >>= 1;
    }
    r
}

const MDS: [[u8; 4]; 4] = [
    [0x01, 0xef, 0x5b, 0x5b],
    [0x5b, 0xef, 0xef, 0x01],
    [0xef, 0x5b, 0x01, 0xef],
    [0xef, 0x01, 0xef, 0x5b],
];
/// x^8 + x^6 + x^5 + x^3 + 1.
const MDS_POLY: u8 = 0x69;

const RS: [[u8; 8]; 4] = [
    [0x01, 0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e],
    [0xa4, 0x56, 0x82, 0xf3, 0x1e, 0xc6, 0x68, 0xe5],
    [0x02, 0xa1, 0xfc, 0xc1, 0x47, 0xae, 0x3d, 0x19],
    [0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e, 0x03],
];
/// x^8 + x^6 + x^3 + x^2 + 1.
const RS_POLY: u8 = 0x4d;

/// MDS column `j` times byte `y`, as a word.
fn mds_col(j: usize, y: u8) -> u32 {
    let mut w = 0u32;
    for (i, row) in MDS.iter().enumerate() {
        w |= u32::from(gf_mul(row[j], y, MDS_POLY)) << (8 * i);
    }
    w
}

/// The byte-wise S-box chain of h() for byte position `j` with key words
/// `l` (k of them).
fn sbox_chain(q: &([u8; 256], [u8; 256]), j: usize, x: u8, l: &[[u8; 4]]) -> u8 {
    let (q0, q1) = (&q.0, &q.1);
    let k = l.len();
    let mut y = x;
    if k == 4 {
        y = [q1, q0, q0, q1][j][y as usize] ^ l[3][j];
    }
    if k >= 3 {
        y = [q1, q1, q0, q0][j][y as usize] ^ l[2][j];
    }
    let b = [q0, q1, q0, q1][j];
    let a = [q0, q0, q1, q1][j];
    let c = [q1, q0, q1, q0][j];
    c[(a[(b[y as usize] ^ l[1][j]) as usize] ^ l[0][j]) as usize]
}

fn h(q: &([u8; 256], [u8; 256]), x: u32, l: &[[u8; 4]]) -> u32 {
    let b = x.to_le_bytes();
    (0..4).fold(0u32, |acc, j| acc ^ mds_col(j, sbox_chain(q, j, b[j], l)))
}

/// A keyed Twofish (128, 192 or 256-bit key).
pub struct Twofish {
    /// Whitening and round subkeys.
    k: [u32; 40],
    /// Key-dependent S-box composed with the MDS column, per byte position.
    t: [[u32; 256]; 4],
}

impl Drop for Twofish {
    fn drop(&mut self) {
        self.k.zeroize();
        for t in self.t.iter_mut() {
            t.zeroize();
        }
    }
}

impl Twofish {
    /// `None` unless the key is 16, 24 or 32 bytes.
    pub fn new(key: &[u8]) -> Option<Box<Twofish>> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return None;
        }
        let q = q_tables();
        let k = key.len() / 8;
        let mut me: Vec<[u8; 4]> = Vec::with_capacity(k);
        let mut mo: Vec<[u8; 4]> = Vec::with_capacity(k);
        let mut s: Vec<[u8; 4]> = vec![[0u8; 4]; k];
        for i in 0..k {
            let w = |o: usize| [key[o], key[o + 1], key[o + 2], key[o + 3]];
            me.push(w(8 * i));
            mo.push(w(8 * i + 4));
            // S words in reverse order: S_{k-1-i} = RS . key[8i..8i+8].
            let mut v = [0u8; 4];
            for (r, row) in RS.iter().enumerate() {
                v[r] = (0..8).fold(0u8, |acc, c| acc ^ gf_mul(row[c], key[8 * i + c], RS_POLY));
            }
            s[k - 1 - i] = v;
        }
        let mut tf = Box::new(Twofish {
            k: [0; 40],
            t: [[0; 256]; 4],
        });
        const RHO: u32 = 0x0101_0101;
        for i in 0..20u32 {
            let a = h(&q, (2 * i).wrapping_mul(RHO), &me);
            let b = h(&q, (2 * i + 1).wrapping_mul(RHO), &mo).rotate_left(8);
            tf.k[2 * i as usize] = a.wrapping_add(b);
            tf.k[2 * i as usize + 1] = a.wrapping_add(b.wrapping_mul(2)).rotate_left(9);
        }
        for j in 0..4 {
            for x in 0..256usize {
                tf.t[j][x] = mds_col(j, sbox_chain(&q, j, x as u8, &s));
            }
        }
        me.zeroize();
        mo.zeroize();
        s.zeroize();
        Some(tf)
    }

    #[inline(always)]
    fn g(&self, x: u32) -> u32 {
        let b = x.to_le_bytes();
        self.t[0][b[0] as usize]
            ^ self.t[1][b[1] as usize]
            ^ self.t[2][b[2] as usize]
            ^ self.t[3][b[3] as usize]
    }

    fn load(b: &[u8; 16]) -> [u32; 4] {
        let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        [w(0), w(1), w(2), w(3)]
    }

    fn store(r: [u32; 4], b: &mut [u8; 16]) {
        for (i, w) in r.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
    }

    /// Encrypt one block in place.
    pub fn encrypt_block(&self, blk: &mut [u8; 16]) {
        let p = Self::load(blk);
        let k = &self.k;
        let (mut r0, mut r1, mut r2, mut r3) = (p[0] ^ k[0], p[1] ^ k[1], p[2] ^ k[2], p[3] ^ k[3]);
        for r in (0..16).step_by(2) {
            let t0 = self.g(r0);
            let t1 = self.g(r1.rotate_left(8));
            r2 = (r2 ^ t0.wrapping_add(t1).wrapping_add(k[2 * r + 8])).rotate_right(1);
            r3 = r3.rotate_left(1)
                ^ t0.wrapping_add(t1.wrapping_mul(2))
                    .wrapping_add(k[2 * r + 9]);
            let t0 = self.g(r2);
            let t1 = self.g(r3.rotate_left(8));
            r0 = (r0 ^ t0.wrapping_add(t1).wrapping_add(k[2 * r + 10])).rotate_right(1);
            r1 = r1.rotate_left(1)
                ^ t0.wrapping_add(t1.wrapping_mul(2))
                    .wrapping_add(k[2 * r + 11]);
        }
        Self::store([r2 ^ k[4], r3 ^ k[5], r0 ^ k[6], r1 ^ k[7]], blk);
    }

    /// Decrypt one block in place.
    pub fn decrypt_block(&self, blk: &mut [u8; 16]) {
        let c = Self::load(blk);
        let k = &self.k;
        let (mut r2, mut r3, mut r0, mut r1) = (c[0] ^ k[4], c[1] ^ k[5], c[2] ^ k[6], c[3] ^ k[7]);
        for r in (0..16).step_by(2).rev() {
            let t0 = self.g(r2);
            let t1 = self.g(r3.rotate_left(8));
            r0 = r0.rotate_left(1) ^ t0.wrapping_add(t1).wrapping_add(k[2 * r + 10]);
            r1 = (r1
                ^ t0.wrapping_add(t1.wrapping_mul(2))
                    .wrapping_add(k[2 * r + 11]))
            .rotate_right(1);
            let t0 = self.g(r0);
            let t1 = self.g(r1.rotate_left(8));
            r2 = r2.rotate_left(1) ^ t0.wrapping_add(t1).wrapping_add(k[2 * r + 8]);
            r3 = (r3
                ^ t0.wrapping_add(t1.wrapping_mul(2))
                    .wrapping_add(k[2 * r + 9]))
            .rotate_right(1);
        }
        Self::store([r0 ^ k[0], r1 ^ k[1], r2 ^ k[2], r3 ^ k[3]], blk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

    /// Against the `twofish` crate (a different implementation of the same
    /// spec) for every key size and many random keys and blocks.
    #[test]
    fn matches_twofish_crate() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        };
        for klen in [16usize, 24, 32] {
            for _ in 0..20 {
                let key: Vec<u8> = (0..klen).map(|_| next()).collect();
                let ours = Twofish::new(&key).unwrap();
                let theirs = twofish::Twofish::new_from_slice(&key).unwrap();
                for _ in 0..4 {
                    let mut b = [0u8; 16];
                    b.iter_mut().for_each(|v| *v = next());
                    let mut a = Array::from(b);
                    theirs.encrypt_block(&mut a);
                    let mut o = b;
                    ours.encrypt_block(&mut o);
                    assert_eq!(o, a.0, "encrypt, {klen}-byte key");
                    ours.decrypt_block(&mut o);
                    assert_eq!(o, b, "decrypt round trip");
                    theirs.decrypt_block(&mut a);
                    assert_eq!(a.0, b);
                }
            }
        }
        assert!(Twofish::new(&[0u8; 20]).is_none());
    }
}
