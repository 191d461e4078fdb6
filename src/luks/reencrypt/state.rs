//! What a LUKS2 header in reencryption says about the operation: the
//! `reencrypt` keyslot (mode, direction, resilience and its area), the
//! `backup-previous` / `backup-final` segments (old and new data layout)
//! and the digests that bind the old and new volume keys to them. Every
//! value is checked here, before anything sizes a buffer or a loop by it.

use serde_json::{Map, Value};

use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use crate::luks::json::{parse_u64str, Metadata};

/// cryptsetup's largest hotzone (1 GiB): an `in-reencryption` segment
/// longer than this is refused rather than recovered.
pub const MAX_HOTZONE: u64 = 1 << 30;

/// Which keys the data moves between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Old key to new key (`reencrypt`).
    Reencrypt,
    /// Plaintext to new key.
    Encrypt,
    /// Old key to plaintext.
    Decrypt,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Reencrypt => "reencrypt",
            Mode::Encrypt => "encrypt",
            Mode::Decrypt => "decrypt",
        }
    }
}

/// Which end of the device the hotzones start from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Backward,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        }
    }
}

/// How an interrupted hotzone is repaired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resilience {
    /// A hash of every `block` bytes of the hotzone's old ciphertext is
    /// stored in the keyslot area; a block whose hash still matches was
    /// not rewritten yet.
    Checksum { hash: HashAlg, block: u32 },
    /// The hotzone's old ciphertext is copied into the keyslot area.
    Journal,
    /// Nothing: an interrupted hotzone cannot be repaired.
    None,
    /// Data moves by `shift` bytes: away from the start of the device
    /// (encryption, `datashift`) or back to it (decryption of a volume
    /// whose header was on the device, `datashift-checksum` or
    /// `datashift-journal`: `moved` protects the last hotzone, which
    /// rewrites the moved first segment in place).
    Datashift { shift: u64, moved: Option<Moved> },
}

/// How the in-place hotzone of a decryption with data shift (the moved
/// first segment) is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    /// `datashift-checksum`: hashes of every `block` bytes, as `checksum`.
    Checksum { hash: HashAlg, block: u32 },
    /// `datashift-journal`: the old bytes themselves, as `journal`.
    Journal,
}

impl Resilience {
    pub fn name(&self) -> &'static str {
        match self {
            Resilience::Checksum { .. } => "checksum",
            Resilience::Journal => "journal",
            Resilience::None => "none",
            Resilience::Datashift { moved: None, .. } => "datashift",
            Resilience::Datashift {
                moved: Some(Moved::Checksum { .. }),
                ..
            } => "datashift-checksum",
            Resilience::Datashift {
                moved: Some(Moved::Journal),
                ..
            } => "datashift-journal",
        }
    }
}

/// One data segment as the engine needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegParams {
    /// `None` = linear (plaintext); else the dm-crypt cipher spec.
    pub cipher: Option<String>,
    pub offset: u64,
    pub sector_size: u32,
    pub iv_tweak: u64,
}

/// The reencryption described by a header.
#[derive(Clone, Debug)]
pub struct State {
    /// 2 for `online-reencrypt-v2`, 3 for `-v3`.
    pub version: u8,
    /// The `reencrypt` keyslot.
    pub slot: u32,
    pub mode: Mode,
    pub direction: Direction,
    pub resilience: Resilience,
    pub area_offset: u64,
    pub area_size: u64,
    pub old: SegParams,
    pub new: SegParams,
    /// Digest of the old / new volume key (None for plaintext).
    pub digest_old: Option<u32>,
    pub digest_new: Option<u32>,
    /// The segment flagged `in-reencryption` (a hotzone was interrupted).
    pub hot: Option<u32>,
}

/// The `online-reencrypt*` requirement of a header, if any: its version.
pub fn requirement_version(meta: &Metadata) -> Option<Result<u8, LuksError>> {
    let r = meta
        .requirements
        .iter()
        .find(|r| r.starts_with("online-reencrypt"))?;
    Some(match r.as_str() {
        "online-reencrypt-v2" => Ok(2),
        "online-reencrypt-v3" => Ok(3),
        "online-reencrypt" => Err(LuksError::Unsupported(
            "reencryption metadata of cryptsetup 2.2 (online-reencrypt v1, no metadata digest); \
             finish it with that cryptsetup version"
                .into(),
        )),
        other => Err(LuksError::Requirement(other.to_string())),
    })
}

