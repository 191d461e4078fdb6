//! veritysetup's 512-byte superblock at the start of the hash area
//! (`--hash-offset`), little-endian: signature `verity\0\0`, version 1,
//! hash type, UUID, algorithm name, block sizes, data blocks, salt.

use super::Fail;
use crate::targets::verity::tree::HashAlg;

pub const SB_SIZE: usize = 512;
const SIGNATURE: &[u8; 8] = b"verity\0\0";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub hash_type: u32,
    pub uuid: [u8; 16],
    pub alg: HashAlg,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    pub data_blocks: u64,
    pub salt: Vec<u8>,
}

/// veritysetup's rule for block sizes (a multiple of 512, a power of
/// two, at most 512 KiB).
pub fn block_size_ok(b: u64) -> bool {
    (512..=512 * 1024).contains(&b) && b.is_power_of_two()
}

impl Superblock {
    pub fn to_bytes(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        b[..8].copy_from_slice(SIGNATURE);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&self.hash_type.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        let name = self.alg.name().as_bytes();
        b[32..32 + name.len()].copy_from_slice(name);
        b[64..68].copy_from_slice(&self.data_block_size.to_le_bytes());
        b[68..72].copy_from_slice(&self.hash_block_size.to_le_bytes());
        b[72..80].copy_from_slice(&self.data_blocks.to_le_bytes());
        b[80..82].copy_from_slice(&(self.salt.len() as u16).to_le_bytes());
        b[88..88 + self.salt.len()].copy_from_slice(&self.salt);
        b
    }

    /// Reads a superblock with veritysetup's checks and messages; `dev`
    /// names the device in them.
    pub fn parse(b: &[u8; SB_SIZE], dev: &str) -> Result<Superblock, Fail> {
        let le32 = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        if &b[..8] != SIGNATURE {
            return Err(Fail::usage(format!(
                "Device {dev} is not a valid VERITY device."
            )));
        }
        let version = le32(8);
        if version != 1 {
            return Err(Fail::usage(format!(
                "Unsupported VERITY version {version}."
            )));
        }
        let hash_type = le32(12);
        if hash_type > 1 {
            return Err(Fail::usage(format!(
                "Unsupported VERITY hash type {hash_type}."
            )));
        }
        let (dbs, hbs) = (le32(64), le32(68));
        if !block_size_ok(dbs.into()) || !block_size_ok(hbs.into()) {
            return Err(Fail::usage("Unsupported VERITY block size."));
        }
        let name_end = b[32..64].iter().position(|&c| c == 0).unwrap_or(32);
        let name = String::from_utf8_lossy(&b[32..32 + name_end]).to_ascii_lowercase();
        let alg = HashAlg::from_name(&name).ok_or_else(|| {
            Fail::usage(format!(
                "Hash algorithm {name} not supported (udm verifies sha1, sha256 and sha512)."
            ))
        })?;
        let salt_size = u16::from_le_bytes([b[80], b[81]]) as usize;
        if salt_size > 256 {
            return Err(Fail::usage("VERITY header corrupted."));
        }
        Ok(Superblock {
            hash_type,
            uuid: b[16..32].try_into().expect("16 bytes"),
            alg,
            data_block_size: dbs,
            hash_block_size: hbs,
            data_blocks: u64::from_le_bytes(b[72..80].try_into().expect("8 bytes")),
            salt: b[88..88 + salt_size].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let sb = Superblock {
            hash_type: 1,
            uuid: *uuid::Uuid::parse_str("12345678-1234-1234-1234-123456789abc")
                .unwrap()
                .as_bytes(),
            alg: HashAlg::Sha256,
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: 256,
            salt: vec![0, 0x11, 0x22, 0x33],
        };
        let b = sb.to_bytes();
        // The bytes veritysetup 2.6.1 wrote for these parameters.
        assert_eq!(&b[..16], b"verity\0\0\x01\0\0\0\x01\0\0\0");
        assert_eq!(
            &b[0x40..0x5c],
            b"\0\x10\0\0\0\x10\0\0\0\x01\0\0\0\0\0\0\x04\0\0\0\0\0\0\0\0\x11\x22\x33"
        );
        assert_eq!(Superblock::parse(&b, "h").unwrap(), sb);
        let mut bad = b;
        bad[0] = b'V';
        assert!(Superblock::parse(&bad, "h")
            .unwrap_err()
            .msg
            .contains("not a valid VERITY"));
        let mut bad = b;
        bad[64] = 1;
        assert_eq!(
            Superblock::parse(&bad, "h").unwrap_err().msg,
            "Unsupported VERITY block size."
        );
        let mut bad = b;
        bad[81] = 2;
        assert_eq!(
            Superblock::parse(&bad, "h").unwrap_err().msg,
            "VERITY header corrupted."
        );
    }
}
