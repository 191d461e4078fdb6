//! Known answers for the ciphers and IV modes beyond AES-XTS, through the
//! whole [`SectorCrypt`] path (key split, IV generation, chain mode). The
//! digests were computed with python3-cryptography (OpenSSL's ciphers,
//! with the IV rules written out from dm-crypt's documentation: plain64
//! little-endian, benbi big-endian `(sector << (9 - log2(block))) + 1` at
//! the IV's end, ESSIV the IV encrypted under the key's hash, eboiv the
//! byte offset encrypted under the key, tcw's seed and CRC32 whitening):
//! three 512-byte sectors of bytes `i mod 256` from sector 7, keyed with
//! bytes 0, 1, 2, ...

use sha2::{Digest, Sha256};

use super::SectorCrypt;

fn digest(spec: &str, key_len: usize) -> String {
    let key: Vec<u8> = (0..key_len as u8).collect();
    let c = SectorCrypt::new(spec, &key, 512, false).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let plain: Vec<u8> = (0..512 * 3).map(|i| i as u8).collect();
    let mut d = plain.clone();
    c.encrypt(&mut d, 7);
    let mut back = d.clone();
    c.decrypt(&mut back, 7);
    assert_eq!(back, plain, "{spec} round trip");
    hex::encode(Sha256::digest(&d))
}

#[test]
fn cross_checked_with_python_cryptography() {
    for (spec, klen, want) in [
        (
            "camellia-cbc-plain64",
            32,
            "80841d6d7e7c9473656a63f9522de647259312b09508861ea01906178f072fc3",
        ),
        (
            "camellia-ecb",
            16,
            "0433b8791707b6072dc5a5e5391fd71ba0d03d5f5fd1ff037ca135de9bb210a4",
        ),
        (
            "blowfish-cbc-plain64",
            16,
            "7eb96960d6746a98e51d594747e629fc7417c1b1e23d8ad408b2916d466e79fb",
        ),
        (
            "cast5-cbc-benbi",
            16,
            "4827d847ac50d233e0a1088e10e4007e6c28bc98c3b7ad44a6958fec41fcd027",
        ),
        (
            "blowfish-cbc-essiv:sha256",
            16,
            "944b750d4b42c8589cdaa6b7c6a8f641e2b85cf8c42f6dedd6820d477d7dbe94",
        ),
        (
            "camellia-cbc-essiv:sha256",
            32,
            "edb3517bac20789f1386db0a9dd76937f845938b54e493d97c5d4103c72b76b2",
        ),
        (
            "aes-cbc-eboiv",
            16,
            "e26135fbf84120c8d5e7b80dff7e0bde78fe109c29288c094206a69f5924b1ac",
        ),
        (
            "des3_ede-cbc-plain64",
            24,
            "e44c60c51522787020fe55af8f5a7fbc00f1a8d79149c3d6cec1d54a3c60825f",
        ),
        (
            "aes-cbc-tcw",
            48,
            "22f7ef6fe3556e1f73e59c81a16bb04b47201e795d8add7e9c155617a597357f",
        ),
    ] {
        assert_eq!(digest(spec, klen), want, "{spec}");
    }
}

/// RFC 3713's 128-bit Camellia example, through camellia-ecb.
#[test]
fn camellia_rfc3713() {
    let key = hex::decode("0123456789abcdeffedcba9876543210").unwrap();
    let c = SectorCrypt::new("camellia-ecb", &key, 512, false).unwrap();
    let mut d = key.repeat(32);
    c.encrypt(&mut d, 0);
    assert_eq!(hex::encode(&d[..16]), "67673138549669730857065648eabe43");
    assert_eq!(d[..16], d[496..]);
}

/// Every new cipher in every chain mode the kernel runs it in: round trip,
/// sector-by-sector calls equal one call, and the bytes differ from the
/// plaintext and between sectors.
#[test]
fn every_new_mode_round_trips_and_splits() {
    for (spec, klen) in [
        ("camellia-xts-plain64", 64),
        ("camellia-xts-plain64", 32),
        ("camellia-cbc-plain", 24),
        ("camellia-lrw-benbi", 48),
        ("aes-lrw-plain64", 32),
        ("aes-lrw-benbi", 48),
        ("serpent-lrw-plain64", 48),
        ("twofish-xts-essiv:sha256", 64),
        ("aes-xts-essiv:wp256", 64),
        ("cast5-ecb", 16),
        ("cast5-cbc-plain64be", 10),
        ("blowfish-cbc-null", 56),
        ("blowfish:4-cbc-plain", 64),
        ("aes:64-cbc-lmk", 64 * 16),
        ("aes:64-cbc-lmk", 65 * 32),
        ("aes-cbc-lmk", 32),
        ("blowfish-cbc-lmk", 16),
        ("serpent-cbc-tcw", 64),
        ("cast5-cbc-tcw", 40),
        ("des3_ede-cbc-tcw", 48),
        ("kuznyechik-xts-plain64", 64),
        ("kuznyechik-cbc-essiv:sha256", 32),
        ("aes-cbc-elephant", 32),
        ("aes-cbc-elephant", 64),
        ("twofish-cbc-eboiv", 32),
        ("xchacha12,aes-adiantum-plain64", 32),
        ("xchacha20,aes-adiantum-plain64", 32),
        ("capi:adiantum(xchacha12,aes)-benbi", 32),
    ] {
        let key: Vec<u8> = (0..klen).map(|i| (i * 13 + 5) as u8).collect();
        let c = SectorCrypt::new(spec, &key, 512, false).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let plain: Vec<u8> = (0..512 * 5).map(|i| (i * 7) as u8).collect();
        let mut d = plain.clone();
        c.encrypt(&mut d, 40);
        assert_ne!(d[..512], plain[..512], "{spec}");
        let mut parts = plain.clone();
        for (k, u) in parts.chunks_mut(512).enumerate() {
            c.encrypt(u, 40 + k as u64);
        }
        assert_eq!(parts, d, "{spec}: split");
        let mut same = vec![0x42u8; 1024];
        c.encrypt(&mut same, 40);
        if !spec.contains("ecb") && !spec.contains("null") {
            assert_ne!(same[..512], same[512..], "{spec}: sectors differ");
        }
        c.decrypt(&mut d, 40);
        assert_eq!(d, plain, "{spec}: round trip");
    }
}

