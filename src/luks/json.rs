//! LUKS2 JSON metadata: validation into typed views, and the few edits udm
//! makes (add or remove a keyslot). The parsed `serde_json::Value` is kept and
//! edited in place, so tokens, unknown members and member order survive a
//! rewrite untouched.

use super::af::STRIPES;
use super::error::LuksError;
use super::hash::HashAlg;
use super::kdf::{Argon2Kind, Kdf};
use base64::Engine;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// cryptsetup's limit on keyslots and tokens.
pub const MAX_KEYSLOTS: u32 = 32;
pub const MAX_TOKENS: u32 = 32;
/// Largest key udm accepts (bytes).
pub const MAX_KEY_SIZE: u64 = 512;
/// Largest keyslots area cryptsetup allows.
pub const MAX_KEYSLOTS_SIZE: u64 = 128 * 1024 * 1024;

/// A `luks2` keyslot.
#[derive(Clone, Debug)]
pub struct Keyslot {
    pub key_size: u32,
    /// 0 = ignore unless asked for by number, 1 = normal, 2 = high.
    pub priority: u32,
    pub kdf: Kdf,
    pub salt: Vec<u8>,
    pub af_hash: HashAlg,
    pub stripes: u32,
    pub area_offset: u64,
    pub area_size: u64,
    pub area_encryption: String,
    pub area_key_size: u32,
}

/// A segment; only `crypt` ones can be activated.
#[derive(Clone, Debug)]
pub struct Segment {
    pub kind: String,
    pub offset: u64,
    /// None = "dynamic" (to the end of the device).
    pub size: Option<u64>,
    pub iv_tweak: u64,
    pub encryption: String,
    pub sector_size: u32,
    pub integrity: bool,
    pub flags: Vec<String>,
}

impl Segment {
    /// Backup segments exist only during reencryption and are never mapped.
    pub fn is_backup(&self) -> bool {
        self.flags.iter().any(|f| f.starts_with("backup-"))
    }
}

/// A `pbkdf2` digest binding keyslots to segments.
#[derive(Clone, Debug)]
pub struct Digest {
    pub keyslots: Vec<u32>,
    pub segments: Vec<u32>,
    pub hash: HashAlg,
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub digest: Vec<u8>,
}

/// Validated metadata plus the JSON it came from.
#[derive(Clone, Debug)]
pub struct Metadata {
    pub value: Value,
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// Keyslots of types udm does not unlock (e.g. `reencrypt`), with their type.
    pub other_keyslots: BTreeMap<u32, String>,
    pub segments: BTreeMap<u32, Segment>,
    pub digests: BTreeMap<u32, Digest>,
    pub tokens: BTreeMap<u32, Vec<u32>>,
    pub json_size: u64,
    pub keyslots_size: u64,
    pub flags: Vec<String>,
    pub requirements: Vec<String>,
}

fn obj<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, LuksError> {
    v.as_object()
        .ok_or_else(|| LuksError::field(field, short(v), "must be a JSON object"))
}

fn short(v: &Value) -> String {
    v.to_string()
}

fn member<'a>(o: &'a Map<String, Value>, name: &str, field: &str) -> Result<&'a Value, LuksError> {
    o.get(name).ok_or_else(|| {
        LuksError::field(
            format!("{field}.{name}"),
            "(missing)",
            "required member is missing",
        )
    })
}

fn string<'a>(o: &'a Map<String, Value>, name: &str, field: &str) -> Result<&'a str, LuksError> {
    let v = member(o, name, field)?;
    v.as_str()
        .ok_or_else(|| LuksError::field(format!("{field}.{name}"), short(v), "must be a string"))
}

/// A 64-bit quantity stored as a decimal string.
fn u64str(o: &Map<String, Value>, name: &str, field: &str) -> Result<u64, LuksError> {
    let s = string(o, name, field)?;
    parse_u64str(s).ok_or_else(|| {
        LuksError::field(
            format!("{field}.{name}"),
            s,
            "must be a decimal string of an unsigned 64-bit number",
        )
    })
}

