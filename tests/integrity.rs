//! `udm integritysetup` and the `integrity` target against the installed
//! `integritysetup` 2.6.1 (whose `dump` reads a superblock without the
//! kernel) and through a running server: udm's format is read back by
//! integritysetup with the parameters asked for; data written through
//! udm reads back after a restart; a flipped bit in a data sector is an
//! EIO on that sector only; and 20 SIGKILLs during journaled writes lose
//! no write acknowledged before a completed FLUSH and leave no sector
//! whose tag mismatches. FAILS
//! if integritysetup or python3-libnbd is missing.

mod common;

use std::path::Path;
use std::process::Command;

use common::integrity::{field, nbd_py, ok, uis};
use common::*;

/// `format` options, then the dump fields they must give.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);

#[test]
fn integritysetup_dump_reads_udms_format_with_the_parameters_asked() {
    let d = scratch("integrity-fmt");
    let key = write_file(d.path(), "key", &[0x42; 32]);
    let key = key.to_str().unwrap();
    let cases: &[Case] = &[
        (
            &[],
            &[
                ("integrity_tag_size", "4"),
                ("sector_size", "512"),
                ("log2_interleave_sectors", "15"),
            ],
        ),
        (
            &[
                "--tag-size",
                "8",
                "--integrity",
                "sha256",
                "--sector-size",
                "4096",
            ],
            &[("integrity_tag_size", "8"), ("sector_size", "4096")],
        ),
        (
            &[
                "--integrity",
                "sha1",
                "--journal-size",
                "1048576",
                "--interleave-sectors",
                "8192",
            ],
            &[
                ("integrity_tag_size", "20"),
                ("log2_interleave_sectors", "13"),
                ("journal_sections", "19"),
            ],
        ),
        (
            &[
                "--integrity",
                "hmac-sha256",
                "--integrity-key-file",
                key,
                "--integrity-key-size",
                "32",
            ],
            &[("integrity_tag_size", "32"), ("superblock_version", "5")],
        ),
        (
            &["--integrity-bitmap-mode", "--buffer-sectors", "64"],
            &[("superblock_version", "5")],
        ),
        (
            &[
                "--integrity-legacy-padding",
                "--integrity-legacy-hmac",
                "--journal-watermark",
                "60",
            ],
            &[("superblock_version", "1"), ("flags", "")],
        ),
    ];
    for (i, (opts, want)) in cases.iter().enumerate() {
        let img = sparse(d.path(), &format!("{i}.img"), 64 << 20);
        let p = img.to_str().unwrap();
        ok(uis().args(["format", "-q", "--no-wipe", p]).args(*opts));
        let theirs = ok(Command::new(need("integritysetup")).args(["dump", p]));
        let ours = ok(uis().args(["dump", p]));
        assert_eq!(ours, theirs, "dump of {opts:?}");
        for (k, v) in *want {
            assert_eq!(field(&theirs, k), *v, "{k} of {opts:?}:\n{theirs}");
        }
        let provided: u64 = field(&theirs, "provided_data_sectors").parse().unwrap();
        assert!(provided > 120_000 && provided < 131_072, "{provided}");
    }
    let img = sparse(d.path(), "bad.img", 1 << 20);
    let o = uis()
        .args(["dump", img.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
}

fn serve(d: &Path) -> UdmServe {
    let sock = d.join("nbd.sock");
    let _ = std::fs::remove_file(&sock);
    let ctl = d.join("ctl");
    UdmServe::start(&sock, &["--control", ctl.to_str().unwrap()])
}

#[test]
fn written_data_survives_a_restart_and_a_flipped_bit_fails_its_sector_only() {
    let d = scratch("integrity-rw");
    let img = sparse(d.path(), "v.img", 32 << 20);
    let p = img.to_str().unwrap();
    ok(uis().args(["format", "-q", p]));
    let ctl = d.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let srv = serve(d.path());
    ok(uis().args(["open", p, "vol", "--control", ctl]));
    let st = ok(uis().args(["status", "vol", "--control", ctl]));
    assert!(
        st.contains("type:    INTEGRITY") && st.contains("integrity: crc32c"),
        "{st}"
    );
    let write = "import random\nr = random.Random(5)\n\
                 buf = bytes(r.getrandbits(8) for _ in range(1 << 16))\n\
                 h.pwrite(buf, 0)\nh.pwrite(b'\\xa5' * 512, 5 * 512)\nh.flush()\n\
                 print(h.get_size())";
    let o = nbd_py(&srv.sock, "vol", write);
    assert!(o.status.success(), "{}", show(&o));
    srv.stop();
    // Restart: every byte reads back.
    let srv = serve(d.path());
    ok(uis().args(["open", p, "vol", "--control", ctl]));
    let check = "import random\nr = random.Random(5)\n\
                 buf = bytearray(r.getrandbits(8) for _ in range(1 << 16))\n\
                 buf[5*512:6*512] = b'\\xa5' * 512\nassert h.pread(1 << 16, 0) == bytes(buf)\n\
                 print('same')";
    let o = nbd_py(&srv.sock, "vol", check);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("same"),
        "{}",
        show(&o)
    );
    ok(uis().args(["close", "vol", "--control", ctl]));
    srv.stop();
    // Flip one bit of sector 5's data on the image.
    let raw = std::fs::read(&img).unwrap();
    let at = raw
        .windows(512)
        .position(|w| w.iter().all(|&b| b == 0xa5))
        .expect("sector 5 on the image");
    let mut b = pread(&img, at as u64 + 100, 1);
    b[0] ^= 0x10;
    pwrite(&img, at as u64 + 100, &b);
    let srv = serve(d.path());
    ok(uis().args(["open", p, "vol", "--control", ctl]));
    let probe = concat!(
        "bad = []\n",
        "for s in range(16):\n",
        "    try:\n",
        "        h.pread(512, s * 512)\n",
        "    except nbd.Error as e:\n",
        "        bad.append((s, e.errnum))\n",
        "print(bad)",
    );
    let o = nbd_py(&srv.sock, "vol", probe);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "[(5, 5)]",
        "{}",
        show(&o)
    );
    let st = ok(uis().args(["status", "vol", "--control", ctl]));
    assert!(st.contains("failures: 1"), "{st}");
    srv.stop();
}

