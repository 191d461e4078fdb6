//! dm-snapshot over NBD: a snapshot reads the data as it was while the
//! origin changes, a persistent snapshot reads the same after a server
//! restart, its COW device holds the kernel's format (checked by a parser
//! written here from the kernel's documentation, not udm's code), a full
//! COW device invalidates the snapshot with a `dmsetup wait` event while
//! the origin goes on, and `snapshot-merge` puts the snapshot back into
//! the origin, also when the server is killed in the middle of it; and
//! SIGKILLs at random moments during writes to a P or PO snapshot, whose
//! exceptions cross many metadata areas, lose no acknowledged write.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::dm::DmServer;
use common::*;
use udm::core::{BlockDevice, WriteBuf};
use udm::store::{Location, OpenFlags};

const MIB: u64 = 1 << 20;

fn client(srv: &DmServer, export: &str) -> Arc<dyn BlockDevice> {
    Location::parse(&srv.uri(export))
        .unwrap()
        .open(OpenFlags::default())
        .unwrap()
}

fn read(d: &dyn BlockDevice, off: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    d.read(off, &mut b).unwrap();
    b
}

fn table(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(format!("{name}.table"));
    std::fs::write(&p, text).unwrap();
    format!("{name}={}", p.display())
}

/// The persistent COW format as the kernel documents it
/// (dm-snap-persistent.c): chunk 0 a header of four little-endian u32s
/// (magic 0x70416e53, valid, version 1, chunk size in sectors); metadata
/// areas at chunk 1 + i * (pairs_per_area + 1), each a chunk of
/// little-endian (old_chunk, new_chunk) u64 pairs ended by a pair whose
/// new_chunk is 0, and followed by its data chunks.
struct Cow {
    valid: u32,
    chunk: u64,
    pairs: Vec<(u64, u64)>,
}

fn parse_cow(bytes: &[u8]) -> Cow {
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    assert_eq!(u32_at(0), 0x7041_6e53, "magic 'SnAp'");
    assert_eq!(&bytes[0..4], b"SnAp");
    assert_eq!(u32_at(8), 1, "version");
    let chunk = u64::from(u32_at(12)) * 512;
    let per_area = chunk / 16;
    let mut pairs = Vec::new();
    'areas: for area in 0.. {
        let at = ((1 + area * (per_area + 1)) * chunk) as usize;
        for i in 0..per_area as usize {
            let (old, new) = (u64_at(at + 16 * i), u64_at(at + 16 * i + 8));
            if new == 0 {
                break 'areas;
            }
            // A data chunk, never the header or an area's chunk (with
            // writes in flight together, commit order may differ from
            // allocation order, so not always one of this area's own).
            assert!(new % (per_area + 1) != 1 && new != 0, "pair {old} -> {new}");
            assert!(
                (new + 1) * chunk <= bytes.len() as u64,
                "pair {old} -> {new}"
            );
            pairs.push((old, new));
        }
    }
    Cow {
        valid: u32_at(4),
        chunk,
        pairs,
    }
}

fn status(srv: &DmServer, name: &str) -> String {
    srv.ok(&["status", name]).trim().to_string()
}

