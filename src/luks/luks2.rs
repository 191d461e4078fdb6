//! The LUKS2 binary header and its two copies. Reading picks the valid copy
//! with the highest seqid as cryptsetup does (a damaged primary falls back
//! to the secondary with a warning; with no sane primary binary header the
//! secondary is looked for at every metadata size); writing updates one
//! copy at a time in cryptsetup's order so a crash leaves at most one copy
//! inconsistent, and [`Luks2::recover`] rewrites a bad copy as
//! cryptsetup's recovery does.

use super::disk::Disk;
use super::error::LuksError;
use super::hash::HashAlg;
use super::json::Metadata;
use super::luks1::{cstr, put_cstr};
use crate::protocol::be;

pub const MAGIC_PRIMARY: [u8; 6] = *b"LUKS\xba\xbe";
pub const MAGIC_SECONDARY: [u8; 6] = *b"SKUL\xba\xbe";
pub const BIN_LEN: usize = 4096;
const CSUM_OFF: usize = 0x1C0;
/// Allowed per-copy header sizes (binary header + JSON area).
pub const HDR_SIZES: [u64; 9] = [
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
];

/// The fields of a binary header that are the same in both copies.
#[derive(Clone, Debug)]
pub struct BinHeader {
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: String,
    pub checksum_alg: HashAlg,
    pub uuid: String,
    pub subsystem: String,
}

/// A validated LUKS2 header as read from disk.
#[derive(Clone, Debug)]
pub struct Luks2 {
    pub bin: BinHeader,
    pub meta: Metadata,
    /// Per-copy salts, kept across rewrites as cryptsetup does.
    pub salts: [[u8; 64]; 2],
    /// Which copy was used (0 primary, 1 secondary).
    pub used_copy: usize,
    /// Problems found with the other copy (already logged via tracing).
    pub warnings: Vec<String>,
    /// The copy to rewrite from the used one, if the two differ.
    pub recovery: Option<Recovery>,
}

/// A big-endian header field through the shared codec: a buffer too short
/// for it is an error naming the offset, not a panic.
fn be64(b: &[u8], off: usize) -> Result<u64, LuksError> {
    be::u64_at(b, off).ok_or_else(|| {
        LuksError::field(
            format!("header bytes {off}..{}", off + 8),
            b.len(),
            "past the end of the header",
        )
    })
}

/// Parse one 4096-byte binary header expected at `offset` (checksum not checked).
pub fn parse_bin(
    b: &[u8],
    offset: u64,
    secondary: bool,
) -> Result<(BinHeader, [u8; 64]), LuksError> {
    if b.len() < BIN_LEN {
        return Err(LuksError::field(
            "binary header",
            b.len(),
            "shorter than 4096 bytes",
        ));
    }
    let which = if secondary { "secondary" } else { "primary" };
    let want = if secondary {
        MAGIC_SECONDARY
    } else {
        MAGIC_PRIMARY
    };
    if b[..6] != want {
        return Err(LuksError::field(
            format!("{which} header magic"),
            hex::encode(&b[..6]),
            "not a LUKS2 header",
        ));
    }
    let version = u16::from_be_bytes([b[6], b[7]]);
    if version != 2 {
        return Err(LuksError::field(
            format!("{which} header version"),
            version,
            "expected 2",
        ));
    }
    let hdr_size = be64(b, 8)?;
    // cryptsetup's range; the exact sizes are the JSON's to prove
    // (config.json_size), so a copy in range with a bad size is damaged
    // rather than absent, as cryptsetup tells them apart.
    if !(HDR_SIZES[0]..=HDR_SIZES[HDR_SIZES.len() - 1]).contains(&hdr_size) {
        return Err(LuksError::field(
            format!("{which} hdr_size"),
            hdr_size,
            "must be 16 KiB..4 MiB, a power of two",
        ));
    }
    let hdr_offset = be64(b, 0x100)?;
    if hdr_offset != offset || (secondary && hdr_offset != hdr_size) {
        return Err(LuksError::field(
            format!("{which} hdr_offset"),
            hdr_offset,
            format!("does not match the copy's position {offset}"),
        ));
    }
    let alg_name = cstr(b, 0x48, 32, &format!("{which} checksum_alg"))?;
    let checksum_alg = HashAlg::from_name(&alg_name).ok_or_else(|| {
        LuksError::field(
            format!("{which} checksum_alg"),
            &alg_name,
            "unsupported hash",
        )
    })?;
    let mut salt = [0u8; 64];
    salt.copy_from_slice(&b[0x68..0xA8]);
    Ok((
        BinHeader {
            hdr_size,
            seqid: be64(b, 0x10)?,
            label: cstr(b, 0x18, 48, &format!("{which} label"))?,
            checksum_alg,
            uuid: cstr(b, 0xA8, 40, &format!("{which} uuid"))?,
            subsystem: cstr(b, 0xD0, 48, &format!("{which} subsystem"))?,
        },
        salt,
    ))
}

