//! `luksDump`: the header as cryptsetup 2.6 prints it, line for line, so
//! scripts that grep its output (`Key Slot 0: ENABLED`, `PBKDF:`, `Digest
//! ID:`) read udm's the same way. LUKS2 is printed from the JSON itself, as
//! cryptsetup does, so keyslots, tokens and segments udm does not model
//! (reencryption, foreign tokens) still show.
//!
//! The volume key dump is built in a [`SecretText`] sized for it up front.

use super::error::LuksError;
use super::json::{hostile_char, parse_u64str, to_pretty};
use super::secret::SecretText;
use super::volume::Volume;
use super::{luks1, luks2};
use base64::Engine;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt::Write;

/// Hex bytes, each followed by a space, 16 to a line, continuation lines
/// starting with `wrap` (cryptsetup's `hexprint_base64` / `crypt_log_hex`).
fn hex16(o: &mut String, b: &[u8], wrap: &str) {
    for (i, x) in b.iter().enumerate() {
        if i > 0 && i % 16 == 0 {
            o.push('\n');
            o.push_str(wrap);
        }
        let _ = write!(o, "{x:02x} ");
    }
}

fn b64hex(o: &mut String, v: &Value) {
    let bytes = v
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default();
    hex16(o, &bytes, "\t            ");
    o.push('\n');
}

/// A JSON string field, escaped for the terminal.
fn s(v: &Value) -> Cow<'_, str> {
    esc(v.as_str().unwrap_or(""))
}

/// `text` from the header with its control characters (C0, DEL, C1) and
/// the invisible Unicode format characters that reorder or hide text
/// written as `\xNN` / `\u{NNNN}`: a header is untrusted input, and raw
/// escape sequences would let it rewrite the terminal or fake lines of
/// the dump. cryptsetup prints these fields raw; normal headers print the
/// same either way.
pub fn esc(text: &str) -> Cow<'_, str> {
    let bad = hostile_char;
    if !text.chars().any(bad) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !bad(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(parse_u64str))
        .unwrap_or(0)
}

/// Numbered members of a JSON object in numeric order (cryptsetup walks
/// ids 0..max, not the stored order).
fn numbered(v: &Value) -> Vec<(u32, &Value)> {
    let mut out: Vec<(u32, &Value)> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, x)| k.parse().ok().map(|n| (n, x)))
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// The text of `cryptsetup luksDump DEVICE`.
pub fn header_text(v: &Volume, device: &str) -> String {
    let mut o = String::new();
    if let Some(h) = v.header.luks2() {
        luks2_text(&mut o, h);
    } else if let Some(h) = v.header.luks1() {
        luks1_text(&mut o, h, device);
    }
    o
}

/// A LUKS1 header: its binary fields and the eight keyslots.
fn luks1_text(o: &mut String, h: &luks1::Header, device: &str) {
    let _ = writeln!(o, "LUKS header information for {device}\n");
    let _ = writeln!(o, "Version:       \t1");
    let _ = writeln!(o, "Cipher name:   \t{}", esc(&h.cipher_name));
    let _ = writeln!(o, "Cipher mode:   \t{}", esc(&h.cipher_mode));
    let _ = writeln!(o, "Hash spec:     \t{}", h.hash.name());
    let _ = writeln!(o, "Payload offset:\t{}", h.payload_offset);
    let _ = writeln!(o, "MK bits:       \t{}", h.key_bytes * 8);
    o.push_str("MK digest:     \t");
    for x in &h.mk_digest {
        let _ = write!(o, "{x:02x} ");
    }
    o.push_str("\nMK salt:       \t");
    hex16(o, &h.mk_digest_salt, "               \t");
    let _ = writeln!(o, "\nMK iterations: \t{}", h.mk_digest_iter);
    let _ = writeln!(o, "UUID:          \t{}\n", esc(&h.uuid));
    for (i, sl) in h.slots.iter().enumerate() {
        if sl.active {
            let _ = writeln!(o, "Key Slot {i}: ENABLED");
            let _ = writeln!(o, "\tIterations:         \t{}", sl.iterations);
            o.push_str("\tSalt:               \t");
            hex16(o, &sl.salt, "\t                      \t");
            let _ = writeln!(o, "\n\tKey material offset:\t{}", sl.key_offset);
            let _ = writeln!(o, "\tAF stripes:            \t{}", sl.stripes);
        } else {
            let _ = writeln!(o, "Key Slot {i}: DISABLED");
        }
    }
}

