//! Tests of the fault and logging targets (flakey, delay, dust,
//! log-writes) against the kernel documentation's tables, status lines and
//! messages, over in-memory devices.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::log_replay::{replay, Check, LogReader, ReplayPlan};
use super::log_writes::{LOG_DISCARD_FLAG, LOG_FLUSH_FLAG, LOG_FUA_FLAG, LOG_MARK_FLAG};
use super::{DeviceResolver, Target, TargetArgs, TargetError, TargetOptions};
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;

/// Devices by name, each a memory store.
struct Mem(HashMap<String, Arc<MemStore>>);

impl Mem {
    fn new(devs: &[(&str, u64)]) -> Mem {
        Mem(devs
            .iter()
            .map(|(n, s)| (n.to_string(), Arc::new(MemStore::new(*s))))
            .collect())
    }
    fn get(&self, n: &str) -> Arc<MemStore> {
        self.0[n].clone()
    }
}

impl DeviceResolver for Mem {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        self.0
            .get(spec)
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .ok_or_else(|| format!("no device {spec}"))
    }
}

fn build(
    name: &str,
    args: &str,
    len: u64,
    mem: &mut Mem,
) -> Result<Arc<dyn Target>, (String, TargetError)> {
    let ty = super::lookup(name).expect("target type");
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    (ty.new)(TargetArgs {
        args: &args,
        len,
        resolver: mem,
        options: &TargetOptions::default(),
    })
    .map_err(|e| {
        let field = e.arg.map(|i| ty.arg_name(i)).unwrap_or_default();
        (field, e)
    })
}

fn err(name: &str, args: &str, mem: &mut Mem) -> (String, String) {
    match build(name, args, 1 << 20, mem) {
        Ok(_) => panic!("{name} {args} was accepted"),
        Err((field, e)) => (field, e.msg),
    }
}

fn msg(t: &dyn Target, m: &str) -> Result<Option<String>, String> {
    let argv: Vec<String> = m.split_whitespace().map(String::from).collect();
    t.message(&argv)
}

#[test]
fn every_new_target_is_listed() {
    for n in ["flakey", "delay", "dust", "log-writes"] {
        assert!(super::lookup(n).is_some(), "{n} missing from TYPES");
    }
}

// ---------------------------------------------------------------- flakey

#[test]
fn flakey_tables_print_back_as_the_kernel_does() {
    let mut m = Mem::new(&[("d", 1 << 20)]);
    let cases = [
        // No features: the kernel sets and prints error_reads error_writes.
        ("d 0 1 1", "d 0 1 1 2 error_reads error_writes"),
        ("d 8 0 5 0", "d 8 0 5 2 error_reads error_writes"),
        ("d 0 5 5 1 drop_writes", "d 0 5 5 1 drop_writes"),
        ("d 0 5 5 1 error_writes", "d 0 5 5 1 error_writes"),
        (
            "d 0 5 5 2 error_reads drop_writes",
            "d 0 5 5 2 error_reads drop_writes",
        ),
        // The documentation's examples.
        (
            "d 0 0 5 5 corrupt_bio_byte 32 r 1 0",
            "d 0 0 5 5 corrupt_bio_byte 32 r 1 0",
        ),
        (
            "d 0 0 5 5 corrupt_bio_byte 224 w 0 32",
            "d 0 0 5 5 corrupt_bio_byte 224 w 0 32",
        ),
        (
            "d 0 0 1 4 random_write_corrupt 100000000 random_read_corrupt 100000000",
            "d 0 0 1 4 random_read_corrupt 100000000 random_write_corrupt 100000000",
        ),
    ];
    for (line, want) in cases {
        let t = build("flakey", line, 1 << 19, &mut m).unwrap();
        assert_eq!(t.table_params(false), want, "{line}");
        assert_eq!(t.status(), "", "flakey has no status");
        assert!(
            msg(t.as_ref(), "anything").is_err(),
            "flakey takes no messages"
        );
    }
}

