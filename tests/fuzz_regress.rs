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
        ("log_writes", fuzzing::log_writes_seeds()),
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

/// Every seed of an on-disk format's target through its driver (each
/// must be accepted: `driver` returns true), then `n` mutations of them
/// (at least one in `min_ratio` must still be accepted, so that the
/// mutations reach past the first checks). Crash inputs (`crash-*`)
/// only have to run without a panic.
fn replay_format(target: &str, driver: fn(&[u8]) -> bool, n: usize, min_ratio: usize) {
    let dir = seed_dir(target);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut seeds = Vec::new();
    for name in &names {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let ok = driver(&bytes);
        if !name.starts_with("crash-") {
            assert!(
                ok,
                "fuzz/seeds/{target}/{name} is not accepted by its driver"
            );
            seeds.push(bytes);
        }
    }
    assert!(
        seeds.len() >= 3,
        "fuzz/seeds/{target} holds only {} seeds",
        seeds.len()
    );
    let tokens: [&[u8]; 6] = [
        &[0],
        &[0xff; 4],
        &[0; 8],
        &[1, 0, 0, 0],
        &[0x80],
        &[0xff; 8],
    ];
    let mut r = Rng(0x5eed_0ff0_4da7_5eed ^ target.len() as u64);
    let n = iterations(n);
    let mut accepted = 0;
    for _ in 0..n {
        let s = &seeds[r.below(seeds.len())];
        accepted += usize::from(driver(&mutate(&mut r, s, &seeds, &tokens)));
    }
    assert!(
        accepted * min_ratio >= n,
        "{target}: only {accepted} of {n} mutated inputs were accepted"
    );
    eprintln!("{target}: {accepted} of {n} mutated inputs accepted");
}

#[test]
fn mutated_verity_images_never_panic() {
    replay_format("verity", fuzzing::verity, 300, 20);
}

#[test]
fn mutated_logs_never_panic() {
    replay_format("log_writes", fuzzing::log_writes, 2000, 20);
}

#[test]
fn mutated_tcrypt_headers_never_panic() {
    replay_format("tcrypt", fuzzing::tcrypt, 2000, 50);
}

#[test]
fn mutated_bitlk_metadata_never_panics() {
    replay_format("bitlk", fuzzing::bitlk, 1000, 50);
}

#[test]
fn mutated_fvault2_metadata_never_panics() {
    replay_format("fvault2", fuzzing::fvault2, 1000, 50);
}

