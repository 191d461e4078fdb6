//! The `tcw` IV (TrueCrypt before 4.1), as dm-crypt computes it. The key
//! ends with an IV seed (the cipher's IV size) and 16 whitening bytes. A
//! 512-byte sector's IV is the seed XOR the little-endian sector number
//! (repeated over a 16-byte IV); after CBC encryption the ciphertext is
//! XORed, every 8 bytes, with a whitening value made from the whitening
//! bytes XOR the sector number, passed through CRC32 four bytes at a time
//! and folded to 8 bytes. A read removes the whitening before decrypting.

use zeroize::Zeroize;

/// The kernel crypto API's `crc32` of 4 bytes: reflected polynomial
/// 0xedb88320, register starting at 0 and not inverted at the end.
fn crc32_raw(bytes: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & 0u32.wrapping_sub(crc & 1));
        }
    }
    crc
}

/// The tcw IV generator of one volume.
pub struct Tcw {
    iv_seed: [u8; 16],
    whitening: [u8; 16],
}

impl Drop for Tcw {
    fn drop(&mut self) {
        self.iv_seed.zeroize();
        self.whitening.zeroize();
    }
}

impl Tcw {
    /// `extra` is the key's tail: IV seed (`iv_size` bytes) then 16
    /// whitening bytes.
    pub fn new(extra: &[u8], iv_size: usize) -> Tcw {
        let mut iv_seed = [0u8; 16];
        iv_seed[..iv_size].copy_from_slice(&extra[..iv_size]);
        let mut whitening = [0u8; 16];
        whitening.copy_from_slice(&extra[iv_size..iv_size + 16]);
        Tcw { iv_seed, whitening }
    }

    /// The IV of IV sector `s` (first `iv_size` bytes).
    pub fn iv(&self, s: u64, iv_size: usize) -> [u8; 16] {
        let le = s.to_le_bytes();
        let mut iv = [0u8; 16];
        for (i, v) in iv[..iv_size].iter_mut().enumerate() {
            *v = self.iv_seed[i] ^ le[i % 8];
        }
        iv
    }

    /// XOR the whitening of IV sector `s` into the 512-byte `sector`
    /// (its own inverse).
    pub fn whiten(&self, sector: &mut [u8], s: u64) {
        let le = s.to_le_bytes();
        let mut buf = [0u8; 16];
        for (i, v) in buf.iter_mut().enumerate() {
            *v = self.whitening[i] ^ le[i % 8];
        }
        for part in buf.chunks_exact_mut(4) {
            let c = crc32_raw(part);
            part.copy_from_slice(&c.to_le_bytes());
        }
        let mut w = [0u8; 8];
        for i in 0..4 {
            w[i] = buf[i] ^ buf[12 + i];
            w[4 + i] = buf[4 + i] ^ buf[8 + i];
        }
        for chunk in sector[..512].chunks_exact_mut(8) {
            chunk.iter_mut().zip(&w).for_each(|(x, y)| *x ^= y);
        }
        buf.zeroize();
        w.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The raw register is the complement of the usual (zlib) CRC-32 run
    /// from an inverted start: check "123456789" against the catalogue
    /// CRC-32 value 0xcbf43926 that way, and against values Python's
    /// zlib.crc32(data, 0xffffffff) ^ 0xffffffff gives.
    #[test]
    fn crc32_matches_the_kernel_register_convention() {
        let usual = |d: &[u8]| {
            // Usual CRC-32 = !raw(!0 ...): emulate with an inverted start.
            let mut crc = !0u32;
            for &b in d {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = (crc >> 1) ^ (0xedb8_8320 & 0u32.wrapping_sub(crc & 1));
                }
            }
            !crc
        };
        assert_eq!(usual(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32_raw(&[0, 0, 0, 0]), 0);
        assert_eq!(crc32_raw(b"abcd"), 0xccc6_120d);
        assert_eq!(crc32_raw(&[1, 2, 3, 4]), 0x9778_24d1);
    }

    #[test]
    fn iv_and_whitening_follow_the_sector() {
        let mut extra = [0u8; 32];
        extra.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let t = Tcw::new(&extra, 16);
        let iv = t.iv(0x0102, 16);
        assert_eq!(iv[0], 0x02);
        assert_eq!(iv[1], 1 ^ 1);
        assert_eq!(iv[8], 8 ^ 0x02);
        let t8 = Tcw::new(&extra[..24], 8);
        assert_eq!(t8.iv(0, 8)[8..], [0u8; 8]);
        let mut d = [0u8; 512];
        t.whiten(&mut d, 3);
        assert_eq!(d[..8], d[504..], "one 8-byte value over the sector");
        assert_ne!(d[..8], [0u8; 8]);
        let mut e = [0u8; 512];
        t.whiten(&mut e, 4);
        assert_ne!(d, e);
        t.whiten(&mut d, 3);
        assert_eq!(d, [0u8; 512]);
    }
}
