//! The structural rules a LUKS2 JSON area must pass before anything reads
//! it, as cryptsetup's `LUKS2_hdr_validate` checks them, in its order:
//! requirements, tokens, digests, segments, keyslots, config, keyslot
//! areas, the JSON's size, then each `luks2` keyslot's members and its one
//! digest. Only these make a header unreadable; a value udm cannot use
//! (an unknown KDF, an odd stripe count) fails later, when the keyslot or
//! segment it belongs to is used, as in cryptsetup, so such a header still
//! dumps, and its other keyslots still open.
//!
//! [`repair`] is cryptsetup's in-memory fix of a known glitch (KDF members
//! left behind by a KDF change in cryptsetup before 2.0.3), applied when
//! the first validation fails; the fixed JSON reaches the disk only with
//! the next header write.

use super::fields::parse_u64str;
use crate::luks::error::LuksError;
use serde_json::{Map, Value};

type Obj = Map<String, Value>;

fn bad(field: impl Into<String>, value: impl std::fmt::Display, why: &str) -> LuksError {
    LuksError::field(field, value, why)
}

/// cryptsetup's "numbered": only ASCII digits (the empty string too).
fn numbered(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

fn object<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a Obj, LuksError> {
    let v = o.get(key);
    v.and_then(Value::as_object).ok_or_else(|| {
        bad(
            join(path, key),
            v.map_or("(missing)".into(), Value::to_string),
            "must be a JSON object",
        )
    })
}

fn array<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a Vec<Value>, LuksError> {
    let v = o.get(key);
    v.and_then(Value::as_array).ok_or_else(|| {
        bad(
            join(path, key),
            v.map_or("(missing)".into(), Value::to_string),
            "must be a JSON array",
        )
    })
}

/// A member that must be a non-empty string.
fn string<'a>(o: &'a Obj, key: &str, path: &str) -> Result<&'a str, LuksError> {
    let v = o.get(key);
    match v.and_then(Value::as_str) {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(bad(
            join(path, key),
            v.map_or("(missing)".into(), Value::to_string),
            "must be a non-empty string",
        )),
    }
}

/// A member that must be a JSON integer.
fn integer(o: &Obj, key: &str, path: &str) -> Result<i128, LuksError> {
    let v = o.get(key);
    let n = v.and_then(|v| {
        v.as_i64()
            .map(i128::from)
            .or_else(|| v.as_u64().map(i128::from))
    });
    n.ok_or_else(|| {
        bad(
            join(path, key),
            v.map_or("(missing)".into(), Value::to_string),
            "must be an integer",
        )
    })
}

