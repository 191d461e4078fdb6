//! Creating LUKS1 and LUKS2 headers with cryptsetup 2.6's layout: LUKS1
//! keyslot areas 4 KiB-aligned from sector 8 and data at the next 1 MiB;
//! LUKS2 two 16 KiB header copies, keyslots area up to 16 MiB and data at
//! 16 MiB. The header is written first without keyslots, then keyslot 0 is
//! added through the same path as `add-key`.

use super::disk::Disk;
use super::error::LuksError;
use super::feedback::Feedback;
use super::hash::HashAlg;
use super::json::{b64_encode, Metadata};
use super::kdf::Kdf;
use super::keyslot;
use super::volume::{Header, Volume};

pub use super::integrity::integrity_tag_size;
use super::{luks1, luks2};
use serde_json::json;
use std::path::Path;
use zeroize::Zeroizing;

const MIB: u64 = 1 << 20;

/// Everything `format` needs, already resolved (KDF costs calibrated).
#[derive(Clone, Debug)]
pub struct FormatParams {
    /// 1 or 2.
    pub version: u8,
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64`.
    pub cipher: String,
    pub key_bytes: u32,
    /// None: 4096 when the data area allows it (LUKS2), else 512.
    pub sector_size: Option<u32>,
    pub kdf: Kdf,
    pub digest_iterations: u32,
    /// LUKS1 hash-spec; LUKS2 AF/digest hash.
    pub hash: HashAlg,
    pub label: String,
    pub uuid: Option<String>,
    /// LUKS2 per-copy header size (binary + JSON).
    pub metadata_size: u64,
    pub keyslots_size: Option<u64>,
    /// LUKS2 subsystem (second label).
    pub subsystem: String,
    /// Data start in bytes (`--offset`); None: after the metadata, aligned.
    pub data_offset: Option<u64>,
    /// Alignment of the data start in bytes (`--align-payload`; 1 MiB).
    pub align: Option<u64>,
    /// Keyslot for the first passphrase (`--key-slot`; 0).
    pub key_slot: Option<u32>,
    /// LUKS2 authenticated encryption: the segment's `integrity.type`
    /// (`hmac(sha256)`, `aead`, `poly1305`; see [`integrity_mode`]).
    /// `key_bytes` then includes the integrity key.
    pub integrity: Option<String>,
}

/// cryptsetup's `--integrity` word as the segment's `integrity.type` and
/// the bytes of integrity key it adds to the volume key
/// (`crypt_parse_integrity_mode`).
pub fn integrity_mode(word: &str) -> Result<(&'static str, u32), LuksError> {
    Ok(match word {
        "aead" => ("aead", 0),
        "poly1305" => ("poly1305", 0),
        "hmac-sha256" => ("hmac(sha256)", 32),
        "hmac-sha512" => ("hmac(sha512)", 64),
        _ => {
            return Err(LuksError::Usage(format!(
                "No known integrity specification pattern detected ('{word}'; udm supports \
                 aead, poly1305, hmac-sha256, hmac-sha512)."
            )))
        }
    })
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            version: 2,
            cipher: "aes-xts-plain64".into(),
            key_bytes: 64,
            sector_size: None,
            kdf: Kdf::Argon2 {
                kind: super::kdf::Argon2Kind::Id,
                time: 4,
                memory_kib: 1024 * 1024,
                cpus: 4,
            },
            digest_iterations: 1000,
            hash: HashAlg::Sha256,
            label: String::new(),
            uuid: None,
            metadata_size: 16 * 1024,
            keyslots_size: None,
            subsystem: String::new(),
            data_offset: None,
            align: None,
            key_slot: None,
            integrity: None,
        }
    }
}

/// A random (version 4) UUID in text form.
pub fn random_uuid() -> Result<String, LuksError> {
    let mut b = [0u8; 16];
    b.copy_from_slice(&keyslot::random(16)?);
    let u = uuid::Builder::from_random_bytes(b).into_uuid();
    b.fill(0);
    Ok(u.hyphenated().to_string())
}

/// A UUID as libuuid's `uuid_parse` takes it (and so cryptsetup): the
/// 36-character hyphenated form only, any case; kept as given.
pub fn check_uuid(u: &str) -> Result<(), LuksError> {
    if u.len() == 36 && uuid::Uuid::try_parse(u).is_ok() {
        Ok(())
    } else {
        Err(LuksError::Usage(format!(
            "Wrong LUKS UUID format provided: {u}"
        )))
    }
}

/// Below this keyslots area libcryptsetup warns that few keyslots fit: 4 MiB
/// less two 16 KiB headers (whatever the metadata size).
const VERY_SMALL_KEYSLOTS: u64 = 4 * MIB - 2 * 0x4000;

/// Sizes a format will use: (data offset bytes, metadata bytes, keyslots_size).
pub fn layout(p: &FormatParams, detached: bool) -> Result<(u64, u64, u64), LuksError> {
    if p.version == 1 {
        let area = luks1::area_sectors(p.key_bytes).div_ceil(8) * 8;
        let end = 8 + 8 * area;
        let align = (p.align.unwrap_or(MIB) / 512).max(1);
        let payload = match p.data_offset {
            Some(o) => {
                if o % 512 != 0 || (o != 0 && o / 512 < end) || (o == 0 && !detached) {
                    return Err(LuksError::Usage(format!(
                        "Requested data offset {o} bytes overlaps the LUKS1 header and keyslots \
                         (which end at {} bytes).",
                        end * 512
                    )));
                }
                o / 512
            }
            None if detached => 0,
            None => end.div_ceil(align) * align,
        };
        let meta = if detached {
            (end * 512).div_ceil(4096) * 4096
        } else {
            payload * 512
        };
        return Ok((payload * 512, meta, 0));
    }
    let hdr = p.metadata_size;
    if !luks2::HDR_SIZES.contains(&hdr) {
        return Err(LuksError::Usage(format!(
            "Unsupported LUKS2 metadata size {hdr} (16 KiB .. 4 MiB, a power of two)."
        )));
    }
    // libcryptsetup's order (LUKS2_generate_hdr): without a size, the
    // keyslots fill the space up to a requested data offset (also with a
    // detached header, whose areas could go back on the device); a size,
    // given or default, that does not fit below the offset shrinks to fit
    // (format() says so, as cryptsetup does).
    let offset = p.data_offset.filter(|&o| o != 0);
    if let Some(k) = p.keyslots_size {
        if k % 4096 != 0 || k == 0 || k > super::json::MAX_KEYSLOTS_SIZE {
            return Err(LuksError::Usage(format!(
                "Unsupported LUKS2 keyslots size {k} (a multiple of 4096, at most 128 MiB)."
            )));
        }
    }
    let mut ks = match (p.keyslots_size, offset) {
        (Some(k), _) => k,
        (None, Some(o)) => {
            (o.saturating_sub(2 * hdr) / 4096 * 4096).min(super::json::MAX_KEYSLOTS_SIZE)
        }
        (None, None) => (16 * MIB).saturating_sub(2 * hdr),
    };
    if let Some(o) = offset {
        if 2 * hdr + ks > o {
            ks = o.saturating_sub(2 * hdr) / 4096 * 4096;
        }
    }
    let meta = 2 * hdr + ks;
    let align = p.align.unwrap_or(MIB).max(512);
    let data = match p.data_offset {
        Some(o) => {
            if o % 512 != 0 || (!detached && o < meta) || ks < 4096 {
                return Err(LuksError::Usage(format!(
                    "Requested data offset {o} bytes is too small for the LUKS2 metadata \
                     ({} bytes).",
                    meta.max(2 * hdr + 4096)
                )));
            }
            o
        }
        None if detached => 0,
        None => meta.div_ceil(align) * align,
    };
    Ok((data, meta, ks))
}

/// Format `image` (header inside, or in the detached `header` file) and add
/// a keyslot (0 unless `p.key_slot`) for `passphrase`, with `volume_key`
/// or a new random one. Returns the volume key and the keyslot.
///
/// A regular file too small for any data is formatted anyway, grown to
/// hold the metadata, with a warning (as cryptsetup does); a block device
/// too small for the metadata is refused.
pub fn format(
    image: &Path,
    header: Option<&Path>,
    p: &FormatParams,
    passphrase: &[u8],
    volume_key: Option<&[u8]>,
    fb: &dyn Feedback,
) -> Result<(Zeroizing<Vec<u8>>, u32), LuksError> {
    let detached = header.is_some();
    let (data_off, meta_len, ks_size) = check_params(p, detached, volume_key, fb)?;
    let data_size = data_size_for(image, p, detached, (data_off, meta_len), fb)?;
    let mut meta = match header {
        Some(h) => {
            let d = Disk::create(h)?;
            d.grow_to(meta_len)?;
            d
        }
        None => Disk::open(image, true)?,
    };
    let key = match volume_key {
        Some(k) => Zeroizing::new(k.to_vec()),
        None => keyslot::random(p.key_bytes as usize)?,
    };
    let uuid = match &p.uuid {
        Some(u) => u.clone(),
        None => random_uuid()?,
    };
    fb.begin("Wiping header area", meta_len);
    meta.zero(0, meta_len, &mut |done| fb.advance(done))?;
    fb.end();
    let digest_salt = keyslot::random(32)?;
    let fresh = Fresh {
        p,
        key: &key,
        digest_salt: &digest_salt,
        uuid,
        data_off,
    };
    let hdr = if p.version == 1 {
        fresh.luks1(meta_len, &mut meta)?
    } else {
        let sector = sector_size(p, data_size, data_off)?;
        if let Some(kind) = p.integrity.as_deref().filter(|_| data_size > data_off) {
            // cryptsetup clears the first 8 sectors of the data area, where
            // the dm-integrity superblock goes, then has the kernel format
            // the integrity device there.
            let len = 4096.min(data_size - data_off);
            Disk::open(image, true)?.zero(data_off, len, &mut |_| {})?;
            let tag = integrity_tag_size(kind, &p.cipher);
            super::integrity::Layer::format(image, kind, tag, sector, data_off)?;
        }
        fresh.luks2(ks_size, sector, &mut meta)?
    };
    let mut vol = Volume {
        meta,
        data_path: image.to_path_buf(),
        data_size,
        detached,
        header: hdr,
        cost_limit: None,
        // The cipher is the one the user just chose.
        allow_weak_cipher: true,
    };
    let slot = vol.add_key(
        &key,
        passphrase,
        Some(p.key_slot.unwrap_or(0)),
        p.kdf,
        p.hash,
    )?;
    Ok((key, slot))
}

/// The parameters checked, in libcryptsetup's order (with its notes on
/// the keyslots area), and the layout: (data offset, metadata length,
/// keyslots area size) in bytes.
fn check_params(
    p: &FormatParams,
    detached: bool,
    volume_key: Option<&[u8]>,
    fb: &dyn Feedback,
) -> Result<(u64, u64, u64), LuksError> {
    if p.key_bytes == 0 || p.key_bytes > luks1::MAX_KEY_BYTES {
        return Err(LuksError::Usage(format!(
            "Invalid key size {} bits.",
            p.key_bytes * 8
        )));
    }
    if let Some(u) = &p.uuid {
        check_uuid(u)?;
    }
    if p.label.len() >= 48 {
        return Err(LuksError::Usage(
            "Label is too long (at most 47 bytes).".into(),
        ));
    }
    p.kdf.check("--pbkdf")?;
    let (data_off, meta_len, ks_size) = layout(p, detached)?;
    if p.version == 2 {
        // libcryptsetup's two notes, in its order.
        if ks_size < VERY_SMALL_KEYSLOTS {
            fb.notice(&format!(
                "keyslots area ({ks_size} bytes) is very small, available LUKS2 keyslot count \
                 is very limited."
            ));
        }
        if p.keyslots_size.is_some_and(|k| k != ks_size) {
            fb.notice(&format!(
                "LUKS2 keyslots area size changed to {ks_size} bytes."
            ));
        }
    }
    if p.subsystem.len() >= 48 {
        return Err(LuksError::Usage(
            "Subsystem is too long (at most 47 bytes).".into(),
        ));
    }
    if let Some(k) = volume_key {
        if k.len() != p.key_bytes as usize {
            return Err(LuksError::Usage(format!(
                "Volume key has {} bits, the cipher needs {}.",
                k.len() * 8,
                p.key_bytes * 8
            )));
        }
    }
    Ok((data_off, meta_len, ks_size))
}

/// The data device's size. A regular file too small for any data is
/// grown to hold the metadata (with cryptsetup's warning); a block
/// device too small for the metadata is refused.
fn data_size_for(
    image: &Path,
    p: &FormatParams,
    detached: bool,
    (data_off, meta_len): (u64, u64),
    fb: &dyn Feedback,
) -> Result<u64, LuksError> {
    let regular = std::fs::metadata(image)
        .map(|m| m.is_file())
        .unwrap_or(false);
    let mut data_size = Disk::open(image, false)?.size()?;
    if data_size <= data_off {
        if !regular && (detached || data_size < meta_len) {
            return Err(LuksError::Usage(format!(
                "Device {} is too small (LUKS{} needs more than {data_off} bytes).",
                image.display(),
                p.version
            )));
        }
        fb.warn(&format!(
            "Device {} is too small for activation, there is no remaining space for data.",
            image.display()
        ));
        if !detached {
            Disk::open(image, true)?.grow_to(data_off.max(meta_len))?;
            data_size = data_size.max(data_off.max(meta_len));
        }
    }
    Ok(data_size)
}

/// The LUKS2 encryption sector size: the one asked for (checked against
/// the data), else as cryptsetup 2.6 picks it.
fn sector_size(p: &FormatParams, data_size: u64, data_off: u64) -> Result<u32, LuksError> {
    let offset_wants_512 = p
        .data_offset
        .is_some_and(|o| o != 0 && (o / 512) % 4096 != 0);
    let sector = match p.sector_size {
        Some(s) => {
            if !(512..=4096).contains(&s) || !s.is_power_of_two() {
                return Err(LuksError::Usage(format!(
                    "Unsupported encryption sector size {s}."
                )));
            }
            if data_size > data_off && (data_size - data_off) % u64::from(s) != 0 {
                return Err(LuksError::Usage(format!(
                    "Device size is not aligned to requested sector size {s}."
                )));
            }
            s
        }
        None if offset_wants_512 => 512,
        None if data_size > data_off && (data_size - data_off) % 4096 == 0 => 4096,
        None if data_size <= data_off => 4096,
        None => 512,
    };
    Ok(sector)
}

/// What a new header of either version is made of.
struct Fresh<'a> {
    p: &'a FormatParams,
    key: &'a [u8],
    digest_salt: &'a [u8],
    uuid: String,
    data_off: u64,
}

impl Fresh<'_> {
    /// A LUKS1 header (PBKDF2 only; cipher given as name-mode), written.
    fn luks1(&self, meta_len: u64, meta: &mut Disk) -> Result<Header, LuksError> {
        let Fresh {
            p,
            key,
            digest_salt,
            ref uuid,
            data_off,
        } = *self;
        let Kdf::Pbkdf2 { .. } = p.kdf else {
            return Err(LuksError::Usage(
                "LUKS1 supports only the pbkdf2 PBKDF.".into(),
            ));
        };
        let (name, mode) = p
            .cipher
            .split_once('-')
            .filter(|(n, m)| !n.is_empty() && !m.is_empty() && n.len() < 32 && m.len() < 32)
            .ok_or_else(|| {
                LuksError::Usage(format!(
                    "Invalid cipher specification {} for LUKS1 (cipher-mode).",
                    p.cipher
                ))
            })?;
        let d = keyslot::key_digest(p.hash, key, digest_salt, p.digest_iterations, 20);
        let mut dig = [0u8; 20];
        dig.copy_from_slice(&d);
        let mut salt = [0u8; 32];
        salt.copy_from_slice(digest_salt);
        let h = luks1::Header::new(
            name,
            mode,
            p.hash,
            (data_off / 512) as u32,
            p.key_bytes,
            dig,
            salt,
            p.digest_iterations,
            uuid,
        );
        let h = luks1::Header::parse(&h.to_bytes(), meta_len)?;
        meta.write_at(0, &h.to_bytes())?;
        meta.sync()?;
        Ok(Header::from(h))
    }

    /// A LUKS2 header with one dynamic segment and its digest, written.
    fn luks2(&self, ks_size: u64, sector: u32, meta: &mut Disk) -> Result<Header, LuksError> {
        let Fresh {
            p,
            key,
            digest_salt,
            ref uuid,
            data_off,
        } = *self;
        let d = keyslot::key_digest(
            p.hash,
            key,
            digest_salt,
            p.digest_iterations,
            p.hash.digest_len(),
        );
        let value = json!({
            "keyslots": {},
            "tokens": {},
            "segments": {"0": {
                "type": "crypt",
                "offset": data_off.to_string(),
                "size": "dynamic",
                "iv_tweak": "0",
                "encryption": p.cipher,
                "sector_size": sector,
            }},
            "digests": {"0": {
                "type": "pbkdf2",
                "keyslots": [],
                "segments": ["0"],
                "hash": p.hash.name(),
                "iterations": p.digest_iterations,
                "salt": b64_encode(digest_salt),
                "digest": b64_encode(&d),
            }},
            "config": {"json_size": (p.metadata_size - 4096).to_string(), "keyslots_size": ks_size.to_string()},
        });
        let mut value = value;
        if let Some(i) = &p.integrity {
            // cryptsetup 2.6 writes the journal fields as "none": LUKS2
            // does not yet carry journal encryption or MAC.
            value["segments"]["0"]["integrity"] = json!({
                "type": i,
                "journal_encryption": "none",
                "journal_integrity": "none",
            });
        }
        let meta_json = Metadata::parse(value, p.metadata_size)?;
        let mut salts = [[0u8; 64]; 2];
        for s in &mut salts {
            s.copy_from_slice(&keyslot::random(64)?);
        }
        let mut h = luks2::Luks2 {
            bin: luks2::BinHeader {
                hdr_size: p.metadata_size,
                seqid: 1,
                label: p.label.clone(),
                checksum_alg: HashAlg::Sha256,
                uuid: uuid.clone(),
                subsystem: p.subsystem.clone(),
            },
            meta: meta_json,
            salts,
            used_copy: 0,
            recovery: None,
            warnings: Vec::new(),
        };
        h.write(meta)?;
        Ok(Header::from(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 4, RFC 4122 variant, lower-case hyphenated; only the
    /// hyphenated form passes the check (not the simple, braced or URN
    /// forms the crate also parses).
    #[test]
    fn uuids_as_cryptsetup_writes_and_takes_them() {
        let u = random_uuid().unwrap();
        assert_eq!(u.len(), 36, "{u}");
        assert_eq!(&u[14..15], "4", "{u}");
        assert!("89ab".contains(&u[19..20]), "{u}");
        assert_eq!(u, u.to_lowercase());
        assert_ne!(u, random_uuid().unwrap());
        check_uuid(&u).unwrap();
        check_uuid("12345678-1234-4234-8234-123456789ABC").unwrap();
        for bad in [
            "not-a-uuid",
            "12345678123442348234123456789abc",
            "{12345678-1234-4234-8234-123456789abc}",
            "urn:uuid:12345678-1234-4234-8234-123456789abc",
            "12345678-1234-4234-8234-123456789abg",
            "1234567-81234-4234-8234-123456789abc",
        ] {
            let e = check_uuid(bad).unwrap_err().to_string();
            assert!(e.contains("Wrong LUKS UUID format provided"), "{bad}: {e}");
        }
    }
}