pub(crate) fn parse_u64str(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn int(
    o: &Map<String, Value>,
    name: &str,
    field: &str,
    min: u64,
    max: u64,
) -> Result<u32, LuksError> {
    let v = member(o, name, field)?;
    match v.as_u64() {
        Some(n) if n >= min && n <= max && n <= u64::from(u32::MAX) => Ok(n as u32),
        _ => Err(LuksError::field(
            format!("{field}.{name}"),
            short(v),
            format!("must be an integer in {min}..={max}"),
        )),
    }
}

fn b64(o: &Map<String, Value>, name: &str, field: &str) -> Result<Vec<u8>, LuksError> {
    let s = string(o, name, field)?;
    if s.len() > 1024 {
        return Err(LuksError::field(format!("{field}.{name}"), s, "too long"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| LuksError::field(format!("{field}.{name}"), s, "not valid Base64"))
}

fn hash(o: &Map<String, Value>, name: &str, field: &str) -> Result<HashAlg, LuksError> {
    let s = string(o, name, field)?;
    HashAlg::from_name(s)
        .ok_or_else(|| LuksError::field(format!("{field}.{name}"), s, "unsupported hash"))
}

fn id(key: &str, field: &str, max: u32) -> Result<u32, LuksError> {
    match parse_u64str(key) {
        Some(n) if n < u64::from(max) && (key == "0" || !key.starts_with('0')) => Ok(n as u32),
        _ => Err(LuksError::field(
            field,
            key,
            format!("member name must be a decimal number below {max}"),
        )),
    }
}

fn id_list(
    o: &Map<String, Value>,
    name: &str,
    field: &str,
    max: u32,
) -> Result<Vec<u32>, LuksError> {
    let v = member(o, name, field)?;
    let a = v
        .as_array()
        .ok_or_else(|| LuksError::field(format!("{field}.{name}"), short(v), "must be an array"))?;
    let mut out = Vec::with_capacity(a.len().min(64));
    for e in a {
        let s = e.as_str().ok_or_else(|| {
            LuksError::field(
                format!("{field}.{name}"),
                short(e),
                "entries must be strings",
            )
        })?;
        out.push(id(s, &format!("{field}.{name}"), max)?);
    }
    Ok(out)
}

fn strings(o: &Map<String, Value>, name: &str, field: &str) -> Result<Vec<String>, LuksError> {
    match o.get(name) {
        None => Ok(Vec::new()),
        Some(v) => {
            let a = v.as_array().ok_or_else(|| {
                LuksError::field(format!("{field}.{name}"), short(v), "must be an array")
            })?;
            a.iter()
                .map(|e| {
                    e.as_str().map(str::to_string).ok_or_else(|| {
                        LuksError::field(
                            format!("{field}.{name}"),
                            short(e),
                            "entries must be strings",
                        )
                    })
                })
                .collect()
        }
    }
}

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
                u64::from(super::kdf::MAX_PBKDF2_ITERATIONS),
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

impl Metadata {
    /// Validate `value` as the JSON of a header with `hdr_size` bytes per copy.
    pub fn parse(value: Value, hdr_size: u64) -> Result<Metadata, LuksError> {
        let top = obj(&value, "json")?;
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
        let areas_start = 2 * hdr_size;
        let areas_end = areas_start + keyslots_size;

        let mut keyslots = BTreeMap::new();
        let mut other_keyslots = BTreeMap::new();
        let mut areas: Vec<(u64, u64, u32)> = Vec::new();
        for (k, v) in obj(member(top, "keyslots", "json")?, "keyslots")? {
            let n = id(k, "keyslots", MAX_KEYSLOTS)?;
            let f = format!("keyslots.{k}");
            let o = obj(v, &f)?;
            let t = string(o, "type", &f)?;
            let key_size = int(o, "key_size", &f, 1, MAX_KEY_SIZE)?;
            let priority = match o.get("priority") {
                None => 1,
                Some(_) => int(o, "priority", &f, 0, 2)?,
            };
            if t != "luks2" {
                other_keyslots.insert(n, t.to_string());
                continue;
            }
            let af = obj(member(o, "af", &f)?, &format!("{f}.af"))?;
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
            let area = obj(member(o, "area", &f)?, &fa)?;
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
            areas.push((area_offset, area_offset + area_size, n));
            let (kdf, salt) = parse_kdf(
                obj(member(o, "kdf", &f)?, &format!("{f}.kdf"))?,
                &format!("{f}.kdf"),
            )?;
            keyslots.insert(
                n,
                Keyslot {
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
                },
            );
        }
        areas.sort_unstable();
        for w in areas.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(LuksError::field(
                    format!("keyslots.{}.area.offset", w[1].2),
                    w[1].0,
                    format!("overlaps the area of keyslot {}", w[0].2),
                ));
            }
        }

        let mut segments = BTreeMap::new();
        for (k, v) in obj(member(top, "segments", "json")?, "segments")? {
            let n = id(k, "segments", 1024)?;
            let f = format!("segments.{k}");
            let o = obj(v, &f)?;
            let kind = string(o, "type", &f)?.to_string();
            let offset = u64str(o, "offset", &f)?;
            if offset % 512 != 0 {
                return Err(LuksError::field(
                    format!("{f}.offset"),
                    offset,
                    "must be a multiple of 512",
                ));
            }
            let size_s = string(o, "size", &f)?;
            let size = if size_s == "dynamic" {
                None
            } else {
                let s = u64str(o, "size", &f)?;
                if s == 0 || s % 512 != 0 {
                    return Err(LuksError::field(
                        format!("{f}.size"),
                        s,
                        "must be non-zero and a multiple of 512",
                    ));
                }
                if offset.checked_add(s).is_none() {
                    return Err(LuksError::field(
                        format!("{f}.size"),
                        s,
                        "offset + size overflows",
                    ));
                }
                Some(s)
            };
            let flags = strings(o, "flags", &f)?;
            let mut seg = Segment {
                kind: kind.clone(),
                offset,
                size,
                iv_tweak: 0,
                encryption: String::new(),
                sector_size: 512,
                integrity: false,
                flags,
            };
            if kind == "crypt" {
                seg.iv_tweak = u64str(o, "iv_tweak", &f)?;
                seg.encryption = string(o, "encryption", &f)?.to_string();
                if seg.encryption.is_empty() || seg.encryption.len() > 128 {
                    return Err(LuksError::field(
                        format!("{f}.encryption"),
                        &seg.encryption,
                        "invalid cipher spec",
                    ));
                }
                seg.sector_size = int(o, "sector_size", &f, 512, 4096)?;
                if !seg.sector_size.is_power_of_two() {
                    return Err(LuksError::field(
                        format!("{f}.sector_size"),
                        seg.sector_size,
                        "must be 512, 1024, 2048 or 4096",
                    ));
                }
                if let Some(s) = size {
                    if s % u64::from(seg.sector_size) != 0 {
                        return Err(LuksError::field(
                            format!("{f}.size"),
                            s,
                            "not a multiple of sector_size",
                        ));
                    }
                }
                if let Some(i) = o.get("integrity") {
                    obj(i, &format!("{f}.integrity"))?;
                    seg.integrity = true;
                }
            }
            segments.insert(n, seg);
        }
        for (i, n) in segments.keys().enumerate() {
            if *n as usize != i {
                return Err(LuksError::field(
                    "segments",
                    n,
                    "segment numbers must be 0..N-1 without gaps",
                ));
            }
        }
        let regular: Vec<(&u32, &Segment)> =
            segments.iter().filter(|(_, s)| !s.is_backup()).collect();
        let mut seen_backup = false;
        for (n, s) in &segments {
            if s.is_backup() {
                seen_backup = true;
            } else if seen_backup {
                return Err(LuksError::field(
                    format!("segments.{n}"),
                    "",
                    "regular segment after a backup segment",
                ));
            }
        }
        for (i, (n, s)) in regular.iter().enumerate() {
            if s.size.is_none() && i + 1 != regular.len() {
                return Err(LuksError::field(
                    format!("segments.{n}.size"),
                    "dynamic",
                    "only the last segment may be dynamic",
                ));
            }
            if s.offset != 0 && s.offset < areas_end {
                return Err(LuksError::field(
                    format!("segments.{n}.offset"),
                    s.offset,
                    format!("overlaps the header and keyslots area (ends at {areas_end})"),
                ));
            }
            if let (Some(sz), Some((_, next))) = (s.size, regular.get(i + 1)) {
                if s.offset + sz > next.offset && next.offset + next.size.unwrap_or(1) > s.offset {
                    return Err(LuksError::field(
                        format!("segments.{n}"),
                        s.offset,
                        "overlaps the next segment",
                    ));
                }
            }
        }

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
                if !keyslots.contains_key(k) && !other_keyslots.contains_key(k) {
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
                u64::from(super::kdf::MAX_PBKDF2_ITERATIONS),
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
        for (n, s) in &segments {
            if s.kind == "crypt"
                && !s.is_backup()
                && !digests.values().any(|d| d.segments.contains(n))
            {
                return Err(LuksError::field(
                    format!("segments.{n}"),
                    "crypt",
                    "not referenced by any digest",
                ));
            }
        }

        let mut tokens = BTreeMap::new();
        for (k, v) in obj(member(top, "tokens", "json")?, "tokens")? {
            let n = id(k, "tokens", MAX_TOKENS)?;
            let f = format!("tokens.{k}");
            let o = obj(v, &f)?;
            string(o, "type", &f)?;
            let ks = id_list(o, "keyslots", &f, MAX_KEYSLOTS)?;
            for k in &ks {
                if !keyslots.contains_key(k) && !other_keyslots.contains_key(k) {
                    return Err(LuksError::field(
                        format!("{f}.keyslots"),
                        k,
                        "names a keyslot that does not exist",
                    ));
                }
            }
            tokens.insert(n, ks);
        }
        Ok(Metadata {
            value,
            keyslots,
            other_keyslots,
            segments,
            digests,
            tokens,
            json_size,
            keyslots_size,
            flags,
            requirements,
        })
    }

    /// The digest that verifies keyslot `slot`.
    pub fn digest_of(&self, slot: u32) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.keyslots.contains(&slot))
            .map(|(n, d)| (*n, d))
    }

    /// The digest bound to segment 0 (the volume key's digest).
    pub fn segment_digest(&self) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.segments.contains(&0))
            .map(|(n, d)| (*n, d))
    }

    /// Serialized compact JSON, as written to disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.value).unwrap_or_default()
    }

    fn edit(
        &self,
        hdr_size: u64,
        f: impl FnOnce(&mut Map<String, Value>),
    ) -> Result<Metadata, LuksError> {
        let mut v = self.value.clone();
        if let Some(top) = v.as_object_mut() {
            f(top);
        }
        Metadata::parse(v, hdr_size)
    }

    /// A copy with keyslot `slot` added (JSON `ks`) and bound to digest `digest`.
    pub fn with_keyslot(
        &self,
        hdr_size: u64,
        slot: u32,
        ks: Value,
        digest: u32,
    ) -> Result<Metadata, LuksError> {
        self.edit(hdr_size, |top| {
            if let Some(k) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
                k.insert(slot.to_string(), ks);
            }
            if let Some(d) = top
                .get_mut("digests")
                .and_then(|d| d.get_mut(digest.to_string()))
                .and_then(|d| d.get_mut("keyslots"))
                .and_then(Value::as_array_mut)
            {
                d.push(Value::String(slot.to_string()));
            }
        })
    }

    /// A copy without keyslot `slot`; digests and tokens forget it.
    pub fn without_keyslot(&self, hdr_size: u64, slot: u32) -> Result<Metadata, LuksError> {
        let name = slot.to_string();
        self.edit(hdr_size, |top| {
            if let Some(k) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
                k.shift_remove(&name);
            }
            for group in ["digests", "tokens"] {
                if let Some(g) = top.get_mut(group).and_then(Value::as_object_mut) {
                    for (_, item) in g.iter_mut() {
                        if let Some(a) = item.get_mut("keyslots").and_then(Value::as_array_mut) {
                            a.retain(|e| e.as_str() != Some(name.as_str()));
                        }
                    }
                }
            }
        })
    }
}

