//! Setting a job up from a header in reencryption: the data area, the
//! alignment, the hotzone to do next (or the interrupted one) and the
//! progress so far, for the plain case and for the two data shifts.

use super::{crypt, luks2, shift_zone, Job, Sizes, NONE_DEFAULT, UDM_MAX_HOTZONE};
use crate::crypto::SectorCrypt;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::luks2::Luks2;
use crate::luks::reencrypt::keys::Key;
use crate::luks::reencrypt::segments::Zone;
use crate::luks::reencrypt::state::{
    segment_by_flag, Direction, Mode, Moved, Resilience, SegParams, State, MAX_HOTZONE,
};
use crate::luks::volume::Volume;

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

/// cryptsetup's encryption with data shift and a detached header: no
/// moved segment, the data encrypted in place (at the data offset) in
/// hotzones of the shift (the generic backward path). Some(shift) then.
fn in_place_shift(vol: &mut Volume, st: &State) -> Result<Option<u64>, LuksError> {
    Ok(match st.resilience {
        Resilience::Datashift { shift, moved: None }
            if st.mode == Mode::Encrypt
                && vol.detached
                && segment_by_flag(&luks2(vol)?.meta, "backup-moved-segment").is_none() =>
        {
            Some(shift)
        }
        _ => None,
    })
}

/// What udm reencrypts in place: old and new data at the same offset
/// without an iv_tweak, and no fixed-size segment (`--device-size`)
/// except the in-place data shift's plaintext.
fn check_in_place_layout(
    vol: &mut Volume,
    st: &State,
    in_place: Option<u64>,
) -> Result<(), LuksError> {
    if st.old.offset != st.new.offset || st.old.iv_tweak != 0 || st.new.iv_tweak != 0 {
        return Err(LuksError::Unsupported(
            "reencryption between segments at different offsets or with an iv_tweak".into(),
        ));
    }
    let h = luks2(vol)?;
    for flag in ["backup-previous", "backup-final"] {
        if let Some(id) = segment_by_flag(&h.meta, flag) {
            // The in-place data shift's plaintext segment has a size.
            if h.meta.segments[&id].size.is_some() && in_place.is_none() {
                return Err(LuksError::Unsupported(
                    "reencryption of a fixed-size data segment (--device-size)".into(),
                ));
            }
        }
    }
    Ok(())
}

/// (offset, size) of each data segment, backups aside, in header order.
fn regular_segments(h: &Luks2) -> Vec<(u64, Option<u64>)> {
    h.meta
        .segments
        .values()
        .filter(|s| !s.is_backup())
        .map(|s| (s.offset, s.size))
        .collect()
}

