//! The integrity target's bitmap mode (`B`) against the installed
//! `integritysetup` 2.6.1 and through a running server: udm's bitmap
//! format and the superblock it keeps while open and after a close are
//! what `integritysetup dump` reads back; data round trips through
//! `udm integritysetup open --integrity-bitmap-mode`; and SIGKILLs during
//! writes leave no sector whose tag mismatches after the restart. FAILS
//! if integritysetup or python3-libnbd is missing.

mod common;

use std::path::Path;
use std::process::Command;

use common::integrity::{field, nbd_py, ok, uis};
use common::*;

/// `integritysetup dump` of `img`, checked equal to udm's own.
fn dump(img: &Path) -> String {
    let p = img.to_str().unwrap();
    let theirs = ok(Command::new(need("integritysetup")).args(["dump", p]));
    assert_eq!(ok(uis().args(["dump", p])), theirs);
    theirs
}

/// `close vol`, retried while an NBD client's disconnect is still on
/// its way to the server.
fn close(ctl: &str) {
    wait_for("close vol", std::time::Duration::from_secs(20), || {
        uis()
            .args(["close", "vol", "--control", ctl])
            .output()
            .unwrap()
            .status
            .success()
    });
}

fn serve(d: &Path) -> UdmServe {
    let sock = d.join("nbd.sock");
    let _ = std::fs::remove_file(&sock);
    let ctl = d.join("ctl");
    UdmServe::start(&sock, &["--control", ctl.to_str().unwrap()])
}

/// `format` options, then the dump fields they must give.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);

#[test]
fn bitmap_format_reads_back_in_integritysetup_dump() {
    let d = scratch("integrity-bfmt");
    let cases: &[Case] = &[
        (
            &["--integrity-bitmap-mode"],
            &[
                ("superblock_version", "5"),
                ("log2_blocks_per_bitmap", "15"),
            ],
        ),
        (
            &[
                "--integrity-bitmap-mode",
                "--bitmap-sectors-per-bit",
                "4096",
                "--sector-size",
                "4096",
                "--integrity-legacy-padding",
                "--integrity-legacy-hmac",
            ],
            &[
                ("superblock_version", "3"),
                ("log2_blocks_per_bitmap", "9"),
                ("flags", ""),
            ],
        ),
    ];
    for (i, (opts, want)) in cases.iter().enumerate() {
        let img = sparse(d.path(), &format!("{i}.img"), 64 << 20);
        ok(uis()
            .args(["format", "-q", "--no-wipe", img.to_str().unwrap()])
            .args(*opts));
        let theirs = dump(&img);
        for (k, v) in *want {
            assert_eq!(field(&theirs, k), *v, "{k} of {opts:?}:\n{theirs}");
        }
    }
}

#[test]
fn bitmap_mode_round_trips_and_marks_the_superblock_dirty_while_open() {
    let d = scratch("integrity-brw");
    let img = sparse(d.path(), "v.img", 32 << 20);
    let p = img.to_str().unwrap();
    ok(uis().args(["format", "-q", "--integrity-bitmap-mode", p]));
    let ctl = d.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let open = |extra: &[&str]| {
        ok(uis()
            .args(["open", p, "vol", "--control", ctl, "-B"])
            .args(extra));
    };
    let srv = serve(d.path());
    open(&[
        "--bitmap-sectors-per-bit",
        "512",
        "--bitmap-flush-time",
        "300",
    ]);
    let st = ok(uis().args(["status", "vol", "--control", ctl]));
    assert!(
        st.contains("bitmap 512-byte sectors per bit: 512")
            && st.contains("bitmap flush interval: 300 ms"),
        "{st}"
    );
    let write = "import random\nr = random.Random(9)\n\
                 buf = bytes(r.getrandbits(8) for _ in range(1 << 18))\n\
                 h.pwrite(buf, 4096)\nh.flush()\nprint(h.get_size())";
    let o = nbd_py(&srv.sock, "vol", write);
    assert!(o.status.success(), "{}", show(&o));
    // Written to: dirty, with the line's bit size.
    let open_dump = dump(&img);
    assert_eq!(field(&open_dump, "log2_blocks_per_bitmap"), "9");
    assert!(
        field(&open_dump, "flags").contains("dirty_bitmap"),
        "{open_dump}"
    );
    close(ctl);
    srv.stop();
    let closed = dump(&img);
    assert!(
        !field(&closed, "flags").contains("dirty_bitmap"),
        "{closed}"
    );
    let srv = serve(d.path());
    open(&[]);
    let check = "import random\nr = random.Random(9)\n\
                 buf = bytes(r.getrandbits(8) for _ in range(1 << 18))\n\
                 assert h.pread(1 << 18, 4096) == buf\nprint('same')";
    let o = nbd_py(&srv.sock, "vol", check);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("same"),
        "{}",
        show(&o)
    );
    srv.stop();
}

