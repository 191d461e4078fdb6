//! Reading LUKS2 JSON metadata: every member is checked (type, range,
//! references between objects) before anything uses it, and errors name the
//! dotted path of the member at fault (`keyslots.3.area.offset`), so a user
//! can tell a damaged header from an unsupported one.

use super::fields::{b64, hash, id, id_list, int, member, obj, string, strings, u64str};
use super::types::{Digest, Keyslot, Segment, Unusable};
use super::{Metadata, MAX_KEYSLOTS, MAX_KEYSLOTS_SIZE, MAX_KEY_SIZE, MAX_TOKENS};
use crate::luks::af::STRIPES;
use crate::luks::error::LuksError;
use crate::luks::kdf::{Argon2Kind, Kdf};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

fn parse_kdf(o: &Map<String, Value>, field: &str) -> Result<(Kdf, Vec<u8>), LuksError> {
    let t = string(o, "type", field)?;
    let kdf = match t {
        "pbkdf2" => Kdf::Pbkdf2 {
            hash: hash(o, "hash", field)?,
            iterations: int(
                o,
                "iterations",
                field,
                1,
                u64::from(crate::luks::kdf::MAX_PBKDF2_ITERATIONS),
            )?,
        },
        "argon2i" | "argon2id" => Kdf::Argon2 {
            kind: if t == "argon2i" {
                Argon2Kind::I
            } else {
                Argon2Kind::Id
            },
            time: int(o, "time", field, 1, u64::from(u32::MAX))?,
            memory_kib: int(o, "memory", field, 1, u64::from(u32::MAX))?,
            cpus: int(o, "cpus", field, 1, u64::from(u32::MAX))?,
        },
        _ => {
            return Err(LuksError::field(
                format!("{field}.type"),
                t,
                "unsupported KDF (pbkdf2, argon2i, argon2id)",
            ))
        }
    };
    kdf.check(field)?;
    let salt = b64(o, "salt", field)?;
    if salt.len() != 32 {
        return Err(LuksError::field(
            format!("{field}.salt"),
            salt.len(),
            "salt must decode to 32 bytes",
        ));
    }
    Ok((kdf, salt))
}

/// The `config` object: (json_size, keyslots_size, flags, requirements).
fn parse_config(
    top: &Map<String, Value>,
    hdr_size: u64,
) -> Result<(u64, u64, Vec<String>, Vec<String>), LuksError> {
    let config = obj(member(top, "config", "json")?, "config")?;
    let json_size = u64str(config, "json_size", "config")?;
    if json_size != hdr_size.saturating_sub(4096) {
        return Err(LuksError::field(
            "config.json_size",
            json_size,
            format!(
                "must be header size - 4096 = {}",
                hdr_size.saturating_sub(4096)
            ),
        ));
    }
    let keyslots_size = u64str(config, "keyslots_size", "config")?;
    if keyslots_size % 4096 != 0 || keyslots_size > MAX_KEYSLOTS_SIZE {
        return Err(LuksError::field(
            "config.keyslots_size",
            keyslots_size,
            "must be a multiple of 4096 and at most 128 MiB",
        ));
    }
    let flags = strings(config, "flags", "config")?;
    let mut requirements = Vec::new();
    if let Some(r) = config.get("requirements") {
        let r = obj(r, "config.requirements")?;
        requirements = strings(r, "mandatory", "config.requirements")?;
    }
    Ok((json_size, keyslots_size, flags, requirements))
}

/// `luks2` keyslots udm can unlock, the numbers and types of other
/// keyslots, and `luks2` keyslots udm cannot unlock with why.
type Keyslots = (
    BTreeMap<u32, Keyslot>,
    BTreeMap<u32, String>,
    BTreeMap<u32, Unusable>,
);