/// A member that must be a decimal string of an unsigned 64-bit number.
fn u64_string(o: &Obj, key: &str, path: &str) -> Result<u64, LuksError> {
    let s = string(o, key, path)?;
    parse_u64str(s).filter(|_| numbered(s)).ok_or_else(|| {
        bad(
            join(path, key),
            s,
            "must be a decimal string of an unsigned 64-bit number",
        )
    })
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Every entry of `arr` a string naming a member of `target`.
fn references(arr: &[Value], target: &Obj, path: &str, what: &str) -> Result<(), LuksError> {
    for e in arr {
        let Some(s) = e.as_str() else {
            return Err(bad(path, e, "entries must be strings"));
        };
        if !target.get(s).is_some_and(Value::is_object) {
            return Err(bad(path, s, &format!("names a {what} that does not exist")));
        }
    }
    Ok(())
}

fn numbered_keys(o: &Obj, path: &str) -> Result<(), LuksError> {
    match o.keys().find(|k| !numbered(k)) {
        Some(k) => Err(bad(path, k, "member names must be decimal numbers")),
        None => Ok(()),
    }
}

fn requirements(top: &Obj) -> Result<(), LuksError> {
    let config = object(top, "config", "")?;
    let Some(r) = config.get("requirements") else {
        return Ok(());
    };
    let r = r
        .as_object()
        .ok_or_else(|| bad("config.requirements", r, "must be a JSON object"))?;
    if r.get("mandatory").is_none() {
        return Ok(());
    }
    let mut online = 0;
    for e in array(r, "mandatory", "config.requirements")? {
        let s = e.as_str().ok_or_else(|| {
            bad(
                "config.requirements.mandatory",
                e,
                "entries must be strings",
            )
        })?;
        let v = s.strip_prefix("online-reencrypt");
        if v.is_some_and(|v| {
            v.is_empty()
                || v.strip_prefix("-v")
                    .is_some_and(|n| !n.is_empty() && numbered(n))
        }) {
            online += 1;
        }
    }
    if online > 1 {
        return Err(bad(
            "config.requirements.mandatory",
            online,
            "more than one online reencryption requirement",
        ));
    }
    Ok(())
}

fn tokens(top: &Obj) -> Result<(), LuksError> {
    let tokens = object(top, "tokens", "")?;
    numbered_keys(tokens, "tokens")?;
    let keyslots = object(top, "keyslots", "")?;
    for (k, t) in tokens {
        let p = format!("tokens.{k}");
        let t = t
            .as_object()
            .ok_or_else(|| bad(&p, t, "must be a JSON object"))?;
        string(t, "type", &p)?;
        references(
            array(t, "keyslots", &p)?,
            keyslots,
            &format!("{p}.keyslots"),
            "keyslot",
        )?;
    }
    Ok(())
}

fn digests(top: &Obj) -> Result<(), LuksError> {
    let digests = object(top, "digests", "")?;
    let keyslots = object(top, "keyslots", "")?;
    let segments = object(top, "segments", "")?;
    numbered_keys(digests, "digests")?;
    for (k, d) in digests {
        let p = format!("digests.{k}");
        let d = d
            .as_object()
            .ok_or_else(|| bad(&p, d, "must be a JSON object"))?;
        string(d, "type", &p)?;
        let ks = array(d, "keyslots", &p)?;
        let segs = array(d, "segments", &p)?;
        references(ks, keyslots, &format!("{p}.keyslots"), "keyslot")?;
        references(segs, segments, &format!("{p}.segments"), "segment")?;
    }
    Ok(())
}

fn is_backup(seg: &Obj) -> bool {
    seg.get("flags").and_then(Value::as_array).is_some_and(|f| {
        f.iter()
            .any(|x| x.as_str().is_some_and(|s| s.starts_with("backup-")))
    })
}

/// One segment's members: (offset, size; 0 for "dynamic").
fn segment(seg: &Obj, p: &str, top: &Obj) -> Result<(u64, u64), LuksError> {
    let kind = string(seg, "type", p)?;
    let offset = u64_string(seg, "offset", p)?;
    let size = match string(seg, "size", p)? {
        "dynamic" => 0,
        _ => match u64_string(seg, "size", p)? {
            0 => return Err(bad(join(p, "size"), 0, "must not be 0")),
            n => n,
        },
    };
    if offset % 512 != 0 {
        return Err(bad(join(p, "offset"), offset, "must be a multiple of 512"));
    }
    if size % 512 != 0 {
        return Err(bad(join(p, "size"), size, "must be a multiple of 512"));
    }
    if seg.contains_key("flags") {
        if let Some(f) = array(seg, "flags", p)?.iter().find(|f| !f.is_string()) {
            return Err(bad(join(p, "flags"), f, "entries must be strings"));
        }
    }
    if kind == "crypt" {
        crypt_segment(seg, p, size, top)?;
    }
    Ok((offset, size))
}

fn crypt_segment(seg: &Obj, p: &str, size: u64, top: &Obj) -> Result<(), LuksError> {
    u64_string(seg, "iv_tweak", p)?;
    string(seg, "encryption", p)?;
    let sector = integer(seg, "sector_size", p)?;
    if let Some(i) = seg.get("integrity") {
        let ip = join(p, "integrity");
        let i = i
            .as_object()
            .ok_or_else(|| bad(&ip, i, "must be a JSON object"))?;
        for m in ["type", "journal_encryption", "journal_integrity"] {
            string(i, m, &ip)?;
        }
    }
    if sector <= 0 || sector > i128::from(u32::MAX) || sector % 512 != 0 {
        return Err(bad(
            join(p, "sector_size"),
            sector,
            "must be a non-zero multiple of 512",
        ));
    }
    if size % sector as u64 != 0 {
        return Err(bad(
            join(p, "size"),
            size,
            "must be a multiple of sector_size",
        ));
    }
    let name = p.trim_start_matches("segments.");
    let digests = object(top, "digests", "")?;
    let bound = digests.values().any(|d| {
        d.get("segments")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|s| s.as_str() == Some(name)))
    });
    if !bound {
        return Err(bad(p, "crypt", "not assigned to any key digest"));
    }
    Ok(())
}

