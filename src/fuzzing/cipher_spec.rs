//! The `cipher_spec` driver: a dm-crypt cipher spec keyed and run over
//! two sectors; and its seeds.

/// The `cipher_spec` fuzz target: a dm-crypt cipher spec (lossy UTF-8 of
/// the input after two bytes) keyed with a key of the first byte's length
/// (0 to 255 bytes) and the sector size the second byte picks; a spec that
/// keys must encrypt and decrypt two sectors back to the same bytes. Never
/// a panic, whatever the spec.
pub fn cipher_spec(data: &[u8]) -> bool {
    let (klen, ss_sel, spec) = match data {
        [k, s, rest @ ..] => (*k as usize, *s, String::from_utf8_lossy(rest)),
        _ => return false,
    };
    let _ = crate::crypto::spec::parse(&spec);
    let ss = 512u32 << (ss_sel % 5); // 512..8192: 8192 must be refused
    let large = ss_sel & 0x80 != 0;
    let key: Vec<u8> = (0..klen)
        .map(|i| (i as u8).wrapping_mul(151) ^ 0x5a)
        .collect();
    let Ok(sc) = crate::crypto::SectorCrypt::new(&spec, &key, ss, large) else {
        return false;
    };
    let plain: Vec<u8> = (0..2 * ss as usize).map(|i| (i % 251) as u8).collect();
    let mut buf = plain.clone();
    let sector = u64::from(ss_sel) << 20;
    sc.encrypt(&mut buf, sector);
    sc.decrypt(&mut buf, sector);
    assert!(
        buf == plain,
        "cipher spec '{spec}' does not decrypt what it encrypted"
    );
    true
}

/// Seed inputs for [`cipher_spec`]: key length, sector size selector, spec.
pub fn cipher_spec_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let seed = |k: u8, s: u8, spec: &str| {
        let mut v = vec![k, s];
        v.extend_from_slice(spec.as_bytes());
        v
    };
    vec![
        ("xts_plain64", seed(64, 0, "aes-xts-plain64")),
        ("xts_4k_large", seed(32, 0x83, "aes-xts-plain64")),
        ("cbc_essiv", seed(16, 0, "aes-cbc-essiv:sha256")),
        ("cbc_plain", seed(32, 1, "aes-cbc-plain")),
        ("ecb", seed(16, 0, "aes-ecb")),
        ("serpent_xts", seed(64, 0, "serpent-xts-plain64")),
        ("twofish_cbc", seed(32, 2, "twofish-cbc-essiv:sha256")),
        ("benbi", seed(16, 0, "aes-cbc-benbi")),
        ("null", seed(0, 0, "cipher_null-ecb")),
        ("keycount", seed(128, 0, "aes:2-xts-plain64")),
        ("kernel_form", seed(64, 0, "capi:xts(aes)-plain64")),
    ]
}
