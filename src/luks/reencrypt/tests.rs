//! The verification string byte for byte, and hostile reencryption
//! metadata refused before it sizes anything. The header is one
//! cryptsetup 2.6.1 wrote with `reencrypt --init-only` (re-key,
//! checksum resilience).

use super::state::{Direction, Mode, Resilience, State};
use super::verify;
use crate::luks::json::Metadata;
use serde_json::Value;

const INIT_ONLY: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"CvNLkgKI/X7UCmgmfmkQy9RqO1OYc7u/dgCL5/rMrFA="}},"1":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"290816","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"NsTl64/UAbHCKkSDBexIQLLxGEstjmyeaGJ/XtFGl/E="}},"2":{"area":{"offset":"548864","size":"16228352","type":"checksum","hash":"sha256","sector_size":4096},"type":"reencrypt","key_size":1,"mode":"reencrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096},"1":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-previous"]},"2":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0","1"],"hash":"sha256","iterations":1000,"salt":"j8YDtF6n0MTaNWM+APndv0F7J7SnSDxzNBld/E0/8n0=","digest":"xVGtcUumBEoJJHVwbShdZrP73qkz5odGGYY4d8CFQr0="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":["2"],"hash":"sha256","iterations":1000,"salt":"fE6C6crMAYYTResBHhslc7gBy11a0fj7UNx8HE7PFuU=","digest":"s5okG67rZdmkWaSP97DmEv1VjNXHAT2DJxi4wCV74rQ="},"2":{"type":"pbkdf2","keyslots":["2"],"segments":[],"hash":"sha256","iterations":1000,"salt":"fo7M5uky6Kc/LZF4OmZW7ud38GdAB85qzTO1jPUyLdU=","digest":"qXFmB285/PDckTncibRYX/w18T56kvhfURQHthrb4nY="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#;

fn meta(edit: impl FnOnce(&mut Value)) -> Result<Option<State>, crate::luks::error::LuksError> {
    let mut v: Value = serde_json::from_str(INIT_ONLY).unwrap();
    edit(&mut v);
    State::read(&Metadata::parse(v, 16384)?)
}

#[test]
fn reads_cryptsetup_init_only_state() {
    let st = meta(|_| {}).unwrap().unwrap();
    assert_eq!((st.version, st.slot), (2, 2));
    assert_eq!(
        (st.mode, st.direction),
        (Mode::Reencrypt, Direction::Forward)
    );
    assert!(matches!(
        st.resilience,
        Resilience::Checksum { block: 4096, .. }
    ));
    assert_eq!(
        (st.digest_old, st.digest_new, st.hot),
        (Some(0), Some(1), None)
    );
    assert_eq!((st.area_offset, st.area_size), (548864, 16228352));
}

#[test]
fn verification_string_layout() {
    let v: Value = serde_json::from_str(INIT_ONLY).unwrap();
    let d = verify::data(&v, 2, 2, Some(&[1u8; 4]), Some(&[2u8; 4])).unwrap();
    let mut want = vec![0x76, 0x32, 1, 1, 1, 1, 2, 2, 2, 2];
    want.extend_from_slice(b"reencryptforwardchecksum");
    want.extend_from_slice(&548864u64.to_be_bytes());
    want.extend_from_slice(&16228352u64.to_be_bytes());
    want.extend_from_slice(b"sha256");
    want.extend_from_slice(&4096u32.to_be_bytes());
    for _ in 0..2 {
        want.extend_from_slice(b"crypt");
        want.extend_from_slice(&16777216u64.to_be_bytes());
        want.extend_from_slice(b"dynamic");
        want.extend_from_slice(&0u64.to_be_bytes());
        want.extend_from_slice(b"aes-xts-plain64");
        want.extend_from_slice(&4096u32.to_be_bytes());
    }
    assert_eq!(&d[..], &want[..]);
}

#[test]
fn hostile_reencryption_metadata_is_refused() {
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| v["keyslots"]["2"]["area"]["size"] = "999999999999".into()),
            "area",
        ),
        (
            Box::new(|v| v["keyslots"]["2"]["area"]["sector_size"] = 3.into()),
            "sector_size",
        ),
        (
            Box::new(|v| v["keyslots"]["2"]["mode"] = "encrypt".into()),
            "mode",
        ),
        (
            Box::new(|v| v["keyslots"]["2"]["area"]["type"] = "teleport".into()),
            "area.type",
        ),
        (
            Box::new(|v| {
                v["segments"]["0"]["size"] = "2147483648".into();
                v["segments"]["0"]["flags"] = serde_json::json!(["in-reencryption"]);
            }),
            "1 GiB",
        ),
        (
            Box::new(|v| {
                v["config"]["requirements"]["mandatory"] = serde_json::json!(["online-reencrypt"])
            }),
            "v1",
        ),
    ];
    for (edit, want) in cases {
        let e = meta(edit).unwrap_err().to_string();
        assert!(e.contains(want), "expected {want}: {e}");
    }
}
