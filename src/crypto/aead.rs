//! [`SectorAead`]: dm-crypt's authenticated mode (`integrity:<bytes>:aead`),
//! one sector at a time, with exactly the bytes the kernel writes.
//!
//! Why a type of its own and not a [`super::SectorCrypt`] variant: an AEAD
//! sector has an output beside the data (the tag, and for `-random` the IV
//! that must be stored because it cannot be recomputed), and decryption can
//! fail. The crypt target keeps both in the tag area of the dm-integrity
//! device below it.
//!
//! The layout follows dm-crypt's `crypt_convert_block_aead`:
//! - associated data: the sector number relative to the target (little
//!   endian, 8 bytes, without `iv_offset`), then the IV;
//! - the IV: random per write (`-random`), or `plain64`/`plain` of the
//!   cc_sector (shifted for `iv_large_sectors`);
//! - the per-sector tuple on the integrity device: the auth tag, then the
//!   IV when it is random, then zeros up to the tuple size.
//!
//! Ciphers: `gcm(aes)` (AES-128/256), `rfc7539(chacha20,poly1305)` (both
//! through `ring`, 12-byte IV), and `authenc(hmac(sha256|sha512),xts(aes))`:
//! XTS with the IV as its tweak input, then an HMAC over associated data
//! and ciphertext (the kernel's `authenc` template), truncated to the tag
//! size. The dm-crypt key of `authenc` is the XTS key followed by the
//! HMAC key (dm-crypt's `crypt_copy_authenckey` takes them in that order).

use hmac::{Hmac, KeyInit, Mac};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::Zeroizing;

use super::block::Block;
use super::spec;
use super::tfm::Tfm;
use super::CryptoError;
use crate::mem::Locked;

/// How a sector's IV is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AeadIv {
    /// Random per write, stored in the tag area.
    Random,
    /// The 64-bit little-endian sector, zero padded.
    Plain64,
    /// The low 32 bits of the sector, little endian, zero padded.
    Plain,
}

/// The MAC of `authenc`.
enum MacKey {
    Sha256(Hmac<sha2::Sha256>),
    Sha512(Hmac<sha2::Sha512>),
}

/// The keyed cipher; on locked pages, wiped on drop.
// One per device, built once and never moved on the I/O path, so the size
// difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Kind {
    /// GCM or ChaCha20-Poly1305: `ring` does both halves.
    Ring(LessSafeKey),
    /// XTS then HMAC.
    Authenc { xts: Tfm, mac: MacKey },
}

/// A keyed dm-crypt AEAD sector transform. Send + Sync; no key in Debug.
pub struct SectorAead {
    spec_text: String,
    kind: Locked<Kind>,
    iv: AeadIv,
    iv_size: usize,
    tag_size: usize,
    tuple: usize,
    sector_size: u32,
    shift: u32,
    iv_large: bool,
}

impl std::fmt::Debug for SectorAead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorAead")
            .field("spec", &self.spec_text)
            .field("tag_size", &self.tag_size)
            .field("iv", &self.iv)
            .field("tuple", &self.tuple)
            .field("key", &"<hidden>")
            .finish()
    }
}

/// A sector whose tag did not match: its index in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthFailed(pub usize);

/// The cipher of an AEAD spec: what it is, how its key splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    Gcm,
    ChaPoly,
    AuthencSha256,
    AuthencSha512,
}

/// Whether `spec` names a cipher that only runs as an AEAD (so a crypt
/// line with it needs `integrity:<bytes>:aead`).
pub fn is_aead_spec(spec: &str) -> bool {
    parse(spec).is_ok()
}

