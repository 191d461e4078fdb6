//! `udm veritysetup` against the installed `veritysetup` 2.6.1 (whose
//! `format`, `verify` and `dump` run without device-mapper), and the
//! `verity` target through a running server: a tree made by either
//! program is accepted by the other, byte for byte, with the same output
//! and exit codes; an image formatted by veritysetup reads back through
//! `udm veritysetup open` and NBD, and a flipped byte fails exactly the
//! blocks it should. FAILS if veritysetup, nbdcopy or python3-libnbd is
//! missing.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output};

const UUID: &str = "12345678-1234-1234-1234-123456789abc";

fn vs() -> Command {
    Command::new(need("veritysetup"))
}

fn uvs() -> Command {
    let mut c = udm();
    c.arg("veritysetup");
    c
}

fn out(c: &mut Command, args: &[&str]) -> Output {
    c.args(args).output().unwrap()
}

/// Stdout with the hash file's name (which differs) taken out.
fn text(o: &Output, hash: &Path) -> String {
    String::from_utf8_lossy(&o.stdout).replace(&hash.display().to_string(), "HASH")
}

fn root_of(o: &Output) -> String {
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    t.lines()
        .find_map(|l| l.strip_prefix("Root hash:"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|| panic!("no root hash in:\n{t}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn format_is_byte_identical_and_each_verifies_the_others_tree() {
    let dir = scratch("verity-fmt");
    let d = dir.path();
    let data = write_file(d, "d.img", &fast_bytes(7, (1 << 20) + 4096 * 3));
    // Options of `format`, and what `verify` needs besides the superblock.
    let cases: &[(&[&str], &[&str])] = &[
        (&[], &[]),
        (
            &[
                "--hash",
                "sha1",
                "--format",
                "0",
                "--data-block-size",
                "1024",
                "--hash-block-size",
                "512",
            ],
            &[],
        ),
        (&["--hash", "sha512", "--salt", "-"], &[]),
        (
            &["--no-superblock"],
            &["--no-superblock", "--salt", "00aa11bb"],
        ),
        (
            &[
                "--hash-offset",
                "8192",
                "--data-block-size",
                "512",
                "--hash-block-size",
                "1024",
            ],
            &["--hash-offset", "8192"],
        ),
        (&["--data-blocks", "100"], &[]),
        (&["--data-blocks", "1"], &[]),
    ];
    for (i, (opts, vopts)) in cases.iter().enumerate() {
        let hv = d.join(format!("v{i}.img"));
        let hu = d.join(format!("u{i}.img"));
        let mut av = vec![
            "format",
            s(&data),
            s(&hv),
            "--salt",
            "00aa11bb",
            "--uuid",
            UUID,
        ];
        av.extend_from_slice(opts);
        let mut au = av.clone();
        au[2] = s(&hu);
        let ov = out(&mut vs(), &av);
        let ou = out(&mut uvs(), &au);
        assert!(ov.status.success(), "{opts:?}: {}", show(&ov));
        assert!(ou.status.success(), "{opts:?}: {}", show(&ou));
        assert_eq!(text(&ou, &hu), text(&ov, &hv), "{opts:?}: format output");
        assert!(
            std::fs::read(&hu).unwrap() == std::fs::read(&hv).unwrap(),
            "{opts:?}: hash device differs from veritysetup's"
        );
        let root = root_of(&ou);
        let check = |tool: &mut dyn FnMut() -> Command, hash: &Path| {
            let mut a = vec!["verify", s(&data), s(hash), root.as_str()];
            a.extend_from_slice(vopts);
            let o = out(&mut tool(), &a);
            assert!(o.status.success(), "{a:?}: {}", show(&o));
        };
        check(&mut vs, &hu);
        check(&mut uvs, &hv);
        if !opts.contains(&"--no-superblock") {
            let mut a = vec!["dump"];
            a.extend_from_slice(vopts);
            let dv = out(vs().args(&a), &[s(&hv)]);
            let du = out(uvs().args(&a), &[s(&hu)]);
            assert!(du.status.success(), "{}", show(&du));
            assert_eq!(text(&du, &hu), text(&dv, &hv), "{opts:?}: dump");
        }
    }
}

/// Runs `args` (with `{}` placeholders already filled) through both
/// programs: same exit code, same stdout, same stderr.
fn same(args: &[&str]) {
    let o1 = out(&mut vs(), args);
    let o2 = out(&mut uvs(), args);
    let strip = |o: &Output| String::from_utf8_lossy(&o.stderr).replace("veritysetup: ", "");
    assert_eq!(
        o2.status.code(),
        o1.status.code(),
        "{args:?}:\n{}",
        show(&o2)
    );
    assert_eq!(o2.stdout, o1.stdout, "{args:?}: stdout\n{}", show(&o2));
    assert_eq!(strip(&o2), strip(&o1), "{args:?}: stderr");
}

#[test]
fn failures_read_as_veritysetups() {
    let dir = scratch("verity-fail");
    let d = dir.path();
    let data = write_file(d, "d.img", &fast_bytes(9, 1 << 20));
    let hash = d.join("h.img");
    let o = out(&mut vs(), &["format", s(&data), s(&hash), "--salt", "01"]);
    assert!(o.status.success(), "{}", show(&o));
    let root = root_of(&o);
    let wrong = format!(
        "{}{}",
        if root.starts_with('0') { "1" } else { "0" },
        &root[1..]
    );
    let bad_data = d.join("bd.img");
    std::fs::copy(&data, &bad_data).unwrap();
    pwrite(&bad_data, 70_000, b"X");
    let bad_hash = d.join("bh.img");
    std::fs::copy(&hash, &bad_hash).unwrap();
    pwrite(&bad_hash, 4096 + 4000, b"X");
    let bad_digest = d.join("bg.img");
    std::fs::copy(&hash, &bad_digest).unwrap();
    pwrite(&bad_digest, 2 * 4096 + 40, b"X");
    let (d, h) = (s(&data), s(&hash));
    for args in [
        vec!["verify", d, h, &root],
        vec!["verify", "-v", d, h, &root],
        vec!["verify", d, h, &wrong],
        vec!["verify", "-v", s(&bad_data), h, &root],
        vec!["verify", d, s(&bad_hash), &root],
        vec!["verify", d, s(&bad_digest), &root],
        vec!["verify", d, h, "abc"],
        vec!["verify", d, h],
        vec!["dump", d],
        vec!["dump", "/nonexistent/h.img"],
        vec!["format", d, "/tmp/x.img", "--salt", "zz"],
        vec!["format", d, "/tmp/x.img", "--uuid", "bad"],
        vec!["format", d, "/tmp/x.img", "--data-block-size", "1000"],
        vec!["format", d, "/tmp/x.img", "--format", "2"],
        vec!["format", "--bogus", d, h],
        vec![
            "format",
            d,
            "/tmp/x.img",
            "--data-blocks",
            "1000000000000000",
        ],
        vec!["format", d, "/tmp/x.img", "--hash-offset", "100"],
        vec!["format", "/nonexistent/d.img", h],
    ] {
        same(&args);
    }
}

/// Reads every 4 KiB block of the export through libnbd; the blocks that
/// failed, each with EIO.
fn failing_blocks(uri: &str) -> Vec<u64> {
    need_python_module("nbd", "python3-libnbd");
    let script = "import nbd, sys\n\
        h = nbd.NBD(); h.connect_uri(sys.argv[1])\n\
        bad = []\n\
        for off in range(0, h.get_size(), 4096):\n\
        \x20   try: h.pread(4096, off)\n\
        \x20   except nbd.Error as e:\n\
        \x20       assert e.errno == 'EIO', e\n\
        \x20       bad.append(off // 4096)\n\
        print(' '.join(map(str, bad)))\n";
    let o = run(Command::new(PYTHON).args(["-c", script, uri]));
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect()
}

#[test]
fn veritysetup_image_reads_through_the_server_and_corruption_fails_its_blocks() {
    let dir = scratch("verity-open");
    let d = dir.path();
    let bytes = fast_bytes(11, 64 << 20);
    let data = write_file(d, "d.img", &bytes);
    let hash = d.join("h.img");
    let o = out(&mut vs(), &["format", s(&data), s(&hash)]);
    assert!(o.status.success(), "{}", show(&o));
    let root = root_of(&o);
    let srv = dm::DmServer::start(d, &[]);
    let ctl = s(&srv.ctl).to_string();
    let open = |name: &str| {
        let o = out(
            &mut uvs(),
            &["open", s(&data), name, s(&hash), &root, "--control", &ctl],
        );
        assert!(o.status.success(), "{}", show(&o));
    };
    open("v");
    let copy = d.join("copy.img");
    run(Command::new(need("nbdcopy")).args([&srv.uri("v"), s(&copy)]));
    assert!(
        std::fs::read(&copy).unwrap() == bytes,
        "nbdcopy read other bytes"
    );
    std::fs::remove_file(&copy).unwrap();
    let st = out(&mut uvs(), &["status", "v", "--control", &ctl]);
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(st.contains("  status:      verified\n"), "{st}");
    assert!(st.contains(&format!("  root hash:   {root}\n")), "{st}");
    assert!(st.contains("  hash offset: 8 sectors\n"), "{st}");
    assert!(srv
        .ok(&["table", "v"])
        .contains(&format!(" verity 1 {} ", s(&data))));

    // One flipped data byte: that block fails with EIO, no other.
    let events = srv.status_json("v")["event_nr"].as_u64().unwrap();
    pwrite(&data, 1000 * 4096 + 123, &[bytes[1000 * 4096 + 123] ^ 1]);
    assert_eq!(failing_blocks(&srv.uri("v")), [1000]);
    assert!(srv.ok(&["status", "v"]).trim_end().ends_with(" verity C"));
    assert!(srv.status_json("v")["event_nr"].as_u64().unwrap() > events);
    let st = out(&mut uvs(), &["status", "v", "--control", &ctl]);
    assert!(String::from_utf8_lossy(&st.stdout).contains("status:      corrupted"));
    pwrite(&data, 1000 * 4096 + 123, &[bytes[1000 * 4096 + 123]]);

    // One flipped byte in the second level-0 hash block (after the
    // superblock block and the top level): the 128 data blocks it
    // covers fail on a device opened after.
    let level0 = 4096 * 2;
    pwrite(&hash, level0 + 4096 + 5, b"\xff");
    open("w");
    let bad = failing_blocks(&srv.uri("w"));
    assert_eq!(bad, (128..256).collect::<Vec<u64>>());

    for n in ["v", "w"] {
        let o = out(&mut uvs(), &["close", n, "--control", &ctl]);
        assert!(o.status.success(), "{}", show(&o));
    }
    let o = out(&mut uvs(), &["status", "v", "--control", &ctl]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "/dev/mapper/v is inactive.\n"
    );
}

#[test]
fn fec_parity_is_byte_identical_and_each_repairs_with_the_others() {
    let dir = scratch("verity-fec");
    let d = dir.path();
    let bytes = fast_bytes(13, (1 << 20) + 4096 * 5);
    let data = write_file(d, "d.img", &bytes);
    // Options of `format` besides the FEC device; whether the parity goes
    // on the hash device (after a pre-sized tree area).
    let cases: &[(&[&str], bool)] = &[
        (&[], false),
        (
            &[
                "--fec-roots",
                "24",
                "--hash",
                "sha1",
                "--data-block-size",
                "512",
                "--hash-block-size",
                "512",
            ],
            false,
        ),
        (&["--fec-roots", "5", "--fec-offset", "65536"], true),
    ];
    for (i, (opts, on_hash)) in cases.iter().enumerate() {
        let (hv, hu) = (d.join(format!("hv{i}")), d.join(format!("hu{i}")));
        let (fv, fu) = if *on_hash {
            for h in [&hv, &hu] {
                std::fs::write(h, vec![0u8; 96 << 10]).unwrap();
            }
            (hv.clone(), hu.clone())
        } else {
            (d.join(format!("fv{i}")), d.join(format!("fu{i}")))
        };
        let base = |h: &Path, f: &Path| -> Vec<String> {
            let mut a: Vec<String> = ["format", s(&data), s(h), "--fec-device", s(f)]
                .iter()
                .map(|x| x.to_string())
                .collect();
            a.extend(["--salt", "0a0b", "--uuid", UUID].map(String::from));
            a.extend(opts.iter().map(|x| x.to_string()));
            a
        };
        let ov = vs().args(base(&hv, &fv)).output().unwrap();
        let ou = uvs().args(base(&hu, &fu)).output().unwrap();
        assert!(ov.status.success(), "{opts:?}: {}", show(&ov));
        assert!(ou.status.success(), "{opts:?}: {}", show(&ou));
        assert_eq!(text(&ou, &hu), text(&ov, &hv), "{opts:?}: format output");
        assert!(
            std::fs::read(&hu).unwrap() == std::fs::read(&hv).unwrap(),
            "{opts:?}: hash device differs"
        );
        assert!(
            std::fs::read(&fu).unwrap() == std::fs::read(&fv).unwrap(),
            "{opts:?}: FEC parity differs from veritysetup's"
        );
        let root = root_of(&ou);
        let fo: Vec<&str> = {
            let mut v = vec!["--fec-device", if *on_hash { s(&hu) } else { s(&fu) }];
            let mut it = opts.iter();
            while let Some(o) = it.next() {
                if o.starts_with("--fec") {
                    v.push(o);
                    v.push(it.next().unwrap());
                }
            }
            v
        };
        // veritysetup reads udm's tree and parity, and udm reads
        // veritysetup's (the same bytes, so one direction per program
        // on a damaged copy shows both decoders agree).
        let dump = |c: &mut Command, h: &Path| {
            let mut a = vec!["dump", s(h)];
            a.extend_from_slice(&fo);
            if *on_hash {
                let at = a.iter().position(|x| *x == s(&hu)).unwrap();
                a[at] = s(h);
            }
            out(c, &a)
        };
        let (dv, du) = (dump(&mut vs(), &hv), dump(&mut uvs(), &hu));
        assert!(du.status.success(), "{}", show(&du));
        assert_eq!(text(&du, &hu), text(&dv, &hv), "{opts:?}: dump");
        let bad = d.join(format!("bad{i}.img"));
        // Three bytes: repairable, and `verify` succeeds saying so; every
        // byte: whatever veritysetup says (beyond repair with 24 roots).
        for (damage, code) in [(3usize, 0), (bytes.len() - 4096 * 7, 2)] {
            let mut b = bytes.clone();
            for x in &mut b[4096 * 7..4096 * 7 + damage] {
                *x ^= 0x5a;
            }
            std::fs::write(&bad, &b).unwrap();
            let mut a = vec!["verify", s(&bad), s(&hu), root.as_str()];
            a.extend_from_slice(&fo);
            same(&a);
            // With 2 roots nearly any garbage is within one symbol of
            // some codeword, so only 24 roots call the wreck unrepairable.
            if damage != 3 && !opts.contains(&"24") {
                continue;
            }
            let o = out(&mut uvs(), &a);
            assert_eq!(
                o.status.code(),
                Some(code),
                "{opts:?} {damage}: {}",
                show(&o)
            );
        }
    }
}

#[test]
fn fec_repairs_corrupt_blocks_through_the_server() {
    let dir = scratch("verity-fec-open");
    let d = dir.path();
    let bytes = fast_bytes(17, 4 << 20);
    let data = write_file(d, "d.img", &bytes);
    let (hash, fec) = (d.join("h.img"), d.join("f.img"));
    let o = out(
        &mut vs(),
        &["format", s(&data), s(&hash), "--fec-device", s(&fec)],
    );
    assert!(o.status.success(), "{}", show(&o));
    let root = root_of(&o);
    let srv = dm::DmServer::start(d, &[]);
    let ctl = s(&srv.ctl).to_string();
    let open = |name: &str| {
        let o = out(
            &mut uvs(),
            &[
                "open",
                s(&data),
                name,
                s(&hash),
                &root,
                "--fec-device",
                s(&fec),
                "--control",
                &ctl,
            ],
        );
        assert!(o.status.success(), "{}", show(&o));
    };
    // A few bytes of one block, and a whole block of the same round
    // (blocks 300 and 600 share round 0): two errors in some codewords,
    // beyond 2 roots until the hashes mark both blocks as erasures.
    pwrite(&data, 300 * 4096 + 10, b"\x00\x01\x02\x03");
    pwrite(&data, 600 * 4096, &vec![0xaa; 4096]);
    open("v");
    assert!(srv.ok(&["table", "v"]).contains(&format!(
        "use_fec_from_device {} fec_blocks 1033 fec_start 0 fec_roots 2",
        s(&fec)
    )));
    let copy = d.join("copy.img");
    run(Command::new(need("nbdcopy")).args([&srv.uri("v"), s(&copy)]));
    assert!(
        std::fs::read(&copy).unwrap() == bytes,
        "the repaired blocks read back other bytes"
    );
    assert!(srv.ok(&["status", "v"]).trim_end().ends_with(" verity V 2"));
    let st = out(&mut uvs(), &["status", "v", "--control", &ctl]);
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(st.contains("  status:      verified\n"), "{st}");
    assert!(st.contains("  FEC roots:   2\n"), "{st}");

    // Three whole blocks of one round (1033 covered blocks, 5 rounds):
    // more than 2 roots can rebuild. Those fail, the rest still reads.
    pwrite(&data, 300 * 4096, &bytes[300 * 4096..301 * 4096]);
    pwrite(&data, 600 * 4096, &bytes[600 * 4096..601 * 4096]);
    for b in [100u64, 105, 110] {
        pwrite(&data, b * 4096, &vec![0x55; 4096]);
    }
    open("w");
    assert_eq!(failing_blocks(&srv.uri("w")), [100, 105, 110]);
    assert!(srv.ok(&["status", "w"]).trim_end().ends_with(" verity C 0"));
    for n in ["v", "w"] {
        let o = out(&mut uvs(), &["close", n, "--control", &ctl]);
        assert!(o.status.success(), "{}", show(&o));
    }
}
