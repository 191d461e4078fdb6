//! Moving the data: hotzone by hotzone, each one protected before it is
//! touched and committed after, in the order cryptsetup uses so either
//! program can take over after an interruption at any point:
//!
//! 1. the hot table (hotzone = its own `in-reencryption` segment) goes
//!    into memory; the hotzone's old bytes are read;
//! 2. resilience: checksums of the old bytes (checksum) or the old bytes
//!    themselves (journal) go to the reencrypt keyslot's area, then the
//!    header with the hot table is written — the commit point; with
//!    `none` nothing is written;
//! 3. the bytes are decrypted with the old key, encrypted with the new
//!    one, written and synced;
//! 4. the post table (hotzone joined to the new side) is written.
//!
//! A crash between 2 and 4 leaves the hot table on disk; [`Job::recover`]
//! repairs that hotzone from the checksums (blocks whose hash still
//! matches were not rewritten yet) or from the journal, as cryptsetup's
//! recovery does.
//!
//! The job is split by what each part does: `plan` sets a job up from the
//! header (where the next hotzone lies, what protects it), `step` moves
//! hotzones, `recover` repairs an interrupted one and `finish` drops the
//! reencryption metadata at the end. Each uses only this file's `Job` and
//! helpers (and `recover` and `step` end in `finish`'s method), so there
//! is no circle between them.

mod finish;
mod plan;
mod recover;
mod step;

use serde_json::{Map, Value};

use super::keys::Key;
use super::segments::{self, Zone};
use super::state::{Moved, Resilience, SegParams, State};
use crate::crypto::SectorCrypt;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::luks2::Luks2;
use crate::luks::volume::Volume;

/// The largest hotzone udm moves in one step (its buffer). cryptsetup
/// allows up to 1 GiB; smaller steps only mean more header writes.
pub const UDM_MAX_HOTZONE: u64 = 64 << 20;
/// cryptsetup's hotzone for resilience `none` when none is asked for.
const NONE_DEFAULT: u64 = 20 << 20;
/// Recovery works through an interrupted hotzone in pieces this large.
const RECOVERY_CHUNK: u64 = 1 << 20;

/// The next hotzone of an encryption with data shift when the first
/// `linear` bytes are still plaintext: (offset, length) relative to the
/// data area, as cryptsetup picks them (the last one is the moved segment).
fn shift_zone(linear: u64, shift: u64, moved: u64) -> (u64, u64) {
    if linear <= shift {
        return (0, linear.min(moved));
    }
    let rest = linear - shift;
    if rest < shift {
        (shift, rest)
    } else {
        (rest, shift)
    }
}

/// Sizes a run takes from the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sizes {
    /// `--hotzone-size`: the largest hotzone, in bytes.
    pub hotzone: Option<u64>,
    /// `--device-size`: reencrypt only the first that many bytes of the
    /// data area (cryptsetup's fixed-size mode; whatever lies beyond
    /// stays under the old key and is lost once the header names only
    /// the new one).
    pub device: Option<u64>,
}

/// How a run ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte moved; the reencryption metadata is gone.
    Finished,
    /// Stopped by request after a whole hotzone; resumable.
    Interrupted,
}

fn crypt(p: &SegParams, key: Option<&Key>) -> Result<Option<SectorCrypt>, LuksError> {
    match (&p.cipher, key) {
        (None, _) => Ok(None),
        (Some(c), Some(k)) => SectorCrypt::new(c, k, p.sector_size, false)
            .map(Some)
            .map_err(|e| LuksError::Crypto(format!("{c}: {e}"))),
        (Some(_), None) => Err(LuksError::Usage("volume key missing".into())),
    }
}

fn luks2(vol: &mut Volume) -> Result<&mut Luks2, LuksError> {
    let path = vol.data_path.display().to_string();
    vol.header.luks2_mut().ok_or(LuksError::NotLuks2(path))
}

