//! Authenticated LUKS2 (`luksFormat --integrity`) against cryptsetup 2.6.
//!
//! cryptsetup cannot format such a volume on this machine (it has the
//! kernel's dm-integrity write the integrity superblock), so the header is
//! checked two ways: cryptsetup reads udm's header and prints what udm
//! prints (`luksDump`), and the header is cryptsetup's own for the same
//! parameters without `--integrity`, except for exactly what libcryptsetup's
//! `LUKS2_generate_hdr` adds for it (the segment's `integrity` object) and
//! the volume key size (the cipher key plus the integrity key).
//!
//! Volumes udm formats with `--integrity` also open in udm as cryptsetup
//! opens them (crypt over the integrity device `NAME_dif`), keep what is
//! written across close and open, and fail a sector whose ciphertext
//! changed on disk with EIO.
//!
//! FAILS if cryptsetup or python3-libnbd is missing (apt-get install
//! cryptsetup-bin python3-libnbd).

mod common;

use common::integrity::nbd_py;
use common::luks::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Output;

const UUID: &str = "6f1a3c2e-8d4b-4c1a-9e2f-0123456789ab";

fn udm_cs() -> std::process::Command {
    let mut c = udm();
    c.arg("cryptsetup");
    c
}

/// Both JSONs with what is random per format (salts, digests, the
/// keyslot's area contents) removed.
fn normalised(mut v: Value) -> Value {
    for (_, ks) in v["keyslots"].as_object_mut().expect("keyslots").iter_mut() {
        ks["kdf"]["salt"] = json!("");
    }
    for (_, d) in v["digests"].as_object_mut().expect("digests").iter_mut() {
        d["salt"] = json!("");
        d["digest"] = json!("");
    }
    v
}

/// udm formats with `--integrity`, cryptsetup formats the same image
/// size, UUID and cipher without it; the headers differ only by the
/// integrity object and the key size.
fn same_as_cryptsetup(cipher: &str, integrity: &str, kind: &str, key_bits: u64) {
    need("cryptsetup");
    let d = scratch("udm-luks-int");
    let key = write_file(d.path(), "key", b"integrity passphrase");
    let ours = sparse(d.path(), "udm.img", 64 << 20);
    let theirs = sparse(d.path(), "cs.img", 64 << 20);
    let common_opts = [
        "--type",
        "luks2",
        "--cipher",
        cipher,
        "--uuid",
        UUID,
        FAST_PBKDF[0],
        FAST_PBKDF[1],
    ];
    let mut udm_opts: Vec<&str> = common_opts.to_vec();
    udm_opts.extend(["--integrity", integrity, "--integrity-no-wipe"]);
    run(udm_cs()
        .arg("luksFormat")
        .arg("-q")
        .args(&udm_opts)
        .arg("--key-file")
        .arg(&key)
        .arg(&ours));
    // cryptsetup's header for AES-XTS with the same cipher key size and
    // no integrity (a random-IV or AEAD cipher without dm would not
    // format), then what libcryptsetup changes for the integrity volume:
    // the segment's cipher and integrity object, the volume key size, and
    // the keyslot's area, which falls back to aes-xts-plain64 with a
    // 512-bit key (an authenticated cipher cannot encrypt a keyslot) and
    // holds the AF-split of the longer key (4000 stripes, 4 KiB aligned).
    let cipher_key = key_bits - integrity_key_bits(integrity);
    let ks = cipher_key.to_string();
    let mut cs_opts: Vec<&str> = common_opts.to_vec();
    cs_opts[3] = "aes-xts-plain64";
    cs_opts.extend(["--key-size", &ks]);
    cs_format(&theirs, &cs_opts, &key);

    let mut want = normalised(cs_json(&theirs));
    let seg = &mut want["segments"]["0"];
    seg["encryption"] = json!(cipher);
    seg["integrity"] = json!({
        "type": kind, "journal_encryption": "none", "journal_integrity": "none"
    });
    let slot = &mut want["keyslots"]["0"];
    slot["key_size"] = json!(key_bits / 8);
    slot["area"]["encryption"] = json!("aes-xts-plain64");
    slot["area"]["key_size"] = json!(64);
    let area = (key_bits / 8 * 4000).div_ceil(4096) * 4096;
    slot["area"]["size"] = json!(area.to_string());
    let got = normalised(cs_json(&ours));
    assert_eq!(
        serde_json::to_string_pretty(&got).unwrap(),
        serde_json::to_string_pretty(&want).unwrap(),
        "{cipher} --integrity {integrity}"
    );
    // The dump cryptsetup prints from udm's header is udm's own.
    let cs_text = cs_dump(&ours);
    assert!(
        cs_text.contains(&format!("\tintegrity: {kind}\n")),
        "{cs_text}"
    );
    let ud_text = run_text(udm_cs().arg("luksDump").arg(&ours));
    assert_eq!(ud_text, cs_text);
    // The passphrase opens the keyslot for cryptsetup, and the volume key
    // it gives has the integrity key's bytes too.
    let vk = cs_volume_key(&ours, None, &key);
    assert_eq!(vk.len() as u64 * 8, key_bits);
    // The dm-integrity superblock at the data offset, as the kernel
    // writes it for cryptsetup: the tag size for this cipher, fix_padding.
    let off = got["segments"]["0"]["offset"]
        .as_str()
        .and_then(|s| s.parse::<u64>().ok())
        .expect("offset");
    let sb = pread(&ours, off, 512);
    assert_eq!(&sb[..8], b"integrt\0");
    assert_eq!(sb[8], 4, "superblock version 4 (fix_padding)");
    assert_eq!(
        u64::from(u16::from_le_bytes([sb[10], sb[11]])),
        tag_size(kind)
    );
    // --integrity-no-wipe: nothing written after the journal.
    let sections = u64::from(u32::from_le_bytes([sb[12], sb[13], sb[14], sb[15]]));
    assert!(sections > 0);
    assert!(pread(&ours, 48 << 20, 4096).iter().all(|&b| b == 0));
}

