//! Hostile and damaged headers: every bad field is refused with an error that
//! names it, requirement flags are refused by name, and random mutations of
//! real headers never panic, hang or allocate without bound. FAILS if
//! cryptsetup is missing (it makes the base images).

mod common;

use common::luks::*;
use common::*;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Output;
use udm::luks::{luks1, luks2, LuksError};

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
    // cryptsetup's legacy offline-reencryption flag (udm reads the online
    // reencryption flags, tests/cryptsetup_reencrypt.rs).
    rewrite_json(&img, &|v| {
        v["config"]["requirements"] = serde_json::json!({"mandatory": ["offline-reencrypt"]})
    });
    let e = udm::luks::open(&img, None, b"r").unwrap_err();
    assert!(
        matches!(&e, LuksError::Requirement(r) if r == "offline-reencrypt"),
        "{e}"
    );
    assert!(e.to_string().contains("offline-reencrypt"));
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
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("offline-reencrypt"),
        "{}",
        show(&o)
    );
    // dump still works, and shows the requirement.
    let o = run(udm().args(["luks", "dump"]).arg(&img));
    assert!(String::from_utf8_lossy(&o.stdout).contains("offline-reencrypt"));
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

/// A header that demands absurd KDF work is refused before any KDF runs,
/// with an error naming the keyslot and its cost (32 keyslots of 2^30
/// PBKDF2 iterations would take hours; 4 GiB of Argon2 memory could push
/// the machine into the OOM killer). `--key-slot` limits the cost to one
/// slot, and `--no-kdf-limit` lets the user go ahead.
#[test]
fn costly_headers_are_refused_before_any_kdf_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"cost");
    let base = luks2_image(d, "base.img", &kf);
    let with_slots = |name: &str, slots: Vec<(u32, serde_json::Value)>| {
        let img = d.join(name);
        std::fs::copy(&base, &img).unwrap();
        rewrite_json(&img, &|v| {
            let ks0 = v["keyslots"]["0"].clone();
            for (n, kdf) in &slots {
                let mut k = ks0.clone();
                k["area"]["offset"] = (32768 + u64::from(*n) * 258048).to_string().into();
                k["kdf"] = kdf.clone();
                v["keyslots"][n.to_string()] = k;
                if *n != 0 {
                    v["digests"]["0"]["keyslots"]
                        .as_array_mut()
                        .unwrap()
                        .push(n.to_string().into());
                }
            }
        });
        img
    };
    let salt = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let pbkdf2 =
        |it: u64| serde_json::json!({"type":"pbkdf2","hash":"sha256","iterations":it,"salt":salt});

    // 32 keyslots × 2^30 PBKDF2 iterations.
    let hostile = with_slots(
        "pbkdf2.img",
        (0..32).map(|n| (n, pbkdf2(1 << 30))).collect(),
    );
    let t = std::time::Instant::now();
    let o = udm()
        .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
        .arg(&kf)
        .arg(&hostile)
        .output()
        .unwrap();
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        err.contains("keyslot 0 demands 1073741824 PBKDF2-sha256 iterations")
            // 32 × 2^30 iterations × 2 blocks (a 64-byte key from SHA-256).
            && err.contains("68719476736")
            && err.contains("--no-kdf-limit"),
        "{err}"
    );
    assert!(
        took < std::time::Duration::from_secs(1),
        "refusal took {took:?}"
    );

    // 4 GiB of Argon2 memory (cryptsetup's own maximum).
    let argon =
        serde_json::json!({"type":"argon2id","time":4,"memory":4194304u64,"cpus":4,"salt":salt});
    let hostile = with_slots("argon2.img", vec![(0, argon)]);
    let t = std::time::Instant::now();
    let e = udm::luks::open(&hostile, None, b"cost").unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(e.to_string().contains("keyslot 0 demands 4096 MiB"), "{e}");

    // Slot 0 is real and cheap; slots 1 and 2 ask 2^29 iterations each.
    let mixed = with_slots(
        "mixed.img",
        vec![(1, pbkdf2(1 << 29)), (2, pbkdf2(1 << 29))],
    );
    let code = |extra: &[&str]| {
        udm()
            .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
            .arg(&kf)
            .args(extra)
            .arg(&mixed)
            .output()
            .unwrap()
    };
    let o = code(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("keyslot 1"),
        "{}",
        show(&o)
    );
    let o = code(&["--key-slot", "0"]);
    assert!(o.status.success(), "{}", show(&o));
    let o = code(&["--no-kdf-limit"]);
    assert!(o.status.success(), "{}", show(&o));
    // cryptsetup opens it too (slot 0 is tried first).
    assert_eq!(cs_test_code(&mixed, None, &kf), Some(0));
}

