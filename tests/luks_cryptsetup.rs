//! udm against cryptsetup 2.6: volumes made by either open in the other, with
//! the same volume key and the same data, for LUKS1/LUKS2, pbkdf2/argon2,
//! 512/4096-byte sectors and 256/512-bit XTS keys; keyslot changes made by
//! one are honoured by the other. FAILS if cryptsetup or python3-cryptography
//! is missing (apt-get install cryptsetup-bin python3-cryptography).

mod common;

use common::luks::*;
use common::*;
use std::path::Path;
use udm::crypto::SectorCrypt;

const PLAIN_AT: u64 = 1 << 20; // data-relative offset of the test pattern
const PLAIN_LEN: usize = 64 * 1024;

fn expected_table(case: &Case, key: &[u8], dev: &str, size: u64, data_off: u64) -> String {
    let len = (size - data_off) / 512;
    let mut t = format!(
        "0 {len} crypt aes-xts-plain64 {} 0 {dev} {}",
        hex::encode(key),
        data_off / 512
    );
    if case.luks == 2 && case.sector != 512 {
        t.push_str(&format!(" 1 sector_size:{}", case.sector));
    }
    t.push('\n');
    t
}

#[test]
fn cryptsetup_volumes_open_in_udm_with_same_key_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "pass", b"correct horse\nbattery");
    for (i, case) in cases().into_iter().enumerate() {
        let size = case.data_offset() + (4 << 20);
        let img = sparse(d, &format!("cs{i}.img"), size);
        cs_format(&img, &case.format_args(), &kf);
        let cs_key = cs_volume_key(&img, None, &kf);
        assert_eq!(cs_key.len() as u32 * 8, case.key_bits, "{case:?}");

        // Data encrypted outside udm (Python cryptography) with cryptsetup's key.
        let plain = bytes(i as u64 + 1, PLAIN_LEN);
        let cipher = py_crypt(
            d,
            "enc",
            "aes-xts-plain64",
            &cs_key,
            case.sector,
            PLAIN_AT / 512,
            &plain,
        );
        pwrite(&img, case.data_offset() + PLAIN_AT, &cipher);

        let act = udm::luks::open(&img, None, b"correct horse\nbattery")
            .unwrap_or_else(|e| panic!("{case:?}: {e}"));
        assert_eq!(act.volume_key(), &cs_key[..], "{case:?}");
        assert_eq!(act.version, case.luks);
        assert!(act.warnings.is_empty(), "{:?}", act.warnings);
        assert_eq!(
            &*act.table("/dev/x"),
            &expected_table(&case, &cs_key, "/dev/x", size, case.data_offset()),
            "{case:?}"
        );
        let seg = &act.segments[0];
        let sc = SectorCrypt::new(&seg.cipher, act.volume_key(), seg.sector_size, false).unwrap();
        let mut got = pread(&img, seg.offset_sectors * 512 + PLAIN_AT, PLAIN_LEN);
        sc.decrypt(&mut got, seg.iv_offset + PLAIN_AT / 512);
        assert!(got == plain, "{case:?}: data decrypted by udm differs");

        let e = udm::luks::open(&img, None, b"wrong").unwrap_err();
        assert!(matches!(e, udm::luks::LuksError::WrongPassphrase), "{e}");
    }
}