/// The binary header of one copy with a zero checksum field.
fn bin_bytes(h: &BinHeader, salt: &[u8; 64], copy: usize) -> Vec<u8> {
    let mut b = vec![0u8; BIN_LEN];
    b[..6].copy_from_slice(if copy == 0 {
        &MAGIC_PRIMARY
    } else {
        &MAGIC_SECONDARY
    });
    b[6..8].copy_from_slice(&2u16.to_be_bytes());
    b[8..16].copy_from_slice(&h.hdr_size.to_be_bytes());
    b[16..24].copy_from_slice(&h.seqid.to_be_bytes());
    put_cstr(&mut b, 0x18, 48, &h.label);
    put_cstr(&mut b, 0x48, 32, h.checksum_alg.name());
    b[0x68..0xA8].copy_from_slice(salt);
    put_cstr(&mut b, 0xA8, 40, &h.uuid);
    put_cstr(&mut b, 0xD0, 48, &h.subsystem);
    let off = if copy == 0 { 0 } else { h.hdr_size };
    b[0x100..0x108].copy_from_slice(&off.to_be_bytes());
    b
}

fn checksum(alg: HashAlg, bin_zero_csum: &[u8], json_area: &[u8]) -> Vec<u8> {
    alg.digest(&[bin_zero_csum, json_area])
}

/// Split the JSON area into its text, enforcing NUL termination and NUL fill.
pub fn json_text<'a>(area: &'a [u8], which: &str) -> Result<&'a [u8], LuksError> {
    let end = area.iter().position(|&c| c == 0).ok_or_else(|| {
        LuksError::field(
            format!("{which} JSON area"),
            area.len(),
            "JSON is not NUL-terminated within the area",
        )
    })?;
    if let Some(p) = area[end..].iter().position(|&c| c != 0) {
        return Err(LuksError::field(
            format!("{which} JSON area"),
            end + p,
            "non-NUL byte after the JSON text",
        ));
    }
    if area.first() != Some(&b'{') {
        return Err(LuksError::field(
            format!("{which} JSON area"),
            "first byte",
            "must start with '{'",
        ));
    }
    Ok(&area[..end])
}

/// Parse and validate the JSON area of a header of `hdr_size` bytes.
pub fn parse_json_area(area: &[u8], hdr_size: u64, which: &str) -> Result<Metadata, LuksError> {
    let text = json_text(area, which)?;
    let value: serde_json::Value = serde_json::from_slice(text)
        .map_err(|e| LuksError::field(format!("{which} JSON"), e, "malformed JSON"))?;
    Metadata::parse(value, hdr_size)
}

/// Parse and validate one copy given its 4096-byte binary header and JSON area.
pub fn parse_copy(
    bin: &[u8],
    area: &[u8],
    offset: u64,
    secondary: bool,
) -> Result<(BinHeader, [u8; 64], Metadata), LuksError> {
    let which = if secondary { "secondary" } else { "primary" };
    let (h, salt) = parse_bin(bin, offset, secondary)?;
    check_sum(&h, bin, area, which)?;
    let meta = parse_json_area(area, h.hdr_size, which)?;
    Ok((h, salt, meta))
}

