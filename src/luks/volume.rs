//! A LUKS volume on disk: its metadata device (the image, or a detached header
//! file), its data device, and the operations that read or change keyslots.
//! Every change orders its writes so that a crash at any point leaves all
//! previously valid passphrases working: new key material is written before a
//! header references it, and old material is wiped only after no header does.

use super::cost::{CostLimit, SlotCost};
use super::disk::Disk;
use super::error::LuksError;
use super::hash::HashAlg;
use super::json::b64_encode;
use super::kdf::Kdf;
use super::keyslot::{self, ct_eq, SlotParams};
use super::{luks1, luks2, Activation, MappedSegment};
use serde_json::json;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

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

/// An opened (not yet unlocked) LUKS volume.
#[derive(Debug)]
pub struct Volume {
    pub meta: Disk,
    pub data_path: PathBuf,
    pub data_size: u64,
    pub detached: bool,
    pub header: Header,
    /// Ceiling on KDF cost before a passphrase is tried (None: no limit,
    /// the user's explicit choice).
    pub cost_limit: Option<CostLimit>,
}

/// LUKS2 config flags that become dm-crypt options, in cryptsetup's order.
const FLAG_OPTIONS: [(&str, &str); 5] = [
    ("allow-discards", "allow_discards"),
    ("same-cpu-crypt", "same_cpu_crypt"),
    ("submit-from-crypt-cpus", "submit_from_crypt_cpus"),
    ("no-read-workqueue", "no_read_workqueue"),
    ("no-write-workqueue", "no_write_workqueue"),
];

impl Volume {
    /// Read and validate the header of `image` (or of the detached `header`).
    pub fn load(image: &Path, header: Option<&Path>, write: bool) -> Result<Volume, LuksError> {
        let meta_path = header.unwrap_or(image);
        let meta = Disk::open(meta_path, write)?;
        let meta_size = meta.size()?;
        let mut head = [0u8; 8];
        if meta_size >= 8 {
            meta.read_at(0, &mut head)?;
        }
        let hdr = if luks1::Header::is_luks1(&head) {
            if meta_size < luks1::HEADER_LEN as u64 {
                return Err(LuksError::field(
                    "header",
                    meta_size,
                    "device smaller than a LUKS1 header",
                ));
            }
            let mut buf = vec![0u8; luks1::HEADER_LEN];
            meta.read_at(0, &mut buf)?;
            Header::Luks1(Box::new(luks1::Header::parse(&buf, meta_size)?))
        } else if head[..6] == luks1::MAGIC && head[6..8] != [0, 2] {
            return Err(LuksError::field(
                "version",
                u16::from_be_bytes([head[6], head[7]]),
                "unsupported LUKS version",
            ));
        } else {
            Header::Luks2(Box::new(luks2::read(&meta)?))
        };
        let (data_size, detached) = match header {
            Some(_) => (Disk::open(image, false)?.size()?, true),
            None => (meta_size, false),
        };
        let v = Volume {
            meta,
            data_path: image.to_path_buf(),
            data_size,
            detached,
            header: hdr,
            cost_limit: Some(CostLimit::default()),
        };
        v.check_data_offset()?;
        Ok(v)
    }

    pub fn version(&self) -> u8 {
        match self.header {
            Header::Luks1(_) => 1,
            Header::Luks2(_) => 2,
        }
    }

    pub fn uuid(&self) -> &str {
        match &self.header {
            Header::Luks1(h) => &h.uuid,
            Header::Luks2(h) => &h.bin.uuid,
        }
    }

    /// Warnings from reading the header (e.g. damaged primary copy).
    pub fn warnings(&self) -> Vec<String> {
        match &self.header {
            Header::Luks1(_) => Vec::new(),
            Header::Luks2(h) => h.warnings.clone(),
        }
    }

    /// Active keyslot numbers.
    pub fn active_slots(&self) -> Vec<u32> {
        match &self.header {
            Header::Luks1(h) => (0..8u32).filter(|&i| h.slots[i as usize].active).collect(),
            Header::Luks2(h) => h.meta.keyslots.keys().copied().collect(),
        }
    }

