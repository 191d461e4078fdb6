//! The hash functions LUKS headers may name (hash-spec, af.hash, checksum_alg,
//! digest hash), resolved once from their cryptsetup spelling so the rest of
//! the code never matches on strings.

use sha2::Digest;

/// A hash usable for PBKDF2, the AF diffuse function and header checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashAlg {
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
    /// cryptsetup's default plain-mode hash, and an old LUKS1 hash-spec.
    Ripemd160,
    /// An old LUKS1 hash-spec (cryptsetup's test images carry it).
    Whirlpool,
}

impl HashAlg {
    /// Parse a cryptsetup hash name (lowercase, as stored in headers).
    pub fn from_name(name: &str) -> Option<HashAlg> {
        Some(match name {
            "sha1" => HashAlg::Sha1,
            "sha224" => HashAlg::Sha224,
            "sha256" => HashAlg::Sha256,
            "sha384" => HashAlg::Sha384,
            "sha512" => HashAlg::Sha512,
            "ripemd160" => HashAlg::Ripemd160,
            "whirlpool" => HashAlg::Whirlpool,
            _ => return None,
        })
    }

    /// The name as written into headers.
    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha1 => "sha1",
            HashAlg::Sha224 => "sha224",
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha384 => "sha384",
            HashAlg::Sha512 => "sha512",
            HashAlg::Ripemd160 => "ripemd160",
            HashAlg::Whirlpool => "whirlpool",
        }
    }

    /// Digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            HashAlg::Sha1 => 20,
            HashAlg::Sha224 => 28,
            HashAlg::Sha256 => 32,
            HashAlg::Sha384 => 48,
            HashAlg::Sha512 => 64,
            HashAlg::Ripemd160 => 20,
            HashAlg::Whirlpool => 64,
        }
    }

    /// Hash the concatenation of `parts`; returns `len()` bytes.
    pub fn digest(self, parts: &[&[u8]]) -> Vec<u8> {
        fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
            let mut h = D::new();
            for p in parts {
                h.update(p);
            }
            h.finalize().to_vec()
        }
        match self {
            HashAlg::Sha1 => run::<sha1::Sha1>(parts),
            HashAlg::Sha224 => run::<sha2::Sha224>(parts),
            HashAlg::Sha256 => run::<sha2::Sha256>(parts),
            HashAlg::Sha384 => run::<sha2::Sha384>(parts),
            HashAlg::Sha512 => run::<sha2::Sha512>(parts),
            HashAlg::Ripemd160 => run::<ripemd::Ripemd160>(parts),
            HashAlg::Whirlpool => run::<whirlpool::Whirlpool>(parts),
        }
    }

    /// PBKDF2-HMAC with this hash, filling `out`.
    pub fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        use pbkdf2::pbkdf2_hmac;
        match self {
            HashAlg::Sha1 => pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, out),
            HashAlg::Sha224 => pbkdf2_hmac::<sha2::Sha224>(password, salt, iterations, out),
            HashAlg::Sha256 => pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, out),
            HashAlg::Sha384 => pbkdf2_hmac::<sha2::Sha384>(password, salt, iterations, out),
            HashAlg::Sha512 => pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, out),
            HashAlg::Ripemd160 => pbkdf2_hmac::<ripemd::Ripemd160>(password, salt, iterations, out),
            HashAlg::Whirlpool => {
                pbkdf2_hmac::<whirlpool::Whirlpool>(password, salt, iterations, out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbkdf2_rfc6070_vector() {
        let mut out = [0u8; 20];
        HashAlg::Sha1.pbkdf2(b"password", b"salt", 2, &mut out);
        assert_eq!(hex::encode(out), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
    }

    /// ISO/IEC 10118-3 "abc" digests; the PBKDF2 outputs were checked
    /// against OpenSSL's `kdf PBKDF2` (legacy provider) on the same input.
    #[test]
    fn whirlpool_and_ripemd160_known_answers() {
        assert_eq!(
            hex::encode(HashAlg::Whirlpool.digest(&[b"a", b"bc"])),
            "4e2448a4c6f486bb16b6562c73b4020bf3043e3a731bce721ae1b303d97e6d4c\
             7181eebdb6c57e277d0e34957114cbd6c797fc9d95d8b582d225292076d4eef5"
        );
        assert_eq!(
            hex::encode(HashAlg::Ripemd160.digest(&[b"abc"])),
            "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc"
        );
        let mut out = [0u8; 64];
        HashAlg::Whirlpool.pbkdf2(b"password", b"salt", 2, &mut out);
        assert_eq!(
            hex::encode(out),
            "110b2e4266f03c334f6085bf421a68d6976a2f767e0bb6041a9c9315ec0d249f\
             c8cb5fac1f9f3b87dbb98e9b4b220dfe0d6b55f88109dd558c30f0a0356f7d9f"
        );
        let mut out = [0u8; 20];
        HashAlg::Ripemd160.pbkdf2(b"password", b"salt", 2, &mut out);
        assert_eq!(hex::encode(out), "768dcc27b7bfdef794a1ff9d935090fcf598555e");
    }

    #[test]
    fn names_round_trip() {
        for h in [
            HashAlg::Sha1,
            HashAlg::Sha224,
            HashAlg::Sha256,
            HashAlg::Sha384,
            HashAlg::Sha512,
            HashAlg::Ripemd160,
            HashAlg::Whirlpool,
        ] {
            assert_eq!(HashAlg::from_name(h.name()), Some(h));
            assert_eq!(h.digest(&[b"x"]).len(), h.digest_len());
        }
        assert_eq!(HashAlg::from_name("SHA256"), None);
    }
}
