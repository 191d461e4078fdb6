//! Issue 44, finding 6: a dm-integrity superblock whose `journal_sections`
//! makes a journal of terabytes, on a sparse file big enough to hold it.
//! On 402eec8 journal replay read the whole journal into one buffer and
//! the allocation failure aborted the server at `dmsetup create`; now the
//! table is refused with the kernel's "journal doesn't fit into memory"
//! and the server, its other devices and its control socket go on.
//! FAILS if integritysetup (cryptsetup-bin) is missing.

mod common;

use std::process::Command;

use common::dm::DmServer;
use common::integrity::{field, ok, uis};
use common::*;

#[test]
fn a_journal_larger_than_memory_is_refused_and_the_server_goes_on() {
    let d = scratch("integrity-hostile");
    let p = d.path();
    let img = sparse(p, "v.img", 16 << 20);
    ok(uis().args(["format", "-q", "--tag-size", "4", img.to_str().unwrap()]));
    // 512-byte sectors and 4-byte tags: 176-sector sections, so 24 million
    // of them are a journal of about 2 TiB (the kernel's geometry allows
    // at most 2^32 - 1 sectors before the data), more than half of the
    // memory of any machine this runs on.
    const SECTIONS: u32 = 24_000_000;
    pwrite(&img, 12, &SECTIONS.to_le_bytes());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(2300 << 30)
        .unwrap();
    let dump = run_text(Command::new(need("integritysetup")).arg("dump").arg(&img));
    assert_eq!(field(&dump, "journal_sections"), SECTIONS.to_string());

    let other = sparse(p, "other.img", 1 << 20);
    let srv = DmServer::start(p, &[]);
    srv.ok(&[
        "create",
        "plain",
        "--table",
        &format!("0 2048 linear {} 0", other.display()),
    ]);
    let o = srv.run(&[
        "create",
        "ig",
        "--table",
        &format!("0 8 integrity {} 0 4 J 0", img.display()),
    ]);
    let err = show(&o);
    assert!(
        !o.status.success() && err.contains("journal doesn't fit into memory"),
        "a 2 TiB journal was not refused by name:\n{err}"
    );
    let ls = srv.ok(&["ls"]);
    assert!(
        ls.contains("plain") && !ls.contains("ig"),
        "the server answers and keeps its other device: {ls}"
    );
    assert_eq!(
        srv.serve.stop(),
        Some(0),
        "the server was not stopped cleanly"
    );
}
