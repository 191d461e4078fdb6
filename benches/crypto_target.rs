//! The crypt target over the in-memory store: 1 MiB requests, single
//! thread, against the bare cipher in the same run; and one QD1 stream of
//! 1 MiB requests with 1 versus 2 crypt threads (ordered parallel
//! encryption).
//!
//! `direct_*`: the store offers direct access, so the cipher moves the
//! bytes (encrypts from the caller's buffer into the store, decrypts from
//! the store into the caller's buffer) — writes of owned and of borrowed
//! buffers, and reads. `copy_*`: the ablation, a store without direct
//! access (the cipher runs in the target's buffer and the store copies).
//! The store alone and a null device (no copy at all) are measured too.
//! After the criterion groups, 2 versus 1 crypt threads is measured once
//! more for a stream with gaps between requests (see [`gapped_qd1`]).
//! bench/crypto.sh prints the ratios.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use udm::core::{BlockDevice, DevResult, Limits, WriteBuf};
use udm::crypto::SectorCrypt;
use udm::store::MemStore;
use udm::targets::{crypt, DeviceResolver, Target, TargetArgs, TargetOptions};

const REQ: usize = 1 << 20;
/// Device size: 8 MiB, so the store's memory stays in the last-level cache
/// (a DRAM-sized store measures memory bandwidth, not the target).
const DEV: u64 = 8 << 20;

/// Accepts writes without copying, reads leave the buffer as it is.
struct NullDev;
impl BlockDevice for NullDev {
    fn size(&self) -> u64 {
        DEV
    }
    fn limits(&self) -> Limits {
        Limits::default()
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> DevResult<()> {
        black_box(buf);
        Ok(())
    }
    fn write(&self, _offset: u64, data: WriteBuf<'_>, _fua: bool) -> DevResult<()> {
        black_box(data.as_slice());
        Ok(())
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> DevResult<()> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> DevResult<()> {
        Ok(())
    }
}

struct One(Arc<dyn BlockDevice>);
impl DeviceResolver for One {
    fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0.clone())
    }
}

const KEY: &str = "7f1c2b3a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8b9cadbecfd0e1f2\
                   03142536475869708a9bacbdcedfe0f1021324354657687980a1b2c3d4e5f6a7";

fn target(dev: Arc<dyn BlockDevice>, ss: u32, threads: usize) -> Arc<dyn Target> {
    let line = format!("aes-xts-plain64 {KEY} 0 dev 0 1 sector_size:{ss}");
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    crypt::new(TargetArgs {
        args: &args,
        len: DEV,
        resolver: &mut One(dev),
        options: &TargetOptions {
            crypt_threads: threads,
            ..Default::default()
        },
    })
    .expect("crypt table")
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("crypt_target");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Bytes(REQ as u64));
    let mut buf = vec![0x33u8; REQ];
    let key = hex::decode(KEY).unwrap();
    for ss in [512u32, 4096] {
        let sc = SectorCrypt::new("aes-xts-plain64", &key, ss, false).unwrap();
        g.bench_function(format!("cipher_alone_enc_ss{ss}/{REQ}"), |b| {
            b.iter(|| sc.encrypt(black_box(&mut buf), 8))
        });
        g.bench_function(format!("cipher_alone_dec_ss{ss}/{REQ}"), |b| {
            b.iter(|| sc.decrypt(black_box(&mut buf), 8))
        });
        // The cipher out of place between the 1 MiB buffer and a rotating
        // place in store-sized memory: the target's direct path minus the
        // target (what the memory traffic alone costs over the in-place
        // figure above).
        let mut far = vec![0u8; DEV as usize];
        let mut at = 0usize;
        g.bench_function(format!("cipher_to_memory_enc_ss{ss}/{REQ}"), |b| {
            b.iter(|| {
                sc.encrypt_to(&buf, black_box(&mut far[at..at + REQ]), 8);
                at = (at + REQ) % DEV as usize;
            })
        });
        g.bench_function(format!("cipher_to_memory_dec_ss{ss}/{REQ}"), |b| {
            b.iter(|| {
                sc.decrypt_to(black_box(&far[at..at + REQ]), &mut buf, 8);
                at = (at + REQ) % DEV as usize;
            })
        });
        for threads in [1usize, 2] {
            for (kind, mem) in [
                ("direct", MemStore::new(DEV)),
                ("copy", MemStore::without_direct_access(DEV)),
            ] {
                let t = target(Arc::new(mem), ss, threads);
                let mut at = 0u64;
                let mut step = || {
                    let now = at;
                    at = (at + REQ as u64) % DEV;
                    now
                };
                g.bench_function(format!("{kind}_t{threads}_write_owned_ss{ss}/{REQ}"), |b| {
                    b.iter(|| t.write(step(), WriteBuf::Owned(&mut buf), false).unwrap())
                });
                g.bench_function(
                    format!("{kind}_t{threads}_write_borrowed_ss{ss}/{REQ}"),
                    |b| b.iter(|| t.write(step(), WriteBuf::Borrowed(&buf), false).unwrap()),
                );
                g.bench_function(format!("{kind}_t{threads}_read_ss{ss}/{REQ}"), |b| {
                    b.iter(|| t.read(step(), &mut buf).unwrap())
                });
            }
            let t = target(Arc::new(NullDev), ss, threads);
            g.bench_function(format!("null_t{threads}_write_ss{ss}/{REQ}"), |b| {
                b.iter(|| t.write(0, WriteBuf::Owned(&mut buf), false).unwrap())
            });
        }
    }
    let mem = MemStore::new(DEV);
    let mut at = 0u64;
    g.bench_function(format!("memstore_alone_write/{REQ}"), |b| {
        b.iter(|| {
            mem.write(at, WriteBuf::Owned(&mut buf), false).unwrap();
            at = (at + REQ as u64) % DEV;
        })
    });
    g.finish();
}

