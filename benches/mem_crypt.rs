//! Bulk mempool allocation in the crypt target: 1 MiB borrowed writes (encrypted into
//! bounce pages) with the pages taken in one bulk call vs one at a time.
//! Two targets over two RAM stores in the same process, measured back to
//! back (as one measures dm-crypt over a RAM disk).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
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
    // Not direct access: over a direct store a borrowed write needs no
    // bounce pages, and this bench is about them.
    let store: Arc<dyn BlockDevice> = Arc::new(MemStore::without_direct_access(SIZE));
    let args: Vec<String> = format!("aes-xts-plain64 {KEY} 0 ram 0")
        .split_whitespace()
        .map(String::from)
        .collect();
    let t = crypt::new(TargetArgs {
        args: &args,
        len: SIZE,
        resolver: &mut One(store),
        options: &TargetOptions {
            crypt_threads: 0,
            ..Default::default()
        },
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

/// The same comparison interleaved: writes alternate between the two
/// targets (ABBA order) and each write is timed, so load changes on a
/// shared machine hit both sides equally. Medians go to
/// target/criterion/crypt_write_1mib_borrowed/interleaved.json for
/// bench/mem.sh.
fn interleaved() {
    let data: Vec<u8> = (0..IO).map(|i| (i * 7 + 3) as u8).collect();
    let each = target(false);
    let bulk = target(true);
    for t in [&each, &bulk] {
        for off in (0..SIZE).step_by(IO) {
            t.write(off, WriteBuf::Borrowed(&data), false).unwrap();
        }
    }
    let rounds = 2000usize;
    let (mut te, mut tb) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let mut off = 0u64;
    for r in 0..rounds {
        let order: [(&Arc<dyn Target>, bool); 2] = if r % 2 == 0 {
            [(&each, false), (&bulk, true)]
        } else {
            [(&bulk, true), (&each, false)]
        };
        for (t, is_bulk) in order {
            let t0 = Instant::now();
            t.write(off, WriteBuf::Borrowed(black_box(&data)), false)
                .unwrap();
            let ns = t0.elapsed().as_nanos() as f64;
            if is_bulk {
                tb.push(ns)
            } else {
                te.push(ns)
            }
        }
        off = (off + IO as u64) % SIZE;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (me, mb) = (median(&mut te), median(&mut tb));
    println!("interleaved 1 MiB borrowed writes, {rounds} each: one at a time {me:.0} ns, bulk {mb:.0} ns (median)");
    let dir = std::path::Path::new("target/criterion/crypt_write_1mib_borrowed");
    if std::fs::create_dir_all(dir).is_ok() {
        let _ = std::fs::write(
            dir.join("interleaved.json"),
            format!("{{\"rounds\": {rounds}, \"one_at_a_time_ns\": {me}, \"bulk_ns\": {mb}}}\n"),
        );
    }
}

/// Many writers at once (a QD64 fio job, in process): `writers`
/// threads each write `per` borrowed 1 MiB requests to their own part of the
/// device, all at the same time, so the bounce-page allocations of
/// concurrent requests meet on the pool. One round times all writes of one
/// target; rounds alternate ABBA between the two targets; the median round
/// gives MB/s. Results go to
/// target/criterion/crypt_write_1mib_borrowed/concurrent_<writers>.json.
fn concurrent(writers: usize) {
    let data: Vec<u8> = (0..IO).map(|i| (i * 7 + 3) as u8).collect();
    let each = target(false);
    let bulk = target(true);
    for t in [&each, &bulk] {
        for off in (0..SIZE).step_by(IO) {
            t.write(off, WriteBuf::Borrowed(&data), false).unwrap();
        }
    }
    let per = 256 / writers;
    let part = SIZE / writers as u64;
    let round = |t: &Arc<dyn Target>| -> f64 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for w in 0..writers {
                let (t, data) = (t.clone(), &data);
                s.spawn(move || {
                    let base = w as u64 * part;
                    for k in 0..per as u64 {
                        let off = base + (k * IO as u64) % part;
                        t.write(off, WriteBuf::Borrowed(black_box(data)), false)
                            .unwrap();
                    }
                });
            }
        });
        t0.elapsed().as_nanos() as f64
    };
    let rounds = 60usize;
    let (mut te, mut tb) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for r in 0..rounds {
        if r % 2 == 0 {
            te.push(round(&each));
            tb.push(round(&bulk));
        } else {
            tb.push(round(&bulk));
            te.push(round(&each));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let bytes = (writers * per * IO) as f64;
    let (me, mb) = (bytes / median(&mut te) * 1e3, bytes / median(&mut tb) * 1e3);
    println!(
        "{writers} concurrent writers, 1 MiB borrowed writes, {rounds} rounds of {} MiB each: one at a time {me:.0} MB/s, bulk {mb:.0} MB/s (median round)",
        writers * per
    );
    let dir = std::path::Path::new("target/criterion/crypt_write_1mib_borrowed");
    if std::fs::create_dir_all(dir).is_ok() {
        let _ = std::fs::write(
            dir.join(format!("concurrent_{writers}.json")),
            format!("{{\"writers\": {writers}, \"rounds\": {rounds}, \"one_at_a_time_mbs\": {me}, \"bulk_mbs\": {mb}}}\n"),
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(40);
    targets = bench
}
fn main() {
    benches();
    interleaved();
    concurrent(4);
    concurrent(64);
    Criterion::default().configure_from_args().final_summary();
}
