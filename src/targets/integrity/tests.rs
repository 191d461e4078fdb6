//! The integrity target over an in-memory device: format at first map,
//! writes that read back (also after a reopen), a flipped bit that fails
//! exactly its sector, journal replay after a write that never reached
//! its place, and the tagged I/O of a device without an internal hash.

use std::sync::Arc;

use super::journal;
use super::layout::Geometry;
use super::superblock::Superblock;
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, Target, TargetArgs, TargetOptions};

struct One(Arc<MemStore>);

impl DeviceResolver for One {
    fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0.clone())
    }
}

pub(super) const DEV: u64 = 8 << 20;

/// The target of `line` over `m`, resumed (its background jobs running)
/// as a device's live table is.
pub(super) fn open(m: &Arc<MemStore>, line: &str, len: u64) -> Result<Arc<dyn Target>, String> {
    let t = load(m, line, len)?;
    t.resume();
    Ok(t)
}

/// The target of `line` over `m` as a loaded table: not yet resumed.
pub(super) fn load(m: &Arc<MemStore>, line: &str, len: u64) -> Result<Arc<dyn Target>, String> {
    let args: Vec<String> = line.split_whitespace().map(Into::into).collect();
    let opts = TargetOptions::default();
    let mut r = One(m.clone());
    super::new(TargetArgs {
        args: &args,
        len,
        resolver: &mut r,
        options: &opts,
    })
    .map_err(|e| e.msg)
}

pub(super) fn geometry(m: &MemStore) -> Geometry {
    let mut b = vec![0u8; 512];
    m.read(0, &mut b).unwrap();
    let sb = Superblock::parse(&b).unwrap().unwrap();
    Geometry::of(&sb, 0, DEV / 512).unwrap()
}

const CRC: &str = "d 0 4 J 2 fix_padding internal_hash:crc32c";

#[test]
fn formats_writes_reads_back_and_survives_a_reopen() {
    let m = Arc::new(MemStore::new(DEV));
    let t = open(&m, CRC, 4 << 20).unwrap();
    let g = geometry(&m);
    assert!(g.provided_data_sectors * 512 >= 4 << 20);
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 + i / 513) as u8).collect();
    t.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
    let mut back = vec![0u8; data.len()];
    t.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    drop(t);
    let t = open(&m, CRC, 4 << 20).unwrap();
    t.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(t.status(), format!("0 {} -", g.provided_data_sectors));
}

#[test]
fn a_flipped_bit_fails_its_sector_only() {
    let m = Arc::new(MemStore::new(DEV));
    let t = open(&m, CRC, 1 << 20).unwrap();
    let g = geometry(&m);
    t.write(0, WriteBuf::Borrowed(&vec![0x5a; 8192]), false)
        .unwrap();
    // Closed, so the journal's copy is in place (a J-mode write waits in
    // the journal until the watermark, a close or a suspend).
    drop(t);
    let t = open(&m, CRC, 1 << 20).unwrap();
    let at = g.data_sector(5) * 512 + 100;
    let mut b = [0u8; 512];
    let base = at / 512 * 512;
    m.read(base, &mut b).unwrap();
    b[100] ^= 1;
    m.write(base, WriteBuf::Borrowed(&b), false).unwrap();
    let mut s = [0u8; 512];
    for k in 0..16u64 {
        let r = t.read(k * 512, &mut s);
        assert_eq!(r.is_err(), k == 5, "sector {k}: {r:?}");
    }
    assert!(t.status().starts_with("1 "), "{}", t.status());
}

