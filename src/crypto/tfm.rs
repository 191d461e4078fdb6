//! One keyed transform of a [`super::SectorCrypt`] (one `keycount` slot):
//! the chain mode over its block cipher, and the ESSIV salt cipher when
//! the IV mode is ESSIV. Built once per key, never moved on the I/O path.

use sha2::Digest;
use zeroize::{Zeroize, Zeroizing};

use super::adiantum::{Adiantum, Rounds};
use super::block::{Block, BlockCipher};
use super::block64::Cipher64;
use super::lrw::Lrw;
use super::modes;
use super::spec::{Alg, Chain, CipherSpec, EssivHash, IvMode};
use super::CryptoError;

// One per transform, built once and never moved on the I/O path, so the
// size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Kind {
    Null,
    Ecb(BlockCipher),
    Cbc(BlockCipher),
    Xts {
        k1: BlockCipher,
        k2: BlockCipher,
        #[cfg(target_arch = "x86_64")]
        fast: Option<super::xts_vaes::VaesXts>,
    },
    Lrw(Box<Lrw>),
    Ecb64(Cipher64),
    Cbc64(Cipher64),
    /// `high`: the IV mode puts its value at the end of the 32-byte IV
    /// (plain64be, benbi), so the 16-byte IV block is the tweak's upper half.
    Adiantum {
        a: Box<Adiantum>,
        high: bool,
    },
}

/// ESSIV's salt cipher: the volume's cipher keyed with the key's hash.
// One per transform, like `Kind`.
#[allow(clippy::large_enum_variant)]
pub(super) enum Essiv {
    B16(BlockCipher),
    B8(Cipher64),
}

pub(super) struct Tfm {
    pub kind: Kind,
    pub essiv: Option<Essiv>,
}

/// Prefix a key-construction error with the spec, keeping its kind.
fn in_spec(spec_text: &str) -> impl Fn(CryptoError) -> CryptoError + '_ {
    move |e: CryptoError| {
        let msg = format!("cipher spec '{spec_text}': {e}");
        if e.about_key() {
            CryptoError::key(msg)
        } else {
            CryptoError::new(msg)
        }
    }
}

fn xts_kind(spec_text: &str, alg: Alg, key: &[u8]) -> Result<Kind, CryptoError> {
    if key.len() % 2 != 0 {
        return Err(CryptoError::key(format!(
            "cipher spec '{spec_text}': an XTS key must have two halves of equal size, got {} bits",
            key.len() * 8
        )));
    }
    let (a, b) = key.split_at(key.len() / 2);
    let k1 = BlockCipher::new(alg, a).map_err(|e| {
        CryptoError::key(format!(
            "cipher spec '{spec_text}': XTS key of {} bits: each half {e}",
            key.len() * 8
        ))
    })?;
    let k2 = BlockCipher::new(alg, b).map_err(in_spec(spec_text))?;
    Ok(Kind::Xts {
        #[cfg(target_arch = "x86_64")]
        fast: if alg == Alg::Aes {
            super::xts_vaes::VaesXts::new(a, b)
        } else {
            None
        },
        k1,
        k2,
    })
}

impl Tfm {
    /// Key one transform with its share of the dm-crypt key.
    pub fn new(spec_text: &str, spec: &CipherSpec, key: &[u8]) -> Result<Tfm, CryptoError> {
        let ctx = in_spec(spec_text);
        let wide = spec.alg.block_size() == 16;
        let kind = match (spec.alg, spec.chain) {
            (Alg::Null, _) => Kind::Null,
            (alg, Chain::Ecb) if wide => Kind::Ecb(BlockCipher::new(alg, key).map_err(&ctx)?),
            (alg, Chain::Cbc) if wide => Kind::Cbc(BlockCipher::new(alg, key).map_err(&ctx)?),
            (alg, Chain::Ecb) => Kind::Ecb64(Cipher64::new(alg, key).map_err(&ctx)?),
            (alg, Chain::Cbc) => Kind::Cbc64(Cipher64::new(alg, key).map_err(&ctx)?),
            (alg, Chain::Xts) => xts_kind(spec_text, alg, key)?,
            (alg, Chain::Lrw) => Kind::Lrw(Box::new(Lrw::new(alg, key).map_err(&ctx)?)),
            (alg, Chain::Adiantum) => {
                let r = if alg == Alg::XChaCha20Aes {
                    Rounds::R20
                } else {
                    Rounds::R12
                };
                Kind::Adiantum {
                    a: Box::new(Adiantum::new(r, key).map_err(&ctx)?),
                    high: matches!(spec.iv, IvMode::Plain64Be | IvMode::Benbi),
                }
            }
        };
        let essiv = match spec.iv {
            IvMode::Essiv(h) => {
                let salt = essiv_salt(h, key);
                Some(if wide {
                    Essiv::B16(BlockCipher::new(spec.alg, &salt).map_err(&ctx)?)
                } else {
                    Essiv::B8(Cipher64::new(spec.alg, &salt).map_err(&ctx)?)
                })
            }
            _ => None,
        };
        Ok(Tfm { kind, essiv })
    }