/// cryptsetup's `INTEGRITY_tag_size` for the combinations tested here.
fn tag_size(kind: &str) -> u64 {
    match kind {
        "hmac(sha256)" => 32,
        "hmac(sha512)" => 16 + 64,
        _ => 28,
    }
}

fn integrity_key_bits(integrity: &str) -> u64 {
    match integrity {
        "hmac-sha256" => 256,
        "hmac-sha512" => 512,
        _ => 0,
    }
}

#[test]
fn xts_hmac_sha256_header_is_cryptsetups() {
    same_as_cryptsetup("aes-xts-plain64", "hmac-sha256", "hmac(sha256)", 768);
}

#[test]
fn xts_random_hmac_sha512_header_is_cryptsetups() {
    same_as_cryptsetup("aes-xts-random", "hmac-sha512", "hmac(sha512)", 1024);
}

#[test]
fn gcm_and_chacha_headers_are_cryptsetups() {
    same_as_cryptsetup("aes-gcm-random", "aead", "aead", 256);
    same_as_cryptsetup("chacha20-random", "poly1305", "poly1305", 256);
}

#[test]
fn unsupported_integrity_is_refused_with_its_name() {
    let d = scratch("udm-luks-int");
    let key = write_file(d.path(), "key", b"pw");
    let img = sparse(d.path(), "v.img", 32 << 20);
    for (cipher, integrity, want) in [
        (
            "aes-xts-plain64",
            "crc32",
            "No known integrity specification",
        ),
        (
            "aes-cbc-essiv:sha256",
            "hmac-sha256",
            "not supported by udm",
        ),
        (
            "chacha20-poly1305-random",
            "aead",
            "--cipher chacha20-random",
        ),
    ] {
        let out = udm_cs()
            .args(["luksFormat", "-q", "--type", "luks2", "--cipher", cipher])
            .args(["--integrity", integrity, FAST_PBKDF[0], FAST_PBKDF[1]])
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .output()
            .expect("run udm");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{cipher} {integrity}");
        assert!(err.contains(want), "{cipher} {integrity}: {err}");
    }
    let out = udm_cs()
        .args([
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--integrity",
            "hmac-sha256",
        ])
        .arg("--key-file")
        .arg(&key)
        .arg(&img)
        .output()
        .expect("run udm");
    assert!(String::from_utf8_lossy(&out.stderr).contains("only for LUKS2"));
}

