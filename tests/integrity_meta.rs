//! dm-integrity with a separate metadata device (`meta_device`,
//! integritysetup's `--data-device`) against the installed
//! `integritysetup` 2.6.1 and through a running server: the superblock
//! udm writes on the metadata device is what `integritysetup dump` reads,
//! with the parameters asked for; in J, D and B modes data written
//! through udm reads back after a restart, lies in the clear on the data
//! device at the same offsets (readable without the metadata, as with the
//! kernel), and a flipped bit there fails its sector only; and SIGKILLs
//! during journaled writes lose no write acknowledged before a completed
//! FLUSH and leave no sector whose tag mismatches. FAILS if
//! integritysetup or python3-libnbd is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::integrity::{field, nbd_py, ok, uis};
use common::*;

const DATA: u64 = 32 << 20;
const META: u64 = 4 << 20;

/// `integritysetup dump` of `meta`, checked equal to udm's own.
fn dump(meta: &Path) -> String {
    let p = meta.to_str().unwrap();
    let theirs = ok(Command::new(need("integritysetup")).args(["dump", p]));
    assert_eq!(ok(uis().args(["dump", p])), theirs);
    theirs
}

/// A data image and a metadata image in `d`.
fn images(d: &Path, tag: &str) -> (PathBuf, PathBuf) {
    (
        sparse(d, &format!("{tag}-data.img"), DATA),
        sparse(d, &format!("{tag}-meta.img"), META),
    )
}

fn format(meta: &Path, data: &Path, opts: &[&str]) {
    ok(uis()
        .args(["format", "-q", meta.to_str().unwrap(), "--data-device"])
        .arg(data)
        .args(opts));
}

/// `format` options, then the dump fields they must give.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);

#[test]
fn integritysetup_dump_reads_the_metadata_device_udm_formats() {
    let d = scratch("integrity-meta-fmt");
    let cases: &[Case] = &[
        (
            &[],
            &[
                ("log2_interleave_sectors", "0"),
                ("integrity_tag_size", "4"),
                ("journal_sections", "2"),
                ("provided_data_sectors", "65536"),
                ("superblock_version", "5"),
                ("flags", "fix_hmac"),
            ],
        ),
        (
            &[
                "--integrity",
                "sha256",
                "--sector-size",
                "4096",
                "--journal-size",
                "1048576",
            ],
            &[
                ("integrity_tag_size", "32"),
                ("sector_size", "4096"),
                ("log2_interleave_sectors", "0"),
                ("provided_data_sectors", "65536"),
            ],
        ),
        (
            &[
                "--integrity-bitmap-mode",
                "--integrity-legacy-hmac",
                "--integrity-legacy-padding",
            ],
            &[("superblock_version", "3"), ("flags", "")],
        ),
        (
            &["--integrity-legacy-hmac", "--integrity-legacy-padding"],
            &[("superblock_version", "2"), ("flags", "")],
        ),
    ];
    for (i, (opts, want)) in cases.iter().enumerate() {
        let (data, meta) = images(d.path(), &i.to_string());
        let mut o = vec!["--no-wipe"];
        o.extend_from_slice(opts);
        format(&meta, &data, &o);
        let theirs = dump(&meta);
        for (k, v) in *want {
            assert_eq!(field(&theirs, k), *v, "{k} of {opts:?}:\n{theirs}");
        }
        // The data device is left alone by a format without a wipe.
        assert!(pread(&data, 0, 4096).iter().all(|&b| b == 0));
    }
}

fn serve(d: &Path) -> UdmServe {
    let sock = d.join("nbd.sock");
    let _ = std::fs::remove_file(&sock);
    let ctl = d.join("ctl");
    UdmServe::start(&sock, &["--control", ctl.to_str().unwrap()])
}

const WRITE: &str = "import random\nr = random.Random(11)\n\
                     buf = bytes(r.getrandbits(8) for _ in range(1 << 16))\n\
                     h.pwrite(buf, 1 << 20)\nh.pwrite(b'\\xa5' * 512, 5 * 512)\nh.flush()\n\
                     print(h.get_size())";

const CHECK: &str = "import random\nr = random.Random(11)\n\
                     buf = bytes(r.getrandbits(8) for _ in range(1 << 16))\n\
                     assert h.pread(1 << 16, 1 << 20) == buf\n\
                     assert h.pread(512, 5 * 512) == b'\\xa5' * 512\nprint('same')";