#[test]
fn a_snapshot_keeps_its_data_across_origin_writes_and_a_restart_in_the_kernels_format() {
    let d = scratch("udm-snap-");
    let p = d.path();
    let old = fast_bytes(7, 8 * MIB as usize);
    let origin = write_file(p, "origin.img", &old);
    let cow = sparse(p, "cow.img", 4 * MIB);
    let (o, c) = (origin.display(), cow.display());
    let args = [
        "--table".to_string(),
        table(p, "org", &format!("0 16384 snapshot-origin {o}\n")),
        "--table".to_string(),
        table(p, "snap", &format!("0 16384 snapshot {o} {c} P 8\n")),
    ];
    let srv = DmServer::start(p, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let (org, snap) = (client(&srv, "org"), client(&srv, "snap"));
    // Writes to the origin at chunks 0, 1 (one write across both), 100,
    // and a whole chunk at 200; one write to the snapshot at chunk 300.
    org.write(3584, WriteBuf::Borrowed(&[0xaa; 1024]), false)
        .unwrap();
    org.write(100 * 4096 + 512, WriteBuf::Borrowed(&[0xbb; 512]), false)
        .unwrap();
    org.write(200 * 4096, WriteBuf::Borrowed(&[0xcc; 4096]), true)
        .unwrap();
    snap.write(300 * 4096, WriteBuf::Borrowed(&[0xdd; 512]), true)
        .unwrap();
    let mut want = old.clone();
    want[300 * 4096..300 * 4096 + 512].fill(0xdd);
    assert!(read(snap.as_ref(), 0, 8 * MIB as usize) == want);
    assert_eq!(read(org.as_ref(), 200 * 4096, 4096), vec![0xcc; 4096]);
    assert_eq!(
        read(org.as_ref(), 300 * 4096, 512),
        old[300 * 4096..][..512]
    );
    // Five exceptions after the header and area: 7 chunks of 8 sectors.
    assert_eq!(status(&srv, "snap"), "0 16384 snapshot 56/8192 16");
    assert_eq!(status(&srv, "org"), "0 16384 snapshot-origin");
    drop((org, snap));
    assert_eq!(srv.serve.stop(), Some(0));

    // The COW device in the kernel's format: each pair's data chunk holds
    // the origin's old chunk (or the snapshot's write).
    let bytes = std::fs::read(&cow).unwrap();
    let f = parse_cow(&bytes);
    assert_eq!((f.valid, f.chunk), (1, 4096));
    let mut olds: Vec<u64> = f.pairs.iter().map(|x| x.0).collect();
    olds.sort();
    assert_eq!(olds, [0, 1, 100, 200, 300]);
    for (oc, nc) in &f.pairs {
        let data = &bytes[(nc * 4096) as usize..][..4096];
        assert!(data == &want[(oc * 4096) as usize..][..4096], "chunk {oc}");
    }

    // Restart: the same contents.
    let srv = DmServer::start(p, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let snap = client(&srv, "snap");
    assert!(read(snap.as_ref(), 0, 8 * MIB as usize) == want);
    assert_eq!(status(&srv, "snap"), "0 16384 snapshot 56/8192 16");
}

#[test]
fn a_full_cow_invalidates_the_snapshot_raises_an_event_and_the_origin_goes_on() {
    let d = scratch("udm-snapfull-");
    let p = d.path();
    let origin = write_file(p, "origin.img", &fast_bytes(3, 4 * MIB as usize));
    // Header, one area, three data chunks.
    let cow = sparse(p, "cow.img", 5 * 4096);
    let (o, c) = (origin.display(), cow.display());
    let srv = DmServer::start(
        p,
        &[
            "--table",
            &table(p, "org", &format!("0 8192 snapshot-origin {o}\n")),
            "--table",
            &table(p, "snap", &format!("0 8192 snapshot {o} {c} P 8\n")),
        ],
    );
    let info = srv.ok(&["info", "snap"]);
    let ev = info
        .lines()
        .find_map(|l| l.strip_prefix("Event number:"))
        .expect("an event number in dmsetup info")
        .trim()
        .to_string();
    let waiter = srv
        .cmd()
        .args(["wait", "snap", &ev])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let org = client(&srv, "org");
    for i in 0..3u64 {
        org.write(i * 4096, WriteBuf::Borrowed(&[1; 4096]), false)
            .unwrap();
    }
    assert_eq!(status(&srv, "snap"), "0 8192 snapshot 40/40 16");
    org.write(3 * 4096, WriteBuf::Borrowed(&[2; 4096]), false)
        .unwrap();
    assert_eq!(status(&srv, "snap"), "0 8192 snapshot Invalid");
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "dmsetup wait: {}", show(&out));
    let snap = client(&srv, "snap");
    let mut b = [0u8; 512];
    assert!(
        snap.read(0, &mut b).is_err(),
        "reads of an invalid snapshot fail"
    );
    assert_eq!(read(org.as_ref(), 3 * 4096, 4096), vec![2; 4096]);
    drop((org, snap));
    assert_eq!(srv.serve.stop(), Some(0));
    assert_eq!(parse_cow(&std::fs::read(&cow).unwrap()).valid, 0);
}

/// `(allocated, metadata)` sectors from a `snapshot-merge` status line.
fn merge_progress(srv: &DmServer) -> (u64, u64) {
    let s = status(srv, "org");
    let w: Vec<&str> = s.split_whitespace().collect();
    assert_eq!(w[2], "snapshot-merge", "{s}");
    let a = w[3].split('/').next().unwrap().parse().unwrap();
    (a, w[4].parse().unwrap())
}

#[test]
fn merge_puts_the_snapshot_into_the_origin_even_across_a_sigkill() {
    let d = scratch("udm-snapmerge-");
    let p = d.path();
    let origin = write_file(p, "origin.img", &fast_bytes(5, 4 * MIB as usize));
    let cow = sparse(p, "cow.img", 4 * MIB);
    let (o, c) = (origin.display(), cow.display());
    let srv = DmServer::start(
        p,
        &[
            "--table",
            &table(p, "org", &format!("0 8192 snapshot-origin {o}\n")),
            "--table",
            &table(p, "snap", &format!("0 8192 snapshot {o} {c} P 8\n")),
        ],
    );
    let (org, snap) = (client(&srv, "org"), client(&srv, "snap"));
    for i in 0..64u64 {
        org.write(i * 12288, WriteBuf::Borrowed(&[0xa5; 2048]), false)
            .unwrap();
        snap.write(i * 8192 + 1024, WriteBuf::Borrowed(&bytes(i, 1024)), false)
            .unwrap();
    }
    let view = read(snap.as_ref(), 0, 4 * MIB as usize);
    drop((org, snap));
    assert_eq!(srv.serve.stop(), Some(0));

    // The origin's table becomes snapshot-merge; slowed down so that the
    // kill lands in the middle.
    let merge = table(p, "org", &format!("0 8192 snapshot-merge {o} {c} P 8\n"));
    std::env::set_var("UDM_SNAPSHOT_MERGE_DELAY_MS", "20");
    let srv = DmServer::start(p, &["--table", &merge]);
    let (start, meta) = merge_progress(&srv);
    assert!(start > meta, "exceptions to merge: {start} {meta}");
    let org = client(&srv, "org");
    assert!(
        read(org.as_ref(), 0, 4 * MIB as usize) == view,
        "reads see the snapshot"
    );
    wait_for("the merge to progress", Duration::from_secs(60), || {
        merge_progress(&srv).0 < start - 16
    });
    drop(org);
    srv.serve.kill9();
    let left = parse_cow(&std::fs::read(&cow).unwrap()).pairs.len();
    assert!(
        left > 0 && left < 106,
        "killed mid-merge with {left} exceptions left"
    );

    std::env::set_var("UDM_SNAPSHOT_MERGE_DELAY_MS", "0");
    let srv = DmServer::start(p, &["--table", &merge]);
    wait_for("the merge to finish", Duration::from_secs(60), || {
        let (a, m) = merge_progress(&srv);
        a == m
    });
    let org = client(&srv, "org");
    assert!(read(org.as_ref(), 0, 4 * MIB as usize) == view);
    drop(org);
    assert_eq!(srv.serve.stop(), Some(0));
    assert!(
        std::fs::read(&origin).unwrap() == view,
        "the origin holds the snapshot"
    );
    assert_eq!(parse_cow(&std::fs::read(&cow).unwrap()).pairs, []);
}

/// Issue 44's reopen matrix after process death: crash_io.py writes 4 KiB
/// blocks (one chunk each) to the snapshot of a zero origin, so each new
/// block is an exception and the 256-exception areas fill and roll over
/// during the rounds; a SIGKILL lands at a random moment, and after each
/// restart every acknowledged block reads back (the snapshot keeps no
/// cache: an exception is committed before its write is acknowledged).
/// `UDM_SNAPSHOT_KILLS` sets the rounds per store type (default 6).
#[test]
fn sigkill_during_snapshot_writes_loses_no_acknowledged_write() {
    let kills = std::env::var("UDM_SNAPSHOT_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    for store in ["P", "PO"] {
        let d = scratch("udm-snapkill-");
        let p = d.path();
        let origin = sparse(p, "origin.img", 64 * MIB);
        let cow = sparse(p, "cow.img", 66 * MIB);
        let t = p.join("snap.table");
        std::fs::write(
            &t,
            format!(
                "0 131072 snapshot {} {} {store} 8\n",
                origin.display(),
                cow.display()
            ),
        )
        .unwrap();
        crash::sigkill_rounds(p, &t, "snap", kills, &format!("snapshot {store}"), false);
        let f = parse_cow(&std::fs::read(&cow).unwrap());
        assert_eq!(f.valid, 1, "{store}: the snapshot stayed valid");
        println!(
            "snapshot {store}: {} exceptions on the COW device",
            f.pairs.len()
        );
    }
}
