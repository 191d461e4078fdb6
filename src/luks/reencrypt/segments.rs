//! The segment tables a header carries while data moves, built member by
//! member in cryptsetup's order so both programs write the same JSON:
//! the "hot" table (written before a hotzone is touched: the hotzone is
//! its own segment flagged `in-reencryption`) and the "post" table
//! (written after: the hotzone has joined the new side). Offsets are
//! bytes relative to the start of the data area unless named otherwise.

use serde_json::{json, Map, Value};

use super::state::{Direction, Mode, SegParams, State};

/// One segment's JSON: `crypt` (type, offset, size, iv_tweak, encryption,
/// sector_size) or `linear` (type, offset, size); `hot` adds the
/// `in-reencryption` flag. `size` None = "dynamic".
pub fn segment_json(
    p: &SegParams,
    offset: u64,
    iv_tweak: u64,
    size: Option<u64>,
    hot: bool,
) -> Value {
    let size = size.map_or_else(|| "dynamic".to_string(), |s| s.to_string());
    let mut v = match &p.cipher {
        Some(c) => json!({
            "type": "crypt",
            "offset": offset.to_string(),
            "size": size,
            "iv_tweak": iv_tweak.to_string(),
            "encryption": c,
            "sector_size": p.sector_size,
        }),
        None => json!({"type": "linear", "offset": offset.to_string(), "size": size}),
    };
    if hot {
        v["flags"] = json!(["in-reencryption"]);
    }
    v
}

/// A segment's JSON with a flag appended (cryptsetup's set_flag).
pub fn with_flag(mut v: Value, flag: &str) -> Value {
    match v.get_mut("flags").and_then(Value::as_array_mut) {
        Some(a) => a.push(json!(flag)),
        None => v["flags"] = json!([flag]),
    }
    v
}

/// Where the engine stands: hotzone `[offset, offset+length)` of a data
/// area of `size` bytes starting at byte `data_offset` of the device.
#[derive(Clone, Copy, Debug)]
pub struct Zone {
    pub data_offset: u64,
    pub size: u64,
    pub offset: u64,
    pub length: u64,
    /// `--device-size`: only the first `size` bytes are reencrypted, and
    /// the segment after the moving boundary gets a fixed size (ending
    /// there) instead of "dynamic", as cryptsetup's fixed-size mode.
    pub fixed: bool,
}

impl Zone {
    /// Refuse an interrupted hotzone read from a header (segment `hid` at
    /// byte `at`) unless it is non-empty, at most `max` bytes, inside the
    /// data area and aligned to `align`, and `ok` (the caller's own rule
    /// for the mode): header values must not steer recovery I/O anywhere
    /// else.
    pub fn check(
        &self,
        hid: impl std::fmt::Display,
        at: u64,
        max: u64,
        align: u64,
        ok: bool,
    ) -> Result<(), crate::luks::LuksError> {
        let inside = self
            .offset
            .checked_add(self.length)
            .is_some_and(|e| e <= self.size);
        if !ok
            || self.length == 0
            || self.length > max
            || !inside
            || self.offset % align != 0
            || self.length % align != 0
        {
            return Err(crate::luks::LuksError::field(
                format!("segments.{hid}"),
                at,
                "interrupted hotzone outside the data area or misaligned",
            ));
        }
        Ok(())
    }
}

fn new_seg(st: &State, z: &Zone, at: u64, size: Option<u64>, hot: bool) -> Value {
    segment_json(&st.new, z.data_offset + at, at / 512, size, hot)
}

fn old_seg(st: &State, z: &Zone, at: u64, size: Option<u64>) -> Value {
    segment_json(&st.old, z.data_offset + at, at / 512, size, false)
}

/// The hot table for zone `z`; `current` is the header's regular
/// segments (the backward direction keeps segment 0's JSON).
pub fn hot(st: &State, z: &Zone, current: &Map<String, Value>) -> Vec<Value> {
    let mut v = Vec::new();
    let end = z.offset + z.length;
    match st.direction {
        Direction::Forward => {
            if z.offset > 0 {
                v.push(new_seg(st, z, 0, Some(z.offset), false));
            }
            v.push(new_seg(st, z, z.offset, Some(z.length), true));
            if end < z.size {
                v.push(old_seg(st, z, end, z.fixed.then(|| z.size - end)));
            }
        }
        Direction::Backward => {
            if z.offset > 0 {
                let mut first = current.get("0").cloned().unwrap_or(Value::Null);
                first["size"] = json!(z.offset.to_string());
                v.push(first);
            }
            v.push(new_seg(st, z, z.offset, Some(z.length), true));
            if end < z.size {
                v.push(new_seg(st, z, end, z.fixed.then(|| z.size - end), false));
            }
        }
    }
    v
}

