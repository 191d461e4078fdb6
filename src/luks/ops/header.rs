//! Whole-header verbs: luksHeaderBackup and luksHeaderRestore.
//!
//! A backup is created exclusively (`O_EXCL`, never over an existing file)
//! and readable by its owner only (mode 0400): it holds every keyslot, so
//! anyone who can read it can attack the passphrases offline, and anyone
//! with an old passphrase can use it after that passphrase was removed.

use super::{confirm_or, Device};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::volume::Volume;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// luksHeaderBackup: header and keyslot areas (LUKS1: up to the end of the
/// keyslots, 4 KiB aligned; LUKS2: both header copies and the keyslots
/// area), as cryptsetup writes them.
pub fn backup(dev: &Device, file: &Path, fb: &dyn Feedback) -> Result<(), LuksError> {
    let v = dev.load(false, fb)?;
    let len = v.header_len();
    let mut buf = zeroize::Zeroizing::new(vec![0u8; len as usize]);
    v.meta.read_at(0, &mut buf)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(file)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                LuksError::Usage(format!(
                    "Requested header backup file {} already exists.",
                    file.display()
                ))
            } else {
                LuksError::io(
                    format!("Cannot create header backup file {}", file.display()),
                    e,
                )
            }
        })?;
    f.write_all(&buf).and_then(|_| f.sync_all()).map_err(|e| {
        LuksError::io(
            format!("Cannot write header backup file {}", file.display()),
            e,
        )
    })
}

/// luksHeaderRestore: the backup must itself be a valid header; a device
/// that already has one must match its data offset and metadata size, and
/// the user confirms (cryptsetup's wording, with the UUID warning).
pub fn restore(dev: &Device, file: &Path, fb: &dyn Feedback) -> Result<(), LuksError> {
    let target = dev.meta_path().to_path_buf();
    if std::fs::metadata(&target).is_err() {
        return Err(LuksError::Device(target.display().to_string()));
    }
    let backup = Volume::load(&target, Some(file), false).map_err(|e| {
        LuksError::Usage(format!(
            "Backup file does not contain valid LUKS header ({e})."
        ))
    })?;
    if let Some(h) = backup.header.luks2() {
        if h.meta
            .requirements
            .iter()
            .any(|r| r.starts_with("online-reencrypt"))
        {
            return Err(LuksError::Usage(format!(
                "Forbidden LUKS2 requirements detected in backup {}.",
                file.display()
            )));
        }
    }
    let len = backup.header_len();
    let current = Volume::load(&target, None, false).ok();
    let mut msg = format!("Device {} ", target.display());
    match &current {
        None => msg.push_str(
            "does not contain LUKS header. Replacing header can destroy data on that device.",
        ),
        Some(cur) => {
            if cur.version() != backup.version() {
                // cryptsetup refuses to restore across versions.
                return Err(LuksError::Usage(format!(
                    "Device {} is LUKS{}, the backup is LUKS{}; restore failed.",
                    target.display(),
                    cur.version(),
                    backup.version()
                )));
            }
            if cur.data_offset() != backup.data_offset() {
                return Err(LuksError::Usage(
                    "Data offset differ on device and backup, restore failed.".into(),
                ));
            }
            if cur.header_len() != len && cur.version() == 2 {
                return Err(LuksError::Usage(
                    "Binary header with keyslot areas size differ on device and backup, restore failed."
                        .into(),
                ));
            }
            msg.push_str(&format!(
                "already contains LUKS{} header. Replacing header will destroy existing keyslots.",
                if cur.version() == 1 { "" } else { "2" }
            ));
            if cur.uuid() != backup.uuid() {
                msg.push_str("\nWARNING: real device header has different UUID than backup!");
            }
        }
    }
    confirm_or(fb, &msg, "Operation aborted.")?;
    let mut buf = zeroize::Zeroizing::new(vec![0u8; len as usize]);
    backup.meta.read_at(0, &mut buf)?;
    let mut out = Disk::open(&target, true)?;
    if out.size()? < len {
        return Err(LuksError::Usage(format!(
            "Device {} is too small for the {len}-byte header backup.",
            target.display()
        )));
    }
    out.write_at(0, &buf)?;
    out.sync()
}

/// convert: LUKS1 to LUKS2 or back, after asking.
pub fn convert(dev: &Device, to: u8, fb: &dyn Feedback) -> Result<(), LuksError> {
    let mut v = dev.load(true, fb)?;
    if v.version() == to {
        return Err(LuksError::Usage(format!(
            "Device is already LUKS{} type.",
            if to == 1 { "1" } else { "2" }
        )));
    }
    if !fb.confirm(&format!(
        "This operation will convert {} to LUKS{} format.\n",
        dev.meta_path().display(),
        if to == 1 { "1" } else { "2" }
    ))? {
        return Err(LuksError::Denied(
            "Operation aborted, device was NOT converted.".into(),
        ));
    }
    v.convert(to)
}

/// repair: after asking (LUKS1), fix what cryptsetup fixes; returns the
/// messages to show.
pub fn repair(dev: &Device, fb: &dyn Feedback) -> Result<Vec<String>, LuksError> {
    if !super::exists(dev.meta_path()) {
        return Err(LuksError::Device(dev.meta_path().display().to_string()));
    }
    let luks2_ok = matches!(Volume::load(&dev.path, dev.header.as_deref(), false), Ok(v) if v.version() == 2 && v.warnings().is_empty());
    if !luks2_ok {
        confirm_or(
            fb,
            "Really try to repair LUKS device header?",
            "Operation aborted.",
        )?;
    }
    crate::luks::repair::repair(&dev.path, dev.header.as_deref())
}
