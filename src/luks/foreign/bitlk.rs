//! BitLocker volumes (cryptsetup's `bitlk` type).
//!
//! The FVE metadata (three copies, each with a CRC-32) lists volume master
//! keys (VMKs), each wrapped with AES-CCM under a key derived from what
//! protects it: a passphrase or recovery password (a million rounds of
//! SHA-256), a startup key file (.BEK), or a clear key stored beside it.
//! A VMK unwraps the full volume encryption key (FVEK), and first proves
//! itself by unwrapping a SHA-256 of the metadata, so a tampered metadata
//! copy is refused before its key is used. The data is mapped as
//! cryptsetup maps it: zero over the metadata areas, the relocated
//! filesystem header in front, crypt lines for the rest.

use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::crc32;
use crate::luks::cost::{CostLimit, SlotCost};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use crate::luks::kdf::Kdf;

pub(super) const FVE_SIZE: u64 = 64 * 1024;
const NONCE: usize = 12;
const TAG: usize = 16;
const GUID_NORMAL: [u8; 16] = [
    0x3b, 0xd6, 0x67, 0x49, 0x29, 0x2e, 0xd8, 0x4a, 0x83, 0x99, 0xf6, 0xa3, 0x39, 0xe3, 0xd0, 0x01,
];
const GUID_EOW: [u8; 16] = [
    0x3b, 0x4d, 0xa8, 0x92, 0x80, 0xdd, 0x0e, 0x4d, 0x9e, 0x4e, 0xb1, 0xe3, 0x28, 0x4e, 0xae, 0xd8,
];

/// What protects a VMK (cryptsetup's names in the dump).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    ClearKey,
    Tpm,
    StartupKey,
    TpmPin,
    Recovery,
    Passphrase,
    SmartCard,
    Unknown,
}

impl Protection {
    fn from_code(c: u16) -> Protection {
        match c {
            0x0000 => Protection::ClearKey,
            0x0100 => Protection::Tpm,
            0x0200 => Protection::StartupKey,
            0x0500 => Protection::TpmPin,
            0x0800 => Protection::Recovery,
            0x1000 => Protection::SmartCard,
            0x2000 => Protection::Passphrase,
            _ => Protection::Unknown,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Protection::ClearKey => "VMK protected with clear key",
            Protection::Tpm => "VMK protected with TPM",
            Protection::StartupKey => "VMK protected with startup key",
            Protection::TpmPin => "VMK protected with TPM and PIN",
            Protection::Passphrase => "VMK protected with passphrase",
            Protection::Recovery => "VMK protected with recovery passphrase",
            Protection::SmartCard => "VMK protected with smart card",
            Protection::Unknown => "VMK with unknown protection",
        }
    }
}

/// An AES-CCM wrapped key.
#[derive(Clone, Default)]
struct Wrapped {
    nonce: [u8; NONCE],
    tag: [u8; TAG],
    data: Vec<u8>,
}

/// One volume master key entry.
pub struct Vmk {
    pub guid: String,
    pub name: Option<String>,
    pub protection: Protection,
    salt: [u8; 16],
    wrapped: Option<Wrapped>,
    /// Clear key protection: the key that unwraps `wrapped`.
    clear_key: Option<Zeroizing<Vec<u8>>>,
}

/// What one segment of a mapped volume reads, by 512-byte sector of
/// the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seg {
    /// Zeros: an area Windows keeps for itself (metadata, the relocated
    /// boot sectors' home, chunk maps).
    Zero,
    /// Encrypted data at this sector, which is also its IV sector.
    Crypt(u64),
    /// Data still in the clear at this sector.
    Clear(u64),
}

/// A volume's table as segments: (start, length, what it reads), in
/// 512-byte sectors.
pub type Segments = Vec<(u64, u64, Seg)>;

