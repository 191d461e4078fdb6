//! Issue 44, attacker findings F4/F5: memory a device keeps for its
//! lifetime because its image says how much (a snapshot's chunk-sized
//! buffers, an integrity journal kept in memory) was bounded per device
//! but charged to nothing, so a few hostile images together took the
//! host's memory. Now it is reserved from the server's pinned metadata
//! memory (`serve --pinned-memory`) before it is allocated: a device that
//! does not fit is refused at activation naming itself, the bytes and the
//! fix, and the devices already active go on. Sparse files only: nothing
//! here allocates more than a few MiB.
//! FAILS on a udm without `--pinned-memory`.

mod common;

use common::dm::DmServer;
use common::integrity::{ok, uis};
use common::*;

/// Two integrity devices in `J` mode, each with an 8 MiB journal kept in
/// memory (about 8.5 MiB pinned with its index): with 24 MiB of pinned
/// memory the first activates, the second is refused by name, the first
/// still answers, and once it is removed its memory is back and the
/// second activates. (`dmsetup create` builds the table at load and
/// again at resume, the first build held until the second is live, so
/// activating takes twice a device's memory for that moment, and the
/// ledger counts both: 24 MiB fits one activation, not two.)
#[test]
fn a_second_journal_past_the_pinned_memory_is_refused_and_the_first_goes_on() {
    let d = scratch("pinned-integrity");
    let p = d.path();
    let imgs: Vec<_> = ["a.img", "b.img"]
        .iter()
        .map(|n| {
            let img = sparse(p, n, 64 << 20);
            ok(uis().args([
                "format",
                "-q",
                "--tag-size",
                "4",
                "--journal-size",
                &(8u64 << 20).to_string(),
                img.to_str().unwrap(),
            ]));
            img
        })
        .collect();
    let srv = DmServer::start(p, &["--pinned-memory", "24M"]);
    let table = |img: &std::path::Path| format!("0 8 integrity {} 0 4 J 0", img.display());
    srv.ok(&["create", "ig1", "--table", &table(&imgs[0])]);
    let o = srv.run(&["create", "ig2", "--table", &table(&imgs[1])]);
    let err = show(&o);
    assert!(
        !o.status.success(),
        "the second journal was not refused:\n{err}"
    );
    for want in [
        "device 'ig2'",
        "pinned metadata memory",
        "--pinned-memory",
        "--journal-size",
    ] {
        assert!(
            err.contains(want),
            "'{want}' missing from the refusal:\n{err}"
        );
    }
    let ls = srv.ok(&["ls"]);
    assert!(ls.contains("ig1") && !ls.contains("ig2"), "{ls}");
    let st = srv.ok(&["status", "ig1"]);
    assert!(st.contains("integrity"), "ig1 no longer answers: {st}");
    srv.ok(&["remove", "ig1"]);
    srv.ok(&["create", "ig2", "--table", &table(&imgs[1])]);
    assert_eq!(srv.serve.stop(), Some(0), "the server did not stop cleanly");
}

/// A COW header asking for 2^21-sector (1 GiB) chunks on a sparse file:
/// the two chunk buffers a snapshot keeps are refused against 1 GiB of
/// pinned memory before either is allocated; a snapshot of small chunks
/// on the same server activates.
#[test]
fn a_snapshot_of_gigabyte_chunks_is_refused_before_allocating() {
    let d = scratch("pinned-snapshot");
    let p = d.path();
    let origin = sparse(p, "origin.img", 1 << 20);
    let cow = sparse(p, "cow.img", 3 << 30);
    let mut hdr = Vec::new();
    for v in [0x7041_6e53u32, 1, 1, 1 << 21] {
        hdr.extend_from_slice(&v.to_le_bytes());
    }
    pwrite(&cow, 0, &hdr);
    let small = sparse(p, "small-cow.img", 4 << 20);
    let srv = DmServer::start(p, &["--pinned-memory", "1G"]);
    let o = srv.run(&[
        "create",
        "big",
        "--table",
        &format!("0 2048 snapshot {} {} P 8", origin.display(), cow.display()),
    ]);
    let err = show(&o);
    assert!(!o.status.success(), "1 GiB chunks were not refused:\n{err}");
    for want in [
        "device 'big'",
        "1073741824-byte chunks",
        "pinned metadata memory",
        "--pinned-memory",
        "smaller chunk size",
    ] {
        assert!(
            err.contains(want),
            "'{want}' missing from the refusal:\n{err}"
        );
    }
    srv.ok(&[
        "create",
        "snap",
        "--table",
        &format!(
            "0 2048 snapshot {} {} P 8",
            origin.display(),
            small.display()
        ),
    ]);
    assert!(srv.ok(&["ls"]).contains("snap"));
    assert_eq!(srv.serve.stop(), Some(0), "the server did not stop cleanly");
}
