//! No-clone remap: what a linear or striped table costs on top of the bare store.
//! The same 4 KiB and 1 MiB reads and writes go to a MemStore directly,
//! through a one-segment linear table, and through a 2-leg striped table
//! (64 KiB chunks, so a 1 MiB request is cut into 16 pieces).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use udm::core::{BlockDevice, WriteBuf};
use udm::mapper::{MappedDevice, Segment};
use udm::store::MemStore;
use udm::targets::{self, DeviceResolver, TargetArgs, TargetOptions};

const SIZE: u64 = 64 << 20;

struct Mem(Vec<Arc<MemStore>>);
impl DeviceResolver for Mem {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        spec.parse::<usize>()
            .map(|i| self.0[i].clone() as Arc<dyn BlockDevice>)
            .map_err(|e| e.to_string())
    }
}

fn table(target: &str, args: &[&str], legs: &mut Mem) -> Arc<dyn BlockDevice> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let t = targets::table_constructor(target).expect("known target")(TargetArgs {
        args: &args,
        len: SIZE,
        resolver: legs,
        options: &TargetOptions::default(),
    })
    .unwrap_or_else(|e| panic!("{}", e.msg));
    Arc::new(MappedDevice::new(vec![Segment {
        start: 0,
        len: SIZE,
        target: t,
    }]))
}

fn bench(c: &mut Criterion) {
    let bare = Arc::new(MemStore::new(SIZE));
    let mut one = Mem(vec![bare.clone()]);
    let linear = table("linear", &["0", "0"], &mut one);
    let mut two = Mem(vec![
        Arc::new(MemStore::new(SIZE / 2)),
        Arc::new(MemStore::new(SIZE / 2)),
    ]);
    let striped = table("striped", &["2", "128", "0", "0", "1", "0"], &mut two);
    let devs: [(&str, Arc<dyn BlockDevice>); 3] = [
        ("bare", bare as Arc<dyn BlockDevice>),
        ("linear", linear),
        ("striped", striped),
    ];
    for (op, len) in [
        ("read", 4096usize),
        ("read", 1 << 20),
        ("write", 4096),
        ("write", 1 << 20),
    ] {
        let mut g = c.benchmark_group(format!("{op}_{}k", len / 1024));
        g.throughput(Throughput::Bytes(len as u64));
        let mut buf = vec![0x5au8; len];
        for (name, dev) in &devs {
            let mut off = 0u64;
            g.bench_with_input(BenchmarkId::from_parameter(name), dev, |b, dev| {
                b.iter(|| {
                    off = (off + len as u64 * 7) % (SIZE - len as u64) / 4096 * 4096;
                    if op == "read" {
                        dev.read(off, &mut buf).unwrap();
                    } else {
                        dev.write(off, WriteBuf::Owned(&mut buf), false).unwrap();
                    }
                    black_box(&buf);
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
