//! `udm serve --luks` end to end: a volume made by cryptsetup, data encrypted
//! outside udm with cryptsetup's key, read back by nbdcopy over NBD and
//! written through NBD so that the outside decryption matches. FAILS if
//! cryptsetup, nbdcopy or python3-cryptography is missing.
//!
//! The images are on a disk filesystem (/var/tmp), where the file's
//! writes go to its writer thread and a LUKS write is encrypted there
//! (`AsyncIo::prepare`): the bytes that thread stores are the ones
//! checked against cryptsetup's key.

mod common;

use common::luks::*;
use common::*;
use std::ffi::OsStr;
use std::process::Command;

#[test]
fn serve_luks_reads_and_writes_like_cryptsetup() {
    need("nbdcopy");
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let d = dir.path();
    let fs = run_text(Command::new("stat").args(["-f", "-c", "%T"]).arg(d));
    assert_ne!(fs.trim(), "tmpfs", "/var/tmp must be a disk filesystem");
    let kf = write_file(d, "k", b"served");
    for case in [cases()[0].clone(), cases()[4].clone()] {
        let size = case.data_offset() + (4 << 20);
        let img = sparse(d, &format!("s{}.img", case.luks), size);
        cs_format(&img, &case.format_args(), &kf);
        let key = cs_volume_key(&img, None, &kf);
        let plain = bytes(9, 4 << 20);
        let enc = py_crypt(d, "enc", "aes-xts-plain64", &key, case.sector, 0, &plain);
        pwrite(&img, case.data_offset(), &enc);

        let sock = d.join(format!("s{}.sock", case.luks));
        let srv = UdmServe::start(
            &sock,
            &[
                OsStr::new("--luks"),
                OsStr::new(&format!("v={}", img.display())),
                OsStr::new("--key-file"),
                kf.as_os_str(),
            ],
        );
        let uri = srv.uri("v");
        let out = d.join("out.raw");
        run(Command::new("nbdcopy").arg(&uri).arg(&out));
        assert!(
            std::fs::read(&out).unwrap() == plain,
            "{case:?}: data served by udm differs from cryptsetup's"
        );

        // 1 MiB requests, 16 in flight: each is cut over the crypto
        // threads on the writer.
        let plain2 = bytes(10, 4 << 20);
        let src = write_file(d, "in.raw", &plain2);
        run(Command::new("nbdcopy")
            .args(["--request-size=1048576", "--requests=16"])
            .arg(&src)
            .arg(&uri));
        let raw = pread(&img, case.data_offset(), 4 << 20);
        let back = py_crypt(d, "dec", "aes-xts-plain64", &key, case.sector, 0, &raw);
        assert!(
            back == plain2,
            "{case:?}: data written through udm serve does not decrypt with cryptsetup's key"
        );
    }
}

/// `udm serve --luks` honours `--no-kdf-limit` as `udm cryptsetup` does:
/// a LUKS1 keyslot edited to 2^30 PBKDF2 iterations is refused at once
/// without it, naming the flag; with it the KDF is run (the server is
/// still deriving when the test stops it, instead of refusing).
#[test]
fn serve_luks_honours_no_kdf_limit() {
    use std::os::unix::fs::FileExt;
    use std::process::Stdio;
    need("cryptsetup");
    let dir = scratch("serve-kdf");
    let d = dir.path();
    let kf = write_file(d, "k", b"served");
    let img = sparse(d, "l1.img", 4 << 20);
    run(Command::new("cryptsetup")
        .args(["luksFormat", "--batch-mode", "--type", "luks1"])
        .args(["--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&kf)
        .arg(&img));
    // Keyslot 0's iterations (LUKS1: slots at 208, 48 bytes each, the
    // count big-endian after the active word). No checksum covers it.
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&(1u32 << 30).to_be_bytes(), 208 + 4)
        .unwrap();
    drop(f);
    let serve = |extra: &[&str]| {
        let mut c = udm();
        c.arg("serve")
            .arg("--socket")
            .arg(d.join("nbd.sock"))
            .arg("--key-file")
            .arg(&kf)
            .arg("--luks")
            .arg(format!("v={}", img.display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_secs(4) {
            if child.try_wait().unwrap().is_some() {
                return Some(child.wait_with_output().unwrap());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    };
    let o = serve(&[]).expect("a 2^30-iteration keyslot was tried without --no-kdf-limit");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--no-kdf-limit"),
        "{}",
        show(&o)
    );
    if let Some(o) = serve(&["--no-kdf-limit"]) {
        panic!("serve --luks --no-kdf-limit refused at once: {}", show(&o));
    }
}
