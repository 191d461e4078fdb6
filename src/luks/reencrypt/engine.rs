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

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};

use super::keys::Key;
use super::segments::{self, Zone};
use super::state::{Direction, Mode, Moved, Resilience, SegParams, State, MAX_HOTZONE};
use crate::crypto::SectorCrypt;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
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

/// The size `--device-size` asks to reencrypt, checked as cryptsetup
/// checks it: at least what the fixed-size segments already cover, at
/// most the data area (`size`), equal to their total when none is
/// dynamic, aligned to both sector sizes and to the zone `align`.
fn fixed_size(
    st: &State,
    regular: &[(u64, Option<u64>)],
    size: u64,
    want: u64,
    align: u64,
) -> Result<u64, LuksError> {
    let minimal: u64 = regular.iter().filter_map(|s| s.1).sum();
    let dynamic = regular.iter().any(|s| s.1.is_none());
    let ss = |p: &SegParams| u64::from(p.sector_size);
    if want < minimal
        || want > size
        || (!dynamic && want != minimal)
        || want % ss(&st.old) != 0
        || want % ss(&st.new) != 0
    {
        return Err(LuksError::Usage(
            "Illegal device size requested in reencryption parameters.".into(),
        ));
    }
    if want == 0 || want % align != 0 {
        return Err(LuksError::Usage(format!(
            "Device size must be multiple of calculated zone alignment ({align} bytes)."
        )));
    }
    Ok(want)
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
    /// Set up from the header of `vol` (which must be in reencryption)
    /// and both keys, with the command line's `sizes`.
    pub fn new(
        vol: &'a mut Volume,
        st: State,
        key_old: Option<&Key>,
        key_new: Option<&Key>,
        sizes: Sizes,
    ) -> Result<Job<'a>, LuksError> {
        let Sizes {
            hotzone: max_hotzone,
            device: device_size,
        } = sizes;
        // cryptsetup's encryption with data shift and a detached header:
        // no moved segment, the data encrypted in place (at the data
        // offset) in hotzones of the shift (the generic backward path
        // below).
        let in_place = match st.resilience {
            Resilience::Datashift { shift, moved: None }
                if st.mode == Mode::Encrypt
                    && vol.detached
                    && super::state::segment_by_flag(&luks2(vol)?.meta, "backup-moved-segment")
                        .is_none() =>
            {
                Some(shift)
            }
            _ => None,
        };
        if let (Resilience::Datashift { shift, moved }, None) = (st.resilience, in_place) {
            if st.mode == Mode::Decrypt {
                return Job::new_unshift(vol, st, key_old, shift, moved, device_size);
            }
            let job = Job::new_shift(vol, st, key_old, key_new, shift)?;
            // The segments have fixed sizes: as cryptsetup, a resume's
            // --device-size must be the plaintext's size.
            if device_size.is_some_and(|d| d != job.zone.size) {
                return Err(LuksError::Usage(
                    "Illegal device size requested in reencryption parameters.".into(),
                ));
            }
            return Ok(job);
        }
        if st.old.offset != st.new.offset || st.old.iv_tweak != 0 || st.new.iv_tweak != 0 {
            return Err(LuksError::Unsupported(
                "reencryption between segments at different offsets or with an iv_tweak".into(),
            ));
        }
        let h = luks2(vol)?;
        for flag in ["backup-previous", "backup-final"] {
            if let Some(id) = super::state::segment_by_flag(&h.meta, flag) {
                // The in-place data shift's plaintext segment has a size.
                if h.meta.segments[&id].size.is_some() && in_place.is_none() {
                    return Err(LuksError::Unsupported(
                        "reencryption of a fixed-size data segment (--device-size)".into(),
                    ));
                }
            }
        }
        let data_offset = st.new.offset;
        let size = vol.data_size.checked_sub(data_offset).ok_or_else(|| {
            LuksError::field("segments", data_offset, "data offset beyond the device")
        })?;
        let align = match st.resilience {
            Resilience::Checksum { block, .. } => u64::from(block),
            _ => 4096u64
                .max(u64::from(st.old.sector_size))
                .max(u64::from(st.new.sector_size)),
        };
        let h = luks2(vol)?;
        let regular: Vec<(u64, Option<u64>)> = h
            .meta
            .segments
            .values()
            .filter(|s| !s.is_backup())
            .map(|s| (s.offset, s.size))
            .collect();
        let size = match device_size {
            None => size,
            Some(want) => fixed_size(&st, &regular, size, want, align)?,
        };
        if size % align != 0 {
            return Err(LuksError::Usage(format!(
                "Data device is not aligned to the reencryption block size ({align} bytes)."
            )));
        }
        let old = crypt(&st.old, key_old)?;
        let new = crypt(&st.new, key_new)?;
        let mut zone = Zone {
            data_offset,
            size,
            offset: 0,
            length: 0,
            fixed: device_size.is_some(),
        };
        if let Some(hid) = st.hot {
            let s = &h.meta.segments[&hid];
            zone.offset = s.offset.checked_sub(data_offset).unwrap_or(u64::MAX);
            zone.length = s.size.unwrap_or(0);
            zone.check(hid, s.offset, MAX_HOTZONE, align, true)?;
        } else {
            let mut len = match st.resilience {
                _ if in_place.is_some() => {
                    let shift = in_place.unwrap_or(0);
                    if shift == 0
                        || shift > UDM_MAX_HOTZONE
                        || shift % align != 0
                        || size % shift != 0
                    {
                        return Err(LuksError::field(
                            format!("keyslots.{}.area.shift_size", st.slot),
                            shift,
                            "not a 4 KiB multiple of at most 64 MiB dividing the data area",
                        ));
                    }
                    shift
                }
                Resilience::None => max_hotzone.unwrap_or(NONE_DEFAULT),
                Resilience::Checksum { hash, block } => {
                    st.area_size / hash.digest_len() as u64 * u64::from(block)
                }
                _ => st.area_size,
            };
            len = len.min(UDM_MAX_HOTZONE);
            if let Some(m) = max_hotzone.filter(|_| in_place.is_none()) {
                len = len.min(m);
            }
            len -= len % align;
            if len == 0 {
                return Err(LuksError::Usage(format!(
                    "Hotzone size must be multiple of calculated zone alignment ({align} bytes)."
                )));
            }
            if 65536 % align == 0 && len > 65536 && in_place.is_none() {
                len -= len % 65536;
            }
            let first = |i: usize| regular.get(i).copied();
            let seg0_len = || -> Result<u64, LuksError> {
                first(0).and_then(|s| s.1).ok_or_else(|| {
                    LuksError::field("segments.0.size", "dynamic", "expected a fixed size")
                })
            };
            match (st.direction, regular.len()) {
                (Direction::Forward, 1) => zone.offset = 0,
                (Direction::Forward, 2) => zone.offset = seg0_len()?,
                (Direction::Backward, 1) => {
                    len = len.min(size);
                    zone.offset = size - len;
                }
                (Direction::Backward, 2) => {
                    let t = seg0_len()?;
                    len = len.min(t);
                    zone.offset = t - len;
                }
                (_, n) => {
                    return Err(LuksError::field(
                        "segments",
                        n,
                        "a clean reencryption has one or two data segments",
                    ))
                }
            }
            if zone.offset > size || zone.offset % align != 0 {
                return Err(LuksError::field(
                    "segments.0.size",
                    zone.offset,
                    "misaligned",
                ));
            }
            zone.length = len.min(size - zone.offset);
        }
        let progress = match st.direction {
            Direction::Forward => zone.offset,
            Direction::Backward => size - zone.offset - zone.length,
        };
        Job::with(vol, st, old, new, zone, progress)
    }

    /// Encryption with data shift (`--reduce-device-size`), cryptsetup's
    /// layout: the plaintext starts at byte 0 of the device, its first
    /// `shift` bytes were copied to the "moved" segment near the end before
    /// the header overwrote them; hotzones of `shift` bytes go backward,
    /// each read at `X - shift` and written encrypted at `X` (disjoint, so
    /// an interrupted hotzone is simply done again); the last one is read
    /// from the moved segment.
    fn new_shift(
        vol: &'a mut Volume,
        st: State,
        key_old: Option<&Key>,
        key_new: Option<&Key>,
        shift: u64,
    ) -> Result<Job<'a>, LuksError> {
        if st.mode != super::state::Mode::Encrypt || st.direction != Direction::Backward {
            return Err(LuksError::Unsupported(format!(
                "reencryption with data shift in mode {} ({}); udm moves data only to \
                 encrypt (--reduce-device-size), cryptsetup can finish it",
                st.mode.name(),
                st.direction.name()
            )));
        }
        let align = 4096u64
            .max(u64::from(st.old.sector_size))
            .max(u64::from(st.new.sector_size));
        let slot = st.slot;
        let bad = |what: &str, v: u64| {
            LuksError::field(
                format!("keyslots.{slot}.area.shift_size"),
                v,
                what.to_string(),
            )
        };
        if shift == 0 || shift % align != 0 || shift > MAX_HOTZONE {
            return Err(bad("zero, misaligned or larger than 1 GiB", shift));
        }
        let data_offset = st.new.offset;
        if st.old.offset != 0 || data_offset < shift || st.new.iv_tweak != 0 {
            return Err(LuksError::Unsupported(
                "data shift with segments other than cryptsetup's encryption layout".into(),
            ));
        }
        let dev = vol.data_size;
        let h = luks2(vol)?;
        let seg = |flag: &str| -> Result<(u64, Option<u64>), LuksError> {
            let id = super::state::segment_by_flag(&h.meta, flag)
                .ok_or_else(|| LuksError::field("segments", flag, "missing"))?;
            let s = &h.meta.segments[&id];
            Ok((s.offset, s.size))
        };
        let (m_off, m_size) = seg("backup-moved-segment")?;
        let m_size = m_size
            .filter(|&m| m > 0 && m <= shift && m % align == 0)
            .ok_or_else(|| bad("moved segment size", 0))?;
        if m_off.checked_add(m_size).is_none_or(|e| e > dev) || m_off % 512 != 0 {
            return Err(LuksError::field(
                "segments (backup-moved-segment).offset",
                m_off,
                "beyond the data device",
            ));
        }
        let size = seg("backup-previous")?
            .1
            .filter(|&s| s > 0 && s % align == 0)
            .ok_or_else(|| LuksError::field("segments (backup-previous).size", "", "bad"))?;
        if data_offset.checked_add(size).is_none_or(|e| e > dev) {
            return Err(LuksError::field(
                "segments (backup-previous).size",
                size,
                "encrypted data would end beyond the device",
            ));
        }
        let mut linear = 0u64;
        for s in h.meta.segments.values().filter(|s| !s.is_backup()) {
            if s.kind == "linear" {
                linear = linear.saturating_add(s.size.ok_or_else(|| {
                    LuksError::field("segments", "dynamic", "linear segment without a size")
                })?);
            }
        }
        let mut zone = Zone {
            data_offset,
            size,
            offset: 0,
            length: 0,
            fixed: false,
        };
        if let Some(hid) = st.hot {
            let s = &h.meta.segments[&hid];
            zone.offset = s.offset.checked_sub(data_offset).unwrap_or(u64::MAX);
            zone.length = s.size.unwrap_or(0);
            let ok_src = if zone.offset == 0 {
                zone.length == m_size
            } else {
                zone.offset >= shift
            };
            zone.check(hid, s.offset, shift, align, ok_src)?;
            linear = zone.offset + zone.length;
        } else {
            if linear > size || linear % align != 0 {
                return Err(LuksError::field(
                    "segments",
                    linear,
                    "plaintext segments do not fit the data",
                ));
            }
            (zone.offset, zone.length) = shift_zone(linear, shift, m_size);
        }
        let old = crypt(&st.old, key_old)?;
        let new = crypt(&st.new, key_new)?;
        let mut job = Job::with(vol, st, old, new, zone, size - linear)?;
        job.shift = Some((shift, m_off, m_size));
        Ok(job)
    }

    /// Decryption with data shift (a volume whose header was on the
    /// device), cryptsetup's layout: the header went to a detached file,
    /// the first `moved` bytes of ciphertext were copied to byte 0 (the
    /// moved segment); hotzones of `shift` bytes go forward from `moved`,
    /// each read at `shift + X` and written decrypted at `X` (disjoint,
    /// so an interrupted one is simply done again); the last hotzone
    /// decrypts the moved segment in place, protected by checksums or a
    /// journal in the reencrypt keyslot's area.
    ///
    /// `device_size` (`--device-size`, given to this run as cryptsetup
    /// takes it: a resume without it decrypts the whole device) moves and
    /// decrypts only the first that many bytes.
    fn new_unshift(
        vol: &'a mut Volume,
        st: State,
        key_old: Option<&Key>,
        shift: u64,
        moved: Option<Moved>,
        device_size: Option<u64>,
    ) -> Result<Job<'a>, LuksError> {
        let slot = st.slot;
        let Some(moved) = moved else {
            return Err(LuksError::Unsupported(format!(
                "decryption with resilience datashift (keyslots.{slot}.area.type); cryptsetup \
                 writes datashift-checksum or datashift-journal for it"
            )));
        };
        if st.direction != Direction::Forward || st.new.cipher.is_some() {
            return Err(LuksError::field(
                format!("keyslots.{slot}.direction"),
                st.direction.name(),
                "decryption with data shift goes forward to a linear segment",
            ));
        }
        let align = 4096u64.max(u64::from(st.old.sector_size));
        let bad = |what: &str, v: u64| {
            LuksError::field(
                format!("keyslots.{slot}.area.shift_size"),
                v,
                what.to_string(),
            )
        };
        if shift == 0 || shift % align != 0 {
            return Err(bad("zero or not aligned to the encryption sector", shift));
        }
        if st.new.offset != 0 || st.old.offset != shift || st.old.iv_tweak != 0 {
            return Err(LuksError::Unsupported(
                "decryption with data shift with segments other than cryptsetup's layout \
                 (old data at the shift, new data at 0, no iv_tweak)"
                    .into(),
            ));
        }
        let size = vol
            .data_size
            .checked_sub(shift)
            .filter(|s| *s > 0 && s % align == 0)
            .ok_or_else(|| bad("data device too small or not aligned for this shift", shift))?;
        let size = match device_size {
            None => size,
            Some(want) if want > 0 && want <= size && want % align == 0 => want,
            Some(_) => {
                return Err(LuksError::Usage(
                    "Illegal device size requested in reencryption parameters.".into(),
                ))
            }
        };
        let h = luks2(vol)?;
        let mid = super::state::segment_by_flag(&h.meta, "backup-moved-segment")
            .ok_or_else(|| LuksError::field("segments", "backup-moved-segment", "missing"))?;
        let ms = &h.meta.segments[&mid];
        let m_size = ms
            .size
            .filter(|&m| m > 0 && m <= shift && m <= size && m % align == 0)
            .ok_or_else(|| {
                LuksError::field(
                    format!("segments.{mid}.size"),
                    ms.size.map_or("dynamic".into(), |m| m.to_string()),
                    "moved segment empty, misaligned or larger than the shift",
                )
            })?;
        if ms.offset != 0 || ms.kind != "crypt" {
            return Err(LuksError::field(
                format!("segments.{mid}.offset"),
                ms.offset,
                "the moved segment of a decryption lies encrypted at byte 0",
            ));
        }
        let need = match moved {
            Moved::Checksum { hash, block } => {
                if m_size % u64::from(block) != 0 {
                    return Err(LuksError::field(
                        format!("keyslots.{slot}.area.sector_size"),
                        block,
                        "does not divide the moved segment",
                    ));
                }
                m_size / u64::from(block) * hash.digest_len() as u64
            }
            Moved::Journal => m_size,
        };
        if need > st.area_size {
            return Err(LuksError::field(
                format!("keyslots.{slot}.area.size"),
                st.area_size,
                format!("smaller than the {need} bytes protecting the moved segment"),
            ));
        }
        let mut zone = Zone {
            data_offset: 0,
            size,
            offset: 0,
            length: 0,
            fixed: false,
        };
        let progress;
        if let Some(hid) = st.hot {
            let s = &h.meta.segments[&hid];
            zone.offset = s.offset;
            zone.length = s.size.unwrap_or(0);
            let ok = if zone.offset == 0 {
                zone.length == m_size
            } else {
                zone.offset >= m_size
            };
            zone.check(
                hid,
                s.offset,
                shift.max(m_size),
                align,
                ok && s.kind == "linear",
            )?;
            progress = if zone.offset == 0 {
                size - m_size
            } else {
                zone.offset - m_size
            };
        } else {
            let last_crypt = h
                .meta
                .segments
                .iter()
                .filter(|(_, s)| !s.is_backup())
                .enumerate()
                .filter(|(_, (_, s))| s.kind == "crypt")
                .map(|(i, (n, s))| (i, *n, s.offset))
                .last();
            match last_crypt {
                // Every byte moved; only the teardown is left.
                None => progress = size,
                Some((0, _, _)) => {
                    zone.length = m_size;
                    progress = size - m_size;
                }
                Some((_, n, off)) => {
                    zone.offset = off.saturating_sub(shift);
                    if zone.offset < m_size || zone.offset >= size || zone.offset % align != 0 {
                        return Err(LuksError::field(
                            format!("segments.{n}.offset"),
                            off,
                            "old data segment outside the data area or misaligned",
                        ));
                    }
                    zone.length = shift.min(size - zone.offset);
                    progress = zone.offset - m_size;
                }
            }
        }
        let old = crypt(&st.old, key_old)?;
        let mut job = Job::with(vol, st, old, None, zone, progress)?;
        job.unshift = Some((shift, m_size, moved));
        Ok(job)
    }

    /// A job on `vol` at `zone` with `progress` bytes done: the data
    /// device opened for writing, no hooks, no data shift.
    fn with(
        vol: &'a mut Volume,
        st: State,
        old: Option<SectorCrypt>,
        new: Option<SectorCrypt>,
        zone: Zone,
        progress: u64,
    ) -> Result<Job<'a>, LuksError> {
        let data = Disk::open(&vol.data_path, true)?;
        Ok(Job {
            vol,
            data,
            st,
            old,
            new,
            zone,
            progress,
            none_dirty: false,
            crash_in: None,
            steps: 0,
            live: None,
            shift: None,
            unshift: None,
        })
    }

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

    /// The hot and post tables of the current hotzone.
    fn tables(&mut self) -> Result<(Vec<Value>, Vec<Value>), LuksError> {
        let z = self.zone;
        let current = self.regular()?;
        Ok(if let Some((shift, m, _)) = self.unshift {
            let hot = segments::hot_unshift(&self.st, &z, shift, m, &current);
            let post = segments::post_unshift(&self.st, &z, m, &hot);
            (hot, post)
        } else if self.shift.is_some() {
            let hot = segments::hot_shift(&self.st, &z, &current);
            let post = segments::post_shift(&z, &hot);
            (hot, post)
        } else {
            let hot = segments::hot(&self.st, &z, &current);
            let post = segments::post(&self.st, &z, &hot);
            (hot, post)
        })
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

    /// Read the hotzone's plaintext from where the data shift left it,
    /// encrypt it and write it at its new place, in pieces; `crash`: stop
    /// halfway (test hook).
    fn move_zone(&mut self, crash: bool) -> Result<(), LuksError> {
        let z = self.zone;
        let src = match (self.shift, self.unshift) {
            (Some((_, m_off, _)), _) if z.offset == 0 => m_off,
            (Some((shift, _, _)), _) => z.data_offset + z.offset - shift,
            (None, Some((shift, _, _))) => z.data_offset + z.offset + shift,
            _ => return Err(LuksError::Usage("not a data shift".into())),
        };
        let dst = z.data_offset + z.offset;
        let stop_at = if crash {
            (z.length / 2) & !4095
        } else {
            u64::MAX
        };
        let mut done = 0u64;
        while done < z.length {
            let n = UDM_MAX_HOTZONE.min(z.length - done);
            let mut buf = zeroize::Zeroizing::new(vec![0u8; n as usize]);
            self.data.read_at(src + done, &mut buf)?;
            self.transform(&mut buf, z.offset + done);
            if done + n > stop_at {
                let part = (stop_at - done) as usize;
                self.data.write_at(dst + done, &buf[..part])?;
                self.data.sync()?;
                return Err(LuksError::Usage(format!(
                    "simulated crash inside hotzone {} (test hook)",
                    self.steps
                )));
            }
            self.data.write_at(dst + done, &buf)?;
            done += n;
        }
        self.data.sync()
    }

    /// One hotzone that moves data (no copy of the old bytes is needed:
    /// the source stays intact until the post table is written).
    fn step_shift(&mut self) -> Result<(), LuksError> {
        // Online, clients must not write the source while it is copied:
        // the device waits from before the hot table to the reload.
        self.live(false)?;
        let (hot, post) = self.tables()?;
        self.set_segments(hot, true)?;
        self.commit()?;
        let crash = self.crash_in == Some(self.steps);
        self.move_zone(crash)?;
        self.steps += 1;
        self.set_segments(post, false)?;
        self.commit()?;
        self.live(true)
    }

    /// One hotzone, steps 1-4 of the module doc.
    fn step(&mut self) -> Result<(), LuksError> {
        if self.moving() {
            return self.step_shift();
        }
        self.live(false)?;
        let z = self.zone;
        let (hot, post) = self.tables()?;
        self.set_segments(hot, true)?;
        let len = usize::try_from(z.length).map_err(|_| LuksError::Usage("hotzone".into()))?;
        let mut buf = zeroize::Zeroizing::new(vec![0u8; len]);
        self.data.read_at(z.data_offset + z.offset, &mut buf)?;
        let prot = self.protection();
        match prot {
            Resilience::Checksum { hash, block } => {
                let mut sums = Vec::with_capacity(len / block as usize * hash.digest_len());
                for b in buf.chunks(block as usize) {
                    sums.extend_from_slice(&hash.digest(&[b]));
                }
                let off = self.st.area_offset;
                self.vol.meta.write_at(off, &sums)?;
                self.commit()?;
            }
            Resilience::Journal => {
                let off = self.st.area_offset;
                self.vol.meta.write_at(off, &buf)?;
                self.commit()?;
            }
            // In place under datashift (detached header): the hot table
            // is committed, as cryptsetup commits it, but nothing keeps
            // the old bytes.
            Resilience::Datashift { .. } => self.commit()?,
            Resilience::None => self.none_dirty = true,
        }
        self.transform(&mut buf, z.offset);
        if self.crash_in == Some(self.steps) {
            let half = (len / 2) & !4095;
            self.data.write_at(z.data_offset + z.offset, &buf[..half])?;
            self.data.sync()?;
            return Err(LuksError::Usage(format!(
                "simulated crash inside hotzone {} (test hook)",
                self.steps
            )));
        }
        self.steps += 1;
        self.data.write_at(z.data_offset + z.offset, &buf)?;
        if prot != Resilience::None {
            self.data.sync()?;
        }
        self.set_segments(post, false)?;
        if prot != Resilience::None {
            self.commit()?;
        }
        self.live(true)
    }

    /// Move to the next hotzone (cryptsetup's context update).
    fn advance(&mut self) {
        let z = &mut self.zone;
        self.progress += z.length;
        if let Some((shift, _, m_size)) = self.shift {
            (z.offset, z.length) = shift_zone(z.offset, shift, m_size);
            return;
        }
        if let Some((shift, m_size, _)) = self.unshift {
            // Forward from the moved segment's end; the moved segment last.
            z.offset = if z.offset == 0 {
                z.size
            } else {
                z.offset + z.length
            };
            if z.offset >= z.size {
                z.offset = 0;
                z.length = m_size;
            } else {
                z.length = shift.min(z.size - z.offset);
            }
            return;
        }
        match self.st.direction {
            Direction::Forward => {
                z.offset += z.length;
                z.length = z.length.min(z.size - z.offset);
            }
            Direction::Backward => {
                if z.offset < z.length {
                    z.length = z.offset;
                }
                z.offset -= z.length;
            }
        }
    }

    /// Repair an interrupted hotzone (the header holds a hot table),
    /// commit the post table, and finish if that was the last one.
    pub fn recover(&mut self) -> Result<Outcome, LuksError> {
        self.live(false)?;
        let z = self.zone;
        let prot = self.protection();
        // What recovery reads from the keyslot area must lie inside it.
        let need = match prot {
            Resilience::Checksum { hash, block } => {
                z.length / u64::from(block) * hash.digest_len() as u64
            }
            Resilience::Journal => z.length,
            _ => 0,
        };
        if need > self.st.area_size {
            return Err(LuksError::field(
                format!("keyslots.{}.area.size", self.st.slot),
                self.st.area_size,
                format!("smaller than the {need} bytes the interrupted hotzone needs"),
            ));
        }
        let mut done = if self.moving() {
            self.move_zone(false)?;
            z.length
        } else {
            0u64
        };
        while done < z.length {
            let n = RECOVERY_CHUNK.min(z.length - done);
            let at = z.offset + done;
            let mut buf = zeroize::Zeroizing::new(vec![0u8; n as usize]);
            match prot {
                Resilience::Checksum { hash, block } => {
                    let hl = hash.digest_len() as u64;
                    let blocks = n / u64::from(block);
                    let mut sums = vec![0u8; (blocks * hl) as usize];
                    let first = done / u64::from(block);
                    self.vol
                        .meta
                        .read_at(self.st.area_offset + first * hl, &mut sums)?;
                    self.data.read_at(z.data_offset + at, &mut buf)?;
                    for (i, b) in buf.chunks_mut(block as usize).enumerate() {
                        let want = &sums[i * hl as usize..(i + 1) * hl as usize];
                        if hash.digest(&[b]) == want {
                            let bat = at + i as u64 * u64::from(block);
                            self.transform(b, bat);
                            self.data.write_at(z.data_offset + bat, b)?;
                        }
                    }
                }
                Resilience::Journal => {
                    self.vol
                        .meta
                        .read_at(self.st.area_offset + done, &mut buf)?;
                    self.transform(&mut buf, at);
                    self.data.write_at(z.data_offset + at, &buf)?;
                }
                Resilience::Datashift { .. } => {
                    return Err(LuksError::Usage(
                        "Interrupted hotzone cannot be recovered: an encryption in place with \
                         resilience datashift (a detached header with --reduce-device-size) \
                         keeps no copy of it."
                            .into(),
                    ))
                }
                _ => {
                    return Err(LuksError::Usage(
                        "Interrupted hotzone cannot be recovered: resilience mode none.".into(),
                    ))
                }
            }
            done += n;
        }
        self.data.sync()?;
        let current: Vec<Value> = self.regular()?.into_iter().map(|(_, v)| v).collect();
        let post = if let Some((_, m, _)) = self.unshift {
            segments::post_unshift(&self.st, &z, m, &current)
        } else if self.shift.is_some() {
            segments::post_shift(&z, &current)
        } else {
            segments::post(&self.st, &z, &current)
        };
        self.set_segments(post, false)?;
        self.st.hot = None;
        self.live(true)?;
        self.advance();
        if self.progress >= self.zone.size {
            return self.finish();
        }
        self.commit()?;
        Ok(Outcome::Interrupted)
    }

    /// Whether a stop must wait for the next hotzone: cryptsetup 2.6.1
    /// cannot resume a decryption with data shift resting just before a
    /// moved segment smaller than the shift (it sizes that hotzone by the
    /// shift and fails), so udm never leaves the header there.
    fn must_go_on(&self) -> bool {
        self.unshift
            .is_some_and(|(shift, m, _)| m < shift && self.zone.offset == 0)
    }

    /// Run hotzones until done or `stop` is set (checked between them).
    pub fn run(&mut self, stop: &AtomicBool, fb: &dyn Feedback) -> Result<Outcome, LuksError> {
        fb.begin("Reencrypting", self.zone.size);
        fb.advance(self.progress);
        let mut r = Ok(());
        while self.progress < self.zone.size && (!stop.load(Ordering::Relaxed) || self.must_go_on())
        {
            r = self.step();
            if r.is_err() {
                break;
            }
            self.advance();
            fb.advance(self.progress);
        }
        fb.end();
        r?;
        if self.progress >= self.zone.size {
            return self.finish();
        }
        if self.none_dirty {
            self.commit()?;
        }
        Ok(Outcome::Interrupted)
    }

    /// Drop the reencryption metadata once every byte has moved, as
    /// cryptsetup's teardown does: keyslots of the old key (when it
    /// changed), the backup segments, the requirement flag, the reencrypt
    /// keyslot and its digest. One header write; the old keyslots' areas
    /// are wiped only after no header names them.
    fn finish(&mut self) -> Result<Outcome, LuksError> {
        if let Some((_, m_off, m_size)) = self.shift {
            // The moved segment still holds the start of the plaintext:
            // overwritten with random bytes, as cryptsetup's teardown does.
            let mut done = 0u64;
            while done < m_size {
                let n = RECOVERY_CHUNK.min(m_size - done);
                let noise = crate::luks::keyslot::random(n as usize)?;
                self.data.write_at(m_off + done, &noise)?;
                done += n;
            }
            self.data.sync()?;
        }
        if let Some((shift, _, _)) = self.unshift {
            // The last `shift` bytes of the device held ciphertext that
            // has moved down: overwritten with random bytes, as
            // cryptsetup's teardown does.
            let dev = self.vol.data_size;
            let mut at = dev.saturating_sub(shift);
            while at < dev {
                let n = RECOVERY_CHUNK.min(dev - at);
                let noise = crate::luks::keyslot::random(n as usize)?;
                self.data.write_at(at, &noise)?;
                at += n;
            }
            self.data.sync()?;
        }
        let st = self.st.clone();
        let h = self.header()?;
        let hdr_size = h.bin.hdr_size;
        let old_slots: Vec<(u32, u64, u64)> = match st.digest_old {
            Some(d) if st.digest_new != Some(d) => h
                .meta
                .digests
                .get(&d)
                .map(|dg| {
                    dg.keyslots
                        .iter()
                        .filter_map(|s| {
                            h.meta
                                .keyslots
                                .get(s)
                                .map(|k| (*s, k.area_offset, k.area_size))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let mut gone: Vec<String> = old_slots.iter().map(|s| s.0.to_string()).collect();
        gone.push(st.slot.to_string());
        h.meta = h.meta.edit(hdr_size, |top| {
            if let Some(k) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
                for g in &gone {
                    k.shift_remove(g);
                }
            }
            for group in ["digests", "tokens"] {
                if let Some(g) = top.get_mut(group).and_then(Value::as_object_mut) {
                    for (_, item) in g.iter_mut() {
                        if let Some(a) = item.get_mut("keyslots").and_then(Value::as_array_mut) {
                            a.retain(|e| !gone.iter().any(|g| e.as_str() == Some(g)));
                        }
                    }
                }
            }
            let mut keep = Map::new();
            let mut dropped = Vec::new();
            if let Some(segs) = top.get("segments").and_then(Value::as_object) {
                for (k, v) in segs {
                    let backup = v["flags"].as_array().is_some_and(|f| {
                        f.iter()
                            .any(|x| x.as_str().is_some_and(|s| s.starts_with("backup-")))
                    });
                    if backup {
                        dropped.push(k.clone());
                    } else {
                        keep.insert(k.clone(), v.clone());
                    }
                }
            }
            top.insert("segments".into(), Value::Object(keep));
            if let Some(ds) = top.get_mut("digests").and_then(Value::as_object_mut) {
                for d in ds.values_mut() {
                    if let Some(a) = d.get_mut("segments").and_then(Value::as_array_mut) {
                        a.retain(|e| !dropped.iter().any(|g| e.as_str() == Some(g)));
                    }
                }
                ds.retain(|_, d| d["keyslots"].as_array().is_some_and(|a| !a.is_empty()));
            }
            if let Some(cfg) = top.get_mut("config").and_then(Value::as_object_mut) {
                let mut empty = false;
                if let Some(m) = cfg
                    .get_mut("requirements")
                    .and_then(|r| r.get_mut("mandatory"))
                    .and_then(Value::as_array_mut)
                {
                    m.retain(|r| {
                        !r.as_str()
                            .is_some_and(|s| s.starts_with("online-reencrypt"))
                    });
                    empty = m.is_empty();
                }
                if empty {
                    cfg.shift_remove("requirements");
                }
            }
        })?;
        self.commit()?;
        for (_, off, len) in old_slots {
            self.vol.meta.zero(off, len, &mut |_| {})?;
        }
        self.vol.meta.sync()?;
        Ok(Outcome::Finished)
    }
}
