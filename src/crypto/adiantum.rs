//! Adiantum (`xchacha12,aes-adiantum-plain64`, `xchacha20,aes-...`): the
//! length-preserving wide-block mode of Crowley and Biggers (IACR ToSC
//! 2018), as the kernel's `adiantum` template runs it for dm-crypt: one
//! sector is one message, the dm-crypt IV is the 32-byte tweak T.
//!
//! Keys: the 32-byte key K keys XChaCha; its keystream under the nonce
//! `1, 0, ..., 0` gives, in order, the AES-256 key, the 16-byte Poly1305
//! key of the tweak hash, the 16-byte Poly1305 key of NHPoly1305 and the
//! 1072-byte NH key.
//!
//! A message P is split into P_L (all but the last 16 bytes) and P_R.
//! `H(T, M)` is the sum mod 2^128 of Poly1305 (no final key added) over
//! `le64(bits of M) || 0^8 || T` and NHPoly1305(M): NH over each 1024-byte
//! chunk, its 32-byte output Poly1305'd. Encryption: P_M = P_R + H(T, P_L);
//! C_M = AES(P_M); C_L = P_L XOR XChaCha(K, nonce C_M || 1 || 0^7);
//! C_R = C_M - H(T, C_L). Decryption runs the same steps backwards.

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit, KeyIvInit, StreamCipher};
use poly1305::universal_hash::UniversalHash;
use poly1305::Poly1305;
use zeroize::{Zeroize, Zeroizing};

use super::block::Block;
use super::CryptoError;

/// NH key words: 256 for a 1024-byte chunk plus 4 per extra pass.
const NH_KEY_WORDS: usize = 256 + 12;
/// NH's chunk of message per Poly1305 step.
const NH_CHUNK: usize = 1024;

/// The stream cipher's round count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounds {
    R12,
    R20,
}

/// A keyed Adiantum instance.
pub struct Adiantum {
    rounds: Rounds,
    stream_key: Zeroizing<[u8; 32]>,
    aes: aes::Aes256,
    /// Poly1305 keyed with `r || 0^16`: with s = 0 the tag is the bare
    /// polynomial value, the kernel's `poly1305_core_emit` without nonce.
    /// Kept keyed and cloned per message (keying precomputes powers of r).
    header_poly: Poly1305,
    nh_poly: Poly1305,
    nh_key: Box<[u32; NH_KEY_WORDS]>,
}

impl Drop for Adiantum {
    fn drop(&mut self) {
        self.nh_key.zeroize();
    }
}

fn xor_stream(rounds: Rounds, key: &[u8; 32], nonce: &[u8; 24], data: &mut [u8]) {
    match rounds {
        Rounds::R12 => chacha20::XChaCha12::new(key.into(), nonce.into()).apply_keystream(data),
        Rounds::R20 => chacha20::XChaCha20::new(key.into(), nonce.into()).apply_keystream(data),
    }
}

/// NH over one chunk (a multiple of 16 bytes, at most 1024): four passes,
/// pass i pairing message words with key words offset by 4i.
fn nh(key: &[u32; NH_KEY_WORDS], chunk: &[u8]) -> [u8; 32] {
    nh_at(key, 0, chunk)
}

/// NH of 16-byte units that start at unit `first` of their chunk.
fn nh_at(key: &[u32; NH_KEY_WORDS], first: usize, units: &[u8]) -> [u8; 32] {
    let mut sums = [0u64; 4];
    for (i, m) in units.chunks_exact(16).enumerate() {
        let u = first + i;
        let w = |i: usize| u32::from_le_bytes([m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]]);
        let (m0, m1, m2, m3) = (w(0), w(1), w(2), w(3));
        let k = &key[4 * u..4 * u + 16];
        for (p, s) in sums.iter_mut().enumerate() {
            let k = &k[4 * p..4 * p + 4];
            let a = u64::from(m0.wrapping_add(k[0])) * u64::from(m2.wrapping_add(k[2]));
            let b = u64::from(m1.wrapping_add(k[1])) * u64::from(m3.wrapping_add(k[3]));
            *s = s.wrapping_add(a).wrapping_add(b);
        }
    }
    let mut out = [0u8; 32];
    for (o, s) in out.chunks_exact_mut(8).zip(sums) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    out
}

