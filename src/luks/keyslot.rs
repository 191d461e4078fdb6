//! Keyslot unlock and creation shared by LUKS1 and LUKS2: derive the area key
//! from the passphrase, decrypt or encrypt the AF-split key material, and
//! check a candidate volume key against the header's digest.

use super::af;
use super::cipher::area_crypt;
use super::disk::Disk;
use super::error::LuksError;
use super::hash::HashAlg;
use super::kdf::Kdf;
use zeroize::Zeroizing;

/// Where and how one keyslot's material is stored.
pub struct SlotParams<'a> {
    pub kdf: Kdf,
    pub salt: &'a [u8],
    pub af_hash: HashAlg,
    pub stripes: u32,
    /// Byte offset of the key material on the metadata device.
    pub offset: u64,
    pub encryption: &'a str,
    /// Length of the key that encrypts the area.
    pub area_key_size: usize,
    /// Length of the stored volume key.
    pub key_size: usize,
}

impl<'a> SlotParams<'a> {
    /// A LUKS2 keyslot's parameters as its JSON metadata gives them.
    pub fn luks2(k: &'a crate::luks::json::Keyslot) -> SlotParams<'a> {
        SlotParams {
            kdf: k.kdf,
            salt: &k.salt,
            af_hash: k.af_hash,
            stripes: k.stripes,
            offset: k.area_offset,
            encryption: &k.area_encryption,
            area_key_size: k.area_key_size as usize,
            key_size: k.key_size as usize,
        }
    }
}

/// Bytes of key material: AF-split key padded to 512.
pub fn material_len(key_size: usize, stripes: u32) -> usize {
    (key_size * stripes as usize).div_ceil(512) * 512
}

/// Recover the candidate volume key stored in a keyslot.
pub fn unlock(
    disk: &Disk,
    p: &SlotParams,
    passphrase: &[u8],
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let mut area_key = Zeroizing::new(vec![0u8; p.area_key_size]);
    p.kdf.derive(passphrase, p.salt, &mut area_key)?;
    let mut material = Zeroizing::new(vec![0u8; material_len(p.key_size, p.stripes)]);
    disk.read_at(p.offset, &mut material)?;
    area_crypt(p.encryption, &area_key, &mut material, false)?;
    af::merge(p.af_hash, &material, p.key_size, p.stripes)
        .ok_or_else(|| LuksError::Crypto("key material shorter than the AF stripes".into()))
}

/// Encrypt `volume_key` for a keyslot; returns the material to write at `p.offset`.
pub fn seal(
    p: &SlotParams,
    passphrase: &[u8],
    volume_key: &[u8],
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let mut area_key = Zeroizing::new(vec![0u8; p.area_key_size]);
    p.kdf.derive(passphrase, p.salt, &mut area_key)?;
    let rnd = random(volume_key.len() * (p.stripes.max(1) as usize - 1))?;
    let split = af::split(p.af_hash, volume_key, p.stripes, &mut |b| {
        b.copy_from_slice(&rnd[..b.len()])
    });
    let mut material = Zeroizing::new(vec![0u8; material_len(p.key_size, p.stripes)]);
    material[..split.len()].copy_from_slice(&split);
    area_crypt(p.encryption, &area_key, &mut material, true)?;
    Ok(material)
}

/// Random bytes as a Result, for callers that can report the failure.
pub fn random(n: usize) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let mut v = Zeroizing::new(vec![0u8; n]);
    getrandom::fill(&mut v)
        .map_err(|e| LuksError::Crypto(format!("OS random source failed: {e}")))?;
    Ok(v)
}

/// Constant-time equality.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// True if `key` is the key LUKS2 digest `d` was made from (compared in
/// constant time).
pub fn digest_matches(d: &super::json::Digest, key: &[u8]) -> bool {
    ct_eq(
        &key_digest(d.hash, key, &d.salt, d.iterations, d.digest.len()),
        &d.digest,
    )
}

/// PBKDF2 digest of a volume key, `len` bytes.
pub fn key_digest(
    hash: HashAlg,
    key: &[u8],
    salt: &[u8],
    iterations: u32,
    len: usize,
) -> Zeroizing<Vec<u8>> {
    let mut d = Zeroizing::new(vec![0u8; len]);
    hash.pbkdf2(key, salt, iterations, &mut d);
    d
}