/// Run `cmd` for at most `limit`; None (after killing it) if it is still
/// running then, so a regression fails the test instead of hanging it.
fn run_bounded(cmd: &mut std::process::Command, limit: std::time::Duration) -> Option<Output> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    None
}

/// The digest's PBKDF2 runs once for every keyslot tried, after the
/// keyslot's own KDF, so a header can hide its cost there: a cheap LUKS1
/// keyslot behind 2^30 digest iterations (header bytes 164..168, no
/// checksum to fix) or a LUKS2 digest object asking the same took minutes
/// per open. Both are now refused within 1 s, with the right passphrase and
/// with a wrong one, naming the digest and its cost; `--no-kdf-limit`
/// still lets the user try (it is then busy deriving, not refusing).
#[test]
fn costly_digests_are_refused_before_any_kdf_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"digest");
    let wrong = write_file(d, "w", b"wrong");
    let l1 = sparse(d, "l1.img", 4 << 20);
    cs_format(&l1, &["--type=luks1", "--pbkdf-force-iterations=1000"], &kf);
    pwrite(&l1, 164, &(1u32 << 30).to_be_bytes());
    let l2 = luks2_image(d, "l2.img", &kf);
    rewrite_json(&l2, &|v| {
        v["digests"]["0"]["iterations"] = (1u64 << 30).into()
    });
    let limit = std::time::Duration::from_secs(1);
    for (img, hash) in [(&l1, "sha256"), (&l2, "sha256")] {
        for key in [&kf, &wrong] {
            let t = std::time::Instant::now();
            let o = run_bounded(
                udm()
                    .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
                    .arg(key)
                    .arg(img),
                limit,
            );
            let o = o.unwrap_or_else(|| panic!("{img:?} with {key:?}: still running after 1 s"));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{img:?}: {}", show(&o));
            let want = format!("the digest of keyslot 0 demands 1073741824 PBKDF2-{hash}");
            assert!(
                err.contains(&want) && err.contains("--no-kdf-limit"),
                "{img:?}: {err}"
            );
            assert!(t.elapsed() < limit, "{img:?}: {:?}", t.elapsed());
        }
        let busy = run_bounded(
            udm()
                .args(["cryptsetup", "open", "--test-passphrase", "--no-kdf-limit"])
                .arg("--key-file")
                .arg(&kf)
                .arg(img),
            std::time::Duration::from_millis(1500),
        );
        assert!(
            busy.is_none(),
            "{img:?}: --no-kdf-limit did not try the slot: {}",
            busy.as_ref().map(show).unwrap_or_default()
        );
    }
}

/// The smaller protections: a data segment at offset 0 behind an embedded
/// header is refused (its first write would destroy the keyslots); header
/// backups are created exclusively and readable by their owner only; a
/// key file others can read gets a warning.
#[test]
fn data_over_header_backups_and_key_file_modes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"prot");
    std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let img = luks2_image(d, "p.img", &kf);

    let over = d.join("over.img");
    std::fs::copy(&img, &over).unwrap();
    rewrite_json(&over, &|v| v["segments"]["0"]["offset"] = "0".into());
    let e = udm::luks::open(&over, None, b"prot")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("segments.0.offset") && e.contains("overlap"),
        "{e}"
    );

    let bk = d.join("bk");
    let o = udm()
        .args(["cryptsetup", "luksHeaderBackup", "--header-backup-file"])
        .arg(&bk)
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        std::fs::metadata(&bk).unwrap().permissions().mode() & 0o7777,
        0o400
    );
    let before = std::fs::read(&bk).unwrap();
    let o = udm()
        .args(["cryptsetup", "luksHeaderBackup", "--header-backup-file"])
        .arg(&bk)
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    assert!(
        std::fs::read(&bk).unwrap() == before,
        "existing backup was touched"
    );

    let o = run(udm()
        .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
        .arg(&kf)
        .arg(&img));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("readable by"));
    std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run(udm()
        .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
        .arg(&kf)
        .arg(&img));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("readable by group or others (mode 0644)"),
        "{}",
        show(&o)
    );
}

