//! The verity target over in-memory devices: a tree built here, then reads
//! that must pass, corruptions that must fail exactly the blocks they
//! touch, and each mode's behaviour.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::build::build;
use super::tree::{Geometry, HashAlg};
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, EventHook, Target, TargetArgs, TargetError, TargetOptions};

struct Mem(HashMap<String, Arc<MemStore>>);

impl DeviceResolver for Mem {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        self.0
            .get(spec)
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .ok_or_else(|| format!("no device {spec}"))
    }
}

/// A data device of `blocks` 4 KiB blocks, a hash device with the tree
/// (sha256, salt `5a`, tree from hash block 1) and the table arguments.
struct Fixture {
    mem: Mem,
    data: Vec<u8>,
    geo: Geometry,
    args: String,
    events: Arc<AtomicUsize>,
}

fn fixture(blocks: u64, alg: HashAlg, version: u32) -> Fixture {
    let bs = 4096usize;
    let mut data: Vec<u8> = (0..blocks as usize * bs)
        .map(|i| (i / 3 + i / 4099) as u8)
        .collect();
    // One all-zero block, for ignore_zero_blocks.
    if blocks > 3 {
        data[3 * bs..4 * bs].fill(0);
    }
    let geo = Geometry::new(version, 4096, 4096, blocks, 1, alg).unwrap();
    let tree = build::<()>(&geo, alg, &[0x5a], &mut |j, b| {
        b.copy_from_slice(&data[j as usize * bs..][..bs]);
        Ok(())
    })
    .unwrap();
    let hash = MemStore::new(geo.end * 4096);
    for (i, l) in tree.levels.iter().enumerate() {
        hash.write(geo.level_start[i] * 4096, WriteBuf::Borrowed(l), false)
            .unwrap();
    }
    let dev = MemStore::new(data.len() as u64);
    dev.write(0, WriteBuf::Borrowed(&data), false).unwrap();
    let args = format!(
        "{version} data hash 4096 4096 {blocks} 1 {} {} 5a",
        alg.name(),
        hex::encode(&tree.root)
    );
    let mut m = HashMap::new();
    m.insert("data".to_string(), Arc::new(dev));
    m.insert("hash".to_string(), Arc::new(hash));
    Fixture {
        mem: Mem(m),
        data,
        geo,
        args,
        events: Arc::new(AtomicUsize::new(0)),
    }
}

impl Fixture {
    fn target(&mut self, extra: &str) -> Result<Arc<dyn Target>, TargetError> {
        let args: Vec<String> = format!("{} {extra}", self.args)
            .split_whitespace()
            .map(String::from)
            .collect();
        let ev = self.events.clone();
        let options = TargetOptions {
            events: Some(EventHook(Arc::new(move || {
                ev.fetch_add(1, Ordering::Relaxed);
            }))),
            ..TargetOptions::default()
        };
        (super::TYPE.new)(TargetArgs {
            args: &args,
            len: self.data.len() as u64,
            resolver: &mut self.mem,
            options: &options,
        })
    }
    fn poke(&self, dev: &str, at: u64) {
        let d = &self.mem.0[dev];
        let mut b = [0u8; 1];
        d.read(at, &mut b).unwrap();
        b[0] ^= 0x40;
        d.write(at, WriteBuf::Borrowed(&b), false).unwrap();
    }
}

fn read(t: &dyn Target, block: u64, n: usize) -> Result<Vec<u8>, String> {
    let mut b = vec![0u8; n * 4096];
    t.read(block * 4096, &mut b).map_err(|e| e.to_string())?;
    Ok(b)
}

#[test]
fn every_block_reads_back_and_the_table_prints_as_given() {
    for (alg, version, blocks) in [
        (HashAlg::Sha256, 1, 300),
        (HashAlg::Sha1, 0, 130),
        (HashAlg::Sha512, 1, 70),
        (HashAlg::Sha256, 1, 1),
    ] {
        let mut f = fixture(blocks, alg, version);
        let t = f.target("").unwrap();
        let all = read(&*t, 0, blocks as usize).unwrap();
        assert!(all == f.data, "{alg:?} v{version}: data differs");
        assert_eq!(t.status(), "V");
        assert_eq!(t.table_params(false), f.args);
        assert_eq!(f.events.load(Ordering::Relaxed), 0);
        assert!(t.limits().read_only);
        assert!(t.write(0, WriteBuf::Borrowed(&[0; 4096]), false).is_err());
    }
}

#[test]
fn a_flipped_data_byte_fails_its_block_only_and_raises_an_event() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    f.poke("data", 7 * 4096 + 100);
    let t = f.target("").unwrap();
    let e = read(&*t, 7, 1).unwrap_err();
    assert!(e.contains("data block 7"), "{e}");
    assert!(
        read(&*t, 6, 3).is_err(),
        "a request covering the block fails"
    );
    assert_eq!(read(&*t, 6, 1).unwrap(), f.data[6 * 4096..7 * 4096]);
    assert_eq!(read(&*t, 8, 100).unwrap(), f.data[8 * 4096..108 * 4096]);
    assert_eq!(t.status(), "C");
    assert_eq!(f.events.load(Ordering::Relaxed), 2);
}

