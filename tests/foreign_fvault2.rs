//! cryptsetup's own FileVault2 image (the upstream suite's
//! `fvault2-images.tar.xz`, read from `../shared/upstream/`, never copied
//! here) through `udm cryptsetup`: `fvault2Dump` prints what cryptsetup
//! 2.6.1 prints for it, the volume key is the one `fvault2-compat-test`
//! expects, a wrong passphrase is refused as cryptsetup refuses it, and
//! the volume opened on a running `udm serve` reads back over NBD with the
//! filesystem UUID and sha256 the script checks. FAILS if the upstream
//! folder, cryptsetup, nbdcopy or blkid is missing.

mod common;

use common::foreign::*;
use common::*;

const PASS: &str = "heslo123";
const VOLUME_KEY: &str = "20 73 4d 33 89 21 27 74 d7 61 0c 29 d7 32 88 09 \
                          16 f3 be 14 c4 b1 2a c7 aa f0 7e 5c cc 77 b3 19";

#[test]
fn dump_and_passphrase_as_cryptsetup() {
    need("cryptsetup");
    let (_keep, dir) = unpack_upstream("fvault2-images.tar.xz", "fvault2-images");
    let ours = cs_piped(&dir, None, &["fvault2Dump", "small"], "");
    let theirs = run(std::process::Command::new("cryptsetup")
        .args(["fvault2Dump", "small"])
        .current_dir(&dir));
    assert!(ours.status.success(), "{}", show(&ours));
    assert_eq!(
        String::from_utf8_lossy(&ours.stdout),
        String::from_utf8_lossy(&theirs.stdout)
    );

    let o = cs_piped(
        &dir,
        None,
        &["fvault2Dump", "--dump-volume-key", "small"],
        PASS,
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        text.ends_with(&format!("Volume key:       \t{VOLUME_KEY} \n")),
        "{text}"
    );

    let o = cs_piped(
        &dir,
        None,
        &["open", "--type", "fvault2", "--test-passphrase", "small"],
        PASS,
    );
    assert!(o.status.success(), "{}", show(&o));
    let o = cs_piped(
        &dir,
        None,
        &["open", "--type", "fvault2", "--test-passphrase", "small"],
        "heslo124",
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("No key available with this passphrase."));

    // Not a FileVault2 volume: named, exit 1.
    std::fs::write(dir.join("zero"), vec![0u8; 1 << 20]).unwrap();
    let o = cs_piped(&dir, None, &["fvault2Dump", "zero"], "");
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Device zero is not a valid FVAULT2 device.")
    );
}

#[test]
fn volume_opens_over_nbd_with_the_expected_filesystem() {
    need("nbdcopy");
    need("blkid");
    need("sha256sum");
    let (keep, dir) = unpack_upstream("fvault2-images.tar.xz", "fvault2-images");
    let ctl = keep.path().join("ctl");
    let srv = UdmServe::start(
        &keep.path().join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    // A relative device path, as the script gives it: the server must be
    // handed the absolute one.
    let o = cs_piped(
        &dir,
        Some(&ctl),
        &["open", "--type", "fvault2", "small", "fv"],
        PASS,
    );
    assert!(o.status.success(), "{}", show(&o));
    let st = cs_piped(&dir, Some(&ctl), &["status", "fv"], "");
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(st.contains("type:    FVAULT2"), "{st}");
    assert!(st.contains("cipher:  aes-xts-plain64"), "{st}");
    assert!(st.contains("offset:  131072 sectors"), "{st}");
    let copy = copy_and_close(&dir, &ctl, &srv, "fv").unwrap();
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), 167_772_160);
    assert_eq!(fs_uuid(&copy, 0), "de124d8a-2164-394e-924f-8e28db0a09cb");
    assert_eq!(
        sha256_of(&copy),
        "2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18"
    );
}
