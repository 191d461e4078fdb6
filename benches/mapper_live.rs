//! The per-request cost of a runtime device: 4 KiB reads from tmpfs files
//! through
//! - `routes`: the compiled routes of a striped table, called directly;
//! - `live/hist-off`, `live/hist-on`: the same table as a `LiveDevice`
//!   (atomic-pointer load plus per-CPU counters, with and without the two
//!   clock reads and the histogram record);
//! - `stack3/flat`, `stack3/nested`: linear over striped over two linear
//!   devices, compiled flat (the default) and layer by layer.
//! The difference `live - routes` is what live reload and statistics cost.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use udm::core::BlockDevice;
use udm::mapper::{BuildOptions, Devices};
use zeroize::Zeroizing;

const LEG: u64 = 32 << 20;

fn up(d: &Devices, name: &str, table: String) {
    d.create(name, "", false).unwrap();
    d.load(name, Zeroizing::new(table)).unwrap();
    let plan = d.prepare_resume(name).unwrap();
    d.commit(plan);
}

fn devices(dir: &std::path::Path, flatten: bool) -> Devices {
    let (a, b) = (dir.join("a"), dir.join("b"));
    for f in [&a, &b] {
        std::fs::write(f, vec![7u8; LEG as usize]).unwrap();
    }
    let (a, b) = (a.display(), b.display());
    let d = Devices::new(BuildOptions::default(), flatten, true);
    let s = 2 * LEG / 512;
    up(&d, "single", format!("0 {s} striped 2 128 {a} 0 {b} 0\n"));
    up(&d, "l1", format!("0 {} linear {a} 0\n", LEG / 512));
    up(&d, "l2", format!("0 {} linear {b} 0\n", LEG / 512));
    up(&d, "s", format!("0 {s} striped 2 128 @l1 0 @l2 0\n"));
    up(&d, "top", format!("0 {s} linear @s 0\n"));
    d
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let flat = devices(dir.path(), true);
    let nested_dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let nested = devices(nested_dir.path(), false);
    let single = flat.info("single").unwrap().device;
    let routes = single.routes();
    let mut g = c.benchmark_group("live_4k_read");
    g.throughput(Throughput::Bytes(4096));
    let mut buf = vec![0u8; 4096];
    let mut at = 0u64;
    let mut next = move || {
        at = (at + 69 * 4096) % (2 * LEG - 4096);
        at
    };
    g.bench_function("routes", |b| {
        b.iter(|| routes.read(black_box(next()), &mut buf).unwrap())
    });
    single.stats().set_histograms(false);
    g.bench_function("live/hist-off", |b| {
        b.iter(|| single.read(black_box(next()), &mut buf).unwrap())
    });
    single.stats().set_histograms(true);
    g.bench_function("live/hist-on", |b| {
        b.iter(|| single.read(black_box(next()), &mut buf).unwrap())
    });
    let top: Arc<udm::mapper::LiveDevice> = flat.info("top").unwrap().device;
    g.bench_function("stack3/flat", |b| {
        b.iter(|| top.read(black_box(next()), &mut buf).unwrap())
    });
    let ntop = nested.info("top").unwrap().device;
    g.bench_function("stack3/nested", |b| {
        b.iter(|| ntop.read(black_box(next()), &mut buf).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
