//! dm-crypt-compatible sector encryption: cipher spec parsing, block ciphers
//! with their chain modes, and IV generators.
//!
//! CONTRACT used by the crypt target and by LUKS (keep these signatures):
//!
//! ```ignore
//! pub struct SectorCrypt;   // a keyed transform; Send + Sync; zeroizes keys on drop; no key in Debug
//! impl SectorCrypt {
//!     /// `spec` is a dm-crypt cipher spec (`aes-xts-plain64`, `capi:xts(aes)-plain64`,
//!     /// `aes-cbc-essiv:sha256`, `serpent-xts-plain64`, `cipher_null-ecb`, ...).
//!     /// `key` is the whole dm-crypt key (for XTS both halves).
//!     pub fn new(spec: &str, key: &[u8], sector_size: u32, iv_large_sectors: bool)
//!         -> Result<SectorCrypt, CryptoError>;
//!     /// Encrypt `data` (a multiple of sector_size bytes) in place. `sector` is the
//!     /// dm-crypt cc_sector of data[0]: 512-byte units, iv_offset already added.
//!     pub fn encrypt(&self, data: &mut [u8], sector: u64);
//!     pub fn decrypt(&self, data: &mut [u8], sector: u64);
//!     /// Encrypt `src` into `dst` (same length) without modifying `src` (bounce path).
//!     pub fn encrypt_to(&self, src: &[u8], dst: &mut [u8], sector: u64);
//!     pub fn sector_size(&self) -> u32;
//! }
//! pub struct CryptoError;    // Display names the offending part of the spec; never contains key bytes
//! ```

mod adiantum;
pub mod aead;
mod block;
mod block64;
mod elephant;
mod lmk;
mod lrw;
mod modes;
pub mod pool;
mod sector;
pub mod spec;
mod tcrypt_cbc;
#[cfg(test)]
mod tcrypt_cbc_tests;
mod tcw;
mod tfm;
mod twofish_fast;
#[cfg(test)]
mod vectors;
// The AVX-512/VAES intrinsics are stable since Rust 1.89; the `aes` 0.9.4
// dependency already requires 1.89, so the crate's declared 1.85 is not
// reachable in practice. (Raising rust-version crate-wide would turn on
// newer lints across every module.)
#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
mod xts_vaes;

pub use aead::SectorAead;
pub use sector::SectorCrypt;
pub use spec::CipherSpec;

/// A cipher spec or key the crypto layer cannot use. The message names the
/// offending part (spec, cipher, mode, key size, sector size) and never
/// contains key bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CryptoError {
    msg: String,
    about_key: bool,
}

impl CryptoError {
    /// An error about the cipher spec or geometry.
    pub fn new(msg: impl Into<String>) -> CryptoError {
        CryptoError {
            msg: msg.into(),
            about_key: false,
        }
    }

    /// An error about the key (its size or presence).
    pub fn key(msg: impl Into<String>) -> CryptoError {
        CryptoError {
            msg: msg.into(),
            about_key: true,
        }
    }

    /// Whether the key, rather than the spec, is what is wrong (a table
    /// parser points at the key argument then).
    pub fn about_key(&self) -> bool {
        self.about_key
    }
}

impl std::fmt::Display for CryptoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for CryptoError {}

/// The error for a key of the wrong size: it names the algorithm, the size
/// given and the sizes accepted (never the key).
fn key_error(alg: spec::Alg, len: usize, accepted: &str) -> CryptoError {
    CryptoError::key(format!(
        "{}: a {}-bit key is not valid (accepted: {accepted})",
        alg.name(),
        len * 8
    ))
}

/// Key one of the block cipher crates' types, or say which sizes it takes.
fn keyed<C: cipher::KeyInit>(alg: spec::Alg, key: &[u8], accepted: &str) -> Result<C, CryptoError> {
    C::new_from_slice(key).map_err(|_| key_error(alg, key.len(), accepted))
}
