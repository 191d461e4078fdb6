//! Metadata read and edit tests on a header as cryptsetup writes it.

use super::*;
use crate::luks::error::LuksError;
use serde_json::Value;

pub(crate) const SAMPLE: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2id","time":4,"memory":32,"cpus":2,"salt":"PEarZfwhTheIXVpDvG9/LgUMs3bMl1H+ajBr/VK1gzU="}}},"tokens":{"0":{"type":"x-custom","keyslots":["0"],"blob":[1,2,{"a":"b"}]}},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"mxdsHl91bo2bWk+0LefFORWFpf8hPru/W5AU+1yIg0U=","digest":"/GHRIADrlACARFvCmFXmVkzeRsG7WldFSilghEbhAEY="}},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;

fn parse(s: &str) -> Result<Metadata, LuksError> {
    Metadata::parse(serde_json::from_str(s).unwrap(), 16384)
}

#[test]
fn parses_cryptsetup_metadata_and_round_trips_bytes() {
    let m = parse(SAMPLE).unwrap();
    assert_eq!(m.keyslots[&0].area_offset, 32768);
    assert_eq!(m.segments[&0].sector_size, 4096);
    assert_eq!(m.segments[&0].size, None);
    assert_eq!(m.to_bytes(), SAMPLE.as_bytes());
}

#[test]
fn edits_keep_tokens_and_order() {
    let m = parse(SAMPLE).unwrap();
    let ks = m.value["keyslots"]["0"].clone();
    let mut ks1 = ks.clone();
    ks1["area"]["offset"] = Value::String("290816".into());
    let m2 = m.with_keyslot(16384, 1, ks1, 0).unwrap();
    assert_eq!(m2.digests[&0].keyslots, vec![0, 1]);
    let m3 = m2.without_keyslot(16384, 0).unwrap();
    assert_eq!(m3.tokens[&0], Vec::<u32>::new());
    assert_eq!(
        m3.value["tokens"]["0"]["blob"],
        m.value["tokens"]["0"]["blob"]
    );
    let back = m3.without_keyslot(16384, 1).unwrap();
    assert!(back.keyslots.is_empty());
}

#[test]
fn rejects_named_fields() {
    let cases = [
        (
            SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":\"-1\""),
            "keyslots.0.area.offset",
        ),
        (
            SAMPLE.replace(
                "\"offset\":\"32768\"",
                "\"offset\":\"18446744073709551616\"",
            ),
            "keyslots.0.area.offset",
        ),
        (
            SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":\"16600000\""),
            "keyslots.0.area.offset",
        ),
        (
            SAMPLE.replace("\"offset\":\"32768\"", "\"offset\":32768"),
            "keyslots.0.area.offset",
        ),
        (
            SAMPLE.replace("\"json_size\":\"12288\"", "\"json_size\":\"4096\""),
            "config.json_size",
        ),
        (
            SAMPLE.replace("\"sector_size\":4096", "\"sector_size\":3000"),
            "segments.0.sector_size",
        ),
        (
            SAMPLE.replace(
                "\"keyslots\":[\"0\"],\"segments\"",
                "\"keyslots\":[\"7\"],\"segments\"",
            ),
            "digests.0.keyslots",
        ),
        (
            SAMPLE.replace(
                "\"hash\":\"sha256\",\"iterations\"",
                "\"hash\":\"md4\",\"iterations\"",
            ),
            "digests.0.hash",
        ),
        (
            SAMPLE.replace("\"0\":{\"type\":\"crypt\"", "\"1\":{\"type\":\"crypt\""),
            "segments",
        ),
    ];
    for (json, field) in cases {
        let e = parse(&json).unwrap_err().to_string();
        assert!(e.contains(field), "expected {field}: {e}");
    }
}

#[test]
fn overlapping_areas_rejected() {
    let m = parse(SAMPLE).unwrap();
    let ks = m.value["keyslots"]["0"].clone();
    let e = m.with_keyslot(16384, 1, ks, 0).unwrap_err().to_string();
    assert!(e.contains("overlaps"), "{e}");
}

/// Values cryptsetup's validation accepts but udm cannot unlock with leave
/// the header readable; the keyslot keeps why, which is the error when it
/// is used.
#[test]
fn unusable_keyslots_fail_only_when_used() {
    let cases = [
        (
            SAMPLE.replace("\"memory\":32", "\"memory\":99999999"),
            "keyslots.0.kdf.memory",
        ),
        (
            SAMPLE.replace("\"stripes\":4000", "\"stripes\":1"),
            "keyslots.0.af.stripes",
        ),
        (
            SAMPLE.replace("\"type\":\"argon2id\"", "\"type\":\"argon2\""),
            "keyslots.0.kdf.type",
        ),
    ];
    for (json, field) in cases {
        let m = parse(&json).unwrap();
        assert!(m.keyslots.is_empty(), "{field}");
        let e = m.unusable[&0].error().to_string();
        assert!(e.contains(field), "expected {field}: {e}");
    }
}

/// cryptsetup's in-memory repair: KDF members another KDF left behind go,
/// and only when the header fails validation without the repair.
#[test]
fn leftover_kdf_members_are_repaired_in_memory() {
    let json = SAMPLE.replace(
        "\"cpus\":2,",
        "\"cpus\":2,\"iterations\":1000,\"hash\":\"sha256\",",
    );
    let m = parse(&json).unwrap();
    let kdf = m.value["keyslots"]["0"]["kdf"].as_object().unwrap();
    let keys: Vec<&str> = kdf.keys().map(String::as_str).collect();
    assert_eq!(keys, ["type", "time", "memory", "cpus", "salt"]);
    assert!(m.keyslots.contains_key(&0));
    // An unknown KDF type has no members to keep: left as it is, and the
    // keyslot is unusable, not the header.
    let odd = SAMPLE.replace("\"type\":\"argon2id\"", "\"type\":\"scrypt\"");
    let m = parse(&odd).unwrap();
    assert!(m.unusable.contains_key(&0));
}

/// cryptsetup's structural rules refuse the header itself.
#[test]
fn structural_faults_refuse_the_header() {
    let cases = [
        (
            SAMPLE.replace("\"tokens\":{", "\"tokens\":{\"x\":{},"),
            "tokens",
        ),
        (
            SAMPLE.replace(
                "\"digests\":{\"0\":{\"type\":\"pbkdf2\",\"keyslots\":[\"0\"]",
                "\"digests\":{\"0\":{\"type\":\"pbkdf2\",\"keyslots\":[]",
            ),
            "keyslots.0",
        ),
        (
            SAMPLE.replace("\"size\":\"dynamic\"", "\"size\":\"511\""),
            "segments.0.size",
        ),
        (
            SAMPLE.replace("\"af\":{\"type\":\"luks1\"", "\"af\":{\"type\":\"luks9\""),
            "keyslots.0.af.type",
        ),
    ];
    for (json, field) in cases {
        assert_ne!(json, SAMPLE, "{field}: edit did not apply");
        let e = parse(&json).unwrap_err().to_string();
        assert!(e.contains(field), "expected {field}: {e}");
    }
}
