//! The 8-byte block ciphers (cast5, blowfish) and the chain modes the
//! kernel runs them in (cbc, ecb; xts and lrw need 16-byte blocks). Old
//! volumes only: these are serial, one block per call, and no one reaches
//! for them for speed.
//!
//! Every variant zeroizes its key schedule on drop (the crates' `zeroize`
//! feature).

use cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

use super::spec::Alg;
use super::CryptoError;

/// A keyed 8-byte block cipher.
pub enum Cipher64 {
    Blowfish(Box<blowfish::Blowfish>),
    Cast5(Box<cast5::Cast5>),
}

impl std::fmt::Debug for Cipher64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Cipher64::Blowfish(_) => "blowfish",
            Cipher64::Cast5(_) => "cast5",
        };
        write!(f, "Cipher64({name}, key hidden)")
    }
}

impl Cipher64 {
    /// Key `alg`; the sizes accepted are the kernel's (blowfish 32 to 448
    /// bits, cast5 40 to 128 bits).
    pub fn new(alg: Alg, key: &[u8]) -> Result<Cipher64, CryptoError> {
        let bad = |accepted: &str| {
            CryptoError::key(format!(
                "{}: a {}-bit key is not valid (accepted: {accepted})",
                alg.name(),
                key.len() * 8
            ))
        };
        Ok(match alg {
            Alg::Blowfish => Cipher64::Blowfish(Box::new(
                blowfish::Blowfish::new_from_slice(key).map_err(|_| bad("32 to 448 bits"))?,
            )),
            Alg::Cast5 => Cipher64::Cast5(Box::new(
                cast5::Cast5::new_from_slice(key).map_err(|_| bad("40 to 128 bits"))?,
            )),
            other => {
                return Err(CryptoError::new(format!(
                    "{} is not an 8-byte block cipher",
                    other.name()
                )))
            }
        })
    }

    fn block(&self, b: &mut [u8], encrypt: bool) {
        let mut a: Array<u8, cipher::consts::U8> = Array::default();
        a.copy_from_slice(b);
        match (self, encrypt) {
            (Cipher64::Blowfish(c), true) => c.encrypt_block(&mut a),
            (Cipher64::Blowfish(c), false) => c.decrypt_block(&mut a),
            (Cipher64::Cast5(c), true) => c.encrypt_block(&mut a),
            (Cipher64::Cast5(c), false) => c.decrypt_block(&mut a),
        }
        b.copy_from_slice(&a);
    }

    /// Encrypt one 8-byte block in place (ESSIV's IV encryption).
    pub fn encrypt_block(&self, b: &mut [u8]) {
        self.block(b, true);
    }

    /// ECB over `data` (a multiple of 8 bytes).
    pub fn ecb(&self, data: &mut [u8], encrypt: bool) {
        for b in data.chunks_exact_mut(8) {
            self.block(b, encrypt);
        }
    }

    /// CBC over one chain (one sector) with the 8-byte `iv`.
    pub fn cbc(&self, data: &mut [u8], iv: &[u8], encrypt: bool) {
        let mut prev = [0u8; 8];
        prev.copy_from_slice(&iv[..8]);
        for b in data.chunks_exact_mut(8) {
            if encrypt {
                b.iter_mut().zip(&prev).for_each(|(x, p)| *x ^= p);
                self.block(b, true);
                prev.copy_from_slice(b);
            } else {
                let mut saved = [0u8; 8];
                saved.copy_from_slice(b);
                self.block(b, false);
                b.iter_mut().zip(&prev).for_each(|(x, p)| *x ^= p);
                prev = saved;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eric Young's blowfish vectors (key 0, plaintext 0; and the
    /// 0123456789abcdef-keyed one) and RFC 2144's CAST-128 128-bit vector.
    #[test]
    fn known_answers() {
        let bf = Cipher64::new(Alg::Blowfish, &[0u8; 8]).unwrap();
        let mut b = [0u8; 8];
        bf.encrypt_block(&mut b);
        assert_eq!(hex::encode(b), "4ef997456198dd78");
        let bf = Cipher64::new(Alg::Blowfish, &hex::decode("fedcba9876543210").unwrap()).unwrap();
        let mut b = hex::decode("0123456789abcdef").unwrap();
        bf.encrypt_block(&mut b);
        assert_eq!(hex::encode(&b), "0aceab0fc6a0a28d");
        let c5 = Cipher64::new(
            Alg::Cast5,
            &hex::decode("0123456712345678234567893456789a").unwrap(),
        )
        .unwrap();
        let mut b = hex::decode("0123456789abcdef").unwrap();
        c5.encrypt_block(&mut b);
        assert_eq!(hex::encode(&b), "238b4fe5847e44b2");
        c5.ecb(&mut b, false);
        assert_eq!(hex::encode(&b), "0123456789abcdef");
    }

    #[test]
    fn cbc_round_trips_and_chains() {
        let c = Cipher64::new(Alg::Cast5, &[7u8; 16]).unwrap();
        let plain: Vec<u8> = (0..64u8).collect();
        let mut d = plain.clone();
        c.cbc(&mut d, &[1u8; 8], true);
        let mut e = plain.clone();
        c.cbc(&mut e, &[2u8; 8], true);
        assert_ne!(d[56..], e[56..], "the IV reaches the last block");
        c.cbc(&mut d, &[1u8; 8], false);
        assert_eq!(d, plain);
        for (alg, len) in [
            (Alg::Blowfish, 3),
            (Alg::Blowfish, 57),
            (Alg::Cast5, 4),
            (Alg::Cast5, 17),
        ] {
            let e = Cipher64::new(alg, &vec![1u8; len]).unwrap_err();
            assert!(e.about_key() && e.to_string().contains("bits"), "{e}");
        }
    }
}