#[test]
fn flakey_refuses_bad_tables_naming_the_field() {
    let mut m = Mem::new(&[("d", 1 << 20)]);
    let cases: &[(&str, &str, &str)] = &[
        ("d 0 1", "", "Invalid argument count"),
        ("d 0 x 1", "argument 3 (up interval)", "Invalid up interval"),
        (
            "d 0 1 -1",
            "argument 4 (down interval)",
            "Invalid down interval",
        ),
        ("d 0 0 0", "", "Total (up + down) interval is zero"),
        ("d 0 4294967295 1", "", "Interval overflow"),
        (
            "d 0 1 1 12",
            "argument 5 (#features)",
            "Invalid number of feature args",
        ),
        (
            "d 0 1 1 2 drop_writes",
            "argument 5 (#features)",
            "feature words follow",
        ),
        (
            "d 0 1 1 1 bogus",
            "argument 6",
            "Unrecognised flakey feature",
        ),
        (
            "d 0 1 1 2 drop_writes drop_writes",
            "argument 7",
            "duplicated",
        ),
        (
            "d 0 1 1 2 drop_writes error_writes",
            "argument 7",
            "conflicts with feature drop_writes",
        ),
        (
            "d 0 1 1 2 corrupt_bio_byte 1",
            "argument 6",
            "requires 4 parameters",
        ),
        (
            "d 0 1 1 5 corrupt_bio_byte 0 r 1 0",
            "argument 7",
            "Invalid corrupt bio byte",
        ),
        (
            "d 0 1 1 5 corrupt_bio_byte 1 x 1 0",
            "argument 8",
            "Invalid corrupt bio direction",
        ),
        (
            "d 0 1 1 5 corrupt_bio_byte 1 r 256 0",
            "argument 9",
            "0-255",
        ),
        (
            "d 0 1 1 6 drop_writes corrupt_bio_byte 1 w 1 0",
            "",
            "drop_writes is incompatible",
        ),
        (
            "d 0 1 1 3 error_reads random_read_corrupt 5",
            "",
            "error_reads is incompatible",
        ),
        (
            "d 0 1 1 2 random_read_corrupt 1000000001",
            "argument 7",
            "Invalid random corrupt argument",
        ),
        ("nodev 0 1 1", "argument 1 (device)", "no device"),
    ];
    for (line, field, text) in cases {
        let (f, e) = err("flakey", line, &mut m);
        assert_eq!(&f, field, "{line}: {e}");
        assert!(e.contains(text), "{line}: {e}");
    }
}

fn flakey_of(line: &str, m: &mut Mem) -> Arc<super::flakey::Flakey> {
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    super::flakey::build(TargetArgs {
        args: &args,
        len: 1 << 19,
        resolver: m,
        options: &TargetOptions::default(),
    })
    .unwrap()
}