impl Adiantum {
    pub fn new(rounds: Rounds, key: &[u8]) -> Result<Adiantum, CryptoError> {
        let stream_key: Zeroizing<[u8; 32]> = Zeroizing::new(key.try_into().map_err(|_| {
            CryptoError::key(format!(
                "adiantum takes a 256-bit key, got {} bits",
                key.len() * 8
            ))
        })?);
        let mut derived = Zeroizing::new([0u8; 32 + 16 + 16 + 4 * NH_KEY_WORDS]);
        let mut nonce = [0u8; 24];
        nonce[0] = 1;
        xor_stream(rounds, &stream_key, &nonce, &mut derived[..]);
        let aes = aes::Aes256::new_from_slice(&derived[..32])
            .map_err(|_| CryptoError::new("adiantum: AES-256 key derivation failed"))?;
        let mut pk = Zeroizing::new([0u8; 32]);
        pk[..16].copy_from_slice(&derived[32..48]);
        let header_poly = Poly1305::new((&*pk).into());
        pk[..16].copy_from_slice(&derived[48..64]);
        let nh_poly = Poly1305::new((&*pk).into());
        let mut nh_key = Box::new([0u32; NH_KEY_WORDS]);
        for (w, c) in nh_key.iter_mut().zip(derived[64..].chunks_exact(4)) {
            *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(Adiantum {
            rounds,
            stream_key,
            aes,
            header_poly,
            nh_poly,
            nh_key,
        })
    }

    /// The tweak part of H: Poly1305 over the message's bit length and T.
    fn header_hash(&self, tweak: &[u8], bulk_len: usize) -> u128 {
        let mut hp = self.header_poly.clone();
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&((bulk_len as u64) * 8).to_le_bytes());
        hp.update_padded(&head);
        hp.update_padded(tweak);
        u128::from_le_bytes(hp.finalize().into())
    }

    /// NHPoly1305 of the bulk part.
    fn nh_hash(&self, msg: &[u8]) -> u128 {
        let mut np = self.nh_poly.clone();
        for chunk in msg.chunks(NH_CHUNK) {
            let whole = chunk.len() - chunk.len() % 16;
            let mut out = nh(&self.nh_key, &chunk[..whole]);
            if whole < chunk.len() {
                // A chunk that is not whole 16-byte units is zero-padded;
                // NH is a sum over units, so the last one adds on.
                let mut pad = [0u8; 16];
                pad[..chunk.len() - whole].copy_from_slice(&chunk[whole..]);
                let tail = nh_at(&self.nh_key, whole / 16, &pad);
                for (o, t) in out.chunks_exact_mut(8).zip(tail.chunks_exact(8)) {
                    let v = u64::from_le_bytes(o.try_into().unwrap_or([0; 8]))
                        .wrapping_add(u64::from_le_bytes(t.try_into().unwrap_or([0; 8])));
                    o.copy_from_slice(&v.to_le_bytes());
                }
                pad.zeroize();
            }
            np.update_padded(&out);
        }
        u128::from_le_bytes(np.finalize().into())
    }

    fn stream(&self, cm: &[u8; 16], data: &mut [u8]) {
        let mut nonce = [0u8; 24];
        nonce[..16].copy_from_slice(cm);
        nonce[16] = 1;
        xor_stream(self.rounds, &self.stream_key, &nonce, data);
    }

