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

/// AES-128-XTS over one whole metadata block as a single data unit
/// (Core Storage's), either way.
fn xts(key: &[u8], unit: u64, data: &mut [u8], encrypt: bool) {
    use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
    let k1 = aes::Aes128::new_from_slice(&key[..16]).unwrap();
    let k2 = aes::Aes128::new_from_slice(&key[16..32]).unwrap();
    let mut t = Array::from([0u8; 16]);
    t[..8].copy_from_slice(&unit.to_le_bytes());
    k2.encrypt_block(&mut t);
    let mut tweak = u128::from_le_bytes(t.into());
    for b in data.chunks_exact_mut(16) {
        let tb = tweak.to_le_bytes();
        let mut blk = Array::from([0u8; 16]);
        for i in 0..16 {
            blk[i] = b[i] ^ tb[i];
        }
        if encrypt {
            k1.encrypt_block(&mut blk);
        } else {
            k1.decrypt_block(&mut blk);
        }
        for i in 0..16 {
            b[i] = blk[i] ^ tb[i];
        }
        let carry = (tweak >> 127) as u8;
        tweak = (tweak << 1) ^ u128::from(carry * 0x87);
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The image `small` with its passphrase key's PBKDF2 iterations set to
/// `iters`: block 0x0019 of the encrypted metadata decrypted, the count
/// changed in its base64 PassphraseWrappedKEKStruct, the block's CRC-32C
/// made to match and the block encrypted again, as a hostile image would
/// be made.
fn with_iterations(image: &std::path::Path, iters: u32) {
    use base64::Engine;
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut h = [0u8; 512];
    f.read_exact_at(&mut h, 0).unwrap();
    let block_size = u64::from(le32(&h, 96));
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&h[176..192]);
    key[16..].copy_from_slice(&h[304..320]);
    let label_at = le64(&h, 104) * block_size;
    let mut label = vec![0u8; 8192];
    f.read_exact_at(&mut label, label_at).unwrap();
    let mut desc = [0u8; 40];
    f.read_exact_at(&mut desc, label_at + u64::from(le32(&label, 220)))
        .unwrap();
    let (start, count) = (le64(&desc, 32) * block_size, le64(&desc, 8));
    for i in 0..count {
        let at = start + i * 8192;
        let mut b = vec![0u8; 8192];
        f.read_exact_at(&mut b, at).unwrap();
        assert!(b.iter().any(|&x| x != 0), "block 0x0019 not found");
        xts(&key, i, &mut b, false);
        if u16::from_le_bytes([b[10], b[11]]) != 0x0019 {
            continue;
        }
        let (off, size) = (le32(&b, 112) as usize, le32(&b, 116) as usize);
        let xml = String::from_utf8_lossy(&b[off..off + size]).into_owned();
        let head = "<key>PassphraseWrappedKEKStruct</key><data";
        let tag = xml.find(head).expect("no PassphraseWrappedKEKStruct") + head.len();
        let from = tag + xml[tag..].find('>').unwrap() + 1;
        let to = from + xml[from..].find("</data>").unwrap();
        // The base64 text's characters, whitespace left where it is.
        let places: Vec<usize> = (from..to)
            .filter(|&p| !xml.as_bytes()[p].is_ascii_whitespace())
            .collect();
        let text: String = places.iter().map(|&p| xml.as_bytes()[p] as char).collect();
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut pwk = b64.decode(&text).unwrap();
        pwk[168..172].copy_from_slice(&iters.to_le_bytes());
        let new = b64.encode(&pwk);
        assert_eq!(new.len(), places.len());
        for (p, c) in places.iter().zip(new.bytes()) {
            b[off + p] = c;
        }
        let crc = !crc32c::crc32c_append(0, &b[8..]);
        b[..4].copy_from_slice(&crc.to_le_bytes());
        xts(&key, i, &mut b, true);
        f.write_all_at(&b, at).unwrap();
        return;
    }
    panic!("block 0x0019 not found");
}

/// `cmd`'s output, or a failure if it still runs after `limit` (then it
/// is killed): a KDF of 2^32-1 iterations runs for a quarter of an hour.
fn output_within(cmd: &mut std::process::Command, limit: std::time::Duration) -> Option<Output> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

use std::process::Output;

/// A FileVault2 header asking for 2^32-1 PBKDF2 iterations (a quarter of
/// an hour per passphrase tried) is refused at once, naming the cost and
/// `--no-kdf-limit`, by `udm cryptsetup` and by `udm serve --fvault2`;
/// with `--no-kdf-limit` the KDF is run (it is still running when the
/// test gives up on it).
#[test]
fn huge_pbkdf2_iterations_are_refused_before_any_passphrase_is_tried() {
    let (keep, dir) = unpack_upstream("fvault2-images.tar.xz", "fvault2-images");
    let img = dir.join("small");
    // The image as it came opens: the edit below is what is refused.
    with_iterations(&img, u32::MAX);
    let kf = keep.path().join("key");
    std::fs::write(&kf, PASS).unwrap();
    let quick = std::time::Duration::from_secs(20);
    let o = output_within(
        udm()
            .args([
                "cryptsetup",
                "open",
                "--type",
                "fvault2",
                "--test-passphrase",
            ])
            .arg("--key-file")
            .arg(&kf)
            .arg(&img),
        quick,
    )
    .expect("udm cryptsetup still deriving after 20 s: no KDF cost limit for FVAULT2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        err.contains("4294967295") && err.contains("--no-kdf-limit"),
        "{}",
        show(&o)
    );
    let o = output_within(
        udm()
            .arg("serve")
            .arg("--socket")
            .arg(keep.path().join("nbd.sock"))
            .arg("--key-file")
            .arg(&kf)
            .arg("--fvault2")
            .arg(format!("fv={}", img.display())),
        quick,
    )
    .expect("udm serve --fvault2 still deriving after 20 s");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        err.contains("4294967295") && err.contains("--no-kdf-limit"),
        "{}",
        show(&o)
    );
    // --no-kdf-limit is honoured: the KDF runs (and is stopped).
    let o = output_within(
        udm()
            .args([
                "cryptsetup",
                "open",
                "--type",
                "fvault2",
                "--test-passphrase",
            ])
            .args(["--no-kdf-limit", "--key-file"])
            .arg(&kf)
            .arg(&img),
        std::time::Duration::from_secs(3),
    );
    assert!(
        o.is_none(),
        "--no-kdf-limit not honoured: {}",
        show(&o.unwrap())
    );
}
