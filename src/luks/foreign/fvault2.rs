//! FileVault2 volumes (cryptsetup's `fvault2` type): a Mac's Core Storage
//! physical volume holding one encrypted logical volume.
//!
//! The plaintext volume header carries half of an AES-XTS key (the other
//! half is the physical volume's UUID) that decrypts the metadata blocks;
//! those hold XML property lists with the PBKDF2 parameters, the key
//! encryption key wrapped (RFC 3394) under the passphrase's PBKDF2-SHA256,
//! the volume key wrapped under that, and the logical volume's place and
//! family UUID. The volume key is the unwrapped 16 bytes followed by the
//! first 16 bytes of SHA-256(key ‖ family UUID), used as AES-128-XTS
//! with plain64 sector numbers counted from the logical volume's start.
//! Every block carries a CRC-32C, checked before anything in it is used.

use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use base64::Engine;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::luks::cost::{CostLimit, SlotCost};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use crate::luks::kdf::Kdf;

#[cfg(feature = "fuzzing")]
pub mod fuzz;

const VOL_HEADER: usize = 512;
const MD_BLOCK: usize = 8192;
/// cryptsetup reads no metadata beyond the first GiB.
const MAX_OFF: u64 = 1 << 30;
const PWK_SIZE: usize = 284;
const KWVK_SIZE: usize = 256;

/// What the metadata says about the logical volume and its key.
pub struct Metadata {
    pub ph_vol_uuid: String,
    pub family_uuid: String,
    family_uuid_bin: [u8; 16],
    /// Byte offset and size of the encrypted logical volume.
    pub log_vol_off: u64,
    pub log_vol_size: u64,
    pub pbkdf2_iters: u32,
    /// The KDF cost udm accepts before trying a passphrase (`None`: the
    /// user's `--no-kdf-limit`); the iteration count is the header's, up
    /// to 2^32-1 (hours per attempt).
    pub cost_limit: Option<CostLimit>,
    pub pbkdf2_salt: [u8; 16],
    wrapped_kek: [u8; 24],
    wrapped_vk: [u8; 24],
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | (u64::from(le32(b, at + 4)) << 32)
}

/// CRC-32C (Castagnoli, reflected) from `seed`, without a final
/// inversion: Core Storage stores the register as it ends.
fn crc32c(seed: u32, data: &[u8]) -> u32 {
    // The crate keeps the register inverted between calls.
    !crc32c::crc32c_append(!seed, data)
}

/// A block starts with its checksum and the seed, which must be all ones.
fn crc_ok(block: &[u8]) -> bool {
    le32(block, 4) == 0xffff_ffff && crc32c(0xffff_ffff, &block[8..]) == le32(block, 0)
}

fn invalid(what: &str) -> LuksError {
    LuksError::field("FVAULT2 metadata", what, "invalid")
}

fn read_block(disk: &Disk, off: u64, len: usize) -> Result<Vec<u8>, LuksError> {
    if off > MAX_OFF {
        return Err(invalid("block offset (beyond the first GiB)"));
    }
    let mut b = vec![0u8; len];
    disk.read_at(off, &mut b)?;
    Ok(b)
}

/// The value of `<key>KEY</key><TYPE ...>VALUE</TYPE>` in a property list,
/// the first such place that has one.
fn plist_value<'a>(xml: &'a str, key: &str, ty: &str) -> Option<&'a str> {
    let head = format!("<key>{key}</key><{ty}");
    let close = format!("</{ty}>");
    let mut from = 0;
    while let Some(at) = xml[from..].find(&head) {
        let rest = &xml[from + at + head.len()..];
        from += at + 1;
        let Some(gt) = rest.find('>') else { continue };
        let value = &rest[gt + 1..];
        let end = value.find('<').unwrap_or(value.len());
        if end > 0 && value[end..].starts_with(&close) {
            return Some(&value[..end]);
        }
    }
    None
}

/// The XML text of a metadata block, from the offset and size at `at`.
fn block_xml(block: &[u8], at: usize) -> Result<String, LuksError> {
    let (off, size) = (le32(block, at) as usize, le32(block, at + 4) as usize);
    let bytes = block
        .get(off..off.saturating_add(size))
        .ok_or_else(|| invalid("XML offset or size"))?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

fn base64_field(xml: &str, key: &str, size: usize) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let text: String = plist_value(xml, key, "data")
        .ok_or_else(|| invalid(key))?
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let v = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| invalid(key))?,
    );
    if v.len() != size {
        return Err(invalid(key));
    }
    Ok(v)
}