/// `capi:gcm(aes)-IV`, `aes-gcm-IV`, `capi:rfc7539(chacha20,poly1305)-IV`,
/// `capi:authenc(hmac(sha256|sha512),xts(aes))-IV`.
fn parse(spec: &str) -> Result<(Alg, AeadIv), CryptoError> {
    let (api, iv) = spec
        .rsplit_once('-')
        .ok_or_else(|| CryptoError::new(format!("cipher spec '{spec}': IV mechanism required")))?;
    let alg = match api {
        "capi:gcm(aes)" | "aes-gcm" => Alg::Gcm,
        "capi:rfc7539(chacha20,poly1305)" => Alg::ChaPoly,
        "capi:authenc(hmac(sha256),xts(aes))" => Alg::AuthencSha256,
        "capi:authenc(hmac(sha512),xts(aes))" => Alg::AuthencSha512,
        _ => {
            return Err(CryptoError::new(format!(
                "cipher spec '{spec}' is not an AEAD udm supports (capi:gcm(aes)-random, \
                 capi:rfc7539(chacha20,poly1305)-random, \
                 capi:authenc(hmac(sha256|sha512),xts(aes))-random|plain64)"
            )))
        }
    };
    let iv = match iv {
        "random" => AeadIv::Random,
        "plain64" => AeadIv::Plain64,
        "plain" => AeadIv::Plain,
        _ => {
            return Err(CryptoError::new(format!(
                "cipher spec '{spec}': IV mode '{iv}' is not supported with an AEAD \
                 (random, plain64, plain)"
            )))
        }
    };
    Ok((alg, iv))
}

/// Key the `ring` AEAD of `alg` (GCM: AES-128 or AES-256).
fn ring_key(spec: &str, alg: Alg, key: &[u8]) -> Result<LessSafeKey, CryptoError> {
    let which = match (alg, key.len()) {
        (Alg::Gcm, 16) => &aead::AES_128_GCM,
        (Alg::Gcm, 32) => &aead::AES_256_GCM,
        (Alg::ChaPoly, 32) => &aead::CHACHA20_POLY1305,
        (Alg::Gcm, n) => {
            return Err(CryptoError::key(format!(
                "cipher spec '{spec}': a key of {} bits; gcm(aes) takes 128 or 256",
                n * 8
            )))
        }
        (_, n) => {
            return Err(CryptoError::key(format!(
                "cipher spec '{spec}': a key of {} bits; chacha20-poly1305 takes 256",
                n * 8
            )))
        }
    };
    let k = UnboundKey::new(which, key)
        .map_err(|_| CryptoError::key(format!("cipher spec '{spec}': the key was refused")))?;
    Ok(LessSafeKey::new(k))
}

/// Key `authenc`: the XTS key, then the HMAC key of the digest's size.
fn authenc_key(spec: &str, alg: Alg, key: &[u8]) -> Result<Kind, CryptoError> {
    let mac_len = if alg == Alg::AuthencSha256 { 32 } else { 64 };
    let xts_len = key.len().saturating_sub(mac_len);
    if !matches!(xts_len, 32 | 64) {
        return Err(CryptoError::key(format!(
            "cipher spec '{spec}': a key of {} bits; authenc takes the XTS key (256 or 512 \
             bits) followed by a {}-bit HMAC key",
            key.len() * 8,
            mac_len * 8
        )));
    }
    let (xk, mk) = key.split_at(xts_len);
    let xspec = spec::parse("aes-xts-plain64")?;
    let xts = Tfm::new(spec, &xspec, xk)?;
    let bad = |_| CryptoError::key(format!("cipher spec '{spec}': the HMAC key was refused"));
    let mac = if alg == Alg::AuthencSha256 {
        MacKey::Sha256(Hmac::new_from_slice(mk).map_err(bad)?)
    } else {
        MacKey::Sha512(Hmac::new_from_slice(mk).map_err(bad)?)
    };
    Ok(Kind::Authenc { xts, mac })
}