#[test]
fn a_committed_section_is_replayed_at_open() {
    let m = Arc::new(MemStore::new(DEV));
    drop(open(&m, CRC, 1 << 20).unwrap());
    let g = geometry(&m);
    // A commit that reached the journal but not its place: section 0
    // with the sequence number a fresh journal continues with.
    let data = vec![0xc3u8; 512];
    let mut tag = [0u8; 4];
    let mut b = vec![0u8; 512];
    m.read(0, &mut b).unwrap();
    let sb = Superblock::parse(&b).unwrap().unwrap();
    assert!(!sb.has(super::superblock::flags::FIXED_HMAC));
    super::tags::Alg::Crc32c.tag(None, 24, &data, &mut tag);
    let mut sec = vec![0u8; (g.section_sectors * 512) as usize];
    let blk = [journal::Block {
        sector: 24,
        data: &data,
        tag: &tag,
    }];
    journal::fill_section(&g, &mut sec, 0, 1, &blk);
    m.write(
        g.journal_sector(0, 0) * 512,
        WriteBuf::Borrowed(&sec),
        false,
    )
    .unwrap();
    let t = open(&m, CRC, 1 << 20).unwrap();
    let mut back = vec![0u8; 512];
    t.read(24 * 512, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn writes_wrap_the_journal_and_stay_readable() {
    let m = Arc::new(MemStore::new(DEV));
    let line = "d 0 4 J 3 journal_sectors:400 fix_padding internal_hash:crc32c";
    let t = open(&m, line, 2 << 20).unwrap();
    let g = geometry(&m);
    assert_eq!(g.journal_sections, 2);
    for round in 0..7u8 {
        let d = vec![round; 96 * 1024];
        t.write(u64::from(round) * 4096, WriteBuf::Borrowed(&d), false)
            .unwrap();
    }
    drop(t);
    let t = open(&m, line, 2 << 20).unwrap();
    // Sectors past the last write were never written (no wipe): not read.
    let mut all = vec![0u8; 6 * 4096 + 96 * 1024];
    t.read(0, &mut all).unwrap();
    assert_eq!(all[6 * 4096], 6);
    assert_eq!(all[6 * 4096 + 90 * 1024], 6);
    assert_eq!(all[0], 0);
}

#[test]
fn tagged_io_without_an_internal_hash() {
    let m = Arc::new(MemStore::new(DEV));
    let t = open(&m, "d 0 28 J 2 block_size:4096 fix_padding", 1 << 20).unwrap();
    let l = t.tag_layout().unwrap();
    assert_eq!((l.sector_size, l.tag_size), (4096, 28));
    let data = vec![0x11u8; 8192];
    let tags: Vec<u8> = (0..56).collect();
    t.write_tagged(8192, &data, &tags, true).unwrap();
    assert!(t.write_tagged(8192, &data, &tags[..50], true).is_err());
    let (mut d, mut tg) = (vec![0u8; 8192], vec![0u8; 56]);
    drop(t);
    let t = open(&m, "d 0 28 J 2 block_size:4096 fix_padding", 1 << 20).unwrap();
    t.read_tagged(8192, &mut d, &mut tg).unwrap();
    assert_eq!((d, tg), (data, tags));
    let c = open(&m, CRC, 1 << 20).err().unwrap();
    assert!(c.contains("tag size"), "{c}");
}

#[test]
fn lines_udm_cannot_serve_are_refused_by_name() {
    let m = Arc::new(MemStore::new(DEV));
    for (line, word) in [
        ("d 0 4 B 0", "internal_hash"),
        ("d 0 4 J 1 meta_device:/x", "meta_device"),
        ("d 0 4 J 1 allow_discards", "internal_hash"),
        ("d 0 - J 0", "tag size"),
    ] {
        let e = open(&m, line, 1 << 20).err().unwrap();
        assert!(e.contains(word), "{line}: {e}");
    }
    let r = open(&m, "d 0 4 R 1 internal_hash:crc32c", 1 << 20)
        .err()
        .unwrap();
    assert!(r.contains("not formatted"), "{r}");
}

/// The device's bytes as a crash would leave them now (the writer
/// thread may be between any two of its writes).
fn crash_copy(m: &MemStore) -> Arc<MemStore> {
    let mut all = vec![0u8; DEV as usize];
    m.read(0, &mut all).unwrap();
    let c = Arc::new(MemStore::new(DEV));
    c.write(0, WriteBuf::Borrowed(&all), false).unwrap();
    c
}

#[test]
fn acknowledged_writes_read_back_before_any_commit_and_a_flush_makes_them_survive_a_crash() {
    let m = Arc::new(MemStore::new(DEV));
    // The watermark at 100 %: nothing is committed or placed until the
    // journal is full, so only the FLUSH commits.
    let line = "d 0 4 J 3 journal_watermark:100 fix_padding internal_hash:crc32c";
    let t = open(&m, line, 4 << 20).unwrap();
    let g = geometry(&m);
    let before = crash_copy(&m);
    for k in 0..20u64 {
        t.write(
            k * 8192,
            WriteBuf::Borrowed(&vec![k as u8 + 1; 4096]),
            false,
        )
        .unwrap();
    }
    let mut b = vec![0u8; 4096];
    t.read(19 * 8192, &mut b).unwrap();
    assert_eq!(b, vec![20u8; 4096]);
    // Nothing reached the device yet: the journal area is as it was.
    let jlen = (g.journal_sections * g.section_sectors * 512) as usize;
    let (mut now, mut was) = (vec![0u8; jlen], vec![0u8; jlen]);
    m.read(g.journal_sector(0, 0) * 512, &mut now).unwrap();
    before.read(g.journal_sector(0, 0) * 512, &mut was).unwrap();
    assert!(now == was, "a write reached the journal before any commit");
    t.flush().unwrap();
    let c = crash_copy(&m);
    let t2 = open(&c, line, 4 << 20).unwrap();
    for k in 0..20u64 {
        t2.read(k * 8192, &mut b).unwrap();
        assert_eq!(b, vec![k as u8 + 1; 4096], "block {k} after the crash");
    }
    drop(t2);
    drop(t);
}

#[test]
fn concurrent_writers_and_flushes_keep_every_flushed_write_through_a_crash() {
    let m = Arc::new(MemStore::new(DEV));
    let line = "d 0 4 J 4 journal_sectors:1000 journal_watermark:30 fix_padding \
                internal_hash:crc32c";
    let t = open(&m, line, 4 << 20).unwrap();
    assert!(geometry(&m).journal_sections >= 4);
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let t = &t;
            s.spawn(move || {
                for round in 0..60u64 {
                    let blk = (w * 1000 + round * 7) % 1024;
                    let d = vec![(w * 61 + round) as u8 | 1; 4096];
                    t.write(blk * 4096, WriteBuf::Borrowed(&d), round % 9 == 0)
                        .unwrap();
                    if round % 10 == 0 {
                        t.flush().unwrap();
                    }
                }
            });
        }
    });
    t.flush().unwrap();
    let c = crash_copy(&m);
    let t2 = open(&c, line, 4 << 20).unwrap();
    // Only written blocks are read: the others were never wiped.
    let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
    for w in 0..4u64 {
        for round in 0..60u64 {
            let at = (w * 1000 + round * 7) % 1024 * 4096;
            t.read(at, &mut a).unwrap();
            t2.read(at, &mut b).unwrap();
            assert!(a == b, "block at {at} differs after the crash");
            assert_ne!(a[0], 0);
        }
    }
    assert!(t2.status().starts_with("0 "), "{}", t2.status());
}