/// `strtoull(s, NULL, 16)`: optional `0x`, then hex digits up to the
/// first other character.
fn hex_number(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    let digits: &str = &s[..s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len())];
    u64::from_str_radix(digits, 16).ok()
}

/// Block 0x0019's PBKDF2 parameters and wrapped keys.
struct Keys {
    iters: u32,
    salt: [u8; 16],
    kek: [u8; 24],
    vk: [u8; 24],
}

/// What the encrypted metadata blocks give; each part is found once.
#[derive(Default)]
struct Found {
    keys: Option<Keys>,
    volume: Option<(u64, uuid::Uuid)>,
    log_vol_blkoff: Option<u32>,
}

impl Found {
    /// Block 0x0019: the PBKDF2 parameters and the two wrapped keys.
    fn keys(&mut self, block: &[u8]) -> Result<(), LuksError> {
        let xml = block_xml(block, 112)?;
        let pwk = base64_field(&xml, "PassphraseWrappedKEKStruct", PWK_SIZE)?;
        let kwvk = base64_field(&xml, "KEKWrappedVolumeKeyStruct", KWVK_SIZE)?;
        let mut k = Keys {
            iters: le32(&pwk, 168),
            salt: [0u8; 16],
            kek: [0u8; 24],
            vk: [0u8; 24],
        };
        k.salt.copy_from_slice(&pwk[8..24]);
        k.kek.copy_from_slice(&pwk[32..56]);
        k.vk.copy_from_slice(&kwvk[8..32]);
        self.keys = Some(k);
        Ok(())
    }

    /// Block 0x001a: the logical volume's size and family UUID.
    fn volume(&mut self, block: &[u8]) -> Result<(), LuksError> {
        let xml = block_xml(block, 128)?;
        let size = plist_value(&xml, "com.apple.corestorage.lv.size", "integer")
            .and_then(hex_number)
            .filter(|&n| n != 0 && n != u64::MAX)
            .ok_or_else(|| invalid("com.apple.corestorage.lv.size"))?;
        let family = plist_value(&xml, "com.apple.corestorage.lv.familyUUID", "string")
            .filter(|s| s.len() == 36)
            .and_then(|s| uuid::Uuid::try_parse(s).ok())
            .ok_or_else(|| invalid("com.apple.corestorage.lv.familyUUID"))?;
        self.volume = Some((size, family));
        Ok(())
    }
}

/// What the plaintext volume header gives.
struct VolHeader {
    block_size: u64,
    /// The disk label's block number.
    label: u64,
    uuid: uuid::Uuid,
    /// The AES-XTS key of the encrypted metadata.
    key: Zeroizing<[u8; 32]>,
}

/// The volume header, checked.
fn volume_header(disk: &Disk) -> Result<VolHeader, LuksError> {
    let h = Zeroizing::new(read_block(disk, 0, VOL_HEADER)?);
    if !crc_ok(&h) || &h[88..90] != b"CS" || le32(&h, 168) != 16 {
        return Err(LuksError::Usage("not a Core Storage volume".into()));
    }
    if le16(&h, 8) != 1 {
        return Err(LuksError::Unsupported(format!(
            "Unsupported FVAULT2 version {}.",
            le16(&h, 8)
        )));
    }
    let mut key = Zeroizing::new([0u8; 32]);
    key[..16].copy_from_slice(&h[176..192]);
    key[16..].copy_from_slice(&h[304..320]);
    let uuid = uuid::Uuid::from_slice(&h[304..320]).map_err(|_| invalid("physical volume UUID"))?;
    Ok(VolHeader {
        block_size: u64::from(le32(&h, 96)),
        label: le64(&h, 104),
        uuid,
        key,
    })
}

/// AES-128-XTS decryption of one whole block as a single data unit.
fn xts_decrypt(key: &[u8; 32], unit: u64, data: &mut [u8]) -> Option<()> {
    let k1 = aes::Aes128::new_from_slice(&key[..16]).ok()?;
    let k2 = aes::Aes128::new_from_slice(&key[16..]).ok()?;
    let mut t = Array::from([0u8; 16]);
    t[..8].copy_from_slice(&unit.to_le_bytes());
    k2.encrypt_block(&mut t);
    let mut tweak = u128::from_le_bytes(t.into());
    for b in data.chunks_exact_mut(16) {
        let tb = tweak.to_le_bytes();
        let mut blk = Array::from([0u8; 16]);
        for i in 0..16 {
            blk[i] = b[i] ^ tb[i];
        }
        k1.decrypt_block(&mut blk);
        for i in 0..16 {
            b[i] = blk[i] ^ tb[i];
        }
        let carry = (tweak >> 127) as u8;
        tweak = (tweak << 1) ^ u128::from(carry * 0x87);
    }
    Some(())
}

