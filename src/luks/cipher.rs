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
