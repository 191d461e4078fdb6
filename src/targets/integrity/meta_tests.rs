//! The integrity target with `meta_device`: tags, journal, bitmap and
//! superblock on the metadata device, plain data on the data device, in
//! every writing mode, across reopens, crashes, discards, recalculation
//! and a data device that grew.

use std::sync::Arc;

use super::io;
use super::layout::{Geometry, DEFAULT_LOG2_BUFFER_SECTORS};
use super::superblock::{flags, Superblock};
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, Target, TargetArgs, TargetOptions};

/// `d` is the data device, `m` the metadata device.
struct Two(Arc<MemStore>, Arc<MemStore>);

impl DeviceResolver for Two {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        match spec {
            "d" => Ok(self.0.clone()),
            "m" => Ok(self.1.clone()),
            _ => Err(format!("{spec}: no such device")),
        }
    }
}

const DATA: u64 = 4 << 20;
const META: u64 = 1 << 20;

fn devices() -> (Arc<MemStore>, Arc<MemStore>) {
    (Arc::new(MemStore::new(DATA)), Arc::new(MemStore::new(META)))
}

/// The target of `line`, resumed as a live table is.
fn open(d: &Arc<MemStore>, m: &Arc<MemStore>, line: &str) -> Result<Arc<dyn Target>, String> {
    let args: Vec<String> = line.split_whitespace().map(Into::into).collect();
    let opts = TargetOptions::default();
    let mut r = Two(d.clone(), m.clone());
    let t = super::new(TargetArgs {
        args: &args,
        len: d.size(),
        resolver: &mut r,
        options: &opts,
    })
    .map_err(|e| e.msg)?;
    t.resume();
    Ok(t)
}

fn line(mode: &str) -> String {
    let extra = match mode {
        "B" => " sectors_per_bit:8 bitmap_flush_interval:3600000",
        _ => "",
    };
    let n = 2 + extra.split_whitespace().count();
    format!("d 0 4 {mode} {n} meta_device:m{extra} internal_hash:crc32c")
}

fn sb(m: &MemStore) -> Superblock {
    let mut b = vec![0u8; 512];
    m.read(0, &mut b).unwrap();
    Superblock::parse(&b).unwrap().unwrap()
}

fn geometry(d: &MemStore, m: &MemStore) -> Geometry {
    let s = sb(m);
    Geometry::of_separate(
        &s,
        0,
        m.size() / 512,
        d.size() / 512,
        DEFAULT_LOG2_BUFFER_SECTORS,
    )
    .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i / 509) as u8)
        .collect()
}

#[test]
fn every_mode_keeps_plain_data_on_the_data_device_and_reads_back_after_a_reopen() {
    for mode in ["J", "D", "B"] {
        let (d, m) = devices();
        let t = open(&d, &m, &line(mode)).unwrap();
        let s = sb(&m);
        assert_eq!(s.log2_interleave_sectors, 0, "{mode}");
        assert_eq!(s.provided_data_sectors, DATA / 512, "{mode}");
        assert!(
            !s.has(flags::FIXED_PADDING) && s.version >= 2,
            "{mode}: {s:?}"
        );
        assert_eq!(t.size(), DATA);
        let data = pattern(96 * 1024, mode.as_bytes()[0]);
        t.write(8192, WriteBuf::Borrowed(&data), false).unwrap();
        t.write(DATA - 4096, WriteBuf::Borrowed(&data[..4096]), false)
            .unwrap();
        t.flush().unwrap();
        drop(t);
        // The data device alone: the same bytes at the same offsets.
        let mut raw = vec![0u8; data.len()];
        d.read(8192, &mut raw).unwrap();
        assert_eq!(raw, data, "{mode}");
        // Their tags on the metadata device, after the journal.
        let g = geometry(&d, &m);
        let mut tag = [0u8; 4];
        io::read_bytes(&*m, g.tag_byte(16), &mut tag).unwrap();
        let mut want = [0u8; 4];
        super::tags::Alg::Crc32c.tag(None, 16, &data[..512], &mut want);
        assert_eq!(tag, want, "{mode}");
        let t = open(&d, &m, &line(mode)).unwrap();
        let mut back = vec![0u8; data.len()];
        t.read(8192, &mut back).unwrap();
        assert_eq!(back, data, "{mode}");
        t.read(DATA - 4096, &mut back[..4096]).unwrap();
        assert_eq!(back[..4096], data[..4096], "{mode}");
    }
}

#[test]
fn a_flipped_data_bit_fails_its_sector_only() {
    for mode in ["J", "D", "B"] {
        let (d, m) = devices();
        let t = open(&d, &m, &line(mode)).unwrap();
        t.write(0, WriteBuf::Borrowed(&[0x5a; 8192]), false)
            .unwrap();
        drop(t);
        let mut b = [0u8; 512];
        d.read(5 * 512, &mut b).unwrap();
        b[100] ^= 1;
        d.write(5 * 512, WriteBuf::Borrowed(&b), false).unwrap();
        let t = open(&d, &m, &line(mode)).unwrap();
        for k in 0..16u64 {
            let r = t.read(k * 512, &mut b);
            assert_eq!(r.is_err(), k == 5, "{mode}: sector {k}: {r:?}");
        }
        assert!(t.status().starts_with("1 "), "{}", t.status());
    }
}