#[test]
fn flakey_behaves_as_its_features_say_while_down() {
    let mut m = Mem::new(&[("d", 1 << 20)]);
    let d = m.get("d");
    let data = vec![0xAAu8; 4096];
    // Up interval of an hour: up now; forced down for the test.
    let t = flakey_of("d 0 3600 1", &mut m);
    assert!(!t.is_down());
    t.write(0, WriteBuf::Borrowed(&data), false).unwrap();
    t.force_state(Some(true));
    assert!(t.is_down());
    let mut b = vec![0u8; 4096];
    assert!(t.read(0, &mut b).is_err(), "all I/O fails without features");
    assert!(t.write(0, WriteBuf::Borrowed(&data), false).is_err());
    assert!(t.flush().is_err());
    t.force_state(None);
    t.read(0, &mut b).unwrap();

    // drop_writes: acknowledged, never stored; reads work.
    let t = flakey_of("d 0 3600 1 1 drop_writes", &mut m);
    t.force_state(Some(true));
    t.write(0, WriteBuf::Borrowed(&[0x55u8; 4096]), true)
        .unwrap();
    t.flush().unwrap();
    t.discard(0, 4096).unwrap();
    t.read(0, &mut b).unwrap();
    assert!(
        b.iter().all(|&x| x == 0xAA),
        "a dropped write reached the disk"
    );
    t.force_state(Some(false));
    t.write(0, WriteBuf::Borrowed(&[0x55u8; 4096]), false)
        .unwrap();
    d.read(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0x55));

    // error_writes: reads fine, writes fail.
    let t = flakey_of("d 0 3600 1 1 error_writes", &mut m);
    t.force_state(Some(true));
    t.read(0, &mut b).unwrap();
    let e = t
        .write(0, WriteBuf::Borrowed(&data), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("down interval"), "{e}");

    // error_reads only: writes pass.
    let t = flakey_of("d 0 3600 1 1 error_reads", &mut m);
    t.force_state(Some(true));
    assert!(t.read(0, &mut b).is_err());
    t.write(0, WriteBuf::Borrowed(&data), false).unwrap();

    // The documentation's read corruption: the 32nd byte becomes 1.
    let t = flakey_of("d 0 0 5 5 corrupt_bio_byte 32 r 1 0", &mut m);
    assert!(t.is_down(), "up interval 0: always down");
    t.read(0, &mut b).unwrap();
    assert_eq!(b[31], 1);
    assert!(b.iter().enumerate().all(|(i, &x)| i == 31 || x == 0xAA));
    d.read(0, &mut b).unwrap();
    assert_eq!(b[31], 0xAA, "read corruption never reaches the disk");

    // Write corruption with flags: 32 (REQ_META) never matches a udm
    // request; REQ_FUA matches FUA writes only; a borrowed buffer is left
    // alone.
    let t = flakey_of("d 0 0 5 5 corrupt_bio_byte 224 w 0 32", &mut m);
    t.write(0, WriteBuf::Borrowed(&data), false).unwrap();
    d.read(0, &mut b).unwrap();
    assert_eq!(b[223], 0xAA);
    let t = flakey_of("d 0 0 5 5 corrupt_bio_byte 224 w 0 131072", &mut m);
    t.write(0, WriteBuf::Borrowed(&data), false).unwrap();
    d.read(0, &mut b).unwrap();
    assert_eq!(b[223], 0xAA, "not a FUA write");
    t.write(0, WriteBuf::Borrowed(&data), true).unwrap();
    d.read(0, &mut b).unwrap();
    assert_eq!(b[223], 0, "FUA write corrupted");
    assert!(data.iter().all(|&x| x == 0xAA), "caller's bytes untouched");

    // Random read corruption with probability 1: one byte per read.
    d.write(0, WriteBuf::Borrowed(&data), false).unwrap();
    let t = flakey_of("d 0 0 1 2 random_read_corrupt 1000000000", &mut m);
    let mut changed = 0;
    for _ in 0..16 {
        t.read(0, &mut b).unwrap();
        let diff = b.iter().filter(|&&x| x != 0xAA).count();
        assert!(diff <= 1);
        changed += diff;
    }
    assert!(changed > 0, "16 reads at probability 1 changed nothing");
}

// ----------------------------------------------------------------- delay