#[test]
fn udm_volumes_pass_cryptsetup_with_same_key_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "pass", b"udm pass");
    let bad = write_file(d, "bad", b"udm pasS");
    for (i, case) in cases().into_iter().enumerate() {
        let size = case.data_offset() + (4 << 20);
        let img = d.join(format!("u{i}.img"));
        run(udm()
            .args(["luks", "format", "--batch-mode"])
            .arg(format!("--size={size}"))
            .args(case.format_args())
            .arg("--key-file")
            .arg(&kf)
            .arg(&img));
        let text = cs_dump(&img);
        if case.luks == 2 {
            assert!(
                text.contains(&format!("PBKDF:      {}", case.pbkdf)),
                "{case:?}\n{text}"
            );
            assert!(
                text.contains(&format!("sector: {} [bytes]", case.sector)),
                "{case:?}\n{text}"
            );
            assert!(
                text.contains(&format!("Key:        {} bits", case.key_bits)),
                "{text}"
            );
        } else {
            assert!(
                text.contains(&format!("MK bits:       \t{}", case.key_bits)),
                "{text}"
            );
            assert!(
                text.contains(&format!("Hash spec:     \t{}", case.hash)),
                "{text}"
            );
            assert!(text.contains("Payload offset:\t4096"), "{text}");
        }
        assert!(
            cs_test(&img, None, &kf),
            "{case:?}: cryptsetup rejects udm's passphrase"
        );
        assert!(
            cs_test_code(&img, None, &bad) == Some(2),
            "{case:?}: cryptsetup accepts a wrong passphrase"
        );
        let cs_key = cs_volume_key(&img, None, &kf);
        let act = udm::luks::open(&img, None, b"udm pass").unwrap();
        assert_eq!(act.volume_key(), &cs_key[..], "{case:?}");
        // udm's own dump prints the same key.
        let o = run(udm()
            .args(["luks", "dump", "--dump-volume-key", "--key-file"])
            .arg(&kf)
            .arg(&img));
        assert_eq!(parse_mk_dump(&String::from_utf8_lossy(&o.stdout)), cs_key);

        // Data encrypted by udm's mapping decrypts outside udm with cryptsetup's key.
        let plain = bytes(100 + i as u64, PLAIN_LEN);
        let seg = &act.segments[0];
        assert_eq!(seg.offset_sectors * 512, case.data_offset());
        let sc = SectorCrypt::new(&seg.cipher, act.volume_key(), seg.sector_size, false).unwrap();
        let mut enc = plain.clone();
        sc.encrypt(&mut enc, PLAIN_AT / 512);
        pwrite(&img, case.data_offset() + PLAIN_AT, &enc);
        let back = py_crypt(
            d,
            "dec",
            "aes-xts-plain64",
            &cs_key,
            case.sector,
            PLAIN_AT / 512,
            &enc,
        );
        assert!(
            back == plain,
            "{case:?}: cryptsetup's key does not decrypt udm's data"
        );
    }
}

fn cs_add_key(img: &Path, old: &Path, new: &Path) {
    run(cryptsetup()
        .args([
            "luksAddKey",
            "-q",
            "--pbkdf-force-iterations=1000",
            "--pbkdf=pbkdf2",
            "--key-file",
        ])
        .arg(old)
        .arg(img)
        .arg(new));
}