/// A LUKS2 header, printed from its JSON as cryptsetup prints it.
fn luks2_text(o: &mut String, h: &luks2::Luks2) {
    let j = &h.meta.value;
    let _ = writeln!(o, "LUKS header information");
    let _ = writeln!(o, "Version:       \t2");
    let _ = writeln!(o, "Epoch:         \t{}", h.bin.seqid);
    let _ = writeln!(o, "Metadata area: \t{} [bytes]", h.bin.hdr_size);
    let _ = writeln!(o, "Keyslots area: \t{} [bytes]", h.meta.keyslots_size);
    let or = |x: &str, d: &'static str| {
        if x.is_empty() {
            d.to_string()
        } else {
            esc(x).into_owned()
        }
    };
    let _ = writeln!(o, "UUID:          \t{}", or(&h.bin.uuid, "(no UUID)"));
    let _ = writeln!(o, "Label:         \t{}", or(&h.bin.label, "(no label)"));
    let _ = writeln!(
        o,
        "Subsystem:     \t{}",
        or(&h.bin.subsystem, "(no subsystem)")
    );
    o.push_str("Flags:       \t");
    for f in &h.meta.flags {
        let _ = write!(o, "{} ", esc(f));
    }
    let reqs = &h.meta.requirements;
    let _ = write!(
        o,
        "{}\n{}",
        if h.meta.flags.is_empty() {
            "(no flags)"
        } else {
            ""
        },
        if reqs.is_empty() { "\n" } else { "" }
    );
    if !reqs.is_empty() {
        o.push_str("Requirements:\t");
        for r in reqs {
            let _ = write!(o, "{} ", esc(r));
        }
        o.push_str("\n\n");
    }
    segments_text(o, j);
    keyslots_text(o, h);
    tokens_text(o, j);
    digests_text(o, j);
}

fn segments_text(o: &mut String, j: &Value) {
    o.push_str("Data segments:\n");
    for (n, seg) in numbered(&j["segments"]) {
        let _ = writeln!(o, "  {n}: {}", s(&seg["type"]));
        let _ = writeln!(o, "\toffset: {} [bytes]", u(&seg["offset"]));
        if s(&seg["size"]) == "dynamic" {
            o.push_str("\tlength: (whole device)\n");
        } else {
            let _ = writeln!(o, "\tlength: {} [bytes]", u(&seg["size"]));
        }
        if let Some(e) = seg.get("encryption") {
            let _ = writeln!(o, "\tcipher: {}", s(e));
        }
        if let Some(ss) = seg.get("sector_size") {
            let _ = writeln!(o, "\tsector: {} [bytes]", u(ss));
        }
        if let Some(t) = seg.get("integrity").and_then(|i| i.get("type")) {
            let _ = writeln!(o, "\tintegrity: {}", s(t));
        }
        if let Some(fl) = seg.get("flags").and_then(Value::as_array) {
            if !fl.is_empty() {
                let names: Vec<Cow<'_, str>> = fl.iter().map(s).collect();
                let _ = writeln!(o, "\tflags : {}", names.join(", "));
            }
        }
        o.push('\n');
    }
}

