//! A LUKS volume on disk: its metadata device (the image, or a detached header
//! file), its data device, and the operations that read or change keyslots.
//! Every change orders its writes so that a crash at any point leaves all
//! previously valid passphrases working: new key material is written before a
//! header references it, and old material is wiped only after no header does.

use super::cost::{CostLimit, SlotCost};
use super::disk::Disk;
use super::error::LuksError;
use super::hash::HashAlg;
use super::header::NewSlot;
use super::kdf::Kdf;
use super::keyslot::{self, SlotParams};
use super::{luks1, luks2, Activation};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

pub use super::header::{Binding, Header, SlotUse};

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
    /// Map (and unlock through) null or ECB ciphers, which udm otherwise
    /// refuses: see [`super::cipher::is_weak`].
    pub allow_weak_cipher: bool,
}

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
            luks1::Header::parse(&buf, meta_size)?.into()
        } else if head[..6] == luks1::MAGIC && head[6..8] != [0, 2] {
            return Err(LuksError::field(
                "version",
                u16::from_be_bytes([head[6], head[7]]),
                "unsupported LUKS version",
            ));
        } else {
            luks2::read(&meta)?.into()
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
            allow_weak_cipher: false,
        };
        v.check_data_offset()?;
        Ok(v)
    }

    pub fn version(&self) -> u8 {
        self.header.version()
    }

    pub fn uuid(&self) -> &str {
        self.header.uuid()
    }

    /// Warnings from reading the header (e.g. damaged primary copy).
    pub fn warnings(&self) -> Vec<String> {
        self.header.warnings()
    }

    /// Active keyslot numbers.
    pub fn active_slots(&self) -> Vec<u32> {
        self.header.active_slots()
    }

    /// Bytes of the metadata area (what header-backup copies; for LUKS1, as
    /// cryptsetup, the keyslot areas' end rounded up to 4 KiB).
    pub fn header_len(&self) -> u64 {
        self.header.backup_len()
    }

    /// The data offset in bytes as the header states it (see
    /// [`Header::data_offset`]).
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset()
    }

    /// Refuse headers whose requirement flags udm does not implement.
    pub fn check_requirements(&self) -> Result<(), LuksError> {
        self.header.check_requirements()
    }

    fn slot_params(&self, slot: u32) -> Option<SlotParams<'_>> {
        self.header.slot_params(slot)
    }

    /// True if `key` is this volume's (segment) key.
    pub fn check_key(&self, key: &[u8]) -> bool {
        self.header.check_key(key)
    }

    /// Keyslots to try, in cryptsetup's order; `only` alone if given.
    fn try_order(&self, only: Option<u32>) -> Vec<u32> {
        match only {
            Some(s) => vec![s],
            None => self.header.try_order(),
        }
    }

    /// With the header inside the data device, data must start after the
    /// metadata (see [`Header::check_data_offset`]); a detached header
    /// leaves the whole data device to data.
    pub fn check_data_offset(&self) -> Result<(), LuksError> {
        if self.detached {
            return Ok(());
        }
        self.header.check_data_offset()
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
        self.header.slot_is_unbound(slot)
    }

    /// Keyslot `slot`'s priority: 0 ignore, 1 normal, 2 preferred.
    pub fn slot_priority(&self, slot: u32) -> u32 {
        self.header.slot_priority(slot)
    }

    /// The digest check for a key from keyslot `slot`: the volume key's
    /// digest, or with `usable` Any the keyslot's own.
    fn key_fits(&self, slot: u32, key: &[u8], usable: SlotUse) -> bool {
        match usable {
            SlotUse::Segment => self.check_key(key),
            SlotUse::Any => self.header.check_slot_key(slot, key),
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
        let spec = self.header.luks1_area_cipher();
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
                        digest: self.header.digest_kdf(s, usable),
                        key_len: self.slot_params(s).map_or(0, |p| p.area_key_size),
                        digest_len: self.header.digest_len(s, usable),
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
            if let Some(e) = self.header.unusable_slot(slot) {
                return Err(e);
            }
            let params = self.slot_params(slot).filter(|_| serves(slot));
            let Some(mut p) = params else {
                wrong = false;
                continue;
            };
            if !spec.is_empty() {
                p.encryption = &spec;
            }
            self.refuse_weak(&format!("keyslot {slot}'s area"), p.encryption)?;
            let key = keyslot::unlock(&self.meta, &p, passphrase)?;
            if self.key_fits(slot, &key, usable) {
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

    /// Err when `cipher` (used by `what`) is weak and the user has not
    /// allowed that.
    fn refuse_weak(&self, what: &str, cipher: &str) -> Result<(), LuksError> {
        if self.allow_weak_cipher || !super::cipher::is_weak(cipher) {
            return Ok(());
        }
        Err(LuksError::WeakCipher {
            what: what.to_string(),
            cipher: cipher.to_string(),
        })
    }

    /// The dm-crypt mapping for `key` (already verified).
    pub fn activation(
        &self,
        key: Zeroizing<Vec<u8>>,
        keyslot: u32,
    ) -> Result<Activation, LuksError> {
        self.check_requirements()?;
        let (mut segments, options) = self.header.mapped_segments(self.data_size)?;
        for (n, s) in segments.iter().enumerate().filter(|(_, s)| !s.linear) {
            self.refuse_weak(&format!("data segment {n}"), &s.cipher)?;
        }
        let integrity = super::integrity::layer_of(&self.header, &self.data_path)?;
        if let (Some(l), [seg]) = (&integrity, segments.as_mut_slice()) {
            // cryptsetup's stack: the crypt line over NAME_dif from its
            // start, as long as the integrity device provides.
            let spec = super::cipher::authenticated_dm_cipher(&seg.cipher, &l.kind, l.tag_size)
                .ok_or_else(|| {
                    LuksError::Unsupported(format!("integrity {} with {}", l.kind, seg.cipher))
                })?;
            seg.cipher = spec.split(' ').next().unwrap_or("").to_string();
            seg.offset_sectors = 0;
            seg.len_sectors = l.provided_sectors;
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
            integrity,
        })
    }

    pub(crate) fn write_header(&mut self) -> Result<(), LuksError> {
        self.header.write(&mut self.meta)
    }

    /// First free keyslot number.
    pub fn free_slot(&self) -> Option<u32> {
        self.header.free_slot()
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
            Binding::Digest(d) => self.header.digest_matches(d, key),
            Binding::NewUnbound { .. } => true,
        };
        if !matches {
            return Err(LuksError::Usage(
                "volume key does not match the header digest".into(),
            ));
        }
        kdf.check("new keyslot kdf")?;
        let slot = self.pick_slot(slot)?;
        let new = NewSlot {
            slot,
            key,
            passphrase,
            kdf,
            af_hash,
        };
        self.header.seal_slot(&mut self.meta, new, binding)?;
        self.write_header()?;
        Ok(slot)
    }

    /// The keyslot a new key goes to: `slot` if it is free and in range,
    /// else the first free one; cryptsetup's messages otherwise.
    fn pick_slot(&self, slot: Option<u32>) -> Result<u32, LuksError> {
        let Some(s) = slot else {
            return self
                .free_slot()
                .ok_or_else(|| LuksError::Usage("All key slots full.".into()));
        };
        if self.header.slot_taken(s) {
            return Err(LuksError::Usage(format!(
                "Key slot {s} is full, please select another one."
            )));
        }
        let max = self.header.max_slots();
        if s >= max {
            return Err(LuksError::Usage(format!(
                "Key slot {s} is invalid (0..{}).",
                max - 1
            )));
        }
        Ok(s)
    }

    /// Remove keyslot `slot`: un-reference it in the header, then wipe its area.
    pub fn kill_slot(&mut self, slot: u32) -> Result<(), LuksError> {
        self.check_requirements()?;
        if !self.active_slots().contains(&slot) {
            return Err(LuksError::Usage(format!("Keyslot {slot} is not active.")));
        }
        let (off, len) = self.header.release_slot(slot)?;
        self.write_header()?;
        self.meta.zero(off, len, &mut |_| {})?;
        self.meta.sync()
    }
}
