//! TrueCrypt's legacy CBC data modes (volumes made before TrueCrypt 4.1,
//! and its blowfish ones), which the kernel's dm-crypt cannot map: the
//! little-endian blowfish TrueCrypt used (cryptsetup's `blowfish_le`) and
//! the CBC cascades. cryptsetup decrypts their headers but refuses to
//! activate them; udm is not bound by what the kernel has, so it maps
//! them with one crypt line of a udm-only spelling, the chain and mode
//! exactly as `tcryptDump` prints them:
//!
//! - `CHAIN-cbc-tcrypt` (TrueCrypt's "inner CBC", and plain CBC for one
//!   cipher): each cipher of the chain, first to last on encryption, makes
//!   a CBC pass over the sector with its own IV and whitening.
//! - `CHAIN-cbci-tcrypt` (TrueCrypt's "outer CBC"): the chain is one block
//!   cipher (first cipher applied first) in one CBC pass.
//!
//! IV and whitening are the tcw IV mode's (`tcw.rs`; TrueCrypt's
//! `InitSectorIVAndWhitening`), taken from one seed shared by every pass
//! and read by each cipher at its own block size: the IV is the seed's
//! first block XOR the sector number, the whitening comes from the 16
//! bytes after it. The key is each cipher's key in chain order (aes,
//! serpent and twofish 256 bits, blowfish_le 448, cast5 128, des3_ede
//! 192), then that seed: the largest block size plus 16 bytes. This is
//! cryptsetup's TCRYPT volume key for these chains, so `tcryptDump
//! --dump-volume-key` gives the key of the line.

use zeroize::Zeroize;

use super::block::{as_blocks, Block, BlockCipher};
use super::block64::Cipher64;
use super::modes;
use super::spec::{Cascade, TcryptChain, TcryptPart, MAX_TCRYPT_CHAIN};
use super::tcw::Tcw;
use super::CryptoError;

/// TrueCrypt's sectors: these modes know no other size.
const SECTOR: usize = 512;

/// A keyed cipher of the chain.
// Built once per device on locked pages, never moved on the I/O path.
#[allow(clippy::large_enum_variant)]
enum Keyed {
    B16(BlockCipher),
    B8 { c: Cipher64, le: bool },
}

/// Swap the bytes of every 32-bit word: TrueCrypt's blowfish read its
/// words little-endian, the kernel's (and the crate's) big-endian.
fn swap_words(b: &mut [u8]) {
    b.chunks_exact_mut(4).for_each(<[u8]>::reverse);
}

impl Keyed {
    fn new(p: TcryptPart, key: &[u8]) -> Result<Keyed, CryptoError> {
        Ok(if p.alg.block_size() == 16 {
            Keyed::B16(BlockCipher::new(p.alg, key)?)
        } else {
            Keyed::B8 {
                c: Cipher64::new(p.alg, key)?,
                le: p.le,
            }
        })
    }

    fn block_size(&self) -> usize {
        match self {
            Keyed::B16(_) => 16,
            Keyed::B8 { .. } => 8,
        }
    }

    /// Every block of `data` on its own.
    fn ecb(&self, data: &mut [u8], encrypt: bool) {
        match self {
            Keyed::B16(c) if encrypt => c.encrypt_blocks(as_blocks(data)),
            Keyed::B16(c) => c.decrypt_blocks(as_blocks(data)),
            Keyed::B8 { c, le } => {
                if *le {
                    swap_words(data);
                }
                c.ecb(data, encrypt);
                if *le {
                    swap_words(data);
                }
            }
        }
    }

    /// One CBC chain over `sector` from `iv` (its first block size bytes).
    /// XOR commutes with the word swap, so the little-endian blowfish's
    /// CBC is the usual CBC over swapped data and IV.
    fn cbc(&self, sector: &mut [u8], iv: &[u8; 16], encrypt: bool) {
        match self {
            Keyed::B16(c) => {
                let ivs = [Block::from(*iv)];
                if encrypt {
                    modes::cbc_encrypt(c, sector.len(), sector, &ivs);
                } else {
                    modes::cbc_decrypt(c, sector.len(), sector, &ivs);
                }
            }
            Keyed::B8 { c, le } => {
                let mut iv8 = [0u8; 8];
                iv8.copy_from_slice(&iv[..8]);
                if *le {
                    swap_words(sector);
                    swap_words(&mut iv8);
                }
                c.cbc(sector, &iv8, encrypt);
                if *le {
                    swap_words(sector);
                }
                iv8.zeroize();
            }
        }
    }
}

/// One cipher of the chain with its IV and whitening at its block size.
struct Stage {
    cipher: Keyed,
    tcw: Tcw,
}

/// A keyed TrueCrypt legacy CBC transform of 512-byte sectors.
pub struct TcryptCbc {
    stages: [Option<Stage>; MAX_TCRYPT_CHAIN],
    cascade: Cascade,
}