impl SectorAead {
    /// Key a transform. `tuple` is the `integrity:<bytes>` of the table:
    /// the auth tag, then the stored IV (random IVs only), fill the rest.
    pub fn new(
        spec_text: &str,
        key: &[u8],
        tuple: usize,
        sector_size: u32,
        iv_large_sectors: bool,
    ) -> Result<SectorAead, CryptoError> {
        let (alg, iv) = parse(spec_text)?;
        if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(CryptoError::new(format!(
                "sector size {sector_size} is invalid (a power of two from 512 to 4096)"
            )));
        }
        let (kind, iv_size, max_tag) = match alg {
            Alg::Gcm | Alg::ChaPoly => (Kind::Ring(ring_key(spec_text, alg, key)?), 12, 16),
            Alg::AuthencSha256 => (authenc_key(spec_text, alg, key)?, 16, 32),
            Alg::AuthencSha512 => (authenc_key(spec_text, alg, key)?, 16, 64),
        };
        let stored = if iv == AeadIv::Random { iv_size } else { 0 };
        let tag_size = tuple.saturating_sub(stored);
        // ring's tags are whole; authenc may truncate the HMAC (as the
        // kernel's setauthsize allows), never to nothing.
        let fits = match kind {
            Kind::Ring(_) => tag_size == 16,
            Kind::Authenc { .. } => (1..=max_tag).contains(&tag_size),
        };
        if !fits {
            return Err(CryptoError::new(format!(
                "cipher spec '{spec_text}' with integrity:{tuple}: the tag would be {tag_size} \
                 bytes (the tuple less a stored IV of {stored}); this cipher's tag is {}",
                if max_tag == 16 {
                    "16 bytes".to_string()
                } else {
                    format!("1 to {max_tag} bytes")
                }
            )));
        }
        let step = sector_size / 512;
        Ok(SectorAead {
            spec_text: spec_text.to_string(),
            kind: Locked::new(kind),
            iv,
            iv_size,
            tag_size,
            tuple,
            sector_size,
            shift: step.trailing_zeros(),
            iv_large: iv_large_sectors,
        })
    }

    /// Bytes of the tag area one sector uses (the table's `integrity:` size).
    pub fn tuple_size(&self) -> usize {
        self.tuple
    }

    /// The encryption unit in bytes.
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    /// Encrypt whole sectors in place and write their tuples (`stride`
    /// bytes apart in `tags`, at least the tuple size). `cc_sector` is the
    /// dm-crypt sector of `data[0]` (iv_offset included), `rel_sector` the
    /// same without iv_offset (what the associated data names).
    pub fn seal(
        &self,
        data: &mut [u8],
        tags: &mut [u8],
        stride: usize,
        cc_sector: u64,
        rel_sector: u64,
    ) -> Result<(), CryptoError> {
        let ss = self.sector_size as usize;
        let step = u64::from(self.sector_size / 512);
        if !self.fits(data.len(), tags.len(), stride) {
            return Err(CryptoError::new(format!(
                "AEAD seal: {} data bytes need {} tag bytes at a stride of {stride}, got {}",
                data.len(),
                data.len() / ss * stride,
                tags.len()
            )));
        }
        for (k, (sector, tuple)) in data
            .chunks_exact_mut(ss)
            .zip(tags.chunks_exact_mut(stride))
            .enumerate()
        {
            let k = k as u64;
            let mut iv = [0u8; 16];
            self.make_iv(&mut iv, cc_sector.wrapping_add(k * step))?;
            let iv = &iv[..self.iv_size];
            let aad = aad(rel_sector.wrapping_add(k * step), iv);
            let (tag, rest) = tuple.split_at_mut(self.tag_size);
            self.encrypt_one(sector, &aad[..8 + self.iv_size], iv, tag)?;
            let stored = if self.iv == AeadIv::Random {
                rest[..self.iv_size].copy_from_slice(iv);
                self.iv_size
            } else {
                0
            };
            rest[stored..].fill(0);
        }
        Ok(())
    }

    /// Check and decrypt whole sectors in place; the first sector whose
    /// tag does not match is the error (its data is left undecrypted).
    pub fn open(
        &self,
        data: &mut [u8],
        tags: &[u8],
        stride: usize,
        cc_sector: u64,
        rel_sector: u64,
    ) -> Result<(), AuthFailed> {
        let ss = self.sector_size as usize;
        let step = u64::from(self.sector_size / 512);
        if !self.fits(data.len(), tags.len(), stride) {
            return Err(AuthFailed(0));
        }
        for (k, (sector, tuple)) in data
            .chunks_exact_mut(ss)
            .zip(tags.chunks_exact(stride))
            .enumerate()
        {
            let n = k as u64;
            let (tag, rest) = tuple.split_at(self.tag_size);
            let mut iv = [0u8; 16];
            if self.iv == AeadIv::Random {
                iv[..self.iv_size].copy_from_slice(&rest[..self.iv_size]);
            } else {
                self.make_iv(&mut iv, cc_sector.wrapping_add(n * step))
                    .map_err(|_| AuthFailed(k))?;
            }
            let iv = &iv[..self.iv_size];
            let aad = aad(rel_sector.wrapping_add(n * step), iv);
            if !self.decrypt_one(sector, &aad[..8 + self.iv_size], iv, tag) {
                return Err(AuthFailed(k));
            }
        }
        Ok(())
    }

    /// Whole sectors, a stride that holds the tuple, and a tag for each.
    fn fits(&self, data: usize, tags: usize, stride: usize) -> bool {
        let ss = self.sector_size as usize;
        data % ss == 0 && stride >= self.tuple && tags == data / ss * stride
    }

    fn make_iv(&self, iv: &mut [u8; 16], cc_sector: u64) -> Result<(), CryptoError> {
        let s = if self.iv_large {
            cc_sector >> self.shift
        } else {
            cc_sector
        };
        match self.iv {
            AeadIv::Random => getrandom::fill(&mut iv[..self.iv_size])
                .map_err(|e| CryptoError::new(format!("random IV: the OS generator failed: {e}"))),
            AeadIv::Plain64 => {
                iv[..8].copy_from_slice(&s.to_le_bytes());
                Ok(())
            }
            AeadIv::Plain => {
                iv[..4].copy_from_slice(&(s as u32).to_le_bytes());
                Ok(())
            }
        }
    }

    fn encrypt_one(
        &self,
        sector: &mut [u8],
        aad: &[u8],
        iv: &[u8],
        tag: &mut [u8],
    ) -> Result<(), CryptoError> {
        match &*self.kind {
            Kind::Ring(k) => {
                let nonce = Nonce::try_assume_unique_for_key(iv)
                    .map_err(|_| CryptoError::new("AEAD nonce of the wrong size"))?;
                let t = k
                    .seal_in_place_separate_tag(nonce, Aad::from(aad), sector)
                    .map_err(|_| CryptoError::new("AEAD seal refused the sector"))?;
                tag.copy_from_slice(t.as_ref());
            }
            Kind::Authenc { xts, mac } => {
                xts.one(sector, &tweak(iv), true);
                tag.copy_from_slice(&mac.tag(aad, sector)[..tag.len()]);
            }
        }
        Ok(())
    }

    fn decrypt_one(&self, sector: &mut [u8], aad: &[u8], iv: &[u8], tag: &[u8]) -> bool {
        match &*self.kind {
            Kind::Ring(k) => {
                let Ok(nonce) = Nonce::try_assume_unique_for_key(iv) else {
                    return false;
                };
                let Ok(tag) = <[u8; 16]>::try_from(tag) else {
                    return false;
                };
                k.open_in_place_separate_tag(
                    nonce,
                    Aad::from(aad),
                    aead::Tag::from(tag),
                    sector,
                    0..,
                )
                .is_ok()
            }
            Kind::Authenc { xts, mac } => {
                if !mac.verify(aad, sector, tag) {
                    return false;
                }
                xts.one(sector, &tweak(iv), false);
                true
            }
        }
    }
}

