//! LUKS2 reencryption, offline, with cryptsetup's on-disk format so that
//! either program can start, interrupt, resume or finish what the other
//! began. By job: `state` reads what a header in reencryption says,
//! `segments` builds the segment tables written around each hotzone,
//! `verify` the digest that binds the parameters to the keys, `keys`
//! unlocks the old and new volume keys, `init` starts an operation,
//! `engine` moves the data, recovers an interrupted hotzone and finishes.
//!
//! Supported: re-key (new key, cipher, key size or sector size), encrypt
//! and decrypt of volumes with a detached header, in both directions,
//! with resilience checksum, journal or none; encrypt with data shift
//! (`--reduce-device-size`, resilience datashift; started offline, as
//! cryptsetup starts it, resumable online; with a detached header, as
//! cryptsetup, in place, in hotzones of the shift); decrypt of a
//! volume whose header is on the device (the header moves to a new
//! detached file, the data moves back to byte 0: resilience
//! datashift-checksum or datashift-journal); `--device-size` (only the
//! start of the data area: fixed-size segments while it runs, or, for a
//! decryption with data shift, as cryptsetup, the size of this run).
//! Online (a `Live` device) every mode runs, data shifts included: the
//! device is suspended from before a hotzone's hot table until its new
//! table is loaded. Not supported: `--device-size` with an encryption
//! with data shift (cryptsetup refuses it too), metadata version 1.

mod engine;
mod init;
mod keys;
mod segments;
mod state;
#[cfg(test)]
mod tests;
mod verify;

pub use engine::{Job, LiveHook, Outcome, Sizes, UDM_MAX_HOTZONE};
pub use init::{init, InitParams};
pub use keys::{unlock_digest, Key};
pub use state::{Direction, Mode, Moved, Resilience, State};

use std::sync::atomic::AtomicBool;

use super::error::LuksError;
use super::feedback::Feedback;
use super::volume::Volume;
use super::{Activation, MappedSegment};

/// The reencryption state of `vol`'s header (None: not in reencryption,
/// or LUKS1).
pub fn status(vol: &Volume) -> Result<Option<State>, LuksError> {
    match vol.header.luks2() {
        Some(h) => State::read(&h.meta),
        None => Ok(None),
    }
}

/// Unlock both keys with `passphrase` and check the verification digest.
fn unlock_checked(
    vol: &Volume,
    st: &State,
    passphrase: &[u8],
) -> Result<(Option<Key>, Option<Key>), LuksError> {
    let (old, new) = keys::unlock_both(vol, st.digest_old, st.digest_new, passphrase)?;
    if let Some(h) = vol.header.luks2() {
        let knew = match (&new, st.digest_new) {
            (Some(k), Some(d)) if Some(d) != st.digest_old => Some(k.as_slice()),
            _ => None,
        };
        let data = verify::data(
            &h.meta.value,
            st.slot,
            st.version,
            old.as_deref().map(|k| &k[..]),
            knew,
        )?;
        verify::check(&h.meta, st.slot, &data)?;
    }
    Ok((old, new))
}

