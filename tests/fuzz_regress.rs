//! Stable-toolchain stand-ins for the `table` and `nbd_client` fuzz targets
//! (fuzz/, nightly only): a deterministic mutation loop over every file in
//! fuzz/seeds/<target>/ (the seeds, and every crash input a fuzzer run has
//! found) through the same drivers, `udm::fuzzing::{table, NbdHarness}`.
//! Nothing may panic and every server connection must end.
//! `UDM_MUTATIONS=N` sets the number of cases per target.
//!
//! The seed files themselves are the output of `udm::fuzzing::*_seeds`;
//! `seed_files_are_current` checks them (`UDM_WRITE_SEEDS=1` rewrites them).

use std::path::{Path, PathBuf};

use udm::fuzzing;

fn seed_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target)
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(seed_dir(target))
        .unwrap_or_else(|e| panic!("fuzz/seeds/{target}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let v: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(
        v.len() >= 4,
        "fuzz/seeds/{target} holds only {} files",
        v.len()
    );
    v
}

fn iterations(default: usize) -> usize {
    std::env::var("UDM_MUTATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// xorshift64: the same cases on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Mostly one edit, sometimes up to three: byte flips, random bytes, inserted tokens, deleted
/// runs, truncation, or a splice with another input.
fn mutate(r: &mut Rng, input: &[u8], others: &[Vec<u8>], tokens: &[&[u8]]) -> Vec<u8> {
    let mut v = input.to_vec();
    let edits = if r.below(4) == 0 { 1 + r.below(3) } else { 1 };
    for _ in 0..edits {
        let i = r.below(v.len() + 1);
        match r.below(7) {
            0 if i < v.len() => v[i] ^= 1 << r.below(8),
            1 if i < v.len() => v[i] = r.below(256) as u8,
            2 => {
                let t = tokens[r.below(tokens.len())];
                v.splice(i..i, t.iter().copied());
            }
            3 if i < v.len() => {
                let n = r.below(16).min(v.len() - i);
                v.drain(i..i + n);
            }
            4 => v.truncate(i),
            5 => {
                let o = &others[r.below(others.len())];
                let j = r.below(o.len() + 1);
                v.truncate(i);
                v.extend_from_slice(&o[j..]);
            }
            _ => {
                let n = r.below(8);
                v.splice(i..i, (0..n).map(|_| r.below(256) as u8).collect::<Vec<_>>());
            }
        }
    }
    v
}

#[test]
fn seed_files_are_current() {
    let write = std::env::var_os("UDM_WRITE_SEEDS").is_some();
    let table: Vec<(&str, Vec<u8>)> = fuzzing::table_seeds()
        .into_iter()
        .map(|(n, t)| (n, t.into_bytes()))
        .collect();
    for (target, seeds) in [
        ("table", table),
        ("nbd_client", fuzzing::nbd_seeds()),
        ("cipher_spec", fuzzing::cipher_spec_seeds()),
        ("control", fuzzing::control_seeds()),
    ] {
        let dir = seed_dir(target);
        for (name, bytes) in seeds {
            let f = dir.join(name);
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&f, &bytes).unwrap();
            }
            let on_disk = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            assert!(
                on_disk == bytes,
                "{} is stale: rerun with UDM_WRITE_SEEDS=1",
                f.display()
            );
        }
    }
}

#[test]
fn mutated_tables_never_panic() {
    let seeds = corpus("table");
    let tokens: [&[u8]; 24] = [
        b" flakey a 0 1 1",
        b" delay a 0 0",
        b" dust a 0 512",
        b" log-writes a b",
        b"drop_writes",
        b"corrupt_bio_byte 1 r 0 0",
        b"random_read_corrupt 1000000000",
        b"@",
        b" ",
        b"\n",
        b"\\",
        b"#",
        b"0",
        b"18446744073709551615",
        b"99999999999999999999",
        b"4294967296",
        b" linear a 0",
        b" striped 2 8 a 0 b 0",
        b" crypt aes-xts-plain64 ",
        b"sector_size:4096",
        b"iv_large_sectors",
        b":64",
        b"-essiv:sha256",
        b" nc ",
    ];
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for s in &seeds {
        fuzzing::table(s);
    }
    let n = iterations(10_000);
    let mut built = 0;
    for _ in 0..n {
        let s = &seeds[r.below(seeds.len())];
        built += usize::from(fuzzing::table(&mutate(&mut r, s, &seeds, &tokens)));
    }
    // The mutations must reach the targets' I/O, not only the parser.
    assert!(built * 20 >= n, "only {built} of {n} mutated tables built");
    eprintln!("{built} of {n} mutated tables built a device");
}