fn check_sum(h: &BinHeader, bin: &[u8], area: &[u8], which: &str) -> Result<(), LuksError> {
    if area.len() as u64 != h.hdr_size - BIN_LEN as u64 {
        return Err(LuksError::field(
            format!("{which} JSON area"),
            area.len(),
            "wrong length",
        ));
    }
    let mut zeroed = bin[..BIN_LEN].to_vec();
    zeroed[CSUM_OFF..CSUM_OFF + 64].fill(0);
    let sum = checksum(h.checksum_alg, &zeroed, area);
    if bin[CSUM_OFF..CSUM_OFF + sum.len()] != sum[..] {
        return Err(LuksError::field(
            format!("{which} header checksum"),
            hex::encode(&bin[CSUM_OFF..CSUM_OFF + sum.len()]),
            "does not match the header contents",
        ));
    }
    Ok(())
}

/// One header copy as read: its binary header and JSON area, and the
/// metadata if the JSON is valid.
struct Raw {
    bin: BinHeader,
    salt: [u8; 64],
    area: Vec<u8>,
}

/// What one copy turned out to be, in cryptsetup's terms: usable (`Ok`), a
/// sane binary header over a bad checksum or JSON (obsolete: the place of
/// the other copy is still known from it), or nothing usable at all.
enum Copy {
    Ok(Raw, Box<Metadata>),
    Obsolete(Raw, LuksError),
    Fail(LuksError),
}

/// The binary header and JSON area of the copy at `offset`, checksum
/// checked; on failure the copy as read when its binary header itself is
/// sane (its size then still says where the secondary is).
fn read_raw(
    disk: &Disk,
    size: u64,
    offset: u64,
    secondary: bool,
) -> Result<Raw, Box<(Option<Raw>, LuksError)>> {
    let which = if secondary { "secondary" } else { "primary" };
    if size < offset + BIN_LEN as u64 {
        let e = LuksError::field(
            format!("{which} header"),
            offset,
            "beyond the end of the device",
        );
        return Err(Box::new((None, e)));
    }
    let mut bin = vec![0u8; BIN_LEN];
    disk.read_at(offset, &mut bin)
        .map_err(|e| Box::new((None, e)))?;
    let (h, salt) = parse_bin(&bin, offset, secondary).map_err(|e| Box::new((None, e)))?;
    if size < offset + h.hdr_size {
        let e = LuksError::field(
            "hdr_size",
            h.hdr_size,
            "header copy extends beyond the device",
        );
        return Err(Box::new((None, e)));
    }
    let mut area = vec![0u8; (h.hdr_size - BIN_LEN as u64) as usize];
    disk.read_at(offset + BIN_LEN as u64, &mut area)
        .map_err(|e| Box::new((None, e)))?;
    let raw = Raw { bin: h, salt, area };
    match check_sum(&raw.bin, &bin, &raw.area, which) {
        Ok(()) => Ok(raw),
        Err(e) => Err(Box::new((Some(raw), e))),
    }
}

fn read_copy(disk: &Disk, size: u64, offset: u64, secondary: bool) -> Copy {
    let which = if secondary { "secondary" } else { "primary" };
    match read_raw(disk, size, offset, secondary) {
        Ok(raw) => match parse_json_area(&raw.area, raw.bin.hdr_size, which) {
            Ok(meta) => Copy::Ok(raw, Box::new(meta)),
            Err(e) => Copy::Obsolete(raw, e),
        },
        Err(b) => match *b {
            (Some(raw), e) => Copy::Obsolete(raw, e),
            (None, e) => Copy::Fail(e),
        },
    }
}

/// The secondary copy: where a sane primary binary header says, else at
/// the first offset of [`HDR_SIZES`] holding a copy with a good checksum
/// (cryptsetup's scan when the primary is gone).
fn read_secondary(disk: &Disk, size: u64, primary: &Copy) -> Copy {
    match primary {
        Copy::Ok(r, _) | Copy::Obsolete(r, _) => read_copy(disk, size, r.bin.hdr_size, true),
        Copy::Fail(_) => {
            let mut last = None;
            for off in HDR_SIZES {
                match read_raw(disk, size, off, true) {
                    Ok(raw) => {
                        return match parse_json_area(&raw.area, raw.bin.hdr_size, "secondary") {
                            Ok(meta) => Copy::Ok(raw, Box::new(meta)),
                            Err(e) => Copy::Obsolete(raw, e),
                        }
                    }
                    Err(b) => last = Some(b.1),
                }
            }
            Copy::Fail(last.unwrap_or_else(|| {
                LuksError::field(
                    "secondary header",
                    "(none)",
                    "no valid secondary header found",
                )
            }))
        }
    }
}