/// Every keyslot JSON object (also those udm does not unlock), with the
/// digests it belongs to.
fn keyslots_text(o: &mut String, h: &luks2::Luks2) {
    let j = &h.meta.value;
    o.push_str("Keyslots:\n");
    for (n, ks) in numbered(&j["keyslots"]) {
        let bound = h
            .meta
            .digests
            .values()
            .any(|d| d.keyslots.contains(&n) && !d.segments.is_empty());
        let _ = writeln!(
            o,
            "  {n}: {}{}",
            s(&ks["type"]),
            if bound { "" } else { " (unbound)" }
        );
        if let Some(k) = ks.get("key_size") {
            let _ = writeln!(o, "\tKey:        {} bits", u(k) * 8);
        }
        let prio = match ks.get("priority").map(u) {
            None | Some(1) => "normal",
            Some(0) => "ignored",
            Some(2) => "preferred",
            Some(_) => "invalid",
        };
        let _ = writeln!(o, "\tPriority:   {prio}");
        let area = &ks["area"];
        keyslot_kind_text(o, ks, area);
        if area.get("offset").is_some() {
            let _ = writeln!(o, "\tArea offset:{} [bytes]", u(&area["offset"]));
            let _ = writeln!(o, "\tArea length:{} [bytes]", u(&area["size"]));
        }
        for (dn, d) in numbered(&j["digests"]) {
            let ids = d["keyslots"].as_array().cloned().unwrap_or_default();
            if ids.iter().any(|e| e.as_str() == Some(&n.to_string())) {
                let _ = writeln!(o, "\tDigest ID:  {dn}");
            }
        }
    }
}

/// The lines that depend on a keyslot's type: a `luks2` keyslot's
/// cipher and KDF, or a `reencrypt` keyslot's mode and resilience.
fn keyslot_kind_text(o: &mut String, ks: &Value, area: &Value) {
    if s(&ks["type"]) == "luks2" {
        let kdf = &ks["kdf"];
        let _ = writeln!(o, "\tCipher:     {}", s(&area["encryption"]));
        let _ = writeln!(o, "\tCipher key: {} bits", u(&area["key_size"]) * 8);
        let _ = writeln!(o, "\tPBKDF:      {}", s(&kdf["type"]));
        if s(&kdf["type"]) == "pbkdf2" {
            let _ = writeln!(o, "\tHash:       {}", s(&kdf["hash"]));
            let _ = writeln!(o, "\tIterations: {}", u(&kdf["iterations"]));
        } else {
            let _ = writeln!(o, "\tTime cost:  {}", u(&kdf["time"]));
            let _ = writeln!(o, "\tMemory:     {}", u(&kdf["memory"]));
            let _ = writeln!(o, "\tThreads:    {}", u(&kdf["cpus"]));
        }
        o.push_str("\tSalt:       ");
        b64hex(o, &kdf["salt"]);
        let _ = writeln!(o, "\tAF stripes: {}", u(&ks["af"]["stripes"]));
        let _ = writeln!(o, "\tAF hash:    {}", s(&ks["af"]["hash"]));
    } else if s(&ks["type"]) == "reencrypt" {
        let _ = writeln!(o, "\t{:<12}{}", "Mode:", s(&ks["mode"]));
        let _ = writeln!(o, "\t{:<12}{}", "Direction:", s(&ks["direction"]));
        let _ = writeln!(o, "\t{:<12}{}", "Resilience:", s(&area["type"]));
        match area["type"].as_str().unwrap_or("") {
            "checksum" => {
                let _ = writeln!(o, "\t{:<12}{}", "Hash:", s(&area["hash"]));
                let _ = writeln!(
                    o,
                    "\t{:<12}{} [bytes]",
                    "Hash data:",
                    u(&area["sector_size"])
                );
            }
            "datashift" => {
                let _ = writeln!(
                    o,
                    "\t{:<12}{}[bytes]",
                    "Shift size:",
                    u(&area["shift_size"])
                );
            }
            _ => {}
        }
    }
}

fn tokens_text(o: &mut String, j: &Value) {
    o.push_str("Tokens:\n");
    for (n, t) in numbered(&j["tokens"]) {
        let _ = writeln!(o, "  {n}: {}", s(&t["type"]));
        if s(&t["type"]) == "luks2-keyring" {
            if let Some(d) = t.get("key_description") {
                let _ = writeln!(o, "\tKey description: {}", s(d));
            }
        }
        for k in t["keyslots"].as_array().into_iter().flatten() {
            let _ = writeln!(o, "\tKeyslot:    {}", s(k));
        }
    }
}

fn digests_text(o: &mut String, j: &Value) {
    o.push_str("Digests:\n");
    for (n, d) in numbered(&j["digests"]) {
        let _ = writeln!(o, "  {n}: {}", s(&d["type"]));
        if s(&d["type"]) == "pbkdf2" {
            let _ = writeln!(o, "\tHash:       {}", s(&d["hash"]));
            let _ = writeln!(o, "\tIterations: {}", u(&d["iterations"]));
            o.push_str("\tSalt:       ");
            b64hex(o, &d["salt"]);
            o.push_str("\tDigest:     ");
            b64hex(o, &d["digest"]);
        }
    }
}