#[test]
fn a_flipped_hash_byte_fails_the_blocks_it_covers() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    // Level 0's second block covers data blocks 128..256.
    let at = f.geo.level_start[0] * 4096 + 4096 + 9;
    f.poke("hash", at);
    let t = f.target("").unwrap();
    assert!(read(&*t, 128, 1).unwrap_err().contains("metadata block"));
    assert!(read(&*t, 255, 1).is_err());
    assert_eq!(read(&*t, 0, 128).unwrap(), f.data[..128 * 4096]);
    assert_eq!(read(&*t, 256, 44).unwrap(), f.data[256 * 4096..]);
    assert_eq!(t.status(), "C");
}

#[test]
fn modes_decide_what_a_corrupt_block_does() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    f.poke("data", 5 * 4096);
    let t = f.target("1 ignore_corruption").unwrap();
    let got = read(&*t, 5, 1).unwrap();
    assert_ne!(
        got,
        f.data[5 * 4096..6 * 4096],
        "the corrupt data is returned"
    );
    assert_eq!(t.status(), "C");

    for mode in ["restart_on_corruption", "panic_on_corruption"] {
        let t = f.target(&format!("1 {mode}")).unwrap();
        assert!(read(&*t, 0, 1).is_ok());
        assert!(read(&*t, 5, 1).is_err());
        let e = read(&*t, 0, 1).unwrap_err();
        assert!(e.contains("reload the table"), "{e}");
        assert!(t.table_params(false).ends_with(&format!(" 1 {mode}")));
    }
}

#[test]
fn zero_blocks_and_check_at_most_once() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    // Block 3 is zero in the tree; garbage on disk reads as zeros.
    f.poke("data", 3 * 4096 + 1);
    let t = f.target("1 ignore_zero_blocks").unwrap();
    assert_eq!(read(&*t, 3, 1).unwrap(), vec![0; 4096]);
    let t = f.target("").unwrap();
    assert!(read(&*t, 3, 1).is_err(), "without the option it is corrupt");

    let t = f.target("1 check_at_most_once").unwrap();
    assert!(read(&*t, 10, 1).is_ok());
    f.poke("data", 10 * 4096);
    assert!(read(&*t, 10, 1).is_ok(), "verified once, not again");
    assert!(read(&*t, 3, 1).is_err());
}

#[test]
fn a_bitmap_too_large_is_refused_not_allocated() {
    let f = fixture(300, HashAlg::Sha256, 1);
    let args: Vec<String> = format!("{} 1 check_at_most_once", f.args)
        .replace(" 300 1 ", " 1125899906842624 1 ")
        .split_whitespace()
        .map(String::from)
        .collect();
    /// Devices of 4 EiB that are never read.
    struct Huge;
    impl BlockDevice for Huge {
        fn size(&self) -> u64 {
            1 << 62
        }
        fn limits(&self) -> crate::core::Limits {
            crate::core::Limits::default()
        }
        fn read(&self, _: u64, _: &mut [u8]) -> crate::core::DevResult<()> {
            unreachable!("not read")
        }
        fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> crate::core::DevResult<()> {
            unreachable!("not written")
        }
        fn flush(&self) -> crate::core::DevResult<()> {
            Ok(())
        }
        fn discard(&self, _: u64, _: u64) -> crate::core::DevResult<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool) -> crate::core::DevResult<()> {
            Ok(())
        }
    }
    impl DeviceResolver for Huge {
        fn resolve(&mut self, _: &str) -> Result<Arc<dyn BlockDevice>, String> {
            Ok(Arc::new(Huge))
        }
    }
    let r = (super::TYPE.new)(TargetArgs {
        args: &args,
        len: 1 << 62,
        resolver: &mut Huge,
        options: &TargetOptions::default(),
    });
    match r {
        Err(e) => assert!(e.msg.contains("bitmap"), "{}", e.msg),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn hash_blocks_are_cached_once_verified() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    let t = f.target("").unwrap();
    read(&*t, 0, 300).unwrap();
    f.poke("hash", f.geo.level_start[0] * 4096);
    assert!(read(&*t, 0, 1).is_ok(), "served from the verified cache");
}