const PROBE: &str = concat!(
    "bad = []\n",
    "for s in range(16):\n",
    "    try:\n",
    "        h.pread(512, s * 512)\n",
    "    except nbd.Error as e:\n",
    "        bad.append((s, e.errnum))\n",
    "print(bad)",
);

/// One mode: format (with the wipe), open, write, restart, read back;
/// the plain data on the data image; then a flipped bit there.
fn round_trip(d: &Path, mode: &str, flag: Option<&str>) {
    let (data, meta) = images(d, mode);
    format(&meta, &data, &[]);
    let ctl = d.join("ctl");
    let ctl = ctl.to_str().unwrap();
    let open = || {
        ok(uis()
            .args(["open", meta.to_str().unwrap(), "vol", "--control", ctl])
            .arg("--data-device")
            .arg(&data)
            .args(flag));
    };
    let srv = serve(d);
    open();
    let st = ok(uis().args(["status", "vol", "--control", ctl]));
    assert!(
        st.contains("metadata device:") && st.contains("(detached)"),
        "{mode}: {st}"
    );
    let o = nbd_py(&srv.sock, "vol", WRITE);
    assert!(o.status.success(), "{mode}: {}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        DATA.to_string(),
        "{mode}: the whole data device is provided"
    );
    srv.stop();
    let srv = serve(d);
    open();
    let o = nbd_py(&srv.sock, "vol", CHECK);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("same"),
        "{mode}: {}",
        show(&o)
    );
    srv.stop();
    // The data device alone holds the data in the clear, where it was
    // written.
    assert_eq!(pread(&data, 5 * 512, 512), vec![0xa5; 512], "{mode}");
    let o = Command::new(PYTHON)
        .arg("-c")
        .arg(format!(
            "import random,sys\nr = random.Random(11)\n\
             buf = bytes(r.getrandbits(8) for _ in range(1 << 16))\n\
             f = open({:?}, 'rb'); f.seek(1 << 20)\nsys.exit(f.read(1 << 16) != buf)",
            data.to_str().unwrap()
        ))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{mode}: data not in the clear at its offset"
    );
    let mut b = pread(&data, 5 * 512 + 100, 1);
    b[0] ^= 0x10;
    pwrite(&data, 5 * 512 + 100, &b);
    let srv = serve(d);
    open();
    let o = nbd_py(&srv.sock, "vol", PROBE);
    assert!(o.status.success(), "{mode}: {}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "[(5, 5)]",
        "{mode}: {}",
        show(&o)
    );
    srv.stop();
}

#[test]
fn data_round_trips_in_j_d_and_b_modes_and_a_flipped_bit_fails_its_sector_only() {
    let d = scratch("integrity-meta-rw");
    for (mode, flag) in [
        ("J", None),
        ("D", Some("--integrity-no-journal")),
        ("B", Some("--integrity-bitmap-mode")),
    ] {
        round_trip(d.path(), mode, flag);
    }
}

/// J mode with the journal and tags on their own device: the check is
/// crash_io.py's `flushed` one, as for the interleaved layout (J mode is
/// a volatile write cache until a FLUSH).
#[test]
fn sigkill_during_journaled_writes_with_a_metadata_device_loses_nothing_flushed() {
    const KILLS: u32 = 12;
    let d = scratch("integrity-meta-kill");
    let p = d.path();
    let data = sparse(p, "data.img", 24 << 20);
    let meta = sparse(p, "meta.img", 4 << 20);
    format(&meta, &data, &["--journal-size", "262144"]);
    let sectors: u64 = field(&dump(&meta), "provided_data_sectors")
        .parse()
        .unwrap();
    assert_eq!(sectors, (24 << 20) / 512);
    let table = p.join("ig.table");
    std::fs::write(
        &table,
        format!(
            "0 {sectors} integrity {} 0 4 J 3 meta_device:{} fix_hmac internal_hash:crc32c\n",
            data.display(),
            meta.display()
        ),
    )
    .unwrap();
    crash::sigkill_rounds(
        p,
        &table,
        "ig",
        KILLS,
        "integrity with a metadata device",
        true,
    );
}
