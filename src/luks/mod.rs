//! LUKS1 and LUKS2 volumes, interchangeable with cryptsetup: read and validate
//! headers (never trusting a field before it is checked), unlock keyslots,
//! produce the dm-crypt table cryptsetup would load, and create or change
//! headers with crash-safe write ordering.
//!
//! Entry points: [`open`] (passphrase -> [`Activation`] -> dm table text),
//! [`read_passphrase`], and [`volume::Volume`] / [`format`] for management.

pub mod af;
pub mod change;
pub mod cipher;
pub mod convert;
pub mod cost;
pub mod crypttab;
pub mod disk;
pub mod dump;
pub mod error;
pub mod feedback;
pub mod foreign;
pub mod format;
pub mod hash;
pub mod header;
pub mod integrity;
pub mod json;
pub mod kdf;
pub mod keyring;
pub mod keyslot;
pub mod luks1;
pub mod luks2;
pub mod ops;
pub mod passphrase;
pub mod pbkdf;
pub mod plain;
pub mod reencrypt;
pub mod repair;
pub mod secret;
pub mod volume;

pub use error::LuksError;
pub use passphrase::read_passphrase;

use std::fmt;
use std::path::Path;
use zeroize::Zeroizing;

/// One crypt line of an activation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedSegment {
    /// dm-crypt cipher spec.
    pub cipher: String,
    /// Data start on the data device, 512-byte sectors.
    pub offset_sectors: u64,
    /// Length, 512-byte sectors.
    pub len_sectors: u64,
    pub sector_size: u32,
    /// dm-crypt iv_offset (512-byte units).
    pub iv_offset: u64,
    /// Which key maps it: 0 the volume key, n the n-th of
    /// [`Activation::other_keys`] (a device in reencryption has two).
    pub key_index: usize,
    /// Plaintext (`linear`): the side of an encryption or decryption in
    /// progress that has no key.
    pub linear: bool,
}

/// An unlocked volume: what dm-crypt needs to map it. Holds the volume key
/// (zeroized on drop, never shown by `Debug`).
pub struct Activation {
    key: Zeroizing<Vec<u8>>,
    /// Keys of further segments (reencryption in progress).
    other_keys: Vec<Zeroizing<Vec<u8>>>,
    pub segments: Vec<MappedSegment>,
    /// Optional dm-crypt flags from the LUKS2 config (allow_discards, ...).
    pub options: Vec<&'static str>,
    /// The keyslot that opened.
    pub keyslot: u32,
    /// 1 or 2.
    pub version: u8,
    pub uuid: String,
    /// Problems noticed while reading the header (e.g. primary copy damaged).
    pub warnings: Vec<String>,
    /// Authenticated LUKS2: the integrity device (`NAME_dif`) the crypt
    /// line must be mapped over, at offset 0 (see [`Activation::table`]).
    pub integrity: Option<integrity::Layer>,
}

impl fmt::Debug for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Activation")
            .field("key", &format_args!("<{} bytes hidden>", self.key.len()))
            .field("segments", &self.segments)
            .field("options", &self.options)
            .field("keyslot", &self.keyslot)
            .field("version", &self.version)
            .finish()
    }
}

impl Activation {
    /// The volume key (for `dump --dump-volume-key` and tests).
    pub fn volume_key(&self) -> &[u8] {
        &self.key
    }

