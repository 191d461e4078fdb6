//! The LUKS1 images of cryptsetup's own test suite (made by the kernel's
//! dm-crypt years ago: whirlpool and sha1/sha256 PBKDF2, aes/serpent/
//! twofish in xts, cbc-essiv:sha256, xts-essiv:wp256 and lrw-plain64)
//! unlock with the suite's keyfile, and their decrypted payload carries the
//! filesystem UUID `luks1-compat-test` expects, read by blkid. FAILS if
//! ../shared/upstream/cryptsetup-tests is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use udm::crypto::SectorCrypt;

fn upstream() -> PathBuf {
    common::upstream_cryptsetup_tests().join("luks1-images.tar.xz")
}

/// Decrypt the first MiB of the payload into a file and ask blkid for its
/// filesystem UUID.
fn payload_uuid(img: &Path, dir: &Path) -> Result<String, String> {
    let key = std::fs::read(img.parent().unwrap().join("keyfile1")).unwrap();
    let act = udm::luks::open(img, None, &key).map_err(|e| format!("open: {e}"))?;
    let seg = &act.segments[0];
    let c = SectorCrypt::new(&seg.cipher, act.volume_key(), seg.sector_size, false)
        .map_err(|e| format!("cipher {}: {e}", seg.cipher))?;
    let raw = std::fs::read(img).unwrap();
    let start = (seg.offset_sectors * 512) as usize;
    let mut data = raw[start..(start + (1 << 20)).min(raw.len())].to_vec();
    c.decrypt(&mut data, seg.iv_offset);
    let out = dir.join(format!(
        "{}.plain",
        img.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&out, &data).unwrap();
    let o = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID"])
        .arg(&out)
        .output()
        .expect("blkid (util-linux) must be installed");
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[test]
fn every_luks1_image_of_the_upstream_suite_opens_with_the_expected_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new("tar")
        .arg("xJf")
        .arg(upstream())
        .arg("--no-same-owner")
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(st.success(), "tar could not unpack the images");
    let imgs = dir.path().join("luks1-images");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&imgs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("luks1_")
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 12, "the suite has 12 LUKS1 images");
    let mut bad = Vec::new();
    for img in &names {
        let name = img.file_name().unwrap().to_string_lossy().to_string();
        match payload_uuid(img, dir.path()) {
            Ok(u) if u == "DEAD-BABE" => eprintln!("{name}: DEAD-BABE [OK]"),
            Ok(u) => bad.push(format!("{name}: UUID '{u}', want DEAD-BABE")),
            Err(e) => bad.push(format!("{name}: {e}")),
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
