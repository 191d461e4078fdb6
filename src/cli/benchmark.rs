//! `udm benchmark`: the counterpart of `cryptsetup benchmark`, laid out like
//! it, so a user can compare the two tools' numbers line by line: PBKDF2
//! iterations per second, Argon2 cost parameters for the requested time, and
//! in-memory encryption/decryption speed of each supported cipher and key
//! size (no storage I/O). `--cipher` measures one cipher; `--json` prints a
//! machine-readable object instead.
//!
//! The cipher numbers come from the same `SectorCrypt` the crypt target
//! uses, over a 1 MiB buffer (as many sectors per call as the target gets
//! for a 1 MiB request), single thread.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::crypto::SectorCrypt;

/// Arguments of `udm benchmark`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Measure only this cipher (dm-crypt spec such as `aes-xts-plain64`,
    /// or `aes-xts` for which plain64 is assumed).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Key size in bits for --cipher (default: 512 for xts, 256 otherwise).
    #[arg(long, short = 's')]
    pub key_size: Option<u32>,
    /// Encryption sector size in bytes (512..4096).
    #[arg(long, default_value_t = 512)]
    pub sector_size: u32,
    /// Time spent measuring each cipher direction, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub time_ms: u64,
    /// Target time for the Argon2 cost search, in milliseconds (as
    /// cryptsetup's --iter-time).
    #[arg(long, short = 'i', default_value_t = 2000)]
    pub iter_time: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug)]
struct Pbkdf2Result {
    hash: &'static str,
    key_bits: u32,
    iterations_per_second: u64,
}

#[derive(Serialize, Debug)]
struct Argon2Result {
    kind: &'static str,
    key_bits: u32,
    time_cost: u32,
    memory_kib: u32,
    lanes: u32,
    measured_ms: u64,
    requested_ms: u64,
}

#[derive(Serialize, Debug)]
struct CipherResult {
    algorithm: String,
    spec: String,
    key_bits: u32,
    sector_size: u32,
    encryption_mib_s: f64,
    decryption_mib_s: f64,
}

#[derive(Serialize, Debug, Default)]
struct Report {
    pbkdf2: Vec<Pbkdf2Result>,
    argon2: Vec<Argon2Result>,
    ciphers: Vec<CipherResult>,
}

/// The table cryptsetup prints, in its order, then the ciphers low-end
/// and non-AES machines weigh against it: camellia in XTS, and adiantum,
/// the choice where the CPU has no AES instructions.
const CIPHERS: &[(&str, u32)] = &[
    ("aes-cbc", 128),
    ("serpent-cbc", 128),
    ("twofish-cbc", 128),
    ("aes-cbc", 256),
    ("serpent-cbc", 256),
    ("twofish-cbc", 256),
    ("aes-xts", 256),
    ("serpent-xts", 256),
    ("twofish-xts", 256),
    ("aes-xts", 512),
    ("serpent-xts", 512),
    ("twofish-xts", 512),
    ("camellia-xts", 256),
    ("camellia-xts", 512),
    ("xchacha12,aes-adiantum", 256),
    ("xchacha20,aes-adiantum", 256),
];

const BUF: usize = 1 << 20;

fn pbkdf2_rate(hash: &'static str) -> Pbkdf2Result {
    let pw = b"udm benchmark passphrase";
    let salt = [0x5au8; 32];
    let mut out = [0u8; 32];
    let mut iters: u32 = 1000;
    loop {
        let t = Instant::now();
        match hash {
            "sha1" => pbkdf2::pbkdf2_hmac::<sha1::Sha1>(pw, &salt, iters, &mut out),
            "sha256" => pbkdf2::pbkdf2_hmac::<sha2::Sha256>(pw, &salt, iters, &mut out),
            "ripemd160" => pbkdf2::pbkdf2_hmac::<ripemd::Ripemd160>(pw, &salt, iters, &mut out),
            "whirlpool" => pbkdf2::pbkdf2_hmac::<whirlpool::Whirlpool>(pw, &salt, iters, &mut out),
            _ => pbkdf2::pbkdf2_hmac::<sha2::Sha512>(pw, &salt, iters, &mut out),
        }
        let el = t.elapsed();
        if el >= Duration::from_millis(250) || iters >= 1 << 28 {
            black_box(&out);
            return Pbkdf2Result {
                hash,
                key_bits: 256,
                iterations_per_second: (f64::from(iters) / el.as_secs_f64().max(1e-9)) as u64,
            };
        }
        iters = iters.saturating_mul(4);
    }
}

