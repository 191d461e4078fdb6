//! `convert --type luks1|luks2`: the same keyslots and volume key under
//! the other header format, laid out as cryptsetup 2.6 lays them out, so a
//! converted volume is byte-for-byte what cryptsetup's conversion makes
//! (bar the random salts of the LUKS2 header copies).
//!
//! LUKS1 → LUKS2: the keyslot material moves from 4 KiB to 32 KiB (two
//! 16 KiB header copies now precede it); the JSON describes each LUKS1
//! slot (pbkdf2, AF with the header hash, area = the LUKS1 area rounded to
//! 4 KiB), segment 0 at the payload offset, and digest 0 carrying the
//! LUKS1 master key digest. The keyslots area runs to the data offset.
//!
//! LUKS2 → LUKS1: only when LUKS1 can express it: 512-byte sectors, one
//! segment, one pbkdf2 digest, no tokens, at most 8 keyslots, each pbkdf2
//! with the digest's hash and the data cipher. Areas move back by 28 KiB.
//!
//! Order, for crash safety: the new header is validated first, the key
//! material is copied (the old copy stays where the old header points),
//! and the header is written last.

use super::disk::Disk;
use super::error::LuksError;
use super::hash::HashAlg;
use super::json::{b64_encode, Metadata};
use super::luks1;
use super::luks2::{BinHeader, Luks2};
use super::volume::Volume;
use serde_json::{json, Map, Value};

/// Header copy size a conversion uses (cryptsetup: 16 KiB).
const HDR: u64 = 16 * 1024;
/// LUKS1 key material starts at 4 KiB; LUKS2's after two 16 KiB copies.
const SHIFT: u64 = 2 * HDR - 4096;

fn usage(m: impl Into<String>) -> LuksError {
    LuksError::Usage(m.into())
}

/// Copy `len` bytes of key material from `from` to `to` on the metadata
/// device (read before write: the areas may overlap).
fn move_areas(d: &mut Disk, from: u64, to: u64, len: u64) -> Result<(), LuksError> {
    let mut buf = zeroize::Zeroizing::new(vec![0u8; len as usize]);
    d.read_at(from, &mut buf)?;
    d.write_at(to, &buf)?;
    d.sync()
}

impl Volume {
    /// Convert to LUKS`to`; an error (nothing written) if it is already
    /// that version or the header cannot be expressed in it.
    pub fn convert(&mut self, to: u8) -> Result<(), LuksError> {
        self.check_requirements()?;
        match (self.version(), to) {
            (1, 1) => Err(usage("Device is already LUKS1 type.")),
            (2, 2) => Err(usage("Device is already LUKS2 type.")),
            (1, 2) => self.convert_to_luks2(),
            (2, 1) => self.convert_to_luks1(),
            _ => Err(usage(
                "Invalid LUKS type, only luks1 and luks2 are supported.",
            )),
        }
    }