/// F17: LUKS2's header checksum is unkeyed, so whoever holds the storage
/// can rewrite the data segment's cipher to `cipher_null-ecb` (or a
/// keyslot area's) while every keyslot still opens; udm then wrote new
/// data in clear with the real key. Both are refused, naming the cipher,
/// through `serve --luks`, `serve --crypttab` and `cryptsetup open`;
/// `--allow-weak-cipher` is the explicit way through.
#[test]
fn null_and_ecb_ciphers_in_a_header_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"weak");
    let base = luks2_image(d, "base.img", &kf);
    let edited = |name: &str, field: &'static str, cipher: &'static str| {
        let img = d.join(name);
        std::fs::copy(&base, &img).unwrap();
        rewrite_json(&img, &|v| match field {
            "segment" => v["segments"]["0"]["encryption"] = cipher.into(),
            _ => v["keyslots"]["0"]["area"]["encryption"] = cipher.into(),
        });
        img
    };
    let limit = std::time::Duration::from_secs(20);
    let serve = |sock: &str, args: &[&OsStr]| {
        let o = run_bounded(
            udm()
                .args(["serve", "--socket"])
                .arg(d.join(sock))
                .args(args),
            limit,
        );
        o.unwrap_or_else(|| panic!("udm serve {args:?} started (mapped a weak cipher)"))
    };
    for cipher in ["cipher_null-ecb", "aes-ecb"] {
        let img = edited("seg.img", "segment", cipher);
        let e = udm::luks::open(&img, None, b"weak").unwrap_err();
        assert!(matches!(e, LuksError::WeakCipher { .. }), "{e}");
        let luks = format!("v={}", img.display());
        let o = serve(
            "a.sock",
            &[
                OsStr::new("--luks"),
                OsStr::new(&luks),
                OsStr::new("--key-file"),
                kf.as_os_str(),
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", show(&o));
        assert!(
            err.contains(&format!("data segment 0 uses cipher {cipher}"))
                && err.contains("--allow-weak-cipher"),
            "{err}"
        );
        let tab = write_file(
            d,
            "crypttab",
            format!("v {} {} luks\n", img.display(), kf.display()).as_bytes(),
        );
        let o = serve("b.sock", &[OsStr::new("--crypttab"), tab.as_os_str()]);
        assert!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(cipher),
            "{}",
            show(&o)
        );
    }
    // With the override the same volume is served.
    let img = edited("seg.img", "segment", "cipher_null-ecb");
    let luks = format!("v={}", img.display());
    let srv = UdmServe::start(
        &d.join("c.sock"),
        &[
            OsStr::new("--luks"),
            OsStr::new(&luks),
            OsStr::new("--key-file"),
            kf.as_os_str(),
            OsStr::new("--allow-weak-cipher"),
        ],
    );
    srv.stop();

    // A keyslot area: refused before its KDF runs.
    let img = edited("area.img", "area", "cipher_null-ecb");
    let o = udm()
        .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
        .arg(&kf)
        .arg(&img)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        err.contains("keyslot 0's area uses cipher cipher_null-ecb"),
        "{err}"
    );
}