/// The parsed metadata.
pub struct Metadata {
    pub togo: bool,
    pub sector_size: u32,
    /// The FVE information's "state offset", which cryptsetup prints as
    /// the volume size: for a volume converted the old way, how many bytes
    /// from the start are encrypted (the rest is still in the clear).
    pub volume_size: u64,
    pub normal_state: bool,
    /// The conversion's current and next state (4 and 4: encrypted).
    pub state: [u16; 2],
    /// The bytes at `volume_size` a conversion in progress keeps for
    /// itself (state 2).
    pub state_size: u32,
    /// Where an encrypt-on-write volume keeps its two chunk map copies.
    pub eow_offsets: [u64; 2],
    /// 0 normal, 1 encrypt-on-write, 2 unknown.
    pub kind: u8,
    pub cipher_mode: &'static str,
    pub key_bits: u32,
    pub guid: String,
    pub creation_time: u64,
    pub description: String,
    pub version: u16,
    pub metadata_offset: [u64; 3],
    pub volume_header_offset: u64,
    pub volume_header_size: u64,
    fve_sha256: [u8; 32],
    validation: Wrapped,
    pub vmks: Vec<Vmk>,
    fvek: Wrapped,
    /// The KDF cost udm accepts before trying a secret (`None`: the
    /// user's `--no-kdf-limit`). Each VMK a passphrase or recovery
    /// password protects costs a million SHA-256 rounds, and the metadata
    /// can list hundreds of them.
    pub cost_limit: Option<CostLimit>,
}

/// SHA-256 rounds of one key stretch (BitLocker's fixed count).
const STRETCH_ROUNDS: u32 = 0x10_0000;

pub(super) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(super) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

pub(super) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// A Windows GUID (three little-endian fields) as text.
fn guid_text(g: &[u8]) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{}-{}",
        le32(g, 0),
        le16(g, 4),
        le16(g, 6),
        hex::encode(&g[8..10]),
        hex::encode(&g[10..16])
    )
}

fn utf16(b: &[u8]) -> String {
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    String::from_utf16_lossy(&units)
}

fn bad(what: &str) -> LuksError {
    LuksError::field("BITLK metadata", what, "invalid")
}

/// The entries (size, type, value) of a metadata list from `start` to
/// `end`, stopping at a zero size.
fn entries(
    b: &[u8],
    mut start: usize,
    end: usize,
) -> Result<Vec<(usize, usize, u16, u16)>, LuksError> {
    let mut out = Vec::new();
    while end.saturating_sub(start) >= 6 {
        let size = usize::from(le16(b, start));
        if size == 0 {
            break;
        }
        if size > end - start || size < 8 {
            return Err(bad("entry size"));
        }
        out.push((start, size, le16(b, start + 2), le16(b, start + 4)));
        start += size;
    }
    Ok(out)
}

fn wrapped(b: &[u8], at: usize, size: usize) -> Result<Wrapped, LuksError> {
    if size < 8 + NONCE + TAG {
        return Err(bad("encrypted key entry"));
    }
    let mut w = Wrapped::default();
    w.nonce.copy_from_slice(&b[at + 8..at + 8 + NONCE]);
    w.tag.copy_from_slice(&b[at + 20..at + 20 + TAG]);
    w.data = b[at + 36..at + size].to_vec();
    Ok(w)
}

fn parse_vmk(b: &[u8], at: usize, size: usize) -> Result<Vmk, LuksError> {
    if size < 8 + 28 {
        return Err(bad("VMK entry size"));
    }
    let mut v = Vmk {
        guid: guid_text(&b[at + 8..at + 24]),
        name: None,
        protection: Protection::from_code(le16(b, at + 8 + 26)),
        salt: [0; 16],
        wrapped: None,
        clear_key: None,
    };
    for (s, n, _ty, value) in entries(b, at + 8 + 28, at + size)? {
        match value {
            3 if n >= 8 + 4 + 16 => v.salt.copy_from_slice(&b[s + 12..s + 28]),
            5 => v.wrapped = Some(wrapped(b, s, n)?),
            1 if n >= 12 => v.clear_key = Some(Zeroizing::new(b[s + 12..s + n].to_vec())),
            2 if v.name.is_none() => v.name = Some(utf16(&b[s + 8..s + n])),
            _ => {}
        }
    }
    Ok(v)
}

