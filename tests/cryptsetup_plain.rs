//! Plain dm-crypt and crypttab against cryptsetup's bytes. cryptsetup
//! cannot map a plain device without the kernel, but it can encrypt a file
//! in place with a volume key we choose (`reencrypt --encrypt
//! --volume-key-file`, offline, detached header): that is the ciphertext a
//! plain mapping with the same key, cipher and sector size holds. udm
//! derives the key from the passphrase by cryptsetup's plain rules (the
//! expected key is the one cryptsetup's own plain-mode test expects for
//! that passphrase), is served from a crypttab line, and nbdcopy writes the
//! plaintext through it: the file must then equal cryptsetup's. The same
//! crypttab opens cryptsetup's LUKS2 result (detached header) and reads the
//! plaintext back.
//!
//! FAILS if cryptsetup or nbdcopy is missing.

mod common;

use common::luks::*;
use common::*;
use std::process::Command;

/// sha256("xxx"), cryptsetup's plain key for passphrase `xxx`, `--hash
/// sha256`, 256-bit key (its password-hash-test).
const KEY_XXX_SHA256: &str = "cd2eb0837c9b4c962c22d2ff8b5441b7b45805887f051d39bf133b583baf6860";

#[test]
fn plain_crypttab_volumes_hold_cryptsetups_ciphertext() {
    need("nbdcopy");
    let dir = scratch("plain");
    let d = dir.path();
    let size = 4usize << 20;
    let plain = fast_bytes(7, size);
    let p_file = write_file(d, "plain.bin", &plain);

    // cryptsetup's ciphertext of `plain` under the key, in place.
    let cs = write_file(d, "cs.img", &plain);
    let vk = write_file(d, "vk.bin", &hex::decode(KEY_XXX_SHA256).unwrap());
    let pass = write_file(d, "pass", b"luks-pass");
    run(cryptsetup()
        .args([
            "reencrypt",
            "--encrypt",
            "-q",
            "--type",
            "luks2",
            "--header",
        ])
        .arg(d.join("cs.hdr"))
        .arg("--volume-key-file")
        .arg(&vk)
        .args([
            "--key-size",
            "256",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--sector-size",
            "512",
        ])
        .args(FAST_PBKDF)
        .arg("--key-file")
        .arg(&pass)
        .arg(&cs));
    let expected = std::fs::read(&cs).unwrap();
    assert!(expected != plain, "cryptsetup did not encrypt");

    // Three volumes: plain from a typed passphrase (a line on stdin),
    // plain from a raw key file, and cryptsetup's LUKS2 result.
    let typed = sparse(d, "typed.img", size as u64);
    let keyed = sparse(d, "keyed.img", size as u64);
    let ct = write_file(
        d,
        "crypttab",
        format!(
            "# plain volumes\n\
             typed {} none plain,cipher=aes-cbc-essiv:sha256,size=256,hash=sha256\n\
             keyed {} {} plain,cipher=aes-cbc-essiv:sha256,size=256,hash=ripemd160,no-read-workqueue\n\
             luks2 {} {} luks,header={},readonly,nofail\n",
            typed.display(),
            keyed.display(),
            vk.display(),
            cs.display(),
            pass.display(),
            d.join("cs.hdr").display(),
        )
        .as_bytes(),
    );
    let sock = d.join("s.sock");
    let srv = UdmServe::start_with_input(
        &sock,
        &[std::ffi::OsStr::new("--crypttab"), ct.as_os_str()],
        Some(b"xxx\n"),
    );
    for export in ["typed", "keyed"] {
        run(Command::new("nbdcopy").arg(&p_file).arg(srv.uri(export)));
    }
    let back = d.join("back.bin");
    run(Command::new("nbdcopy").arg(srv.uri("luks2")).arg(&back));
    // crypttab's readonly: writes are refused.
    let o = Command::new("nbdcopy")
        .arg(&p_file)
        .arg(srv.uri("luks2"))
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "a readonly crypttab volume took a write"
    );
    assert_eq!(srv.stop(), Some(0));
    assert!(
        std::fs::read(&typed).unwrap() == expected,
        "plain (hashed passphrase) differs from cryptsetup's ciphertext"
    );
    assert!(
        std::fs::read(&keyed).unwrap() == expected,
        "plain (key file) differs from cryptsetup's ciphertext"
    );
    assert!(
        std::fs::read(&back).unwrap() == plain,
        "cryptsetup's LUKS2 volume read back wrong"
    );
}