#[test]
fn mutated_cipher_specs_never_panic() {
    let seeds = corpus("cipher_spec");
    let tokens: [&[u8]; 12] = [
        b"-",
        b":",
        b"aes",
        b"serpent",
        b"twofish",
        b"xts",
        b"cbc",
        b"essiv:sha256",
        b"plain64",
        b"benbi",
        b"capi:",
        b"(",
    ];
    let mut r = Rng(0x0dd_ba11_cafe_f00d);
    for s in &seeds {
        assert!(
            fuzzing::cipher_spec(s),
            "seed {:?} does not key",
            String::from_utf8_lossy(s)
        );
    }
    let n = iterations(20_000);
    let mut keyed = 0;
    for _ in 0..n {
        let s = &seeds[r.below(seeds.len())];
        keyed += usize::from(fuzzing::cipher_spec(&mutate(&mut r, s, &seeds, &tokens)));
    }
    assert!(keyed * 50 >= n, "only {keyed} of {n} mutated specs keyed");
    eprintln!("{keyed} of {n} mutated cipher specs keyed a transform");
}

#[test]
fn mutated_control_requests_never_panic() {
    let seeds = corpus("control");
    let tokens: [&[u8]; 10] = [
        b"UDMC",
        &[0, 0, 0, 0],
        &[0xff, 0xff, 0xff, 0xff],
        b"\"op\":\"",
        b"remove_all",
        b"message",
        b"@z",
        b" flakey @z 0 0 1",
        b" dust @z 0 512",
        b"\"force\":true",
    ];
    let h = fuzzing::ControlHarness::new();
    let mut r = Rng(0xc0_47_01_5e);
    for s in &seeds {
        assert!(h.run(s) > 0, "a seed ran no request");
    }
    let n = iterations(3000);
    let mut ran = 0;
    for _ in 0..n {
        let s = &seeds[r.below(seeds.len())];
        ran += usize::from(h.run(&mutate(&mut r, s, &seeds, &tokens)) > 0);
    }
    assert!(
        ran * 20 >= n,
        "only {ran} of {n} mutated sessions ran a request"
    );
    eprintln!("{ran} of {n} mutated control sessions ran requests");
}

#[test]
fn mutated_nbd_clients_never_panic_or_hang() {
    let seeds = corpus("nbd_client");
    // `run` returns only when the server side has ended the connection;
    // the loop runs beside a watchdog so that a hang fails the test.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let tokens: [&[u8]; 8] = [
            &0x2560_9513u32.to_be_bytes(),
            &0x4948_4156_454f_5054u64.to_be_bytes(),
            &[0xff; 4],
            &[0; 8],
            &[0, 0, 0, 7],
            &[0, 0x10, 0, 0],
            &[0x80, 0, 0, 0],
            b"fuzz",
        ];
        let h = fuzzing::NbdHarness::new();
        let mut r = Rng(0x1234_5678_9abc_def1);
        for s in &seeds {
            h.run(s);
        }
        let n = iterations(5000);
        let mut served = 0;
        for _ in 0..n {
            let s = &seeds[r.below(seeds.len())];
            let out = h.run(&mutate(&mut r, s, &seeds, &tokens));
            // A reply to a request: the session got past the handshake.
            let replied = out
                .windows(4)
                .any(|w| w == 0x6744_6698u32.to_be_bytes() || w == 0x668e_33efu32.to_be_bytes());
            served += usize::from(replied);
        }
        // The mutations must reach the transmission phase, not only haggling.
        assert!(
            served * 20 >= n,
            "only {served} of {n} sessions got a reply"
        );
        eprintln!("{served} of {n} mutated sessions reached transmission");
        let _ = done.send(());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(300)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a server connection did not end after its client's input did")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the mutation loop panicked (see above)")
        }
    }
}