/// One FVE metadata copy, if its signature, version and CRC-32 hold.
fn read_copy(disk: &Disk, off: u64) -> Option<Vec<u8>> {
    let mut head = [0u8; 112];
    disk.read_at(off, &mut head).ok()?;
    let real = u64::from(le16(&head, 8)) << 4;
    if &head[..8] != b"-FVE-FS-" || le16(&head, 10) != 2 || !(112..=FVE_SIZE).contains(&real) {
        return None;
    }
    let mut val = [0u8; 88];
    disk.read_at(off + real, &mut val).ok()?;
    if le16(&val, 0) < 8 || le16(&val, 2) > 2 {
        return None;
    }
    let mut block = vec![0u8; real as usize];
    disk.read_at(off, &mut block).ok()?;
    (crc32(&block) == le32(&val, 4)).then(|| {
        block.extend_from_slice(&val);
        block
    })
}

fn cipher_of(code: u16) -> Result<(&'static str, u32), LuksError> {
    Ok(match code {
        0x8000 => ("cbc-elephant", 256),
        0x8001 => ("cbc-elephant", 512),
        0x8002 => ("cbc-eboiv", 128),
        0x8003 => ("cbc-eboiv", 256),
        0x8004 => ("xts-plain64", 256),
        0x8005 => ("xts-plain64", 512),
        _ => {
            return Err(LuksError::Unsupported(
                "Unknown or unsupported encryption type.".into(),
            ))
        }
    })
}

/// Read and check the metadata (cryptsetup's `BITLK_read_sb`).
pub fn read(disk: &Disk) -> Result<Metadata, LuksError> {
    let name = disk.path().display().to_string();
    let not = || LuksError::Usage(format!("Device {name} is not a valid BITLK device."));
    let mut sig = [0u8; 13];
    disk.read_at(0, &mut sig).map_err(|_| not())?;
    let (togo, sb_at) = match &sig[3..11] {
        b"-FVE-FS-" => (false, 160),
        b"MSWIN4.1" => (true, 424),
        _ => return Err(not()),
    };
    if &sig[..3] == b"\xeb\x52\x90" {
        return Err(LuksError::Unsupported(
            "BITLK version 1 is currently not supported.".into(),
        ));
    }
    if &sig[..3] != b"\xeb\x58\x90" {
        return Err(not());
    }
    let sector_size = match le16(&sig, 11) {
        0 => 512,
        n @ (512 | 4096) => u32::from(n),
        n => {
            return Err(LuksError::Unsupported(format!(
                "Unsupported sector size {n}."
            )))
        }
    };
    // The GUID and three metadata offsets; an encrypt-on-write volume
    // adds its two chunk map offsets.
    let mut sb = [0u8; 56];
    disk.read_at(sb_at, &mut sb).map_err(|_| not())?;
    let offsets = [le64(&sb, 16), le64(&sb, 24), le64(&sb, 32)];
    let (idx, block) = offsets
        .iter()
        .enumerate()
        .find_map(|(i, &o)| read_copy(disk, o).map(|b| (i, b)))
        .ok_or_else(|| {
            LuksError::Usage(format!(
                "Failed to read and validate BITLK FVE metadata from {name}."
            ))
        })?;
    let real = block.len() - 88;
    let (fve, val) = block.split_at(real);
    let fve_offsets = [le64(fve, 32), le64(fve, 40), le64(fve, 48)];
    if offsets[idx] != fve_offsets[idx] {
        return Err(LuksError::Usage(format!(
            "Failed to validate the location of BITLK FVE metadata from {name}."
        )));
    }
    let mut m = parse_block(fve, val, togo, sector_size, &sb[..16], fve_offsets)?;
    if m.kind == 1 {
        m.eow_offsets = [le64(&sb, 40), le64(&sb, 48)];
    }
    Ok(m)
}

