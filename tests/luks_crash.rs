//! Crash safety of keyslot changes: the write sequence of add-key and
//! kill-slot is cut after every possible number of writes (the process
//! "dies" there), and the volume must still open with every passphrase that
//! was valid before — in udm and in cryptsetup. FAILS if cryptsetup is missing.

mod common;

use common::luks::*;
use common::*;
use std::path::Path;
use udm::luks::hash::HashAlg;
use udm::luks::kdf::Kdf;
use udm::luks::volume::Volume;
use udm::luks::LuksError;

const KDF: Kdf = Kdf::Pbkdf2 {
    hash: HashAlg::Sha256,
    iterations: 1000,
};

fn opens(img: &Path, pass: &[u8]) -> bool {
    match udm::luks::open(img, None, pass) {
        Ok(_) => true,
        Err(LuksError::WrongPassphrase) => false,
        Err(e) => panic!("volume unreadable after simulated crash: {e}"),
    }
}

/// Run `op` with the write budget 0, 1, 2, ... until it completes; after each
/// cut, `check` inspects the image. Returns the number of writes op needs.
fn sweep(
    template: &Path,
    work: &Path,
    op: &dyn Fn(&mut Volume) -> Result<(), LuksError>,
    check: &dyn Fn(&Path, bool),
) -> usize {
    for n in 0..64 {
        std::fs::copy(template, work).unwrap();
        let mut v = Volume::load(work, None, true).unwrap();
        v.meta.set_write_budget(Some(n));
        let r = op(&mut v);
        drop(v);
        if let Err(e) = &r {
            assert!(
                e.to_string().contains("simulated crash"),
                "unexpected error at budget {n}: {e}"
            );
        }
        check(work, r.is_ok());
        if r.is_ok() {
            return n;
        }
    }
    panic!("operation never completed");
}

#[test]
fn add_and_kill_survive_a_crash_between_any_two_writes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k0 = write_file(d, "k0", b"old-0");
    let k1 = write_file(d, "k1", b"old-1");
    for luks in ["luks1", "luks2"] {
        let tpl = d.join(format!("{luks}.img"));
        udm_format(
            &tpl,
            &[
                "--size=20M",
                FAST_PBKDF[0],
                FAST_PBKDF[1],
                &format!("--type={luks}"),
            ],
            &k0,
        );
        run(cryptsetup()
            .args([
                "luksAddKey",
                "-q",
                "--pbkdf=pbkdf2",
                "--pbkdf-force-iterations=1000",
                "--key-file",
            ])
            .arg(&k0)
            .arg(&tpl)
            .arg(&k1));
        let work = d.join(format!("{luks}.work"));
        let cs_copy = d.join(format!("{luks}.cs"));
        let check_old = |img: &Path, done: bool| {
            assert!(
                opens(img, b"old-0") && opens(img, b"old-1"),
                "{luks}: an old passphrase stopped working"
            );
            // cryptsetup (on a copy: it may repair the header) agrees.
            std::fs::copy(img, &cs_copy).unwrap();
            assert!(
                cs_test(&cs_copy, None, &k0) && cs_test(&cs_copy, None, &k1),
                "{luks}: cryptsetup lost an old passphrase"
            );
            if done {
                assert!(
                    opens(img, b"new"),
                    "{luks}: completed add-key does not open"
                );
            }
        };
        let add = |v: &mut Volume| {
            let (_, key) = v.unlock(b"old-0", None)?;
            v.add_key(&key, b"new", None, KDF, HashAlg::Sha256)
                .map(|_| ())
        };
        let writes = sweep(&tpl, &work, &add, &check_old);
        assert!(
            writes >= if luks == "luks1" { 4 } else { 10 },
            "{luks}: only {writes} writes"
        );

        // Killing slot 1 never harms slot 0; once complete, slot 1 is gone.
        let kill = |v: &mut Volume| v.kill_slot(1);
        let check_kill = |img: &Path, done: bool| {
            assert!(opens(img, b"old-0"), "{luks}: kill-slot 1 broke slot 0");
            std::fs::copy(img, &cs_copy).unwrap();
            assert!(cs_test(&cs_copy, None, &k0));
            if done {
                assert!(
                    !opens(img, b"old-1") && cs_test_code(&cs_copy, None, &k1) == Some(2),
                    "{luks}: killed slot still opens"
                );
            }
        };
        sweep(&tpl, &work, &kill, &check_kill);
    }
}

#[test]
fn key_material_is_written_before_the_header_references_it() {
    // With budget for exactly the material (write + sync), the header is untouched.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k0 = write_file(d, "k0", b"p");
    let img = d.join("v.img");
    udm_format(&img, &["--size=20M", FAST_PBKDF[0], FAST_PBKDF[1]], &k0);
    let before = pread(&img, 0, 32768);
    let mut v = Volume::load(&img, None, true).unwrap();
    let (_, key) = v.unlock(b"p", None).unwrap();
    v.meta.set_write_budget(Some(2));
    assert!(v.add_key(&key, b"q", None, KDF, HashAlg::Sha256).is_err());
    drop(v);
    assert!(
        pread(&img, 0, 32768) == before,
        "header changed before the key material was durable"
    );
    assert!(!opens(&img, b"q"));
    // The material itself landed in the second area (first fit after slot 0).
    assert!(pread(&img, 32768 + 258048, 4096).iter().any(|&b| b != 0));
}
