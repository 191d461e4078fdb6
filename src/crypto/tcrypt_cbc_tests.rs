//! [`super::SectorCrypt`] with udm's TrueCrypt legacy CBC specs, checked
//! against the kernel-compatible tcw IV mode and ECB specs it is made of
//! (the real volumes are checked in tests/foreign_tcrypt.rs, which reads
//! cryptsetup's images).

use super::spec::tcrypt_chain;
use super::tcw::Tcw;
use super::SectorCrypt;

fn key(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 512) as u8).collect()
}

#[test]
fn key_and_sector_size_are_checked() {
    let e = SectorCrypt::new("aes-cbc-tcrypt", &[1u8; 63], 512, false).unwrap_err();
    assert!(e.about_key() && e.to_string().contains("takes 512"), "{e}");
    let e = SectorCrypt::new("aes-cbc-tcrypt", &[1u8; 64], 4096, false).unwrap_err();
    assert!(e.to_string().contains("512-byte sectors"), "{e}");
    let e = SectorCrypt::new("blowfish-aes-cbc-tcrypt", &[1u8; 120], 512, false).unwrap_err();
    assert!(e.to_string().contains("blowfish_le"), "{e}");
}

/// One 16-byte cipher is the kernel's tcw IV mode, which udm checks
/// against dm-crypt's vectors: both spellings write the same bytes.
#[test]
fn one_cipher_is_the_kernels_tcw() {
    for alg in ["aes", "serpent", "twofish"] {
        let k = key(64, 3);
        let plain = data(4 * 512);
        let tcw = SectorCrypt::new(&format!("{alg}-cbc-tcw"), &k, 512, false).unwrap();
        for mode in ["cbc-tcrypt", "cbci-tcrypt"] {
            let tc = SectorCrypt::new(&format!("{alg}-{mode}"), &k, 512, false).unwrap();
            let (mut a, mut b) = (plain.clone(), plain.clone());
            tcw.encrypt(&mut a, 77);
            tc.encrypt(&mut b, 77);
            assert_eq!(a, b, "{alg}-{mode}");
            tc.decrypt(&mut b, 77);
            assert_eq!(b, plain);
        }
    }
}

/// Inner CBC of 16-byte ciphers is one tcw pass per cipher, each with
/// its own key and the shared seed.
#[test]
fn inner_cascade_is_tcw_passes() {
    let k = key(96, 9);
    let plain = data(3 * 512);
    let chain = SectorCrypt::new("serpent-aes-cbc-tcrypt", &k, 512, false).unwrap();
    let mut serpent_key = k[..32].to_vec();
    serpent_key.extend_from_slice(&k[64..]);
    let serpent = SectorCrypt::new("serpent-cbc-tcw", &serpent_key, 512, false).unwrap();
    let aes = SectorCrypt::new("aes-cbc-tcw", &k[32..], 512, false).unwrap();
    let mut want = plain.clone();
    serpent.encrypt(&mut want, 5);
    aes.encrypt(&mut want, 5);
    let mut got = plain.clone();
    chain.encrypt(&mut got, 5);
    assert_eq!(got, want);
    chain.decrypt(&mut got, 5);
    assert_eq!(got, plain);
}

/// Outer CBC built by hand from ECB specs: each block chained, through
/// both ciphers, then tcw's whitening.
#[test]
fn outer_cascade_chains_the_whole_chain() {
    let k = key(96, 17);
    let plain = data(512);
    let s = 9u64;
    let twofish = SectorCrypt::new("twofish-ecb", &k[..32], 512, false).unwrap();
    let aes = SectorCrypt::new("aes-ecb", &k[32..64], 512, false).unwrap();
    let tcw = Tcw::new(&k[64..], 16);
    let mut want = plain.clone();
    let mut prev = tcw.iv(s, 16);
    for b in want.chunks_exact_mut(16) {
        b.iter_mut().zip(&prev).for_each(|(x, p)| *x ^= p);
        // ECB specs take whole sectors: one block in a padded sector.
        for c in [&twofish, &aes] {
            let mut buf = [0u8; 512];
            buf[..16].copy_from_slice(b);
            c.encrypt(&mut buf, 0);
            b.copy_from_slice(&buf[..16]);
        }
        prev.copy_from_slice(b);
    }
    tcw.whiten(&mut want, s);
    let chain = SectorCrypt::new("twofish-aes-cbci-tcrypt", &k, 512, false).unwrap();
    let mut got = plain.clone();
    chain.encrypt(&mut got, s);
    assert_eq!(got, want);
    chain.decrypt(&mut got, s);
    assert_eq!(got, plain);
}

/// Every kind of chain round-trips over several sectors, and the sector
/// number and the whitening bytes reach the ciphertext.
#[test]
fn every_chain_round_trips() {
    for spec in [
        "blowfish_le-cbc-tcrypt",
        "blowfish_le-aes-cbc-tcrypt",
        "serpent-blowfish_le-aes-cbc-tcrypt",
        "aes-twofish-serpent-cbci-tcrypt",
        "cast5-des3_ede-cbc-tcrypt",
    ] {
        let chain = tcrypt_chain(spec).unwrap().unwrap();
        let k = key(chain.key_len(), 2);
        let c = SectorCrypt::new(spec, &k, 512, false).unwrap();
        let plain = data(4 * 512);
        let mut d = plain.clone();
        c.encrypt(&mut d, 1000);
        assert_ne!(d, plain, "{spec}");
        assert_ne!(d[..512], d[512..1024], "{spec}: sectors differ");
        let mut e = plain.clone();
        c.encrypt(&mut e, 1001);
        assert_ne!(d[..512], e[..512], "{spec}: the sector number counts");
        let mut k2 = k.clone();
        if let Some(last) = k2.last_mut() {
            *last ^= 1;
        }
        let mut f = plain.clone();
        SectorCrypt::new(spec, &k2, 512, false)
            .unwrap()
            .encrypt(&mut f, 1000);
        assert_ne!(d, f, "{spec}: the whitening bytes count");
        c.decrypt(&mut d, 1000);
        assert_eq!(d, plain, "{spec}");
    }
}
