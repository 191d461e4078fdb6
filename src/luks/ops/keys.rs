//! Keyslot verbs with cryptsetup's flow: which passphrase is asked for
//! first, what proves the right to remove a slot, and the confirmation
//! before the last keyslot goes.

use super::{read_volume_key_file, unlock, Device, Unlock, VolumeKey};
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::passphrase::KeySource;
use crate::luks::pbkdf::PbkdfChoice;
use crate::luks::volume::{Binding, Volume};
use std::path::PathBuf;
use zeroize::Zeroizing;

/// luksAddKey.
#[derive(Clone, Debug, Default)]
pub struct AddKeyOpts {
    pub dev: Device,
    /// The existing passphrase (`--key-file`, `--key-slot` of the old one).
    pub unlock: Unlock,
    /// The new passphrase (positional new key file, `--new-keyfile-*`).
    pub new_key: KeySource,
    /// Slot for the new passphrase.
    pub new_slot: Option<u32>,
    /// Prove knowledge of the volume key instead of a passphrase.
    pub volume_key_file: Option<PathBuf>,
    pub pbkdf: PbkdfChoice,
}

/// The volume key from a passphrase, or from `--volume-key-file`.
fn existing_key(
    v: &Volume,
    u: &Unlock,
    vk_file: Option<&std::path::Path>,
    prompt: &str,
) -> Result<VolumeKey, LuksError> {
    match vk_file {
        Some(p) => {
            let len = v.header.key_size().unwrap_or(64);
            let k = read_volume_key_file(p, len)?;
            if !v.check_key(&k) {
                return Err(LuksError::Usage(
                    "Volume key does not match the volume.".into(),
                ));
            }
            Ok(Zeroizing::new(k.to_vec()))
        }
        None => unlock(v, u, prompt).map(|(_, k)| k),
    }
}

/// The KDF hash a new keyslot uses: LUKS1 slots always use the header's.
fn slot_pbkdf(v: &Volume, p: &PbkdfChoice) -> PbkdfChoice {
    let mut p = p.clone();
    if let Some(h) = v.header.luks1() {
        p.hash = Some(h.hash.name().to_string());
    }
    p
}

/// Add a keyslot; returns its number.
pub fn add_key(o: &AddKeyOpts, fb: &dyn Feedback) -> Result<u32, LuksError> {
    let mut v = o.dev.load(true, fb)?;
    v.check_requirements()?;
    let key = existing_key(
        &v,
        &o.unlock,
        o.volume_key_file.as_deref(),
        "Enter any existing passphrase: ",
    )?;
    let new = o
        .new_key
        .read("Enter new passphrase for key slot: ", true)?;
    let p = slot_pbkdf(&v, &o.pbkdf);
    let kdf = p.resolve(v.version(), key.len(), fb)?;
    v.add_key(&key, &new, o.new_slot, kdf, p.hash()?)
}

/// luksAddKey --unbound: a keyslot for a key no segment uses (a random
/// one of `key_bytes`, or `--volume-key-file`'s), under a digest of its
/// own. No existing passphrase is asked for, as in cryptsetup.
#[derive(Clone, Debug, Default)]
pub struct AddUnboundOpts {
    pub dev: Device,
    pub new_key: KeySource,
    pub new_slot: Option<u32>,
    pub key_bytes: usize,
    pub volume_key_file: Option<PathBuf>,
    pub pbkdf: PbkdfChoice,
}

/// Add an unbound key; returns its keyslot.
pub fn add_unbound_key(o: &AddUnboundOpts, fb: &dyn Feedback) -> Result<u32, LuksError> {
    let mut v = o.dev.load(true, fb)?;
    if v.version() != 2 {
        return Err(LuksError::Usage(format!(
            "Device {} is not a valid LUKS2 device.",
            o.dev.meta_path().display()
        )));
    }
    v.check_requirements()?;
    let key: VolumeKey = match &o.volume_key_file {
        Some(p) => Zeroizing::new(read_volume_key_file(p, o.key_bytes)?.to_vec()),
        None => crate::luks::keyslot::random(o.key_bytes)?,
    };
    let new = o
        .new_key
        .read("Enter new passphrase for key slot: ", true)?;
    let kdf = o.pbkdf.resolve(2, key.len(), fb)?;
    let hash = o.pbkdf.hash()?;
    let iterations = o.pbkdf.digest_iterations(hash, key.len());
    v.add_key_to(
        &key,
        &new,
        o.new_slot,
        kdf,
        hash,
        Binding::NewUnbound { hash, iterations },
    )
}

/// Remove the keyslot the passphrase opens (luksRemoveKey); returns it.
pub fn remove_key(dev: &Device, u: &Unlock, fb: &dyn Feedback) -> Result<u32, LuksError> {
    let mut v = dev.load(true, fb)?;
    v.check_requirements()?;
    let (slot, _key) = unlock(&v, u, "Enter passphrase to be deleted: ")?;
    last_slot_guard(&v, slot, fb)?;
    v.kill_slot(slot)?;
    Ok(slot)
}

/// Before the last keyslot goes, ask (cryptsetup's question).
fn last_slot_guard(v: &Volume, slot: u32, fb: &dyn Feedback) -> Result<(), LuksError> {
    let active = v.active_slots();
    if active.len() == 1
        && active[0] == slot
        && !fb.confirm(
            "This is the last keyslot. Device will become unusable after purging this key.",
        )?
    {
        return Err(LuksError::Denied(
            "Operation aborted, the keyslot was NOT wiped.".into(),
        ));
    }
    Ok(())
}

