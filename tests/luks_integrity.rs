//! Authenticated LUKS2 (`luksFormat --integrity`) against cryptsetup 2.6.
//!
//! cryptsetup cannot format such a volume on this machine (it has the
//! kernel's dm-integrity write the integrity superblock), so the header is
//! checked two ways: cryptsetup reads udm's header and prints what udm
//! prints (`luksDump`), and the header is cryptsetup's own for the same
//! parameters without `--integrity`, except for exactly what libcryptsetup's
//! `LUKS2_generate_hdr` adds for it (the segment's `integrity` object) and
//! the volume key size (the cipher key plus the integrity key).
//!
//! FAILS if cryptsetup is missing (apt-get install cryptsetup-bin).

mod common;

use common::luks::*;
use common::*;
use serde_json::{json, Value};

const UUID: &str = "6f1a3c2e-8d4b-4c1a-9e2f-0123456789ab";

fn udm_cs() -> std::process::Command {
    let mut c = udm();
    c.arg("cryptsetup");
    c
}

/// Both JSONs with what is random per format (salts, digests, the
/// keyslot's area contents) removed.
fn normalised(mut v: Value) -> Value {
    for (_, ks) in v["keyslots"].as_object_mut().expect("keyslots").iter_mut() {
        ks["kdf"]["salt"] = json!("");
    }
    for (_, d) in v["digests"].as_object_mut().expect("digests").iter_mut() {
        d["salt"] = json!("");
        d["digest"] = json!("");
    }
    v
}

/// udm formats with `--integrity`, cryptsetup formats the same image
/// size, UUID and cipher without it; the headers differ only by the
/// integrity object and the key size.
fn same_as_cryptsetup(cipher: &str, integrity: &str, kind: &str, key_bits: u64) {
    need("cryptsetup");
    let d = scratch("udm-luks-int");
    let key = write_file(d.path(), "key", b"integrity passphrase");
    let ours = sparse(d.path(), "udm.img", 64 << 20);
    let theirs = sparse(d.path(), "cs.img", 64 << 20);
    let common_opts = [
        "--type",
        "luks2",
        "--cipher",
        cipher,
        "--uuid",
        UUID,
        FAST_PBKDF[0],
        FAST_PBKDF[1],
    ];
    let mut udm_opts: Vec<&str> = common_opts.to_vec();
    udm_opts.extend(["--integrity", integrity, "--integrity-no-wipe"]);
    run(udm_cs()
        .arg("luksFormat")
        .arg("-q")
        .args(&udm_opts)
        .arg("--key-file")
        .arg(&key)
        .arg(&ours));
    // cryptsetup's header for AES-XTS with the same cipher key size and
    // no integrity (a random-IV or AEAD cipher without dm would not
    // format), then what libcryptsetup changes for the integrity volume:
    // the segment's cipher and integrity object, the volume key size, and
    // the keyslot's area, which falls back to aes-xts-plain64 with a
    // 512-bit key (an authenticated cipher cannot encrypt a keyslot) and
    // holds the AF-split of the longer key (4000 stripes, 4 KiB aligned).
    let cipher_key = key_bits - integrity_key_bits(integrity);
    let ks = cipher_key.to_string();
    let mut cs_opts: Vec<&str> = common_opts.to_vec();
    cs_opts[3] = "aes-xts-plain64";
    cs_opts.extend(["--key-size", &ks]);
    cs_format(&theirs, &cs_opts, &key);

    let mut want = normalised(cs_json(&theirs));
    let seg = &mut want["segments"]["0"];
    seg["encryption"] = json!(cipher);
    seg["integrity"] = json!({
        "type": kind, "journal_encryption": "none", "journal_integrity": "none"
    });
    let slot = &mut want["keyslots"]["0"];
    slot["key_size"] = json!(key_bits / 8);
    slot["area"]["encryption"] = json!("aes-xts-plain64");
    slot["area"]["key_size"] = json!(64);
    let area = (key_bits / 8 * 4000).div_ceil(4096) * 4096;
    slot["area"]["size"] = json!(area.to_string());
    let got = normalised(cs_json(&ours));
    assert_eq!(
        serde_json::to_string_pretty(&got).unwrap(),
        serde_json::to_string_pretty(&want).unwrap(),
        "{cipher} --integrity {integrity}"
    );
    // The dump cryptsetup prints from udm's header is udm's own.
    let cs_text = cs_dump(&ours);
    assert!(
        cs_text.contains(&format!("\tintegrity: {kind}\n")),
        "{cs_text}"
    );
    let ud_text = run_text(udm_cs().arg("luksDump").arg(&ours));
    assert_eq!(ud_text, cs_text);
    // The passphrase opens the keyslot for cryptsetup, and the volume key
    // it gives has the integrity key's bytes too.
    let vk = cs_volume_key(&ours, None, &key);
    assert_eq!(vk.len() as u64 * 8, key_bits);
    // The superblock area at the data offset is cleared, as cryptsetup does.
    let off = got["segments"]["0"]["offset"]
        .as_str()
        .and_then(|s| s.parse::<u64>().ok())
        .expect("offset");
    assert!(pread(&ours, off, 4096).iter().all(|&b| b == 0));
}

fn integrity_key_bits(integrity: &str) -> u64 {
    match integrity {
        "hmac-sha256" => 256,
        "hmac-sha512" => 512,
        _ => 0,
    }
}

#[test]
fn xts_hmac_sha256_header_is_cryptsetups() {
    same_as_cryptsetup("aes-xts-plain64", "hmac-sha256", "hmac(sha256)", 768);
}

#[test]
fn xts_random_hmac_sha512_header_is_cryptsetups() {
    same_as_cryptsetup("aes-xts-random", "hmac-sha512", "hmac(sha512)", 1024);
}

#[test]
fn gcm_and_chacha_headers_are_cryptsetups() {
    same_as_cryptsetup("aes-gcm-random", "aead", "aead", 256);
    same_as_cryptsetup("chacha20-random", "poly1305", "poly1305", 256);
}

#[test]
fn unsupported_integrity_is_refused_with_its_name() {
    let d = scratch("udm-luks-int");
    let key = write_file(d.path(), "key", b"pw");
    let img = sparse(d.path(), "v.img", 32 << 20);
    for (cipher, integrity, want) in [
        (
            "aes-xts-plain64",
            "crc32",
            "No known integrity specification",
        ),
        (
            "aes-cbc-essiv:sha256",
            "hmac-sha256",
            "not supported by udm",
        ),
        (
            "chacha20-poly1305-random",
            "aead",
            "--cipher chacha20-random",
        ),
    ] {
        let out = udm_cs()
            .args(["luksFormat", "-q", "--type", "luks2", "--cipher", cipher])
            .args(["--integrity", integrity, FAST_PBKDF[0], FAST_PBKDF[1]])
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .output()
            .expect("run udm");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{cipher} {integrity}");
        assert!(err.contains(want), "{cipher} {integrity}: {err}");
    }
    let out = udm_cs()
        .args([
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--integrity",
            "hmac-sha256",
        ])
        .arg("--key-file")
        .arg(&key)
        .arg(&img)
        .output()
        .expect("run udm");
    assert!(String::from_utf8_lossy(&out.stderr).contains("only for LUKS2"));
}
