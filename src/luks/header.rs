//! A LUKS header of either version behind one interface. LUKS1 and LUKS2
//! differ in layout (fixed binary fields against JSON objects) but answer
//! the same questions: which keyslots are active, what each costs and where
//! its material lies, which digest checks a key, where the data starts.
//! Every place that needs the version difference asks here, so the rest of
//! udm reads as one format; LUKS2-only features (tokens, reencryption,
//! unbound keys) reach the LUKS2 header through [`Header::luks2`], which
//! also says "not here" for LUKS1.

use super::disk::Disk;
use super::error::LuksError;
use super::hash::HashAlg;
use super::json::b64_encode;
use super::kdf::Kdf;
use super::keyslot::{self, ct_eq, SlotParams};
use super::{luks1, luks2, MappedSegment};
use serde_json::json;

/// Which keyslots may answer a passphrase. cryptsetup's verbs take only a
/// keyslot whose key opens a data segment; `luksChangeKey`, `luksDump
/// --unbound` and `open --test-passphrase --unbound` also take a keyslot
/// holding an unbound key (one no segment uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotUse {
    Segment,
    Any,
}

/// The digest a new LUKS2 keyslot is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// The volume key's (segment 0's); the key must match it.
    Volume,
    /// An existing digest (the keyslot a passphrase change replaces); the
    /// key must match it.
    Digest(u32),
    /// A new unbound key: a digest of its own with no segment (PBKDF2 with
    /// `hash` and `iterations`), unless the key is the volume key, which
    /// binds the keyslot to the volume as cryptsetup does.
    NewUnbound { hash: HashAlg, iterations: u32 },
}

/// The header, by version.
#[derive(Clone, Debug)]
pub enum Header {
    Luks1(Box<luks1::Header>),
    Luks2(Box<luks2::Luks2>),
}

impl From<luks1::Header> for Header {
    fn from(h: luks1::Header) -> Header {
        Header::Luks1(Box::new(h))
    }
}

impl From<luks2::Luks2> for Header {
    fn from(h: luks2::Luks2) -> Header {
        Header::Luks2(Box::new(h))
    }
}

/// LUKS2 config flags that become dm-crypt options, in cryptsetup's order.
const FLAG_OPTIONS: [(&str, &str); 5] = [
    ("allow-discards", "allow_discards"),
    ("same-cpu-crypt", "same_cpu_crypt"),
    ("submit-from-crypt-cpus", "submit_from_crypt_cpus"),
    ("no-read-workqueue", "no_read_workqueue"),
    ("no-write-workqueue", "no_write_workqueue"),
];

impl Header {
    /// The LUKS2 header, or None for LUKS1 (which has no JSON, tokens,
    /// reencryption or unbound keys).
    pub fn luks2(&self) -> Option<&luks2::Luks2> {
        match self {
            Header::Luks2(h) => Some(h),
            Header::Luks1(_) => None,
        }
    }

    /// [`Header::luks2`], mutable.
    pub fn luks2_mut(&mut self) -> Option<&mut luks2::Luks2> {
        match self {
            Header::Luks2(h) => Some(h),
            Header::Luks1(_) => None,
        }
    }

    /// The LUKS1 header, or None for LUKS2.
    pub fn luks1(&self) -> Option<&luks1::Header> {
        match self {
            Header::Luks1(h) => Some(h),
            Header::Luks2(_) => None,
        }
    }

    pub fn version(&self) -> u8 {
        match self {
            Header::Luks1(_) => 1,
            Header::Luks2(_) => 2,
        }
    }

    pub fn uuid(&self) -> &str {
        match self {
            Header::Luks1(h) => &h.uuid,
            Header::Luks2(h) => &h.bin.uuid,
        }
    }

    /// Replace the UUID (already checked) in memory.
    pub fn set_uuid(&mut self, uuid: &str) {
        match self {
            Header::Luks1(h) => h.uuid = uuid.to_string(),
            Header::Luks2(h) => h.bin.uuid = uuid.to_string(),
        }
    }