fn argon2_cost(kind: &'static str, requested_ms: u64) -> Result<Argon2Result, String> {
    let alg = if kind == "argon2i" {
        argon2::Algorithm::Argon2i
    } else {
        argon2::Algorithm::Argon2id
    };
    let lanes: u32 = std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u32)
        .min(4);
    // cryptsetup's search: time cost 4, memory up to 1 GiB, then more time.
    const MAX_MEM_KIB: u32 = 1 << 20;
    let mut time_cost = 4u32;
    let mut mem = 32u32 << 10;
    let mut out = [0u8; 32];
    loop {
        let params = argon2::Params::new(mem, time_cost, lanes, Some(32))
            .map_err(|e| format!("argon2 parameters: {e}"))?;
        let t = Instant::now();
        argon2::Argon2::new(alg, argon2::Version::V0x13, params)
            .hash_password_into(b"udm benchmark", &[0x5a; 16], &mut out)
            .map_err(|e| format!("argon2: {e}"))?;
        let ms = t.elapsed().as_millis() as u64;
        let done = ms * 10 >= requested_ms * 9 || (mem >= MAX_MEM_KIB && time_cost >= 1000);
        if done {
            return Ok(Argon2Result {
                kind,
                key_bits: 256,
                time_cost,
                memory_kib: mem,
                lanes,
                measured_ms: ms,
                requested_ms,
            });
        }
        // Scale towards the target; memory first, then time.
        let factor = (requested_ms as f64 / ms.max(1) as f64).clamp(1.1, 8.0);
        if mem < MAX_MEM_KIB {
            mem = ((f64::from(mem) * factor) as u32).min(MAX_MEM_KIB);
        } else {
            time_cost = ((f64::from(time_cost) * factor).ceil() as u32).min(1000);
        }
    }
}

/// Bytes per second of `f` applied to a 1 MiB buffer for about `time`.
fn rate(time: Duration, buf: &mut [u8], f: impl Fn(&mut [u8])) -> f64 {
    f(buf); // warm up
    let t = Instant::now();
    let mut bytes = 0u64;
    while t.elapsed() < time {
        f(buf);
        bytes += buf.len() as u64;
    }
    bytes as f64 / t.elapsed().as_secs_f64()
}

fn cipher_rate(
    algorithm: &str,
    key_bits: u32,
    sector_size: u32,
    time: Duration,
) -> Result<CipherResult, String> {
    // `aes-xts` means `aes-xts-plain64`; a full spec is taken as it is.
    let full = algorithm.matches('-').count() >= 2
        || algorithm.starts_with("capi:")
        || algorithm.ends_with("-ecb");
    let spec = if full {
        algorithm.to_string()
    } else {
        format!("{algorithm}-plain64")
    };
    if key_bits % 8 != 0 || key_bits == 0 || key_bits > 4096 {
        return Err(format!("invalid key size {key_bits} bits"));
    }
    let key: Vec<u8> = (0..key_bits / 8)
        .map(|i| (i as u8).wrapping_mul(73) ^ 0x3c)
        .collect();
    let sc = SectorCrypt::new(&spec, &key, sector_size, false).map_err(|e| e.to_string())?;
    let mut buf = vec![0x42u8; BUF];
    let enc = rate(time, &mut buf, |b| sc.encrypt(black_box(b), 0));
    let dec = rate(time, &mut buf, |b| sc.decrypt(black_box(b), 0));
    let mib = (1u64 << 20) as f64;
    Ok(CipherResult {
        algorithm: algorithm.to_string(),
        spec,
        key_bits,
        sector_size,
        encryption_mib_s: enc / mib,
        decryption_mib_s: dec / mib,
    })
}

fn print_cipher_header() {
    println!("#     Algorithm |       Key |      Encryption |      Decryption");
}

fn print_cipher(c: &CipherResult) {
    println!(
        "{:>15}   {:>8}b   {:>10.1} MiB/s   {:>10.1} MiB/s",
        c.algorithm, c.key_bits, c.encryption_mib_s, c.decryption_mib_s
    );
}