fn parse_block(
    fve: &[u8],
    val: &[u8],
    togo: bool,
    sector_size: u32,
    sb_guid: &[u8],
    metadata_offset: [u64; 3],
) -> Result<Metadata, LuksError> {
    if le16(val, 0) < 88 || le16(val, 8) != 80 || le16(val, 10) != 0 || le16(val, 12) != 5 {
        return Err(bad("validation"));
    }
    let validation = Wrapped {
        nonce: val[16..28].try_into().unwrap_or_default(),
        tag: val[28..44].try_into().unwrap_or_default(),
        data: val[44..88].to_vec(),
    };
    let (cipher_mode, key_bits) = cipher_of(le16(fve, 100))?;
    let meta_size = le32(fve, 64) as usize;
    if !(48 + 4..=FVE_SIZE as usize).contains(&meta_size) || 64 + meta_size > fve.len() {
        return Err(bad("metadata size"));
    }
    let mut m = Metadata {
        togo,
        sector_size,
        volume_size: le64(fve, 16),
        normal_state: le16(fve, 12) == 4 && le16(fve, 14) == 4,
        state: [le16(fve, 12), le16(fve, 14)],
        state_size: le32(fve, 24),
        eow_offsets: [0; 2],
        kind: if sb_guid == GUID_NORMAL {
            0
        } else if sb_guid == GUID_EOW {
            1
        } else {
            2
        },
        cipher_mode,
        key_bits,
        guid: guid_text(&fve[80..96]),
        creation_time: (le64(fve, 104).saturating_sub(116_444_736_000_000_000)) / 10_000_000,
        description: String::new(),
        version: le16(fve, 10),
        metadata_offset,
        volume_header_offset: 0,
        volume_header_size: 0,
        fve_sha256: Sha256::digest(fve).into(),
        validation,
        vmks: Vec::new(),
        fvek: Wrapped::default(),
        cost_limit: Some(CostLimit::default()),
    };
    let mut have_fvek = false;
    let mut have_desc = false;
    for (s, n, ty, _value) in entries(fve, 112, 64 + meta_size)? {
        match ty {
            2 => m.vmks.push(parse_vmk(fve, s, n)?),
            3 if !have_fvek => {
                m.fvek = wrapped(fve, s, n)?;
                have_fvek = true;
            }
            0xf if n >= 24 => {
                m.volume_header_offset = le64(fve, s + 8);
                m.volume_header_size = le64(fve, s + 16);
            }
            7 if !have_desc => {
                m.description = utf16(&fve[s + 8..s + n]);
                have_desc = true;
            }
            _ => {}
        }
    }
    if !have_fvek {
        return Err(bad("FVEK entry missing"));
    }
    Ok(m)
}

/// AES-CCM decryption with a 12-byte nonce and 16-byte tag (RFC 3610,
/// L = 3), as BitLocker wraps its keys; None if the tag does not match.
fn ccm_open(key: &[u8], w: &Wrapped) -> Option<Zeroizing<Vec<u8>>> {
    use aes::cipher::{Array, BlockCipherEncrypt, KeyInit};
    let c = aes::Aes256::new_from_slice(key).ok()?;
    let enc = |b: [u8; 16]| -> [u8; 16] {
        let mut a = Array::from(b);
        c.encrypt_block(&mut a);
        a.into()
    };
    let ctr = |i: u32| {
        let mut a = [0u8; 16];
        a[0] = 2;
        a[1..13].copy_from_slice(&w.nonce);
        a[13..].copy_from_slice(&i.to_be_bytes()[1..]);
        enc(a)
    };
    let mut plain = Zeroizing::new(w.data.clone());
    for (i, chunk) in plain.chunks_mut(16).enumerate() {
        let s = ctr(i as u32 + 1);
        chunk.iter_mut().zip(s).for_each(|(p, k)| *p ^= k);
    }
    let mut b0 = [0u8; 16];
    b0[0] = (((TAG - 2) / 2) << 3) as u8 | 2;
    b0[1..13].copy_from_slice(&w.nonce);
    b0[13..].copy_from_slice(&(plain.len() as u32).to_be_bytes()[1..]);
    let mut mac = enc(b0);
    for chunk in plain.chunks(16) {
        chunk.iter().enumerate().for_each(|(i, p)| mac[i] ^= p);
        mac = enc(mac);
    }
    let s0 = ctr(0);
    let ok = mac
        .iter()
        .zip(s0)
        .zip(w.tag)
        .fold(0u8, |d, ((m, s), t)| d | (m ^ s ^ t));
    (ok == 0).then_some(plain)
}