fn segments(top: &Obj) -> Result<(), LuksError> {
    let segs = object(top, "segments", "")?;
    if segs.is_empty() {
        return Err(bad("segments", "{}", "no segment"));
    }
    numbered_keys(segs, "segments")?;
    let mut first_backup: Option<u64> = None;
    for (k, s) in segs {
        let p = format!("segments.{k}");
        let s = s
            .as_object()
            .ok_or_else(|| bad(&p, s, "must be a JSON object"))?;
        segment(s, &p, top)?;
        let i = parse_u64str(k).unwrap_or(u64::MAX);
        if is_backup(s) {
            first_backup = Some(first_backup.map_or(i, |f| f.min(i)));
        } else if first_backup.is_some_and(|f| i >= f) {
            return Err(bad(&p, k, "regular segment behind a backup segment"));
        }
    }
    let count = segs.len() as u64;
    let regular = match first_backup {
        Some(0) => return Err(bad("segments", "", "no regular segment")),
        Some(f) if f >= count => return Err(bad("segments", f, "gap before the backup segments")),
        Some(f) => f,
        None => count,
    };
    let get = |i: u64| {
        segs.get(&i.to_string())
            .and_then(Value::as_object)
            .ok_or_else(|| bad("segments", i, "segment numbers must be 0..N-1 without gaps"))
    };
    let mut iv = Vec::new();
    for i in 0..regular {
        let s = get(i)?;
        let off = s
            .get("offset")
            .and_then(Value::as_str)
            .and_then(parse_u64str)
            .unwrap_or(0);
        let len = s
            .get("size")
            .and_then(Value::as_str)
            .and_then(parse_u64str)
            .unwrap_or(0);
        iv.push((off, if len == 0 { u64::MAX } else { len }));
    }
    for i in regular..count {
        get(i)?;
    }
    segment_intervals(&iv)
}

/// Regular segments: only the last may be dynamic, none may overlap.
fn segment_intervals(iv: &[(u64, u64)]) -> Result<(), LuksError> {
    for (i, &(off, len)) in iv.iter().enumerate() {
        if len == u64::MAX && i + 1 != iv.len() {
            return Err(bad(
                format!("segments.{i}.size"),
                "dynamic",
                "only the last segment may be dynamic",
            ));
        }
        for (j, &(o2, l2)) in iv.iter().enumerate().filter(|(j, _)| *j != i) {
            if l2 != u64::MAX && o2.checked_add(l2).is_none() {
                return Err(bad(
                    format!("segments.{j}.size"),
                    l2,
                    "offset + size overflows",
                ));
            }
            if off >= o2 && (l2 == u64::MAX || off < o2 + l2) {
                return Err(bad(
                    format!("segments.{i}"),
                    off,
                    &format!("overlaps segments.{j}"),
                ));
            }
        }
    }
    Ok(())
}

fn keyslots(top: &Obj) -> Result<(), LuksError> {
    let ks = object(top, "keyslots", "")?;
    numbered_keys(ks, "keyslots")?;
    for (k, v) in ks {
        let p = format!("keyslots.{k}");
        let o = v
            .as_object()
            .ok_or_else(|| bad(&p, v, "must be a JSON object"))?;
        string(o, "type", &p)?;
        let n = integer(o, "key_size", &p)?;
        if !(0..=i128::from(u32::MAX)).contains(&n) {
            return Err(bad(join(&p, "key_size"), n, "must fit in 32 bits"));
        }
    }
    Ok(())
}

/// Allowed sizes of one metadata copy (binary header + JSON area).
fn metadata_size_ok(n: u64) -> bool {
    (14..=22).any(|s| n == 1 << s)
}