/// The encrypted metadata's place (block offset, block count) from the
/// disk label and its volume groups descriptor.
fn disk_label(disk: &Disk, block_size: u64, blkoff: u64) -> Result<(u64, u64), LuksError> {
    let off = blkoff
        .checked_mul(block_size)
        .ok_or_else(|| invalid("disk label offset"))?;
    let label = read_block(disk, off, MD_BLOCK)?;
    if !crc_ok(&label) {
        return Err(invalid("disk label checksum"));
    }
    let desc = read_block(disk, off + u64::from(le32(&label, 220)), 40)?;
    Ok((le64(&desc, 32), le64(&desc, 8)))
}

/// Read and check the metadata (cryptsetup's `FVAULT2_read_metadata`).
pub fn read(disk: &Disk) -> Result<Metadata, LuksError> {
    let VolHeader {
        block_size,
        label,
        uuid: ph_uuid,
        key,
    } = volume_header(disk)?;
    let (start, count) = disk_label(disk, block_size, label)?;
    let start = start
        .checked_mul(block_size)
        .filter(|&o| o <= MAX_OFF)
        .ok_or_else(|| invalid("encrypted metadata offset"))?;
    let mut found = Found::default();
    let mut block = Zeroizing::new(vec![0u8; MD_BLOCK]);
    for i in 0..count {
        block.copy_from_slice(&read_block(disk, start + i * MD_BLOCK as u64, MD_BLOCK)?);
        if block.iter().all(|&b| b == 0) {
            break;
        }
        xts_decrypt(&key, i, &mut block).ok_or_else(|| invalid("metadata key"))?;
        if !crc_ok(&block) {
            return Err(invalid("encrypted metadata block checksum"));
        }
        match le16(&block, 10) {
            0x0019 => found.keys(&block)?,
            0x001a => found.volume(&block)?,
            0x0305 => found.log_vol_blkoff = Some(le32(&block, 104)),
            _ => {}
        }
    }
    let missing = || invalid("encrypted metadata (a needed block is missing)");
    let keys = found.keys.ok_or_else(missing)?;
    let (size, family) = found.volume.ok_or_else(missing)?;
    let blkoff = found.log_vol_blkoff.ok_or_else(missing)?;
    Ok(Metadata {
        ph_vol_uuid: ph_uuid.hyphenated().to_string(),
        family_uuid: family.hyphenated().to_string(),
        family_uuid_bin: *family.as_bytes(),
        log_vol_off: u64::from(blkoff)
            .checked_mul(block_size)
            .ok_or_else(|| invalid("logical volume offset"))?,
        log_vol_size: size,
        pbkdf2_iters: keys.iters,
        cost_limit: Some(CostLimit::default()),
        pbkdf2_salt: keys.salt,
        wrapped_kek: keys.kek,
        wrapped_vk: keys.vk,
    })
}

/// RFC 3394 key unwrap of a 128-bit key under a 128-bit key; None when
/// the integrity value does not come out (a wrong passphrase).
fn unwrap(kek: &[u8], wrapped: &[u8; 24]) -> Option<Zeroizing<[u8; 16]>> {
    let c = aes::Aes128::new_from_slice(kek).ok()?;
    let mut a = u64::from_be_bytes(wrapped[..8].try_into().ok()?);
    let mut r = Zeroizing::new([[0u8; 8]; 2]);
    r[0].copy_from_slice(&wrapped[8..16]);
    r[1].copy_from_slice(&wrapped[16..24]);
    for j in (0..6u64).rev() {
        for i in (0..2usize).rev() {
            let t = j * 2 + i as u64 + 1;
            let mut b = Zeroizing::new(Array::from([0u8; 16]));
            b[..8].copy_from_slice(&(a ^ t).to_be_bytes());
            b[8..].copy_from_slice(&r[i]);
            c.decrypt_block(&mut b);
            a = u64::from_be_bytes(b[..8].try_into().ok()?);
            r[i].copy_from_slice(&b[8..]);
        }
    }
    if a != 0xA6A6_A6A6_A6A6_A6A6 {
        return None;
    }
    let mut out = Zeroizing::new([0u8; 16]);
    out[..8].copy_from_slice(&r[0]);
    out[8..].copy_from_slice(&r[1]);
    Some(out)
}

impl std::fmt::Debug for Metadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("fvault2::Metadata")
            .field("ph_vol_uuid", &self.ph_vol_uuid)
            .field("family_uuid", &self.family_uuid)
            .field("log_vol_off", &self.log_vol_off)
            .field("log_vol_size", &self.log_vol_size)
            .finish_non_exhaustive()
    }
}

