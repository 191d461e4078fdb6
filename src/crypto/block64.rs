//! The 8-byte block ciphers (cast5, blowfish, des3_ede) and the chain modes the
//! kernel runs them in (cbc, ecb; xts and lrw need 16-byte blocks). Old
//! volumes only: these are serial, one block per call, and no one reaches
//! for them for speed.
//!
//! Every variant zeroizes its key schedule on drop (the crates' `zeroize`
//! feature).

use cipher::consts::U8;
use cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt};

use super::spec::Alg;
use super::{keyed, CryptoError};

/// A keyed 8-byte block cipher.
pub enum Cipher64 {
    Blowfish(Box<blowfish::Blowfish>),
    Cast5(Box<cast5::Cast5>),
    /// Triple DES, encrypt-decrypt-encrypt with three keys (the kernel's
    /// `des3_ede`), for TrueCrypt's old CBC volumes.
    Des3Ede(Box<des::TdesEde3>),
}

impl std::fmt::Debug for Cipher64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Cipher64::Blowfish(_) => "blowfish",
            Cipher64::Cast5(_) => "cast5",
            Cipher64::Des3Ede(_) => "des3_ede",
        };
        write!(f, "Cipher64({name}, key hidden)")
    }
}

type Block8 = Array<u8, U8>;

/// One block in one direction, for any of the crates' 8-byte ciphers.
fn run<C>(c: &C, a: &mut Block8, encrypt: bool)
where
    C: BlockCipherEncrypt<BlockSize = U8> + BlockCipherDecrypt<BlockSize = U8>,
{
    if encrypt {
        c.encrypt_block(a)
    } else {
        c.decrypt_block(a)
    }
}

impl Cipher64 {
    /// Key `alg`; the sizes accepted are the kernel's (blowfish 32 to 448
    /// bits, cast5 40 to 128 bits, des3_ede 192 bits).
    pub fn new(alg: Alg, key: &[u8]) -> Result<Cipher64, CryptoError> {
        Ok(match alg {
            Alg::Blowfish => Cipher64::Blowfish(Box::new(keyed(alg, key, "32 to 448 bits")?)),
            Alg::Cast5 => Cipher64::Cast5(Box::new(keyed(alg, key, "40 to 128 bits")?)),
            Alg::Des3Ede => Cipher64::Des3Ede(Box::new(keyed(alg, key, "192 bits")?)),
            other => {
                return Err(CryptoError::new(format!(
                    "{} is not an 8-byte block cipher",
                    other.name()
                )))
            }
        })
    }

    fn block(&self, b: &mut [u8], encrypt: bool) {
        let mut a = Block8::default();
        a.copy_from_slice(b);
        match self {
            Cipher64::Blowfish(c) => run(&**c, &mut a, encrypt),
            Cipher64::Cast5(c) => run(&**c, &mut a, encrypt),
            Cipher64::Des3Ede(c) => run(&**c, &mut a, encrypt),
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
        // NIST SP 800-67's TDEA example: the three keys and the first
        // block of "The qufck brown fox jump" (sic).
        let d3 = Cipher64::new(
            Alg::Des3Ede,
            &hex::decode("0123456789abcdef23456789abcdef01456789abcdef0123").unwrap(),
        )
        .unwrap();
        let mut b = hex::decode("5468652071756663").unwrap();
        d3.encrypt_block(&mut b);
        assert_eq!(hex::encode(&b), "a826fd8ce53b855f");
        d3.ecb(&mut b, false);
        assert_eq!(hex::encode(&b), "5468652071756663");
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
            (Alg::Des3Ede, 16),
        ] {
            let e = Cipher64::new(alg, &vec![1u8; len]).unwrap_err();
            assert!(e.about_key() && e.to_string().contains("bits"), "{e}");
        }
    }
}
