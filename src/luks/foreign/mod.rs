//! Volumes of other systems' disk encryption that cryptsetup opens, as
//! tables of udm's own crypt target: TrueCrypt/VeraCrypt (`tcrypt`),
//! BitLocker (`bitlk`) and FileVault2 (`fvault2`).
//!
//! They live under `luks/` because they need what LUKS needs and nothing
//! more: the store-backed `Disk` reader, the passphrase sources, the
//! secret buffers and `LuksError` with cryptsetup's exit codes. Each
//! format reads and decrypts its own header and turns it into crypt table
//! lines; nothing outside these files knows the formats' layouts.
//! `activate.rs` turns an unlocked header into the devices cryptsetup
//! creates, for `udm cryptsetup open` and `udm serve` alike.

pub mod activate;
pub mod bitlk;
pub mod bitlk_partial;
pub mod fvault2;
pub mod partition;
pub mod tcrypt;

/// CRC-32 (IEEE 802.3, reflected), the running register without the
/// final inversion: TrueCrypt's keyfile pool mixes in the register itself
/// after every byte, and its header checksums invert it at both ends.
pub(crate) fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    crc
}

/// The usual CRC-32 of `data`.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    !crc32_update(!0, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }
}