/// Unwrap a key entry: its plaintext starts with its own length (u16)
/// and 10 more bytes before the key.
fn unwrap_key(key: &[u8], w: &Wrapped) -> Option<Zeroizing<Vec<u8>>> {
    let p = ccm_open(key, w)?;
    if p.len() < 12 || usize::from(le16(&p, 0)) != p.len() {
        return None;
    }
    Some(Zeroizing::new(p[12..].to_vec()))
}

/// BitLocker's key stretching: a million SHA-256 rounds over
/// (last, initial, salt, counter).
fn stretch(initial: &[u8; 32], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    let mut st = Zeroizing::new([0u8; 88]);
    st[32..64].copy_from_slice(initial);
    st[64..80].copy_from_slice(salt);
    for i in 0..u64::from(STRETCH_ROUNDS) {
        st[80..].copy_from_slice(&i.to_le_bytes());
        let h: [u8; 32] = Sha256::digest(&st[..]).into();
        st[..32].copy_from_slice(&h);
    }
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&st[..32]);
    out
}

/// A recovery password's 16 key bytes, if `pw` is one (8 groups of 6
/// digits, each a multiple of 11).
fn recovery_key(pw: &[u8]) -> Option<Zeroizing<[u8; 16]>> {
    let pw = pw.strip_suffix(b"\n").unwrap_or(pw);
    if pw.len() != 55 {
        return None;
    }
    let mut out = Zeroizing::new([0u8; 16]);
    for (i, group) in pw.split(|&c| c == b'-').enumerate() {
        if i >= 8 || group.len() != 6 || !group.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u32 = std::str::from_utf8(group).ok()?.parse().ok()?;
        if n % 11 != 0 || n / 11 > 0xffff {
            return None;
        }
        out[i * 2..i * 2 + 2].copy_from_slice(&((n / 11) as u16).to_le_bytes());
    }
    Some(out)
}

/// The key in a startup key file (.BEK) made for `vmk`.
fn startup_key(bek: &[u8], vmk: &Vmk, m: &Metadata) -> Option<Zeroizing<Vec<u8>>> {
    if bek.len() < 48 + 6 || guid_text(&bek[16..32]) != vmk.guid {
        return None;
    }
    if le32(bek, 4) != 1 || le32(bek, 0) as usize != bek.len() {
        return None;
    }
    if le16(bek, 50) != 6 || le16(bek, 52) != 9 {
        return None;
    }
    for (s, n, _ty, value) in entries(bek, 48 + 8 + 24, bek.len()).ok()? {
        match value {
            1 if n >= 12 => return Some(Zeroizing::new(bek[s + 12..s + n].to_vec())),
            0x17 if n >= 24 && guid_text(&bek[s + 8..s + 24]) != m.guid => return None,
            _ => {}
        }
    }
    None
}