#[test]
fn keyslot_changes_interoperate_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k0 = write_file(d, "k0", b"first");
    let k1 = write_file(d, "k1", b"second");
    let k2 = write_file(d, "k2", b"third");
    for luks in [1u8, 2] {
        let case = Case {
            luks,
            pbkdf: if luks == 1 { "pbkdf2" } else { "argon2id" },
            sector: 4096,
            key_bits: 512,
            hash: "sha256",
        };
        let size = case.data_offset() + (1 << 20);
        let pb: Vec<String> = case
            .format_args()
            .into_iter()
            .filter(|a| a.starts_with("--pbkdf"))
            .collect();

        // cryptsetup changes a udm volume.
        let img = d.join(format!("udm{luks}.img"));
        run(udm()
            .args(["luks", "format", "-q"])
            .arg(format!("--size={size}"))
            .args(case.format_args())
            .arg("--key-file")
            .arg(&k0)
            .arg(&img));
        cs_add_key(&img, &k0, &k1);
        assert_eq!(udm::luks::open(&img, None, b"second").unwrap().keyslot, 1);
        run(cryptsetup().args(["luksKillSlot", "-q"]).arg(&img).arg("0"));
        assert!(matches!(
            udm::luks::open(&img, None, b"first"),
            Err(udm::luks::LuksError::WrongPassphrase)
        ));
        assert!(udm::luks::open(&img, None, b"second").is_ok());

        // udm changes a cryptsetup volume.
        let img = sparse(d, &format!("cs{luks}.img"), size);
        cs_format(&img, &case.format_args(), &k0);
        let key = cs_volume_key(&img, None, &k0);
        run(udm()
            .args(["luks", "add-key"])
            .arg(&img)
            .arg(&k1)
            .arg("--key-file")
            .arg(&k0)
            .args(&pb));
        run(udm()
            .args(["luks", "add-key", "--key-slot=5"])
            .arg(&img)
            .arg(&k2)
            .arg("--key-file")
            .arg(&k1)
            .args(&pb));
        assert!(cs_test(&img, None, &k1) && cs_test(&img, None, &k2));
        assert_eq!(cs_volume_key(&img, None, &k2), key);
        let dump = cs_dump(&img);
        if luks == 1 {
            assert!(dump.contains("Key Slot 5: ENABLED"), "{dump}");
        } else {
            assert!(dump.contains("  5: luks2"), "{dump}");
        }
        run(udm()
            .args(["luks", "kill-slot", "--key-file"])
            .arg(&k1)
            .arg(&img)
            .arg("0"));
        assert!(
            cs_test_code(&img, None, &k0) == Some(2),
            "killed slot still opens in cryptsetup"
        );
        assert!(cs_test(&img, None, &k1));
        // As cryptsetup 2.6: while other slots remain, only another slot's
        // passphrase authorises killing a slot (its own is refused with 2).
        let cs_copy = d.join(format!("kill{luks}.img"));
        std::fs::copy(&img, &cs_copy).unwrap();
        let o = cryptsetup()
            .args(["luksKillSlot", "--key-file"])
            .arg(&k2)
            .arg(&cs_copy)
            .arg("5")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "cryptsetup: {}", show(&o));
        let o = udm()
            .args(["luks", "kill-slot", "--key-file"])
            .arg(&k2)
            .arg(&img)
            .arg("5")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        let o = udm()
            .args(["luks", "kill-slot", "--key-file"])
            .arg(&k1)
            .arg(&img)
            .arg("5")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", show(&o));
        let o = udm()
            .args(["luks", "kill-slot", "--key-file"])
            .arg(&k1)
            .arg(&img)
            .arg("1")
            .output()
            .unwrap();
        assert!(
            !o.status.success(),
            "killing the last slot without --batch-mode must not proceed"
        );
        run(udm()
            .args(["luks", "remove-key", "--batch-mode", "--key-file"])
            .arg(&k1)
            .arg(&img));
        // No keyslot left: "No usable keyslot is available", exit 1 (not
        // the 2 of a wrong passphrase), from both.
        assert_eq!(cs_test_code(&img, None, &k1), Some(1));
        // cryptsetup still reads the now keyless header.
        run(cryptsetup().arg("luksDump").arg(&img));
        let o = udm()
            .args(["luks", "test-passphrase", "--key-file"])
            .arg(&k1)
            .arg(&img)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    }
}

#[test]
fn zeroed_primary_header_opens_from_secondary_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"pw");
    let img = sparse(d, "z.img", 20 << 20);
    cs_format(&img, &FAST_PBKDF, &kf);
    let key = cs_volume_key(&img, None, &kf);
    pwrite(&img, 0, &vec![0u8; 16384]);
    let act = udm::luks::open(&img, None, b"pw").unwrap();
    assert_eq!(act.volume_key(), &key[..]);
    assert!(
        act.warnings
            .iter()
            .any(|w| w.contains("primary") && w.contains("secondary")),
        "{:?}",
        act.warnings
    );
    let o = run(udm()
        .args(["luks", "test-passphrase", "--key-file"])
        .arg(&kf)
        .arg(&img));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("WARNING") && err.contains("primary header is damaged"),
        "{err}"
    );

    // A checksum mismatch (one flipped JSON byte) is handled the same way.
    let img2 = sparse(d, "c.img", 20 << 20);
    cs_format(&img2, &FAST_PBKDF, &kf);
    let mut b = pread(&img2, 4096, 1);
    b[0] ^= 0x20;
    pwrite(&img2, 4096, &b);
    let act = udm::luks::open(&img2, None, b"pw").unwrap();
    assert!(
        act.warnings.iter().any(|w| w.contains("checksum")),
        "{:?}",
        act.warnings
    );

    // udm rewriting the header repairs the primary copy; cryptsetup sees a clean header.
    let k1 = write_file(d, "k1", b"pw1");
    udm_add_key(&img, &kf, &k1, &FAST_PBKDF);
    let act = udm::luks::open(&img, None, b"pw1").unwrap();
    assert!(act.warnings.is_empty(), "{:?}", act.warnings);
    assert!(cs_test(&img, None, &k1) && cs_test(&img, None, &kf));
}