    /// Encrypt the plain IVs of `ivs` with the ESSIV salt cipher, if any.
    pub fn essiv(&self, ivs: &mut [Block]) {
        match &self.essiv {
            None => {}
            Some(Essiv::B16(c)) => c.encrypt_blocks(ivs),
            Some(Essiv::B8(c)) => ivs
                .iter_mut()
                .for_each(|iv| c.encrypt_block(&mut iv.0[..8])),
        }
    }

    /// Consecutive units of `ss` bytes, `ivs[k]` the IV of unit k (the
    /// portable path; the vectorised AES-XTS is the caller's).
    pub fn run(&self, ss: usize, data: &mut [u8], ivs: &mut [Block], encrypt: bool) {
        match &self.kind {
            Kind::Null => {}
            Kind::Ecb(c) => modes::ecb(c, data, encrypt),
            Kind::Ecb64(c) => c.ecb(data, encrypt),
            Kind::Cbc(c) if encrypt => modes::cbc_encrypt(c, ss, data, ivs),
            Kind::Cbc(c) => modes::cbc_decrypt(c, ss, data, ivs),
            Kind::Xts { k1, k2, .. } => modes::xts(k1, k2, ss, data, ivs, encrypt),
            Kind::Lrw(l) => {
                for (unit, iv) in data.chunks_exact_mut(ss).zip(ivs.iter()) {
                    l.sector(unit, iv, encrypt);
                }
            }
            Kind::Cbc64(c) => {
                for (unit, iv) in data.chunks_exact_mut(ss).zip(ivs.iter()) {
                    c.cbc(unit, &iv.0[..8], encrypt);
                }
            }
            Kind::Adiantum { a, high } => {
                let at = if *high { 16 } else { 0 };
                for (unit, iv) in data.chunks_exact_mut(ss).zip(ivs.iter()) {
                    let mut tweak = [0u8; 32];
                    tweak[at..at + 16].copy_from_slice(&iv.0);
                    a.crypt(unit, &tweak, encrypt);
                }
            }
        }
    }

    /// One unit with a given IV (the IV modes that look at the data).
    pub fn one(&self, unit: &mut [u8], iv: &Block, encrypt: bool) {
        let mut ivs = [*iv];
        self.run(unit.len(), unit, &mut ivs, encrypt);
    }
}

/// ESSIV's salt, the hash of the transform's key, in a buffer wiped on
/// drop (sha2's and whirlpool's hashers wipe themselves when finalized
/// with their `zeroize` feature).
fn essiv_salt(h: EssivHash, key: &[u8]) -> Zeroizing<Vec<u8>> {
    fn run<D: Digest>(key: &[u8], keep: usize) -> Zeroizing<Vec<u8>> {
        let mut d = D::new();
        d.update(key);
        let mut out = d.finalize();
        let salt = Zeroizing::new(out[..keep.min(out.len())].to_vec());
        out.as_mut_slice().zeroize();
        salt
    }
    match h {
        EssivHash::Sha1 => run::<sha1::Sha1>(key, 20),
        EssivHash::Sha256 => run::<sha2::Sha256>(key, 32),
        EssivHash::Sha512 => run::<sha2::Sha512>(key, 64),
        EssivHash::Rmd160 => run::<ripemd::Ripemd160>(key, 20),
        EssivHash::Wp256 => run::<whirlpool::Whirlpool>(key, 32),
        EssivHash::Wp384 => run::<whirlpool::Whirlpool>(key, 48),
        EssivHash::Wp512 => run::<whirlpool::Whirlpool>(key, 64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essiv_salt_is_the_hash_of_the_key_and_the_hashers_wipe_themselves() {
        fn wipes_on_drop<T: zeroize::ZeroizeOnDrop>() {}
        // Fails to build without the hash crates' `zeroize` feature: the
        // hasher would keep the key in its block buffer after use.
        wipes_on_drop::<sha2::Sha256>();
        wipes_on_drop::<whirlpool::Whirlpool>();
        let key = [0x5au8; 32];
        let want: [u8; 32] = sha2::Sha256::digest(key).into();
        assert_eq!(&essiv_salt(EssivHash::Sha256, &key)[..], &want[..]);
        let wp = whirlpool::Whirlpool::digest(key);
        assert_eq!(&essiv_salt(EssivHash::Wp256, &key)[..], &wp[..32]);
        assert_eq!(essiv_salt(EssivHash::Wp384, &key).len(), 48);
    }
}
