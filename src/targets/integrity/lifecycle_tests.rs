//! Issue 44's siblings: a table loaded beside the live one (`dmsetup
//! reload`) must not touch the disk until its `resume`, and the swap must
//! hand the disk over clean (the old table's postsuspend writes back and
//! empties the journal or clears the bitmap, then the new one starts).
//! Each test follows the service's order: load beside a live instance
//! that goes on writing, postsuspend the old, resume the new; every
//! block is checked against a model live, after a crash at the swap and
//! after a reopen.

use std::sync::Arc;

use super::superblock::{flags, Superblock};
use super::tests::{geometry, load, open, DEV};
use crate::core::{BlockDevice, Fault, WriteBuf};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, Target, TargetArgs, TargetOptions};

const LEN: u64 = 1 << 20;
const BLOCK: usize = 4096;
/// A journal of many sections and the watermark at 100 %: the writer
/// places nothing until the journal is full, so committed sections stay
/// in the journal on disk.
const J: &str =
    "d 0 4 J 4 journal_sectors:4096 journal_watermark:100 fix_padding internal_hash:crc32c";
const B: &str = "d 0 4 B 4 sectors_per_bit:8 bitmap_flush_interval:3600000 fix_padding \
                 internal_hash:crc32c";

/// Every byte of the device.
fn bytes(m: &MemStore) -> Vec<u8> {
    let mut all = vec![0u8; DEV as usize];
    m.read(0, &mut all).unwrap();
    all
}

/// A device holding what `m` holds now, as a crash leaves it.
fn crash_copy(m: &MemStore) -> Arc<MemStore> {
    let c = Arc::new(MemStore::new(DEV));
    c.write(0, WriteBuf::Borrowed(&bytes(m)), false).unwrap();
    c
}

/// Block `k` filled with `v`, through `t` and into the model.
fn put(t: &Arc<dyn Target>, model: &mut [u8], k: usize, v: u8) {
    let b = [v; BLOCK];
    t.write((k * BLOCK) as u64, WriteBuf::Borrowed(&b), false)
        .unwrap();
    model[k * BLOCK..][..BLOCK].copy_from_slice(&b);
}

/// Every block of the mapping written so far (the model's blocks not
/// zero; the others have no tags yet, as on a device formatted without
/// a wipe) read through `t` equals the model.
fn check(t: &Arc<dyn Target>, model: &[u8], when: &str) {
    let mut back = [0u8; BLOCK];
    for (k, want) in model.chunks(BLOCK).enumerate() {
        if want.iter().all(|&b| b == 0) {
            continue;
        }
        t.read((k * BLOCK) as u64, &mut back)
            .unwrap_or_else(|e| panic!("{when}: block {k}: {e}"));
        assert!(
            back == want,
            "{when}: block {k} holds {} not {}",
            back[0],
            want[0]
        );
    }
}

/// The same check through a fresh instance on `m` (a reopen).
fn check_reopened(m: &Arc<MemStore>, line: &str, model: &[u8], when: &str) {
    let t = open(m, line, LEN).unwrap();
    check(&t, model, when);
}

fn superblock(m: &MemStore) -> Superblock {
    let mut b = vec![0u8; 512];
    m.read(0, &mut b).unwrap();
    Superblock::parse(&b).unwrap().unwrap()
}

/// Flips a byte of logical sector `s`'s data below the target: a write
/// torn by a crash (the data changed, its tag did not).
fn tear(m: &MemStore, s: u64) {
    let at = geometry(m).data_sector(s) * 512;
    let mut b = [0u8; 512];
    m.read(at, &mut b).unwrap();
    b[7] ^= 0x40;
    m.write(at, WriteBuf::Borrowed(&b), false).unwrap();
}

#[test]
fn a_loaded_table_touches_nothing_on_disk_until_resume() {
    for line in [J, B] {
        let m = Arc::new(MemStore::new(DEV));
        let mut model = vec![0u8; LEN as usize];
        let old = open(&m, line, LEN).unwrap();
        put(&old, &mut model, 0, 1);
        put(&old, &mut model, 3, 2);
        old.flush().unwrap();
        // J: a committed section waits in the journal; B: the bitmap is
        // dirty and the superblock says so.
        let before = bytes(&m);
        let new = load(&m, line, LEN).unwrap();
        assert!(
            bytes(&m) == before,
            "{line}: loading the table wrote the disk"
        );
        drop(new);
        assert!(
            bytes(&m) == before,
            "{line}: dropping the loaded table wrote the disk"
        );
        check(&old, &model, line);
    }
}

/// `dmsetup reload` + `resume` of a J-mode device taking writes: the new
/// table must start from the journal the old one left (written back and
/// empty), not from what the journal held at load. Before, the new
/// instance replayed at load, took the next section as its own while the
/// old one committed there, and the old one's close emptied the journal
/// beneath it: flushed writes were lost at a crash.
#[test]
fn a_reload_under_writes_keeps_every_write_in_journal_mode() {
    let m = Arc::new(MemStore::new(DEV));
    let mut model = vec![0u8; LEN as usize];
    let old = open(&m, J, LEN).unwrap();
    put(&old, &mut model, 0, 1);
    put(&old, &mut model, 1, 2);
    old.flush().unwrap();
    let new = load(&m, J, LEN).unwrap();
    // The live table goes on between load and resume.
    put(&old, &mut model, 1, 3);
    put(&old, &mut model, 5, 4);
    old.flush().unwrap();
    old.postsuspend();
    new.resume();
    put(&new, &mut model, 5, 6);
    put(&new, &mut model, 9, 7);
    new.flush().unwrap();
    check(&new, &model, "the new table, live");
    // A crash right after the swap: neither instance closed.
    check_reopened(&crash_copy(&m), J, &model, "a crash at the swap");
    drop(old);
    check(&new, &model, "the new table, the old one gone");
    check_reopened(
        &crash_copy(&m),
        J,
        &model,
        "a crash after the old table went",
    );
    put(&new, &mut model, 1, 8);
    new.flush().unwrap();
    drop(new);
    check_reopened(&m, J, &model, "a reopen");
}