fn area_u64(area: &Map<String, Value>, key: &str) -> Result<u64, LuksError> {
    area.get(key)
        .and_then(Value::as_str)
        .and_then(parse_u64str)
        .ok_or_else(|| {
            LuksError::field(
                format!("reencrypt keyslot area.{key}"),
                area.get(key).map(|v| v.to_string()).unwrap_or_default(),
                "missing or not a decimal string",
            )
        })
}

fn seg_params(meta: &Metadata, id: u32) -> Result<SegParams, LuksError> {
    let s = meta
        .segments
        .get(&id)
        .ok_or_else(|| LuksError::field("segments", id, "missing"))?;
    let cipher = match s.kind.as_str() {
        "crypt" => Some(s.encryption.clone()),
        "linear" => None,
        k => {
            return Err(LuksError::Unsupported(format!(
                "segments.{id}.type = {k} in reencryption"
            )))
        }
    };
    if s.integrity {
        return Err(LuksError::Unsupported(format!(
            "segments.{id}.integrity in reencryption"
        )));
    }
    Ok(SegParams {
        cipher,
        offset: s.offset,
        sector_size: s.sector_size,
        iv_tweak: s.iv_tweak,
    })
}

/// The id of the segment carrying `flag`.
pub fn segment_by_flag(meta: &Metadata, flag: &str) -> Option<u32> {
    meta.segments
        .iter()
        .find(|(_, s)| s.flags.iter().any(|f| f == flag))
        .map(|(n, _)| *n)
}

/// The digest bound to segment `seg`.
pub fn digest_of_segment(meta: &Metadata, seg: u32) -> Option<u32> {
    meta.digests
        .iter()
        .find(|(_, d)| d.segments.contains(&seg))
        .map(|(n, _)| *n)
}

impl State {
    /// Read the reencryption state of `meta`; None if the header is not
    /// in reencryption.
    pub fn read(meta: &Metadata) -> Result<Option<State>, LuksError> {
        let Some(version) = requirement_version(meta) else {
            return Ok(None);
        };
        let version = version?;
        let (slot, ks) = reencrypt_keyslot(meta)?;
        let (mode, direction) = mode_and_direction(ks, slot)?;
        let (area, area_offset, area_size) = keyslot_area(meta, ks, slot)?;
        let resilience = resilience(area, slot)?;
        let (old, new, digest_old, digest_new) = backup_segments(meta, mode, slot)?;
        let hot = hot_segment(meta)?;
        Ok(Some(State {
            version,
            slot,
            mode,
            direction,
            resilience,
            area_offset,
            area_size,
            old,
            new,
            digest_old,
            digest_new,
            hot,
        }))
    }
}

/// The `reencrypt` keyslot: its number and JSON object.
fn reencrypt_keyslot(meta: &Metadata) -> Result<(u32, &Map<String, Value>), LuksError> {
    let slot = meta
        .other_keyslots
        .iter()
        .find(|(_, t)| t.as_str() == "reencrypt")
        .map(|(n, _)| *n)
        .ok_or_else(|| {
            LuksError::field(
                "keyslots",
                "(none)",
                "reencryption without a reencrypt keyslot",
            )
        })?;
    let ks = meta.value["keyslots"][slot.to_string()]
        .as_object()
        .ok_or_else(|| LuksError::field(format!("keyslots.{slot}"), "", "not an object"))?;
    Ok((slot, ks))
}

/// The reencrypt keyslot's mode and direction.
fn mode_and_direction(ks: &Map<String, Value>, slot: u32) -> Result<(Mode, Direction), LuksError> {
    let s = |k: &str| ks.get(k).and_then(Value::as_str).unwrap_or("");
    let mode = match s("mode") {
        "reencrypt" => Mode::Reencrypt,
        "encrypt" => Mode::Encrypt,
        "decrypt" => Mode::Decrypt,
        m => {
            return Err(LuksError::field(
                format!("keyslots.{slot}.mode"),
                m,
                "unknown",
            ))
        }
    };
    let direction = match s("direction") {
        "forward" => Direction::Forward,
        "backward" => Direction::Backward,
        d => {
            return Err(LuksError::field(
                format!("keyslots.{slot}.direction"),
                d,
                "unknown",
            ))
        }
    };
    Ok((mode, direction))
}

/// The reencrypt keyslot's area: its object, offset and size, inside the
/// keyslots area.
fn keyslot_area<'a>(
    meta: &Metadata,
    ks: &'a Map<String, Value>,
    slot: u32,
) -> Result<(&'a Map<String, Value>, u64, u64), LuksError> {
    let area = ks
        .get("area")
        .and_then(Value::as_object)
        .ok_or_else(|| LuksError::field(format!("keyslots.{slot}.area"), "", "missing"))?;
    let area_offset = area_u64(area, "offset")?;
    let area_size = area_u64(area, "size")?;
    let areas_start = 2 * (meta.json_size + 4096);
    if area_offset < areas_start
        || area_offset
            .checked_add(area_size)
            .is_none_or(|e| e > areas_start + meta.keyslots_size)
    {
        return Err(LuksError::field(
            format!("keyslots.{slot}.area.offset"),
            area_offset,
            "outside the keyslots area",
        ));
    }
    Ok((area, area_offset, area_size))
}