impl Metadata {
    /// Refuse before any passphrase is tried if the header's PBKDF2
    /// iterations are above the limit LUKS keyslots get.
    pub fn check_cost(&self) -> Result<(), LuksError> {
        let Some(limit) = &self.cost_limit else {
            return Ok(());
        };
        let slot = SlotCost {
            slot: 0,
            kdf: Kdf::Pbkdf2 {
                hash: HashAlg::Sha256,
                iterations: self.pbkdf2_iters,
            },
            digest: None,
            key_len: 16,
            digest_len: 0,
        };
        limit.check_foreign("FVAULT2 passphrase key (keyslot 0)", &[slot])
    }

    /// The 32-byte AES-XTS volume key from `pass`.
    pub fn volume_key(&self, pass: &[u8]) -> Result<Zeroizing<[u8; 32]>, LuksError> {
        self.check_cost()?;
        let mut pk = Zeroizing::new([0u8; 16]);
        pbkdf2::pbkdf2_hmac::<Sha256>(pass, &self.pbkdf2_salt, self.pbkdf2_iters, &mut pk[..]);
        let kek = unwrap(&pk[..], &self.wrapped_kek).ok_or(LuksError::WrongPassphrase)?;
        let vk = unwrap(&kek[..], &self.wrapped_vk).ok_or(LuksError::WrongPassphrase)?;
        let mut key = Zeroizing::new([0u8; 32]);
        key[..16].copy_from_slice(&vk[..]);
        let mut h = Sha256::new();
        h.update(&vk[..]);
        h.update(self.family_uuid_bin);
        key[16..].copy_from_slice(&h.finalize()[..16]);
        Ok(key)
    }

    /// `fvault2Dump`'s text, as cryptsetup 2.6.1 prints it.
    pub fn dump_text(&self, device: &str) -> String {
        let salt: String = self
            .pbkdf2_salt
            .iter()
            .map(|b| format!("{b:02x} "))
            .collect();
        format!(
            "Header information for FVAULT2 device {device}.\n\
             Physical volume UUID: \t{}\n\
             Family UUID:          \t{}\n\
             Logical volume offset:\t{} [bytes]\n\
             Logical volume size:  \t{} [bytes]\n\
             Cipher:               \taes\n\
             Cipher mode:          \txts-plain64\n\
             PBKDF2 iterations:    \t{}\n\
             PBKDF2 salt:          \t{salt}\n",
            self.ph_vol_uuid,
            self.family_uuid,
            self.log_vol_off,
            self.log_vol_size,
            self.pbkdf2_iters
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 3394 section 4.1: 128-bit key data wrapped with a 128-bit KEK.
    #[test]
    fn unwrap_rfc3394() {
        let kek = hex::decode("000102030405060708090A0B0C0D0E0F").unwrap();
        let w: [u8; 24] = hex::decode("1FA68B0A8112B447AEF34BD8FB5A7B829D3E862371D2CFE5")
            .unwrap()
            .try_into()
            .unwrap();
        let k = unwrap(&kek, &w).unwrap();
        assert_eq!(hex::encode(&k[..]), "00112233445566778899aabbccddeeff");
        let mut bad = w;
        bad[23] ^= 1;
        assert!(unwrap(&kek, &bad).is_none());
    }

    /// CRC-32C's check value is 0xe3069283 with the final inversion.
    #[test]
    fn crc32c_check_value() {
        assert_eq!(!crc32c(!0, b"123456789"), 0xe306_9283);
    }

    /// IEEE 1619's XTS-AES-128 vector 2 (unit 0x3333333333, 32 bytes).
    #[test]
    fn xts_ieee1619() {
        let mut key = [0u8; 32];
        key[..16].fill(0x11);
        key[16..].fill(0x22);
        let mut d = hex::decode("c454185e6a16936e39334038acef838bfb186fff7480adc4289382ecd6d394f0")
            .unwrap();
        xts_decrypt(&key, 0x33_3333_3333, &mut d).unwrap();
        assert_eq!(d, [0x44u8; 32]);
    }

    #[test]
    fn plist_values_and_numbers() {
        let x = "<key>a</key><integer size=\"64\">0xa000000</integer>\
                 <key>b</key><string></string><key>b</key><string>v</string>";
        assert_eq!(plist_value(x, "a", "integer"), Some("0xa000000"));
        assert_eq!(plist_value(x, "b", "string"), Some("v"));
        assert_eq!(plist_value(x, "c", "string"), None);
        assert_eq!(hex_number("0xa000000"), Some(0xa00_0000));
        assert_eq!(hex_number("ff zz"), Some(255));
        assert_eq!(hex_number("zz"), None);
    }
}
