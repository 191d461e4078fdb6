//! luksFormat: ask, read the passphrase (twice on a terminal), resolve the
//! PBKDF, write the header and the first keyslot.

use super::{confirm_or, read_volume_key_file, Device};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::format::{self, FormatParams};
use crate::luks::hash::HashAlg;
use crate::luks::passphrase::KeySource;
use crate::luks::pbkdf::PbkdfChoice;
use std::path::PathBuf;

/// A luksFormat request (cryptsetup's options, None = its default).
#[derive(Clone, Debug, Default)]
pub struct FormatOpts {
    pub dev: Device,
    pub key: KeySource,
    /// 1 or 2 (`--type luks1|luks2|luks`).
    pub version: u8,
    pub cipher: Option<String>,
    /// Volume key size in bits.
    pub key_bits: Option<u32>,
    pub sector_size: Option<u32>,
    pub label: Option<String>,
    pub subsystem: Option<String>,
    pub uuid: Option<String>,
    pub metadata_size: Option<u64>,
    pub keyslots_size: Option<u64>,
    /// `--offset`, 512-byte sectors.
    pub offset_sectors: Option<u64>,
    /// `--align-payload`, 512-byte sectors.
    pub align_sectors: Option<u64>,
    pub key_slot: Option<u32>,
    pub volume_key_file: Option<PathBuf>,
    pub pbkdf: PbkdfChoice,
    /// udm's `--size`: create or grow the image file to this many bytes.
    pub create_size: Option<u64>,
    /// `--integrity` as given (`aead`, `poly1305`, `hmac-sha256`,
    /// `hmac-sha512`): authenticated encryption over dm-integrity.
    pub integrity: Option<String>,
    /// `--integrity-no-wipe`: leave the data area's tags unwritten (every
    /// sector reads as an I/O error until written).
    pub integrity_no_wipe: bool,
}

/// `--integrity`: the segment's integrity type and the integrity key's
/// bytes (added to the cipher key, as cryptsetup's
/// `get_adjusted_key_size`), checked against the cipher.
fn integrity_of(o: &FormatOpts, cipher: &str) -> Result<(Option<&'static str>, u32), LuksError> {
    let Some(word) = &o.integrity else {
        return Ok((None, 0));
    };
    if o.version == 1 {
        return Err(LuksError::Usage(
            "Integrity option can be used only for LUKS2 format.".into(),
        ));
    }
    let (kind, key) = format::integrity_mode(word)?;
    if format::integrity_tag_size(kind, cipher) == 0 {
        let hint = if cipher.starts_with("chacha20-poly1305") {
            " (cryptsetup spells ChaCha20-Poly1305 --cipher chacha20-random --integrity poly1305)"
        } else {
            ""
        };
        return Err(LuksError::Usage(format!(
            "Cipher {cipher} with integrity {kind} is not supported by udm{hint}; use \
             aes-gcm-random with aead, chacha20-random with poly1305, or aes-xts-plain64 / \
             aes-xts-random with hmac-sha256 or hmac-sha512."
        )));
    }
    Ok((Some(kind), key))
}

/// cryptsetup's default: 512-bit keys for XTS (two AES-256 keys), 256 otherwise.
pub fn default_key_bits(cipher: &str) -> u32 {
    if cipher.contains("xts") {
        512
    } else {
        256
    }
}

