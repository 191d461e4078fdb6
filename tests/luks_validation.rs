//! Hostile and damaged headers: every bad field is refused with an error that
//! names it, requirement flags are refused by name, and random mutations of
//! real headers never panic, hang or allocate without bound. FAILS if
//! cryptsetup is missing (it makes the base images).

mod common;

use common::luks::*;
use common::*;
use sha2::Digest;
use std::path::Path;
use udm::luks::{luks1, luks2, LuksError};

/// Rewrite the JSON of both LUKS2 copies (with valid checksums), as an attacker could.
fn rewrite_json(img: &Path, edit: &dyn Fn(&mut serde_json::Value)) {
    let hdr = 16384u64;
    let area = pread(img, 4096, (hdr - 4096) as usize);
    let end = area.iter().position(|&b| b == 0).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&area[..end]).unwrap();
    edit(&mut v);
    let text = serde_json::to_vec(&v).unwrap();
    let mut area = vec![0u8; (hdr - 4096) as usize];
    area[..text.len()].copy_from_slice(&text);
    for off in [0, hdr] {
        let mut bin = pread(img, off, 4096);
        bin[0x1C0..0x200].fill(0);
        let mut h = sha2::Sha256::new();
        h.update(&bin);
        h.update(&area);
        let sum = h.finalize();
        bin[0x1C0..0x1C0 + 32].copy_from_slice(&sum);
        pwrite(img, off, &bin);
        pwrite(img, off + 4096, &area);
    }
}

fn luks2_image(d: &Path, name: &str, kf: &Path) -> std::path::PathBuf {
    let img = sparse(d, name, 20 << 20);
    cs_format(&img, &FAST_PBKDF, kf);
    img
}

#[test]
fn requirement_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"r");
    let img = luks2_image(d, "r.img", &kf);
    rewrite_json(&img, &|v| {
        v["config"]["requirements"] = serde_json::json!({"mandatory": ["online-reencrypt-v2"]})
    });
    let e = udm::luks::open(&img, None, b"r").unwrap_err();
    assert!(
        matches!(&e, LuksError::Requirement(r) if r == "online-reencrypt-v2"),
        "{e}"
    );
    assert!(e.to_string().contains("online-reencrypt-v2"));
    let o = udm()
        .args([
            "luks",
            "add-key",
            "--pbkdf=pbkdf2",
            "--pbkdf-force-iterations=1000",
            "--key-file",
        ])
        .arg(&kf)
        .arg(&img)
        .arg(&kf)
        .output()
        .unwrap();
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("online-reencrypt-v2"),
        "{}",
        show(&o)
    );
    // dump still works, and shows the requirement.
    let o = run(udm().args(["luks", "dump"]).arg(&img));
    assert!(String::from_utf8_lossy(&o.stdout).contains("online-reencrypt-v2"));
}

#[test]
fn hostile_values_are_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"h");
    let base = luks2_image(d, "base.img", &kf);
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| v["keyslots"]["0"]["kdf"]["iterations"] = 4_000_000_000u64.into()),
            "keyslots.0.kdf.iterations",
        ),
        (
            Box::new(
                |v| v["keyslots"]["0"]["kdf"] = serde_json::json!({"type":"argon2id","time":4,"memory":4294967295u64,"cpus":4,"salt":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
            ),
            "keyslots.0.kdf.memory",
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["area"]["size"] = "18446744073709551615".into()),
            "keyslots.0.area",
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["area"]["offset"] = "-5".into()),
            "keyslots.0.area.offset",
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["af"]["stripes"] = 1.into()),
            "keyslots.0.af.stripes",
        ),
        (
            Box::new(|v| v["keyslots"]["0"]["key_size"] = 1_000_000.into()),
            "keyslots.0.key_size",
        ),
        (
            Box::new(|v| v["segments"]["0"]["offset"] = "18446744073709551616".into()),
            "segments.0.offset",
        ),
        (
            Box::new(|v| v["segments"]["0"]["sector_size"] = 8192.into()),
            "segments.0.sector_size",
        ),
        (
            Box::new(|v| v["segments"]["0"]["offset"] = "8192".into()),
            "segments.0.offset",
        ),
        (
            Box::new(|v| v["digests"]["0"]["iterations"] = 0.into()),
            "digests.0.iterations",
        ),
        (
            Box::new(|v| v["config"]["keyslots_size"] = "99999999999".into()),
            "config.keyslots_size",
        ),
        (
            Box::new(|v| v["tokens"]["0"] = serde_json::json!({"type":"x","keyslots":["9"]})),
            "tokens.0.keyslots",
        ),
    ];
    for (i, (edit, field)) in cases.into_iter().enumerate() {
        let img = d.join(format!("h{i}.img"));
        std::fs::copy(&base, &img).unwrap();
        rewrite_json(&img, &*edit);
        let e = udm::luks::open(&img, None, b"h").unwrap_err().to_string();
        assert!(e.contains(field), "case {i}: expected {field} in: {e}");
    }
    // Non-NUL garbage after the JSON, in both copies: refused, naming the JSON area.
    let img = d.join("tail.img");
    std::fs::copy(&base, &img).unwrap();
    rewrite_json(&img, &|_| {});
    for off in [4096u64 + 12000, 16384 + 4096 + 12000] {
        pwrite(&img, off, b"x");
    }
    let e = udm::luks::open(&img, None, b"h").unwrap_err().to_string();
    assert!(e.contains("checksum") || e.contains("JSON area"), "{e}");
}