#[test]
fn detached_headers_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"detached");
    let data = sparse(d, "data.img", 8 << 20);
    let hdr = d.join("hdr.img");
    run(cryptsetup()
        .args([
            "luksFormat",
            "-q",
            "--pbkdf=pbkdf2",
            "--pbkdf-force-iterations=1000",
            "--header",
        ])
        .arg(&hdr)
        .arg("--key-file")
        .arg(&kf)
        .arg(&data));
    let key = cs_volume_key(&data, Some(&hdr), &kf);
    let act = udm::luks::open(&data, Some(&hdr), b"detached").unwrap();
    assert_eq!(act.volume_key(), &key[..]);
    let t = act.table("/img");
    assert!(
        t.starts_with(&format!("0 {} crypt aes-xts-plain64 ", (8 << 20) / 512)),
        "{}",
        &*t
    );
    assert!(t.ends_with(" 0 /img 0 1 sector_size:4096\n"), "{}", &*t);

    let data2 = sparse(d, "data2.img", 8 << 20);
    let hdr2 = d.join("hdr2.img");
    run(udm()
        .args([
            "luks",
            "format",
            "-q",
            "--pbkdf=pbkdf2",
            "--pbkdf-force-iterations=1000",
            "--header",
        ])
        .arg(&hdr2)
        .arg("--key-file")
        .arg(&kf)
        .arg(&data2));
    assert!(cs_test(&data2, Some(&hdr2), &kf));
    assert_eq!(
        cs_volume_key(&data2, Some(&hdr2), &kf),
        udm::luks::open(&data2, Some(&hdr2), b"detached")
            .unwrap()
            .volume_key()
    );
    // The data image itself carries no header.
    assert!(pread(&data2, 0, 4096).iter().all(|&b| b == 0));
}

#[test]
fn tokens_survive_udm_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"tok");
    let k1 = write_file(d, "k1", b"tok1");
    let img = sparse(d, "t.img", 20 << 20);
    cs_format(&img, &FAST_PBKDF, &kf);
    let tok = write_file(
        d,
        "tok.json",
        br#"{"type":"x-udm-test","keyslots":["0"],"payload":{"nested":[1,"two",null]},"z":"last"}"#,
    );
    run(cryptsetup()
        .args(["token", "import", "--json-file"])
        .arg(&tok)
        .arg(&img));
    let before = cs_json(&img);
    udm_add_key(&img, &kf, &k1, &FAST_PBKDF);
    let after = cs_json(&img);
    assert_eq!(before["tokens"], after["tokens"]);
    // Killing slot 0 un-assigns it from the token but keeps the token itself.
    run(udm()
        .args(["luks", "kill-slot", "--key-file"])
        .arg(&k1)
        .arg(&img)
        .arg("0"));
    let after = cs_json(&img);
    assert_eq!(
        after["tokens"]["0"]["payload"],
        before["tokens"]["0"]["payload"]
    );
    assert_eq!(after["tokens"]["0"]["keyslots"], serde_json::json!([]));
}