/// One `luks2` keyslot, checked as udm needs it to unlock: the area inside
/// the keyslots area `[areas_start, areas_end)`, 4000 stripes, a KDF udm
/// runs within its limits.
fn parse_keyslot(
    o: &Map<String, Value>,
    f: &str,
    areas_start: u64,
    areas_end: u64,
) -> Result<Keyslot, LuksError> {
    let key_size = int(o, "key_size", f, 1, MAX_KEY_SIZE)?;
    let priority = match o.get("priority") {
        None => 1,
        Some(_) => int(o, "priority", f, 0, 2)?,
    };
    let af = obj(member(o, "af", f)?, &format!("{f}.af"))?;
    let aft = string(af, "type", &format!("{f}.af"))?;
    if aft != "luks1" {
        return Err(LuksError::field(
            format!("{f}.af.type"),
            aft,
            "only \"luks1\" is supported",
        ));
    }
    let stripes = int(af, "stripes", &format!("{f}.af"), 1, u64::from(u32::MAX))?;
    if stripes != STRIPES {
        return Err(LuksError::field(
            format!("{f}.af.stripes"),
            stripes,
            "must be 4000",
        ));
    }
    let af_hash = hash(af, "hash", &format!("{f}.af"))?;
    let fa = format!("{f}.area");
    let area = obj(member(o, "area", f)?, &fa)?;
    let at = string(area, "type", &fa)?;
    if at != "raw" {
        return Err(LuksError::field(
            format!("{fa}.type"),
            at,
            "only \"raw\" is supported",
        ));
    }
    let area_offset = u64str(area, "offset", &fa)?;
    let area_size = u64str(area, "size", &fa)?;
    let area_encryption = string(area, "encryption", &fa)?.to_string();
    if area_encryption.is_empty() || area_encryption.len() > 128 {
        return Err(LuksError::field(
            format!("{fa}.encryption"),
            &area_encryption,
            "invalid cipher spec",
        ));
    }
    let area_key_size = int(area, "key_size", &fa, 1, MAX_KEY_SIZE)?;
    let need = (u64::from(key_size) * u64::from(stripes)).div_ceil(512) * 512;
    if area_size < need {
        return Err(LuksError::field(
            format!("{fa}.size"),
            area_size,
            format!("smaller than the {need} bytes of key material"),
        ));
    }
    let end = area_offset.checked_add(area_size);
    if area_offset < areas_start || end.is_none_or(|e| e > areas_end) {
        return Err(LuksError::field(
            format!("{fa}.offset"),
            area_offset,
            format!("area (+{area_size}) must lie inside the keyslots area [{areas_start}, {areas_end})"),
        ));
    }
    let (kdf, salt) = parse_kdf(
        obj(member(o, "kdf", f)?, &format!("{f}.kdf"))?,
        &format!("{f}.kdf"),
    )?;
    Ok(Keyslot {
        key_size,
        priority,
        kdf,
        salt,
        af_hash,
        stripes,
        area_offset,
        area_size,
        area_encryption,
        area_key_size,
    })
}

/// The `keyslots` object, already validated as cryptsetup validates it:
/// a `luks2` keyslot udm cannot unlock is kept with the reason, which is
/// the error when that keyslot is used.
fn parse_keyslots(
    top: &Map<String, Value>,
    areas_start: u64,
    areas_end: u64,
) -> Result<Keyslots, LuksError> {
    let mut keyslots = BTreeMap::new();
    let mut other_keyslots = BTreeMap::new();
    let mut unusable = BTreeMap::new();
    for (k, v) in obj(member(top, "keyslots", "json")?, "keyslots")? {
        let n = id(k, "keyslots", MAX_KEYSLOTS)?;
        let f = format!("keyslots.{k}");
        let o = obj(v, &f)?;
        let t = string(o, "type", &f)?;
        if t != "luks2" {
            other_keyslots.insert(n, t.to_string());
            continue;
        }
        match parse_keyslot(o, &f, areas_start, areas_end) {
            Ok(ks) => {
                keyslots.insert(n, ks);
            }
            Err(e) => {
                let priority = o.get("priority").and_then(Value::as_u64).unwrap_or(1);
                unusable.insert(n, Unusable::new(e, priority.min(2) as u32));
            }
        }
    }
    Ok((keyslots, other_keyslots, unusable))
}

/// The `segments` object, already validated as cryptsetup validates it
/// (numbered 0..N-1, backups last, regular segments not overlapping, crypt
/// members present). What udm needs beyond that to map a segment (its
/// sector size, its size against the device) is checked when it is mapped.
/// Whether data overlaps the metadata depends on where the header is (a
/// detached header's data may start anywhere): `Volume::check_data_offset`
/// decides that.
fn parse_segments(top: &Map<String, Value>) -> Result<BTreeMap<u32, Segment>, LuksError> {
    let mut segments = BTreeMap::new();
    let u = |o: &Map<String, Value>, k: &str| {
        o.get(k)
            .and_then(Value::as_str)
            .and_then(super::parse_u64str)
    };
    for (k, v) in obj(member(top, "segments", "json")?, "segments")? {
        let n = id(k, "segments", 1024)?;
        let f = format!("segments.{k}");
        let o = obj(v, &f)?;
        let kind = string(o, "type", &f)?.to_string();
        let crypt = kind == "crypt";
        segments.insert(
            n,
            Segment {
                offset: u(o, "offset").unwrap_or(0),
                size: u(o, "size"),
                iv_tweak: if crypt {
                    u(o, "iv_tweak").unwrap_or(0)
                } else {
                    0
                },
                encryption: o
                    .get("encryption")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                sector_size: o
                    .get("sector_size")
                    .and_then(Value::as_u64)
                    .map_or(512, |s| s.min(u64::from(u32::MAX)) as u32),
                integrity: crypt && o.get("integrity").is_some(),
                flags: strings(o, "flags", &f)?,
                kind,
            },
        );
    }
    Ok(segments)
}