/// Deterministic mutation "fuzzing" of the parsers: flip, overwrite and
/// splice bytes of real headers and feed them to the pure parsers.
#[test]
fn mutated_headers_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"m");
    let img2 = luks2_image(d, "m2.img", &kf);
    let img1 = sparse(d, "m1.img", 4 << 20);
    cs_format(
        &img1,
        &["--type=luks1", "--pbkdf-force-iterations=1000"],
        &kf,
    );
    let l1 = pread(&img1, 0, 1024);
    let bin = pread(&img2, 0, 4096);
    let area = pread(&img2, 4096, 12288);
    let json_end = area.iter().position(|&b| b == 0).unwrap();
    let iters: usize = std::env::var("UDM_MUTATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n.max(1) as u64) as usize
    };
    let tokens: [&[u8]; 8] = [
        b"\"",
        b"{",
        b"}",
        b"-1",
        b"18446744073709551616",
        b"[]",
        b"null",
        b"\"dynamic\"",
    ];
    let mut accepted = 0;
    for _ in 0..iters {
        let mut a = l1.clone();
        for _ in 0..1 + rnd(8) {
            let i = rnd(a.len());
            a[i] = rnd(256) as u8;
        }
        let _ = luks1::Header::parse(&a, 1 << rnd(40));

        let mut b = bin.clone();
        for _ in 0..1 + rnd(4) {
            let i = rnd(512);
            b[i] = rnd(256) as u8;
        }
        let _ = luks2::parse_bin(&b, 0, false);

        let mut j = area.clone();
        match rnd(3) {
            0 => {
                let i = rnd(json_end);
                j[i] = rnd(128) as u8;
            }
            1 => {
                let t = tokens[rnd(tokens.len())];
                let i = rnd(json_end);
                let mut v = j[..i].to_vec();
                v.extend_from_slice(t);
                v.extend_from_slice(&j[i + rnd(8).min(json_end - i)..]);
                v.resize(j.len(), 0);
                j = v;
            }
            _ => {
                // Replace a digit run with a huge or negative number.
                let i = rnd(json_end);
                if j[i].is_ascii_digit() {
                    let mut v = j[..i].to_vec();
                    v.extend_from_slice(if rnd(2) == 0 {
                        b"99999999999999999999"
                    } else {
                        b"4294967296"
                    });
                    v.extend_from_slice(&j[i + 1..]);
                    v.resize(j.len(), 0);
                    j = v;
                }
            }
        }
        if luks2::parse_json_area(&j, 16384, "primary").is_ok() {
            accepted += 1;
        }
    }
    // Some mutations hit insignificant bytes (salts, digests): those must still parse.
    assert!(
        accepted > 0,
        "no mutated header was accepted; mutation harness broken"
    );
}

/// Persistent LUKS2 flags become dm-crypt options in cryptsetup's order, and
/// neither Debug output nor errors show the key.
#[test]
fn persistent_flags_map_to_crypt_options_and_keys_stay_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"f");
    let img = luks2_image(d, "f.img", &kf);
    rewrite_json(&img, &|v| {
        v["config"]["flags"] = serde_json::json!([
            "no-write-workqueue",
            "allow-discards",
            "some-future-flag",
            "same-cpu-crypt"
        ])
    });
    let act = udm::luks::open(&img, None, b"f").unwrap();
    let key = hex::encode(act.volume_key());
    let t = act.table("DEV");
    let want = format!(
        "0 {} crypt aes-xts-plain64 {key} 0 DEV 32768 4 allow_discards same_cpu_crypt no_write_workqueue sector_size:4096\n",
        (4 << 20) / 512
    );
    assert_eq!(&*t, &want);
    let dbg = format!("{act:?}");
    assert!(!dbg.contains(&key[..16]) && dbg.contains("hidden"), "{dbg}");
}