/// A served device whose table follows the reencryption (online).
pub trait Live {
    /// Stop I/O to the device (dm suspend): requests wait, none runs.
    fn suspend(&mut self) -> Result<(), LuksError>;
    /// Load `table` and resume the device.
    fn reload(&mut self, table: &str) -> Result<(), LuksError>;
    /// Resume the device with the table it had (a start that failed
    /// after `suspend` and left the header as it was).
    fn resume(&mut self) -> Result<(), LuksError>;
    /// The data device as the device's table names it.
    fn data_device(&self) -> &str;
    /// The device's dm-crypt flags (allow_discards, same_cpu_crypt,
    /// no_*_workqueue, iv_large_sectors), carried into every reloaded
    /// table as cryptsetup carries the active device's flags.
    fn options(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The device's size in 512-byte sectors, if known: every table
    /// loaded keeps it (cryptsetup never resizes the active device during
    /// a reencryption; a data shift's final volume is larger, and
    /// stays as large as it was until it is resized or opened again).
    fn sectors(&self) -> Option<u64> {
        None
    }
}

/// The table `live` gets for the mapping `act`: with the device's
/// dm-crypt flags, cut to the device's size.
pub fn live_table(live: &dyn Live, mut act: Activation) -> zeroize::Zeroizing<String> {
    act.options = live.options();
    if let Some(mut left) = live.sectors() {
        act.segments.retain_mut(|s| {
            s.len_sectors = s.len_sectors.min(left);
            left -= s.len_sectors;
            s.len_sectors > 0
        });
    }
    act.table(live.data_device())
}

/// Resume (or recover, then resume) the reencryption of `vol`, opened
/// for writing, until it finishes or `stop` is set. With `live`, the
/// served device is suspended around each hotzone and reloaded with the
/// volume's new mapping after it. `crash_in`: test hook, fail inside that
/// hotzone of this run.
pub fn resume(
    vol: &mut Volume,
    passphrase: &[u8],
    sizes: Sizes,
    stop: &AtomicBool,
    fb: &dyn Feedback,
    crash_in: Option<u64>,
    live: Option<&mut dyn Live>,
) -> Result<Outcome, LuksError> {
    let st = status(vol)?.ok_or_else(|| {
        LuksError::Usage(format!(
            "Device {} is not in reencryption.",
            vol.data_path.display()
        ))
    })?;
    let (old, new) = unlock_checked(vol, &st, passphrase)?;
    let crashed = st.hot.is_some();
    let (k_old, k_new) = (old.clone(), new.clone());
    let mut job = Job::new(vol, st.clone(), old.as_ref(), new.as_ref(), sizes)?;
    if let Some(n) = crash_in {
        job.crash_in(n);
    }
    if let Some(live) = live {
        job.set_live(Box::new(move |after, vol| {
            if !after {
                return live.suspend();
            }
            let act = assemble(vol, &st, k_old.clone(), k_new.clone())?;
            let table = live_table(&*live, act);
            live.reload(&table)
        }));
    }
    if crashed && job.recover()? == Outcome::Finished {
        return Ok(Outcome::Finished);
    }
    job.run(stop, fb)
}

/// Repair an interrupted hotzone and stop (cryptsetup's `repair` of a
/// header in reencryption). Ok(None) if no hotzone was interrupted.
pub fn recover_only(vol: &mut Volume, passphrase: &[u8]) -> Result<Option<Outcome>, LuksError> {
    let Some(st) = status(vol)? else {
        return Ok(None);
    };
    if st.hot.is_none() {
        return Ok(None);
    }
    let (old, new) = unlock_checked(vol, &st, passphrase)?;
    let mut job = Job::new(vol, st, old.as_ref(), new.as_ref(), Sizes::default())?;
    job.recover().map(Some)
}

/// The mapping of a volume in reencryption, as the kernel would get it
/// from cryptsetup: each data segment with its own key (or linear).
/// None if `vol` is not in reencryption. A header holding an interrupted
/// hotzone is refused: it must be recovered first.
pub fn activation(vol: &Volume, passphrase: &[u8]) -> Result<Option<Activation>, LuksError> {
    let Some(st) = status(vol)? else {
        return Ok(None);
    };
    if st.hot.is_some() {
        return Err(LuksError::Usage(
            "Reencryption was interrupted inside a hotzone; run `reencrypt --resume-only` \
             to recover it before opening."
                .into(),
        ));
    }
    let (old, new) = unlock_checked(vol, &st, passphrase)?;
    assemble(vol, &st, old, new).map(Some)
}

/// The multi-segment mapping of `vol`'s current header with both keys.
fn assemble(
    vol: &Volume,
    st: &State,
    old: Option<Key>,
    new: Option<Key>,
) -> Result<Activation, LuksError> {
    let Some(h) = vol.header.luks2() else {
        return Err(LuksError::NotLuks2(vol.data_path.display().to_string()));
    };
    let mut keys: Vec<(Option<u32>, Key)> = Vec::new();
    if let Some(k) = old {
        keys.push((st.digest_old, k));
    }
    if let Some(k) = new {
        if st.digest_new != st.digest_old {
            keys.push((st.digest_new, k));
        }
    }
    let dev_sectors = vol.data_size / 512;
    // A decryption with data shift maps the device less the shift (the
    // old ciphertext's tail lies beyond the new data's end).
    let logical = match st.resilience {
        Resilience::Datashift { shift, .. } if st.mode == Mode::Decrypt => {
            dev_sectors.saturating_sub(shift / 512)
        }
        _ => dev_sectors,
    };
    let mut segs = Vec::new();
    let mut start = 0u64;
    for (n, s) in h.meta.segments.iter().filter(|(_, s)| !s.is_backup()) {
        let off = s.offset / 512;
        let len = match s.size {
            Some(b) => b / 512,
            None => dev_sectors
                .checked_sub(off)
                .map(|l| l.min(logical.saturating_sub(start)))
                .filter(|l| *l > 0)
                .ok_or_else(|| {
                    LuksError::field(
                        format!("segments.{n}.offset"),
                        s.offset,
                        "beyond the data device",
                    )
                })?,
        };
        if off.checked_add(len).is_none_or(|e| e > dev_sectors) {
            return Err(LuksError::field(
                format!("segments.{n}.size"),
                len * 512,
                "segment ends beyond the data device",
            ));
        }
        let linear = s.kind == "linear";
        let key_index = if linear {
            0
        } else {
            let d = state::digest_of_segment(&h.meta, *n);
            keys.iter()
                .position(|(kd, _)| *kd == d && d.is_some())
                .ok_or_else(|| {
                    LuksError::field(format!("segments.{n}"), "", "no key for segment")
                })?
        };
        start += len;
        segs.push(MappedSegment {
            cipher: s.encryption.clone(),
            offset_sectors: off,
            len_sectors: len,
            sector_size: s.sector_size,
            iv_offset: s.iv_tweak,
            key_index,
            linear,
        });
    }
    let mut it = keys.into_iter().map(|(_, k)| k);
    let Some(first) = it.next() else {
        return Err(LuksError::field("digests", "", "no volume key"));
    };
    Ok(Activation {
        key: first,
        other_keys: it.collect(),
        segments: segs,
        options: Vec::new(),
        keyslot: 0,
        version: 2,
        uuid: vol.uuid().to_string(),
        warnings: vol.warnings(),
        integrity: None,
    })
}
