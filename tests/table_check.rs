//! `udm table check` runs every line through its target's own constructor
//! without opening a device (`--open`: with the devices opened read-only),
//! and on error prints nothing but the error — naming the line and the
//! field — and exits 1.

mod common;

use std::path::Path;
use std::process::Output;

use common::{scratch, show, udm};

fn check(dir: &Path, table: &str, extra: &[&str]) -> Output {
    let t = dir.join("t.table");
    std::fs::write(&t, table).unwrap();
    udm()
        .args(["table", "check"])
        .args(extra)
        .arg(&t)
        .output()
        .unwrap()
}

/// Exit code 1, stdout empty, and stderr one line that names the line and
/// the field and says `word`.
fn refused(out: &Output, line: usize, field: &str, word: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", show(out));
    assert!(
        out.stdout.is_empty(),
        "printed more than the error:\n{}",
        show(out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    for want in [&format!("line {line}, {field}:") as &str, word] {
        assert!(err.contains(want), "'{want}' missing: {err}");
    }
}

fn accepted(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", show(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The key must suit the cipher: aes-xts-plain64 takes two equal AES keys,
/// so 32, 48 or 64 bytes (AES-128, -192 or -256 halves, as the kernel's
/// `xts(aes)` outside FIPS mode); 24 bytes (48 hex digits) or 40 bytes
/// are refused, and the key is never shown.
#[test]
fn crypt_key_length_is_checked_against_the_cipher() {
    let d = scratch("udm-check-");
    for bytes in [24usize, 40, 20] {
        let key = "5a".repeat(bytes);
        let out = check(
            d.path(),
            &format!("0 8 zero\n8 8 crypt aes-xts-plain64 {key} 0 /dev/no-such-disk 0\n"),
            &[],
        );
        refused(&out, 2, "argument 2 (key)", "XTS key");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("5a5a"));
    }
    for bytes in [32usize, 48, 64] {
        let key = "5a".repeat(bytes);
        let out = accepted(&check(
            d.path(),
            &format!("0 8 crypt aes-xts-plain64 {key} 0 /dev/no-such-disk 0\n"),
            &[],
        ));
        assert!(!out.contains("5a5a"), "key shown: {out}");
        assert!(out.contains("1 segment(s), 8 sectors"), "{out}");
    }
}

#[test]
fn stripe_count_must_match_the_devices() {
    let d = scratch("udm-check-");
    let out = check(d.path(), "0 24 striped 3 8 /dev/a 0 /dev/b 0\n", &[]);
    refused(
        &out,
        1,
        "argument 1 (#stripes)",
        "3 stripes need 8 arguments",
    );
    let out = check(d.path(), "0 24 striped 2 8 /dev/a 0 /dev/b 0\n", &[]);
    refused(&out, 1, "striped", "not divisible");
    let out = check(d.path(), "0 32 striped 2 0 /dev/a 0 /dev/b 0\n", &[]);
    refused(&out, 1, "argument 2 (chunk_size)", "chunk size");
    accepted(&check(
        d.path(),
        "0 32 striped 2 8 /dev/a 0 /dev/b 0\n",
        &[],
    ));
}

#[test]
fn crypt_sector_size_iv_offset_and_features() {
    let d = scratch("udm-check-");
    let key = "5a".repeat(64);
    for (opts, field, word) in [
        ("1 1 sector_size:4096", "argument 3 (iv_offset)", "multiple"),
        ("0 1 sector_size:1000", "argument 7", "sector_size"),
        (
            "0 1 no_such_feature",
            "argument 7",
            "unknown optional parameter",
        ),
        (
            "0 2 allow_discards",
            "argument 6 (#opt_params)",
            "announced",
        ),
    ] {
        let (iv, rest) = opts.split_once(' ').unwrap();
        let out = check(
            d.path(),
            &format!("0 8 crypt aes-xts-plain64 {key} {iv} /dev/x 0 {rest}\n"),
            &[],
        );
        refused(&out, 1, field, word);
    }
    refused(
        &check(d.path(), "0 8 zero\n8 8 no_such_target x\n", &[]),
        2,
        "target",
        "unknown target type",
    );
}

/// `--open` opens the devices read-only and checks the areas against their
/// sizes; without it the same table passes (nothing is opened).
#[test]
fn open_checks_device_sizes() {
    let d = scratch("udm-check-");
    let img = d.path().join("small.img");
    std::fs::write(&img, vec![7u8; 64 << 10]).unwrap();
    let table = format!("0 256 linear {} 0\n", img.display());
    accepted(&check(d.path(), &table, &[]));
    refused(
        &check(d.path(), &table, &["--open"]),
        1,
        "argument 2 (offset)",
        "does not fit",
    );
    let table = format!("0 128 linear {} 0\n", img.display());
    accepted(&check(d.path(), &table, &["--open"]));
    let out = check(d.path(), "0 8 linear /no/such/file 0\n", &["--open"]);
    refused(&out, 1, "argument 1 (device)", "cannot open");
    assert_eq!(
        std::fs::read(&img).unwrap(),
        vec![7u8; 64 << 10],
        "a check changed the device"
    );
}
