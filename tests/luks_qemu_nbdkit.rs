//! LUKS1 written by udm reads back through qemu-img's luks driver and
//! nbdkit's luks filter, and LUKS1 volumes created by qemu-img (or data
//! written through nbdkit) open and decrypt in udm. FAILS if qemu-img,
//! nbdkit or nbdcopy is missing (apt-get install qemu-utils nbdkit libnbd-bin).

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use udm::crypto::SectorCrypt;

const DATA: usize = 2 << 20;

/// Encrypt `plain` into the data area of a udm-opened volume (udm's mapping and cipher).
fn udm_write(img: &Path, pass: &[u8], plain: &[u8]) {
    let act = udm::luks::open(img, None, pass).unwrap();
    let seg = &act.segments[0];
    assert_eq!(seg.len_sectors * 512, plain.len() as u64);
    let sc = SectorCrypt::new(&seg.cipher, act.volume_key(), seg.sector_size, false).unwrap();
    let mut enc = plain.to_vec();
    sc.encrypt(&mut enc, seg.iv_offset);
    pwrite(img, seg.offset_sectors * 512, &enc);
}

/// Decrypt the whole data area with udm.
fn udm_read(img: &Path, pass: &[u8]) -> Vec<u8> {
    let act = udm::luks::open(img, None, pass).unwrap_or_else(|e| panic!("{}: {e}", img.display()));
    let seg = &act.segments[0];
    let sc = SectorCrypt::new(&seg.cipher, act.volume_key(), seg.sector_size, false).unwrap();
    let mut data = pread(
        img,
        seg.offset_sectors * 512,
        (seg.len_sectors * 512) as usize,
    );
    sc.decrypt(&mut data, seg.iv_offset);
    data
}

fn qemu_read(img: &Path, pwfile: &Path, out: &Path) -> Vec<u8> {
    need("qemu-img");
    run(Command::new("qemu-img")
        .arg("convert")
        .arg("--object")
        .arg(format!("secret,id=s0,file={}", pwfile.display()))
        .arg("--image-opts")
        .arg(format!(
            "driver=luks,key-secret=s0,file.filename={}",
            img.display()
        ))
        .args(["-O", "raw"])
        .arg(out));
    std::fs::read(out).unwrap()
}

fn nbdkit_run(img: &Path, pwfile: &Path, script: &str) {
    need("nbdkit");
    need("nbdcopy");
    run(Command::new("nbdkit")
        .args(["-U", "-", "file"])
        .arg(format!("file={}", img.display()))
        .arg("--filter=luks")
        .arg(format!("passphrase=+{}", pwfile.display()))
        .arg("--run")
        .arg(script));
}

#[test]
fn udm_luks1_reads_back_in_qemu_and_nbdkit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pw = write_file(d, "pw", b"qemu-pass");
    for bits in [256u32, 512] {
        let img = d.join(format!("u{bits}.img"));
        let size = 4096 * 512 + DATA as u64;
        run(udm()
            .args([
                "luks",
                "format",
                "-q",
                "--type=luks1",
                "--pbkdf-force-iterations=1000",
            ])
            .arg(format!("--key-size={bits}"))
            .arg(format!("--size={size}"))
            .arg("--key-file")
            .arg(&pw)
            .arg(&img));
        let plain = bytes(bits as u64, DATA);
        udm_write(&img, b"qemu-pass", &plain);

        let q = qemu_read(&img, &pw, &d.join("q.raw"));
        assert!(
            q == plain,
            "qemu-img reads different data from udm's LUKS1 ({bits}-bit)"
        );

        let out = d.join("n.raw");
        nbdkit_run(&img, &pw, &format!("nbdcopy \"$uri\" {}", out.display()));
        assert!(
            std::fs::read(&out).unwrap() == plain,
            "nbdkit luks filter reads different data ({bits}-bit)"
        );

        // nbdkit writes through its filter; udm decrypts the same bytes.
        let plain2 = bytes(bits as u64 + 7, DATA);
        let src = write_file(d, "p2.raw", &plain2);
        nbdkit_run(&img, &pw, &format!("nbdcopy {} \"$uri\"", src.display()));
        assert!(
            udm_read(&img, b"qemu-pass") == plain2,
            "udm reads different data than nbdkit wrote"
        );
    }
}

#[test]
fn qemu_created_luks_opens_in_udm() {
    need("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pw = write_file(d, "pw", b"from-qemu");
    for (cipher, hash) in [("aes-256", "sha256"), ("aes-128", "sha1")] {
        let plain = bytes(3, DATA);
        let raw = write_file(d, "plain.raw", &plain);
        let img = d.join(format!("q-{cipher}.luks"));
        run(Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "luks", "--object"])
            .arg(format!("secret,id=s0,file={}", pw.display()))
            .arg("-o")
            .arg(format!("key-secret=s0,iter-time=10,cipher-alg={cipher},cipher-mode=xts,ivgen-alg=plain64,hash-alg={hash}"))
            .arg(&raw)
            .arg(&img));
        assert!(
            udm_read(&img, b"from-qemu") == plain,
            "udm decrypts qemu's {cipher} volume differently"
        );
        let act = udm::luks::open(&img, None, b"from-qemu").unwrap();
        assert_eq!(
            act.volume_key().len(),
            if cipher == "aes-256" { 64 } else { 32 }
        );
        // udm add-key on a qemu volume; qemu opens with the new passphrase.
        let pw2 = write_file(d, "pw2", b"second");
        run(udm()
            .args([
                "luks",
                "add-key",
                "--pbkdf-force-iterations=1000",
                "--key-file",
            ])
            .arg(&pw)
            .arg(&img)
            .arg(&pw2));
        assert!(qemu_read(&img, &pw2, &d.join("q2.raw")) == plain);
    }
}