/// F21: `luksDump` printed header strings raw, so a header could send
/// terminal escape sequences (retitle, clear, recolour, fake lines) to
/// whoever inspects it. Control and invisible format characters in label,
/// subsystem, flags and token JSON now print escaped, in the dump and in
/// `--dump-json-metadata` (still valid JSON).
#[test]
fn luks_dump_escapes_terminal_controls_from_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"esc");
    let img = luks2_image(d, "e.img", &kf);
    // The binary fields refuse control characters already (parser);
    // invisible format characters pass it.
    let label = "a\u{202e}gpj.exe";
    let subsystem = "s\u{200b}x";
    for off in [0u64, 16384] {
        let mut l = [0u8; 48];
        l[..label.len()].copy_from_slice(label.as_bytes());
        pwrite(&img, off + 24, &l);
        let mut s = [0u8; 48];
        s[..subsystem.len()].copy_from_slice(subsystem.as_bytes());
        pwrite(&img, off + 208, &s);
    }
    rewrite_json(&img, &|v| {
        v["tokens"]["0"] =
            serde_json::json!({"type": "t\u{1b}[31mred\nKey Slot 9: ENABLED", "keyslots": []});
        v["config"]["flags"] = serde_json::json!(["f\u{7f}\u{1b}c"]);
    });
    let hostile = |out: &[u8]| {
        out.contains(&0x1b)
            || out.contains(&0x07)
            || out.contains(&0x7f)
            || out.windows(2).any(|w| w == [0xc2, 0x9b])
            || out.windows(3).any(|w| w == "\u{202e}".as_bytes())
            || out.windows(3).any(|w| w == "\u{200b}".as_bytes())
    };
    let o = run(udm().args(["cryptsetup", "luksDump"]).arg(&img));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!hostile(&o.stdout), "{text:?}");
    assert!(
        text.contains("Label:         \ta\\u{202e}gpj.exe\n")
            && text.contains("s\\u{200b}x")
            && text.contains("t\\x1b[31mred\\x0aKey Slot 9: ENABLED")
            && text.contains("f\\x7f\\x1bc"),
        "{text}"
    );
    assert!(!text.contains("\nKey Slot 9"), "{text}");
    let o = run(udm()
        .args(["cryptsetup", "luksDump", "--dump-json-metadata"])
        .arg(&img));
    assert!(
        !hostile(&o.stdout),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let back: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(back["config"]["flags"][0], "f\u{7f}\u{1b}c");
}

/// F24: a `--table` file with a crypt key that group or others can read
/// is a readable key file; key files got a warning, table files none.
/// Now both do; a private table, or one naming its key through the
/// keyring, gets none.
#[test]
fn readable_table_files_with_keys_get_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = sparse(d, "t.img", 1 << 20);
    let key = "ab".repeat(64);
    let line = format!("0 2048 crypt aes-xts-plain64 {key} 0 {} 0\n", img.display());
    let tbl = write_file(d, "t.table", line.as_bytes());
    let serve_log = |sock: &str, mode: u32| {
        std::fs::set_permissions(&tbl, std::fs::Permissions::from_mode(mode)).unwrap();
        let sock = d.join(sock);
        let table = format!("x={}", tbl.display());
        let srv = UdmServe::start(&sock, &[OsStr::new("--table"), OsStr::new(&table)]);
        assert_eq!(srv.stop(), Some(0));
        std::fs::read_to_string(sock.with_extension("log")).unwrap()
    };
    let log = serve_log("a.sock", 0o644);
    let want = format!(
        "WARNING: table file {} holds a crypt key and is readable by group or others (mode 0644)",
        tbl.display()
    );
    assert!(log.contains(&want), "{log}");
    assert!(!log.contains(&key), "the warning shows the key: {log}");
    let log = serve_log("b.sock", 0o600);
    assert!(!log.contains("WARNING: table file"), "{log}");
}

