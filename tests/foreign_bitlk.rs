//! cryptsetup's own BitLocker images (the upstream suite's
//! `bitlk-images.tar.xz` and its `images.conf`, read from
//! `../shared/upstream/`, never copied here) through `udm cryptsetup`:
//! `bitlkDump` names each volume's GUID, and each volume opened on a
//! running `udm serve` with its passphrase, its recovery password, its
//! startup key (.BEK) or its clear key reads back over NBD with the
//! filesystem UUID and sha256 that `bitlk-compat-test` expects.
//!
//! The two volumes cryptsetup refuses (`bitlk-aes-xts-128-eow` and
//! `bitlk-partially-encrypted-aes-cbc-128`, both encrypt-on-write) must
//! be refused as cryptsetup refuses them, exit 1 and its message, with
//! udm's way out after it. With `--allow-partial-bitlk` udm maps such a
//! volume from its chunk map, which these images no longer hold (the
//! archive keeps only the sectors cryptsetup reads): as they are, they are
//! refused for that reason, and with a chunk map written into a copy
//! (the format's FVE-EOW blocks) they open read-only, crypt where the map
//! says encrypted and in the clear elsewhere, over `udm cryptsetup open`
//! and `udm serve` alike. FAILS if the upstream folder, nbdcopy or blkid
//! is missing.

mod common;

use common::foreign::*;
use common::*;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

/// Why a volume is expected not to open; None for volumes that must.
/// (Empty: the volumes cryptsetup refuses are checked to be refused the
/// same way, by [`refused_as_cryptsetup`].)
fn expected_failure(_file: &str) -> Option<&'static str> {
    None
}

/// The volumes cryptsetup 2.6.1 will not activate, with its message.
fn cryptsetup_refuses(file: &str) -> Option<&'static str> {
    (file.contains("eow") || file.contains("partially-encrypted"))
        .then_some("BITLK devices with type 'encrypt-on-write' cannot be activated.")
}

/// `open` of a volume cryptsetup refuses: exit 1 with cryptsetup's line
/// first, then udm's way out; with `--test-passphrase` too, since
/// cryptsetup refuses before it reads the passphrase.
fn refused_as_cryptsetup(
    dir: &Path,
    ctl: &Path,
    img: &str,
    input: &str,
    why: &str,
) -> Result<(), String> {
    for extra in [&["--test-passphrase"][..], &[img, "bl"][..]] {
        let mut a = vec!["open", "--type", "bitlk", "-r"];
        if extra.len() == 1 {
            a.push(img);
        }
        a.extend_from_slice(extra);
        let o = cs(dir, ctl, &a, input);
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.code() != Some(1)
            || err.lines().next() != Some(why)
            || !err.contains("--allow-partial-bitlk")
        {
            return Err(format!("{a:?}: {}", show(&o)));
        }
    }
    Ok(())
}

/// images.conf: one section per image, KEY=VALUE lines.
fn conf(dir: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("images.conf")).unwrap();
    let mut out = BTreeMap::new();
    let mut cur = String::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            cur = name.to_string();
            out.insert(cur.clone(), BTreeMap::new());
        } else if let Some((k, v)) = line.split_once('=') {
            if let Some(sec) = out.get_mut(&cur) {
                sec.insert(k.to_string(), v.to_string());
            }
        }
    }
    out
}

fn cs(dir: &Path, ctl: &Path, args: &[&str], input: &str) -> std::process::Output {
    cs_piped(dir, Some(ctl), args, input)
}

/// Open `img` with `args`/`input`, read it over NBD, close it: the
/// filesystem UUID and the sha256 of the whole device.
fn open_read(
    dir: &Path,
    ctl: &Path,
    srv: &UdmServe,
    img: &str,
    args: &[&str],
    input: &str,
) -> Result<(String, String), String> {
    let mut a = vec!["open", "--type", "bitlk", "-r"];
    a.extend_from_slice(args);
    a.extend([img, "bl"]);
    let o = cs(dir, ctl, &a, input);
    if !o.status.success() {
        return Err(show(&o));
    }
    let copy = copy_and_close(dir, ctl, srv, "bl")?;
    let found = (fs_uuid(&copy, 0), sha256_of(&copy));
    let _ = std::fs::remove_file(&copy);
    Ok(found)
}