/// Writes the seeds of the foreign volume targets from cryptsetup's
/// upstream test images, unpacked in `$UDM_UPSTREAM_IMAGES` (the
/// `tcrypt-images`, `bitlk-images` and `fvault2-images` directories of
/// `../shared/upstream/cryptsetup-tests/*.tar.xz`); see fuzz/README.md.
/// Slow (it runs the real KDFs once per image), hence ignored.
#[test]
#[ignore]
fn write_upstream_seeds() {
    use std::sync::{Arc, Mutex};
    use udm::core::BlockDevice;
    use udm::luks::foreign::{fvault2, tcrypt};
    let up = PathBuf::from(
        std::env::var_os("UDM_UPSTREAM_IMAGES").expect("UDM_UPSTREAM_IMAGES is not set"),
    );
    let open = |p: &Path| -> Arc<dyn BlockDevice> {
        let f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let len = f.metadata().unwrap().len();
        Arc::new(fuzzing::FileDev(f, len))
    };
    let write = |target: &str, name: &str, bytes: &[u8]| {
        assert!(
            bytes.len() < 1 << 20,
            "{target}/{name}: {} bytes",
            bytes.len()
        );
        let dir = seed_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
        eprintln!("{target}/{name}: {} bytes", bytes.len());
    };
    // TCRYPT: (image, passphrase, hidden, PIM, driver flags).
    for (img, pass, hidden, pim, flags) in [
        ("tc_1-sha1-cbc-aes", "aaaaaaaaaaaa", false, 0, 0x10),
        (
            "tc_2-ripemd160-cbc-aes-blowfish",
            "aaaaaaaaaaaa",
            false,
            0,
            0x30,
        ),
        ("tc_2-ripemd160-lrw-serpent", "aaaaaaaaaaaa", false, 0, 0x00),
        (
            "tc_3-ripemd160-xts-serpent-aes",
            "aaaaaaaaaaaa",
            false,
            0,
            0x00,
        ),
        ("tc_4-sha512-xts-aes-hidden", "bbbbbbbbbbbb", true, 0, 0x02),
        (
            "tc_5-sha512-xts-serpent-aes",
            "aaaaaaaaaaaa",
            false,
            0,
            0x00,
        ),
        (
            "vc_1-sha512-xts-serpent-twofish-aes",
            "aaaaaaaaaaaa",
            false,
            0,
            0x01,
        ),
        ("vc_1-blake2s-xts-aes", "aaaaaaaaaaaa", false, 0, 0x01),
        (
            "vcpim_1_1234-sha256-xts-aes",
            "cccccccccccccccccccc",
            false,
            1234,
            0x41,
        ),
    ] {
        let hash = img.split('-').nth(1).unwrap();
        let p = tcrypt::Params {
            hash: Some(hash.to_string()),
            veracrypt: img.starts_with('v'),
            legacy: true,
            pim,
            ..tcrypt::Params::default()
        };
        let f = std::fs::File::open(up.join("tcrypt-images").join(img)).unwrap();
        let mut raw = [0u8; 512];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut raw, if hidden { 65536 } else { 0 })
            .unwrap();
        let Some((kdf, chain, plain)) = tcrypt::fuzz::decrypt_for_seed(&raw, pass.as_bytes(), &p)
        else {
            eprintln!("{img} does not decrypt: no seed");
            continue;
        };
        let size = (f.metadata().unwrap().len() >> 16) as u8;
        write(
            "tcrypt",
            img,
            &fuzzing::tcrypt_seed(kdf, chain, flags, size, &plain),
        );
    }
    // BitLocker: the sectors the reader looks at, and the startup key.
    let bl = up.join("bitlk-images");
    for (img, bek) in [
        ("bitlk-aes-xts-128", None),
        ("bitlk-aes-xts-128-clearkey-only", None),
        ("bitlk-partially-encrypted-aes-cbc-128", None),
        ("bitlk-togo-aes-xts-128", None),
        ("bitlk-aes-cbc-elephant-128", None),
        ("bitlk-aes-xts-128-eow", None),
        (
            "bitlk-aes-xts-128-startup-key",
            Some("4381F759-C4F8-4DE0-BB61-FC33A831BDA5.BEK"),
        ),
    ] {
        let rec = Arc::new(fuzzing::Recorder {
            inner: open(&bl.join(format!("{img}.img"))),
            reads: Mutex::new(Vec::new()),
        });
        let bek = bek.map(|b| std::fs::read(bl.join(b)).unwrap());
        assert!(fuzzing::bitlk_on(rec.clone(), 0, bek.as_deref()), "{img}");
        let sectors = (rec.size() / 512) as u32;
        let seed = fuzzing::sparse_seed(0, sectors, &rec.chunks(), bek.as_deref());
        write("bitlk", img, &seed);
    }
    // FileVault2: the sectors the reader looks at, and the decrypted
    // metadata blocks it uses.
    let img = up.join("fvault2-images/small");
    let rec = Arc::new(fuzzing::Recorder {
        inner: open(&img),
        reads: Mutex::new(Vec::new()),
    });
    assert!(fuzzing::fvault2_on(rec.clone()), "fvault2 small");
    let disk = udm::luks::disk::Disk::from_device(open(&img), "small");
    let blocks = fvault2::fuzz::decrypt_for_seed(&disk).unwrap();
    let used: Vec<u8> = blocks
        .chunks_exact(fvault2::fuzz::BLOCK_LEN)
        .filter(|b| matches!(u16::from_le_bytes([b[10], b[11]]), 0x19 | 0x1a | 0x305))
        .flatten()
        .copied()
        .collect();
    let sectors = (rec.size() / 512) as u32;
    let chunks = rec.chunks();
    write(
        "fvault2",
        "small",
        &fuzzing::sparse_seed(0, sectors, &chunks, Some(&used)),
    );
    write(
        "fvault2",
        "small_disk_only",
        &fuzzing::sparse_seed(0, sectors, &chunks, None),
    );
    write(
        "fvault2",
        "small_blocks_only",
        &fuzzing::sparse_seed(0, 0, &[], Some(&used)),
    );
}