/// Format; returns the keyslot of the passphrase.
pub fn luks_format(o: &FormatOpts, fb: &dyn Feedback) -> Result<u32, LuksError> {
    let version = o.version;
    if version != 1 && version != 2 {
        return Err(LuksError::Usage(format!(
            "Unsupported LUKS type luks{version} (luks1, luks2)."
        )));
    }
    if version == 1 {
        if o.sector_size.is_some_and(|s| s > 512) {
            return Err(LuksError::Usage(
                "Unsupported encryption sector size.".into(),
            ));
        }
        if o.metadata_size.is_some() || o.keyslots_size.is_some() {
            return Err(LuksError::Usage(
                "Unsupported LUKS2 metadata size options.".into(),
            ));
        }
    }
    let cipher = o.cipher.clone().unwrap_or_else(|| "aes-xts-plain64".into());
    let key_bits = o.key_bits.unwrap_or_else(|| default_key_bits(&cipher));
    if key_bits == 0 || key_bits % 8 != 0 {
        return Err(LuksError::Usage(
            "Key size must be a multiple of 8 bits".into(),
        ));
    }
    let (integrity, integrity_key) = integrity_of(o, &cipher)?;
    let image = &o.dev.path;
    if let Some(size) = o.create_size {
        Disk::create(image)?.grow_to(size)?;
    } else if !super::exists(image) {
        return Err(LuksError::Device(image.display().to_string()));
    }
    let mut created = false;
    if let Some(h) = &o.dev.header {
        if !super::exists(h) {
            confirm_or(
                fb,
                "Header file does not exist, do you want to create it?",
                "Operation aborted.",
            )?;
            Disk::create(h)?.grow_to(4096)?;
            created = true;
        }
    }
    if !created {
        confirm_or(
            fb,
            &format!(
                "This will overwrite data on {} irrevocably.",
                o.dev.meta_path().display()
            ),
            "Operation aborted.",
        )?;
    }
    let pass = o.key.read(
        &format!("Enter passphrase for {}: ", o.dev.meta_path().display()),
        true,
    )?;
    let key_len = (key_bits / 8 + integrity_key) as usize;
    let vk = match &o.volume_key_file {
        Some(p) => Some(read_volume_key_file(p, key_len)?),
        None => None,
    };
    let kdf = o.pbkdf.resolve(version, key_len, fb)?;
    let hash = o.pbkdf.hash()?;
    let digest_iterations = o
        .pbkdf
        .digest_iterations(if version == 1 { hash } else { HashAlg::Sha256 }, key_len);
    let p = FormatParams {
        version,
        cipher,
        key_bytes: key_len as u32,
        sector_size: o.sector_size,
        kdf,
        digest_iterations,
        hash,
        label: o.label.clone().unwrap_or_default(),
        uuid: o.uuid.clone(),
        metadata_size: o.metadata_size.unwrap_or(16 * 1024),
        keyslots_size: o.keyslots_size,
        subsystem: o.subsystem.clone().unwrap_or_default(),
        data_offset: o.offset_sectors.map(|s| s * 512),
        align: o.align_sectors.map(|s| s * 512),
        key_slot: o.key_slot,
        integrity: integrity.map(str::to_string),
    };
    if version == 1 && (o.label.is_some() || o.subsystem.is_some()) {
        return Err(LuksError::Usage(
            "Label and subsystem are supported only for LUKS2 devices.".into(),
        ));
    }
    let (key, slot) = format::format(image, o.dev.header.as_deref(), &p, &pass, vk.as_deref(), fb)?;
    if p.integrity.is_some() && !o.integrity_no_wipe {
        wipe_authenticated(o, &key, fb)?;
    }
    Ok(slot)
}

/// cryptsetup's wipe after an authenticated format: zeros through the
/// crypt layer, so every sector's tag authenticates.
fn wipe_authenticated(o: &FormatOpts, key: &[u8], fb: &dyn Feedback) -> Result<(), LuksError> {
    let v = o.dev.load(false, fb)?;
    let Some(layer) = crate::luks::integrity::layer_of(&v.header, &o.dev.path)? else {
        return Ok(());
    };
    let (cipher, _) = v.header.first_segment();
    let spec = crate::luks::cipher::authenticated_dm_cipher(&cipher, &layer.kind, layer.tag_size)
        .ok_or_else(|| {
        LuksError::Unsupported(format!("integrity {} with {cipher}", layer.kind))
    })?;
    let len = layer.provided_sectors * 512;
    fb.begin("Wiping", len);
    let r = layer.wipe(&o.dev.path, &spec, key, &mut |done| fb.advance(done));
    fb.end();
    r
}
