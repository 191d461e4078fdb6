//! Starting a reencryption: the header edits cryptsetup makes, in its
//! member order, in one header write (after any new key material is on
//! disk): a keyslot for the new volume key and its digest (re-key), the
//! `backup-previous` and `backup-final` segments, the `reencrypt`
//! keyslot (area = the largest free gap of the keyslots area), its
//! verification digest, and the `online-reencrypt-v2` requirement that
//! keeps older tools away. No data moves here.

use serde_json::{json, Map, Value};

use super::keys::Key;
use super::segments::with_flag;
use super::state::{Direction, Mode, Moved, Resilience};
use super::verify;
use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use crate::luks::json::{b64_encode, parse_u64str, Metadata, Segment, MAX_KEYSLOTS};
use crate::luks::keyslot::{self, SlotParams};
use crate::luks::luks2::Luks2;
use crate::luks::volume::Volume;

/// What to start.
#[derive(Clone, Debug)]
pub struct InitParams {
    pub mode: Mode,
    /// `--resilience` (cryptsetup's default: checksum).
    pub resilience: String,
    /// `--resilience-hash` (sha256).
    pub hash: String,
    /// New cipher spec (re-key: None keeps the old one).
    pub cipher: Option<String>,
    /// New volume key size in bytes (None: keep / cipher's default).
    pub key_bytes: Option<usize>,
    /// New encryption sector size (None: keep).
    pub sector_size: Option<u32>,
    /// Only this keyslot gets a keyslot for the new key (`--key-slot`).
    pub key_slot: Option<u32>,
    /// Encryption with data shift: the shift in bytes (half of
    /// `--reduce-device-size`; also the data offset of the fresh header).
    /// The plaintext's first `shift` bytes must already be copied to the
    /// last `shift` bytes of the device.
    pub shift: Option<u64>,
    /// Decryption with data shift (a volume whose header is on the
    /// device, now read from its detached copy): the data moves back to
    /// byte 0. The first hotzone's ciphertext is copied to byte 0 here.
    pub move_first: bool,
    /// `--hotzone-size`: with `move_first`, the moved segment's size
    /// (cryptsetup's default: the shift, at most 20 MiB).
    pub hotzone: Option<u64>,
    /// KDF and AF hash of the new volume key's keyslot(s), when the
    /// command line asks for them (`--pbkdf`, `--hash`, `--iter-time`,
    /// `--pbkdf-force-iterations`); None: the old keyslot's own, as
    /// cryptsetup copies them without a benchmark.
    pub kdf: Option<(crate::luks::kdf::Kdf, HashAlg)>,
    /// `--device-size`: checked against the data area here, as
    /// cryptsetup checks it before writing anything (the engine then
    /// moves only that much).
    pub device_size: Option<u64>,
    /// `--keep-key`: re-key to new segment parameters under the same
    /// volume key (`key_new` is the old key; no new keyslot or digest).
    pub keep_key: bool,
}

/// cryptsetup's default moved segment of a decryption with data shift.
const MOVED_DEFAULT: u64 = 20 << 20;

fn h2(vol: &mut Volume) -> Result<&mut Luks2, LuksError> {
    vol.header.luks2_mut().ok_or_else(|| {
        LuksError::Usage(
            "Reencryption of LUKS1 devices is not supported by udm; convert to LUKS2 first.".into(),
        )
    })
}