#[test]
fn crypttab_errors_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = sparse(d, "x.img", 1 << 20);
    let ct = write_file(
        d,
        "crypttab",
        format!(
            "ok {} /dev/null plain\nbad {} none plain,frobnicate\n",
            img.display(),
            img.display()
        )
        .as_bytes(),
    );
    let o = udm()
        .args(["serve", "--socket"])
        .arg(d.join("s.sock"))
        .arg("--crypttab")
        .arg(&ct)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{}:2", ct.display())) && err.contains("frobnicate"),
        "{err}"
    );
}

/// F10: a crypttab line with neither `luks` nor `plain` fell back to plain
/// dm-crypt (no KDF, offset 0) when the LUKS magics were wiped, silently:
/// the storage holder could downgrade the volume and have the client's
/// first writes destroy the keyslots. A device with LUKS remnants is now
/// refused, naming it and the fix; a device with none is still plain
/// (systemd's rule), with a warning naming the downgrade.
#[test]
fn crypttab_refuses_plain_fallback_over_luks_remnants() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 64 bytes: enough for a plain mapping, so a fallback would serve.
    let kf = write_file(d, "k", &[5u8; 64]);
    let l2 = sparse(d, "l2.img", 20 << 20);
    cs_format(&l2, &FAST_PBKDF, &kf);
    pwrite(&l2, 0, &[0u8; 8]);
    pwrite(&l2, 16384, &[0u8; 8]);
    let l1 = sparse(d, "l1.img", 4 << 20);
    cs_format(&l1, &["--type=luks1", "--pbkdf-force-iterations=1000"], &kf);
    pwrite(&l1, 0, &[0u8; 6]);
    for img in [&l2, &l1] {
        let ct = write_file(
            d,
            "crypttab",
            format!("v {} {}\n", img.display(), kf.display()).as_bytes(),
        );
        let mut child = udm()
            .args(["serve", "--socket"])
            .arg(d.join("r.sock"))
            .arg("--crypttab")
            .arg(&ct)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("{}: served as plain dm-crypt", img.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(
            err.contains(&format!("{} is not a valid LUKS device", img.display()))
                && err.contains("LUKS remnants")
                && err.contains("Add 'plain' to the line"),
            "{err}"
        );
    }

    // Saying `plain` maps it; a device without remnants is plain with a
    // warning.
    let fresh = sparse(d, "fresh.img", 4 << 20);
    let kf = write_file(d, "pk", &[7u8; 64]);
    let ct = write_file(
        d,
        "crypttab",
        format!(
            "said {} {} plain\nfresh {} {}\n",
            l2.display(),
            kf.display(),
            fresh.display(),
            kf.display()
        )
        .as_bytes(),
    );
    let sock = d.join("p.sock");
    let srv = UdmServe::start(&sock, &[std::ffi::OsStr::new("--crypttab"), ct.as_os_str()]);
    assert_eq!(srv.stop(), Some(0));
    let log = std::fs::read_to_string(sock.with_extension("log")).unwrap();
    let warn = format!(
        "crypttab line 2 (fresh): {} has no LUKS header, so it is mapped as plain",
        fresh.display()
    );
    assert!(log.contains(&warn) && log.contains("WARN"), "{log}");
    assert!(!log.contains("(said)"), "{log}");
}
