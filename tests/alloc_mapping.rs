//! Seed 001: remapping through linear and striped targets allocates
//! nothing per request — proven with a counting global allocator.

mod common;

use std::sync::Arc;

use common::alloc::{fewest_allocs, Counting};
use udm::core::{BlockDevice, WriteBuf};
use udm::mapper::{MappedDevice, Segment};
use udm::store::MemStore;
use udm::targets::{self, DeviceResolver, TargetArgs, TargetOptions};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is process-wide: tests that count must not overlap.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Mem(Vec<Arc<MemStore>>);
impl DeviceResolver for Mem {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0[spec.parse::<usize>().map_err(|e| e.to_string())?].clone())
    }
}

fn build(target: &str, args: &[&str], len: u64, legs: &mut Mem) -> MappedDevice {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let t = targets::table_constructor(target).unwrap()(TargetArgs {
        args: &args,
        len,
        resolver: legs,
        options: &TargetOptions::default(),
    })
    .map_err(|e| e.msg)
    .unwrap();
    MappedDevice::new(vec![Segment {
        start: 0,
        len,
        target: t,
    }])
}

/// Allocations in 100 rounds of `reqs` (owned write, borrowed write, read),
/// the fewest of three measurements (see `fewest_allocs`).
fn count(dev: &MappedDevice, reqs: &[(u64, usize)]) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let (n, all) = fewest_allocs(3, || {
        for _ in 0..100 {
            for &(off, len) in reqs {
                dev.write(off, WriteBuf::Owned(&mut buf[..len]), false)
                    .unwrap();
                dev.write(off, WriteBuf::Borrowed(&buf[..len]), false)
                    .unwrap();
                dev.read(off, &mut buf[..len]).unwrap();
            }
        }
    });
    eprintln!("allocations per run: {all:?}");
    n
}

#[test]
fn linear_and_striped_map_without_allocating() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut legs = Mem((0..2).map(|_| Arc::new(MemStore::new(8 << 20))).collect());
    let lin = build("linear", &["0", "2048"], 4 << 20, &mut legs);
    // Inside one segment, and a 1 MiB request.
    assert_eq!(count(&lin, &[(4096, 4096), (65536, 1 << 20)]), 0);

    let st = build(
        "striped",
        &["2", "128", "0", "0", "1", "0"],
        8 << 20,
        &mut legs,
    );
    // Inside one 64 KiB chunk, and requests crossing chunk boundaries.
    assert_eq!(
        count(&st, &[(4096, 4096), (60 << 10, 8192), (0, 1 << 20)]),
        0
    );
}

/// Seed 004 on the crypt path: a request split across crypto threads takes
/// its per-request state from the target's block pool, so in steady state
/// crypt reads and writes (owned and, over a store with direct access,
/// borrowed) allocate nothing either.
#[test]
fn crypt_requests_split_across_threads_without_allocating() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut legs = Mem(vec![Arc::new(MemStore::new(8 << 20))]);
    let key = "11".repeat(64);
    let args: Vec<String> = ["aes-xts-plain64", &key, "0", "0", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let t = targets::table_constructor("crypt").unwrap()(TargetArgs {
        args: &args,
        len: 8 << 20,
        resolver: &mut legs,
        options: &TargetOptions {
            crypt_threads: 2,
            ..Default::default()
        },
    })
    .map_err(|e| e.msg)
    .unwrap();
    let dev = MappedDevice::new(vec![Segment {
        start: 0,
        len: 8 << 20,
        target: t,
    }]);
    let mut buf = vec![7u8; 1 << 20];
    // Warm up: pools fill, worker threads start.
    for _ in 0..50 {
        dev.write(0, WriteBuf::Owned(&mut buf), false).unwrap();
        dev.read(0, &mut buf).unwrap();
    }
    let (n, all) = fewest_allocs(3, || {
        for i in 0..200u64 {
            let off = (i % 7) << 20;
            dev.write(off, WriteBuf::Owned(&mut buf), false).unwrap();
            // Over a store with direct access a borrowed write is encrypted
            // straight into the store: no bounce pages either.
            dev.write(off, WriteBuf::Borrowed(&buf), false).unwrap();
            dev.read(off, &mut buf).unwrap();
            dev.read(off + 4096, &mut buf[..4096]).unwrap();
        }
    });
    assert_eq!(
        n, 0,
        "{n} allocations in 800 crypt requests (fewest of runs {all:?})"
    );
}