    /// Mapped size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len_sectors * 512).sum()
    }

    /// The dmsetup table cryptsetup would load, one crypt line per segment:
    /// `<start> <len> crypt <cipher> <hexkey> <iv_offset> <dev> <offset> [<n> <opts>...]`.
    /// With [`Activation::integrity`], `data_device` must be the integrity
    /// device (`@NAME_dif`, whose table is [`integrity::Layer::table`]).
    ///
    /// The text holds the key in hex, so it is written into one buffer
    /// sized for all of it up front: no reallocation leaves a copy behind,
    /// and the buffer is wiped on drop.
    pub fn table(&self, data_device: &str) -> Zeroizing<String> {
        use std::fmt::Write;
        let opts_len: usize = self.options.iter().map(|o| o.len() + 1).sum::<usize>() + 40;
        let klen = self
            .other_keys
            .iter()
            .map(|k| k.len())
            .fold(self.key.len(), usize::max);
        let per_line = 6 * 21 + 16 + 2 * klen + data_device.len() + opts_len;
        let cap: usize = self
            .segments
            .iter()
            .map(|s| per_line + s.cipher.len())
            .sum::<usize>()
            .max(1);
        let mut out = Zeroizing::new(String::with_capacity(cap));
        let mut start = 0u64;
        for s in &self.segments {
            if s.linear {
                let _ = writeln!(
                    out,
                    "{start} {} linear {data_device} {}",
                    s.len_sectors, s.offset_sectors
                );
                start += s.len_sectors;
                continue;
            }
            let _ = write!(out, "{start} {} crypt {} ", s.len_sectors, s.cipher);
            let key = match s.key_index {
                0 => &self.key,
                n => self.other_keys.get(n - 1).unwrap_or(&self.key),
            };
            for b in key.iter() {
                let _ = write!(out, "{b:02x}");
            }
            let _ = write!(out, " {} {data_device} {}", s.iv_offset, s.offset_sectors);
            let n = self.options.len()
                + usize::from(s.sector_size != 512)
                + usize::from(self.integrity.is_some());
            if n > 0 {
                let _ = write!(out, " {n}");
                for o in &self.options {
                    let _ = write!(out, " {o}");
                }
                if s.sector_size != 512 {
                    let _ = write!(out, " sector_size:{}", s.sector_size);
                }
                if let Some(l) = &self.integrity {
                    let _ = write!(out, " integrity:{}:aead", l.tag_size);
                }
            }
            out.push('\n');
            start += s.len_sectors;
        }
        debug_assert!(out.capacity() == cap, "key table outgrew its buffer");
        out
    }
}

/// Open the LUKS volume in `image` (header in `image`, or in the detached
/// `header` file) with `passphrase`, verifying the key against the digest.
pub fn open(
    image: &Path,
    header: Option<&Path>,
    passphrase: &[u8],
) -> Result<Activation, LuksError> {
    open_with(image, header, passphrase, false)
}

/// [`open`], also mapping null or ECB ciphers when `allow_weak_cipher`
/// (the user's `--allow-weak-cipher`).
pub fn open_with(
    image: &Path,
    header: Option<&Path>,
    passphrase: &[u8],
    allow_weak_cipher: bool,
) -> Result<Activation, LuksError> {
    open_checked(image, header, passphrase, allow_weak_cipher, false)
}

/// [`open_with`], with the KDF cost limit lifted when `no_cost_limit`
/// (the user's `--no-kdf-limit`).
fn open_checked(
    image: &Path,
    header: Option<&Path>,
    passphrase: &[u8],
    allow_weak_cipher: bool,
    no_cost_limit: bool,
) -> Result<Activation, LuksError> {
    let mut vol = volume::Volume::load(image, header, false)?;
    vol.allow_weak_cipher = allow_weak_cipher;
    if no_cost_limit {
        vol.cost_limit = None;
    }
    if let Some(act) = reencrypt::activation(&vol, passphrase)? {
        return Ok(act);
    }
    vol.check_requirements()?;
    let (slot, key) = vol.unlock(passphrase, None)?;
    vol.activation(key, slot)
}

/// Unlock the LUKS volume in `image` for serving and return the devices
/// `cryptsetup open` would create, each a name and its table: `name` with
/// the crypt table, and for an authenticated LUKS2 volume first the
/// integrity device `NAME_dif` the crypt table names. The passphrase
/// comes from `key_file` (`-` for stdin) or the terminal, the header from
/// the image or a detached `header` file.
pub fn activation_tables(
    name: &str,
    image: &str,
    header: Option<&Path>,
    key_file: Option<&Path>,
    allow_weak_cipher: bool,
    no_kdf_limit: bool,
) -> Result<Vec<(String, Zeroizing<String>)>, String> {
    let pass = read_passphrase(key_file, &format!("Enter passphrase for {image}: "))
        .map_err(|e| format!("LUKS device {name}: {e}"))?;
    let act = open_checked(
        Path::new(image),
        header,
        &pass,
        allow_weak_cipher,
        no_kdf_limit,
    )
    .map_err(|e| format!("LUKS device {name} on {image}: {e}"))?;
    // Header warnings (e.g. a damaged primary copy) were logged by the
    // LUKS reader itself.
    tracing::info!(
        "LUKS device {name}: LUKS{} volume {} opened with keyslot {}",
        act.version,
        act.uuid,
        act.keyslot
    );
    let dev = crate::core::table::escape_arg(image);
    Ok(match &act.integrity {
        Some(l) => {
            let dif = integrity::dif_name(name);
            let t = l.table(&dev, crate::targets::integrity::params::Mode::Journal);
            let crypt = act.table(&format!("@{dif}"));
            vec![(dif, Zeroizing::new(t)), (name.to_string(), crypt)]
        }
        None => vec![(name.to_string(), act.table(&dev))],
    })
}