pub fn run(a: Args) -> i32 {
    if !(512..=4096).contains(&a.sector_size) || !a.sector_size.is_power_of_two() {
        eprintln!(
            "udm benchmark: --sector-size {} is invalid (a power of two from 512 to 4096)",
            a.sector_size
        );
        return 2;
    }
    let time = Duration::from_millis(a.time_ms.max(10));
    let mut report = Report::default();
    if !a.json {
        println!("# Tests are approximate using memory only (no storage IO).");
    }
    if let Some(cipher) = &a.cipher {
        let bits = a
            .key_size
            .unwrap_or(if cipher.contains("xts") { 512 } else { 256 });
        match cipher_rate(cipher, bits, a.sector_size, time) {
            Ok(c) => {
                if !a.json {
                    print_cipher_header();
                    print_cipher(&c);
                }
                report.ciphers.push(c);
            }
            Err(e) => {
                eprintln!("udm benchmark: cipher {cipher}, {bits}-bit key: {e}");
                return 1;
            }
        }
    } else {
        for hash in ["sha1", "sha256", "sha512", "ripemd160", "whirlpool"] {
            let r = pbkdf2_rate(hash);
            if !a.json {
                println!(
                    "PBKDF2-{:<9} {:>9} iterations per second for {}-bit key",
                    r.hash, r.iterations_per_second, r.key_bits
                );
            }
            report.pbkdf2.push(r);
        }
        for kind in ["argon2i", "argon2id"] {
            match argon2_cost(kind, a.iter_time) {
                Ok(r) => {
                    if !a.json {
                        println!(
                            "{:<9} {:>5} iterations, {:>7} memory, {} parallel threads (CPUs) for {}-bit key (requested {} ms time)",
                            r.kind, r.time_cost, r.memory_kib, r.lanes, r.key_bits, r.requested_ms
                        );
                    }
                    report.argon2.push(r);
                }
                Err(e) => {
                    eprintln!("udm benchmark: {kind}: {e}");
                    return 1;
                }
            }
        }
        if !a.json {
            print_cipher_header();
        }
        for &(alg, bits) in CIPHERS {
            match cipher_rate(alg, bits, a.sector_size, time) {
                Ok(c) => {
                    if !a.json {
                        print_cipher(&c);
                    }
                    report.ciphers.push(c);
                }
                Err(e) => {
                    eprintln!("udm benchmark: {alg} {bits}b: {e}");
                    return 1;
                }
            }
        }
    }
    if a.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("udm benchmark: {e}");
                return 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cipher_measures_something() {
        let c = cipher_rate("aes-xts", 512, 4096, Duration::from_millis(20)).unwrap();
        assert_eq!(c.spec, "aes-xts-plain64");
        // Positive and finite: at least one buffer ran through each way. A
        // floor in MiB/s would fail whenever the machine is busy enough to
        // preempt the test for the whole window.
        let measured = |r: f64| r.is_finite() && r > 0.0;
        assert!(
            measured(c.encryption_mib_s) && measured(c.decryption_mib_s),
            "{c:?}"
        );
        assert!(cipher_rate("aes-xts", 100, 512, Duration::from_millis(5)).is_err());
        assert!(cipher_rate("des-cbc", 128, 512, Duration::from_millis(5))
            .unwrap_err()
            .contains("des"));
    }

    #[test]
    fn pbkdf2_rate_is_positive() {
        assert!(pbkdf2_rate("sha256").iterations_per_second > 0);
        assert!(pbkdf2_rate("whirlpool").iterations_per_second > 0);
    }

    /// The default table has adiantum and camellia next to aes, serpent
    /// and twofish, and each of them builds.
    #[test]
    fn default_table_lists_adiantum_and_camellia() {
        for want in [
            "aes-xts",
            "serpent-xts",
            "twofish-xts",
            "camellia-xts",
            "xchacha12,aes-adiantum",
        ] {
            assert!(CIPHERS.iter().any(|(a, _)| *a == want), "{want}");
        }
        for &(alg, bits) in CIPHERS
            .iter()
            .filter(|(a, _)| a.contains("camellia") || a.contains("adiantum"))
        {
            let c = cipher_rate(alg, bits, 512, Duration::from_millis(2)).unwrap();
            assert!(c.encryption_mib_s > 0.0, "{c:?}");
        }
        let c = cipher_rate(
            "xchacha12,aes-adiantum",
            256,
            4096,
            Duration::from_millis(2),
        )
        .unwrap();
        assert_eq!(c.spec, "xchacha12,aes-adiantum-plain64");
    }
}