/// J mode after a crash: a flushed write that never left the journal is
/// replayed from the metadata device onto the data device.
#[test]
fn a_flushed_journal_is_replayed_onto_the_data_device() {
    let (d, m) = devices();
    let j = "d 0 4 J 4 meta_device:m journal_sectors:2000 journal_watermark:100 \
             internal_hash:crc32c";
    let t = open(&d, &m, j).unwrap();
    let data = pattern(64 * 1024, 7);
    t.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
    t.flush().unwrap();
    // A crash: no close, nothing placed (the watermark is 100 %).
    std::mem::forget(t);
    let mut raw = vec![0u8; data.len()];
    d.read(4096, &mut raw).unwrap();
    assert_ne!(raw, data, "placed before the crash");
    let t = open(&d, &m, j).unwrap();
    d.read(4096, &mut raw).unwrap();
    assert_eq!(raw, data, "replayed onto the data device");
    let mut back = vec![0u8; data.len()];
    t.read(4096, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn a_bitmap_crash_recomputes_dirty_regions_on_the_metadata_device() {
    let (d, m) = devices();
    let t = open(&d, &m, &line("B")).unwrap();
    t.write(64 * 512, WriteBuf::Borrowed(&[9u8; 4096]), false)
        .unwrap();
    assert!(sb(&m).has(flags::DIRTY_BITMAP));
    std::mem::forget(t);
    // A torn write: new data without its tag, in the dirty region.
    d.write(65 * 512, WriteBuf::Borrowed(&[1u8; 512]), false)
        .unwrap();
    let t = open(&d, &m, &line("B")).unwrap();
    let mut b = [0u8; 512];
    t.read(65 * 512, &mut b).unwrap();
    assert_eq!(b, [1u8; 512]);
    drop(t);
    assert!(!sb(&m).has(flags::DIRTY_BITMAP));
}

#[test]
fn discards_fill_tags_on_the_metadata_device_and_recalculate_reads_the_data() {
    let (d, m) = devices();
    let l = "d 0 4 D 3 meta_device:m allow_discards internal_hash:crc32c";
    let t = open(&d, &m, l).unwrap();
    t.write(0, WriteBuf::Borrowed(&[0x33; 8192]), false)
        .unwrap();
    t.discard(2 * 512, 4 * 512).unwrap();
    let g = geometry(&d, &m);
    let mut tags = [0u8; 8 * 4];
    io::read_bytes(&*m, g.tag_byte(0), &mut tags).unwrap();
    assert!(tags[8..24]
        .iter()
        .all(|&b| b == super::discard::DISCARD_FILLER));
    let mut all = vec![0u8; 8192];
    t.read(0, &mut all).unwrap();
    drop(t);
    // Data written around the target: its tags are recomputed.
    d.write(1 << 20, WriteBuf::Borrowed(&[0x44; 4096]), false)
        .unwrap();
    let r = "d 0 4 D 3 meta_device:m recalculate internal_hash:crc32c";
    let t = open(&d, &m, r).unwrap();
    let t0 = std::time::Instant::now();
    while sb(&m).recalc_sector < DATA / 512 {
        assert!(t0.elapsed().as_secs() < 60, "{:?}", sb(&m));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    t.read(1 << 20, &mut all[..4096]).unwrap();
    assert_eq!(all[..4096], [0x44; 4096]);
}

/// The kernel's resize: a data device that grew provides more sectors,
/// and the superblock says so after the open; the data kept reads back.
#[test]
fn a_grown_data_device_provides_its_new_size() {
    let (d, m) = devices();
    let t = open(&d, &m, &line("D")).unwrap();
    t.write(0, WriteBuf::Borrowed(&[0x21; 4096]), false)
        .unwrap();
    drop(t);
    let big = Arc::new(MemStore::new(2 * DATA));
    let mut all = vec![0u8; DATA as usize];
    d.read(0, &mut all).unwrap();
    big.write(0, WriteBuf::Borrowed(&all), false).unwrap();
    let t = open(&big, &m, &line("D")).unwrap();
    assert_eq!(sb(&m).provided_data_sectors, 2 * DATA / 512);
    assert_eq!(t.size(), 2 * DATA);
    let mut b = [0u8; 4096];
    t.read(0, &mut b).unwrap();
    assert_eq!(b, [0x21; 4096]);
    t.write(DATA + 4096, WriteBuf::Borrowed(&[0x22; 4096]), false)
        .unwrap();
    t.read(DATA + 4096, &mut b).unwrap();
    assert_eq!(b, [0x22; 4096]);
}

#[test]
fn the_layouts_are_not_mixed_up_and_the_line_prints_meta_device() {
    let (d, m) = devices();
    let t = open(&d, &m, &line("J")).unwrap();
    assert!(
        t.table_params(false).contains(" meta_device:m "),
        "{}",
        t.table_params(false)
    );
    t.write(0, WriteBuf::Borrowed(&[0x77; 4096]), false)
        .unwrap();
    drop(t);
    // The data device is not formatted; the metadata device's
    // superblock is not of interleaved data.
    let e = open(&d, &m, "d 0 4 J 1 internal_hash:crc32c")
        .err()
        .unwrap();
    assert!(e.contains("superblock"), "{e}");
    let e = open(&m, &m, "d 0 4 J 1 internal_hash:crc32c")
        .err()
        .unwrap();
    assert!(e.contains("separate"), "{e}");
    let e = open(&d, &m, "d 0 4 J 2 meta_device:d internal_hash:crc32c")
        .err()
        .unwrap();
    assert!(e.contains("data device itself"), "{e}");
    // One device under two names.
    let e = open(&d, &d, &line("J")).err().unwrap();
    assert!(e.contains(" itself"), "{e}");
    // A metadata device too small for the tags of the data device.
    let tiny = Arc::new(MemStore::new(64 * 1024));
    let e = open(&d, &tiny, &line("J")).err().unwrap();
    assert!(e.contains("too small"), "{e}");
}