/// True if the first bytes carry a LUKS2 primary or secondary magic with version 2.
pub fn looks_like_luks2(b: &[u8]) -> bool {
    b.len() >= 8 && (b[..6] == MAGIC_PRIMARY || b[..6] == MAGIC_SECONDARY) && b[6..8] == [0, 2]
}

/// A copy to rewrite from the good one (cryptsetup's auto-recovery, which
/// udm does on `repair` and with any header write): which copy, and the
/// good copy's JSON area as it is on disk.
#[derive(Clone, Debug)]
pub struct Recovery {
    pub copy: usize,
    area: Vec<u8>,
}

/// Read both copies and pick one (module docs), as cryptsetup's
/// `LUKS2_disk_hdr_read`: the copy with the higher seqid among the valid
/// ones, the other marked for recovery. `disk` is the metadata device.
pub fn read(disk: &Disk) -> Result<Luks2, LuksError> {
    let size = disk.size()?;
    let primary = read_copy(disk, size, 0, false);
    let secondary = read_secondary(disk, size, &primary);
    let seq = |c: &Copy| match c {
        Copy::Ok(r, _) => Some(r.bin.seqid),
        _ => None,
    };
    let use_secondary = match (seq(&primary), seq(&secondary)) {
        (Some(p), Some(s)) => s > p,
        (None, Some(_)) => true,
        (Some(_), None) => false,
        (None, None) => {
            let mut b = [0u8; 8];
            if disk.read_at(0, &mut b).is_ok() && !looks_like_luks2(&b) {
                return Err(LuksError::NotLuks(disk.path().display().to_string()));
            }
            return Err(match primary {
                Copy::Obsolete(_, e) | Copy::Fail(e) => e,
                Copy::Ok(..) => unreachable!("an Ok copy has a seqid"),
            });
        }
    };
    let (used, other, used_copy) = if use_secondary {
        (secondary, primary, 1)
    } else {
        (primary, secondary, 0)
    };
    let Copy::Ok(raw, meta) = used else {
        unreachable!("the chosen copy is Ok")
    };
    let warnings = copy_warnings(&raw, &other, used_copy);
    for w in &warnings {
        tracing::warn!("{}: {w}", disk.path().display());
    }
    let need = 2 * raw.bin.hdr_size + meta.keyslots_size;
    if size < need {
        return Err(LuksError::field(
            "config.keyslots_size",
            meta.keyslots_size,
            format!("metadata needs {need} bytes but the device has {size}"),
        ));
    }
    // The other copy's salt is kept while its binary header is readable
    // (cryptsetup keeps it too); a recovered copy gets a new one.
    let mut salts = [raw.salt; 2];
    let (other_salt, stale) = match &other {
        Copy::Ok(o, _) => (Some(o.salt), o.bin.seqid != raw.bin.seqid),
        Copy::Obsolete(o, _) => (Some(o.salt), true),
        Copy::Fail(_) => (None, true),
    };
    salts[1 - used_copy] = match other_salt {
        Some(s) => s,
        None => random_salt(),
    };
    let recovery = (!warnings.is_empty() || stale).then(|| Recovery {
        copy: 1 - used_copy,
        area: raw.area.clone(),
    });
    Ok(Luks2 {
        bin: raw.bin,
        meta: *meta,
        salts,
        used_copy,
        warnings,
        recovery,
    })
}

fn random_salt() -> [u8; 64] {
    let mut s = [0u8; 64];
    let _ = getrandom::fill(&mut s);
    s
}

/// What is wrong with the copy not used (empty: both agree).
fn copy_warnings(used: &Raw, other: &Copy, used_copy: usize) -> Vec<String> {
    let mut w = Vec::new();
    match (other, used_copy) {
        (Copy::Ok(o, _), 1) => w.push(format!(
            "LUKS2 primary header has an older seqid ({}) than the secondary ({}); using the secondary copy",
            o.bin.seqid, used.bin.seqid
        )),
        (Copy::Ok(o, _), _) if o.bin.seqid < used.bin.seqid => w.push(format!(
            "LUKS2 secondary header has an older seqid ({}) than the primary ({})",
            o.bin.seqid, used.bin.seqid
        )),
        (Copy::Ok(..), _) => {}
        (Copy::Obsolete(_, e) | Copy::Fail(e), 0) => w.push(format!(
            "LUKS2 secondary header is damaged ({e}); using the primary copy"
        )),
        (Copy::Obsolete(_, e) | Copy::Fail(e), _) => w.push(format!(
            "LUKS2 primary header is damaged ({e}); using the secondary copy at offset {}",
            used.bin.hdr_size
        )),
    }
    w
}