/// Called around each hotzone when the volume is also served (online
/// reencryption): `false` before the hotzone's old bytes are read (stop
/// the device's I/O), `true` once its post table is in the header
/// (load the mapping of the volume's new state and let I/O go on).
pub type LiveHook<'a> = Box<dyn FnMut(bool, &Volume) -> Result<(), LuksError> + 'a>;

/// One reencryption in progress, keys unlocked.
pub struct Job<'a> {
    vol: &'a mut Volume,
    data: Disk,
    pub st: State,
    old: Option<SectorCrypt>,
    new: Option<SectorCrypt>,
    pub zone: Zone,
    pub progress: u64,
    none_dirty: bool,
    /// Test hook: fail in the middle of this (0-based) hotzone, after the
    /// hot table is committed and half of the new data is written.
    crash_in: Option<u64>,
    steps: u64,
    live: Option<LiveHook<'a>>,
    /// Data shift: (shift, moved segment offset, moved segment size).
    shift: Option<(u64, u64, u64)>,
    /// Decryption with data shift: (shift, moved segment size, how the
    /// moved segment's in-place hotzone is protected).
    unshift: Option<(u64, u64, Moved)>,
}

impl<'a> Job<'a> {
    /// The protection of the current hotzone: the moved segment of a
    /// decryption with data shift has its own (checksum or journal); other
    /// data-shift hotzones need none (their source stays intact).
    fn protection(&self) -> Resilience {
        match self.unshift {
            Some((_, _, Moved::Checksum { hash, block })) if self.zone.offset == 0 => {
                Resilience::Checksum { hash, block }
            }
            Some((_, _, Moved::Journal)) if self.zone.offset == 0 => Resilience::Journal,
            _ => self.st.resilience,
        }
    }

    /// Whether the current hotzone moves data (source and destination
    /// differ) rather than rewriting it in place.
    fn moving(&self) -> bool {
        self.shift.is_some() || (self.unshift.is_some() && self.zone.offset != 0)
    }

    /// Online reencryption: call `hook` around every hotzone.
    pub fn set_live(&mut self, hook: LiveHook<'a>) {
        self.live = Some(hook);
    }

    fn live(&mut self, after: bool) -> Result<(), LuksError> {
        match self.live.as_mut() {
            Some(h) => h(after, self.vol),
            None => Ok(()),
        }
    }

    /// Simulate a crash inside hotzone number `n` of this run (tests).
    pub fn crash_in(&mut self, n: u64) {
        self.crash_in = Some(n);
    }

    fn header(&mut self) -> Result<&mut Luks2, LuksError> {
        luks2(self.vol)
    }

    /// Replace the header's segment table (validated) in memory.
    fn set_segments(&mut self, table: Vec<Value>, hot: bool) -> Result<(), LuksError> {
        let st = self.st.clone();
        let h = self.header()?;
        let hdr_size = h.bin.hdr_size;
        h.meta = h
            .meta
            .edit(hdr_size, |top| segments::install(&st, top, table, hot))?;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), LuksError> {
        let Volume { header, meta, .. } = &mut *self.vol;
        match header.luks2_mut() {
            Some(h) => h.write(meta),
            None => Err(LuksError::Usage("not LUKS2".into())),
        }
    }

    fn regular(&mut self) -> Result<Map<String, Value>, LuksError> {
        let h = self.header()?;
        let mut m = Map::new();
        if let Some(all) = h.meta.value["segments"].as_object() {
            for (k, v) in all {
                let backup = v["flags"].as_array().is_some_and(|f| {
                    f.iter()
                        .any(|x| x.as_str().is_some_and(|s| s.starts_with("backup-")))
                });
                if !backup {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(m)
    }

    /// Old bytes -> new bytes in place, for data at `at` (relative).
    fn transform(&self, buf: &mut [u8], at: u64) {
        let sector = at / 512;
        if let Some(c) = &self.old {
            c.decrypt(buf, sector);
        }
        if let Some(c) = &self.new {
            c.encrypt(buf, sector);
        }
    }
}
