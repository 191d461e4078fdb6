//! The LUKS1 header: 1024 bytes at the start of the metadata device with eight
//! fixed keyslots. Parsing checks every field before anything uses it; writing
//! keeps the bytes udm does not interpret (padding) as they were.

use super::af::STRIPES;
use super::error::LuksError;
use super::hash::HashAlg;
use crate::protocol::be;

pub const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
/// Bytes cryptsetup reads and writes for a LUKS1 header.
pub const HEADER_LEN: usize = 1024;
/// Bytes of the header that carry fields (the rest is padding).
pub const PHDR_LEN: u64 = 592;
pub const NUM_SLOTS: usize = 8;
pub const SLOT_ENABLED: u32 = 0x00AC_71F3;
pub const SLOT_DISABLED: u32 = 0x0000_DEAD;
/// Largest volume key udm accepts (bytes).
pub const MAX_KEY_BYTES: u32 = 512;

/// One LUKS1 key slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub active: bool,
    pub iterations: u32,
    pub salt: [u8; 32],
    /// Key material offset in 512-byte sectors.
    pub key_offset: u32,
    pub stripes: u32,
}

/// A parsed, validated LUKS1 header.
#[derive(Clone, Debug)]
pub struct Header {
    raw: [u8; HEADER_LEN],
    pub cipher_name: String,
    pub cipher_mode: String,
    pub hash: HashAlg,
    /// Data start, 512-byte sectors.
    pub payload_offset: u32,
    pub key_bytes: u32,
    pub mk_digest: [u8; 20],
    pub mk_digest_salt: [u8; 32],
    pub mk_digest_iter: u32,
    pub uuid: String,
    pub slots: [Slot; NUM_SLOTS],
}

/// A big-endian header field through the shared codec: a buffer too short
/// for it is an error naming the offset, not a panic.
pub(crate) fn be32(b: &[u8], off: usize) -> Result<u32, LuksError> {
    be::u32_at(b, off).ok_or_else(|| {
        LuksError::field(
            format!("header bytes {off}..{}", off + 4),
            b.len(),
            "past the end of the header",
        )
    })
}

/// A NUL-terminated string field of `len` bytes at `off`.
pub(crate) fn cstr(b: &[u8], off: usize, len: usize, field: &str) -> Result<String, LuksError> {
    let f = &b[off..off + len];
    let end = f
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| LuksError::field(field, String::from_utf8_lossy(f), "not NUL-terminated"))?;
    let s = std::str::from_utf8(&f[..end]).map_err(|_| {
        LuksError::field(field, String::from_utf8_lossy(&f[..end]), "not valid UTF-8")
    })?;
    if s.chars().any(|c| c.is_control()) {
        return Err(LuksError::field(
            field,
            s.escape_debug(),
            "contains control characters",
        ));
    }
    Ok(s.to_string())
}