/// Writes the integrity and snapshot seeds: devices udm's own targets
/// wrote (formatted, written, flushed; the snapshot's first metadata area
/// exactly full, and one past it), cut to their non-zero sectors. Ignored:
/// the bytes change whenever those formats' writers do, and the seeds need
/// not follow (`replay_format` checks that each still opens).
#[test]
#[ignore]
fn write_udm_seeds() {
    use std::sync::{Arc, Mutex};
    use udm::core::{BlockDevice, WriteBuf};
    use udm::store::MemStore;
    let chunks_of = |m: &Arc<MemStore>| {
        let rec = fuzzing::Recorder {
            inner: m.clone(),
            reads: Mutex::new(vec![(0, m.size())]),
        };
        rec.chunks()
    };
    let write = |target: &str, name: &str, head: [u8; 4], m: &Arc<MemStore>| {
        let seed = fuzzing::sparse_seed_head(head, (m.size() / 512) as u32, &chunks_of(m), None);
        assert!(
            seed.len() < 1 << 20,
            "{target}/{name}: {} bytes",
            seed.len()
        );
        let dir = seed_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), &seed).unwrap();
        eprintln!("{target}/{name}: {} bytes", seed.len());
    };
    // Integrity: (name, mode byte, line selector, opts, device size).
    for (name, mode, line, opts, size) in [
        ("journal_crc32c", 0u8, 5u8, 0u8, 4u64 << 20),
        ("bitmap_crc32c", 1, 5, 0, 4 << 20),
        ("journal_sha256", 0, 1, 0, 4 << 20),
        ("direct_4k", 2, 2, 0, 4 << 20),
        ("journal_discards", 0, 5, 1, 4 << 20),
    ] {
        let m = Arc::new(MemStore::new(size));
        let t =
            fuzzing::integrity_open(&m, mode, line, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let w: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
        t.write(0, WriteBuf::Borrowed(&w), false).unwrap();
        t.write(65536, WriteBuf::Borrowed(&w), false).unwrap();
        t.flush().unwrap();
        drop(t);
        write("integrity", name, [mode, line, opts, 0x07], &m);
    }
    // Snapshot: (name, kind, chunk selector, exceptions written).
    for (name, kind, chunk, n) in [
        ("p_4k_3", 0u8, 3u8, 3u64),
        ("po_4k_3", 1, 3, 3),
        ("p_512_area_full", 0, 0, 32),
        ("p_512_area_full_plus_one", 0, 0, 33),
        ("p_8k_many", 0, 4, 40),
    ] {
        let cow = Arc::new(MemStore::new(512 << 10));
        fuzzing::snapshot_fill(&cow, kind, chunk, n).expect(name);
        write("snapshot", name, [kind, chunk, 0x07, 0], &cow);
    }
}

#[test]
fn mutated_thin_metadata_never_panics() {
    replay_format("thin_metadata", fuzzing::thin_metadata, 150, 50);
}

#[test]
fn mutated_snapshot_cows_never_panic() {
    replay_format("snapshot", fuzzing::snapshot, 300, 50);
}

#[test]
fn mutated_integrity_devices_never_panic() {
    replay_format("integrity", fuzzing::integrity, 150, 50);
}