/// The hash and block size of a checksum resilience.
fn checksum_params(area: &Map<String, Value>, slot: u32) -> Result<(HashAlg, u32), LuksError> {
    let hname = area.get("hash").and_then(Value::as_str).unwrap_or("");
    let hash = HashAlg::from_name(hname).ok_or_else(|| {
        LuksError::field(format!("keyslots.{slot}.area.hash"), hname, "unknown hash")
    })?;
    let block = area
        .get("sector_size")
        .and_then(Value::as_u64)
        .filter(|b| (512..=1 << 16).contains(b) && b.is_power_of_two())
        .ok_or_else(|| {
            LuksError::field(
                format!("keyslots.{slot}.area.sector_size"),
                area.get("sector_size")
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                "must be a power of two from 512 to 65536",
            )
        })? as u32;
    Ok((hash, block))
}

/// The resilience the area's type names.
fn resilience(area: &Map<String, Value>, slot: u32) -> Result<Resilience, LuksError> {
    let atype = area.get("type").and_then(Value::as_str).unwrap_or("");
    let checksum = || checksum_params(area, slot);
    let resilience = match atype {
        "checksum" => {
            let (hash, block) = checksum()?;
            Resilience::Checksum { hash, block }
        }
        "journal" => Resilience::Journal,
        "none" => Resilience::None,
        "datashift" | "datashift-checksum" | "datashift-journal" => {
            let moved = match atype {
                "datashift-checksum" => {
                    let (hash, block) = checksum()?;
                    Some(Moved::Checksum { hash, block })
                }
                "datashift-journal" => Some(Moved::Journal),
                _ => None,
            };
            Resilience::Datashift {
                shift: area_u64(area, "shift_size")?,
                moved,
            }
        }
        t => {
            return Err(LuksError::field(
                format!("keyslots.{slot}.area.type"),
                t,
                "unknown resilience",
            ))
        }
    };
    Ok(resilience)
}

/// The old and new segment parameters (from the backup segments) and
/// their digests, which must agree with each other and with `mode`.
#[allow(clippy::type_complexity)]
fn backup_segments(
    meta: &Metadata,
    mode: Mode,
    slot: u32,
) -> Result<(SegParams, SegParams, Option<u32>, Option<u32>), LuksError> {
    let prev = segment_by_flag(meta, "backup-previous")
        .ok_or_else(|| LuksError::field("segments", "", "no backup-previous segment"))?;
    let fin = segment_by_flag(meta, "backup-final")
        .ok_or_else(|| LuksError::field("segments", "", "no backup-final segment"))?;
    let old = seg_params(meta, prev)?;
    let new = seg_params(meta, fin)?;
    let digest_old = digest_of_segment(meta, prev);
    let digest_new = digest_of_segment(meta, fin);
    if old.cipher.is_some() != digest_old.is_some() || new.cipher.is_some() != digest_new.is_some()
    {
        return Err(LuksError::field(
            "digests",
            "",
            "a crypt backup segment has no digest (or a linear one has)",
        ));
    }
    let expect = match (old.cipher.is_some(), new.cipher.is_some()) {
        (true, true) => Mode::Reencrypt,
        (false, true) => Mode::Encrypt,
        (true, false) => Mode::Decrypt,
        (false, false) => {
            return Err(LuksError::field(
                "segments",
                "",
                "both backup segments are linear",
            ))
        }
    };
    if expect != mode {
        return Err(LuksError::field(
            format!("keyslots.{slot}.mode"),
            mode.name(),
            "does not match the backup segments",
        ));
    }
    Ok((old, new, digest_old, digest_new))
}

/// The hotzone segment of an interrupted step, at most 1 GiB.
fn hot_segment(meta: &Metadata) -> Result<Option<u32>, LuksError> {
    let hot = segment_by_flag(meta, "in-reencryption");
    if let Some(h) = hot {
        let len = meta.segments[&h].size.unwrap_or(u64::MAX);
        if len > MAX_HOTZONE {
            return Err(LuksError::field(
                format!("segments.{h}.size"),
                len,
                "hotzone larger than 1 GiB",
            ));
        }
    }
    Ok(hot)
}
