//! The `lmk` IV (loop-AES compatibility), as dm-crypt computes it: the IV
//! of a 512-byte sector is the raw MD5 state (no padding, no length) after
//! hashing [the 64-byte seed, v3 only] + plaintext bytes 16..512 + the
//! sector number cropped to 56 bits with loop-AES's marker bits. So the IV
//! depends on the plaintext after the first block: a write computes it
//! from the plaintext and encrypts with it; a read decrypts with a zero IV
//! (only the first block depends on the IV in CBC), computes the IV from
//! the result and XORs it into the first block.
//!
//! Loop-AES v2 is 64 keys (`aes:64-cbc-lmk`, the key cc_sector mod 64);
//! v3 adds a 65th key-sized part whose first 16 bytes are the seed.

use zeroize::Zeroize;

/// MD5's per-step additive constants, floor(|sin(i + 1)| * 2^32).
fn md5_k() -> [u32; 64] {
    let mut k = [0u32; 64];
    for (i, v) in k.iter_mut().enumerate() {
        *v = ((i as f64 + 1.0).sin().abs() * 4_294_967_296.0) as u32;
    }
    k
}

const MD5_R: [u32; 16] = [7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21];

const MD5_INIT: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// MD5's compression function over one 64-byte block (RFC 1321, 3.4).
fn md5_block(state: &mut [u32; 4], k: &[u32; 64], block: &[u8]) {
    let mut m = [0u32; 16];
    for (w, c) in m.iter_mut().zip(block.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    let [mut a, mut b, mut c, mut d] = *state;
    for i in 0..64 {
        let (f, g) = match i / 16 {
            0 => ((b & c) | (!b & d), i),
            1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
            2 => (b ^ c ^ d, (3 * i + 5) % 16),
            _ => (c ^ (b | !d), (7 * i) % 16),
        };
        let rot = MD5_R[(i / 16) * 4 + i % 4];
        let t = a.wrapping_add(f).wrapping_add(k[i]).wrapping_add(m[g]);
        a = d;
        d = c;
        c = b;
        b = b.wrapping_add(t.rotate_left(rot));
    }
    for (s, v) in state.iter_mut().zip([a, b, c, d]) {
        *s = s.wrapping_add(v);
    }
    m.zeroize();
}

/// The lmk IV generator of one volume.
pub struct Lmk {
    /// v3's seed: 16 key bytes, zero-padded to the 64 that are hashed.
    seed: Option<[u8; 64]>,
    k: [u32; 64],
}

impl Drop for Lmk {
    fn drop(&mut self) {
        if let Some(s) = &mut self.seed {
            s.zeroize();
        }
    }
}

impl Lmk {
    /// `seed`: the v3 seed part of the key (its first 16 bytes are used),
    /// or `None` for v2.
    pub fn new(seed: Option<&[u8]>) -> Lmk {
        let seed = seed.map(|s| {
            let mut b = [0u8; 64];
            let n = s.len().min(16);
            b[..n].copy_from_slice(&s[..n]);
            b
        });
        Lmk { seed, k: md5_k() }
    }

    /// The IV (first `iv_size` bytes) of the 512-byte plaintext `sector`
    /// at IV sector `s`.
    pub fn iv(&self, sector: &[u8], s: u64, iv_size: usize) -> [u8; 16] {
        let mut st = MD5_INIT;
        if let Some(seed) = &self.seed {
            md5_block(&mut st, &self.k, seed);
        }
        // Bytes 16..512 and the 16-byte tail make 512 bytes: 8 blocks.
        let mut last = [0u8; 64];
        for blk in sector[16..464].chunks_exact(64) {
            md5_block(&mut st, &self.k, blk);
        }
        last[..48].copy_from_slice(&sector[464..512]);
        last[48..52].copy_from_slice(&(s as u32).to_le_bytes());
        let hi = ((s >> 32) as u32 & 0x00ff_ffff) | 0x8000_0000;
        last[52..56].copy_from_slice(&hi.to_le_bytes());
        last[56..60].copy_from_slice(&4024u32.to_le_bytes());
        md5_block(&mut st, &self.k, &last);
        last.zeroize();
        let mut out = [0u8; 16];
        for (o, w) in out.chunks_exact_mut(4).zip(st) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        out[iv_size..].fill(0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Full MD5 (padding added here) over the compression function: the
    /// RFC 1321 test suite proves the constants and the rounds.
    fn md5(msg: &[u8]) -> String {
        let k = md5_k();
        let mut st = MD5_INIT;
        let mut m = msg.to_vec();
        m.push(0x80);
        while m.len() % 64 != 56 {
            m.push(0);
        }
        m.extend_from_slice(&((msg.len() as u64) * 8).to_le_bytes());
        for b in m.chunks_exact(64) {
            md5_block(&mut st, &k, b);
        }
        st.iter().map(|w| hex::encode(w.to_le_bytes())).collect()
    }

    #[test]
    fn md5_rfc1321_suite() {
        assert_eq!(md5(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            md5(
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "57edf4a22be3c955ac49da2e2107b67a"
        );
    }

    #[test]
    fn iv_depends_on_data_after_block_zero_seed_and_sector() {
        let v2 = Lmk::new(None);
        let v3 = Lmk::new(Some(&[9u8; 32]));
        let mut d = [7u8; 512];
        let a = v2.iv(&d, 5, 16);
        d[0] ^= 1;
        assert_eq!(v2.iv(&d, 5, 16), a, "block 0 is not hashed");
        d[511] ^= 1;
        assert_ne!(v2.iv(&d, 5, 16), a);
        assert_ne!(v2.iv(&d, 6, 16), v2.iv(&d, 5, 16));
        assert_ne!(v3.iv(&d, 5, 16), v2.iv(&d, 5, 16));
        assert_eq!(v2.iv(&d, 5, 8)[8..], [0u8; 8]);
        // The sector number is cropped to 56 bits.
        assert_eq!(v2.iv(&d, 1 << 56, 16), v2.iv(&d, 0, 16));
    }
}