    /// Warnings from reading the header (e.g. damaged primary copy).
    pub fn warnings(&self) -> Vec<String> {
        match self {
            Header::Luks1(_) => Vec::new(),
            Header::Luks2(h) => h.warnings.clone(),
        }
    }

    /// Active keyslot numbers.
    pub fn active_slots(&self) -> Vec<u32> {
        match self {
            Header::Luks1(h) => (0..8u32).filter(|&i| h.slots[i as usize].active).collect(),
            Header::Luks2(h) => {
                let mut v: Vec<u32> = h.meta.keyslots.keys().copied().collect();
                v.extend(h.meta.unusable.keys().copied());
                v.sort_unstable();
                v
            }
        }
    }

    /// The error of using LUKS2 keyslot `slot`, when it is one udm cannot
    /// unlock (cryptsetup fails such a keyslot only when it is used).
    pub fn unusable_slot(&self, slot: u32) -> Option<LuksError> {
        self.luks2()
            .and_then(|h| h.meta.unusable.get(&slot))
            .map(|u| u.error())
    }

    /// Highest keyslot number plus one.
    pub fn max_slots(&self) -> u32 {
        match self {
            Header::Luks1(_) => 8,
            Header::Luks2(_) => super::json::MAX_KEYSLOTS,
        }
    }

    /// True if keyslot `slot` is in use, also by a keyslot type udm does
    /// not unlock (LUKS2 `other_keyslots`).
    pub fn slot_taken(&self, slot: u32) -> bool {
        self.active_slots().contains(&slot)
            || self
                .luks2()
                .is_some_and(|h| h.meta.other_keyslots.contains_key(&slot))
    }

    /// First free keyslot number.
    pub fn free_slot(&self) -> Option<u32> {
        (0..self.max_slots()).find(|&i| !self.slot_taken(i))
    }

    /// Volume key bytes as the header states them (a LUKS2 header without
    /// keyslots states none).
    pub fn key_size(&self) -> Option<usize> {
        match self {
            Header::Luks1(h) => Some(h.key_bytes as usize),
            Header::Luks2(h) => h.meta.keyslots.values().next().map(|k| k.key_size as usize),
        }
    }

    /// Bytes of the metadata area (what header-backup copies; for LUKS1, as
    /// cryptsetup, the keyslot areas' end rounded up to 4 KiB).
    pub fn backup_len(&self) -> u64 {
        match self {
            Header::Luks1(h) => (h.areas_end() * 512).div_ceil(4096) * 4096,
            Header::Luks2(_) => self.metadata_end(),
        }
    }

    /// Where the header and keyslot areas end, in bytes.
    pub fn metadata_end(&self) -> u64 {
        match self {
            Header::Luks1(h) => h.areas_end() * 512,
            Header::Luks2(h) => 2 * h.bin.hdr_size + h.meta.keyslots_size,
        }
    }

    /// The data offset in bytes as the header states it: a LUKS1
    /// payload offset, or the lowest offset of a LUKS2 data segment
    /// (backup segments of a reencryption aside; 0 with none).
    pub fn data_offset(&self) -> u64 {
        match self {
            Header::Luks1(h) => u64::from(h.payload_offset) * 512,
            Header::Luks2(h) => h
                .meta
                .segments
                .values()
                .filter(|s| !s.is_backup())
                .map(|s| s.offset)
                .min()
                .unwrap_or(0),
        }
    }

    /// Segment 0's cipher and offset in 512-byte sectors (LUKS1: the
    /// volume's cipher and payload offset; empty and 0 without a segment 0).
    pub fn first_segment(&self) -> (String, u64) {
        match self {
            Header::Luks1(h) => (h.cipher_spec(), u64::from(h.payload_offset)),
            Header::Luks2(h) => {
                let seg = h.meta.segments.get(&0);
                (
                    seg.map(|s| s.encryption.clone()).unwrap_or_default(),
                    seg.map(|s| s.offset / 512).unwrap_or(0),
                )
            }
        }
    }