#[test]
fn delay_tables_status_and_routing() {
    let mut m = Mem::new(&[("r", 4 << 20), ("w", 4 << 20)]);
    let cases = [
        ("r 0 500", "r 0 500"),
        ("r 2048 0 w 4096 400", "r 2048 0 w 4096 400"),
        ("r 0 50 w 0 100 r 0 333", "r 0 50 w 0 100 r 0 333"),
    ];
    for (line, want) in cases {
        let t = build("delay", line, 1 << 18, &mut m).unwrap();
        assert_eq!(t.table_params(false), want);
        assert_eq!(t.status(), "0 0 0");
        assert!(t.limits().queue_depth >= super::delay::HELD_DEPTH);
    }
    let t = build("delay", "r 0 0", 1 << 18, &mut m).unwrap();
    assert_eq!(t.limits().queue_depth, 0, "no delay, nothing held");

    // Reads from the first device, writes to the second at its offset.
    let t = build("delay", "r 8 0 w 16 0", 1 << 18, &mut m).unwrap();
    t.write(0, WriteBuf::Borrowed(&[7u8; 512]), false).unwrap();
    let mut b = [0u8; 512];
    m.get("w").read(16 * 512, &mut b).unwrap();
    assert_eq!(b, [7u8; 512]);
    m.get("r")
        .write(8 * 512, WriteBuf::Borrowed(&[9u8; 512]), false)
        .unwrap();
    t.read(0, &mut b).unwrap();
    assert_eq!(b, [9u8; 512]);

    // A held read shows in the status and takes at least its delay.
    let t = build("delay", "r 0 300 w 0 0", 1 << 18, &mut m).unwrap();
    let t2 = t.clone();
    let start = Instant::now();
    let h = std::thread::spawn(move || {
        let mut b = [0u8; 512];
        t2.read(0, &mut b).unwrap();
    });
    let mut seen = false;
    while start.elapsed() < Duration::from_millis(250) {
        if t.status() == "1 0 0" {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    h.join().unwrap();
    assert!(seen, "the held read never showed in the status");
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(t.status(), "0 0 0");
    let w = Instant::now();
    t.write(0, WriteBuf::Borrowed(&[1u8; 512]), false).unwrap();
    assert!(
        w.elapsed() < Duration::from_millis(300),
        "writes have no delay"
    );
}

#[test]
fn delay_refuses_bad_tables_naming_the_field() {
    let mut m = Mem::new(&[("r", 1 << 20)]);
    let cases: &[(&str, &str, &str)] = &[
        ("r 0", "", "Requires exactly 3, 6 or 9 arguments"),
        ("r 0 1 r 0", "", "Requires exactly 3, 6 or 9 arguments"),
        ("r 0 x", "argument 3 (delay)", "Invalid delay"),
        ("r 0 1 r 0 -5", "argument 6 (write delay)", "Invalid delay"),
        ("r x 1", "argument 2 (offset)", "512-byte sectors"),
        (
            "r 0 1 r 0 1 q 0 1",
            "argument 7 (flush device)",
            "no device",
        ),
        ("r 4095 1", "argument 2 (offset)", "does not fit"),
    ];
    for (line, field, text) in cases {
        let (f, e) = err("delay", line, &mut m);
        assert_eq!(&f, field, "{line}: {e}");
        assert!(e.contains(text), "{line}: {e}");
    }
}

// ------------------------------------------------------------------ dust

#[test]
fn dust_follows_the_documentation_walkthrough() {
    let mut m = Mem::new(&[("d", 1 << 20)]);
    let t = build("dust", "d 0 512", 1 << 20, &mut m).unwrap();
    assert_eq!(t.table_params(false), "d 0 512");
    assert_eq!(t.status(), "d bypass verbose");
    let mut b = vec![0u8; 512 * 128];
    t.read(0, &mut b).unwrap();
    t.write(0, WriteBuf::Borrowed(&b), false).unwrap();
    for blk in [60, 67, 72] {
        assert_eq!(msg(t.as_ref(), &format!("addbadblock {blk}")), Ok(None));
    }
    // Bypass: all I/O passes.
    t.read(0, &mut b).unwrap();
    assert_eq!(msg(t.as_ref(), "enable"), Ok(None));
    assert_eq!(t.status(), "d fail_read_on_bad_block verbose");
    let e = t.read(67 * 512, &mut b[..512]).unwrap_err().to_string();
    assert!(e.contains("67"), "{e}");
    t.read(66 * 512, &mut b[..512]).unwrap();
    assert!(
        t.read(0, &mut b).is_err(),
        "a read spanning bad blocks fails"
    );
    assert_eq!(
        msg(t.as_ref(), "countbadblocks"),
        Ok(Some("countbadblocks: 3 badblock(s) found".into()))
    );
    assert_eq!(
        msg(t.as_ref(), "listbadblocks"),
        Ok(Some("60\n67\n72\n".into()))
    );
    assert_eq!(
        msg(t.as_ref(), "queryblock 72"),
        Ok(Some(
            "dust_query_block: block 72 found in badblocklist".into()
        ))
    );
    // Writing the bad blocks removes them ("remapped").
    t.write(0, WriteBuf::Borrowed(&vec![0u8; 512 * 128]), false)
        .unwrap();
    assert_eq!(
        msg(t.as_ref(), "countbadblocks"),
        Ok(Some("countbadblocks: 0 badblock(s) found".into()))
    );
    t.read(0, &mut b).unwrap();
    assert_eq!(
        msg(t.as_ref(), "queryblock 72"),
        Ok(Some(
            "dust_query_block: block 72 not found in badblocklist".into()
        ))
    );
    assert_eq!(
        msg(t.as_ref(), "listbadblocks"),
        Ok(Some("No blocks in badblocklist".into()))
    );
    // Errors: duplicates, unknown blocks, out of range, bad words.
    msg(t.as_ref(), "addbadblock 88").unwrap();
    let e = msg(t.as_ref(), "addbadblock 88").unwrap_err();
    assert!(e.contains("block 88 already in badblocklist"), "{e}");
    let e = msg(t.as_ref(), "removebadblock 87").unwrap_err();
    assert!(e.contains("block 87 not found in badblocklist"), "{e}");
    assert!(msg(t.as_ref(), "addbadblock 99999")
        .unwrap_err()
        .contains("out of range"));
    assert!(msg(t.as_ref(), "addbadblock")
        .unwrap_err()
        .contains("requires an additional argument"));
    assert!(msg(t.as_ref(), "addbadblock x").is_err());
    assert!(msg(t.as_ref(), "frobnicate")
        .unwrap_err()
        .contains("unrecognized message"));
    assert!(msg(t.as_ref(), "enable now")
        .unwrap_err()
        .contains("invalid number of arguments"));
    assert_eq!(
        msg(t.as_ref(), "clearbadblocks"),
        Ok(Some("dust_clear_badblocks: badblocks cleared".into()))
    );
    assert_eq!(
        msg(t.as_ref(), "clearbadblocks"),
        Ok(Some("dust_clear_badblocks: no badblocks found".into()))
    );
    // Quiet mode toggles.
    msg(t.as_ref(), "quiet").unwrap();
    assert_eq!(t.status(), "d fail_read_on_bad_block quiet");
    msg(t.as_ref(), "quiet").unwrap();
    assert_eq!(t.status(), "d fail_read_on_bad_block verbose");
    // Write failure count: two writes fail (other blocks of the request
    // are written), the third takes the block off the list.
    msg(t.as_ref(), "addbadblock 5 2").unwrap();
    let data = vec![0x33u8; 512 * 8];
    for _ in 0..2 {
        assert!(t.write(4 * 512, WriteBuf::Borrowed(&data), false).is_err());
    }
    let d = m.get("d");
    let mut one = [0u8; 512];
    d.read(4 * 512, &mut one).unwrap();
    assert_eq!(
        one, [0x33; 512],
        "the good block of a failed write is written"
    );
    d.read(5 * 512, &mut one).unwrap();
    assert_eq!(one, [0; 512], "the failing block is not");
    t.write(4 * 512, WriteBuf::Borrowed(&data), false).unwrap();
    assert_eq!(
        msg(t.as_ref(), "countbadblocks"),
        Ok(Some("countbadblocks: 0 badblock(s) found".into()))
    );
    msg(t.as_ref(), "disable").unwrap();
    assert_eq!(t.status(), "d bypass verbose");
}

#[test]
fn dust_blocks_are_numbered_on_the_device_and_bad_tables_are_refused() {
    let mut m = Mem::new(&[("d", 1 << 20)]);
    // 4 KiB blocks, segment starting 8 sectors (one block) into d.
    let t = build("dust", "d 8 4096", 1 << 19, &mut m).unwrap();
    msg(t.as_ref(), "addbadblock 2").unwrap();
    msg(t.as_ref(), "enable").unwrap();
    let mut b = [0u8; 4096];
    t.read(0, &mut b).unwrap();
    assert!(
        t.read(4096, &mut b).is_err(),
        "segment block 1 is device block 2"
    );
    let cases: &[(&str, &str, &str)] = &[
        ("d 0", "", "Invalid argument count"),
        ("d 0 0", "argument 3 (blksz)", "Invalid block size"),
        ("d 0 256", "argument 3 (blksz)", "at least 512"),
        ("d 0 1536", "argument 3 (blksz)", "power of 2"),
        ("d 0 2147483648", "argument 3 (blksz)", "too large"),
        ("d y 512", "argument 2 (offset)", "512-byte sectors"),
    ];
    for (line, field, text) in cases {
        let (f, e) = err("dust", line, &mut m);
        assert_eq!(&f, field, "{line}: {e}");
        assert!(e.contains(text), "{line}: {e}");
    }
}

// ------------------------------------------------------------ log-writes

#[test]
fn log_writes_records_in_the_kernels_format_and_order() {
    let mut m = Mem::new(&[("d", 1 << 20), ("l", 4 << 20)]);
    let t = build("log-writes", "d l", 1 << 20, &mut m).unwrap();
    assert_eq!(t.table_params(false), "d l");
    // Superblock sector, nothing logged yet: next free sector 1.
    assert_eq!(t.status(), "0 0");
    let w = |at: u64, v: u8, fua: bool| {
        t.write(at, WriteBuf::Borrowed(&[v; 1024]), fua).unwrap();
    };
    w(0, 1, false);
    w(4096, 2, false);
    // Not logged before a flush.
    assert_eq!(t.status(), "0 0");
    w(8192, 3, true);
    // A FUA write is logged at once (and rewrites the superblock).
    assert_eq!(t.status(), "1 3");
    t.flush().unwrap();
    t.discard(0, 1024).unwrap();
    assert_eq!(msg(t.as_ref(), "mark mkfs"), Ok(None));
    t.flush().unwrap();
    // 1 FUA + 2 writes + flush + mark + discard + flush.
    assert_eq!(t.status(), "7 13");
    assert!(msg(t.as_ref(), "mark").is_err());
    assert!(msg(t.as_ref(), "note x")
        .unwrap_err()
        .contains("Unrecognised"));

    let log = m.get("l");
    // The superblock byte for byte.
    let mut sb = [0u8; 512];
    log.read(0, &mut sb).unwrap();
    let mut want = [0u8; 512];
    want[..8].copy_from_slice(b"rhswfsj\0");
    want[8] = 1; // version
    want[16] = 5; // nr_entries at the last FUA/mark: the mark was the 5th
    want[24..28].copy_from_slice(&512u32.to_le_bytes());
    assert_eq!(sb, want);
    // The first entry block: the FUA write at sector 16, 2 sectors.
    let mut e = [0u8; 512];
    log.read(512, &mut e).unwrap();
    assert_eq!(&e[..8], &16u64.to_le_bytes());
    assert_eq!(&e[8..16], &2u64.to_le_bytes());
    assert_eq!(&e[16..24], &LOG_FUA_FLAG.to_le_bytes());
    assert_eq!(&e[24..32], &0u64.to_le_bytes());
    assert!(e[32..].iter().all(|&b| b == 0));
    let mut data = [0u8; 1024];
    log.read(1024, &mut data).unwrap();
    assert_eq!(data, [3u8; 1024]);

    drop(t);
    // The destructor's end mark made it 8 entries.
    let mut r = LogReader::open(log.clone()).unwrap();
    assert_eq!((r.sectorsize, r.nr_entries), (512, 8));
    let mut got = Vec::new();
    while let Some(e) = r.next_entry().unwrap() {
        got.push((e.sector, e.nr_sectors, e.flags, e.mark.clone()));
    }
    assert_eq!(
        got,
        vec![
            (16, 2, LOG_FUA_FLAG, None),
            (0, 2, 0, None),
            (8, 2, 0, None),
            (0, 0, LOG_FLUSH_FLAG, None),
            (0, 0, LOG_MARK_FLAG, Some("mkfs".into())),
            (0, 2, LOG_DISCARD_FLAG, None),
            (0, 0, LOG_FLUSH_FLAG, None),
            (0, 0, LOG_MARK_FLAG, Some("dm-log-writes-end".into())),
        ]
    );
}

#[test]
fn a_replayed_log_rebuilds_the_device_at_every_flush() {
    let mut m = Mem::new(&[("d", 1 << 20), ("l", 8 << 20), ("r", 1 << 20)]);
    let t = build("log-writes", "d l", 1 << 20, &mut m).unwrap();
    let d = m.get("d");
    // Snapshots of d at each flush, then a replay that checks each.
    let mut snaps = Vec::new();
    let snap = |d: &MemStore| {
        let mut v = vec![0u8; 1 << 20];
        d.read(0, &mut v).unwrap();
        v
    };
    for round in 0..5u8 {
        for k in 0..8u64 {
            let at = ((k * 7 + u64::from(round) * 3) % 256) * 4096;
            t.write(
                at,
                WriteBuf::Borrowed(&[round * 16 + k as u8; 4096]),
                k == 3,
            )
            .unwrap();
        }
        t.write_zeroes(4096 * u64::from(round), 4096, false)
            .unwrap();
        t.flush().unwrap();
        snaps.push(snap(&d));
    }
    msg(t.as_ref(), "mark done").unwrap();
    let r = m.get("r");
    let mut n = 0;
    let plan = ReplayPlan {
        check: Some(Check::Flush),
        end_mark: Some("done".into()),
        ..ReplayPlan::default()
    };
    let rep = replay(m.get("l"), r.as_ref(), &plan, &mut |e| {
        if !e.is_flush() {
            // The last entry applied (the end mark) is a checkpoint too.
            assert_eq!(e.mark.as_deref(), Some("done"));
            return Ok(());
        }
        if snap(&r) != snaps[n] {
            return Err(format!("replay differs at flush {n}"));
        }
        n += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 5);
    assert!(rep.found_end_mark);
    // An absent end mark is an error, a limit stops early.
    let plan = ReplayPlan {
        end_mark: Some("nope".into()),
        ..ReplayPlan::default()
    };
    assert!(replay(m.get("l"), r.as_ref(), &plan, &mut |_| Ok(()))
        .unwrap_err()
        .contains("'nope' is not in the log"));
    // Bad logs are refused with a reason, not a panic.
    let bad = Arc::new(MemStore::new(4096));
    assert!(LogReader::open(bad.clone())
        .err()
        .expect("refused")
        .contains("magic"));
    bad.write(
        0,
        WriteBuf::Borrowed(&super::log_writes::encode_super(9, 512)),
        false,
    )
    .unwrap();
    let mut rd = LogReader::open(bad).unwrap();
    let mut err = None;
    for _ in 0..10 {
        match rd.next_entry() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    assert!(
        err.is_some(),
        "a superblock counting 9 entries in 4 KiB of zeros"
    );
}

#[test]
fn log_writes_refuses_bad_tables_and_stops_when_the_log_is_full() {
    let mut m = Mem::new(&[("d", 1 << 20), ("l", 4096), ("tiny", 512)]);
    let cases: &[(&str, &str, &str)] = &[
        ("d", "", "Invalid argument count"),
        ("d l x", "", "Invalid argument count"),
        ("q l", "argument 1 (device)", "Device lookup failed"),
        ("d q", "argument 2 (log device)", "Log device lookup failed"),
        ("d tiny", "argument 2 (log device)", "too small"),
    ];
    for (line, field, text) in cases {
        let (f, e) = err("log-writes", line, &mut m);
        assert_eq!(&f, field, "{line}: {e}");
        assert!(e.contains(text), "{line}: {e}");
    }
    let t = build("log-writes", "d l", 1 << 20, &mut m).unwrap();
    for i in 0..8u64 {
        t.write(i * 1024, WriteBuf::Borrowed(&[1u8; 1024]), true)
            .unwrap();
    }
    assert!(t.status().ends_with(" logging_disabled"), "{}", t.status());
    // The device itself keeps working.
    let mut b = [0u8; 1024];
    t.read(7 * 1024, &mut b).unwrap();
    assert_eq!(b, [1u8; 1024]);
}