fn areas(top: &Value) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = top["keyslots"]
        .as_object()
        .map(|ks| {
            ks.values()
                .filter_map(|k| {
                    let a = &k["area"];
                    Some((
                        a["offset"].as_str().and_then(parse_u64str)?,
                        a["size"].as_str().and_then(parse_u64str)?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// cryptsetup's first fit for a new keyslot area.
fn first_fit(top: &Value, keyslots_size: u64, start: u64, size: u64) -> Option<u64> {
    let end = start + keyslots_size;
    let mut cand = start;
    for (o, l) in areas(top) {
        if cand.saturating_add(size) <= o {
            break;
        }
        cand = cand.max(o.saturating_add(l));
    }
    (cand.saturating_add(size) <= end).then_some(cand)
}

/// cryptsetup's largest gap (the first of equal ones).
fn max_gap(meta: &Metadata, start: u64) -> Option<(u64, u64)> {
    let end = start + meta.keyslots_size;
    let mut best = (0, 0);
    let mut at = start;
    for (o, l) in areas(&meta.value).into_iter().chain([(end, 1)]) {
        if at < o && o - at > best.1 {
            best = (at, o - at);
        }
        at = o.saturating_add(l);
    }
    (best.1 > 0).then_some(best)
}

fn free_id(m: Option<&Map<String, Value>>, max: u32) -> Option<u32> {
    (0..max).find(|i| m.is_none_or(|m| !m.contains_key(&i.to_string())))
}

fn push_id(v: &mut Value, key: &str, id: u32) {
    if let Some(a) = v.get_mut(key).and_then(Value::as_array_mut) {
        a.push(json!(id.to_string()));
    }
}

/// Start a reencryption on `vol` (opened for writing, not in
/// reencryption) with the old key `key_old` (None: plaintext, encrypt
/// mode) from keyslot `slot_old` opened by `passphrase`; `key_new` is the
/// new volume key (None: decrypt). A re-key gives every keyslot of
/// `slot_old` and `others` (keyslot, its passphrase) a keyslot for the
/// new key; the rest go when it finishes. Returns the reencrypt keyslot.
pub fn init(
    vol: &mut Volume,
    p: &InitParams,
    passphrase: &[u8],
    slot_old: u32,
    others: &[(u32, &[u8])],
    key_old: Option<&Key>,
    key_new: Option<&Key>,
) -> Result<u32, LuksError> {
    let data_size = vol.data_size;
    let detached = vol.detached;
    let h = &*h2(vol)?;
    let at = check_start(h, p, data_size)?;
    let mut d = Draft {
        h,
        p,
        v: h.meta.value.clone(),
        material: Vec::new(),
        at,
    };
    let digest_new = d.digest_new(key_new, slot_old, passphrase, others)?;
    let (fin_id, old_segs, unshift) = d.segments(data_size, detached)?;
    d.bind_digests(&old_segs, fin_id, digest_new);
    let resilience = d.resilience(unshift.is_some())?;
    let rslot = d.reencrypt_keyslot(resilience, unshift)?;
    let Draft {
        mut v,
        material,
        at,
        ..
    } = d;
    let kold = key_old.map(|k| k.as_slice());
    let knew = match (digest_new, key_new) {
        (Some(dn), Some(k)) if Some(dn) != at.digest_old => Some(k.as_slice()),
        _ => None,
    };
    let version = if p.move_first { 3 } else { 2 };
    let vdata = verify::data(&v, rslot, version, kold, knew)?;
    let rdigest = verify::create(&vdata, rslot)?;
    let did = free_id(v["digests"].as_object(), MAX_KEYSLOTS)
        .ok_or_else(|| LuksError::Usage("No free digest.".into()))?;
    v["digests"][did.to_string()] = rdigest;
    v["config"]["requirements"] = json!({"mandatory": [format!("online-reencrypt-v{version}")]});
    let meta = Metadata::parse(v, at.hdr_size)?;
    write_init(vol, meta, &material, unshift)?;
    Ok(rslot)
}

/// What the header says before a reencryption starts, checked.
struct Start {
    hdr_size: u64,
    /// Where the keyslots area starts (after both header copies).
    start: u64,
    seg0: Segment,
    /// The data offset.
    d_off: u64,
    /// The volume key's digest (None when encrypting).
    digest_old: Option<u32>,
    new_ss: u32,
    /// The larger of the old and new sector sizes.
    check_ss: u32,
    /// Bytes to reencrypt.
    size: u64,
}

/// A clean header with one dynamic data segment, and what the run
/// needs from it; `--device-size` within the device and aligned.
fn check_start(h: &Luks2, p: &InitParams, data_size: u64) -> Result<Start, LuksError> {
    if !h.meta.requirements.is_empty() {
        return Err(LuksError::Usage(
            "LUKS2 reencryption already initialized. Aborting operation.".into(),
        ));
    }
    let hdr_size = h.bin.hdr_size;
    let start = 2 * hdr_size;
    let seg0 = h
        .meta
        .segments
        .get(&0)
        .cloned()
        .ok_or_else(|| LuksError::field("segments.0", "(missing)", "no data segment"))?;
    if h.meta.segments.len() != 1 || seg0.size.is_some() {
        return Err(LuksError::Unsupported(
            "reencryption of a volume with a fixed-size or several data segments".into(),
        ));
    }
    let d_off = seg0.offset;
    let digest_old = match p.mode {
        Mode::Encrypt => None,
        _ => Some(
            h.meta
                .segment_digest()
                .map(|(n, _)| n)
                .ok_or_else(|| LuksError::field("digests", "", "no digest bound to segment 0"))?,
        ),
    };
    let old_ss = if p.mode == Mode::Encrypt {
        512
    } else {
        seg0.sector_size
    };
    let new_ss = p.sector_size.unwrap_or(seg0.sector_size);
    let check_ss = old_ss.max(new_ss);
    let mut size = data_size.saturating_sub(d_off);
    if let Some(want) = p.device_size {
        if want > size {
            return Err(LuksError::Usage(
                "Reduced data size is larger than real device size.".into(),
            ));
        }
        size = want;
    }
    if size == 0 || size % u64::from(check_ss) != 0 {
        return Err(LuksError::Usage(format!(
            "Data device is not aligned to encryption sector size ({check_ss} bytes)."
        )));
    }
    Ok(Start {
        hdr_size,
        start,
        seg0,
        d_off,
        digest_old,
        new_ss,
        check_ss,
        size,
    })
}

/// The header JSON of a reencryption being set up, and the new keyslot
/// material to write before it.
struct Draft<'a> {
    h: &'a Luks2,
    p: &'a InitParams,
    v: Value,
    material: Vec<(u64, zeroize::Zeroizing<Vec<u8>>)>,
    at: Start,
}

impl Draft<'_> {
    /// The new volume key's digest: a re-key adds a keyslot and a digest
    /// for it (the old digest with `--keep-key`), an encryption binds the
    /// existing digest, a decryption has none.
    fn digest_new(
        &mut self,
        key_new: Option<&Key>,
        slot_old: u32,
        passphrase: &[u8],
        others: &[(u32, &[u8])],
    ) -> Result<Option<u32>, LuksError> {
        let h = self.h;
        let segment_digest = || {
            h.meta
                .segment_digest()
                .ok_or_else(|| LuksError::field("digests", "", "no digest bound to segment 0"))
        };
        match (self.p.mode, key_new) {
            (Mode::Reencrypt, Some(_)) if self.p.keep_key => Ok(Some(segment_digest()?.0)),
            (Mode::Reencrypt, Some(knew)) => {
                let (_, dold) = segment_digest()?;
                // cryptsetup's order: keyslots ascending, each one's new
                // keyslot at the first free id and area.
                let mut all: Vec<(u32, &[u8])> = others.to_vec();
                all.push((slot_old, passphrase));
                all.sort_by_key(|(s, _)| *s);
                all.dedup_by_key(|(s, _)| *s);
                let mut did: Option<u32> = None;
                for (slot_old, passphrase) in all {
                    let slot_new = self.new_keyslot(slot_old, passphrase, knew)?;
                    let v = &mut self.v;
                    if let Some(d) = did {
                        // Further keyslots reuse the new key's digest.
                        push_id(&mut v["digests"][d.to_string()], "keyslots", slot_new);
                        continue;
                    }
                    let dsalt = keyslot::random(32)?;
                    let d = free_id(v["digests"].as_object(), MAX_KEYSLOTS)
                        .ok_or_else(|| LuksError::Usage("No free digest.".into()))?;
                    let dg = keyslot::key_digest(
                        dold.hash,
                        knew,
                        &dsalt,
                        dold.iterations,
                        dold.hash.digest_len(),
                    );
                    v["digests"][d.to_string()] = json!({
                        "type": "pbkdf2", "keyslots": [slot_new.to_string()], "segments": [],
                        "hash": dold.hash.name(), "iterations": dold.iterations,
                        "salt": b64_encode(&dsalt), "digest": b64_encode(&dg),
                    });
                    did = Some(d);
                }
                Ok(did)
            }
            (Mode::Encrypt, Some(_)) => Ok(h.meta.segment_digest().map(|(n, _)| n)),
            (Mode::Decrypt, None) => Ok(None),
            _ => Err(LuksError::Usage("volume keys do not match the mode".into())),
        }
    }

    /// A keyslot for the new key `knew` beside `slot_old`, sealed with
    /// `passphrase` (cryptsetup's parameters: the old keyslot's KDF unless
    /// one is given, 4000 stripes); the old keyslot's tokens open it too.
    /// Returns its number.
    fn new_keyslot(
        &mut self,
        slot_old: u32,
        passphrase: &[u8],
        knew: &[u8],
    ) -> Result<u32, LuksError> {
        let (h, p) = (self.h, self.p);
        let v = &mut self.v;
        let material = &mut self.material;
        let old = h
            .meta
            .keyslots
            .get(&slot_old)
            .cloned()
            .ok_or(LuksError::NoUsableKeyslot)?;
        let slot_new = free_id(v["keyslots"].as_object(), MAX_KEYSLOTS)
            .ok_or_else(|| LuksError::Usage("Not enough free keyslots for reencryption.".into()))?;
        let area_size = (knew.len() as u64 * 4000).div_ceil(4096) * 4096;
        let area_off =
            first_fit(v, h.meta.keyslots_size, self.at.start, area_size).ok_or_else(|| {
                LuksError::Usage("No space for new keyslot in the LUKS2 keyslots area.".into())
            })?;
        let salt = keyslot::random(32)?;
        let (new_kdf, af_hash) = p.kdf.unwrap_or((old.kdf, old.af_hash));
        let sp = SlotParams {
            kdf: new_kdf,
            salt: &salt,
            af_hash,
            stripes: 4000,
            offset: area_off,
            encryption: &old.area_encryption,
            area_key_size: old.area_key_size as usize,
            key_size: knew.len(),
        };
        material.push((area_off, keyslot::seal(&sp, passphrase, knew)?));
        let kdf = match new_kdf {
            crate::luks::kdf::Kdf::Pbkdf2 { hash, iterations } => json!({
            "type": "pbkdf2", "hash": hash.name(), "iterations": iterations,
            "salt": b64_encode(&salt)}),
            k @ crate::luks::kdf::Kdf::Argon2 {
                time,
                memory_kib,
                cpus,
                ..
            } => json!({
            "type": k.type_name(), "time": time, "memory": memory_kib, "cpus": cpus,
            "salt": b64_encode(&salt)}),
        };
        v["keyslots"][slot_new.to_string()] = json!({
            "type": "luks2",
            "key_size": knew.len(),
            "af": {"type": "luks1", "stripes": 4000, "hash": af_hash.name()},
            "area": {"type": "raw", "offset": area_off.to_string(),
                     "size": area_size.to_string(),
                     "encryption": old.area_encryption, "key_size": old.area_key_size},
            "kdf": kdf,
        });
        // Tokens of the old keyslot also open the new one
        // (cryptsetup's assign_tokens).
        if let Some(toks) = v.get_mut("tokens").and_then(Value::as_object_mut) {
            for t in toks.values_mut() {
                let has = t["keyslots"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|e| e.as_str() == Some(&slot_old.to_string())));
                if has {
                    push_id(t, "keyslots", slot_new);
                }
            }
        }
        Ok(slot_new)
    }

    /// The data segments during the run, backups included, in
    /// cryptsetup's layout for the mode and shift. Returns the final
    /// segment's id, the old key's segments and, for a decryption with
    /// data shift, (shift, moved segment size).
    #[allow(clippy::type_complexity)]
    fn segments(
        &mut self,
        data_size: u64,
        detached: bool,
    ) -> Result<(u32, Vec<u32>, Option<(u64, u64)>), LuksError> {
        let p = self.p;
        let (d_off, size, new_ss) = (self.at.d_off, self.at.size, self.at.new_ss);
        let seg0 = &self.at.seg0;
        let v = &mut self.v;
        let new_cipher = p.cipher.clone().unwrap_or_else(|| seg0.encryption.clone());
        // Segments: encrypt turns segment 0 into plaintext; backups follow.
        let seg0_json = v["segments"]["0"].clone();
        let prev = match p.mode {
            Mode::Encrypt => {
                json!({"type": "linear", "offset": d_off.to_string(), "size": "dynamic"})
            }
            _ => seg0_json.clone(),
        };
        let fin = match p.mode {
            Mode::Decrypt => {
                json!({"type": "linear", "offset": d_off.to_string(), "size": "dynamic"})
            }
            _ => json!({"type": "crypt", "offset": d_off.to_string(), "size": "dynamic",
                        "iv_tweak": "0", "encryption": new_cipher, "sector_size": new_ss}),
        };
        if p.move_first {
            let (fin_id, old, unshift) = unshift_layout(p, v, seg0, size, self.at.check_ss)?;
            return Ok((fin_id, old, Some(unshift)));
        }
        let fin_id = if let Some(shift) = p.shift.filter(|_| detached) {
            in_place_layout(p, v, shift, d_off, size, fin)?
        } else if let Some(shift) = p.shift {
            shift_layout(p, v, shift, d_off, data_size, fin)?
        } else {
            if p.mode == Mode::Encrypt {
                v["segments"]["0"] = prev.clone();
            }
            v["segments"]["1"] = with_flag(prev, "backup-previous");
            v["segments"]["2"] = with_flag(fin, "backup-final");
            2
        };
        Ok((fin_id, vec![0, 1], None))
    }

    /// Digests name their segments anew: the old key's digest the old
    /// segments, the new key's digest the final one.
    fn bind_digests(&mut self, old_segs: &[u32], fin_id: u32, digest_new: Option<u32>) {
        let v = &mut self.v;
        if let Some(ds) = v["digests"].as_object_mut() {
            for d in ds.values_mut() {
                if let Some(a) = d.get_mut("segments").and_then(Value::as_array_mut) {
                    a.clear();
                }
            }
        }
        if self.p.mode == Mode::Reencrypt || self.p.mode == Mode::Decrypt {
            if let Some(d) = self.at.digest_old {
                for s in old_segs {
                    push_id(&mut v["digests"][d.to_string()], "segments", *s);
                }
            }
        }
        if let Some(d) = digest_new {
            push_id(&mut v["digests"][d.to_string()], "segments", fin_id);
        }
    }

    /// The resilience asked for, checked against the operation (`unshift`:
    /// a decryption with data shift, which protects its moved segment).
    fn resilience(&self, unshift: bool) -> Result<Resilience, LuksError> {
        let p = self.p;
        let (check_ss, d_off) = (self.at.check_ss, self.at.d_off);
        let checksum_hash = || {
            HashAlg::from_name(&p.hash).ok_or_else(|| {
                LuksError::Usage(format!("Hash algorithm {} is not available.", p.hash))
            })
        };
        let resilience = match p.resilience.as_str() {
            _ if p.shift.is_some() => Resilience::Datashift {
                shift: p.shift.unwrap_or(0),
                moved: None,
            },
            r if unshift => Resilience::Datashift {
                shift: d_off,
                moved: Some(match r {
                    "datashift-checksum" => Moved::Checksum {
                        hash: checksum_hash()?,
                        block: 4096u32.max(check_ss),
                    },
                    "datashift-journal" => Moved::Journal,
                    _ => {
                        return Err(LuksError::Usage(
                            "Requested --resilience option cannot be applied to current \
                         reencryption operation."
                                .into(),
                        ))
                    }
                }),
            },
            r if r.starts_with("datashift") => {
                return Err(LuksError::Usage(
                    "Requested --resilience option cannot be applied to current reencryption \
                 operation."
                        .into(),
                ))
            }
            "checksum" => Resilience::Checksum {
                hash: checksum_hash()?,
                block: 4096u32.max(check_ss),
            },
            "journal" => Resilience::Journal,
            "none" => Resilience::None,
            r => {
                return Err(LuksError::Unsupported(format!(
                    "--resilience {r} (udm: checksum, journal, none)"
                )))
            }
        };
        Ok(resilience)
    }

    /// The `reencrypt` keyslot: its area (the largest free gap, or 4 KiB
    /// for a data shift), the resilience's fields, mode and direction.
    /// Returns its number.
    fn reencrypt_keyslot(
        &mut self,
        resilience: Resilience,
        unshift: Option<(u64, u64)>,
    ) -> Result<u32, LuksError> {
        let p = self.p;
        let (hdr_size, start) = (self.at.hdr_size, self.at.start);
        let v = &mut self.v;
        let rslot = free_id(v["keyslots"].as_object(), MAX_KEYSLOTS)
            .ok_or_else(|| LuksError::Usage("All key slots full.".into()))?;
        let tmp = Metadata::parse(v.clone(), hdr_size)?;
        let gap = if p.shift.is_some() {
            // Data shift keeps nothing in its area: cryptsetup takes 4 KiB.
            first_fit(&tmp.value, tmp.keyslots_size, start, 4096).map(|o| (o, 4096))
        } else {
            max_gap(&tmp, start)
        };
        let (a_off, a_len) =
            gap.ok_or_else(|| LuksError::Usage("Not enough space in header keyslot area.".into()))?;
        let mut area = json!({"offset": a_off.to_string(), "size": a_len.to_string(), "type": resilience.name()});
        let hash_block = match resilience {
            Resilience::Checksum { hash, block }
            | Resilience::Datashift {
                moved: Some(Moved::Checksum { hash, block }),
                ..
            } => Some((hash, block)),
            _ => None,
        };
        if let Some((hash, block)) = hash_block {
            area["hash"] = json!(hash.name());
            area["sector_size"] = json!(block);
        }
        if let Resilience::Datashift { shift, .. } = resilience {
            area["shift_size"] = json!(shift.to_string());
        }
        if let Some((_, moved)) = unshift {
            // The moved segment's in-place hotzone must fit the protection.
            let room = match resilience {
                Resilience::Datashift {
                    moved: Some(Moved::Checksum { hash, block }),
                    ..
                } => a_len / hash.digest_len() as u64 * u64::from(block),
                _ => a_len,
            };
            if moved > room {
                return Err(LuksError::Usage(format!(
                    "Moved segment too large. Requested size {moved}, available space for: {room}."
                )));
            }
        }
        let direction = if p.move_first {
            Direction::Forward
        } else if p.mode == Mode::Decrypt || p.shift.is_some() {
            Direction::Backward
        } else {
            Direction::Forward
        };
        v["keyslots"][rslot.to_string()] = json!({
            "area": area, "type": "reencrypt", "key_size": 1,
            "mode": p.mode.name(), "direction": direction.name(), "priority": 0,
        });
        Ok(rslot)
    }
}

/// A decryption with data shift: [first `moved` bytes of the ciphertext,
/// copied from the data offset][gap][the rest of the ciphertext]; new
/// data at 0, linear. Returns the final segment's id, the old key's
/// segments and (shift, moved).
#[allow(clippy::type_complexity)]
fn unshift_layout(
    p: &InitParams,
    v: &mut Value,
    seg0: &Segment,
    size: u64,
    check_ss: u32,
) -> Result<(u32, Vec<u32>, (u64, u64)), LuksError> {
    // cryptsetup's layout: [first `moved` bytes of the ciphertext,
    // copied from the data offset][gap][ciphertext from the data
    // offset + moved]; new data at 0, linear.
    let shift = seg0.offset;
    if p.mode != Mode::Decrypt || shift == 0 || seg0.iv_tweak != 0 {
        return Err(LuksError::Usage(
            "Decryption with data shift needs a LUKS2 header on the device (data offset \
             above 0) and a data segment without iv_tweak."
                .into(),
        ));
    }
    let align = 4096u64.max(u64::from(check_ss));
    if shift % align != 0 {
        return Err(LuksError::Usage(format!(
            "Data offset {shift} is not aligned to {align} bytes; cannot shift the data."
        )));
    }
    if p.hotzone.is_some_and(|hz| hz > shift) {
        return Err(LuksError::Usage(
            "Moved segment size can not be greater than data shift value.".into(),
        ));
    }
    let moved = p.hotzone.unwrap_or(shift.min(MOVED_DEFAULT)).min(size);
    if moved == 0 || moved % align != 0 {
        return Err(LuksError::Usage(format!(
            "Hotzone size must be multiple of calculated zone alignment ({align} bytes)."
        )));
    }
    let crypt = |off: u64, size: Option<u64>, iv: u64| {
        json!({"type": "crypt", "offset": off.to_string(),
               "size": size.map_or_else(|| "dynamic".to_string(), |s| s.to_string()),
               "iv_tweak": iv.to_string(), "encryption": seg0.encryption,
               "sector_size": seg0.sector_size})
    };
    let first = crypt(0, Some(moved), 0);
    let mut segs = Map::new();
    segs.insert("0".into(), first.clone());
    if size > moved {
        segs.insert("1".into(), crypt(shift + moved, None, moved / 512));
    }
    let n = segs.len();
    segs.insert(n.to_string(), with_flag(first, "backup-moved-segment"));
    segs.insert(
        (n + 1).to_string(),
        // `--device-size` fixes its size, as cryptsetup writes it.
        with_flag(crypt(shift, p.device_size, 0), "backup-previous"),
    );
    let fin = json!({"type": "linear", "offset": "0", "size": "dynamic"});
    segs.insert((n + 2).to_string(), with_flag(fin, "backup-final"));
    v["segments"] = Value::Object(segs);
    Ok((n as u32 + 2, (0..=n as u32 + 1).collect(), (shift, moved)))
}

/// An encryption with data shift and a detached header.
fn in_place_layout(
    p: &InitParams,
    v: &mut Value,
    shift: u64,
    d_off: u64,
    size: u64,
    fin: Value,
) -> Result<u32, LuksError> {
    // A detached header: cryptsetup encrypts in place (at the data
    // offset), backward, in hotzones of the shift; the plaintext is
    // one linear segment of the whole data area.
    if p.mode != Mode::Encrypt || shift == 0 || size % shift != 0 {
        return Err(LuksError::Usage(format!(
            "An encryption with data shift and a detached header needs the data size \
             ({size} bytes) to be a multiple of the shift ({shift} bytes)."
        )));
    }
    let prev = json!({"type": "linear", "offset": d_off.to_string(),
                      "size": size.to_string()});
    v["segments"] = json!({"0": prev.clone()});
    v["segments"]["1"] = with_flag(prev, "backup-previous");
    v["segments"]["2"] = with_flag(fin, "backup-final");
    Ok(2)
}

/// An encryption with data shift and the header on the device.
fn shift_layout(
    p: &InitParams,
    v: &mut Value,
    shift: u64,
    d_off: u64,
    data_size: u64,
    fin: Value,
) -> Result<u32, LuksError> {
    // cryptsetup's layout: [header (shift)][plaintext from shift]
    // [gap][first `shift` bytes of the plaintext, moved].
    let plain = data_size.saturating_sub(2 * shift);
    if p.mode != Mode::Encrypt || d_off != shift || plain == 0 || plain % 4096 != 0 {
        return Err(LuksError::Usage(
            "Data shift needs an encryption, a header of the shift's size and a data \
             device larger than twice the shift, aligned to 4096 bytes."
                .into(),
        ));
    }
    let moved_len = plain.min(shift);
    let moved = json!({"type": "linear", "offset": (data_size - shift).to_string(),
                       "size": moved_len.to_string()});
    let mut segs = Map::new();
    segs.insert("0".into(), moved.clone());
    if plain > shift {
        segs.insert(
            "1".into(),
            json!({"type": "linear", "offset": shift.to_string(),
                   "size": (plain - shift).to_string()}),
        );
    }
    let n = segs.len();
    segs.insert(n.to_string(), with_flag(moved, "backup-moved-segment"));
    let prev = json!({"type": "linear", "offset": "0", "size": plain.to_string()});
    segs.insert((n + 1).to_string(), with_flag(prev, "backup-previous"));
    segs.insert((n + 2).to_string(), with_flag(fin, "backup-final"));
    v["segments"] = Value::Object(segs);
    Ok(n as u32 + 2)
}

/// The new keyslots' material, then (decryption with data shift) the
/// first hotzone's ciphertext to byte 0, then the header.
fn write_init(
    vol: &mut Volume,
    meta: Metadata,
    material: &[(u64, zeroize::Zeroizing<Vec<u8>>)],
    unshift: Option<(u64, u64)>,
) -> Result<(), LuksError> {
    for (off, m) in material {
        vol.meta.write_at(*off, m)?;
    }
    if !material.is_empty() {
        vol.meta.sync()?;
    }
    if let Some((shift, moved)) = unshift {
        // The first hotzone's ciphertext goes to byte 0 (over the old
        // on-device header, whose copy is the detached header) before
        // the header that describes it is written.
        let mut d = crate::luks::disk::Disk::open(&vol.data_path, true)?;
        let mut done = 0u64;
        while done < moved {
            let n = (moved - done).min(super::engine::UDM_MAX_HOTZONE);
            let mut buf = zeroize::Zeroizing::new(vec![0u8; n as usize]);
            d.read_at(shift + done, &mut buf)?;
            d.write_at(done, &buf)?;
            done += n;
        }
        d.sync()?;
    }
    let Volume {
        header, meta: disk, ..
    } = vol;
    if let Some(h) = header.luks2_mut() {
        h.meta = meta;
        h.write(disk)?;
    }
    Ok(())
}