/// J mode acknowledges a write once it is in the in-memory journal, as
/// the kernel does (a volatile write cache): only a FLUSH (or FUA) makes
/// it durable. So the check is crash_io.py's `flushed` one: every write
/// acknowledged before a completed FLUSH survives, a later one may be
/// lost (the block then holds an older acknowledged generation), and no
/// block's tag mismatches (an EIO fails the script).
#[test]
fn sigkill_during_journaled_writes_loses_nothing_flushed_and_no_tag_mismatches() {
    const KILLS: u32 = 20;
    let d = scratch("integrity-kill");
    let p = d.path();
    let img = sparse(p, "v.img", 24 << 20);
    ok(uis().args([
        "format",
        "-q",
        "--journal-size",
        "262144",
        img.to_str().unwrap(),
    ]));
    let dump = ok(uis().args(["dump", img.to_str().unwrap()]));
    let sectors: u64 = field(&dump, "provided_data_sectors").parse().unwrap();
    let table = p.join("ig.table");
    std::fs::write(
        &table,
        format!(
            "0 {} integrity {} 0 4 J 3 fix_padding fix_hmac internal_hash:crc32c\n",
            sectors / 8 * 8,
            img.display()
        ),
    )
    .unwrap();
    crash::sigkill_rounds(p, &table, "ig", KILLS, "integrity", true);
}

/// `--journal-crypt ctr-aes` and `--journal-integrity hmac-sha256`: the
/// journal of writes that were flushed but never placed (SIGKILL with the
/// watermark at 100 %, so nothing leaves the journal) is decrypted,
/// checked and replayed at the next open; a wrong journal MAC key is
/// refused by name, and the right one reads every byte back.
#[test]
fn a_sealed_journal_replays_after_sigkill_and_a_wrong_mac_key_is_refused() {
    let d = scratch("integrity-seal");
    let ck = write_file(d.path(), "ck", &[0x11; 32]);
    let mk = write_file(d.path(), "mk", &[0x22; 32]);
    let bad = write_file(d.path(), "bad", &[0x23; 32]);
    let img = sparse(d.path(), "v.img", 32 << 20);
    let p = img.to_str().unwrap();
    let jopts = |mk: &Path| {
        vec![
            "--journal-crypt".to_string(),
            "ctr-aes".into(),
            "--journal-crypt-key-file".into(),
            ck.display().to_string(),
            "--journal-integrity".into(),
            "hmac-sha256".into(),
            "--journal-integrity-key-file".into(),
            mk.display().to_string(),
        ]
    };
    ok(uis().args(["format", "-q", p]).args(jopts(&mk)));
    let dump = ok(uis().args(["dump", p]));
    assert!(dump.contains("have_journal_mac"), "{dump}");
    let ctl = d.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let srv = serve(d.path());
    ok(uis()
        .args([
            "open",
            p,
            "vol",
            "--control",
            ctl,
            "--journal-watermark",
            "100",
        ])
        .args(jopts(&mk)));
    const BUF: &str = "buf = (b'udm journal seal test ' * 3000)[:1 << 16]\n";
    let write = format!("{BUF}h.pwrite(buf, 8192)\nh.flush()\nprint('written')");
    let o = nbd_py(&srv.sock, "vol", &write);
    assert!(o.status.success(), "{}", show(&o));
    srv.kill9();
    // The data is nowhere on the image in the clear: only in the
    // encrypted journal.
    let raw = std::fs::read(&img).unwrap();
    let probe = b"udm journal seal test udm journal seal test ";
    assert!(
        !raw.windows(probe.len()).any(|w| w == probe),
        "plaintext of the write found on the image"
    );
    let srv = serve(d.path());
    let o = uis()
        .args(["open", p, "vol", "--control", ctl])
        .args(jopts(&bad))
        .output()
        .unwrap();
    let text = show(&o);
    assert!(
        !o.status.success() && text.contains("journal_mac"),
        "a wrong journal MAC key was not refused:\n{text}"
    );
    ok(uis()
        .args(["open", p, "vol", "--control", ctl])
        .args(jopts(&mk)));
    let check = format!("{BUF}assert h.pread(1 << 16, 8192) == buf\nprint('same')");
    let o = nbd_py(&srv.sock, "vol", &check);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("same"),
        "{}",
        show(&o)
    );
    srv.stop();
}
