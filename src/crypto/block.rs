//! The 16-byte block ciphers dm-crypt volumes use (the 8-byte ones are in
//! `block64`), behind one enum so the
//! chain modes are written once. Multi-block calls are the point: the `aes`
//! crate picks AES-NI/VAES at run time and only reaches full speed when given
//! many blocks at once.
//!
//! Every variant zeroizes its key schedule on drop (the crates' `zeroize`
//! feature); the key bytes passed in stay the caller's to wipe.

use aes::cipher::consts::U16;
use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt};

use super::spec::Alg;
use super::{key_error, keyed, CryptoError};

/// One cipher block.
pub type Block = Array<u8, U16>;

/// A keyed 16-byte block cipher.
pub enum BlockCipher {
    Aes128(aes::Aes128),
    Aes192(aes::Aes192),
    Aes256(aes::Aes256),
    Serpent(serpent::Serpent),
    /// Table-driven (see `twofish_fast`): the `twofish` crate is far too
    /// slow for a volume.
    Twofish(Box<super::twofish_fast::Twofish>),
    Camellia128(camellia::Camellia128),
    Camellia192(camellia::Camellia192),
    Camellia256(camellia::Camellia256),
    /// Boxed: its encrypt and decrypt schedules make it the largest.
    Kuznyechik(Box<kuznyechik::Kuznyechik>),
}

impl std::fmt::Debug for BlockCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            BlockCipher::Aes128(_) => "aes-128",
            BlockCipher::Aes192(_) => "aes-192",
            BlockCipher::Aes256(_) => "aes-256",
            BlockCipher::Serpent(_) => "serpent",
            BlockCipher::Twofish(_) => "twofish",
            BlockCipher::Camellia128(_) => "camellia-128",
            BlockCipher::Camellia192(_) => "camellia-192",
            BlockCipher::Camellia256(_) => "camellia-256",
            BlockCipher::Kuznyechik(_) => "kuznyechik",
        };
        write!(f, "BlockCipher({name}, key hidden)")
    }
}

/// View a byte slice (length a multiple of 16) as blocks.
pub fn as_blocks(data: &mut [u8]) -> &mut [Block] {
    let (blocks, rest) = Array::slice_as_chunks_mut(data);
    debug_assert!(rest.is_empty());
    blocks
}

/// One direction over many blocks, for any of the crates' 16-byte ciphers.
#[inline]
fn run<C>(c: &C, b: &mut [Block], encrypt: bool)
where
    C: BlockCipherEncrypt<BlockSize = U16> + BlockCipherDecrypt<BlockSize = U16>,
{
    if encrypt {
        c.encrypt_blocks(b)
    } else {
        c.decrypt_blocks(b)
    }
}

impl BlockCipher {
    /// Key `alg` with `key`; the error names the algorithm and the sizes it
    /// accepts (never the key).
    pub fn new(alg: Alg, key: &[u8]) -> Result<BlockCipher, CryptoError> {
        const THREE: &str = "128, 192 or 256 bits";
        Ok(match (alg, key.len()) {
            (Alg::Aes, 16) => BlockCipher::Aes128(keyed(alg, key, THREE)?),
            (Alg::Aes, 24) => BlockCipher::Aes192(keyed(alg, key, THREE)?),
            (Alg::Aes, 32) => BlockCipher::Aes256(keyed(alg, key, THREE)?),
            (Alg::Serpent, _) => BlockCipher::Serpent(keyed(alg, key, "128 to 256 bits")?),
            (Alg::Twofish, _) => BlockCipher::Twofish(
                super::twofish_fast::Twofish::new(key)
                    .ok_or_else(|| key_error(alg, key.len(), THREE))?,
            ),
            (Alg::Camellia, 16) => BlockCipher::Camellia128(keyed(alg, key, THREE)?),
            (Alg::Camellia, 24) => BlockCipher::Camellia192(keyed(alg, key, THREE)?),
            (Alg::Camellia, 32) => BlockCipher::Camellia256(keyed(alg, key, THREE)?),
            (Alg::Aes | Alg::Camellia, n) => return Err(key_error(alg, n, THREE)),
            (Alg::Kuznyechik, _) => BlockCipher::Kuznyechik(Box::new(keyed(alg, key, "256 bits")?)),
            (Alg::XChaCha12Aes | Alg::XChaCha20Aes, _) => {
                return Err(CryptoError::new(format!(
                    "{} is adiantum's cipher pair, not a block cipher",
                    alg.name()
                )))
            }
            (Alg::Cast5 | Alg::Blowfish | Alg::Des3Ede, _) => {
                return Err(CryptoError::new(format!(
                    "{} has 8-byte blocks, not 16",
                    alg.name()
                )))
            }
            (Alg::Null, _) => return Err(CryptoError::new("cipher_null has no block cipher")),
        })
    }

    /// Encrypt or decrypt blocks in place (parallel where the backend can).
    #[inline]
    fn blocks(&self, b: &mut [Block], encrypt: bool) {
        match self {
            BlockCipher::Aes128(c) => run(c, b, encrypt),
            BlockCipher::Aes192(c) => run(c, b, encrypt),
            BlockCipher::Aes256(c) => run(c, b, encrypt),
            BlockCipher::Serpent(c) => run(c, b, encrypt),
            BlockCipher::Camellia128(c) => run(c, b, encrypt),
            BlockCipher::Camellia192(c) => run(c, b, encrypt),
            BlockCipher::Camellia256(c) => run(c, b, encrypt),
            BlockCipher::Kuznyechik(c) => run(&**c, b, encrypt),
            BlockCipher::Twofish(c) if encrypt => {
                b.iter_mut().for_each(|x| c.encrypt_block(&mut x.0))
            }
            BlockCipher::Twofish(c) => b.iter_mut().for_each(|x| c.decrypt_block(&mut x.0)),
        }
    }

    /// Encrypt blocks in place (parallel where the backend can).
    #[inline]
    pub fn encrypt_blocks(&self, b: &mut [Block]) {
        self.blocks(b, true)
    }

    /// Decrypt blocks in place.
    #[inline]
    pub fn decrypt_blocks(&self, b: &mut [Block]) {
        self.blocks(b, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7801's example (section 5.5): the GOST R 34.12-2015 key and
    /// block, which the kernel's testmgr uses as its kuznyechik vector too.
    #[test]
    fn kuznyechik_rfc7801() {
        let key = hex::decode("8899aabbccddeeff0011223344556677fedcba98765432100123456789abcdef")
            .unwrap();
        let c = BlockCipher::new(Alg::Kuznyechik, &key).unwrap();
        let mut data = hex::decode("1122334455667700ffeeddccbbaa9988").unwrap();
        c.encrypt_blocks(as_blocks(&mut data));
        assert_eq!(hex::encode(&data), "7f679d90bebc24305a468d42b9d4edcd");
        c.decrypt_blocks(as_blocks(&mut data));
        assert_eq!(hex::encode(&data), "1122334455667700ffeeddccbbaa9988");
        let e = BlockCipher::new(Alg::Kuznyechik, &key[..16]).unwrap_err();
        assert!(
            e.about_key() && e.to_string().contains("kuznyechik: a 128-bit key"),
            "{e}"
        );
        let e = BlockCipher::new(Alg::Camellia, &key[..20]).unwrap_err();
        assert!(e.to_string().contains("128, 192 or 256 bits"), "{e}");
    }
}
