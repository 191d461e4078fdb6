//! `udm serve --luks` end to end: a volume made by cryptsetup, data encrypted
//! outside udm with cryptsetup's key, read back by nbdcopy over NBD and
//! written through NBD so that the outside decryption matches. FAILS if
//! cryptsetup, nbdcopy or python3-cryptography is missing.

#[path = "luks/common.rs"]
mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(sock: &Path, args: &[&std::ffi::OsStr]) -> Served {
    let child = udm()
        .arg("serve")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut s = Served(child);
    let t0 = Instant::now();
    while !sock.exists() {
        if let Ok(Some(st)) = s.0.try_wait() {
            let mut err = String::new();
            use std::io::Read;
            let _ = s.0.stderr.take().unwrap().read_to_string(&mut err);
            panic!("udm serve exited ({st}): {err}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "udm serve did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s
}

#[test]
fn serve_luks_reads_and_writes_like_cryptsetup() {
    need("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kf = write_file(d, "k", b"served");
    for case in [cases()[0].clone(), cases()[4].clone()] {
        let size = case.data_offset() + (4 << 20);
        let img = sparse(d, &format!("s{}.img", case.luks), size);
        ok(cryptsetup()
            .arg("luksFormat")
            .arg("-q")
            .args(case.format_args())
            .arg("--key-file")
            .arg(&kf)
            .arg(&img));
        let key = cs_volume_key(&img, None, &kf);
        let plain = bytes(9, 4 << 20);
        let enc = py_crypt(d, "enc", "aes-xts-plain64", &key, case.sector, 0, &plain);
        pwrite(&img, case.data_offset(), &enc);

        let sock = d.join(format!("s{}.sock", case.luks));
        let _srv = serve(
            &sock,
            &[
                "--luks".as_ref(),
                format!("v={}", img.display()).as_ref(),
                "--key-file".as_ref(),
                kf.as_os_str(),
            ],
        );
        let uri = format!("nbd+unix:///v?socket={}", sock.display());
        let out = d.join("out.raw");
        ok(Command::new("nbdcopy").arg(&uri).arg(&out));
        assert!(
            std::fs::read(&out).unwrap() == plain,
            "{case:?}: data served by udm differs from cryptsetup's"
        );

        let plain2 = bytes(10, 4 << 20);
        let src = write_file(d, "in.raw", &plain2);
        ok(Command::new("nbdcopy").arg(&src).arg(&uri));
        let raw = pread(&img, case.data_offset(), 4 << 20);
        let back = py_crypt(d, "dec", "aes-xts-plain64", &key, case.sector, 0, &raw);
        assert!(
            back == plain2,
            "{case:?}: data written through udm serve does not decrypt with cryptsetup's key"
        );
    }
}