pub(crate) fn put_cstr(b: &mut [u8], off: usize, len: usize, s: &str) {
    let f = &mut b[off..off + len];
    f.fill(0);
    let n = s.len().min(len - 1);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Sectors of key material for a key of `key_bytes` (AF-split, 512-byte padded).
pub fn area_sectors(key_bytes: u32) -> u64 {
    (u64::from(key_bytes) * u64::from(STRIPES)).div_ceil(512)
}

impl Header {
    /// True if `buf` starts with the LUKS magic and version 1.
    pub fn is_luks1(buf: &[u8]) -> bool {
        buf.len() >= 8 && buf[..6] == MAGIC && buf[6..8] == [0, 1]
    }

    /// Parse and validate; `device_size` is the metadata device's size in bytes.
    pub fn parse(buf: &[u8], device_size: u64) -> Result<Header, LuksError> {
        if buf.len() < HEADER_LEN {
            return Err(LuksError::field(
                "header",
                buf.len(),
                "shorter than 1024 bytes",
            ));
        }
        if buf[..6] != MAGIC {
            return Err(LuksError::field(
                "magic",
                hex::encode(&buf[..6]),
                "not LUKS",
            ));
        }
        let version = u16::from_be_bytes([buf[6], buf[7]]);
        if version != 1 {
            return Err(LuksError::field("version", version, "expected 1"));
        }
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(&buf[..HEADER_LEN]);
        let cipher_name = cstr(&raw, 8, 32, "cipher-name")?;
        let cipher_mode = cstr(&raw, 40, 32, "cipher-mode")?;
        let hash_name = cstr(&raw, 72, 32, "hash-spec")?;
        let hash = HashAlg::from_name(&hash_name).ok_or_else(|| {
            LuksError::field(
                "hash-spec",
                &hash_name,
                "unsupported hash (sha1, sha224, sha256, sha384, sha512)",
            )
        })?;
        if cipher_name.is_empty() || cipher_name.contains('-') {
            return Err(LuksError::field(
                "cipher-name",
                &cipher_name,
                "must be a cipher name without '-'",
            ));
        }
        if cipher_mode.is_empty() {
            return Err(LuksError::field("cipher-mode", "", "empty"));
        }
        let payload_offset = be32(&raw, 104)?;
        let key_bytes = be32(&raw, 108)?;
        if key_bytes == 0 || key_bytes > MAX_KEY_BYTES {
            return Err(LuksError::field(
                "key-bytes",
                key_bytes,
                format!("must be 1..{MAX_KEY_BYTES}"),
            ));
        }
        let mut mk_digest = [0u8; 20];
        mk_digest.copy_from_slice(&raw[112..132]);
        let mut mk_digest_salt = [0u8; 32];
        mk_digest_salt.copy_from_slice(&raw[132..164]);
        let mk_digest_iter = be32(&raw, 164)?;
        if mk_digest_iter == 0 || mk_digest_iter > super::kdf::MAX_PBKDF2_ITERATIONS {
            return Err(LuksError::field(
                "mk-digest-iter",
                mk_digest_iter,
                "out of range",
            ));
        }
        let uuid = cstr(&raw, 168, 40, "uuid")?;
        let mut slots: [Slot; NUM_SLOTS] = std::array::from_fn(|_| Slot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            key_offset: 0,
            stripes: 0,
        });
        let area = area_sectors(key_bytes);
        let mut areas: Vec<(u64, u64, usize)> = Vec::with_capacity(NUM_SLOTS);
        for (i, slot) in slots.iter_mut().enumerate() {
            let b = 208 + 48 * i;
            let state = be32(&raw, b)?;
            // As cryptsetup: only the enabled magic makes a slot active;
            // any other value is an empty slot (kept as it is on rewrite).
            let active = state == SLOT_ENABLED;
            slot.active = active;
            slot.iterations = be32(&raw, b + 4)?;
            slot.salt.copy_from_slice(&raw[b + 8..b + 40]);
            slot.key_offset = be32(&raw, b + 40)?;
            slot.stripes = be32(&raw, b + 44)?;
            if slot.stripes != STRIPES {
                return Err(LuksError::field(
                    format!("key-slot[{i}].stripes"),
                    slot.stripes,
                    "must be 4000",
                ));
            }
            let start = u64::from(slot.key_offset);
            if start * 512 < PHDR_LEN {
                return Err(LuksError::field(
                    format!("key-slot[{i}].key-material-offset"),
                    start,
                    "overlaps the header",
                ));
            }
            if payload_offset != 0 && start + area > u64::from(payload_offset) {
                return Err(LuksError::field(
                    format!("key-slot[{i}].key-material-offset"),
                    start,
                    format!("key material (+{area} sectors) overlaps the payload at sector {payload_offset}"),
                ));
            }
            if active
                && (slot.iterations == 0 || slot.iterations > super::kdf::MAX_PBKDF2_ITERATIONS)
            {
                return Err(LuksError::field(
                    format!("key-slot[{i}].iterations"),
                    slot.iterations,
                    "out of range",
                ));
            }
            areas.push((start, start + area, i));
        }
        areas.sort_unstable();
        for w in areas.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(LuksError::field(
                    format!("key-slot[{}].key-material-offset", w[1].2),
                    w[1].0,
                    format!("overlaps key-slot[{}]", w[0].2),
                ));
            }
        }
        if let Some(last) = areas.last() {
            if last.1 * 512 > device_size {
                return Err(LuksError::field(
                    format!("key-slot[{}].key-material-offset", last.2),
                    last.0,
                    format!("key material ends beyond the device ({device_size} bytes)"),
                ));
            }
        }
        Ok(Header {
            raw,
            cipher_name,
            cipher_mode,
            hash,
            payload_offset,
            key_bytes,
            mk_digest,
            mk_digest_salt,
            mk_digest_iter,
            uuid,
            slots,
        })
    }

    /// The dm-crypt cipher spec (`aes-xts-plain64`).
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }

    /// Serialize, keeping padding bytes from the parsed header.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = self.raw;
        b[..6].copy_from_slice(&MAGIC);
        b[6..8].copy_from_slice(&1u16.to_be_bytes());
        put_cstr(&mut b, 8, 32, &self.cipher_name);
        put_cstr(&mut b, 40, 32, &self.cipher_mode);
        put_cstr(&mut b, 72, 32, self.hash.name());
        b[104..108].copy_from_slice(&self.payload_offset.to_be_bytes());
        b[108..112].copy_from_slice(&self.key_bytes.to_be_bytes());
        b[112..132].copy_from_slice(&self.mk_digest);
        b[132..164].copy_from_slice(&self.mk_digest_salt);
        b[164..168].copy_from_slice(&self.mk_digest_iter.to_be_bytes());
        put_cstr(&mut b, 168, 40, &self.uuid);
        for (i, s) in self.slots.iter().enumerate() {
            let o = 208 + 48 * i;
            let was = be::u32_at(&b, o).unwrap_or(0);
            let state = if s.active {
                SLOT_ENABLED
            } else if was != SLOT_ENABLED && was != 0 {
                was
            } else {
                SLOT_DISABLED
            };
            b[o..o + 4].copy_from_slice(&state.to_be_bytes());
            b[o + 4..o + 8].copy_from_slice(&s.iterations.to_be_bytes());
            b[o + 8..o + 40].copy_from_slice(&s.salt);
            b[o + 40..o + 44].copy_from_slice(&s.key_offset.to_be_bytes());
            b[o + 44..o + 48].copy_from_slice(&s.stripes.to_be_bytes());
        }
        b
    }

    /// A fresh header (all slots disabled) for format.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cipher_name: &str,
        cipher_mode: &str,
        hash: HashAlg,
        payload_offset: u32,
        key_bytes: u32,
        mk_digest: [u8; 20],
        mk_digest_salt: [u8; 32],
        mk_digest_iter: u32,
        uuid: &str,
    ) -> Header {
        let area = area_sectors(key_bytes).div_ceil(8) * 8;
        let slots = std::array::from_fn(|i| Slot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            key_offset: (8 + area * i as u64) as u32,
            stripes: STRIPES,
        });
        Header {
            raw: [0u8; HEADER_LEN],
            cipher_name: cipher_name.into(),
            cipher_mode: cipher_mode.into(),
            hash,
            payload_offset,
            key_bytes,
            mk_digest,
            mk_digest_salt,
            mk_digest_iter,
            uuid: uuid.into(),
            slots,
        }
    }

    /// End of the last key material area, in 512-byte sectors.
    pub fn areas_end(&self) -> u64 {
        let a = area_sectors(self.key_bytes);
        self.slots
            .iter()
            .map(|s| u64::from(s.key_offset) + a)
            .max()
            .unwrap_or(8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> [u8; HEADER_LEN] {
        Header::new(
            "aes",
            "xts-plain64",
            HashAlg::Sha256,
            4096,
            64,
            [1; 20],
            [2; 32],
            1000,
            "u-u-i-d",
        )
        .to_bytes()
    }

    #[test]
    fn round_trip_and_standard_layout() {
        let b = sample();
        let h = Header::parse(&b, 4096 * 512).unwrap();
        assert_eq!(h.cipher_spec(), "aes-xts-plain64");
        let offs: Vec<u32> = h.slots.iter().map(|s| s.key_offset).collect();
        assert_eq!(offs, vec![8, 512, 1016, 1520, 2024, 2528, 3032, 3536]);
        assert_eq!(h.areas_end(), 4036);
        assert_eq!(h.to_bytes(), b);
    }

    #[test]
    fn rejects_bad_fields_by_name() {
        let mut b = sample();
        b[208 + 48 * 3 + 44..208 + 48 * 3 + 48].copy_from_slice(&3999u32.to_be_bytes());
        let e = Header::parse(&b, 1 << 30).unwrap_err().to_string();
        assert!(
            e.contains("key-slot[3].stripes") && e.contains("3999"),
            "{e}"
        );

        let mut b = sample();
        b[208 + 48 + 40..208 + 48 + 44].copy_from_slice(&100u32.to_be_bytes());
        let e = Header::parse(&b, 1 << 30).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");

        let mut b = sample();
        b[72..104].fill(b'x');
        assert!(Header::parse(&b, 1 << 30)
            .unwrap_err()
            .to_string()
            .contains("hash-spec"));

        let b = sample();
        assert!(Header::parse(&b, 1000 * 512)
            .unwrap_err()
            .to_string()
            .contains("beyond the device"));

        let mut b = sample();
        b[108..112].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Header::parse(&b, 1 << 30)
            .unwrap_err()
            .to_string()
            .contains("key-bytes"));
    }
}