/// The key that unwraps `vmk`, from what the user gave.
fn vmk_key(vmk: &Vmk, secret: Option<&[u8]>, m: &Metadata) -> Option<Zeroizing<Vec<u8>>> {
    match (vmk.protection, secret) {
        (Protection::ClearKey, _) => vmk.clear_key.clone(),
        (Protection::Passphrase, Some(pw)) => {
            let text = String::from_utf8_lossy(pw);
            let units: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
            let units = Zeroizing::new(units);
            let once: [u8; 32] = Sha256::digest(&units[..]).into();
            let twice: [u8; 32] = Sha256::digest(once).into();
            Some(Zeroizing::new(stretch(&twice, &vmk.salt).to_vec()))
        }
        (Protection::Recovery, Some(pw)) => {
            let rk = recovery_key(pw)?;
            let initial: [u8; 32] = Sha256::digest(&rk[..]).into();
            Some(Zeroizing::new(stretch(&initial, &vmk.salt).to_vec()))
        }
        (Protection::StartupKey, Some(bek)) => startup_key(bek, vmk, m),
        _ => None,
    }
}

impl Metadata {
    /// Refuse before any secret is tried if stretching it for every VMK a
    /// passphrase or recovery password protects is above the limit LUKS
    /// keyslots get (a stretch counted as PBKDF2-SHA256 iterations).
    pub fn check_cost(&self) -> Result<(), LuksError> {
        let Some(limit) = &self.cost_limit else {
            return Ok(());
        };
        let slots: Vec<SlotCost> = self
            .vmks
            .iter()
            .enumerate()
            .filter(|(_, v)| matches!(v.protection, Protection::Passphrase | Protection::Recovery))
            .map(|(i, _)| SlotCost {
                slot: i as u32,
                kdf: Kdf::Pbkdf2 {
                    hash: HashAlg::Sha256,
                    iterations: STRETCH_ROUNDS,
                },
                digest: None,
                key_len: 32,
                digest_len: 0,
            })
            .collect();
        limit.check_foreign(
            "BITLK VMKs protected by a passphrase (keyslot = VMK)",
            &slots,
        )
    }

    /// The FVEK, unlocked with `secret` (a passphrase, recovery password or
    /// startup key file) or, without one, through a clear key.
    pub fn volume_key(&self, secret: Option<&[u8]>) -> Result<Zeroizing<Vec<u8>>, LuksError> {
        if secret.is_some() {
            self.check_cost()?;
        }
        for vmk in &self.vmks {
            let Some(k) = vmk_key(vmk, secret, self) else {
                continue;
            };
            let Some(w) = &vmk.wrapped else { continue };
            let Some(vmk_key) = unwrap_key(&k, w) else {
                continue;
            };
            let hash = ccm_open(&vmk_key, &self.validation)
                .ok_or_else(|| bad("validation does not decrypt with the VMK"))?;
            if le16(&hash, 2) != 0 || le16(&hash, 4) != 1 || le16(&hash, 8) != 0x2005 {
                return Err(LuksError::Unsupported(
                    "BITLK metadata validation of an unknown kind".into(),
                ));
            }
            if hash[12..44] != self.fve_sha256 {
                return Err(bad("metadata hash (the metadata was changed)"));
            }
            let fvek = unwrap_key(&vmk_key, &self.fvek).ok_or_else(|| bad("FVEK"))?;
            return self.fit_key(fvek);
        }
        Err(LuksError::WrongPassphrase)
    }

    /// The FVEK as dm-crypt takes it (the 128-bit elephant key data holds
    /// two keys with padding between them).
    fn fit_key(&self, k: Zeroizing<Vec<u8>>) -> Result<Zeroizing<Vec<u8>>, LuksError> {
        let want = (self.key_bits / 8) as usize;
        if self.cipher_mode == "cbc-elephant" && want == 32 && k.len() >= 48 {
            let mut out = Zeroizing::new(k[..16].to_vec());
            out.extend_from_slice(&k[32..48]);
            return Ok(out);
        }
        if k.len() < want {
            return Err(bad("FVEK size"));
        }
        Ok(Zeroizing::new(k[..want].to_vec()))
    }