#[test]
fn bad_tables_are_refused_with_the_reason() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    let short = f.args.replace(" 300 1 ", " 200 1 ");
    let args: Vec<String> = short.split_whitespace().map(String::from).collect();
    let e = match (super::TYPE.new)(TargetArgs {
        args: &args,
        len: 300 * 4096,
        resolver: &mut f.mem,
        options: &TargetOptions::default(),
    }) {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    };
    assert_eq!(e.arg, Some(5), "{}", e.msg);
    let big = f.args.replace(" 300 1 ", " 300 9 ");
    let args: Vec<String> = big.split_whitespace().map(String::from).collect();
    let e = match (super::TYPE.new)(TargetArgs {
        args: &args,
        len: 300 * 4096,
        resolver: &mut f.mem,
        options: &TargetOptions::default(),
    }) {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    };
    assert_eq!(e.arg, Some(2), "{}", e.msg);
    assert!(f
        .target("8 use_fec_from_device nodev fec_roots 2 fec_blocks 1 fec_start 0")
        .is_err());
    let e = f
        .target("10 use_fec_from_device hash fec_roots 2 fec_blocks 1 fec_start 0 root_hash_sig_key_desc k")
        .err()
        .expect("fec_blocks 1 accepted");
    assert!(e.msg.contains("fec_blocks 1 is fewer than"), "{}", e.msg);
    let t = f.target("2 root_hash_sig_key_desc k").unwrap();
    assert!(read(&*t, 0, 1).is_ok());
}

/// Writes the FEC parity (`roots`) of the fixture's data and tree to a
/// new device `fec`; the table options that use it.
fn with_fec(f: &mut Fixture, roots: u32) -> String {
    use super::fec::{encode, Layout};
    let blocks = f.geo.data_blocks + f.geo.end - 1;
    let l = Layout::new(roots, 4096, blocks);
    let hash = f.mem.0["hash"].clone();
    let data = f.data.clone();
    let mut parity = Vec::new();
    encode::<()>(
        &l,
        &mut |m, b| {
            if m < f.geo.data_blocks {
                b.copy_from_slice(&data[m as usize * 4096..][..4096]);
            } else {
                hash.read((m - f.geo.data_blocks + 1) * 4096, b).unwrap();
            }
            Ok(true)
        },
        &mut |p| {
            parity.extend_from_slice(p);
            Ok(())
        },
    )
    .unwrap();
    let dev = MemStore::new(parity.len() as u64);
    dev.write(0, WriteBuf::Borrowed(&parity), false).unwrap();
    f.mem.0.insert("fec".into(), Arc::new(dev));
    format!("8 use_fec_from_device fec fec_blocks {blocks} fec_start 0 fec_roots {roots}")
}

#[test]
fn fec_repairs_data_and_hash_blocks_and_counts_them() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    let opts = with_fec(&mut f, 2);
    f.poke("data", 10 * 4096 + 5);
    f.poke("data", 10 * 4096 + 4000);
    // The second level-0 hash block (hash blocks: superblock slot, top,
    // then level 0), which covers data blocks 128..255.
    f.poke("hash", f.geo.level_start[0] * 4096 + 4096 + 40);
    let t = f.target(&opts).unwrap();
    let all = read(&*t, 0, 300).unwrap();
    assert!(all == f.data, "repaired blocks read back other bytes");
    assert_eq!(t.status(), "V 2");
    // check_at_most_once must not take a repaired block as verified: the
    // disk still holds the bad bytes.
    let t = f
        .target(&format!(
            "{} check_at_most_once",
            opts.replacen('8', "9", 1)
        ))
        .unwrap();
    for _ in 0..2 {
        assert!(read(&*t, 10, 1).unwrap() == f.data[10 * 4096..11 * 4096]);
    }
    assert_eq!(t.status(), "V 2");
    assert_eq!(f.events.load(Ordering::Relaxed), 0);

    // Three whole blocks of one round (302 covered blocks, 2 rounds) are
    // more than 2 roots rebuild: those blocks fail, the others read.
    let t = f.target(&opts).unwrap();
    for b in [20u64, 22, 24] {
        let d = &f.mem.0["data"];
        d.write(b * 4096, WriteBuf::Borrowed(&[0x77; 4096]), false)
            .unwrap();
    }
    for b in [20u64, 22, 24] {
        assert!(read(&*t, b, 1).is_err(), "block {b}");
    }
    assert!(read(&*t, 21, 1).is_ok());
    assert!(t.status().starts_with("C "), "{}", t.status());
}

/// A repair decodes a whole FEC round (a second or so per 4 KiB block of a
/// damaged image): with FEC, requests run on workers of the device's own,
/// never on an event loop other exports' clients share (there one
/// client's 64 KiB reads held the loop for seconds each). Without FEC a
/// read costs its hashes only and stays inline.
#[test]
fn with_fec_requests_run_on_workers_of_their_own() {
    let mut f = fixture(300, HashAlg::Sha256, 1);
    let plain = f.target("").unwrap();
    assert_eq!(plain.limits().queue_depth, 0, "no FEC: inline");
    let opts = with_fec(&mut f, 2);
    let t = f.target(&opts).unwrap();
    assert!(t.limits().queue_depth > 0, "FEC: workers of its own");
}