    fn convert_to_luks2(&mut self) -> Result<(), LuksError> {
        let Some(h) = self.header.luks1() else {
            return Ok(());
        };
        if h.slots.iter().map(|s| s.key_offset).min() != Some(8) {
            return Err(usage(
                "Unsupported keyslots material offset (the first keyslot must start at sector 8).",
            ));
        }
        let luks1_size = (h.areas_end() * 512).div_ceil(4096) * 4096;
        let mut max = u64::from(h.payload_offset) * 512;
        if max == 0 {
            max = self.meta.size()?;
        }
        let required = luks1_size + SHIFT;
        if max < required {
            if self.detached {
                self.meta.grow_to(required)?;
                max = required;
            } else {
                return Err(usage("Unable to move keyslot area. Not enough space."));
            }
        }
        let mut luksmeta = [0u8; 8];
        if self.meta.size()? >= luks1_size + 8 {
            self.meta.read_at(luks1_size, &mut luksmeta)?;
            if &luksmeta == b"LUKSMETA" {
                return Err(usage(
                    "Unable to convert header with LUKSMETA additional metadata.",
                ));
            }
        }
        let spec = h.cipher_spec();
        let area = (luks1::area_sectors(h.key_bytes) * 512).div_ceil(4096) * 4096;
        let mut keyslots = Map::new();
        let mut active = Vec::new();
        for (i, s) in h.slots.iter().enumerate() {
            if !s.active {
                continue;
            }
            active.push(Value::String(i.to_string()));
            keyslots.insert(
                i.to_string(),
                json!({
                    "type": "luks2",
                    "key_size": h.key_bytes,
                    "kdf": {"type": "pbkdf2", "hash": h.hash.name(), "iterations": s.iterations, "salt": b64_encode(&s.salt)},
                    "af": {"type": "luks1", "hash": h.hash.name(), "stripes": super::af::STRIPES},
                    "area": {"type": "raw", "encryption": spec, "key_size": h.key_bytes,
                             "offset": (u64::from(s.key_offset) * 512 + SHIFT).to_string(),
                             "size": area.to_string()},
                }),
            );
        }
        let keyslots_size = (max - 2 * HDR) / 4096 * 4096;
        let value = json!({
            "keyslots": keyslots,
            "tokens": {},
            "segments": {"0": {
                "type": "crypt",
                "offset": (u64::from(h.payload_offset) * 512).to_string(),
                "iv_tweak": "0",
                "size": "dynamic",
                "encryption": spec,
                "sector_size": 512,
            }},
            "digests": {"0": {
                "type": "pbkdf2",
                "keyslots": active,
                "segments": ["0"],
                "hash": h.hash.name(),
                "salt": b64_encode(&h.mk_digest_salt),
                "digest": b64_encode(&h.mk_digest),
                "iterations": h.mk_digest_iter,
            }},
            "config": {"json_size": (HDR - 4096).to_string(), "keyslots_size": keyslots_size.to_string()},
        });
        let meta = Metadata::parse(value, HDR).map_err(|e| {
            usage(format!(
                "Cannot convert to LUKS2 format - invalid metadata ({e})."
            ))
        })?;
        let buf_size = luks1_size - 4096;
        if buf_size > keyslots_size {
            return Err(usage(
                "Unable to move keyslot area. LUKS2 keyslots area too small.",
            ));
        }
        let mut salts = [[0u8; 64]; 2];
        for s in &mut salts {
            s.copy_from_slice(&super::keyslot::random(64)?);
        }
        let mut new = Luks2 {
            bin: BinHeader {
                hdr_size: HDR,
                seqid: 1,
                label: String::new(),
                checksum_alg: HashAlg::Sha256,
                uuid: h.uuid.clone(),
                subsystem: String::new(),
            },
            meta,
            salts,
            used_copy: 0,
            recovery: None,
            warnings: Vec::new(),
        };
        move_areas(&mut self.meta, 4096, 2 * HDR, buf_size)?;
        // The LUKS2 header overwrites the LUKS1 one (and the old material
        // below 32 KiB, which the new header no longer points to).
        new.write(&mut self.meta)?;
        self.header = new.into();
        Ok(())
    }