/// The key split of elephant: the first half keys the data cipher (its
/// CBC layer is exactly `aes-cbc-eboiv` under that half), the second the
/// sector-key cipher of the diffuser layer.
#[test]
fn elephant_is_eboiv_over_the_diffuser() {
    let key: Vec<u8> = (0..32u8).map(|i| i ^ 0xa5).collect();
    let el = SectorCrypt::new("aes-cbc-elephant", &key, 512, false).unwrap();
    let eb = SectorCrypt::new("aes-cbc-eboiv", &key[..16], 512, false).unwrap();
    let diff = super::elephant::Elephant::new(&key[16..]).unwrap();
    let plain: Vec<u8> = (0..1024).map(|i| (i * 3) as u8).collect();
    let mut d = plain.clone();
    el.encrypt(&mut d, 9);
    eb.decrypt(&mut d, 9);
    let mut want = plain.clone();
    diff.encrypt(&mut want[..512], 9 * 512);
    diff.encrypt(&mut want[512..], 10 * 512);
    assert_eq!(d, want);
}

/// tcw's key is the cipher key, then the IV seed, then the whitening: a
/// changed whitening byte changes every 8-byte group of the ciphertext the
/// same way, and leaves the CBC layer alone.
#[test]
fn tcw_key_layout() {
    let key: Vec<u8> = (0..48u8).collect();
    let mut key2 = key.clone();
    key2[40] ^= 0xff;
    let a = SectorCrypt::new("aes-cbc-tcw", &key, 512, false).unwrap();
    let b = SectorCrypt::new("aes-cbc-tcw", &key2, 512, false).unwrap();
    let mut x = vec![0u8; 512];
    let mut y = vec![0u8; 512];
    a.encrypt(&mut x, 3);
    b.encrypt(&mut y, 3);
    let delta: Vec<u8> = x.iter().zip(&y).map(|(p, q)| p ^ q).collect();
    assert_ne!(delta[..8], [0u8; 8]);
    assert!(delta.chunks(8).all(|c| c == &delta[..8]));
}

/// dm-crypt's adiantum IV is 32 bytes: plain64 puts the sector number in
/// its first 8 bytes (little-endian), plain64be and benbi in its last 8
/// (big-endian), the rest zero.
#[test]
fn adiantum_tweak_placement() {
    use super::adiantum::{Adiantum, Rounds};
    let key: Vec<u8> = (100..132u8).collect();
    let a = Adiantum::new(Rounds::R12, &key).unwrap();
    let plain: Vec<u8> = (0..4096).map(|i| (i * 11) as u8).collect();
    for (spec, tweak) in [
        ("xchacha12,aes-adiantum-plain64", {
            let mut t = [0u8; 32];
            t[..8].copy_from_slice(&0x0102_0304u64.to_le_bytes());
            t
        }),
        ("xchacha12,aes-adiantum-plain64be", {
            let mut t = [0u8; 32];
            t[24..].copy_from_slice(&0x0102_0304u64.to_be_bytes());
            t
        }),
        ("xchacha12,aes-adiantum-benbi", {
            let mut t = [0u8; 32];
            t[24..].copy_from_slice(&((0x0102_0304u64 << 5) + 1).to_be_bytes());
            t
        }),
    ] {
        for ss in [512usize, 4096] {
            let c = SectorCrypt::new(spec, &key, ss as u32, true).unwrap();
            let mut d = plain[..ss].to_vec();
            // iv_large_sectors: the IV counts sectors of ss bytes.
            c.encrypt(&mut d, 0x0102_0304 * (ss as u64 / 512));
            let mut want = plain[..ss].to_vec();
            a.crypt(&mut want, &tweak, true);
            assert_eq!(d, want, "{spec} {ss}");
        }
    }
}