/// Standard Base64, as LUKS2 stores salts and digests.
pub fn b64_encode(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SAMPLE: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2id","time":4,"memory":32,"cpus":2,"salt":"PEarZfwhTheIXVpDvG9/LgUMs3bMl1H+ajBr/VK1gzU="}}},"tokens":{"0":{"type":"x-custom","keyslots":["0"],"blob":[1,2,{"a":"b"}]}},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"mxdsHl91bo2bWk+0LefFORWFpf8hPru/W5AU+1yIg0U=","digest":"/GHRIADrlACARFvCmFXmVkzeRsG7WldFSilghEbhAEY="}},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;

    fn parse(s: &str) -> Result<Metadata, LuksError> {
        Metadata::parse(serde_json::from_str(s).unwrap(), 16384)
    }

    #[test]
    fn parses_cryptsetup_metadata_and_round_trips_bytes() {
        let m = parse(SAMPLE).unwrap();
        assert_eq!(m.keyslots[&0].area_offset, 32768);
        assert_eq!(m.segments[&0].sector_size, 4096);
        assert_eq!(m.segments[&0].size, None);
        assert_eq!(m.to_bytes(), SAMPLE.as_bytes());
    }

    #[test]
    fn edits_keep_tokens_and_order() {
        let m = parse(SAMPLE).unwrap();
        let ks = m.value["keyslots"]["0"].clone();
        let mut ks1 = ks.clone();
        ks1["area"]["offset"] = Value::String("290816".into());
        let m2 = m.with_keyslot(16384, 1, ks1, 0).unwrap();
        assert_eq!(m2.digests[&0].keyslots, vec![0, 1]);
        let m3 = m2.without_keyslot(16384, 0).unwrap();
        assert_eq!(m3.tokens[&0], Vec::<u32>::new());
        assert_eq!(
            m3.value["tokens"]["0"]["blob"],
            m.value["tokens"]["0"]["blob"]
        );
        let back = m3.without_keyslot(16384, 1).unwrap();
        assert!(back.keyslots.is_empty());
    }

    #[test]
    fn rejects_named_fields() {
        let cases = [
            (
                SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":\"-1\""),
                "keyslots.0.area.offset",
            ),
            (
                SAMPLE.replace(
                    "\"offset\":\"32768\"",
                    "\"offset\":\"18446744073709551616\"",
                ),
                "keyslots.0.area.offset",
            ),
            (
                SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":\"16600000\""),
                "keyslots.0.area.offset",
            ),
            (
                SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":32768"),
                "keyslots.0.area.offset",
            ),
            (
                SAMPLE.replace("\"memory\":32", "\"memory\":99999999"),
                "keyslots.0.kdf.memory",
            ),
            (
                SAMPLE.replace("\"stripes\":4000", "\"stripes\":1"),
                "keyslots.0.af.stripes",
            ),
            (
                SAMPLE.replace("\"json_size\":\"12288\"", "\"json_size\":\"4096\""),
                "config.json_size",
            ),
            (
                SAMPLE.replace("\"sector_size\":4096", "\"sector_size\":3000"),
                "segments.0.sector_size",
            ),
            (
                SAMPLE.replace("\"offset\":\"16777216\"", "\"offset\":\"4096\""),
                "segments.0.offset",
            ),
            (
                SAMPLE.replace(
                    "\"keyslots\":[\"0\"],\"segments\"",
                    "\"keyslots\":[\"7\"],\"segments\"",
                ),
                "digests.0.keyslots",
            ),
            (
                SAMPLE.replace(
                    "\"hash\":\"sha256\",\"iterations\"",
                    "\"hash\":\"md4\",\"iterations\"",
                ),
                "digests.0.hash",
            ),
            (
                SAMPLE.replace("\"0\":{\"type\":\"crypt\"", "\"1\":{\"type\":\"crypt\""),
                "segments",
            ),
        ];
        for (json, field) in cases {
            let e = parse(&json).unwrap_err().to_string();
            assert!(e.contains(field), "expected {field}: {e}");
        }
    }

    #[test]
    fn overlapping_areas_rejected() {
        let m = parse(SAMPLE).unwrap();
        let ks = m.value["keyslots"]["0"].clone();
        let e = m.with_keyslot(16384, 1, ks, 0).unwrap_err().to_string();
        assert!(e.contains("overlaps"), "{e}");
    }
}