#[test]
fn header_backup_and_restore_interoperate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"bk");
    for luks in ["luks1", "luks2"] {
        let img = d.join(format!("{luks}.img"));
        udm_format(
            &img,
            &[
                "--size=20M",
                FAST_PBKDF[0],
                FAST_PBKDF[1],
                &format!("--type={luks}"),
            ],
            &kf,
        );
        let bk = d.join(format!("{luks}.bk"));
        run(udm()
            .args(["luks", "header-backup", "--header-backup-file"])
            .arg(&bk)
            .arg(&img));
        // cryptsetup accepts udm's backup as a detached header.
        assert!(cs_test(&img, Some(&bk), &kf));
        let cs_bk = d.join(format!("{luks}.csbk"));
        run(cryptsetup()
            .args(["luksHeaderBackup", "--header-backup-file"])
            .arg(&cs_bk)
            .arg(&img));
        let (ours, theirs) = (std::fs::read(&bk).unwrap(), std::fs::read(&cs_bk).unwrap());
        assert_eq!(
            ours.len(),
            theirs.len(),
            "{luks}: backup size differs from cryptsetup's"
        );
        assert!(
            ours == theirs,
            "{luks}: backup content differs from cryptsetup's"
        );
        pwrite(&img, 0, &vec![0u8; 1 << 20]);
        assert!(udm::luks::open(&img, None, b"bk").is_err());
        run(udm()
            .args([
                "luks",
                "header-restore",
                "--batch-mode",
                "--header-backup-file",
            ])
            .arg(&bk)
            .arg(&img));
        assert!(cs_test(&img, None, &kf));
        assert!(udm::luks::open(&img, None, b"bk").is_ok());
    }
}

/// The table udm derives from a LUKS header, parsed by udm's table parser and
/// loaded into udm's crypt target, reads what Python encrypted with
/// cryptsetup's key and writes what Python decrypts with it.
#[test]
fn activation_table_serves_the_data_through_the_crypt_target() {
    use udm::core::device::WriteBuf;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "pass", b"table");
    for (i, case) in cases().into_iter().enumerate() {
        let size = case.data_offset() + (4 << 20);
        let img = sparse(d, &format!("t{i}.img"), size);
        cs_format(&img, &case.format_args(), &kf);
        let key = cs_volume_key(&img, None, &kf);
        let plain = bytes(200 + i as u64, PLAIN_LEN);
        let enc = py_crypt(
            d,
            "enc",
            "aes-xts-plain64",
            &key,
            case.sector,
            PLAIN_AT / 512,
            &plain,
        );
        pwrite(&img, case.data_offset() + PLAIN_AT, &enc);

        let act = udm::luks::open(&img, None, b"table").unwrap();
        let table = act.table(img.to_str().unwrap());
        let lines = udm::core::table::parse(&table).unwrap();
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert_eq!(
            (l.start, l.len * 512, l.target.as_str()),
            (0, size - case.data_offset(), "crypt")
        );
        let dev = udm::targets::crypt::new(udm::targets::TargetArgs {
            args: &l.args,
            len: l.len * 512,
            resolver: &mut Files,
            options: &udm::targets::TargetOptions::default(),
        })
        .unwrap_or_else(|e| {
            panic!(
                "{case:?}: udm's crypt target rejects the LUKS table: {}",
                e.msg
            )
        });
        let mut got = vec![0u8; PLAIN_LEN];
        dev.read(PLAIN_AT, &mut got).unwrap();
        assert!(got == plain, "{case:?}: crypt target reads different data");

        let plain2 = bytes(300 + i as u64, PLAIN_LEN);
        dev.write(2 * PLAIN_AT, WriteBuf::Borrowed(&plain2), true)
            .unwrap();
        let raw = pread(&img, case.data_offset() + 2 * PLAIN_AT, PLAIN_LEN);
        let back = py_crypt(
            d,
            "dec",
            "aes-xts-plain64",
            &key,
            case.sector,
            2 * PLAIN_AT / 512,
            &raw,
        );
        assert!(
            back == plain2,
            "{case:?}: data written through udm does not decrypt with cryptsetup's key"
        );
    }
}

