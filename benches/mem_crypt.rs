//! Seed 000 in the crypt target: 1 MiB borrowed writes (encrypted into
//! bounce pages) with the pages taken in one bulk call vs one at a time.
//! Two targets over two RAM stores in the same process, measured back to
//! back (the seed measured dm-crypt over a RAM disk the same way).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use udm::core::{BlockDevice, WriteBuf};
use udm::mem::mempool::set_bulk_bounce_default;
use udm::store::MemStore;
use udm::targets::{crypt, DeviceResolver, Target, TargetArgs, TargetOptions};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
const SIZE: u64 = 64 << 20;
const IO: usize = 1 << 20;

struct One(Arc<dyn BlockDevice>);
impl DeviceResolver for One {
    fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0.clone())
    }
}

fn target(bulk: bool) -> Arc<dyn Target> {
    set_bulk_bounce_default(bulk);
    let store: Arc<dyn BlockDevice> = Arc::new(MemStore::new(SIZE));
    let args: Vec<String> = format!("aes-xts-plain64 {KEY} 0 ram 0")
        .split_whitespace()
        .map(String::from)
        .collect();
    let t = crypt::new(TargetArgs {
        args: &args,
        len: SIZE,
        resolver: &mut One(store),
        options: &TargetOptions { crypt_threads: 0 },
    })
    .expect("crypt table");
    set_bulk_bounce_default(true);
    t
}

fn bench(c: &mut Criterion) {
    let data: Vec<u8> = (0..IO).map(|i| (i * 7 + 3) as u8).collect();
    let mut g = c.benchmark_group("crypt_write_1mib_borrowed");
    g.throughput(Throughput::Bytes(IO as u64));
    for (name, bulk) in [("one_at_a_time", false), ("bulk", true)] {
        let t = target(bulk);
        // Touch the whole store once so page faults are not measured.
        for off in (0..SIZE).step_by(IO) {
            t.write(off, WriteBuf::Borrowed(&data), false).unwrap();
        }
        let mut off = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                t.write(off, WriteBuf::Borrowed(black_box(&data)), false)
                    .unwrap();
                off = (off + IO as u64) % SIZE;
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(40);
    targets = bench
}
criterion_main!(benches);