    /// Why cryptsetup would not map this volume, if it would not.
    pub fn activation_refusal(&self) -> Option<&'static str> {
        if !self.normal_state {
            return Some("This BITLK device is in an unsupported state and cannot be activated.");
        }
        match self.kind {
            0 => None,
            1 => Some("BITLK devices with type 'encrypt-on-write' cannot be activated."),
            _ => Some("BITLK devices with type 'unknown' cannot be activated."),
        }
    }

    /// `bitlkDump`'s text, as cryptsetup 2.6 prints it.
    pub fn dump_text(&self, device: &str) -> String {
        let mut t = format!(
            "Info for BITLK{} device {device}.\nVersion:      \t{}\nGUID:         \t{}\n\
             Sector size:  \t{} [bytes]\nVolume size:  \t{} [bytes]\nCreated:      \t{}\
             Description:  \t{}\nCipher name:  \taes\nCipher mode:  \t{}\nCipher key:   \t{} bits\n\nKeyslots:\n",
            if self.togo { " To Go" } else { "" },
            self.version,
            self.guid,
            self.sector_size,
            self.volume_size,
            ctime(self.creation_time),
            self.description,
            self.cipher_mode,
            self.key_bits
        );
        for (i, v) in self.vmks.iter().enumerate() {
            t.push_str(&format!(" {i}: VMK\n"));
            if let Some(n) = &v.name {
                t.push_str(&format!("\tName:       \t{n}\n"));
            }
            t.push_str(&format!(
                "\tGUID:       \t{}\n\tProtection: \t{}\n\tSalt:       \t{}\n",
                v.guid,
                v.protection.text(),
                hex::encode(v.salt)
            ));
            if let Some(k) = &v.clear_key {
                t.push_str(&format!("\tKey data size:\t{} [bytes]\n", k.len()));
            }
            if let Some(w) = &v.wrapped {
                t.push_str(&format!("\tKey data size:\t{} [bytes]\n", w.data.len()));
            }
        }
        t.push_str(&format!(
            " {}: FVEK\n\tKey data size:\t{} [bytes]\n\nMetadata segments:\n",
            self.vmks.len(),
            self.fvek.data.len()
        ));
        for (i, o) in self.metadata_offset.iter().enumerate() {
            t.push_str(&format!(
                " {i}: FVE metadata area\n\tOffset: \t{o} [bytes]\n\tSize:   \t{FVE_SIZE} [bytes]\n"
            ));
        }
        t.push_str(&format!(
            " 3: Volume header\n\tOffset: \t{} [bytes]\n\tSize:   \t{} [bytes]\n\tCipher: \taes-{}\n",
            self.volume_header_offset, self.volume_header_size, self.cipher_mode
        ));
        t
    }

    /// The table's segments over a device of `sectors` sectors, as
    /// cryptsetup lays them out (every one of them zero or crypt).
    pub fn segments(&self, sectors: u64) -> Result<Segments, LuksError> {
        let mut segs: Vec<(u64, u64, Option<u64>)> = self
            .metadata_offset
            .iter()
            .map(|o| (o / 512, FVE_SIZE / 512, None))
            .collect();
        let hs = self.volume_header_size / 512;
        segs.push((self.volume_header_offset / 512, hs, None));
        segs.push((0, hs, Some(self.volume_header_offset / 512)));
        let mut last = hs;
        loop {
            let start = segs
                .iter()
                .map(|s| s.0 + s.1)
                .filter(|&e| e < sectors && e >= last)
                .min()
                .unwrap_or(sectors);
            let end = segs
                .iter()
                .map(|s| s.0)
                .filter(|&o| o < sectors && o >= start)
                .min()
                .unwrap_or(sectors);
            if end == start {
                if end >= sectors {
                    break;
                }
                last = end + 1;
                continue;
            }
            segs.push((start, end - start, Some(start)));
            last = end;
            if end == sectors {
                break;
            }
            if segs.len() > 10 {
                return Err(bad("layout (more than 10 segments)"));
            }
        }
        segs.sort_by_key(|s| s.0);
        Ok(segs
            .into_iter()
            .map(|(start, len, iv)| (start, len, iv.map_or(Seg::Zero, Seg::Crypt)))
            .collect())
    }
}

