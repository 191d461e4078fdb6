//! The reencryption "verification" digest. cryptsetup (from 2.4.3,
//! metadata version 2) refuses to resume a reencryption unless a pbkdf2
//! digest bound to the `reencrypt` keyslot matches a byte string made of
//! the volume keys and the reencryption parameters: an attacker who can
//! write the header but does not know the keys cannot redirect the
//! operation (say, mark the device decrypted so the next step writes
//! plaintext). The string, byte for byte:
//!
//! `0x76, 0x30 + version`, the old volume key (if any), the new volume key
//! (if any and different), then the keyslot — `mode`, `direction`,
//! `area.type`, `area.offset`, `area.size` and, by type, `area.hash` +
//! `area.sector_size` (checksum) or `area.shift_size` (datashift) — then
//! the `backup-previous`, `backup-final` and (if present)
//! `backup-moved-segment` segments: `type`, `offset`, `size` and, for
//! crypt, `iv_tweak`, `encryption`, `sector_size`. Strings go in as their
//! bytes (at most 64), decimal-string numbers as big-endian u64 (a
//! "dynamic" size as the word itself), JSON integers as big-endian u32.

use serde_json::{json, Map, Value};

use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use crate::luks::json::{b64_encode, parse_u64str};
use crate::luks::keyslot::{ct_eq, key_digest, random};
use zeroize::Zeroizing;

fn bad(what: &str) -> LuksError {
    LuksError::field(what, "", "cannot serialise for the reencryption digest")
}

fn put_str(out: &mut Vec<u8>, o: &Map<String, Value>, k: &str) -> Result<(), LuksError> {
    let s = o.get(k).and_then(Value::as_str).ok_or_else(|| bad(k))?;
    if s.is_empty() || s.len() > 64 {
        return Err(bad(k));
    }
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_u64(
    out: &mut Vec<u8>,
    o: &Map<String, Value>,
    k: &str,
    dynamic: bool,
) -> Result<(), LuksError> {
    let s = o.get(k).and_then(Value::as_str).ok_or_else(|| bad(k))?;
    if dynamic && s == "dynamic" {
        out.extend_from_slice(b"dynamic");
        return Ok(());
    }
    let n = parse_u64str(s).ok_or_else(|| bad(k))?;
    out.extend_from_slice(&n.to_be_bytes());
    Ok(())
}

fn put_u32(out: &mut Vec<u8>, o: &Map<String, Value>, k: &str) -> Result<(), LuksError> {
    let n = o
        .get(k)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(k))?;
    out.extend_from_slice(&n.to_be_bytes());
    Ok(())
}

fn put_segment(out: &mut Vec<u8>, s: &Value) -> Result<(), LuksError> {
    let o = s.as_object().ok_or_else(|| bad("segment"))?;
    put_str(out, o, "type")?;
    put_u64(out, o, "offset", false)?;
    put_u64(out, o, "size", true)?;
    match o.get("type").and_then(Value::as_str) {
        Some("crypt") => {
            put_u64(out, o, "iv_tweak", false)?;
            put_str(out, o, "encryption")?;
            put_u32(out, o, "sector_size")
        }
        Some("linear") => Ok(()),
        _ => Err(bad("segment type")),
    }
}

fn flagged<'a>(segs: &'a Map<String, Value>, flag: &str) -> Option<&'a Value> {
    segs.values().find(|s| {
        s["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == flag))
    })
}

/// The byte string the digest covers (secret: it holds the keys).
pub fn data(
    top: &Value,
    slot: u32,
    version: u8,
    key_old: Option<&[u8]>,
    key_new: Option<&[u8]>,
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let ks = top["keyslots"][slot.to_string()]
        .as_object()
        .ok_or_else(|| bad("reencrypt keyslot"))?;
    let area = ks
        .get("area")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("area"))?;
    let segs = top["segments"].as_object().ok_or_else(|| bad("segments"))?;
    let mut out = Zeroizing::new(Vec::with_capacity(1024));
    out.push(0x76);
    out.push(0x30 + version);
    if let Some(k) = key_old {
        out.extend_from_slice(k);
    }
    if let Some(k) = key_new {
        out.extend_from_slice(k);
    }
    put_str(&mut out, ks, "mode")?;
    put_str(&mut out, ks, "direction")?;
    put_str(&mut out, area, "type")?;
    put_u64(&mut out, area, "offset", false)?;
    put_u64(&mut out, area, "size", false)?;
    match area.get("type").and_then(Value::as_str) {
        Some("checksum") => {
            put_str(&mut out, area, "hash")?;
            put_u32(&mut out, area, "sector_size")?;
        }
        Some("datashift-checksum") => {
            put_str(&mut out, area, "hash")?;
            put_u32(&mut out, area, "sector_size")?;
            put_u64(&mut out, area, "shift_size", false)?;
        }
        Some("datashift") | Some("datashift-journal") => {
            put_u64(&mut out, area, "shift_size", false)?;
        }
        _ => {}
    }
    for flag in ["backup-previous", "backup-final"] {
        put_segment(&mut out, flagged(segs, flag).ok_or_else(|| bad(flag))?)?;
    }
    if let Some(m) = flagged(segs, "backup-moved-segment") {
        put_segment(&mut out, m)?;
    }
    Ok(out)
}

/// Iterations of the digest udm writes: the string holds full volume
/// keys, so no guessing can be slowed further; cryptsetup's minimum.
pub const ITERATIONS: u32 = 1000;

/// A new pbkdf2 digest object over `data`.
pub fn create(data: &[u8], slot: u32) -> Result<Value, LuksError> {
    let salt = random(32)?;
    let hash = HashAlg::Sha256;
    let d = key_digest(hash, data, &salt, ITERATIONS, hash.digest_len());
    Ok(json!({
        "type": "pbkdf2",
        "keyslots": [slot.to_string()],
        "segments": [],
        "hash": hash.name(),
        "iterations": ITERATIONS,
        "salt": b64_encode(&salt),
        "digest": b64_encode(&d),
    }))
}

/// Check `data` against the digest bound to the reencrypt keyslot.
pub fn check(meta: &crate::luks::json::Metadata, slot: u32, data: &[u8]) -> Result<(), LuksError> {
    let d = meta
        .digest_of(slot)
        .map(|(_, d)| d)
        .ok_or_else(|| LuksError::Usage("Reencryption metadata is invalid.".into()))?;
    let got = key_digest(d.hash, data, &d.salt, d.iterations, d.digest.len());
    if ct_eq(&got, &d.digest) {
        Ok(())
    } else {
        Err(LuksError::Usage("Reencryption metadata is invalid.".into()))
    }
}