    /// Refuse headers whose requirement flags udm does not implement.
    pub fn check_requirements(&self) -> Result<(), LuksError> {
        match self.luks2().and_then(|h| h.meta.requirements.first()) {
            Some(r) => Err(LuksError::Requirement(r.clone())),
            None => Ok(()),
        }
    }

    /// The parameters to unlock keyslot `slot`, if it is an active slot
    /// udm can unlock. A LUKS1 keyslot's area is encrypted with the
    /// volume's cipher, which it does not store itself.
    pub fn slot_params(&self, slot: u32) -> Option<SlotParams<'_>> {
        match self {
            Header::Luks1(h) => {
                let s = h.slots.get(slot as usize).filter(|s| s.active)?;
                Some(SlotParams {
                    kdf: Kdf::Pbkdf2 {
                        hash: h.hash,
                        iterations: s.iterations,
                    },
                    salt: &s.salt,
                    af_hash: h.hash,
                    stripes: s.stripes,
                    offset: u64::from(s.key_offset) * 512,
                    encryption: "",
                    area_key_size: h.key_bytes as usize,
                    key_size: h.key_bytes as usize,
                })
            }
            Header::Luks2(h) => {
                let k = h.meta.keyslots.get(&slot)?;
                Some(SlotParams::luks2(k))
            }
        }
    }

    /// The cipher of LUKS1 keyslot areas (empty for LUKS2, whose
    /// keyslots name their own).
    pub fn luks1_area_cipher(&self) -> String {
        self.luks1().map(|h| h.cipher_spec()).unwrap_or_default()
    }

    /// True if `key` is this volume's (segment) key.
    pub fn check_key(&self, key: &[u8]) -> bool {
        match self {
            Header::Luks1(h) => {
                key.len() == h.key_bytes as usize
                    && ct_eq(
                        &keyslot::key_digest(h.hash, key, &h.mk_digest_salt, h.mk_digest_iter, 20),
                        &h.mk_digest,
                    )
            }
            Header::Luks2(h) => h
                .meta
                .segment_digest()
                .is_some_and(|(_, d)| keyslot::digest_matches(d, key)),
        }
    }

    /// True if `key` matches LUKS2 digest `digest` (LUKS1: the volume key).
    pub fn digest_matches(&self, digest: u32, key: &[u8]) -> bool {
        match self {
            Header::Luks2(h) => h
                .meta
                .digests
                .get(&digest)
                .is_some_and(|d| keyslot::digest_matches(d, key)),
            Header::Luks1(_) => self.check_key(key),
        }
    }

    /// True if `key` is the key of keyslot `slot` by that keyslot's own
    /// digest (LUKS1: the volume key).
    pub fn check_slot_key(&self, slot: u32, key: &[u8]) -> bool {
        match self {
            Header::Luks1(_) => self.check_key(key),
            Header::Luks2(h) => h
                .meta
                .digest_of(slot)
                .is_some_and(|(_, d)| keyslot::digest_matches(d, key)),
        }
    }

    /// Whether keyslot `slot` holds an unbound key: its digest names no
    /// segment (cryptsetup's CRYPT_SLOT_UNBOUND).
    pub fn slot_is_unbound(&self, slot: u32) -> bool {
        self.luks2().is_some_and(|h| {
            h.meta.keyslots.contains_key(&slot)
                && h.meta
                    .digest_of(slot)
                    .is_none_or(|(_, d)| d.segments.is_empty())
        })
    }

    /// Keyslot `slot`'s priority: 0 ignore, 1 normal, 2 preferred.
    pub fn slot_priority(&self, slot: u32) -> u32 {
        let Some(h) = self.luks2() else { return 1 };
        match (h.meta.keyslots.get(&slot), h.meta.unusable.get(&slot)) {
            (Some(k), _) => k.priority,
            (None, Some(u)) => u.priority,
            (None, None) => 1,
        }
    }

    /// The PBKDF2 digest a key from keyslot `slot` is checked against when
    /// unlocking for `usable` (the volume key's digest, or the keyslot's
    /// own), as a [`Kdf`] for the cost check.
    pub fn digest_kdf(&self, slot: u32, usable: SlotUse) -> Option<Kdf> {
        let (hash, iterations) = match self {
            Header::Luks1(h) => (h.hash, h.mk_digest_iter),
            Header::Luks2(h) => {
                let d = match usable {
                    SlotUse::Segment => h.meta.segment_digest(),
                    SlotUse::Any => h.meta.digest_of(slot),
                };
                d.map(|(_, d)| (d.hash, d.iterations))?
            }
        };
        Some(Kdf::Pbkdf2 { hash, iterations })
    }

    /// Bytes the digest of [`Header::digest_kdf`] derives (LUKS1: 20).
    pub fn digest_len(&self, slot: u32, usable: SlotUse) -> usize {
        match self {
            Header::Luks1(_) => 20,
            Header::Luks2(h) => match usable {
                SlotUse::Segment => h.meta.segment_digest(),
                SlotUse::Any => h.meta.digest_of(slot),
            }
            .map_or(0, |(_, d)| d.digest.len()),
        }
    }

    /// Keyslots to try, in cryptsetup's order (LUKS2: high priority first;
    /// priority 0 never).
    pub fn try_order(&self) -> Vec<u32> {
        let Some(h) = self.luks2() else {
            return self.active_slots();
        };
        let mut v: Vec<(u32, u32)> = h
            .meta
            .keyslots
            .iter()
            .map(|(n, k)| (*n, k.priority))
            .chain(h.meta.unusable.iter().map(|(n, u)| (*n, u.priority)))
            .filter(|&(_, p)| p > 0)
            .collect();
        v.sort_by_key(|&(n, p)| (std::cmp::Reverse(p), n));
        v.into_iter().map(|(n, _)| n).collect()
    }

    /// With the header inside the data device, data must start after the
    /// metadata: a segment at offset 0 (or a LUKS1 payload at sector 0)
    /// would map the header and keyslots as data, and the first write
    /// through the mapping would destroy every key.
    pub fn check_data_offset(&self) -> Result<(), LuksError> {
        let meta_end = self.metadata_end();
        let why = format!(
            "data would overlap the header and keyslots (which end at byte {meta_end}); only a \
             detached header (--header) may have data at 0"
        );
        match self {
            Header::Luks1(h) => {
                if u64::from(h.payload_offset) * 512 < meta_end {
                    return Err(LuksError::field("payload-offset", h.payload_offset, why));
                }
            }
            Header::Luks2(h) => {
                // Backup segments are never mapped: an encryption with
                // data shift keeps the plaintext's old place (offset 0)
                // in its `backup-previous` segment.
                for (n, s) in h.meta.segments.iter().filter(|(_, s)| !s.is_backup()) {
                    if s.offset < meta_end {
                        return Err(LuksError::field(
                            format!("segments.{n}.offset"),
                            s.offset,
                            why,
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The crypt segments and dm-crypt options that map a data device of
    /// `data_size` bytes.
    pub fn mapped_segments(
        &self,
        data_size: u64,
    ) -> Result<(Vec<MappedSegment>, Vec<&'static str>), LuksError> {
        match self {
            Header::Luks1(h) => Ok((vec![luks1_segment(h, data_size)?], Vec::new())),
            Header::Luks2(h) => {
                let segments = luks2_segments(h, data_size)?;
                let options = FLAG_OPTIONS
                    .iter()
                    .filter(|(flag, _)| h.meta.flags.iter().any(|f| f == flag))
                    .map(|&(_, opt)| opt)
                    .collect();
                Ok((segments, options))
            }
        }
    }

    /// Write the header to `meta` (LUKS2: both copies) and sync.
    pub fn write(&mut self, meta: &mut Disk) -> Result<(), LuksError> {
        match self {
            Header::Luks1(h) => {
                let b = h.to_bytes();
                meta.write_at(0, &b)?;
                meta.sync()
            }
            Header::Luks2(h) => h.write(meta),
        }
    }

    /// Seal `key` under `passphrase` into keyslot `slot` (free, checked
    /// by the caller): the material is written and synced to `meta`
    /// before the in-memory header names it; the caller writes the header.
    pub fn seal_slot(
        &mut self,
        meta: &mut Disk,
        new: NewSlot<'_>,
        binding: Binding,
    ) -> Result<(), LuksError> {
        match self {
            Header::Luks1(h) => seal_luks1(h, meta, new),
            Header::Luks2(h) => seal_luks2(h, meta, new, binding),
        }
    }

    /// Drop keyslot `slot` from the in-memory header; returns its area
    /// (offset, length) for the caller to wipe once the header is written.
    pub fn release_slot(&mut self, slot: u32) -> Result<(u64, u64), LuksError> {
        match self {
            Header::Luks1(h) => {
                let s = &mut h.slots[slot as usize];
                s.active = false;
                s.iterations = 0;
                s.salt = [0; 32];
                Ok((
                    u64::from(s.key_offset) * 512,
                    luks1::area_sectors(h.key_bytes) * 512,
                ))
            }
            Header::Luks2(h) => {
                // From the JSON: a keyslot udm cannot unlock is removed too.
                let a = &h.meta.value["keyslots"][slot.to_string()]["area"];
                let num = |k: &str| a[k].as_str().and_then(super::json::parse_u64str);
                let area = (num("offset").unwrap_or(0), num("size").unwrap_or(0));
                h.meta = h.meta.without_keyslot(h.bin.hdr_size, slot)?;
                Ok(area)
            }
        }
    }
}

/// What a new keyslot holds and how it is protected.
pub struct NewSlot<'a> {
    pub slot: u32,
    pub key: &'a [u8],
    pub passphrase: &'a [u8],
    pub kdf: Kdf,
    /// LUKS2 AF hash (LUKS1 always uses its header hash).
    pub af_hash: HashAlg,
}

/// The one crypt segment of a LUKS1 volume.
fn luks1_segment(h: &luks1::Header, data_size: u64) -> Result<MappedSegment, LuksError> {
    let dev_sectors = data_size / 512;
    let off = u64::from(h.payload_offset);
    if dev_sectors <= off {
        return Err(LuksError::field(
            "payload-offset",
            off,
            format!("data device has only {dev_sectors} sectors"),
        ));
    }
    Ok(MappedSegment {
        cipher: h.cipher_spec(),
        offset_sectors: off,
        len_sectors: dev_sectors - off,
        sector_size: 512,
        iv_offset: 0,
        key_index: 0,
        linear: false,
    })
}

/// The crypt segments of a LUKS2 volume (backup segments aside), each
/// checked against the data device's size.
fn luks2_segments(h: &luks2::Luks2, data_size: u64) -> Result<Vec<MappedSegment>, LuksError> {
    let dev_sectors = data_size / 512;
    let regular: Vec<_> = h
        .meta
        .segments
        .iter()
        .filter(|(_, s)| !s.is_backup())
        .collect();
    if regular.is_empty() {
        return Err(LuksError::field(
            "segments",
            "{}",
            "no data segment to activate",
        ));
    }
    let single = regular.len() == 1;
    let mut segments = Vec::new();
    for (n, s) in regular {
        if s.kind != "crypt" {
            return Err(LuksError::Unsupported(format!(
                "segments.{n}.type = {}",
                s.kind
            )));
        }
        if s.integrity && !single {
            return Err(LuksError::Unsupported(format!(
                "segments.{n}.integrity with more than one segment"
            )));
        }
        if !(512..=4096).contains(&s.sector_size) || !s.sector_size.is_power_of_two() {
            return Err(LuksError::field(
                format!("segments.{n}.sector_size"),
                s.sector_size,
                "must be 512, 1024, 2048 or 4096",
            ));
        }
        if s.encryption.len() > 128 {
            return Err(LuksError::field(
                format!("segments.{n}.encryption"),
                &s.encryption,
                "invalid cipher spec",
            ));
        }
        let off = s.offset / 512;
        let len = match s.size {
            Some(b) => b / 512,
            None => {
                if dev_sectors <= off {
                    return Err(LuksError::field(
                        format!("segments.{n}.offset"),
                        s.offset,
                        format!("data device has only {data_size} bytes"),
                    ));
                }
                dev_sectors - off
            }
        };
        if off + len > dev_sectors {
            return Err(LuksError::field(
                format!("segments.{n}.size"),
                len * 512,
                format!("segment ends beyond the data device ({data_size} bytes)"),
            ));
        }
        // With integrity the size is what the integrity device provides.
        if !s.integrity && (len * 512) % u64::from(s.sector_size) != 0 {
            return Err(LuksError::field(
                format!("segments.{n}.size"),
                len * 512,
                format!(
                    "device size is not aligned to the {}-byte sector size",
                    s.sector_size
                ),
            ));
        }
        segments.push(MappedSegment {
            cipher: s.encryption.clone(),
            offset_sectors: off,
            len_sectors: len,
            sector_size: s.sector_size,
            iv_offset: if single { 0 } else { s.iv_tweak },
            key_index: 0,
            linear: false,
        });
    }
    Ok(segments)
}

/// A LUKS1 keyslot: PBKDF2 only, with the header's hash and cipher.
fn seal_luks1(h: &mut luks1::Header, meta: &mut Disk, new: NewSlot<'_>) -> Result<(), LuksError> {
    let Kdf::Pbkdf2 { iterations, .. } = new.kdf else {
        return Err(LuksError::Usage(
            "LUKS1 keyslots only support pbkdf2".into(),
        ));
    };
    let salt = keyslot::random(32)?;
    let spec = h.cipher_spec();
    let s = &h.slots[new.slot as usize];
    let p = SlotParams {
        kdf: Kdf::Pbkdf2 {
            hash: h.hash,
            iterations,
        },
        salt: &salt,
        af_hash: h.hash,
        stripes: s.stripes,
        offset: u64::from(s.key_offset) * 512,
        encryption: &spec,
        area_key_size: h.key_bytes as usize,
        key_size: h.key_bytes as usize,
    };
    let material = keyslot::seal(&p, new.passphrase, new.key)?;
    meta.write_at(p.offset, &material)?;
    meta.sync()?;
    let s = &mut h.slots[new.slot as usize];
    s.active = true;
    s.iterations = iterations;
    s.salt.copy_from_slice(&salt);
    Ok(())
}

/// A LUKS2 keyslot in the first free stretch of the keyslots area, bound
/// as `binding` says; a new unbound key's digest goes into the same
/// header update.
fn seal_luks2(
    h: &mut luks2::Luks2,
    meta: &mut Disk,
    new: NewSlot<'_>,
    binding: Binding,
) -> Result<(), LuksError> {
    let salt = keyslot::random(32)?;
    let (metadata, digest_id) = bind_digest(h, new.key, binding)?;
    let (encryption, area_key_size) = match h.meta.keyslots.values().next() {
        Some(k) => (k.area_encryption.clone(), k.area_key_size),
        None => {
            let seg = h
                .meta
                .segments
                .get(&0)
                .ok_or_else(|| LuksError::field("segments.0", "(missing)", "no segment"))?;
            if seg.integrity {
                // libcryptsetup's fallback when the segment's cipher cannot
                // encrypt a keyslot (an authenticated one cannot: there are
                // no tags there): AES-XTS with a 512-bit key.
                ("aes-xts-plain64".to_string(), 64)
            } else {
                (seg.encryption.clone(), new.key.len() as u32)
            }
        }
    };
    let key_size = new.key.len();
    let size = (key_size as u64 * u64::from(super::af::STRIPES)).div_ceil(4096) * 4096;
    let offset = alloc_area(h, size).ok_or_else(|| {
        LuksError::Usage("No space for new keyslot in the LUKS2 keyslots area.".into())
    })?;
    let p = SlotParams {
        kdf: new.kdf,
        salt: &salt,
        af_hash: new.af_hash,
        stripes: super::af::STRIPES,
        offset,
        encryption: &encryption,
        area_key_size: area_key_size as usize,
        key_size,
    };
    let material = keyslot::seal(&p, new.passphrase, new.key)?;
    let kdf_json = match new.kdf {
        Kdf::Pbkdf2 { hash, iterations } => {
            json!({"type": "pbkdf2", "hash": hash.name(), "iterations": iterations, "salt": b64_encode(&salt)})
        }
        Kdf::Argon2 {
            time,
            memory_kib,
            cpus,
            ..
        } => {
            json!({"type": new.kdf.type_name(), "time": time, "memory": memory_kib, "cpus": cpus, "salt": b64_encode(&salt)})
        }
    };
    let ks = json!({
        "type": "luks2",
        "key_size": key_size,
        "af": {"type": "luks1", "stripes": super::af::STRIPES, "hash": new.af_hash.name()},
        "area": {"type": "raw", "offset": offset.to_string(), "size": size.to_string(), "encryption": encryption, "key_size": area_key_size},
        "kdf": kdf_json,
    });
    let new_meta = metadata.with_keyslot(h.bin.hdr_size, new.slot, ks, digest_id)?;
    // Material first, header second: a crash in between leaves an unreferenced area.
    meta.write_at(offset, &material)?;
    meta.sync()?;
    h.meta = new_meta;
    Ok(())
}

/// The digest a new LUKS2 keyslot joins, and the metadata to add the
/// keyslot to (with a new unbound key's digest already in it).
fn bind_digest(
    h: &luks2::Luks2,
    key: &[u8],
    binding: Binding,
) -> Result<(super::json::Metadata, u32), LuksError> {
    let (segment_digest, _) = h
        .meta
        .segment_digest()
        .ok_or_else(|| LuksError::field("digests", "{}", "no digest bound to segment 0"))?;
    let meta = h.meta.clone();
    let (hash, iterations) = match binding {
        Binding::Volume => return Ok((meta, segment_digest)),
        Binding::Digest(d) => return Ok((meta, d)),
        Binding::NewUnbound { hash, iterations } => (hash, iterations),
    };
    // cryptsetup takes the lowest free digest number.
    let d = (0..super::json::MAX_KEYSLOTS)
        .find(|i| !meta.digests.contains_key(i))
        .ok_or_else(|| LuksError::Usage("No free digest.".into()))?;
    let dsalt = keyslot::random(32)?;
    let dg = keyslot::key_digest(hash, key, &dsalt, iterations, hash.digest_len());
    let entry = json!({
        "type": "pbkdf2", "keyslots": [], "segments": [],
        "hash": hash.name(), "iterations": iterations,
        "salt": b64_encode(&dsalt), "digest": b64_encode(&dg),
    });
    let meta = meta.edit(h.bin.hdr_size, |top| {
        if let Some(ds) = top.get_mut("digests").and_then(|d| d.as_object_mut()) {
            ds.insert(d.to_string(), entry);
        }
    })?;
    Ok((meta, d))
}

/// First fit for a new keyslot area of `size` bytes.
fn alloc_area(h: &luks2::Luks2, size: u64) -> Option<u64> {
    let start = 2 * h.bin.hdr_size;
    let end = start + h.meta.keyslots_size;
    let mut used: Vec<(u64, u64)> = Vec::new();
    if let Some(ks) = h.meta.value.get("keyslots").and_then(|v| v.as_object()) {
        for k in ks.values() {
            let a = &k["area"];
            let o = a["offset"].as_str().and_then(super::json::parse_u64str);
            let s = a["size"].as_str().and_then(super::json::parse_u64str);
            if let (Some(o), Some(s)) = (o, s) {
                used.push((o, o.saturating_add(s)));
            }
        }
    }
    used.sort_unstable();
    let mut cand = start;
    for (o, e) in used {
        if cand.saturating_add(size) <= o {
            break;
        }
        cand = cand.max(e);
    }
    (cand.saturating_add(size) <= end).then_some(cand)
}