fn config(top: &Obj) -> Result<(u64, u64), LuksError> {
    let c = object(top, "config", "")?;
    let json_size = u64_string(c, "json_size", "config")?;
    let keyslots_size = u64_string(c, "keyslots_size", "config")?;
    let metadata = json_size.saturating_add(4096);
    if !metadata_size_ok(metadata) {
        return Err(bad(
            "config.json_size",
            json_size,
            "header size (json_size + 4096) must be 16 KiB..4 MiB, a power of two",
        ));
    }
    if keyslots_size % 4096 != 0 || keyslots_size > super::MAX_KEYSLOTS_SIZE {
        return Err(bad(
            "config.keyslots_size",
            keyslots_size,
            "must be a multiple of 4096 and at most 128 MiB",
        ));
    }
    let segs = object(top, "segments", "")?;
    let data = segs
        .iter()
        .filter_map(|(k, s)| s.as_object().map(|s| (k, s)))
        .filter(|(_, s)| !is_backup(s))
        .map(|(k, s)| {
            let off = s
                .get("offset")
                .and_then(Value::as_str)
                .and_then(parse_u64str);
            (k, off.unwrap_or(0))
        })
        .min_by_key(|&(_, o)| o);
    if let Some((k, off)) = data.filter(|&(_, o)| o != 0) {
        if off < keyslots_size || off - keyslots_size < 2 * metadata {
            return Err(bad(
                "config.keyslots_size",
                keyslots_size,
                &format!("does not fit between the two header copies and the data (segments.{k}.offset = {off})"),
            ));
        }
    }
    if c.contains_key("flags") {
        if let Some(f) = array(c, "flags", "config")?.iter().find(|f| !f.is_string()) {
            return Err(bad("config.flags", f, "entries must be strings"));
        }
    }
    Ok((metadata, keyslots_size))
}

/// Keyslot areas: past both header copies, inside the keyslots area, not
/// empty, not overlapping.
fn areas(top: &Obj, metadata: u64, keyslots_size: u64) -> Result<(), LuksError> {
    let end = 2 * metadata + keyslots_size;
    let mut iv = Vec::new();
    for (k, v) in object(top, "keyslots", "")? {
        let p = format!("keyslots.{k}");
        let o = v
            .as_object()
            .ok_or_else(|| bad(&p, v, "must be a JSON object"))?;
        let ap = join(&p, "area");
        let a = object(o, "area", &p)?;
        string(a, "type", &ap)?;
        let off = u64_string(a, "offset", &ap)?;
        let len = u64_string(a, "size", &ap)?;
        iv.push((k, off, len));
    }
    for (i, &(k, off, len)) in iv.iter().enumerate() {
        let p = format!("keyslots.{k}.area");
        if off < 2 * metadata {
            return Err(bad(
                join(&p, "offset"),
                off,
                "lies inside the header copies",
            ));
        }
        if len == 0 {
            return Err(bad(join(&p, "size"), 0, "must not be 0"));
        }
        let Some(e) = off.checked_add(len) else {
            return Err(bad(join(&p, "size"), len, "offset + size overflows"));
        };
        if e > end {
            return Err(bad(
                join(&p, "offset"),
                format!("{off}+{len}"),
                &format!("area overflows the keyslots area (ends at {end})"),
            ));
        }
        for &(k2, o2, l2) in iv
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, x)| x)
        {
            let e2 = o2.saturating_add(l2);
            if off >= o2 && off < e2 {
                return Err(bad(
                    join(&p, "offset"),
                    off,
                    &format!("overlaps the area of keyslot {k2} (keyslot {k} ends at {e})"),
                ));
            }
        }
    }
    Ok(())
}