    fn convert_to_luks1(&mut self) -> Result<(), LuksError> {
        let Some(h) = self.header.luks2() else {
            return Ok(());
        };
        let m = &h.meta;
        let seg = m
            .segments
            .get(&0)
            .ok_or_else(|| usage("Cannot convert to LUKS1 format - no data segment."))?;
        if seg.sector_size != 512 {
            return Err(usage("Cannot convert to LUKS1 format - default segment encryption sector size is not 512 bytes."));
        }
        let digest =
            match (m.digests.len(), m.digests.get(&0)) {
                (1, Some(d)) => d,
                _ => return Err(usage(
                    "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible.",
                )),
            };
        if m.segments.len() != 1 {
            return Err(usage(
                "Cannot convert to LUKS1 format - device uses more segments.",
            ));
        }
        if !m.tokens.is_empty() {
            return Err(usage(format!(
                "Cannot convert to LUKS1 format - LUKS2 header contains {} token(s).",
                m.tokens.len()
            )));
        }
        if let Some(n) = m.other_keyslots.keys().next() {
            return Err(usage(format!(
                "Cannot convert to LUKS1 format - keyslot {n} is not LUKS1 compatible."
            )));
        }
        let (name, mode) = seg
            .encryption
            .split_once('-')
            .filter(|(n, m)| n.len() < 32 && m.len() < 32)
            .ok_or_else(|| {
                usage("Cannot convert to LUKS1 format - cipher is not LUKS1 compatible.")
            })?;
        let key_size = m.keyslots.values().next().map(|k| k.key_size).unwrap_or(0);
        if key_size == 0 {
            return Err(usage(
                "Cannot convert to LUKS1 format - no keyslot to take the key size from.",
            ));
        }
        let area = (luks1::area_sectors(key_size) * 512).div_ceil(4096) * 4096;
        for (n, k) in &m.keyslots {
            if *n >= 8 {
                return Err(usage(format!(
                    "Cannot convert to LUKS1 format - slot {n} (over maximum slots) is still active."
                )));
            }
            let ok = matches!(k.kdf, super::kdf::Kdf::Pbkdf2 { hash, .. } if hash == digest.hash)
                && k.af_hash == digest.hash
                && k.area_encryption == seg.encryption
                && k.area_key_size == key_size
                && k.area_size == area;
            if !ok {
                return Err(usage(format!(
                    "Cannot convert to LUKS1 format - keyslot {n} is not LUKS1 compatible."
                )));
            }
        }
        if digest.digest.len() < 20 || digest.salt.len() != 32 {
            return Err(usage(
                "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible.",
            ));
        }
        // Inactive slots get the first free gaps in turn, as placeholders.
        let start = 2 * h.bin.hdr_size;
        let end = start + m.keyslots_size;
        let mut used: Vec<(u64, u64)> = m
            .keyslots
            .values()
            .map(|k| (k.area_offset, k.area_offset + k.area_size))
            .collect();
        let mut offsets = [0u64; 8];
        for (i, off) in offsets.iter_mut().enumerate() {
            if let Some(k) = m.keyslots.get(&(i as u32)) {
                *off = k.area_offset;
                continue;
            }
            used.sort_unstable();
            let mut cand = start;
            for (o, e) in &used {
                if cand + area <= *o {
                    break;
                }
                cand = cand.max(*e);
            }
            if cand + area > end {
                return Err(usage(
                    "Cannot convert to LUKS1 format - no room for LUKS1 keyslot areas.",
                ));
            }
            used.push((cand, cand + area));
            *off = cand;
        }
        let mut dig = [0u8; 20];
        dig.copy_from_slice(&digest.digest[..20]);
        let mut salt = [0u8; 32];
        salt.copy_from_slice(&digest.salt);
        let mut l1 = luks1::Header::new(
            name,
            mode,
            digest.hash,
            u32::try_from(seg.offset / 512)
                .map_err(|_| usage("data offset too large for LUKS1"))?,
            key_size,
            dig,
            salt,
            digest.iterations,
            &h.bin.uuid,
        );
        for (i, off) in offsets.iter().enumerate() {
            let s = &mut l1.slots[i];
            s.key_offset = u32::try_from(off / 512 - SHIFT / 512)
                .map_err(|_| usage("keyslot offset too large for LUKS1"))?;
            if let Some(k) = m.keyslots.get(&(i as u32)) {
                s.active = true;
                if let super::kdf::Kdf::Pbkdf2 { iterations, .. } = k.kdf {
                    s.iterations = iterations;
                }
                s.salt.copy_from_slice(&k.salt);
            }
        }
        let size = self.meta.size()?;
        let l1 = luks1::Header::parse(&l1.to_bytes(), size)
            .map_err(|e| usage(format!("Cannot convert to LUKS1 format ({e}).")))?;
        move_areas(&mut self.meta, start, 4096, m.keyslots_size)?;
        self.meta.write_at(0, &[0u8; 4096])?;
        self.meta.write_at(0, &l1.to_bytes())?;
        self.meta.sync()?;
        self.header = l1.into();
        Ok(())
    }
}
