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