    /// Encrypt or decrypt one message (at least 16 bytes) in place under
    /// `tweak` (dm-crypt's: 32 bytes; whole 16-byte blocks).
    pub fn crypt(&self, data: &mut [u8], tweak: &[u8], encrypt: bool) {
        let (bulk, last) = data.split_at_mut(data.len() - 16);
        let r = u128::from_le_bytes(last.try_into().unwrap_or([0; 16]));
        let head = self.header_hash(tweak, bulk.len());
        let mut b = Block::from(
            r.wrapping_add(head.wrapping_add(self.nh_hash(bulk)))
                .to_le_bytes(),
        );
        if encrypt {
            self.aes.encrypt_block(&mut b);
            self.stream(&b.0, bulk);
        } else {
            self.stream(&b.0, bulk);
            self.aes.decrypt_block(&mut b);
        }
        let out = u128::from_le_bytes(b.0).wrapping_sub(head.wrapping_add(self.nh_hash(bulk)));
        last.copy_from_slice(&out.to_le_bytes());
        b.0.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors of the Adiantum authors' reference test set
    /// (google/adiantum, test_vectors/ours/Adiantum, XChaCha12, empty
    /// tweak): a bare 16-byte message (no bulk part), and a 31-byte one
    /// whose 15-byte bulk part takes NH's zero padding.
    #[test]
    fn reference_vectors_xchacha12() {
        for (key, pt, ct) in [
            (
                "7fc7152ae1f5fda4176769aec92bba82a314e7cfadfd8540da7b7d24bdf17d07",
                "9be382c65ac19fad4659b80bacc857a0",
                "820ae44477dd9a186f80288b25070e85",
            ),
            (
                "4260244fcf1dc13d3132cb3fb7a49c7b88e575bd726d052a6a5cd7264ad24a7a",
                "7912c8f77406549a2d23df49a163046a3f7990b3da30b94395043a8a8fba19",
                "76167e759696c2c6db5e215ebc398f722813fe8a39d5ea56d5b9f290753f04",
            ),
        ] {
            let a = Adiantum::new(Rounds::R12, &hex::decode(key).unwrap()).unwrap();
            let mut d = hex::decode(pt).unwrap();
            a.crypt(&mut d, &[], true);
            assert_eq!(hex::encode(&d), ct);
            a.crypt(&mut d, &[], false);
            assert_eq!(hex::encode(&d), pt);
        }
    }

    /// The same set's XChaCha20 file, first 16- and 31-byte entries.
    #[test]
    fn reference_vectors_xchacha20() {
        for (key, pt, ct) in [
            (
                "7fc7152ae1f5fda4176769aec92bba82a314e7cfadfd8540da7b7d24bdf17d07",
                "9be382c65ac19fad4659b80bacc857a0",
                "8899bb928f2bf9264eafdee237d431aa",
            ),
            (
                "4260244fcf1dc13d3132cb3fb7a49c7b88e575bd726d052a6a5cd7264ad24a7a",
                "7912c8f77406549a2d23df49a163046a3f7990b3da30b94395043a8a8fba19",
                "ac39a4c2b4dec2399a825ff4d079c4386ab3d87a6979839a3332be807b2263",
            ),
        ] {
            let a = Adiantum::new(Rounds::R20, &hex::decode(key).unwrap()).unwrap();
            let mut d = hex::decode(pt).unwrap();
            a.crypt(&mut d, &[], true);
            assert_eq!(hex::encode(&d), ct);
        }
    }

    #[test]
    fn round_trip_every_sector_size_and_wide_diffusion() {
        for rounds in [Rounds::R12, Rounds::R20] {
            let a = Adiantum::new(rounds, &[7u8; 32]).unwrap();
            for len in [16usize, 31, 512, 4096] {
                let plain: Vec<u8> = (0..len).map(|i| (i * 5) as u8).collect();
                let mut t = [0u8; 32];
                t[0] = 9;
                let mut c = plain.clone();
                a.crypt(&mut c, &t, true);
                let mut d = plain.clone();
                d[0] ^= 1; // one bit of the first byte changes every block
                a.crypt(&mut d, &t, true);
                if len >= 32 {
                    assert!(c.chunks(16).zip(d.chunks(16)).all(|(x, y)| x != y), "{len}");
                }
                a.crypt(&mut c, &t, false);
                assert_eq!(c, plain, "{len}");
            }
        }
        assert!(Adiantum::new(Rounds::R12, &[0u8; 16]).is_err());
    }
}