impl MacKey {
    /// Whether `tag` is the leading bytes of the HMAC (constant time).
    fn verify(&self, aad: &[u8], ct: &[u8], tag: &[u8]) -> bool {
        match self {
            MacKey::Sha256(m) => {
                let mut m = m.clone();
                m.update(aad);
                m.update(ct);
                m.verify_truncated_left(tag).is_ok()
            }
            MacKey::Sha512(m) => {
                let mut m = m.clone();
                m.update(aad);
                m.update(ct);
                m.verify_truncated_left(tag).is_ok()
            }
        }
    }

    /// The whole HMAC of associated data then ciphertext, wiped on drop.
    fn tag(&self, aad: &[u8], ct: &[u8]) -> Zeroizing<Vec<u8>> {
        match self {
            MacKey::Sha256(m) => {
                let mut m = m.clone();
                m.update(aad);
                m.update(ct);
                Zeroizing::new(m.finalize().into_bytes().to_vec())
            }
            MacKey::Sha512(m) => {
                let mut m = m.clone();
                m.update(aad);
                m.update(ct);
                Zeroizing::new(m.finalize().into_bytes().to_vec())
            }
        }
    }
}

/// The associated data: relative sector (LE64), then the IV.
fn aad(rel_sector: u64, iv: &[u8]) -> [u8; 24] {
    let mut a = [0u8; 24];
    a[..8].copy_from_slice(&rel_sector.to_le_bytes());
    a[8..8 + iv.len()].copy_from_slice(iv);
    a
}

fn tweak(iv: &[u8]) -> Block {
    let mut b = [0u8; 16];
    b[..iv.len()].copy_from_slice(iv);
    Block::from(b)
}

#[cfg(test)]
#[path = "aead_tests.rs"]
mod tests;