impl Luks2 {
    /// Write both copies with seqid + 1: for each copy, binary header with zero
    /// checksum, JSON area, binary header with checksum, sync; primary first.
    pub fn write(&mut self, disk: &mut Disk) -> Result<(), LuksError> {
        let json = self.meta.to_bytes();
        let area_len = (self.bin.hdr_size - BIN_LEN as u64) as usize;
        if json.len() >= area_len {
            return Err(LuksError::Usage(format!(
                "LUKS2 metadata ({} bytes) does not fit the {area_len}-byte JSON area; use a larger --luks2-metadata-size",
                json.len()
            )));
        }
        let mut area = vec![0u8; area_len];
        area[..json.len()].copy_from_slice(&json);
        self.bin.seqid = self.bin.seqid.saturating_add(1);
        for copy in 0..2 {
            self.write_copy(disk, copy, &area)?;
        }
        self.used_copy = 0;
        self.recovery = None;
        self.warnings.clear();
        Ok(())
    }

    /// One copy: binary header with zero checksum, JSON area, binary
    /// header with checksum, sync.
    fn write_copy(&self, disk: &mut Disk, copy: usize, area: &[u8]) -> Result<(), LuksError> {
        let off = if copy == 0 { 0 } else { self.bin.hdr_size };
        let mut bin = bin_bytes(&self.bin, &self.salts[copy], copy);
        disk.write_at(off, &bin)?;
        disk.write_at(off + BIN_LEN as u64, area)?;
        let sum = checksum(self.bin.checksum_alg, &bin, area);
        bin[CSUM_OFF..CSUM_OFF + sum.len()].copy_from_slice(&sum);
        disk.write_at(off, &bin)?;
        disk.sync()
    }

    /// cryptsetup's recovery of a damaged or stale copy: only that copy is
    /// written, from the good copy's binary header (same seqid: the epoch
    /// does not move) and its JSON area byte for byte, under a new salt.
    /// A JSON fix made in memory while reading (old KDF members) is not
    /// written here; the next header update writes it. Returns whether
    /// anything was written.
    pub fn recover(&mut self, disk: &mut Disk) -> Result<bool, LuksError> {
        let Some(r) = self.recovery.take() else {
            return Ok(false);
        };
        self.salts[r.copy] = random_salt();
        self.write_copy(disk, r.copy, &r.area)?;
        self.warnings.clear();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_area_rules() {
        assert!(json_text(b"{}\0\0", "p").is_ok());
        assert!(json_text(b"{}}}", "p")
            .unwrap_err()
            .to_string()
            .contains("NUL-terminated"));
        assert!(json_text(b"{}\0x", "p")
            .unwrap_err()
            .to_string()
            .contains("non-NUL"));
        assert!(json_text(b" {}\0", "p").is_err());
    }

    #[test]
    fn bin_header_round_trip_and_checks() {
        let h = BinHeader {
            hdr_size: 16384,
            seqid: 7,
            label: "lbl".into(),
            checksum_alg: HashAlg::Sha256,
            uuid: "u".into(),
            subsystem: String::new(),
        };
        let b = bin_bytes(&h, &[3u8; 64], 1);
        let (p, salt) = parse_bin(&b, 16384, true).unwrap();
        assert_eq!((p.seqid, p.label.as_str(), salt[0]), (7, "lbl", 3));
        assert!(parse_bin(&b, 32768, true)
            .unwrap_err()
            .to_string()
            .contains("hdr_offset"));
        assert!(parse_bin(&b, 16384, false)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut bad = b.clone();
        bad[8..16].copy_from_slice(&12345u64.to_be_bytes());
        assert!(parse_bin(&bad, 16384, true)
            .unwrap_err()
            .to_string()
            .contains("hdr_size"));
    }
}