/// The same for bitmap mode: the loaded table must leave the live one's
/// dirty bitmap alone (before, it recomputed the dirty regions, wrote the
/// bitmap area empty and cleared `DIRTY_BITMAP` at load, and the old
/// table's close did the same under the new one), so a write torn by a
/// crash still has its region recomputed.
#[test]
fn a_reload_under_writes_keeps_every_write_in_bitmap_mode() {
    let m = Arc::new(MemStore::new(DEV));
    let mut model = vec![0u8; LEN as usize];
    let old = open(&m, B, LEN).unwrap();
    put(&old, &mut model, 0, 1);
    put(&old, &mut model, 2, 2);
    let new = load(&m, B, LEN).unwrap();
    put(&old, &mut model, 0, 3);
    assert!(superblock(&m).has(flags::DIRTY_BITMAP));
    // A crash between load and resume, the last write torn.
    let c = crash_copy(&m);
    tear(&c, 3);
    model[3 * 512 + 7] ^= 0x40;
    check_reopened(&c, B, &model, "a crash between load and resume");
    model[3 * 512 + 7] ^= 0x40;
    old.postsuspend();
    assert!(
        !superblock(&m).has(flags::DIRTY_BITMAP),
        "postsuspend leaves it clean"
    );
    new.resume();
    put(&new, &mut model, 2, 4);
    check(&new, &model, "the new table, live");
    drop(old);
    // The new table's region is still marked dirty on disk: a torn
    // rewrite of it is recomputed after a crash.
    put(&new, &mut model, 2, 5);
    let c = crash_copy(&m);
    tear(&c, 2 * 8 + 1);
    let mut torn = model.clone();
    torn[(2 * 8 + 1) * 512 + 7] ^= 0x40;
    check_reopened(&c, B, &torn, "a crash after the old table went");
    check(&new, &model, "the new table, the old one gone");
    drop(new);
    check_reopened(&m, B, &model, "a reopen");
}

/// `dmsetup suspend` + `resume` of one table: postsuspend leaves the
/// journal empty with every write in place, and the same instance goes
/// on from there.
#[test]
fn a_resume_after_postsuspend_goes_on_from_a_clean_disk() {
    let m = Arc::new(MemStore::new(DEV));
    let mut model = vec![0u8; LEN as usize];
    let t = open(&m, J, LEN).unwrap();
    put(&t, &mut model, 0, 1);
    put(&t, &mut model, 7, 2);
    t.postsuspend();
    // The flush of `dmsetup suspend` comes after postsuspend.
    t.flush().unwrap();
    // Everything is in place: the data area alone (the journal ignored
    // by an instance in R mode) holds the model.
    let r = open(
        &crash_copy(&m),
        "d 0 4 R 2 fix_padding internal_hash:crc32c",
        LEN,
    )
    .unwrap();
    check(&r, &model, "in place after postsuspend");
    t.resume();
    put(&t, &mut model, 7, 3);
    put(&t, &mut model, 8, 4);
    t.flush().unwrap();
    check(&t, &model, "resumed");
    check_reopened(
        &crash_copy(&m),
        J,
        &model,
        "a crash after the second resume",
    );
    drop(t);
    check_reopened(&m, J, &model, "a reopen");
}

struct One(Arc<MemStore>);

impl DeviceResolver for One {
    fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0.clone())
    }
}

/// A journal damaged after the load is found at resume: the device fails
/// through its `Fault` with the reason, its requests fail, nothing panics.
#[test]
fn a_journal_found_damaged_at_resume_fails_the_device_alone() {
    let k = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let line = format!(
        "d 0 4 J 5 journal_sectors:4096 journal_watermark:100 fix_padding \
         internal_hash:crc32c journal_mac:hmac(sha256):{k}"
    );
    let m = Arc::new(MemStore::new(DEV));
    let old = open(&m, &line, LEN).unwrap();
    put(&old, &mut vec![0u8; LEN as usize], 0, 1);
    old.flush().unwrap();
    // A crash: the committed section is to be replayed.
    std::mem::forget(old);
    let fault = Arc::new(Fault::new());
    let opts = TargetOptions {
        fault: Some(fault.clone()),
        ..TargetOptions::default()
    };
    let args: Vec<String> = line.split_whitespace().map(Into::into).collect();
    let t = super::new(TargetArgs {
        args: &args,
        len: LEN,
        resolver: &mut One(m.clone()),
        options: &opts,
    })
    .map_err(|e| e.msg)
    .unwrap();
    // The first section's first entry, damaged between load and resume.
    let g = geometry(&m);
    let at = g.journal_sector(0, 1) * 512;
    let mut s = [0u8; 512];
    m.read(at, &mut s).unwrap();
    s[100] ^= 0xff;
    m.write(at, WriteBuf::Borrowed(&s), false).unwrap();
    t.resume();
    assert!(fault.is_failed(), "the device did not fail");
    let why = fault.reason().unwrap_or_default().to_string();
    assert!(why.contains("journal_mac"), "{why}");
    let mut b = [0u8; BLOCK];
    let e = t.read(0, &mut b).unwrap_err().to_string();
    assert!(e.contains("journal_mac"), "{e}");
    assert!(t.write(0, WriteBuf::Borrowed(&b), false).is_err());
    // Resumed again (a retried `dmsetup resume`): still failed, no panic.
    t.resume();
    t.postsuspend();
    drop(t);
}