/// Blank what is random per volume (salts, digests) so layouts compare.
fn layout_json(img: &Path) -> serde_json::Value {
    let mut v = cs_json(img);
    for group in ["keyslots", "digests"] {
        if let Some(o) = v[group].as_object_mut() {
            for (_, item) in o.iter_mut() {
                for f in ["salt", "digest"] {
                    if item.get(f).is_some() {
                        item[f] = "-".into();
                    }
                }
                if item.get("kdf").is_some() {
                    item["kdf"]["salt"] = "-".into();
                }
            }
        }
    }
    v
}

/// udm format and cryptsetup luksFormat with the same options produce the same
/// layout: offsets, sizes, KDF and AF parameters, epoch, label, UUID.
#[test]
fn format_layout_matches_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"layout");
    let uuid = "0badc0de-1234-4abc-8def-0123456789ab";
    let common = [
        "--pbkdf-force-iterations=4",
        "--pbkdf-memory=64",
        "--pbkdf-parallel=2",
    ];
    let sets: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--key-size=256", "--sector-size=512", "--label=data"],
        vec!["--luks2-metadata-size=64k", "--luks2-keyslots-size=2m"],
        vec![
            "--luks2-metadata-size=256k",
            "--cipher=aes-xts-plain64",
            "--hash=sha512",
        ],
        vec!["--pbkdf=argon2i"],
    ];
    for (i, set) in sets.iter().enumerate() {
        let a = sparse(d, &format!("cs{i}.img"), 24 << 20);
        let b = d.join(format!("udm{i}.img"));
        run(cryptsetup()
            .arg("luksFormat")
            .arg("-q")
            .args(common)
            .args(set)
            .arg(format!("--uuid={uuid}"))
            .arg("--key-file")
            .arg(&kf)
            .arg(&a));
        run(udm()
            .args(["luks", "format", "-q", "--size=24M"])
            .args(common)
            .args(set)
            .arg(format!("--uuid={uuid}"))
            .arg("--key-file")
            .arg(&kf)
            .arg(&b));
        assert_eq!(layout_json(&a), layout_json(&b), "options {set:?}");
        let head = |img: &Path| {
            let t = cs_dump(img);
            t.lines().take(9).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(head(&a), head(&b), "options {set:?}");
    }
    // LUKS1: same header fields apart from salts and digests.
    for bits in ["256", "512"] {
        let a = sparse(d, &format!("cs1-{bits}.img"), 8 << 20);
        let b = d.join(format!("udm1-{bits}.img"));
        let opts = ["--type=luks1", "--pbkdf-force-iterations=1000"];
        run(cryptsetup()
            .arg("luksFormat")
            .arg("-q")
            .args(opts)
            .arg(format!("--key-size={bits}"))
            .arg(format!("--uuid={uuid}"))
            .arg("--key-file")
            .arg(&kf)
            .arg(&a));
        run(udm()
            .args(["luks", "format", "-q", "--size=8M"])
            .args(opts)
            .arg(format!("--key-size={bits}"))
            .arg(format!("--uuid={uuid}"))
            .arg("--key-file")
            .arg(&kf)
            .arg(&b));
        let fields = |img: &Path| {
            let v = udm::luks::volume::Volume::load(img, None, false).unwrap();
            let udm::luks::volume::Header::Luks1(h) = v.header else {
                panic!("not LUKS1")
            };
            let slots: Vec<_> = h
                .slots
                .iter()
                .map(|s| (s.active, s.iterations, s.key_offset, s.stripes))
                .collect();
            (
                h.cipher_spec(),
                h.hash,
                h.payload_offset,
                h.key_bytes,
                h.mk_digest_iter,
                h.uuid.clone(),
                slots,
            )
        };
        assert_eq!(fields(&a), fields(&b), "LUKS1 {bits}-bit");
    }
}