/// `luksDump --dump-json-metadata`: the JSON as cryptsetup pretty-prints
/// it, followed by the newline cryptsetup's log call adds.
pub fn json_text(v: &Volume) -> Result<String, LuksError> {
    match v.header.luks2() {
        None => Err(LuksError::Usage(
            "Dump operation is not supported for this device type (LUKS1 has no JSON metadata)."
                .into(),
        )),
        Some(h) => Ok(to_pretty(&h.meta.value)),
    }
}

/// `luksDump --dump-volume-key` for the verified `key`: cipher, payload
/// offset, UUID and the key in hex, in a buffer sized for exactly this.
/// With `stored_to`, the key went to that file and is not printed.
pub fn volume_key_text(
    v: &Volume,
    key: &[u8],
    device: &str,
    stored_to: Option<&std::path::Path>,
) -> Result<SecretText, LuksError> {
    let (cipher, payload) = v.header.first_segment();
    let (name, mode) = cipher.split_once('-').unwrap_or((cipher.as_str(), ""));
    // Fixed text, names, and 3 characters per key byte plus a line break
    // and two tabs per 16 bytes.
    let cap = 320
        + device.len()
        + cipher.len()
        + v.uuid().len()
        + key.len() * 4
        + stored_to.map_or(0, |p| p.as_os_str().len());
    let mut t = SecretText::with_capacity(cap);
    let too_long = |_| LuksError::Usage("volume key dump does not fit its buffer".into());
    write!(
        t,
        "LUKS header information for {device}\nCipher name:   \t{name}\nCipher mode:   \t{mode}\n\
         Payload offset:\t{payload}\nUUID:          \t{}\nMK bits:       \t{}\nMK dump:\t",
        v.uuid(),
        key.len() * 8
    )
    .map_err(too_long)?;
    if let Some(p) = stored_to {
        // Replace the dump line cryptsetup leaves out.
        let mut short = SecretText::with_capacity(cap);
        let head = t.as_str();
        let head = head.strip_suffix("MK dump:\t").unwrap_or(head);
        writeln!(short, "{head}Key stored to file {}.", p.display()).map_err(too_long)?;
        return Ok(short);
    }
    key_hex(&mut t, key).map_err(too_long)?;
    Ok(t)
}

/// A key as cryptsetup prints it: each byte in hex and a space, 16 bytes a
/// line, continuation lines indented by two tabs.
fn key_hex(t: &mut SecretText, key: &[u8]) -> std::fmt::Result {
    for (i, chunk) in key.chunks(16).enumerate() {
        if i > 0 {
            t.write_str("\n\t\t")?;
        }
        for b in chunk {
            t.hex(std::slice::from_ref(b), "", 0, "")?;
            t.write_str(" ")?;
        }
    }
    t.write_str("\n")
}

/// `luksDump --unbound --key-slot N` as cryptsetup prints it.
pub fn unbound_key_text(
    v: &Volume,
    slot: u32,
    key: &[u8],
    device: &str,
    stored_to: Option<&std::path::Path>,
) -> Result<SecretText, LuksError> {
    let cap = 160
        + device.len()
        + v.uuid().len()
        + key.len() * 4
        + stored_to.map_or(0, |p| p.as_os_str().len());
    let mut t = SecretText::with_capacity(cap);
    let too_long = |_| LuksError::Usage("unbound key dump does not fit its buffer".into());
    write!(
        t,
        "LUKS header information for {device}\nUUID:    \t{}\nKeyslot: \t{slot}\nKey bits:\t{}\n",
        v.uuid(),
        key.len() * 8
    )
    .map_err(too_long)?;
    match stored_to {
        Some(p) => writeln!(t, "Key stored to file {}.", p.display()).map_err(too_long)?,
        None => {
            t.write_str("Unbound Key:\t").map_err(too_long)?;
            key_hex(&mut t, key).map_err(too_long)?;
        }
    }
    Ok(t)
}