/// The length of the next hotzone when none is in progress, as
/// cryptsetup sizes it: the shift in place, `--hotzone-size` or 20 MiB
/// without resilience, what the keyslot area can protect otherwise;
/// capped by udm's buffer and aligned.
fn first_length(
    st: &State,
    size: u64,
    align: u64,
    max_hotzone: Option<u64>,
    in_place: Option<u64>,
) -> Result<u64, LuksError> {
    let mut len = match st.resilience {
        _ if in_place.is_some() => {
            let shift = in_place.unwrap_or(0);
            if shift == 0 || shift > UDM_MAX_HOTZONE || shift % align != 0 || size % shift != 0 {
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
    Ok(len)
}

/// Where the next hotzone of at most `len` bytes lies (offset, length),
/// from the direction and the one or two data segments of a clean
/// reencryption.
fn first_zone(
    st: &State,
    regular: &[(u64, Option<u64>)],
    size: u64,
    align: u64,
    mut len: u64,
) -> Result<(u64, u64), LuksError> {
    let seg0_len = || -> Result<u64, LuksError> {
        regular
            .first()
            .and_then(|s| s.1)
            .ok_or_else(|| LuksError::field("segments.0.size", "dynamic", "expected a fixed size"))
    };
    let offset = match (st.direction, regular.len()) {
        (Direction::Forward, 1) => 0,
        (Direction::Forward, 2) => seg0_len()?,
        (Direction::Backward, 1) => {
            len = len.min(size);
            size - len
        }
        (Direction::Backward, 2) => {
            let t = seg0_len()?;
            len = len.min(t);
            t - len
        }
        (_, n) => {
            return Err(LuksError::field(
                "segments",
                n,
                "a clean reencryption has one or two data segments",
            ))
        }
    };
    if offset > size || offset % align != 0 {
        return Err(LuksError::field("segments.0.size", offset, "misaligned"));
    }
    Ok((offset, len.min(size - offset)))
}

/// A keyslot field error about the shift.
fn shift_error(st: &State, what: &str, v: u64) -> LuksError {
    LuksError::field(
        format!("keyslots.{}.area.shift_size", st.slot),
        v,
        what.to_string(),
    )
}

/// What udm decrypts with data shift: cryptsetup's layout (forward to a
/// linear segment, old data at the shift, new at 0, no iv_tweak) with a
/// protected moved segment, whose protection is returned.
fn check_unshift_layout(st: &State, shift: u64, moved: Option<Moved>) -> Result<Moved, LuksError> {
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
    if shift == 0 || shift % align != 0 {
        return Err(shift_error(
            st,
            "zero or not aligned to the encryption sector",
            shift,
        ));
    }
    if st.new.offset != 0 || st.old.offset != shift || st.old.iv_tweak != 0 {
        return Err(LuksError::Unsupported(
            "decryption with data shift with segments other than cryptsetup's layout \
             (old data at the shift, new data at 0, no iv_tweak)"
                .into(),
        ));
    }
    Ok(moved)
}

/// The size of a decryption's moved segment: encrypted at byte 0, not
/// empty, aligned, no larger than the shift or the data.
fn moved_segment_size(h: &Luks2, shift: u64, size: u64, align: u64) -> Result<u64, LuksError> {
    let mid = segment_by_flag(&h.meta, "backup-moved-segment")
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
    Ok(m_size)
}

/// The reencrypt keyslot's area must hold the checksums or journal of
/// the moved segment.
fn check_moved_protection(st: &State, moved: Moved, m_size: u64) -> Result<(), LuksError> {
    let slot = st.slot;
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
    Ok(())
}

/// A decryption with data shift interrupted in hotzone `hid`: that
/// hotzone (the moved segment, or one past it) and the bytes done.
fn unshift_hot_zone(
    h: &Luks2,
    zone: &mut Zone,
    hid: u32,
    shift: u64,
    m_size: u64,
    align: u64,
) -> Result<u64, LuksError> {
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
    Ok(if zone.offset == 0 {
        zone.size - m_size
    } else {
        zone.offset - m_size
    })
}

/// A decryption with data shift between hotzones: the next one follows
/// the last plaintext; the moved segment comes last; with no encrypted
/// segment left only the teardown remains. Returns the bytes done.
fn unshift_next_zone(
    h: &Luks2,
    zone: &mut Zone,
    shift: u64,
    m_size: u64,
    align: u64,
) -> Result<u64, LuksError> {
    let size = zone.size;
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
        None => Ok(size),
        Some((0, _, _)) => {
            zone.length = m_size;
            Ok(size - m_size)
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
            Ok(zone.offset - m_size)
        }
    }
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
        let in_place = in_place_shift(vol, &st)?;
        if let (Resilience::Datashift { shift, moved }, None) = (st.resilience, in_place) {
            return Job::new_moving(vol, st, (key_old, key_new), shift, moved, device_size);
        }
        check_in_place_layout(vol, &st, in_place)?;
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
        let regular = regular_segments(luks2(vol)?);
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
            let s = &luks2(vol)?.meta.segments[&hid];
            zone.offset = s.offset.checked_sub(data_offset).unwrap_or(u64::MAX);
            zone.length = s.size.unwrap_or(0);
            zone.check(hid, s.offset, MAX_HOTZONE, align, true)?;
        } else {
            let len = first_length(&st, size, align, max_hotzone, in_place)?;
            (zone.offset, zone.length) = first_zone(&st, &regular, size, align, len)?;
        }
        let progress = match st.direction {
            Direction::Forward => zone.offset,
            Direction::Backward => size - zone.offset - zone.length,
        };
        Job::with(vol, st, old, new, zone, progress)
    }

    /// A job whose hotzones move data: an encryption (`new_shift`) or a
    /// decryption (`new_unshift`) with data shift.
    fn new_moving(
        vol: &'a mut Volume,
        st: State,
        (key_old, key_new): (Option<&Key>, Option<&Key>),
        shift: u64,
        moved: Option<Moved>,
        device_size: Option<u64>,
    ) -> Result<Job<'a>, LuksError> {
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
        Ok(job)
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
        if st.mode != Mode::Encrypt || st.direction != Direction::Backward {
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
            let id = segment_by_flag(&h.meta, flag)
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
        let moved = check_unshift_layout(&st, shift, moved)?;
        let align = 4096u64.max(u64::from(st.old.sector_size));
        let size = vol
            .data_size
            .checked_sub(shift)
            .filter(|s| *s > 0 && s % align == 0)
            .ok_or_else(|| {
                shift_error(
                    &st,
                    "data device too small or not aligned for this shift",
                    shift,
                )
            })?;
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
        let m_size = moved_segment_size(h, shift, size, align)?;
        check_moved_protection(&st, moved, m_size)?;
        let mut zone = Zone {
            data_offset: 0,
            size,
            offset: 0,
            length: 0,
            fixed: false,
        };
        let progress = match st.hot {
            Some(hid) => unshift_hot_zone(h, &mut zone, hid, shift, m_size, align)?,
            None => unshift_next_zone(h, &mut zone, shift, m_size, align)?,
        };
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
}
