//! The 16-byte block ciphers dm-crypt volumes use (the 8-byte ones are in
//! `block64`), behind one enum so the
//! chain modes are written once. Multi-block calls are the point: the `aes`
//! crate picks AES-NI/VAES at run time and only reaches full speed when given
//! many blocks at once.
//!
//! Every variant zeroizes its key schedule on drop (the crates' `zeroize`
//! feature); the key bytes passed in stay the caller's to wipe.

use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

use super::spec::Alg;
use super::CryptoError;

/// One cipher block.
pub type Block = Array<u8, aes::cipher::consts::U16>;

/// A keyed 16-byte block cipher.
pub enum BlockCipher {
    Aes128(aes::Aes128),
    Aes192(aes::Aes192),
    Aes256(aes::Aes256),
    Serpent(serpent::Serpent),
    /// Table-driven (see `twofish_fast`): the `twofish` crate runs ~1 MiB/s.
    Twofish(Box<super::twofish_fast::Twofish>),
    Camellia128(camellia::Camellia128),
    Camellia192(camellia::Camellia192),
    Camellia256(camellia::Camellia256),
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

impl BlockCipher {
    /// Key `alg` with `key`; the error names the algorithm and the sizes it
    /// accepts (never the key).
    pub fn new(alg: Alg, key: &[u8]) -> Result<BlockCipher, CryptoError> {
        let bad = |accepted: &str| {
            CryptoError::key(format!(
                "{}: a {}-bit key is not valid (accepted: {accepted})",
                alg.name(),
                key.len() * 8
            ))
        };
        Ok(match alg {
            Alg::Aes => match key.len() {
                16 => BlockCipher::Aes128(aes::Aes128::new_from_slice(key).map_err(|_| bad(""))?),
                24 => BlockCipher::Aes192(aes::Aes192::new_from_slice(key).map_err(|_| bad(""))?),
                32 => BlockCipher::Aes256(aes::Aes256::new_from_slice(key).map_err(|_| bad(""))?),
                _ => return Err(bad("128, 192 or 256 bits")),
            },
            Alg::Serpent => BlockCipher::Serpent(
                serpent::Serpent::new_from_slice(key).map_err(|_| bad("128 to 256 bits"))?,
            ),
            Alg::Twofish => BlockCipher::Twofish(
                super::twofish_fast::Twofish::new(key)
                    .ok_or_else(|| bad("128, 192 or 256 bits"))?,
            ),
            Alg::Camellia => match key.len() {
                16 => BlockCipher::Camellia128(
                    camellia::Camellia128::new_from_slice(key).map_err(|_| bad(""))?,
                ),
                24 => BlockCipher::Camellia192(
                    camellia::Camellia192::new_from_slice(key).map_err(|_| bad(""))?,
                ),
                32 => BlockCipher::Camellia256(
                    camellia::Camellia256::new_from_slice(key).map_err(|_| bad(""))?,
                ),
                _ => return Err(bad("128, 192 or 256 bits")),
            },
            Alg::XChaCha12Aes | Alg::XChaCha20Aes => {
                return Err(CryptoError::new(format!(
                    "{} is adiantum's cipher pair, not a block cipher",
                    alg.name()
                )))
            }
            Alg::Cast5 | Alg::Blowfish => {
                return Err(CryptoError::new(format!(
                    "{} has 8-byte blocks, not 16",
                    alg.name()
                )))
            }
            Alg::Null => return Err(CryptoError::new("cipher_null has no block cipher")),
        })
    }

    /// Encrypt blocks in place (parallel where the backend can).
    #[inline]
    pub fn encrypt_blocks(&self, b: &mut [Block]) {
        match self {
            BlockCipher::Aes128(c) => c.encrypt_blocks(b),
            BlockCipher::Aes192(c) => c.encrypt_blocks(b),
            BlockCipher::Aes256(c) => c.encrypt_blocks(b),
            BlockCipher::Serpent(c) => c.encrypt_blocks(b),
            BlockCipher::Twofish(c) => b.iter_mut().for_each(|x| c.encrypt_block(&mut x.0)),
            BlockCipher::Camellia128(c) => c.encrypt_blocks(b),
            BlockCipher::Camellia192(c) => c.encrypt_blocks(b),
            BlockCipher::Camellia256(c) => c.encrypt_blocks(b),
        }
    }

    /// Decrypt blocks in place.
    #[inline]
    pub fn decrypt_blocks(&self, b: &mut [Block]) {
        match self {
            BlockCipher::Aes128(c) => c.decrypt_blocks(b),
            BlockCipher::Aes192(c) => c.decrypt_blocks(b),
            BlockCipher::Aes256(c) => c.decrypt_blocks(b),
            BlockCipher::Serpent(c) => c.decrypt_blocks(b),
            BlockCipher::Twofish(c) => b.iter_mut().for_each(|x| c.decrypt_block(&mut x.0)),
            BlockCipher::Camellia128(c) => c.decrypt_blocks(b),
            BlockCipher::Camellia192(c) => c.decrypt_blocks(b),
            BlockCipher::Camellia256(c) => c.decrypt_blocks(b),
        }
    }
}