/// F5: the cap counted PBKDF2 iterations, but PBKDF2 runs them once per
/// hash-sized block of output: a keyslot deriving a 512-byte area key
/// with SHA-1 (26 blocks) just under the iteration cap took about 25
/// minutes per try. It is now refused within 1 s, naming the blocks.
#[test]
fn pbkdf2_cost_counts_output_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"blocks");
    let img = luks2_image(d, "b.img", &kf);
    let salt = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    rewrite_json(&img, &|v| {
        v["keyslots"]["0"]["kdf"] = serde_json::json!({
            "type": "pbkdf2", "hash": "sha1", "iterations": (1u64 << 29) - 10_000, "salt": salt
        });
        v["keyslots"]["0"]["area"]["key_size"] = 512.into();
    });
    let limit = std::time::Duration::from_secs(1);
    let t = std::time::Instant::now();
    let o = run_bounded(
        udm()
            .args(["cryptsetup", "open", "--test-passphrase", "--key-file"])
            .arg(&kf)
            .arg(&img),
        limit,
    )
    .unwrap_or_else(|| panic!("still deriving after 1 s"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        err.contains(
            "keyslot 0 demands 536860912 PBKDF2-sha1 iterations for each of 26 output blocks"
        ) && err.contains("--no-kdf-limit"),
        "{err}"
    );
    assert!(t.elapsed() < limit, "{:?}", t.elapsed());
}

/// A damaged header copy is recovered as cryptsetup recovers it: only the
/// bad copy is written, with the good copy's seqid (the epoch does not
/// move) and JSON area byte for byte, under a new salt; the good copy is
/// untouched. cryptsetup's own auto-recovery of the same damage gives the
/// same bytes but for the salt and the checksum over it. A header whose
/// keyslot names a KDF udm does not know still dumps and is still
/// recovered, and that keyslot fails only when it is used.
#[test]
fn repair_writes_only_the_bad_copy_as_cryptsetup_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"rec");
    let base = luks2_image(d, "base.img", &kf);
    for (bad_off, good_off) in [(0u64, 16384u64), (16384, 0)] {
        let img = d.join(format!("r{bad_off}.img"));
        std::fs::copy(&base, &img).unwrap();
        // One flipped byte in the JSON area: a checksum mismatch.
        let mut b = pread(&img, bad_off + 4096, 1);
        b[0] ^= 0x20;
        pwrite(&img, bad_off + 4096, &b);
        let theirs = d.join(format!("c{bad_off}.img"));
        std::fs::copy(&img, &theirs).unwrap();
        let good_before = pread(&img, good_off, 16384);
        run(udm().args(["cryptsetup", "repair", "-q"]).arg(&img));
        assert_eq!(
            pread(&img, good_off, 16384),
            good_before,
            "good copy rewritten"
        );
        let bad_after = pread(&img, bad_off, 16384);
        // seqid (bytes 16..24) and the JSON area as the good copy's.
        assert_eq!(bad_after[16..24], good_before[16..24], "seqid moved");
        assert_eq!(bad_after[4096..], good_before[4096..], "JSON area differs");
        // cryptsetup's luksDump recovers its copy: equal but for the salt
        // (0x68..0xA8) and checksum (0x1C0..0x200).
        run(cryptsetup().arg("luksDump").arg(&theirs));
        let cs_after = pread(&theirs, bad_off, 16384);
        for (i, (a, c)) in bad_after.iter().zip(&cs_after).enumerate() {
            let salt_or_sum = (0x68..0xA8).contains(&i) || (0x1C0..0x200).contains(&i);
            assert!(
                salt_or_sum || a == c,
                "byte {i} of the recovered copy differs"
            );
        }
        assert_ne!(
            bad_after[0x68..0xA8],
            good_before[0x68..0xA8],
            "salt not renewed"
        );
        // Nothing left to repair.
        run(udm().args(["cryptsetup", "repair", "-q"]).arg(&img));
        assert_eq!(pread(&img, bad_off, 16384), bad_after);
    }
    // An unknown KDF name in keyslot 0: the header dumps, keyslot 0 fails
    // when it is used, naming the field.
    let img = d.join("kdf.img");
    std::fs::copy(&base, &img).unwrap();
    rewrite_json(&img, &|v| {
        v["keyslots"]["0"]["kdf"]["type"] = "argon2".into()
    });
    let o = run(udm().args(["cryptsetup", "luksDump"]).arg(&img));
    assert!(String::from_utf8_lossy(&o.stdout).contains("PBKDF:      argon2"));
    run(cryptsetup().arg("luksDump").arg(&img));
    let e = udm::luks::open(&img, None, b"rec").unwrap_err().to_string();
    assert!(e.contains("keyslots.0.kdf.type"), "{e}");
}