#[test]
fn every_upstream_bitlocker_volume() {
    need("nbdcopy");
    need("blkid");
    need("sha256sum");
    let (keep, dir) = unpack_upstream("bitlk-images.tar.xz", "bitlk-images");
    let ctl = keep.path().join("ctl");
    let srv = UdmServe::start(
        &keep.path().join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    let mut bad = Vec::new();
    let (mut passed, mut refused) = (0, 0);
    for (name, v) in conf(&dir) {
        let img = format!("{name}.img");
        let get = |k: &str| v.get(k).cloned().unwrap_or_default();
        let o = cs(&dir, &ctl, &["bitlkDump", &img], "");
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if !o.status.success() || !text.contains(&format!("GUID:         \t{}\n", get("GUID"))) {
            bad.push(format!("bitlkDump {img}: {}", show(&o)));
            continue;
        }
        let mut ways: Vec<(Vec<String>, String)> = Vec::new();
        for k in ["PW", "RP", "RP2"] {
            if !get(k).is_empty() {
                ways.push((Vec::new(), get(k)));
            }
        }
        if name.contains("startup-key") {
            let bek = format!("{}.BEK", get("SK_VMK_GUID").to_uppercase());
            ways.push((vec!["--key-file".into(), bek], String::new()));
        }
        if name.contains("clearkey") {
            ways.push((Vec::new(), String::new()));
        }
        for (args, input) in ways {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let what = format!("{img} {a:?}");
            if let Some(why) = cryptsetup_refuses(&name) {
                match refused_as_cryptsetup(&dir, &ctl, &img, &input, why) {
                    Ok(()) => refused += 1,
                    Err(e) => {
                        bad.push(format!("{what}: not refused as cryptsetup refuses it: {e}"))
                    }
                }
                continue;
            }
            match (
                open_read(&dir, &ctl, &srv, &img, &a, &input),
                expected_failure(&name),
            ) {
                (Ok((uuid, sum)), None) if uuid == get("UUID") && sum == get("SHA256SUM") => {
                    passed += 1
                }
                (Ok((uuid, sum)), None) => bad.push(format!("{what}: UUID {uuid}, sha256 {sum}")),
                (Err(e), None) => bad.push(format!("{what}: {e}")),
                (Err(_), Some(why)) => report(&format!("bitlk {what}: expected failure ({why})")),
                (Ok(_), Some(_)) => {
                    bad.push(format!("{what}: opens now; drop it from expected_failure"))
                }
            }
        }
    }
    report(&format!(
        "bitlk: {passed} openings gave the expected UUID and sha256; \
         {refused} refused as cryptsetup refuses them"
    ));
    report(&bad.join("\n"));
    assert!(passed >= 20, "only {passed} openings passed");
    assert_eq!(
        refused, 4,
        "the two refused volumes, by passphrase and recovery password"
    );
    assert!(
        bad.is_empty(),
        "BitLocker volumes failed:\n{}",
        bad.join("\n")
    );
}

/// CRC-32 (IEEE), as the chunk map blocks carry it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Store `v` little-endian at `at`.
fn put(b: &mut [u8], at: usize, v: u64, width: usize) {
    b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

/// Size of the volume and its first chunk map offset (after the three
/// metadata offsets, at byte 200 of a non-To-Go volume).
fn volume_geometry(img: &Path) -> (u64, u64) {
    let head = pread(img, 0, 512);
    let le = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap());
    (std::fs::metadata(img).unwrap().len(), le(200))
}

/// Write a chunk map into `img` as an encrypt-on-write volume keeps it:
/// an FVE-EOW block at the volume's first chunk map offset naming one
/// FVE-EOWBM bitmap over the whole volume in `chunk`-byte chunks, whose
/// newer FVE-EOWBR record marks every chunk encrypted but those in
/// `clear` (the older record, all clear, must lose).
fn write_chunk_map(img: &Path, chunk: u64, clear: &[u64]) {
    write_hostile_chunk_map(img, chunk, clear, 1, 0)
}

/// [`write_chunk_map`] with the bitmap listed `listed` times in the
/// FVE-EOW block and counting `extra` bits past the volume's chunks.
fn write_hostile_chunk_map(img: &Path, chunk: u64, clear: &[u64], listed: usize, extra: u64) {
    let (size, eow) = volume_geometry(img);
    let (bitmap_at, log_at) = (eow + 4096, eow + 8192);
    let nbits = size.div_ceil(chunk) + extra;
    let rec_len = 36 + nbits.div_ceil(8) as usize;
    let eow_len = 56 + 8 * listed;
    let mut eow_block = vec![0u8; eow_len];
    eow_block[..8].copy_from_slice(b"FVE-EOW\0");
    for (at, v, w) in [
        (8, 56, 2),
        (10, eow_len as u64, 2),
        (12, 512, 4),
        (20, chunk, 4),
        (24, 4096, 4),
    ] {
        put(&mut eow_block, at, v, w);
    }
    for (at, v, w) in [(32, listed as u64, 4), (40, eow, 8)] {
        put(&mut eow_block, at, v, w);
    }
    for k in 0..listed {
        put(&mut eow_block, 56 + 8 * k, bitmap_at, 8);
    }
    let crc = crc32(&eow_block);
    put(&mut eow_block, 36, u64::from(crc), 4);
    let (r0, r1) = (64, 64 + rec_len);
    let mut bm = vec![0u8; 64 + 2 * rec_len];
    bm[..10].copy_from_slice(b"FVE-EOWBM\0");
    let bm_len = bm.len() as u64;
    for (at, v, w) in [(10, 60, 2), (12, bm_len, 4), (28, size, 8), (36, log_at, 8)] {
        put(&mut bm, at, v, w);
    }
    for (at, v, w) in [
        (44, r0 as u64, 4),
        (48, r1 as u64, 4),
        (52, rec_len as u64, 4),
    ] {
        put(&mut bm, at, v, w);
    }
    let crc = crc32(&bm[..r0]);
    put(&mut bm, 56, u64::from(crc), 4);
    for (at, seq, bits_set) in [(r0, 1, false), (r1, 2, true)] {
        let r = &mut bm[at..at + rec_len];
        r[..10].copy_from_slice(b"FVE-EOWBR\0");
        for (o, v, w) in [
            (10, 36, 2),
            (12, rec_len as u64, 4),
            (16, nbits, 4),
            (20, seq, 8),
        ] {
            put(r, o, v, w);
        }
        for i in 0..nbits {
            if bits_set && !clear.contains(&i) {
                r[36 + (i / 8) as usize] |= 1 << (i % 8);
            }
        }
        let crc = crc32(r);
        put(r, 32, u64::from(crc), 4);
    }
    pwrite(img, eow, &eow_block);
    pwrite(img, bitmap_at, &bm);
}

const CHUNK: u64 = 64 * 1024;
/// A chunk left in the clear with a pattern of its own, away from every
/// metadata area.
const CLEAR_CHUNK: u64 = 200;

/// `img` with a chunk map: encrypted but for [`CLEAR_CHUNK`] (a pattern
/// written there in the clear) and the chunks named in `clear`.
fn with_chunk_map(dir: &Path, img: &str, clear: &[u64]) -> (String, Vec<u8>) {
    let copy = format!("mapped-{img}");
    std::fs::copy(dir.join(img), dir.join(&copy)).unwrap();
    let pattern = bytes(28, 4096);
    pwrite(&dir.join(&copy), CLEAR_CHUNK * CHUNK, &pattern);
    let mut all = vec![CLEAR_CHUNK];
    all.extend_from_slice(clear);
    write_chunk_map(&dir.join(&copy), CHUNK, &all);
    (copy, pattern)
}

/// What a device copy must show: an NTFS boot sector at its start with
/// volume serial `serial` (the filesystem UUID blkid gives NTFS; these
/// images keep no MFT, so blkid itself finds nothing), and the clear
/// chunk's pattern as it is on the disk.
fn check_copy(copy: &Path, serial: &str, pattern: &[u8]) -> Result<(), String> {
    let boot = pread(copy, 0, 512);
    let mut sn: Vec<u8> = boot[0x48..0x50].to_vec();
    sn.reverse();
    let found = hex::encode_upper(&sn);
    if &boot[3..11] != b"NTFS    " || boot[510..] != [0x55, 0xaa] || found != serial {
        return Err(format!("boot sector {:?}, serial {found}", &boot[..16]));
    }
    if pread(copy, CLEAR_CHUNK * CHUNK, pattern.len()) != pattern {
        return Err("the clear chunk does not read as it is on the disk".into());
    }
    Ok(())
}

#[test]
fn partly_encrypted_volumes_open_with_allow_partial_bitlk() {
    need("nbdcopy");
    let (keep, dir) = unpack_upstream("bitlk-images.tar.xz", "bitlk-images");
    let ctl = keep.path().join("ctl");
    let srv = UdmServe::start(
        &keep.path().join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    let partial = "bitlk-partially-encrypted-aes-cbc-128.img";
    let eow = "bitlk-aes-xts-128-eow.img";
    let open = |img: &str| {
        let a = [
            "open",
            "--type",
            "bitlk",
            "--allow-partial-bitlk",
            img,
            "bl",
        ];
        cs(&dir, &ctl, &a, "anaconda")
    };
    // As the archive keeps them (no chunk map): refused, naming why.
    for img in [partial, eow] {
        let o = open(img);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.code() == Some(1) && err.contains("chunk map") && err.contains("FVE-EOW"),
            "{img}: {}",
            show(&o)
        );
    }
    // The partly encrypted volume, its boot sectors' home encrypted:
    // NTFS with the UUID images.conf gives it.
    let (img, pattern) = with_chunk_map(&dir, partial, &[]);
    let o = open(&img);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read-only"),
        "{}",
        show(&o)
    );
    let st = cs(&dir, &ctl, &["status", "bl"], "");
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("readonly"),
        "{}",
        show(&st)
    );
    let copy = copy_and_close(&dir, &ctl, &srv, "bl").unwrap();
    check_copy(&copy, "04E0BBC1E0BBB770", &pattern).unwrap();
    // The encrypt-on-write volume keeps its boot sectors in the clear
    // (35278848 is their home): its map says so, and they read as NTFS.
    let (img, pattern) = with_chunk_map(&dir, eow, &[35_278_848 / CHUNK]);
    let o = open(&img);
    assert!(o.status.success(), "{}", show(&o));
    let copy = copy_and_close(&dir, &ctl, &srv, "bl").unwrap();
    check_copy(&copy, "D85A03335A030E46", &pattern).unwrap();
    // Marked encrypted instead, the same sectors decrypt to noise.
    let (img, _) = with_chunk_map(&dir, eow, &[]);
    assert!(open(&img).status.success());
    let copy = copy_and_close(&dir, &ctl, &srv, "bl").unwrap();
    assert_ne!(&pread(&copy, 3, 8)[..], b"NTFS    ");
    drop(srv);

    // udm serve: refused without the option, served read-only with it.
    let kf = write_file(&dir, "pw", b"anaconda");
    let sock = keep.path().join("serve.sock");
    let (img, pattern) = with_chunk_map(&dir, partial, &[]);
    let vol = format!("bl={}", dir.join(&img).display());
    let os = |v: &[&str]| -> Vec<OsString> { v.iter().map(OsString::from).collect() };
    let mut args = os(&["--no-control", "--bitlk", &vol, "--key-file"]);
    args.push(kf.clone().into());
    serve_refused(&sock, &args, "--allow-partial-bitlk");
    args.push("--allow-partial-bitlk".into());
    let copy = keep.path().join("served.copy");
    served_read_only(&sock, &args, &copy, &pattern);

    // A crypttab bitlk line: refused without bitlk-partial, naming it;
    // with it served read-only, as with --allow-partial-bitlk.
    let ct = keep.path().join("crypttab");
    let sock = keep.path().join("crypttab.sock");
    let line = |opts: &str| format!("bl {} {} {opts}\n", dir.join(&img).display(), kf.display());
    let args = vec![
        OsString::from("--no-control"),
        "--crypttab".into(),
        ct.clone().into(),
    ];
    std::fs::write(&ct, line("bitlk")).unwrap();
    serve_refused(&sock, &args, "bitlk-partial to its crypttab line");
    std::fs::write(&ct, line("bitlk-partial")).unwrap();
    served_read_only(&sock, &args, &keep.path().join("crypttab.copy"), &pattern);
}

