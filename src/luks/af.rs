//! The LUKS anti-forensic splitter. A volume key is stored as `stripes`
//! blocks of which all are needed to recover it, so wiping any small part of
//! a keyslot area destroys that key even on media that remap sectors.

use super::hash::HashAlg;
use zeroize::Zeroizing;

/// cryptsetup only ever uses (and only accepts) 4000 stripes.
pub const STRIPES: u32 = 4000;

/// The diffuse function ("H1" of the LUKS1 spec): every digest-sized chunk i
/// becomes hash(u32be(i) || chunk), truncated to the chunk's length.
fn diffuse(h: HashAlg, buf: &mut [u8]) {
    let dl = h.digest_len();
    for (i, chunk) in buf.chunks_mut(dl).enumerate() {
        let idx = (i as u32).to_be_bytes();
        let d = Zeroizing::new(h.digest(&[&idx, chunk]));
        let n = chunk.len();
        chunk.copy_from_slice(&d[..n]);
    }
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= *s;
    }
}

/// Recover a `key_len`-byte key from `material` (at least key_len*stripes bytes).
/// Returns None if `material` is too short or `stripes` is zero.
pub fn merge(
    h: HashAlg,
    material: &[u8],
    key_len: usize,
    stripes: u32,
) -> Option<Zeroizing<Vec<u8>>> {
    let stripes = stripes as usize;
    if stripes == 0 || key_len == 0 || material.len() < key_len.checked_mul(stripes)? {
        return None;
    }
    let mut d = Zeroizing::new(vec![0u8; key_len]);
    for s in material.chunks_exact(key_len).take(stripes - 1) {
        xor_into(&mut d, s);
        diffuse(h, &mut d);
    }
    let last = &material[(stripes - 1) * key_len..stripes * key_len];
    xor_into(&mut d, last);
    Some(d)
}

/// Split `key` into key.len()*stripes bytes; `random` fills the random stripes.
pub fn split(
    h: HashAlg,
    key: &[u8],
    stripes: u32,
    random: &mut dyn FnMut(&mut [u8]),
) -> Zeroizing<Vec<u8>> {
    let n = key.len();
    let stripes = stripes.max(1) as usize;
    let mut out = Zeroizing::new(vec![0u8; n * stripes]);
    random(&mut out[..n * (stripes - 1)]);
    let mut d = Zeroizing::new(vec![0u8; n]);
    for s in out.chunks_exact(n).take(stripes - 1) {
        xor_into(&mut d, s);
        diffuse(h, &mut d);
    }
    let last = &mut out[(stripes - 1) * n..];
    last.copy_from_slice(&d);
    xor_into(last, key);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(start: u8) -> impl FnMut(&mut [u8]) {
        let mut x = start as u32;
        move |b: &mut [u8]| {
            for v in b {
                x = x.wrapping_mul(1103515245).wrapping_add(12345);
                *v = (x >> 16) as u8;
            }
        }
    }

    #[test]
    fn split_merge_round_trip_all_hashes() {
        for h in [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha512] {
            for len in [16usize, 32, 33, 64] {
                let key: Vec<u8> = (0..len as u8).collect();
                let m = split(h, &key, STRIPES, &mut fill(7));
                assert_eq!(m.len(), len * STRIPES as usize);
                assert_eq!(&merge(h, &m, len, STRIPES).unwrap()[..], &key[..]);
                let mut bad = m.clone();
                bad[3] ^= 1;
                assert_ne!(&merge(h, &bad, len, STRIPES).unwrap()[..], &key[..]);
            }
        }
    }

    #[test]
    fn diffuse_truncates_last_chunk_and_counts_big_endian() {
        // 33 bytes with sha256: chunk 0 is 32 bytes, chunk 1 one byte.
        let mut b = [0u8; 33];
        diffuse(HashAlg::Sha256, &mut b);
        let c0 = HashAlg::Sha256.digest(&[&[0, 0, 0, 0], &[0u8; 32]]);
        let c1 = HashAlg::Sha256.digest(&[&[0, 0, 0, 1], &[0u8]]);
        assert_eq!(&b[..32], &c0[..]);
        assert_eq!(b[32], c1[0]);
    }

    #[test]
    fn merge_rejects_short_material() {
        assert!(merge(HashAlg::Sha256, &[0u8; 10], 32, STRIPES).is_none());
        assert!(merge(HashAlg::Sha256, &[0u8; 64], 32, 0).is_none());
    }
}