/// The members a `luks2` keyslot's type demands (its KDF's own members
/// only for the KDFs cryptsetup knows), and exactly one digest.
fn luks2_keyslot(o: &Obj, p: &str, k: &str, top: &Obj) -> Result<(), LuksError> {
    let kdf = object(o, "kdf", p)?;
    let af = object(o, "af", p)?;
    let area = object(o, "area", p)?;
    let kp = join(p, "kdf");
    let t = string(kdf, "type", &kp)?;
    let need: &[&str] = match t {
        "pbkdf2" => &["type", "salt", "hash", "iterations"],
        "argon2i" | "argon2id" => &["type", "salt", "time", "memory", "cpus"],
        _ => &[],
    };
    if !need.is_empty() {
        if kdf.len() != need.len() {
            return Err(bad(
                &kp,
                kdf.len(),
                &format!("a {t} KDF has exactly the members {need:?}"),
            ));
        }
        for m in need {
            match *m {
                "type" | "salt" | "hash" => drop(string(kdf, m, &kp)?),
                _ => drop(integer(kdf, m, &kp)?),
            }
        }
    }
    let ap = join(p, "af");
    if string(af, "type", &ap)? != "luks1" {
        return Err(bad(
            join(&ap, "type"),
            &af["type"],
            "only \"luks1\" is known",
        ));
    }
    string(af, "hash", &ap)?;
    integer(af, "stripes", &ap)?;
    let rp = join(p, "area");
    if string(area, "type", &rp)? != "raw" {
        return Err(bad(
            join(&rp, "type"),
            &area["type"],
            "only \"raw\" is known",
        ));
    }
    string(area, "encryption", &rp)?;
    integer(area, "key_size", &rp)?;
    string(area, "offset", &rp)?;
    string(area, "size", &rp)?;
    let refs = object(top, "digests", "")?
        .values()
        .filter(|d| {
            d.get("keyslots")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|e| e.as_str() == Some(k)))
        })
        .count();
    if refs != 1 {
        return Err(bad(p, refs, "must be assigned to exactly one digest"));
    }
    Ok(())
}

/// Keyslot types: `luks2` members, and at most one `reencrypt` keyslot,
/// which needs a reencryption requirement.
fn keyslot_types(top: &Obj) -> Result<(), LuksError> {
    let mut reencrypt = 0;
    for (k, v) in object(top, "keyslots", "")? {
        let p = format!("keyslots.{k}");
        let o = v
            .as_object()
            .ok_or_else(|| bad(&p, v, "must be a JSON object"))?;
        match o.get("type").and_then(Value::as_str) {
            Some("luks2") => luks2_keyslot(o, &p, k, top)?,
            Some("reencrypt") => reencrypt += 1,
            _ => {}
        }
    }
    if reencrypt > 1 {
        return Err(bad(
            "keyslots",
            reencrypt,
            "more than one reencrypt keyslot",
        ));
    }
    Ok(())
}

/// `LUKS2_hdr_validate` over `v` for a JSON area of `json_area` bytes.
pub fn validate(v: &Value, json_area: u64) -> Result<(), LuksError> {
    let top = v
        .as_object()
        .ok_or_else(|| bad("json", "(not an object)", "must be a JSON object"))?;
    requirements(top)?;
    tokens(top)?;
    digests(top)?;
    segments(top)?;
    keyslots(top)?;
    let (metadata, keyslots_size) = config(top)?;
    areas(top, metadata, keyslots_size)?;
    let json_size = metadata - 4096;
    if json_size != json_area {
        return Err(bad(
            "config.json_size",
            json_size,
            &format!("does not match the binary header's JSON area ({json_area} bytes)"),
        ));
    }
    let len = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
    if len as u64 > json_size {
        return Err(bad("json", len, "does not fit the JSON area"));
    }
    keyslot_types(top)
}

/// cryptsetup's repair: a `luks2` keyslot's KDF keeps only its type's members.
pub fn repair(v: &mut Value) {
    let Some(ks) = v.get_mut("keyslots").and_then(Value::as_object_mut) else {
        return;
    };
    for k in ks.values_mut() {
        if k.get("type").and_then(Value::as_str) != Some("luks2") {
            continue;
        }
        let Some(kdf) = k.get_mut("kdf").and_then(Value::as_object_mut) else {
            continue;
        };
        let keep: &[&str] = match kdf.get("type").and_then(Value::as_str) {
            Some("pbkdf2") => &["type", "salt", "hash", "iterations"],
            Some("argon2i" | "argon2id") => &["type", "salt", "time", "memory", "cpus"],
            _ => continue,
        };
        kdf.retain(|m, _| keep.contains(&m.as_str()));
    }
}

/// [`validate`], and on failure [`repair`] and validate again: the JSON
/// to use, or the first failure's error.
pub fn validate_or_repair(v: Value, json_area: u64) -> Result<Value, LuksError> {
    match validate(&v, json_area) {
        Ok(()) => Ok(v),
        Err(e) => {
            let mut fixed = v;
            repair(&mut fixed);
            validate(&fixed, json_area).map_err(|_| e)?;
            Ok(fixed)
        }
    }
}