#[test]
fn sigkill_during_bitmap_mode_writes_leaves_no_tag_mismatch() {
    let d = scratch("integrity-bkill");
    let p = d.path();
    let img = sparse(p, "v.img", 24 << 20);
    ok(uis().args(["format", "-q", "-B", img.to_str().unwrap()]));
    let sectors: u64 = field(&dump(&img), "provided_data_sectors").parse().unwrap();
    let table = p.join("ig.table");
    std::fs::write(
        &table,
        format!(
            "0 {} integrity {} 0 4 B 5 sectors_per_bit:256 bitmap_flush_interval:200 \
             fix_padding fix_hmac internal_hash:crc32c\n",
            sectors / 8 * 8,
            img.display()
        ),
    )
    .unwrap();
    crash::sigkill_rounds(p, &table, "ig", 20, "integrity bitmap mode", false);
    let after = dump(&img);
    assert!(!field(&after, "flags").contains("dirty_bitmap"), "{after}");
}

#[test]
fn allow_discards_trims_read_back_and_the_table_says_so() {
    let d = scratch("integrity-discard");
    let img = sparse(d.path(), "v.img", 32 << 20);
    let p = img.to_str().unwrap();
    ok(uis().args(["format", "-q", p]));
    let ctl = d.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let srv = serve(d.path());
    ok(uis().args(["open", p, "vol", "--control", ctl, "--allow-discards"]));
    let table = ok(udm()
        .args(["dmsetup", "table", "vol"])
        .env("UDM_CONTROL", ctl));
    assert!(table.contains(" allow_discards"), "{table}");
    let io = "h.pwrite(b'\\x77' * 65536, 0)\nh.flush()\n\
              assert h.can_trim()\nh.trim(32768, 8192)\nh.flush()\n\
              b = h.pread(65536, 0)\nassert b[:8192] == b'\\x77' * 8192\n\
              assert b[40960:] == b'\\x77' * (65536 - 40960)\nprint('read')";
    let o = nbd_py(&srv.sock, "vol", io);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("read"),
        "{}",
        show(&o)
    );
    close(ctl);
    // Without allow_discards the filler tags are mismatches.
    ok(uis().args(["open", p, "vol", "--control", ctl]));
    let o = nbd_py(&srv.sock, "vol", "h.pread(512, 32768)");
    assert!(!o.status.success(), "{}", show(&o));
    srv.stop();
}

#[test]
fn recalculate_makes_an_unwiped_device_readable_and_keeps_its_position() {
    let d = scratch("integrity-recalc");
    let img = sparse(d.path(), "v.img", 32 << 20);
    let p = img.to_str().unwrap();
    ok(uis().args(["format", "-q", "--no-wipe", p]));
    let ctl = d.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let srv = serve(d.path());
    ok(uis().args(["open", p, "vol", "--control", ctl]));
    // Zeros under zero tags: crc32c does not match.
    let o = nbd_py(&srv.sock, "vol", "h.pread(4096, 0)");
    assert!(!o.status.success(), "{}", show(&o));
    close(ctl);
    ok(uis().args([
        "open",
        p,
        "vol",
        "--control",
        ctl,
        "--integrity-recalculate",
    ]));
    let first = ok(Command::new("integritysetup").args(["dump", p]));
    let provided = field(&first, "provided_data_sectors").to_string();
    wait_for(
        "the recalculation",
        std::time::Duration::from_secs(120),
        || {
            // integritysetup's alone: the superblock moves under two reads.
            let d = ok(Command::new("integritysetup").args(["dump", p]));
            field(&d, "flags").contains("recalculating")
                && d.lines().any(|l| l == format!("recalc_sector {provided}"))
        },
    );
    let o = nbd_py(
        &srv.sock,
        "vol",
        "n = h.get_size()\nfor o in range(0, n, 1 << 20):\n    h.pread(min(1 << 20, n - o), o)\nprint('all')",
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("all"),
        "{}",
        show(&o)
    );
    srv.stop();
}
