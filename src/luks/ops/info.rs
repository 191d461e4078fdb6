//! Verbs that read or relabel the header: luksDump, luksUUID, isLuks and
//! config.

use super::{unlock, Device, Unlock};
use crate::luks::dump;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::secret::SecretText;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// What luksDump prints.
#[derive(Clone, Debug, Default)]
pub enum DumpKind {
    #[default]
    Header,
    Json,
    /// The volume key (asks for a passphrase); with a file, the key goes
    /// there (raw, mode 0400, created exclusively) instead of the screen.
    VolumeKey(Option<PathBuf>),
    /// The unbound key of a keyslot (`--unbound --key-slot N`), to the
    /// screen or a file as `VolumeKey`.
    UnboundKey(u32, Option<PathBuf>),
}

/// Text for stdout: plain, or a secret-bearing buffer.
pub enum DumpText {
    Plain(String),
    Secret(SecretText),
}

impl DumpText {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            DumpText::Plain(s) => s.as_bytes(),
            DumpText::Secret(s) => s.as_bytes(),
        }
    }
}

/// luksDump.
pub fn luks_dump(
    dev: &Device,
    kind: &DumpKind,
    u: &Unlock,
    fb: &dyn Feedback,
) -> Result<DumpText, LuksError> {
    let v = dev.load(false, fb)?;
    let name = dev.meta_path().display().to_string();
    match kind {
        DumpKind::Header => Ok(DumpText::Plain(dump::header_text(&v, &name))),
        DumpKind::Json => dump::json_text(&v).map(DumpText::Plain),
        DumpKind::VolumeKey(file) => {
            if !fb.confirm(
                "The header dump with volume key is sensitive information\nthat allows access to encrypted partition without a passphrase.\nThis dump should be stored encrypted in a safe place.",
            )? {
                return Err(LuksError::Denied("Operation aborted.".into()));
            }
            let (_, key) = unlock(&v, u, &format!("Enter passphrase for {name}: "))?;
            let data_name = dev.path.display().to_string();
            if let Some(p) = file {
                write_key_file(p, &key)?;
            }
            dump::volume_key_text(&v, &key, &data_name, file.as_deref()).map(DumpText::Secret)
        }
        DumpKind::UnboundKey(slot, file) => {
            // cryptsetup checks the keyslot before it asks anything.
            if !v.slot_is_unbound(*slot) {
                return Err(LuksError::Usage(format!(
                    "Keyslot {slot} does not contain unbound key."
                )));
            }
            if !fb.confirm(
                "The header dump with unbound key is sensitive information.\nThis dump should be stored encrypted in a safe place.",
            )? {
                return Err(LuksError::Denied("Operation aborted.".into()));
            }
            let u = Unlock {
                slot: Some(*slot),
                unbound: true,
                ..u.clone()
            };
            let (_, key) = unlock(&v, &u, &format!("Enter passphrase for {name}: "))?;
            if let Some(p) = file {
                write_key_file(p, &key)?;
            }
            let data_name = dev.path.display().to_string();
            dump::unbound_key_text(&v, *slot, &key, &data_name, file.as_deref())
                .map(DumpText::Secret)
        }
    }
}

/// A key to a new file: raw, mode 0400, created exclusively (never over
/// an existing file).
fn write_key_file(p: &std::path::Path, key: &[u8]) -> Result<(), LuksError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(p)
        .map_err(|e| LuksError::io(format!("Cannot create volume key file {}", p.display()), e))?;
    f.write_all(key)
        .and_then(|_| f.sync_all())
        .map_err(|e| LuksError::io(format!("Cannot write volume key file {}", p.display()), e))
}

/// luksUUID: print the UUID, or set it (`--uuid`).
pub fn luks_uuid(
    dev: &Device,
    set: Option<&str>,
    fb: &dyn Feedback,
) -> Result<Option<String>, LuksError> {
    let mut v = dev.load(set.is_some(), fb)?;
    match set {
        None => Ok(Some(v.uuid().to_string())),
        Some(u) => {
            if !fb.confirm("Do you really want to change UUID of device?")? {
                return Err(LuksError::Usage("Operation aborted.".into()));
            }
            v.set_uuid(u)?;
            Ok(None)
        }
    }
}

/// isLuks: Ok when the device carries a valid LUKS header of `version`
/// (None: any).
pub fn is_luks(dev: &Device, version: Option<u8>) -> Result<(), LuksError> {
    let v = dev.load(false, &crate::luks::feedback::Quiet)?;
    match version {
        Some(want) if want != v.version() => {
            Err(LuksError::NotLuks(dev.meta_path().display().to_string()))
        }
        _ => Ok(()),
    }
}

/// config: keyslot priority and the LUKS2 labels.
#[derive(Clone, Debug, Default)]
pub struct ConfigOpts {
    /// (slot, priority: 0 ignore, 1 normal, 2 prefer).
    pub priority: Option<(u32, u32)>,
    pub label: Option<String>,
    pub subsystem: Option<String>,
}

pub fn config(dev: &Device, o: &ConfigOpts, fb: &dyn Feedback) -> Result<(), LuksError> {
    if o.priority.is_none() && o.label.is_none() && o.subsystem.is_none() {
        return Err(LuksError::Usage(
            "Option --priority, --label or --subsystem is missing.".into(),
        ));
    }
    let mut v = dev.load(true, fb)?;
    if v.header.luks2().is_none() {
        return Err(LuksError::NotLuks2(dev.meta_path().display().to_string()));
    }
    if let Some((slot, p)) = o.priority {
        v.set_priority(slot, p)?;
    }
    if o.label.is_some() || o.subsystem.is_some() {
        v.set_label(o.label.as_deref(), o.subsystem.as_deref())?;
    }
    Ok(())
}