    /// Bytes of the metadata area (what header-backup copies; for LUKS1, as
    /// cryptsetup, the keyslot areas' end rounded up to 4 KiB).
    pub fn header_len(&self) -> u64 {
        match &self.header {
            Header::Luks1(h) => (h.areas_end() * 512).div_ceil(4096) * 4096,
            Header::Luks2(h) => 2 * h.bin.hdr_size + h.meta.keyslots_size,
        }
    }

    /// The data offset in bytes as the header states it: a LUKS1
    /// payload offset, or the lowest offset of a LUKS2 data segment
    /// (backup segments of a reencryption aside; 0 with none).
    pub fn data_offset(&self) -> u64 {
        match &self.header {
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

    /// Refuse headers whose requirement flags udm does not implement.
    pub fn check_requirements(&self) -> Result<(), LuksError> {
        if let Header::Luks2(h) = &self.header {
            if let Some(r) = h.meta.requirements.first() {
                return Err(LuksError::Requirement(r.clone()));
            }
        }
        Ok(())
    }

    fn slot_params(&self, slot: u32) -> Option<SlotParams<'_>> {
        match &self.header {
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

    fn luks1_spec(&self) -> String {
        match &self.header {
            Header::Luks1(h) => h.cipher_spec(),
            Header::Luks2(_) => String::new(),
        }
    }

    /// True if `key` is this volume's (segment) key.
    pub fn check_key(&self, key: &[u8]) -> bool {
        match &self.header {
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

    /// Keyslots to try, in cryptsetup's order (LUKS2: high priority first; priority 0 only by number).
    fn try_order(&self, only: Option<u32>) -> Vec<u32> {
        if let Some(s) = only {
            return vec![s];
        }
        match &self.header {
            Header::Luks1(_) => self.active_slots(),
            Header::Luks2(h) => {
                let mut v: Vec<(u32, u32)> = h
                    .meta
                    .keyslots
                    .iter()
                    .filter(|(_, k)| k.priority > 0)
                    .map(|(n, k)| (*n, k.priority))
                    .collect();
                v.sort_by_key(|&(n, p)| (std::cmp::Reverse(p), n));
                v.into_iter().map(|(n, _)| n).collect()
            }
        }
    }

    /// With the header inside the data device, data must start after the
    /// metadata: a segment at offset 0 (or a LUKS1 payload at sector 0)
    /// would map the header and keyslots as data, and the first write
    /// through the mapping would destroy every key.
    pub fn check_data_offset(&self) -> Result<(), LuksError> {
        if self.detached {
            return Ok(());
        }
        let meta_end = match &self.header {
            Header::Luks1(h) => h.areas_end() * 512,
            Header::Luks2(h) => 2 * h.bin.hdr_size + h.meta.keyslots_size,
        };
        match &self.header {
            Header::Luks1(h) => {
                let off = u64::from(h.payload_offset) * 512;
                if off < meta_end {
                    return Err(LuksError::field(
                        "payload-offset",
                        h.payload_offset,
                        format!(
                            "data would overlap the header and keyslots (which end at byte \
                             {meta_end}); only a detached header (--header) may have data at 0"
                        ),
                    ));
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
                            format!(
                                "data would overlap the header and keyslots (which end at \
                                 byte {meta_end}); only a detached header (--header) may \
                                 have data at 0"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The KDF of keyslot `slot`, if it is an active slot udm can unlock.
    pub fn slot_kdf(&self, slot: u32) -> Option<Kdf> {
        self.slot_params(slot).map(|p| p.kdf)
    }

    /// Find the keyslot `passphrase` opens and return it with the volume
    /// key. `only` tries that slot alone (`--key-slot`). Before any KDF
    /// runs, the summed cost of the slots to try is checked against
    /// [`Volume::cost_limit`].
    pub fn unlock(
        &self,
        passphrase: &[u8],
        only: Option<u32>,
    ) -> Result<(u32, Zeroizing<Vec<u8>>), LuksError> {
        self.unlock_for(passphrase, only, SlotUse::Segment)
    }

    /// Whether keyslot `slot` holds an unbound key: its digest names no
    /// segment (cryptsetup's CRYPT_SLOT_UNBOUND).
    pub fn slot_is_unbound(&self, slot: u32) -> bool {
        match &self.header {
            Header::Luks1(_) => false,
            Header::Luks2(h) => {
                h.meta.keyslots.contains_key(&slot)
                    && h.meta
                        .digest_of(slot)
                        .is_none_or(|(_, d)| d.segments.is_empty())
            }
        }
    }

    /// True if `key` is the key of keyslot `slot` by that keyslot's own
    /// digest (LUKS1: the volume key).
    fn check_slot_key(&self, slot: u32, key: &[u8]) -> bool {
        match &self.header {
            Header::Luks1(_) => self.check_key(key),
            Header::Luks2(h) => h
                .meta
                .digest_of(slot)
                .is_some_and(|(_, d)| keyslot::digest_matches(d, key)),
        }
    }

    /// The PBKDF2 digest a key from keyslot `slot` is checked against when
    /// unlocking for `usable` (the volume key's digest, or the keyslot's
    /// own), as a [`Kdf`] for [`CostLimit::check`].
    fn digest_kdf(&self, slot: u32, usable: SlotUse) -> Option<Kdf> {
        let (hash, iterations) = match &self.header {
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

    /// Keyslot `slot`'s priority: 0 ignore, 1 normal, 2 preferred.
    pub fn slot_priority(&self, slot: u32) -> u32 {
        match &self.header {
            Header::Luks1(_) => 1,
            Header::Luks2(h) => h.meta.keyslots.get(&slot).map_or(1, |k| k.priority),
        }
    }

    /// [`Volume::unlock`] over the keyslots `usable` admits. A keyslot
    /// that cannot serve is skipped without running its KDF, and the error
    /// is cryptsetup's: within a priority class the last keyslot tried
    /// decides between a wrong passphrase (exit 2) and no usable keyslot
    /// (exit 1), and a wrong passphrase for a preferred keyslot beats an
    /// unusable normal one.
    pub fn unlock_for(
        &self,
        passphrase: &[u8],
        only: Option<u32>,
        usable: SlotUse,
    ) -> Result<(u32, Zeroizing<Vec<u8>>), LuksError> {
        let spec = self.luks1_spec();
        let order = self.try_order(only);
        if order.is_empty() {
            return Err(LuksError::NoUsableKeyslot);
        }
        let serves = |s: u32| usable == SlotUse::Any || !self.slot_is_unbound(s);
        if let Some(limit) = &self.cost_limit {
            let costs: Vec<SlotCost> = order
                .iter()
                .filter(|&&s| serves(s))
                .filter_map(|&s| {
                    self.slot_kdf(s).map(|kdf| SlotCost {
                        slot: s,
                        kdf,
                        digest: self.digest_kdf(s, usable),
                    })
                })
                .collect();
            limit.check(&costs)?;
        }
        // `wrong`: the current class's last keyslot refused the passphrase
        // (rather than being unusable); `preferred_wrong`: the same for the
        // preferred class once the normal one has begun.
        let (mut wrong, mut preferred_wrong) = (false, false);
        let mut class = None;
        for slot in order {
            let prio = self.slot_priority(slot);
            if class == Some(2) && prio != 2 {
                preferred_wrong = wrong;
            }
            class = Some(prio);
            let params = self.slot_params(slot).filter(|_| serves(slot));
            let Some(mut p) = params else {
                wrong = false;
                continue;
            };
            if self.version() == 1 {
                p.encryption = &spec;
            }
            let key = keyslot::unlock(&self.meta, &p, passphrase)?;
            let ok = match usable {
                SlotUse::Segment => self.check_key(&key),
                SlotUse::Any => self.check_slot_key(slot, &key),
            };
            if ok {
                return Ok((slot, key));
            }
            wrong = true;
        }
        if wrong || preferred_wrong {
            Err(LuksError::WrongPassphrase)
        } else {
            Err(LuksError::NoUsableKeyslot)
        }
    }

    /// The dm-crypt mapping for `key` (already verified).
    pub fn activation(
        &self,
        key: Zeroizing<Vec<u8>>,
        keyslot: u32,
    ) -> Result<Activation, LuksError> {
        self.check_requirements()?;
        let dev_sectors = self.data_size / 512;
        let mut segments = Vec::new();
        let mut options = Vec::new();
        match &self.header {
            Header::Luks1(h) => {
                let off = u64::from(h.payload_offset);
                if dev_sectors <= off {
                    return Err(LuksError::field(
                        "payload-offset",
                        off,
                        format!("data device has only {dev_sectors} sectors"),
                    ));
                }
                segments.push(MappedSegment {
                    cipher: h.cipher_spec(),
                    offset_sectors: off,
                    len_sectors: dev_sectors - off,
                    sector_size: 512,
                    iv_offset: 0,
                    key_index: 0,
                    linear: false,
                });
            }
            Header::Luks2(h) => {
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
                for (n, s) in regular {
                    if s.kind != "crypt" {
                        return Err(LuksError::Unsupported(format!(
                            "segments.{n}.type = {}",
                            s.kind
                        )));
                    }
                    if s.integrity {
                        return Err(LuksError::Unsupported(format!(
                            "segments.{n}.integrity (authenticated encryption)"
                        )));
                    }
                    let off = s.offset / 512;
                    let len = match s.size {
                        Some(b) => b / 512,
                        None => {
                            if dev_sectors <= off {
                                return Err(LuksError::field(
                                    format!("segments.{n}.offset"),
                                    s.offset,
                                    format!("data device has only {} bytes", self.data_size),
                                ));
                            }
                            dev_sectors - off
                        }
                    };
                    if off + len > dev_sectors {
                        return Err(LuksError::field(
                            format!("segments.{n}.size"),
                            len * 512,
                            format!(
                                "segment ends beyond the data device ({} bytes)",
                                self.data_size
                            ),
                        ));
                    }
                    if (len * 512) % u64::from(s.sector_size) != 0 {
                        return Err(LuksError::field(
                            format!("segments.{n}.size"),
                            len * 512,
                            format!(
                                "device size is not aligned to the {}-byte sector size",
                                s.sector_size
                            ),
                        ));
                    }
                    let iv_offset = if single { 0 } else { s.iv_tweak };
                    segments.push(MappedSegment {
                        cipher: s.encryption.clone(),
                        offset_sectors: off,
                        len_sectors: len,
                        sector_size: s.sector_size,
                        iv_offset,
                        key_index: 0,
                        linear: false,
                    });
                }
                for (flag, opt) in FLAG_OPTIONS {
                    if h.meta.flags.iter().any(|f| f == flag) {
                        options.push(opt);
                    }
                }
            }
        }
        Ok(Activation {
            key,
            other_keys: Vec::new(),
            segments,
            options,
            keyslot,
            version: self.version(),
            uuid: self.uuid().to_string(),
            warnings: self.warnings(),
        })
    }

    pub(crate) fn write_header(&mut self) -> Result<(), LuksError> {
        match &mut self.header {
            Header::Luks1(h) => {
                let b = h.to_bytes();
                self.meta.write_at(0, &b)?;
                self.meta.sync()
            }
            Header::Luks2(h) => h.write(&mut self.meta),
        }
    }

    /// First free keyslot number.
    pub fn free_slot(&self) -> Option<u32> {
        match &self.header {
            Header::Luks1(h) => (0..8u32).find(|&i| !h.slots[i as usize].active),
            Header::Luks2(h) => (0..super::json::MAX_KEYSLOTS).find(|i| {
                !h.meta.keyslots.contains_key(i) && !h.meta.other_keyslots.contains_key(i)
            }),
        }
    }

    /// Add a keyslot for `passphrase` holding the verified `key`; returns its
    /// number. `af_hash` is the LUKS2 AF hash (LUKS1 always uses its header hash).
    pub fn add_key(
        &mut self,
        key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: Kdf,
        af_hash: HashAlg,
    ) -> Result<u32, LuksError> {
        self.add_key_to(key, passphrase, slot, kdf, af_hash, Binding::Volume)
    }

    /// [`Volume::add_key`] with the keyslot bound as `binding` says (LUKS2;
    /// LUKS1 knows only the volume key).
    pub fn add_key_to(
        &mut self,
        key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: Kdf,
        af_hash: HashAlg,
        binding: Binding,
    ) -> Result<u32, LuksError> {
        self.check_requirements()?;
        let binding = match binding {
            Binding::NewUnbound { .. } if self.version() == 1 => {
                return Err(LuksError::Usage("Unbound keys need a LUKS2 header.".into()))
            }
            Binding::NewUnbound { .. } if self.check_key(key) => Binding::Volume,
            b => b,
        };
        let matches = match binding {
            Binding::Volume => self.check_key(key),
            Binding::Digest(d) => match &self.header {
                Header::Luks2(h) => h
                    .meta
                    .digests
                    .get(&d)
                    .is_some_and(|d| keyslot::digest_matches(d, key)),
                Header::Luks1(_) => self.check_key(key),
            },
            Binding::NewUnbound { .. } => true,
        };
        if !matches {
            return Err(LuksError::Usage(
                "volume key does not match the header digest".into(),
            ));
        }
        kdf.check("new keyslot kdf")?;
        let slot = match slot {
            Some(s) => {
                if self.active_slots().contains(&s)
                    || matches!(&self.header, Header::Luks2(h) if h.meta.other_keyslots.contains_key(&s))
                {
                    return Err(LuksError::Usage(format!(
                        "Key slot {s} is full, please select another one."
                    )));
                }
                let max = if self.version() == 1 {
                    8
                } else {
                    super::json::MAX_KEYSLOTS
                };
                if s >= max {
                    return Err(LuksError::Usage(format!(
                        "Key slot {s} is invalid (0..{}).",
                        max - 1
                    )));
                }
                s
            }
            None => self
                .free_slot()
                .ok_or_else(|| LuksError::Usage("All key slots full.".into()))?,
        };
        let salt = keyslot::random(32)?;
        match &mut self.header {
            Header::Luks1(h) => {
                let Kdf::Pbkdf2 { iterations, .. } = kdf else {
                    return Err(LuksError::Usage(
                        "LUKS1 keyslots only support pbkdf2".into(),
                    ));
                };
                let spec = h.cipher_spec();
                let s = &h.slots[slot as usize];
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
                let material = keyslot::seal(&p, passphrase, key)?;
                let off = p.offset;
                self.meta.write_at(off, &material)?;
                self.meta.sync()?;
                let s = &mut h.slots[slot as usize];
                s.active = true;
                s.iterations = iterations;
                s.salt.copy_from_slice(&salt);
            }
            Header::Luks2(h) => {
                let hdr_size = h.bin.hdr_size;
                let (segment_digest, _) = h.meta.segment_digest().ok_or_else(|| {
                    LuksError::field("digests", "{}", "no digest bound to segment 0")
                })?;
                // A new unbound key gets a digest of its own, written with
                // its keyslot in one header update.
                let mut meta = h.meta.clone();
                let digest_id = match binding {
                    Binding::Volume => segment_digest,
                    Binding::Digest(d) => d,
                    Binding::NewUnbound { hash, iterations } => {
                        // cryptsetup takes the lowest free digest number.
                        let d = (0..super::json::MAX_KEYSLOTS)
                            .find(|i| !meta.digests.contains_key(i))
                            .ok_or_else(|| LuksError::Usage("No free digest.".into()))?;
                        let dsalt = keyslot::random(32)?;
                        let dg =
                            keyslot::key_digest(hash, key, &dsalt, iterations, hash.digest_len());
                        let entry = json!({
                            "type": "pbkdf2", "keyslots": [], "segments": [],
                            "hash": hash.name(), "iterations": iterations,
                            "salt": b64_encode(&dsalt), "digest": b64_encode(&dg),
                        });
                        meta = meta.edit(hdr_size, |top| {
                            if let Some(ds) = top.get_mut("digests").and_then(|d| d.as_object_mut())
                            {
                                ds.insert(d.to_string(), entry);
                            }
                        })?;
                        d
                    }
                };
                let (encryption, area_key_size) = match h.meta.keyslots.values().next() {
                    Some(k) => (k.area_encryption.clone(), k.area_key_size),
                    None => {
                        let seg = h.meta.segments.get(&0).ok_or_else(|| {
                            LuksError::field("segments.0", "(missing)", "no segment")
                        })?;
                        (seg.encryption.clone(), key.len() as u32)
                    }
                };
                let key_size = key.len();
                let size = (key_size as u64 * u64::from(super::af::STRIPES)).div_ceil(4096) * 4096;
                let offset = alloc_area(h, size).ok_or_else(|| {
                    LuksError::Usage("No space for new keyslot in the LUKS2 keyslots area.".into())
                })?;
                let p = SlotParams {
                    kdf,
                    salt: &salt,
                    af_hash,
                    stripes: super::af::STRIPES,
                    offset,
                    encryption: &encryption,
                    area_key_size: area_key_size as usize,
                    key_size,
                };
                let material = keyslot::seal(&p, passphrase, key)?;
                let kdf_json = match kdf {
                    Kdf::Pbkdf2 { hash, iterations } => {
                        json!({"type": "pbkdf2", "hash": hash.name(), "iterations": iterations, "salt": b64_encode(&salt)})
                    }
                    Kdf::Argon2 {
                        time,
                        memory_kib,
                        cpus,
                        ..
                    } => {
                        json!({"type": kdf.type_name(), "time": time, "memory": memory_kib, "cpus": cpus, "salt": b64_encode(&salt)})
                    }
                };
                let ks = json!({
                    "type": "luks2",
                    "key_size": key_size,
                    "af": {"type": "luks1", "stripes": super::af::STRIPES, "hash": af_hash.name()},
                    "area": {"type": "raw", "offset": offset.to_string(), "size": size.to_string(), "encryption": encryption, "key_size": area_key_size},
                    "kdf": kdf_json,
                });
                let new_meta = meta.with_keyslot(hdr_size, slot, ks, digest_id)?;
                // Material first, header second: a crash in between leaves an unreferenced area.
                self.meta.write_at(offset, &material)?;
                self.meta.sync()?;
                h.meta = new_meta;
            }
        }
        self.write_header()?;
        Ok(slot)
    }

    /// Remove keyslot `slot`: un-reference it in the header, then wipe its area.
    pub fn kill_slot(&mut self, slot: u32) -> Result<(), LuksError> {
        self.check_requirements()?;
        if !self.active_slots().contains(&slot) {
            return Err(LuksError::Usage(format!("Keyslot {slot} is not active.")));
        }
        let (off, len) = match &mut self.header {
            Header::Luks1(h) => {
                let s = &mut h.slots[slot as usize];
                s.active = false;
                s.iterations = 0;
                s.salt = [0; 32];
                (
                    u64::from(s.key_offset) * 512,
                    luks1::area_sectors(h.key_bytes) * 512,
                )
            }
            Header::Luks2(h) => {
                let k = &h.meta.keyslots[&slot];
                let area = (k.area_offset, k.area_size);
                h.meta = h.meta.without_keyslot(h.bin.hdr_size, slot)?;
                area
            }
        };
        self.write_header()?;
        self.meta.zero(off, len, &mut |_| {})?;
        self.meta.sync()
    }
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