const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const K2: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// A crash after a FLUSH, before any entry reached its place: the
/// journal alone (sealed) must bring the data back at the next open.
fn replays_sealed(opts: &str) {
    let m = Arc::new(MemStore::new(DEV));
    let n = opts.split_whitespace().count() + 3;
    let line = format!("d 0 4 J {n} journal_watermark:100 fix_padding internal_hash:crc32c {opts}");
    let t = open(&m, &line, 4 << 20).unwrap();
    let g = geometry(&m);
    let data: Vec<u8> = (0..24 * 1024).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    t.write(40960, WriteBuf::Borrowed(&data), false).unwrap();
    t.flush().unwrap();
    let c = crash_copy(&m);
    let jlen = (g.journal_sections * g.section_sectors * 512) as usize;
    let mut j = vec![0u8; jlen];
    c.read(g.journal_sector(0, 0) * 512, &mut j).unwrap();
    let plain = j.windows(64).any(|w| w == &data[1000..1064]);
    assert_eq!(
        plain,
        !opts.contains("journal_crypt"),
        "{opts}: plaintext in the journal"
    );
    let t2 = open(&c, &line, 4 << 20).unwrap();
    let mut back = vec![0u8; data.len()];
    t2.read(40960, &mut back).unwrap();
    assert!(back == data, "{opts}: replayed data differs");
    drop(t2);
    drop(t);
}

#[test]
fn journals_sealed_with_journal_mac_replay() {
    replays_sealed(&format!("journal_mac:hmac(sha256):{K1}"));
    replays_sealed(&format!("fix_hmac journal_mac:hmac(sha256):{K1}"));
}

#[test]
fn journals_encrypted_with_journal_crypt_replay() {
    replays_sealed(&format!("journal_crypt:ctr(aes):{K1}"));
    replays_sealed(&format!("journal_crypt:chacha20:{K1} journal_mac:sha256"));
    replays_sealed(&format!("journal_crypt:cbc(aes):{}", &K1[..32]));
}

#[test]
fn a_wrong_journal_mac_key_is_refused() {
    for extra in ["", "fix_hmac "] {
        let m = Arc::new(MemStore::new(DEV));
        let n = if extra.is_empty() { 3 } else { 4 };
        let line = |k: &str| {
            format!(
                "d 0 4 J {n} fix_padding internal_hash:crc32c {extra}journal_mac:hmac(sha256):{k}"
            )
        };
        let t = open(&m, &line(K1), 1 << 20).unwrap();
        t.write(0, WriteBuf::Borrowed(&[7u8; 4096]), false).unwrap();
        t.flush().unwrap();
        let c = crash_copy(&m);
        drop(t);
        for dev in [&m, &c] {
            let e = open(dev, &line(K2), 1 << 20).err().unwrap();
            assert!(
                e.contains("journal_mac") && e.contains("key"),
                "{extra}: {e}"
            );
            assert!(
                !e.contains(K2) && !e.contains(K1),
                "a key in the error: {e}"
            );
        }
        assert!(open(&c, &line(K1), 1 << 20).is_ok());
    }
}