/// `ctime`'s text in UTC (`Thu Jan  1 00:00:00 1970`), newline included.
fn ctime(t: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = t / 86400;
    let secs = t % 86400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}\n",
        DAYS[(days % 7) as usize],
        MONTHS[(m - 1) as usize],
        d,
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        y
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmk(protection: Protection) -> Vmk {
        Vmk {
            guid: String::new(),
            name: None,
            protection,
            salt: [0; 16],
            wrapped: None,
            clear_key: None,
        }
    }

    fn metadata(vmks: Vec<Vmk>) -> Metadata {
        Metadata {
            togo: false,
            sector_size: 512,
            volume_size: 0,
            normal_state: true,
            state: [4, 4],
            state_size: 0,
            eow_offsets: [0; 2],
            kind: 0,
            cipher_mode: "xts-plain64",
            key_bits: 256,
            guid: String::new(),
            creation_time: 0,
            description: String::new(),
            version: 2,
            metadata_offset: [0; 3],
            volume_header_offset: 0,
            volume_header_size: 0,
            fve_sha256: [0; 32],
            validation: Wrapped::default(),
            vmks,
            fvek: Wrapped::default(),
            cost_limit: Some(CostLimit::default()),
        }
    }

    /// Hundreds of passphrase VMKs (a million SHA-256 rounds each) are
    /// refused before the first stretch, naming the cost and the flag;
    /// the usual two pass, and `--no-kdf-limit` lifts the limit.
    #[test]
    fn many_passphrase_vmks_are_refused_before_stretching() {
        let many = metadata((0..600).map(|_| vmk(Protection::Passphrase)).collect());
        let t = std::time::Instant::now();
        let e = many
            .volume_key(Some(b"pw"))
            .expect_err("600 stretches tried");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
        let text = e.to_string();
        assert!(
            text.contains("BITLK") && text.contains("1048576") && text.contains("--no-kdf-limit"),
            "{text}"
        );
        let usual = metadata(vec![vmk(Protection::Passphrase), vmk(Protection::Recovery)]);
        usual.check_cost().unwrap();
        let lifted = Metadata {
            cost_limit: None,
            ..many
        };
        lifted.check_cost().unwrap();
        // Keys that are not stretched cost nothing.
        metadata((0..600).map(|_| vmk(Protection::StartupKey)).collect())
            .check_cost()
            .unwrap();
    }

    #[test]
    fn ctime_as_libc_in_utc() {
        assert_eq!(ctime(0), "Thu Jan  1 00:00:00 1970\n");
        assert_eq!(ctime(1_700_000_000), "Tue Nov 14 22:13:20 2023\n");
    }

    #[test]
    fn recovery_password_groups() {
        let k = recovery_key(b"235818-357951-253979-013365-241120-245575-342914-591910").unwrap();
        assert_eq!(&k[..2], &(235_818u32 / 11).to_le_bytes()[..2]);
        assert!(recovery_key(b"235819-357951-253979-013365-241120-245575-342914-591910").is_none());
        assert!(recovery_key(b"anaconda").is_none());
    }

    #[test]
    fn ccm_rfc3610_shape() {
        // A round trip through the same construction: encrypting is the
        // CTR half again, so flip a tag bit and the key must be refused.
        let key = [7u8; 32];
        let w = Wrapped {
            nonce: [1; 12],
            tag: [0; 16],
            data: vec![0; 44],
        };
        assert!(ccm_open(&key, &w).is_none());
    }

    #[test]
    fn guid_fields_are_little_endian() {
        let g = [
            0x3b, 0xd6, 0x67, 0x49, 0x29, 0x2e, 0xd8, 0x4a, 0x83, 0x99, 0xf6, 0xa3, 0x39, 0xe3,
            0xd0, 0x01,
        ];
        assert_eq!(guid_text(&g), "4967d63b-2e29-4ad8-8399-f6a339e3d001");
    }
}