/// Four QD1 streams at once (four threads, each writing 1 MiB requests to
/// its own quarter of the device), crypt target with 1 vs 2 crypt threads:
/// when the streams already keep every core busy, splitting each request
/// must not cost throughput (the second measurement of ordered parallel
/// encryption).
fn streams(c: &mut Criterion) {
    const STREAMS: usize = 4;
    let mut g = c.benchmark_group("crypt_streams");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Bytes((STREAMS * REQ) as u64));
    for threads in [1usize, 2] {
        let t = target(Arc::new(MemStore::new(DEV)), 512, threads);
        let part = DEV / STREAMS as u64;
        g.bench_function(
            format!("direct_t{threads}_write_4streams_ss512/{}", STREAMS * REQ),
            |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    std::thread::scope(|s| {
                        for w in 0..STREAMS as u64 {
                            let t = &t;
                            s.spawn(move || {
                                let mut buf = vec![0x5au8; REQ];
                                for k in 0..iters {
                                    let off = w * part + (k * REQ as u64) % part;
                                    t.write(off, WriteBuf::Owned(black_box(&mut buf)), false)
                                        .unwrap();
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
}

/// 2 versus 1 crypt threads for a QD1 stream with gaps: the two targets
/// take turns (ABBA), so each request of the 2-thread target arrives after
/// the other target's work, longer than the pool's workers spin: they have
/// gone to sleep, and the request pays a wake-up. The criterion figures
/// above are the back-to-back stream, where a worker is still spinning. On
/// a small VM a sleeping worker picks its part up late, after most of the
/// time a half takes, so a gapped stream gets little from the split: this
/// bench keeps that
/// visible. Medians go to target/criterion/crypt_target/gapped_ss*.json.
fn gapped_qd1() {
    const ROUNDS: usize = 1500;
    for ss in [512u32, 4096] {
        let one = target(Arc::new(MemStore::new(DEV)), ss, 1);
        let two = target(Arc::new(MemStore::new(DEV)), ss, 2);
        let mut buf = vec![0x77u8; REQ];
        let (mut t1, mut t2) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
        let mut at = 0u64;
        for r in 0..ROUNDS + 100 {
            let order = if r % 2 == 0 { [1, 2] } else { [2, 1] };
            for k in order {
                let t = if k == 1 { &one } else { &two };
                let start = Instant::now();
                t.write(at, WriteBuf::Owned(black_box(&mut buf)), false)
                    .unwrap();
                let ns = start.elapsed().as_nanos() as f64;
                // The first 100 rounds warm caches and the pool up.
                if r >= 100 {
                    if k == 1 {
                        t1.push(ns)
                    } else {
                        t2.push(ns)
                    }
                }
            }
            at = (at + REQ as u64) % DEV;
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let (m1, m2) = (median(&mut t1), median(&mut t2));
        println!(
            "gapped QD1 1 MiB owned writes (ABBA), ss {ss}, {ROUNDS} each: 1 thread {m1:.0} ns, \
             2 threads {m2:.0} ns (medians), 2 threads / 1 thread {:.2}x",
            m1 / m2
        );
        let dir = std::path::Path::new("target/criterion/crypt_target");
        if std::fs::create_dir_all(dir).is_ok() {
            let _ = std::fs::write(
                dir.join(format!("gapped_ss{ss}.json")),
                format!("{{\"rounds\": {ROUNDS}, \"t1_ns\": {m1}, \"t2_ns\": {m2}}}\n"),
            );
        }
    }
}

criterion_group!(benches, bench, streams);

fn main() {
    benches();
    gapped_qd1();
    Criterion::default().configure_from_args().final_summary();
}