impl TcryptCbc {
    /// Key the chain of `chain` with the whole key (see the module doc).
    pub fn new(spec: &str, chain: &TcryptChain, key: &[u8]) -> Result<TcryptCbc, CryptoError> {
        if key.len() != chain.key_len() {
            return Err(CryptoError::key(format!(
                "cipher spec '{spec}': the key is {} bits; this chain takes {} (each cipher's key, then a {}-byte IV seed and whitening)",
                key.len() * 8,
                chain.key_len() * 8,
                chain.seed_len()
            )));
        }
        let seed = &key[key.len() - chain.seed_len()..];
        let mut stages = [None, None, None];
        let mut at = 0;
        for (slot, p) in stages.iter_mut().zip(chain.parts()) {
            let k = &key[at..at + p.key_len()];
            at += p.key_len();
            let cipher = Keyed::new(p, k)
                .map_err(|e| CryptoError::key(format!("cipher spec '{spec}': {e}")))?;
            let tcw = Tcw::new(seed, cipher.block_size());
            *slot = Some(Stage { cipher, tcw });
        }
        Ok(TcryptCbc {
            stages,
            cascade: chain.cascade,
        })
    }

    fn stages(&self) -> impl DoubleEndedIterator<Item = &Stage> {
        self.stages.iter().flatten()
    }

    /// Encrypt or decrypt one 512-byte sector whose IV sector is `s`.
    pub fn sector(&self, data: &mut [u8], s: u64, encrypt: bool) {
        let data = &mut data[..SECTOR];
        match (self.cascade, encrypt) {
            (Cascade::Inner, true) => {
                for st in self.stages() {
                    let mut iv = st.tcw.iv(s, st.cipher.block_size());
                    st.cipher.cbc(data, &iv, true);
                    st.tcw.whiten(data, s);
                    iv.zeroize();
                }
            }
            (Cascade::Inner, false) => {
                for st in self.stages().rev() {
                    let mut iv = st.tcw.iv(s, st.cipher.block_size());
                    st.tcw.whiten(data, s);
                    st.cipher.cbc(data, &iv, false);
                    iv.zeroize();
                }
            }
            (Cascade::Outer, true) => self.outer_encrypt(data, s),
            (Cascade::Outer, false) => self.outer_decrypt(data, s),
        }
    }

    /// Serial by nature: each block goes through every cipher before the
    /// next block can be chained to it.
    fn outer_encrypt(&self, data: &mut [u8], s: u64) {
        // The first cipher's block size, IV and whitening are the chain's.
        let Some(first) = self.stages().next() else {
            return;
        };
        let bs = first.cipher.block_size();
        let mut prev = first.tcw.iv(s, bs);
        for b in data.chunks_exact_mut(bs) {
            b.iter_mut().zip(&prev).for_each(|(x, p)| *x ^= p);
            for st in self.stages() {
                st.cipher.ecb(b, true);
            }
            prev[..bs].copy_from_slice(b);
        }
        first.tcw.whiten(data, s);
        prev.zeroize();
    }

    /// Each cipher decrypts the whole sector in one call (last cipher
    /// first), then every block is XORed with the ciphertext before it.
    fn outer_decrypt(&self, data: &mut [u8], s: u64) {
        let Some(first) = self.stages().next() else {
            return;
        };
        let bs = first.cipher.block_size();
        first.tcw.whiten(data, s);
        let mut saved = [0u8; SECTOR];
        saved.copy_from_slice(data);
        for st in self.stages().rev() {
            st.cipher.ecb(data, false);
        }
        let mut iv = first.tcw.iv(s, bs);
        data[..bs].iter_mut().zip(&iv).for_each(|(x, p)| *x ^= p);
        for (b, c) in data[bs..].chunks_exact_mut(bs).zip(saved.chunks_exact(bs)) {
            b.iter_mut().zip(c).for_each(|(x, p)| *x ^= p);
        }
        iv.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::spec::Alg;

    /// blowfish_le is the kernel's blowfish on byte-swapped words.
    #[test]
    fn blowfish_le_is_swapped_blowfish() {
        let key: Vec<u8> = (0..56u8).collect();
        let part = TcryptPart {
            alg: Alg::Blowfish,
            le: true,
        };
        let le = Keyed::new(part, &key).unwrap();
        let be = Cipher64::new(Alg::Blowfish, &key).unwrap();
        let mut a = *b"\x01\x02\x03\x04\x05\x06\x07\x08";
        let mut b = *b"\x04\x03\x02\x01\x08\x07\x06\x05";
        le.ecb(&mut a, true);
        be.ecb(&mut b, true);
        swap_words(&mut b);
        assert_eq!(a, b);
        le.ecb(&mut a, false);
        assert_eq!(&a, b"\x01\x02\x03\x04\x05\x06\x07\x08");
    }
}
