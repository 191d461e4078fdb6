//! Cipher alone: AES-XTS (plain64) through `SectorCrypt`, in place, at
//! sector sizes 512 and 4096 with requests of 4 KiB, 64 KiB and 1 MiB, for
//! the vectorised kernel (the widest this CPU runs) and the portable path,
//! and at 1 MiB the AVX2 width too where the AVX-512 one is the widest. bench/crypto.sh runs this
//! beside `openssl speed -evp aes-256-xts` and prints the ratio.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use udm::crypto::SectorCrypt;

fn xts(c: &mut Criterion) {
    let key: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    for (name, bits) in [("aes256", 64usize), ("aes128", 32)] {
        let mut g = c.benchmark_group(format!("xts_{name}"));
        g.measurement_time(Duration::from_secs(2));
        g.warm_up_time(Duration::from_millis(500));
        for ss in [512u32, 4096] {
            for req in [4usize << 10, 64 << 10, 1 << 20] {
                if name == "aes128" && req != 1 << 20 {
                    continue;
                }
                g.throughput(Throughput::Bytes(req as u64));
                let fast = SectorCrypt::new("aes-xts-plain64", &key[..bits], ss, false).unwrap();
                let mut buf = vec![0x5au8; req];
                let mut variants = vec![("vaes", fast)];
                if req == 1 << 20 {
                    let portable = SectorCrypt::new("aes-xts-plain64", &key[..bits], ss, false)
                        .unwrap()
                        .without_vector_kernel();
                    variants.push(("portable", portable));
                    // Both widths where the CPU runs both.
                    let narrow = SectorCrypt::new("aes-xts-plain64", &key[..bits], ss, false)
                        .unwrap()
                        .with_avx2_vector_kernel();
                    if variants[0].1.vector_kernel() == Some("vaes-avx512")
                        && narrow.vector_kernel() == Some("vaes-avx2")
                    {
                        variants.push(("vaes_avx2", narrow));
                    }
                }
                for (kind, sc) in &variants {
                    if *kind == "vaes" {
                        eprintln!(
                            "note: 'vaes' runs the {} kernel on this CPU",
                            sc.vector_kernel().unwrap_or("portable")
                        );
                    }
                    let id = format!("{kind}/enc/ss{ss}");
                    g.bench_with_input(BenchmarkId::new(id, req), &req, |b, _| {
                        b.iter(|| sc.encrypt(black_box(&mut buf), black_box(8)))
                    });
                    let id = format!("{kind}/dec/ss{ss}");
                    g.bench_with_input(BenchmarkId::new(id, req), &req, |b, _| {
                        b.iter(|| sc.decrypt(black_box(&mut buf), black_box(8)))
                    });
                }
            }
        }
        g.finish();
    }
    // The ceiling: AES-256 ECB through the `aes` crate (no tweaks at all).
    let mut g = c.benchmark_group("ceiling");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Bytes(1 << 20));
    let ecb = SectorCrypt::new("aes-ecb", &key[..32], 4096, false).unwrap();
    let mut buf = vec![0x5au8; 1 << 20];
    g.bench_function("aes256_ecb_aes_crate/1048576", |b| {
        b.iter(|| ecb.encrypt(black_box(&mut buf), 0))
    });
    let mut dst = vec![0u8; 1 << 20];
    g.bench_function("memcpy/1048576", |b| {
        b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&buf)))
    });
    g.finish();
}

criterion_group!(benches, xts);
criterion_main!(benches);