/// The post table after hotzone `z` (made from its hot table `hot`).
pub fn post(st: &State, z: &Zone, hot: &[Value]) -> Vec<Value> {
    let rseg = hot
        .iter()
        .position(|s| {
            s["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "in-reencryption"))
        })
        .unwrap_or(0);
    match st.direction {
        Direction::Forward => {
            let old_after = hot.get(rseg + 1);
            let size = old_after.map(|_| z.offset + z.length);
            let mut v = vec![new_seg(st, z, 0, size, false)];
            if let Some(o) = old_after {
                v.push(o.clone());
            }
            v
        }
        Direction::Backward => {
            let mut v = Vec::new();
            if rseg >= 1 {
                v.push(hot[rseg - 1].clone());
            }
            let size = (z.fixed && z.offset > 0).then(|| z.size - z.offset);
            v.push(new_seg(st, z, z.offset, size, false));
            v
        }
    }
}

fn size_of(v: &Value) -> u64 {
    v["size"]
        .as_str()
        .and_then(crate::luks::json::parse_u64str)
        .unwrap_or(0)
}

/// The hot table of an encryption with data shift (backward): the last
/// plaintext (linear) segment gives up its tail to the hotzone, which is
/// written `shift` bytes further on; the first encrypted segment follows.
pub fn hot_shift(st: &State, z: &Zone, current: &Map<String, Value>) -> Vec<Value> {
    let segs: Vec<&Value> = current.values().collect();
    let Some(sg) = segs.iter().rposition(|s| s["type"] == "linear") else {
        return Vec::new();
    };
    let first_crypt = segs.iter().position(|s| s["type"] == "crypt");
    let mut v: Vec<Value> = segs[..sg].iter().map(|s| (*s).clone()).collect();
    let len = size_of(segs[sg]);
    if len > z.length {
        let mut shrunk = segs[sg].clone();
        shrunk["size"] = json!((len - z.length).to_string());
        v.push(shrunk);
    }
    v.push(new_seg(st, z, z.offset, Some(z.length), true));
    if let Some(c) = first_crypt {
        v.push(segs[c].clone());
    }
    v
}

/// The post table of an encryption with data shift: the hotzone joins
/// the encrypted segment after it (which becomes "dynamic" once it starts
/// at the beginning of the data area).
pub fn post_shift(z: &Zone, hot: &[Value]) -> Vec<Value> {
    let Some(rseg) = hot.iter().position(|s| {
        s["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "in-reencryption"))
    }) else {
        return hot.to_vec();
    };
    let mut v: Vec<Value> = hot[..rseg].to_vec();
    let (mut seg, size) = match hot.get(rseg + 1) {
        Some(next) => {
            let mut s = next.clone();
            s["offset"] = json!((z.data_offset + z.offset).to_string());
            s["iv_tweak"] = json!((z.offset / 512).to_string());
            let size = size_of(next).saturating_add(z.length);
            (s, size)
        }
        None => {
            let mut s = hot[rseg].clone();
            if let Some(o) = s.as_object_mut() {
                let empty = match o.get_mut("flags").and_then(Value::as_array_mut) {
                    Some(a) => {
                        a.retain(|x| x != "in-reencryption");
                        a.is_empty()
                    }
                    None => false,
                };
                if empty {
                    o.shift_remove("flags");
                }
            }
            (s, z.length)
        }
    };
    seg["size"] = if rseg > 0 {
        json!(size.to_string())
    } else {
        json!("dynamic")
    };
    v.push(seg);
    v
}

fn assign(top: &mut Map<String, Value>, seg: usize, digest: Option<u32>) {
    let Some(d) = digest else { return };
    let name = seg.to_string();
    if let Some(a) = top
        .get_mut("digests")
        .and_then(|g| g.get_mut(d.to_string()))
        .and_then(|d| d.get_mut("segments"))
        .and_then(Value::as_array_mut)
    {
        if !a.iter().any(|e| e.as_str() == Some(&name)) {
            a.push(json!(name));
        }
    }
}

fn is_crypt(v: &Value) -> bool {
    v["type"] == "crypt"
}

/// Replace the header's segments with `regular` plus the two backup
/// segments (kept from the current header, in their order), and bind
/// digests to segments the way cryptsetup does; `hot` tells which of the
/// two tables this is.
pub fn install(st: &State, top: &mut Map<String, Value>, regular: Vec<Value>, hot: bool) {
    let backups: Vec<Value> = top
        .get("segments")
        .and_then(Value::as_object)
        .map(|m| {
            let by = |flag: &str| {
                m.values()
                    .find(|s| {
                        s["flags"]
                            .as_array()
                            .is_some_and(|f| f.iter().any(|x| x == flag))
                    })
                    .cloned()
            };
            [
                by("backup-previous"),
                by("backup-final"),
                by("backup-moved-segment"),
            ]
            .into_iter()
            .flatten()
            .collect()
        })
        .unwrap_or_default();
    // Every digest forgets every segment first.
    if let Some(ds) = top.get_mut("digests").and_then(Value::as_object_mut) {
        for d in ds.values_mut() {
            if let Some(a) = d.get_mut("segments").and_then(Value::as_array_mut) {
                a.clear();
            }
        }
    }
    let nreg = regular.len();
    let mut segs = Map::new();
    let crypt: Vec<bool> = regular.iter().chain(backups.iter()).map(is_crypt).collect();
    for (i, s) in regular.into_iter().chain(backups).enumerate() {
        segs.insert(i.to_string(), s);
    }
    top.insert("segments".into(), Value::Object(segs));
    let (prev, fin) = (nreg, nreg + 1);
    if st.mode != Mode::Reencrypt {
        if crypt[prev] {
            assign(top, prev, st.digest_old);
        }
        if crypt[fin] {
            assign(top, fin, st.digest_new);
        }
        if crypt.get(fin + 1) == Some(&true) {
            assign(top, fin + 1, st.digest_old);
        }
        let d = if st.mode == Mode::Encrypt {
            st.digest_new
        } else {
            st.digest_old
        };
        for (i, c) in crypt.iter().enumerate() {
            if *c {
                assign(top, i, d);
            }
        }
        return;
    }
    let forward = st.direction == Direction::Forward;
    let (first, second) = if forward {
        (st.digest_new, st.digest_old)
    } else {
        (st.digest_old, st.digest_new)
    };
    if hot {
        let rseg = top["segments"]
            .as_object()
            .and_then(|m| {
                m.iter().position(|(_, s)| {
                    s["flags"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|x| x == "in-reencryption"))
                })
            })
            .unwrap_or(0);
        assign(top, rseg, st.digest_new);
        assign(top, rseg, st.digest_old);
        if rseg > 0 {
            assign(top, 0, first);
        }
        if nreg > rseg + 1 {
            assign(top, rseg + 1, second);
        }
    } else {
        assign(top, 0, if nreg == 1 { st.digest_new } else { first });
        if nreg > 1 {
            assign(top, 1, second);
        }
    }
    assign(top, prev, st.digest_old);
    assign(top, fin, st.digest_new);
}

/// The hot table of a decryption with data shift (forward, new data at
/// byte 0). A hotzone past the moved segment: the moved segment (still
/// encrypted at byte 0), the plaintext decrypted so far (from the moved
/// segment's end), the hotzone, and the old ciphertext after it, still
/// `shift` bytes further on. The moved segment's own hotzone (offset 0,
/// the last one): the hotzone and the plaintext after it.
pub fn hot_unshift(
    st: &State,
    z: &Zone,
    shift: u64,
    moved: u64,
    current: &Map<String, Value>,
) -> Vec<Value> {
    let mut v = Vec::new();
    let end = z.offset + z.length;
    if z.offset == 0 {
        v.push(segment_json(&st.new, 0, 0, Some(z.length), true));
        if let Some(next) = current.get("1") {
            v.push(next.clone());
        }
        return v;
    }
    if let Some(first) = current.get("0") {
        v.push(first.clone());
    }
    let done = z.offset.saturating_sub(moved);
    if done > 0 {
        v.push(segment_json(&st.new, moved, 0, Some(done), false));
    }
    v.push(segment_json(&st.new, z.offset, 0, Some(z.length), true));
    if end < z.size {
        v.push(segment_json(&st.old, shift + end, end / 512, None, false));
    }
    v
}

/// The post table of a decryption with data shift, from its hot table:
/// after the moved segment's hotzone one plaintext segment covers it all;
/// otherwise the moved segment, the plaintext grown by the hotzone, and
/// the old ciphertext after it.
pub fn post_unshift(st: &State, z: &Zone, moved: u64, hot: &[Value]) -> Vec<Value> {
    let rseg = hot.iter().position(|s| {
        s["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "in-reencryption"))
    });
    let Some(rseg) = rseg.filter(|r| *r > 0) else {
        return vec![segment_json(&st.new, 0, 0, None, false)];
    };
    let mut v = vec![hot[0].clone()];
    let old = hot.get(rseg + 1);
    let done = z.offset.saturating_sub(moved) + z.length;
    v.push(segment_json(&st.new, moved, 0, old.map(|_| done), false));
    if let Some(o) = old {
        v.push(o.clone());
    }
    v
}
