//! The per-request cost of a runtime device, over memory so the layers
//! are what is measured: 4 KiB reads from a 2-leg striped table over two
//! MemStores (64 KiB chunks), through
//! - `routes`: the table's routes, called directly;
//! - `live/hist-off`, `live/hist-on`: a `LiveDevice` over the same routes
//!   (atomic-pointer load and per-CPU counters, without and with the two
//!   clock reads and the histogram record): what live reload and
//!   statistics cost per request;
//! - `stack3/flat`: linear over striped over two linear devices as
//!   `mapper::compile` flattens it — the striped target straight over the
//!   stores, behind the top device's routes (the test
//!   `stacks_compile_flat_and_follow_reloads` checks that this is what the
//!   compiler produces);
//! - `stack3/nested`: the same stack layer by layer (`--no-flatten`):
//!   linear → routes → striped → routes → linear → store.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use udm::core::{table, BlockDevice};
use udm::dm::{LiveDevice, Route, Routes};
use udm::mapper::build;
use udm::store::MemStore;
use udm::targets::{DeviceResolver, TargetOptions};

const LEG: u64 = 32 << 20;

/// Names to devices.
struct Named(Vec<(String, Arc<dyn BlockDevice>)>);
impl DeviceResolver for Named {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        self.0
            .iter()
            .find(|(n, _)| n == spec)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| format!("no {spec}"))
    }
}

/// The routes of `text` built over `devs`, one route per segment.
fn routes(text: &str, devs: &mut Named) -> Arc<Routes> {
    let m = build(
        &table::parse(text).unwrap(),
        devs,
        &TargetOptions::default(),
    )
    .unwrap();
    let r: Vec<Route> = m.routes().routes().to_vec();
    Arc::new(Routes::new(r, m.limits()))
}

fn live(r: Arc<Routes>) -> LiveDevice {
    let l = LiveDevice::new(false, true);
    l.swap(r);
    l
}

fn bench(c: &mut Criterion) {
    let a: Arc<dyn BlockDevice> = Arc::new(MemStore::new(LEG));
    let b: Arc<dyn BlockDevice> = Arc::new(MemStore::new(LEG));
    let s = 2 * LEG / 512;
    let mut legs = Named(vec![("a".into(), a.clone()), ("b".into(), b.clone())]);
    let single = routes(&format!("0 {s} striped 2 128 a 0 b 0\n"), &mut legs);
    // Flat: what compile makes of linear over striped over linear.
    let flat = Arc::new(Routes::new(
        vec![Route {
            start: 0,
            len: 2 * LEG,
            dev: single.routes()[0].dev.clone(),
            shift: 0,
        }],
        single.limits(),
    ));
    // Nested: each layer a device of its own.
    let l1 = routes(&format!("0 {} linear a 0\n", LEG / 512), &mut legs);
    let l2 = routes(&format!("0 {} linear b 0\n", LEG / 512), &mut legs);
    let mut lower = Named(vec![("l1".into(), l1), ("l2".into(), l2)]);
    let st = routes(&format!("0 {s} striped 2 128 l1 0 l2 0\n"), &mut lower);
    let mut mid = Named(vec![("s".into(), st)]);
    let nested = routes(&format!("0 {s} linear s 0\n"), &mut mid);

    let single_live = live(single.clone());
    let flat_live = live(flat);
    let nested_live = live(nested);
    let mut g = c.benchmark_group("live_4k_read");
    g.throughput(Throughput::Bytes(4096));
    let mut buf = vec![0u8; 4096];
    let mut at = 0u64;
    let mut next = move || {
        at = (at + 69 * 4096) % (2 * LEG - 4096);
        at
    };
    g.bench_function("routes", |bn| {
        bn.iter(|| single.read(black_box(next()), &mut buf).unwrap())
    });
    single_live.stats().set_histograms(false);
    g.bench_function("live/hist-off", |bn| {
        bn.iter(|| single_live.read(black_box(next()), &mut buf).unwrap())
    });
    single_live.stats().set_histograms(true);
    g.bench_function("live/hist-on", |bn| {
        bn.iter(|| single_live.read(black_box(next()), &mut buf).unwrap())
    });
    g.bench_function("stack3/flat", |bn| {
        bn.iter(|| flat_live.read(black_box(next()), &mut buf).unwrap())
    });
    g.bench_function("stack3/nested", |bn| {
        bn.iter(|| nested_live.read(black_box(next()), &mut buf).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
