//! `repair`: what cryptsetup repairs, and nothing more.
//!
//! LUKS1: disabled keyslots whose offset or stripes differ from the
//! standard layout (or that carry an MS-DOS partition signature over slot
//! 6) are reset to empty with their salt wiped; an `ecb-…` mode becomes
//! `ecb`; the hash name is lower-cased. Active keyslots are never touched.
//! LUKS2: a damaged or stale header copy is rewritten from the good one as
//! cryptsetup's recovery does (that copy only, same seqid, new salt).

use super::disk::Disk;
use super::error::LuksError;
use super::luks1::{self, be32, HEADER_LEN, SLOT_DISABLED, SLOT_ENABLED};
use super::volume::Volume;
use std::path::Path;

/// Repair a LUKS1 header in place (`raw` is its 1024 bytes); returns the
/// messages cryptsetup prints, and whether anything changed.
pub fn repair_luks1(raw: &mut [u8; HEADER_LEN]) -> Result<(Vec<String>, bool), LuksError> {
    let mut msgs = Vec::new();
    let mut changed = false;
    let key_bytes = be32(raw, 108)?;
    if ![16, 32, 64].contains(&key_bytes) {
        return Err(LuksError::Usage(
            "Non standard key size, manual repair required.".into(),
        ));
    }
    if be32(raw, 208 + 40)? < 8 {
        return Err(LuksError::Usage(
            "Non standard keyslots alignment, manual repair required.".into(),
        ));
    }
    if raw[40..44] == *b"ecb-" {
        let old = String::from_utf8_lossy(&raw[40..72])
            .trim_end_matches('\0')
            .to_string();
        raw[40..72].fill(0);
        raw[40..43].copy_from_slice(b"ecb");
        msgs.push(format!("Cipher mode repaired ({old} -> ecb)."));
        changed = true;
    }
    if raw[72..104].iter().any(u8::is_ascii_uppercase) {
        raw[72..104].make_ascii_lowercase();
        let h = String::from_utf8_lossy(&raw[72..104])
            .trim_end_matches('\0')
            .to_string();
        msgs.push(format!("Cipher hash repaired to lowercase ({h})."));
        changed = true;
    }
    let area = luks1::area_sectors(key_bytes).div_ceil(8) * 8;
    let sig = raw[0x1fe] == 0x55 && raw[0x1ff] == 0xaa;
    for i in 0..luks1::NUM_SLOTS {
        let o = 208 + 48 * i;
        if be32(raw, o)? == SLOT_ENABLED {
            continue;
        }
        let want_off = (8 + area * i as u64) as u32;
        let mut bad = false;
        let off = be32(raw, o + 40)?;
        if off != want_off {
            msgs.push(format!(
                "Keyslot {i}: offset repaired ({off} -> {want_off})."
            ));
            raw[o + 40..o + 44].copy_from_slice(&want_off.to_be_bytes());
            bad = true;
        }
        let stripes = be32(raw, o + 44)?;
        if stripes != super::af::STRIPES {
            msgs.push(format!(
                "Keyslot {i}: stripes repaired ({stripes} -> {}).",
                super::af::STRIPES
            ));
            raw[o + 44..o + 48].copy_from_slice(&super::af::STRIPES.to_be_bytes());
            bad = true;
        }
        if i == 6 && sig {
            msgs.push(format!("Keyslot {i}: bogus partition signature."));
            bad = true;
        }
        if bad {
            msgs.push(format!("Keyslot {i}: salt wiped."));
            raw[o..o + 4].copy_from_slice(&SLOT_DISABLED.to_be_bytes());
            raw[o + 4..o + 40].fill(0);
            changed = true;
        }
    }
    Ok((msgs, changed))
}

/// Repair the header of `image` (or of the detached `header`); returns
/// the messages to show. A header that needs nothing is left untouched.
pub fn repair(image: &Path, header: Option<&Path>) -> Result<Vec<String>, LuksError> {
    let meta_path = header.unwrap_or(image);
    let mut d = Disk::open(meta_path, true)?;
    let mut head = [0u8; 8];
    d.read_at(0, &mut head)?;
    if luks1::Header::is_luks1(&head) {
        let mut raw = [0u8; HEADER_LEN];
        d.read_at(0, &mut raw)?;
        let (mut msgs, changed) = repair_luks1(&mut raw)?;
        // Validate before writing: a repair that still leaves a broken
        // header must not replace the original.
        luks1::Header::parse(&raw, d.size()?)
            .map_err(|e| LuksError::Usage(format!("Repair failed ({e}).")))?;
        if changed {
            d.write_at(0, &raw)?;
            d.sync()?;
            msgs.push("Writing LUKS header to disk.".into());
        }
        return Ok(msgs);
    }
    drop(d);
    let mut v = Volume::load(image, header, true)?;
    let warnings = v.warnings();
    let fixed = match v.header.luks2_mut() {
        Some(h) => h.recover(&mut v.meta)?,
        None => false,
    };
    if !fixed {
        return Ok(vec!["No known problems detected for LUKS header.".into()]);
    }
    Ok(warnings
        .into_iter()
        .map(|w| format!("Repaired: {w}."))
        .collect())
}