/// A chunk map may not make udm keep more bitmap than the volume has
/// chunks: one FVE-EOW block may list thousands of bitmap offsets, each
/// block up to 16 MiB, so a small image could ask for gigabytes (the
/// same bitmap listed again and again, or a bitmap counting chunks the
/// volume does not have). Both are refused, naming the chunk map.
#[test]
fn a_chunk_map_larger_than_the_volume_is_refused() {
    let (keep, dir) = unpack_upstream("bitlk-images.tar.xz", "bitlk-images");
    let ctl = keep.path().join("ctl");
    let _srv = UdmServe::start(
        &keep.path().join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    let partial = "bitlk-partially-encrypted-aes-cbc-128.img";
    let size = std::fs::metadata(dir.join(partial)).unwrap().len();
    for (name, listed, extra, want) in [
        ("twice", 2, 0, "twice"),
        (
            "wide",
            1,
            8 * size.div_ceil(CHUNK),
            "the chunk map is corrupt",
        ),
    ] {
        let copy = format!("{name}-{partial}");
        std::fs::copy(dir.join(partial), dir.join(&copy)).unwrap();
        write_hostile_chunk_map(&dir.join(&copy), CHUNK, &[], listed, extra);
        let a = [
            "open",
            "--type",
            "bitlk",
            "--allow-partial-bitlk",
            &copy,
            "bl",
        ];
        let o = cs(&dir, &ctl, &a, "anaconda");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(want) && err.contains("chunk"),
            "{name}: {}",
            show(&o)
        );
    }
}

/// `udm serve ARGS` on `sock` must fail, its error containing `way_out`.
fn serve_refused(sock: &Path, args: &[OsString], way_out: &str) {
    let o = udm()
        .args(["serve", "--socket"])
        .arg(sock)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(way_out), "{}", show(&o));
}

/// `udm serve ARGS` on `sock` serves `bl` as the partly encrypted volume
/// (copied out to `copy`, its clear chunk `pattern`), read-only.
fn served_read_only(sock: &Path, args: &[OsString], copy: &Path, pattern: &[u8]) {
    let srv = UdmServe::start(sock, args);
    run(Command::new("nbdcopy").arg(srv.uri("bl")).arg(copy));
    check_copy(copy, "04E0BBC1E0BBB770", pattern).unwrap();
    let w = Command::new("nbdcopy")
        .arg(copy)
        .arg(srv.uri("bl"))
        .output()
        .unwrap();
    assert!(!w.status.success(), "{args:?}: a write was accepted");
}