/// The reopen matrix of issue 44 for each mode: 512-byte writes at random
/// sectors against an in-memory model, a two-section journal, and at every
/// journal boundary a write count reaches (a section exactly full, one
/// past it, one short; the journal exactly full, so the next write wraps)
/// a FLUSH (a commit boundary) and then either a crash (a copy of the
/// device opened as it is) or a clean close and reopen: every sector of
/// the mapping then equals the model.
#[test]
fn reopening_at_every_journal_boundary_keeps_every_sector_of_the_model() {
    for mode in ["J", "D", "B"] {
        let m = Arc::new(MemStore::new(DEV));
        let line = format!("d 0 4 {mode} 3 journal_sectors:400 fix_padding internal_hash:crc32c");
        let len = 1u64 << 20;
        let mut t = open(&m, &line, len).unwrap();
        let g = geometry(&m);
        assert_eq!(g.journal_sections, 2, "{mode}");
        let per = g.section_entries;
        let total = per * g.journal_sections;
        // A format does not wipe: the mapping is written once, so every
        // sector has its tag.
        let mut model = vec![0u8; len as usize];
        t.write(0, WriteBuf::Borrowed(&model), false).unwrap();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut checks = 0;
        for w in 1..=3 * total + 2 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let s = rng % (len / 512);
            let b = vec![(w % 251) as u8 + 1; 512];
            t.write(s * 512, WriteBuf::Borrowed(&b), false).unwrap();
            model[(s * 512) as usize..][..512].copy_from_slice(&b);
            if !matches!(w % per, 0 | 1) && w % per != per - 1 && w % total != 0 {
                continue;
            }
            t.flush().unwrap();
            checks += 1;
            let mut back = vec![0u8; len as usize];
            if checks % 2 == 0 {
                let c = crash_copy(&m);
                let t2 = open(&c, &line, len).unwrap();
                t2.read(0, &mut back).unwrap();
                assert!(back == model, "{mode}: a crash after write {w} lost data");
            } else {
                drop(t);
                t = open(&m, &line, len).unwrap();
                t.read(0, &mut back).unwrap();
                assert!(back == model, "{mode}: a reopen after write {w} lost data");
            }
        }
        assert!(checks >= 12, "{mode}: {checks} boundaries checked");
    }
}

/// The journal kept in memory (`J`) and a stream cipher's keystream are
/// reserved from the server's pinned memory before they are allocated:
/// refused by name when the ledger is short, given back when the target
/// goes.
#[test]
fn the_journal_and_its_keystream_are_charged_to_the_pinned_memory() {
    let m = Arc::new(MemStore::new(DEV));
    drop(open(&m, CRC, 1 << 20).unwrap());
    let g = geometry(&m);
    let build = |line: &str, ledger: &Arc<crate::mem::PinnedLedger>| {
        let args: Vec<String> = line.split_whitespace().map(Into::into).collect();
        let opts = TargetOptions {
            pinned: Some(ledger.clone()),
            device: Some("ig".into()),
            ..TargetOptions::default()
        };
        super::new(TargetArgs {
            args: &args,
            len: 1 << 20,
            resolver: &mut One(m.clone()),
            options: &opts,
        })
        .map_err(|e| e.msg)
    };
    let journal = super::layout::pinned_journal_bytes(&g, true, false);
    let keystream = super::layout::pinned_journal_bytes(&g, false, true);
    assert!(journal > g.journal_sections * g.section_sectors * 512);
    let stream = format!("d 0 4 D 3 fix_padding internal_hash:crc32c journal_crypt:chacha20:{K1}");
    for (line, need, word) in [
        (CRC, journal, "kept in memory"),
        (&stream[..], keystream, "keystream"),
    ] {
        let short = crate::mem::PinnedLedger::new(need - 1);
        let e = build(line, &short).err().unwrap();
        assert!(
            e.contains("device 'ig'") && e.contains(word) && e.contains("--pinned-memory"),
            "{e}"
        );
        assert_eq!(short.used(), 0, "a refusal holds nothing");
        let enough = crate::mem::PinnedLedger::new(need);
        let t = build(line, &enough).unwrap();
        assert_eq!(enough.used(), need);
        drop(t);
        assert_eq!(enough.used(), 0, "the target gave its memory back");
    }
}
