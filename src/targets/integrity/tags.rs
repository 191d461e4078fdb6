//! The per-sector tag: the kernel's `integrity_sector_checksum`, a hash
//! (or keyed MAC) over the superblock salt (with `FIXED_HMAC`), the
//! sector number as a little-endian u64 and the sector's data, cut or
//! zero-padded to the tag size. The sector number is in the hash so a
//! block copied to another place fails its check there.

use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroizing;

/// An internal hash of a table line (`internal_hash:ALG[:KEY]`).
pub enum Alg {
    Crc32c,
    Sha1,
    Sha256,
    HmacSha256(Zeroizing<Vec<u8>>),
    HmacSha512(Zeroizing<Vec<u8>>),
}

impl std::fmt::Debug for Alg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Alg {
    /// The algorithm named as the kernel's crypto API names it (`crc32c`,
    /// `sha256`, `hmac(sha256)`), with its key for the HMACs.
    pub fn new(name: &str, key: Option<Zeroizing<Vec<u8>>>) -> Result<Alg, String> {
        let keyed = |k: Option<Zeroizing<Vec<u8>>>| {
            k.filter(|k| !k.is_empty()).ok_or_else(|| {
                format!("internal hash {name} needs a key (internal_hash:{name}:HEXKEY)")
            })
        };
        let a = match name {
            "crc32c" => Alg::Crc32c,
            "sha1" => Alg::Sha1,
            "sha256" => Alg::Sha256,
            "hmac(sha256)" => Alg::HmacSha256(keyed(key.clone())?),
            "hmac(sha512)" => Alg::HmacSha512(keyed(key.clone())?),
            _ => {
                return Err(format!(
                    "unknown internal hash '{name}': udm has crc32c, sha1, sha256, \
                     hmac(sha256), hmac(sha512)"
                ))
            }
        };
        if key.is_some() && matches!(a, Alg::Crc32c | Alg::Sha1 | Alg::Sha256) {
            return Err(format!("internal hash {name} takes no key"));
        }
        Ok(a)
    }

    /// The kernel's name, as tables write it.
    pub fn name(&self) -> &'static str {
        match self {
            Alg::Crc32c => "crc32c",
            Alg::Sha1 => "sha1",
            Alg::Sha256 => "sha256",
            Alg::HmacSha256(_) => "hmac(sha256)",
            Alg::HmacSha512(_) => "hmac(sha512)",
        }
    }

    pub fn digest_size(&self) -> usize {
        match self {
            Alg::Crc32c => 4,
            Alg::Sha1 => 20,
            Alg::Sha256 | Alg::HmacSha256(_) => 32,
            Alg::HmacSha512(_) => 64,
        }
    }

    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Alg::HmacSha256(k) | Alg::HmacSha512(k) => Some(k),
            _ => None,
        }
    }

    /// The tag of the block at logical sector `sector` holding `data`,
    /// into `out` (the tag size: a longer digest is cut, a shorter one
    /// padded with zeros).
    pub fn tag(&self, salt: Option<&[u8]>, sector: u64, data: &[u8], out: &mut [u8]) {
        let s = sector.to_le_bytes();
        let d = self.digest(&[salt.unwrap_or(&[]), &s[..], data]);
        let m = self.digest_size().min(out.len());
        out[..m].copy_from_slice(&d[..m]);
        out[m..].fill(0);
    }

    /// The digest (or MAC) of `parts` one after the other, in the first
    /// [`Alg::digest_size`] bytes; also `journal_mac`'s section and
    /// superblock MACs.
    pub fn digest(&self, parts: &[&[u8]]) -> [u8; 64] {
        let mut d = [0u8; 64];
        let n = self.digest_size();
        match self {
            Alg::Crc32c => {
                let mut c = !0u32;
                for p in parts {
                    c = crc32c_update(c, p);
                }
                d[..4].copy_from_slice(&(!c).to_le_bytes());
            }
            Alg::Sha1 => digest::<Sha1>(parts, &mut d[..n]),
            Alg::Sha256 => digest::<Sha256>(parts, &mut d[..n]),
            Alg::HmacSha256(k) => hmac::<Hmac<Sha256>>(k, parts, &mut d[..n]),
            Alg::HmacSha512(k) => hmac::<Hmac<Sha512>>(k, parts, &mut d[..n]),
        }
        d
    }
}

// Digests go into the caller's buffer (`out`, the digest's size): a tag
// is computed per sector, and a heap buffer per sector showed in profiles.
fn digest<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
    let mut h = D::new();
    for p in parts {
        h.update(p);
    }
    out.copy_from_slice(&h.finalize());
}

fn hmac<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]], out: &mut [u8]) {
    // A key of any length is valid for HMAC, so this cannot fail.
    let Ok(mut m) = <M as KeyInit>::new_from_slice(key) else {
        return;
    };
    for p in parts {
        m.update(p);
    }
    out.copy_from_slice(&m.finalize().into_bytes());
}

/// CRC-32C (Castagnoli), the kernel's `crc32c` without its final
/// inversion: `c` is the running register, `!0` to start. The `crc32c`
/// crate uses the CPU's CRC32 instruction (SSE 4.2) when it has one; a
/// byte-wise table ran at a few hundred MB/s and was 30 % of a J-mode
/// write's server CPU.
pub fn crc32c_update(c: u32, data: &[u8]) -> u32 {
    // The crate keeps the register inverted between calls.
    !crc32c::crc32c_append(!c, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C over "123456789".
        assert_eq!(!crc32c_update(!0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn tags_depend_on_sector_salt_and_data() {
        let a = Alg::new("crc32c", None).unwrap();
        let data = [7u8; 512];
        let mut t0 = [0u8; 4];
        let mut t1 = [0u8; 4];
        a.tag(None, 0, &data, &mut t0);
        a.tag(None, 1, &data, &mut t1);
        assert_ne!(t0, t1);
        a.tag(Some(&[1; 16]), 0, &data, &mut t1);
        assert_ne!(t0, t1);
        let s = Alg::new("sha256", None).unwrap();
        let mut long = [0xffu8; 40];
        s.tag(None, 0, &data, &mut long);
        assert_eq!(&long[32..], &[0; 8]);
        assert!(Alg::new("hmac(sha256)", None).unwrap_err().contains("key"));
        assert!(Alg::new("md5", None).unwrap_err().contains("udm has"));
        let h = Alg::new("hmac(sha512)", Some(Zeroizing::new(vec![1; 64]))).unwrap();
        let mut t = [0u8; 64];
        h.tag(None, 0, &data, &mut t);
        assert_ne!(t, [0; 64]);
    }
}