/// The script's stdout, which must have succeeded.
fn py_ok(sock: &Path, export: &str, code: &str) -> String {
    let o = nbd_py(sock, export, code);
    assert!(o.status.success(), "{}", show(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

struct Vol<'a> {
    img: &'a Path,
    key: &'a Path,
    ctl: std::path::PathBuf,
}

impl Vol<'_> {
    fn cs(&self, args: &[&str]) -> Output {
        udm_cs()
            .args(args)
            .arg("--control")
            .arg(&self.ctl)
            .output()
            .expect("run udm cryptsetup")
    }
    fn open(&self) {
        let o = udm_cs()
            .args(["open", "--key-file"])
            .arg(self.key)
            .arg(self.img)
            .arg("vol")
            .arg("--control")
            .arg(&self.ctl)
            .output()
            .unwrap();
        assert!(o.status.success(), "open: {}", show(&o));
    }
    /// Close, once the server has seen the last NBD client leave.
    fn close(&self) {
        let mut last = None;
        wait_for("close of vol", std::time::Duration::from_secs(10), || {
            let o = self.cs(&["close", "vol"]);
            let done = o.status.success();
            last = Some(o);
            done
        });
        let o = last.expect("a close");
        assert!(o.status.success(), "close: {}", show(&o));
    }
}

fn serve(d: &Path) -> UdmServe {
    let sock = d.join("nbd.sock");
    let _ = std::fs::remove_file(&sock);
    let ctl = d.join("ctl");
    UdmServe::start(&sock, &["--control", ctl.to_str().unwrap()])
}

/// The bytes one write changed on the image: the 4 KiB block of the data
/// area at the highest offset that mostly changed (the journal's copy
/// comes before the data areas, the tags are 32 to 80 bytes).
fn moved_block(before: &[u8], after: &[u8], data_off: usize) -> usize {
    let mut best = None;
    for (i, (a, b)) in before[data_off..]
        .chunks(4096)
        .zip(after[data_off..].chunks(4096))
        .enumerate()
    {
        if a.iter().zip(b).filter(|(x, y)| x != y).count() > 3500 {
            best = Some(data_off + i * 4096);
        }
    }
    best.expect("the written block on the image")
}

fn authenticated_volume_round_trip(cipher: &str, integrity: &str, kind: &str) {
    need("cryptsetup");
    let d = scratch("udm-luks-auth");
    let key = write_file(d.path(), "key", b"integrity passphrase");
    let img = sparse(d.path(), "v.img", 64 << 20);
    run(udm_cs()
        .args(["luksFormat", "-q", "--type", "luks2", "--cipher", cipher])
        .args(["--integrity", integrity, FAST_PBKDF[0], FAST_PBKDF[1]])
        .arg("--key-file")
        .arg(&key)
        .arg(&img));
    assert_eq!(run_text(udm_cs().arg("luksDump").arg(&img)), cs_dump(&img));
    let v = Vol {
        img: &img,
        key: &key,
        ctl: d.path().join("ctl"),
    };
    let srv = serve(d.path());
    v.open();
    let st = String::from_utf8_lossy(&v.cs(&["status", "vol"]).stdout).into_owned();
    for want in [
        format!("  cipher:  {cipher}\n"),
        format!("  integrity: {kind}\n"),
        format!("  device:  {}\n", img.display()),
        "  offset:  0 sectors\n".to_string(),
        "  sector size:  4096\n".to_string(),
    ] {
        assert!(st.contains(&want), "{want:?} in:\n{st}");
    }
    // The wipe left every sector authenticated: zeros read back.
    let size: u64 = py_ok(&srv.sock, "vol", "print(h.get_size())")
        .parse()
        .unwrap();
    assert!(size > 40 << 20 && size < 48 << 20, "{size}");
    let zeros = "assert h.pread(1 << 20, h.get_size() - (1 << 20)) == bytes(1 << 20)\nprint('ok')";
    assert_eq!(py_ok(&srv.sock, "vol", zeros), "ok");
    let write = "import random\nr = random.Random(7)\n\
                 h.pwrite(bytes(r.getrandbits(8) for _ in range(1 << 16)), 0)\nh.flush()\nprint('ok')";
    assert_eq!(py_ok(&srv.sock, "vol", write), "ok");
    v.close();
    let dm = |args: &[&str]| {
        udm()
            .arg("dmsetup")
            .arg("--control")
            .arg(&v.ctl)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        !dm(&["info", "vol_dif"]).status.success(),
        "close removes vol_dif"
    );
    v.open();
    let check = "import random\nr = random.Random(7)\n\
                 assert h.pread(1 << 16, 0) == bytes(r.getrandbits(8) for _ in range(1 << 16))\n\
                 print('same')";
    assert_eq!(py_ok(&srv.sock, "vol", check), "same");
    v.close();
    // One more block, to find its ciphertext on the image.
    let before = std::fs::read(&img).unwrap();
    v.open();
    let block = "h.pwrite(b'\\x5a' * 4096, 20 * 4096)\nh.flush()\nprint('ok')";
    assert_eq!(py_ok(&srv.sock, "vol", block), "ok");
    v.close();
    srv.stop();
    let after = std::fs::read(&img).unwrap();
    let at = moved_block(&before, &after, 16 << 20);
    let mut b = pread(&img, at as u64 + 1000, 1);
    b[0] ^= 0x04;
    pwrite(&img, at as u64 + 1000, &b);
    let srv = serve(d.path());
    v.open();
    let probe = concat!(
        "bad = []\n",
        "for s in range(16, 25):\n",
        "    try:\n",
        "        h.pread(4096, s * 4096)\n",
        "    except nbd.Error as e:\n",
        "        bad.append((s, e.errnum))\n",
        "print(bad)",
    );
    assert_eq!(py_ok(&srv.sock, "vol", probe), "[(20, 5)]");
    assert_eq!(py_ok(&srv.sock, "vol", check), "same");
    v.close();
    srv.stop();
}

#[test]
fn hmac_sha256_volume_opens_keeps_data_and_fails_a_changed_sector() {
    authenticated_volume_round_trip("aes-xts-plain64", "hmac-sha256", "hmac(sha256)");
}

#[test]
fn aes_gcm_volume_opens_keeps_data_and_fails_a_changed_sector() {
    authenticated_volume_round_trip("aes-gcm-random", "aead", "aead");
}

/// `udm serve --luks NAME=IMAGE` builds the same pair as `open`: the
/// default export is the volume, the integrity device is `NAME_dif`.
#[test]
fn serve_luks_maps_an_authenticated_volume_over_its_integrity_device() {
    let d = scratch("udm-luks-auth-serve");
    let key = write_file(d.path(), "key", b"integrity passphrase");
    let img = sparse(d.path(), "v.img", 32 << 20);
    run(udm_cs()
        .args([
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--cipher",
            "aes-gcm-random",
        ])
        .args(["--integrity", "aead", FAST_PBKDF[0], FAST_PBKDF[1]])
        .arg("--key-file")
        .arg(&key)
        .arg(&img));
    let sock = d.path().join("nbd.sock");
    let luks = format!("vol={}", img.display());
    let srv = UdmServe::start(
        &sock,
        &[
            "--no-control",
            "--luks",
            &luks,
            "--key-file",
            key.to_str().unwrap(),
        ],
    );
    let code = "h.pwrite(b'\\x11' * 8192, 4096)\nh.flush()\n\
                assert h.pread(8192, 4096) == b'\\x11' * 8192\n\
                assert h.pread(4096, 0) == bytes(4096)\nprint(h.get_size())";
    let size: u64 = py_ok(&sock, "", code).parse().unwrap();
    let dif: u64 = py_ok(&sock, "vol_dif", "print(h.get_size())")
        .parse()
        .unwrap();
    assert_eq!(size, dif);
    assert!(size > 12 << 20 && size < 16 << 20, "{size}");
    srv.stop();
}