/// luksKillSlot. `proof` is the passphrase check: cryptsetup asks for
/// any remaining passphrase unless in batch mode without a key file.
pub fn kill_slot(
    dev: &Device,
    slot: u32,
    proof: Option<&Unlock>,
    fb: &dyn Feedback,
) -> Result<(), LuksError> {
    let mut v = dev.load(true, fb)?;
    v.check_requirements()?;
    let max = if v.version() == 1 {
        8
    } else {
        crate::luks::json::MAX_KEYSLOTS
    };
    if slot >= max {
        return Err(LuksError::Usage(format!("Key slot {slot} is invalid.")));
    }
    if !v.header.slot_taken(slot) {
        return Err(LuksError::Usage(format!("Keyslot {slot} is not active.")));
    }
    if let Some(u) = proof {
        let last = v.active_slots().len() == 1;
        if last && (u.key.key_file.is_none() || fb.always_confirm_last_slot()) {
            last_slot_guard(&v, slot, fb)?;
        }
        // The last slot must be opened by its own passphrase; otherwise
        // any other slot's passphrase proves the right to remove it.
        let pass = match u.key.read("Enter any remaining passphrase: ", false) {
            Ok(p) => p,
            // cryptsetup: empty piped input is no proof at all, and no
            // refusal either (batch scripts kill slots with stdin closed).
            Err(LuksError::NoInput(_))
                if u.key
                    .key_file
                    .as_deref()
                    .is_none_or(|k| k == std::path::Path::new("-")) =>
            {
                return v.kill_slot(slot);
            }
            Err(e) => return Err(e),
        };
        let ok = if last {
            v.unlock(&pass, Some(slot)).is_ok()
        } else {
            let mut found = false;
            for s in v.active_slots() {
                if s != slot && v.unlock(&pass, Some(s)).is_ok() {
                    found = true;
                    break;
                }
            }
            found
        };
        if !ok {
            return Err(LuksError::WrongPassphrase);
        }
    } else {
        last_slot_guard(&v, slot, fb)?;
    }
    v.kill_slot(slot)
}

/// luksChangeKey: the passphrase moves to a new keyslot (LUKS1: the first
/// free one; LUKS2: written to a free slot, then renumbered to the old
/// number), and the old keyslot is wiped. Returns the resulting slot.
pub fn change_key(
    dev: &Device,
    u: &Unlock,
    new: &KeySource,
    pbkdf: &PbkdfChoice,
    fb: &dyn Feedback,
) -> Result<u32, LuksError> {
    let mut v = dev.load(true, fb)?;
    v.check_requirements()?;
    // cryptsetup changes an unbound key's passphrase too.
    let u = Unlock {
        unbound: true,
        ..u.clone()
    };
    let (old, key) = unlock(&v, &u, "Enter passphrase to be changed: ")?;
    let pass = new.read("Enter new passphrase: ", true)?;
    rewrite_slot(&mut v, old, &key, &pass, pbkdf, fb)
}

/// Store `key` under `pass` in place of keyslot `old`.
fn rewrite_slot(
    v: &mut Volume,
    old: u32,
    key: &[u8],
    pass: &[u8],
    pbkdf: &PbkdfChoice,
    fb: &dyn Feedback,
) -> Result<u32, LuksError> {
    let p = slot_pbkdf(v, pbkdf);
    let kdf = p.resolve(v.version(), key.len(), fb)?;
    let hash = p.hash()?;
    // The new keyslot keeps the old one's digest (an unbound key stays
    // unbound).
    let binding = v
        .header
        .luks2()
        .and_then(|h| h.meta.digest_of(old))
        .map_or(Binding::Volume, |(d, _)| Binding::Digest(d));
    match v.free_slot() {
        Some(new) => {
            v.add_key_to(key, pass, Some(new), kdf, hash, binding)?;
            if v.version() == 2 {
                // Keep the passphrase under its old number, as cryptsetup.
                v.copy_token_assignment(old, new)?;
                v.swap_luks2_slots(old, new)?;
                v.write_header()?;
                v.kill_slot(new)?;
                Ok(old)
            } else {
                v.kill_slot(old)?;
                Ok(new)
            }
        }
        None => {
            v.kill_slot(old)?;
            v.add_key_to(key, pass, Some(old), kdf, hash, binding)
        }
    }
}

/// luksConvertKey: the same passphrase, new PBKDF parameters.
pub fn convert_key(
    dev: &Device,
    u: &Unlock,
    pbkdf: &PbkdfChoice,
    fb: &dyn Feedback,
) -> Result<u32, LuksError> {
    let mut v = dev.load(true, fb)?;
    if v.version() != 2 {
        return Err(LuksError::Usage(format!(
            "Device {} is not a valid LUKS2 device.",
            dev.meta_path().display()
        )));
    }
    v.check_requirements()?;
    if let Some(s) = u.slot {
        if !v.active_slots().contains(&s) {
            return Err(LuksError::Usage(format!("Keyslot {s} is not active.")));
        }
    }
    let pass = u
        .key
        .read("Enter passphrase for keyslot to be converted: ", false)?;
    let (old, key) = v.unlock(&pass, u.slot)?;
    rewrite_slot(&mut v, old, &key, &pass, pbkdf, fb)
}

/// erase / luksErase: wipe every keyslot after asking.
pub fn erase(dev: &Device, fb: &dyn Feedback) -> Result<(), LuksError> {
    let mut v = dev.load(true, fb)?;
    if !fb.confirm(&format!(
        "This operation will erase all keyslots on device {}.\nDevice will become unusable after this operation.",
        dev.meta_path().display()
    ))? {
        return Err(LuksError::Denied(
            "Operation aborted, keyslots were NOT wiped.".into(),
        ));
    }
    for s in v.active_slots() {
        v.kill_slot(s)?;
    }
    Ok(())
}
