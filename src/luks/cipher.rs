//! Keyslot-area encryption: LUKS encrypts key material with the keyslot's
//! cipher in 512-byte sectors whose IV counter starts at 0 at the area start.
//! The sector transform itself is `crate::crypto::SectorCrypt`.

use super::error::LuksError;
use crate::crypto::SectorCrypt;

/// Encrypt (`enc`) or decrypt key material in place.
pub fn area_crypt(spec: &str, key: &[u8], data: &mut [u8], enc: bool) -> Result<(), LuksError> {
    if data.len() % 512 != 0 {
        return Err(LuksError::Crypto(format!(
            "key material length {} is not a multiple of 512",
            data.len()
        )));
    }
    let c = SectorCrypt::new(spec, key, 512, false)
        .map_err(|e| LuksError::Crypto(format!("keyslot cipher {spec}: {e}")))?;
    if enc {
        c.encrypt(data, 0);
    } else {
        c.decrypt(data, 0);
    }
    Ok(())
}

/// Whether a LUKS cipher spec (`cipher-mode-iv`, or a bare cipher) leaves
/// data readable to whoever holds the storage: the null cipher stores
/// plaintext, and ECB shows equal plaintext blocks as equal ciphertext.
/// The header checksum is unkeyed, so a storage-side edit can set either
/// while every keyslot still opens; mapping it would write new data in
/// clear with the real key.
pub fn is_weak(spec: &str) -> bool {
    let lower = spec.to_ascii_lowercase();
    let mut parts = lower.split('-');
    let cipher = parts.next().unwrap_or("");
    let mode = parts.next().unwrap_or("");
    let iv = parts.next().unwrap_or("");
    matches!(cipher, "cipher_null" | "null" | "")
        || lower.contains("cipher_null")
        || mode == "ecb"
        || mode == "null"
        || iv == "null"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_specs_are_named_weak_and_usual_ones_are_not() {
        for s in [
            "cipher_null-ecb",
            "cipher_null",
            "CIPHER_NULL-ECB",
            "aes-ecb",
            "aes-ecb-plain64",
            "aes-xts-null",
            "capi:cipher_null-plain64",
        ] {
            assert!(is_weak(s), "{s} should be weak");
        }
        for s in [
            "aes-xts-plain64",
            "aes-cbc-essiv:sha256",
            "serpent-xts-plain64",
            "twofish-cbc-plain",
        ] {
            assert!(!is_weak(s), "{s} should not be weak");
        }
    }
}