/// The `digests` object; every luks2 keyslot belongs to exactly one digest
/// and every regular crypt segment to at least one.
fn parse_digests(
    top: &Map<String, Value>,
    keyslots: &Keyslots,
    segments: &BTreeMap<u32, Segment>,
) -> Result<BTreeMap<u32, Digest>, LuksError> {
    let (keyslots, other_keyslots, unusable) = keyslots;
    let exists = |k: &u32| {
        keyslots.contains_key(k) || other_keyslots.contains_key(k) || unusable.contains_key(k)
    };
    let mut digests = BTreeMap::new();
    for (k, v) in obj(member(top, "digests", "json")?, "digests")? {
        let n = id(k, "digests", MAX_KEYSLOTS)?;
        let f = format!("digests.{k}");
        let o = obj(v, &f)?;
        let t = string(o, "type", &f)?;
        if t != "pbkdf2" {
            return Err(LuksError::field(
                format!("{f}.type"),
                t,
                "only pbkdf2 digests are supported",
            ));
        }
        let ks = id_list(o, "keyslots", &f, MAX_KEYSLOTS)?;
        let segs = id_list(o, "segments", &f, 1024)?;
        for k in &ks {
            if !exists(k) {
                return Err(LuksError::field(
                    format!("{f}.keyslots"),
                    k,
                    "names a keyslot that does not exist",
                ));
            }
        }
        for s in &segs {
            if !segments.contains_key(s) {
                return Err(LuksError::field(
                    format!("{f}.segments"),
                    s,
                    "names a segment that does not exist",
                ));
            }
        }
        let h = hash(o, "hash", &f)?;
        let iterations = int(
            o,
            "iterations",
            &f,
            1,
            u64::from(crate::luks::kdf::MAX_PBKDF2_ITERATIONS),
        )?;
        let salt = b64(o, "salt", &f)?;
        if salt.is_empty() || salt.len() > 64 {
            return Err(LuksError::field(
                format!("{f}.salt"),
                salt.len(),
                "salt length must be 1..64 bytes",
            ));
        }
        let digest = b64(o, "digest", &f)?;
        if digest.len() != 20 && digest.len() != h.digest_len() {
            return Err(LuksError::field(
                format!("{f}.digest"),
                digest.len(),
                "digest length must be 20 or the hash size",
            ));
        }
        digests.insert(
            n,
            Digest {
                keyslots: ks,
                segments: segs,
                hash: h,
                iterations,
                salt,
                digest,
            },
        );
    }
    for k in keyslots.keys() {
        let refs = digests.values().filter(|d| d.keyslots.contains(k)).count();
        if refs != 1 {
            return Err(LuksError::field(
                format!("keyslots.{k}"),
                refs,
                "must be referenced by exactly one digest",
            ));
        }
    }
    for (n, s) in segments {
        if s.kind == "crypt" && !s.is_backup() && !digests.values().any(|d| d.segments.contains(n))
        {
            return Err(LuksError::field(
                format!("segments.{n}"),
                "crypt",
                "not referenced by any digest",
            ));
        }
    }
    Ok(digests)
}

/// The `tokens` object: keyslot lists checked, everything else free-form.
fn parse_tokens(
    top: &Map<String, Value>,
    keyslots: &Keyslots,
) -> Result<BTreeMap<u32, Vec<u32>>, LuksError> {
    let (keyslots, other_keyslots, unusable) = keyslots;
    let exists = |k: &u32| {
        keyslots.contains_key(k) || other_keyslots.contains_key(k) || unusable.contains_key(k)
    };
    let mut tokens = BTreeMap::new();
    for (k, v) in obj(member(top, "tokens", "json")?, "tokens")? {
        let n = id(k, "tokens", MAX_TOKENS)?;
        let f = format!("tokens.{k}");
        let o = obj(v, &f)?;
        string(o, "type", &f)?;
        let ks = id_list(o, "keyslots", &f, MAX_KEYSLOTS)?;
        for k in &ks {
            if !exists(k) {
                return Err(LuksError::field(
                    format!("{f}.keyslots"),
                    k,
                    "names a keyslot that does not exist",
                ));
            }
        }
        tokens.insert(n, ks);
    }
    Ok(tokens)
}

impl Metadata {
    /// Validate `value` as the JSON of a header with `hdr_size` bytes per copy.
    pub fn parse(value: Value, hdr_size: u64) -> Result<Metadata, LuksError> {
        let value = super::validate::validate_or_repair(value, hdr_size.saturating_sub(4096))?;
        let top = obj(&value, "json")?;
        let (json_size, keyslots_size, flags, requirements) = parse_config(top, hdr_size)?;
        let areas_start = 2 * hdr_size;
        let areas_end = areas_start + keyslots_size;
        let ks = parse_keyslots(top, areas_start, areas_end)?;
        let segments = parse_segments(top)?;
        let digests = parse_digests(top, &ks, &segments)?;
        let tokens = parse_tokens(top, &ks)?;
        let (keyslots, other_keyslots, unusable) = ks;
        Ok(Metadata {
            value,
            keyslots,
            other_keyslots,
            unusable,
            segments,
            digests,
            tokens,
            json_size,
            keyslots_size,
            flags,
            requirements,
        })
    }
}
