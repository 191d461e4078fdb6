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

/// The dm-crypt cipher spec and `integrity:` option of an authenticated
/// LUKS2 segment (`encryption` `CIPHER-MODE-IV` or `CIPHER-IV`, integrity
/// type from the segment), as libcryptsetup's `cipher_dm2c` builds them for
/// the crypt target over `NAME_dif`; `tag` is the integrity device's tag
/// size (the format's [`super::format::integrity_tag_size`]).
pub fn authenticated_dm_cipher(encryption: &str, integrity: &str, tag: u32) -> Option<String> {
    let (cipher, rest) = encryption.split_once('-')?;
    let (capi, iv) = match rest.split_once('-') {
        Some((mode, iv)) => (format!("{mode}({cipher})"), iv),
        None => (cipher.to_string(), rest),
    };
    let spec = match integrity {
        "aead" => format!("capi:{capi}-{iv}"),
        "poly1305" => format!("capi:rfc7539({capi},poly1305)-{iv}"),
        "none" => return None,
        mac => format!("capi:authenc({mac},{capi})-{iv}"),
    };
    Some(format!("{spec} integrity:{tag}:aead"))
}

/// The other way: a crypt line's authenticated cipher spec as the LUKS2
/// segment's `encryption` and `integrity.type` it maps (what `cryptsetup
/// status` prints for such a device); None for any other spec.
pub fn luks_form_of_authenticated(spec: &str) -> Option<(String, String)> {
    let (capi, iv) = spec.strip_prefix("capi:")?.rsplit_once('-')?;
    let (kind, inner) = if let Some(x) = capi.strip_prefix("authenc(") {
        let (mac, inner) = x.strip_suffix(')')?.split_once(',')?;
        (mac.to_string(), inner)
    } else if let Some(x) = capi.strip_prefix("rfc7539(") {
        ("poly1305".to_string(), x.strip_suffix(",poly1305)")?)
    } else {
        ("aead".to_string(), capi)
    };
    let encryption = match inner.split_once('(') {
        Some((mode, cipher)) => format!("{}-{mode}-{iv}", cipher.strip_suffix(')')?),
        None => format!("{inner}-{iv}"),
    };
    Some((encryption, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticated_segments_map_as_cryptsetup_maps_them() {
        for (enc, int, tag, want) in [
            (
                "aes-gcm-random",
                "aead",
                28,
                "capi:gcm(aes)-random integrity:28:aead",
            ),
            (
                "chacha20-random",
                "poly1305",
                28,
                "capi:rfc7539(chacha20,poly1305)-random integrity:28:aead",
            ),
            (
                "aes-xts-plain64",
                "hmac(sha256)",
                32,
                "capi:authenc(hmac(sha256),xts(aes))-plain64 integrity:32:aead",
            ),
            (
                "aes-xts-random",
                "hmac(sha512)",
                80,
                "capi:authenc(hmac(sha512),xts(aes))-random integrity:80:aead",
            ),
        ] {
            assert_eq!(
                authenticated_dm_cipher(enc, int, tag).as_deref(),
                Some(want)
            );
            let spec = want.split(' ').next().unwrap_or("");
            assert!(crate::crypto::aead::is_aead_spec(spec), "{spec} runs");
            assert_eq!(
                luks_form_of_authenticated(spec),
                Some((enc.to_string(), int.to_string()))
            );
            assert_eq!(super::super::format::integrity_tag_size(int, enc), tag);
        }
        assert_eq!(authenticated_dm_cipher("aes", "aead", 28), None);
        assert_eq!(luks_form_of_authenticated("aes-xts-plain64"), None);
        assert_eq!(authenticated_dm_cipher("aes-cbc-random", "none", 16), None);
    }

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
