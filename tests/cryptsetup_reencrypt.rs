//! LUKS2 reencryption interop with cryptsetup 2.6, both ways: one program
//! starts (`--init-only`, or a run stopped by SIGINT, SIGKILL or udm's test
//! hooks after some hotzones), the other resumes, recovers and finishes.
//! The data is checked at every step through udm's open path (a device in
//! reencryption maps its old and new segments with their own keys) and,
//! at the end, through cryptsetup alone: a copy decrypted by
//! `cryptsetup reencrypt --decrypt` must hold the plaintext.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::luks::{cryptsetup, cs_volume_key, py_crypt, FAST_PBKDF};
use common::*;
use serde_json::Value;
use udm::core::{BlockDevice, WriteBuf};

const PASS: &[u8] = b"reencrypt interop";
const HDR: u64 = 16 << 20;

struct Vol {
    dir: tempfile::TempDir,
    img: PathBuf,
    hdr: Option<PathBuf>,
    key: PathBuf,
    plain: Vec<u8>,
}

fn cs(args: &[&str], v: &Vol) {
    let mut c = cryptsetup();
    c.args(args).arg("--key-file").arg(&v.key).arg("-q");
    if let Some(h) = &v.hdr {
        c.arg("--header").arg(h);
    }
    c.arg(&v.img);
    run(&mut c);
}

fn udm_cs(args: &[&str], v: &Vol, env: &[(&str, &str)]) -> std::process::Output {
    let mut c = udm();
    c.arg("cryptsetup")
        .args(args)
        .arg("--key-file")
        .arg(&v.key)
        .arg("-q");
    if let Some(h) = &v.hdr {
        c.arg("--header").arg(h);
    }
    c.arg(&v.img);
    for (k, val) in env {
        c.env(k, val);
    }
    c.output().unwrap()
}

/// The volume's data area through udm's open path (any reencryption state).
fn udm_data(v: &Vol) -> Vec<u8> {
    let act = udm::luks::open(&v.img, v.hdr.as_deref(), PASS).expect("udm open");
    let lines = udm::core::table::parse(&act.table(v.img.to_str().unwrap())).unwrap();
    let dev = udm::mapper::build(&lines, &mut Files, &Default::default()).unwrap();
    let mut out = vec![0u8; dev.size() as usize];
    dev.read(0, &mut out).unwrap();
    out
}

fn udm_write(v: &Vol) {
    let act = udm::luks::open(&v.img, v.hdr.as_deref(), PASS).expect("udm open");
    let lines = udm::core::table::parse(&act.table(v.img.to_str().unwrap())).unwrap();
    let dev = udm::mapper::build(&lines, &mut Files, &Default::default()).unwrap();
    assert_eq!(dev.size(), v.plain.len() as u64);
    dev.write(0, WriteBuf::Borrowed(&v.plain), false).unwrap();
    dev.flush().unwrap();
}

/// A LUKS2 volume made by cryptsetup (`data` bytes of data, header on the
/// device or detached) holding random plaintext written through udm.
fn volume(data: usize, detached: bool, extra: &[&str]) -> Vol {
    let dir = scratch("reenc");
    let key = dir.path().join("key");
    std::fs::write(&key, PASS).unwrap();
    let img = dir.path().join("disk.img");
    let hdr = detached.then(|| dir.path().join("hdr.img"));
    let size = data as u64 + if detached { 0 } else { HDR };
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let v = Vol {
        img,
        hdr,
        key,
        plain: fast_bytes(data as u64, data),
        dir,
    };
    let mut args = vec!["luksFormat", "--type", "luks2"];
    args.extend(FAST_PBKDF);
    args.extend(extra);
    cs(&args, &v);
    udm_write(&v);
    v
}

fn dump(v: &Vol) -> Value {
    let mut c = cryptsetup();
    c.args(["luksDump", "--dump-json-metadata"]);
    c.arg(v.hdr.as_ref().unwrap_or(&v.img));
    serde_json::from_str(&run_text(&mut c)).unwrap()
}

fn in_reencryption(j: &Value) -> bool {
    j["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .any(|k| k["type"] == "reencrypt")
}

/// Regular (non-backup) segments of a header.
fn regular_segments(j: &Value) -> usize {
    j["segments"]
        .as_object()
        .unwrap()
        .values()
        .filter(|s| {
            !s["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x.as_str().unwrap().starts_with("backup")))
        })
        .count()
}

/// The data as cryptsetup sees it, without udm: with a detached header,
/// `cryptsetup reencrypt --decrypt` of a copy leaves the plaintext in
/// place. With the header on the device cryptsetup 2.6 cannot decrypt a
/// re-keyed volume offline (its data-shift decryption refuses the
/// re-keyed keyslot layout), so there the volume key cryptsetup reports
/// (`luksDump --dump-volume-key`) decrypts the data area with the
/// independent Python dm-crypt implementation.
fn cs_data(v: &Vol) -> Vec<u8> {
    let d = v.dir.path();
    let j = dump(v);
    let seg = &j["segments"]["0"];
    if v.hdr.is_none() {
        let key = cs_volume_key(&v.img, None, &v.key);
        let off: u64 = seg["offset"].as_str().unwrap().parse().unwrap();
        let ct = pread(&v.img, off, v.plain.len());
        return py_crypt(
            d,
            "dec",
            seg["encryption"].as_str().unwrap(),
            &key,
            seg["sector_size"].as_u64().unwrap() as u32,
            0,
            &ct,
        );
    }
    let img = d.join("cs_copy.img");
    std::fs::copy(&v.img, &img).unwrap();
    let hdr = d.join("cs_copy.hdr");
    std::fs::copy(v.hdr.as_ref().unwrap(), &hdr).unwrap();
    run(cryptsetup()
        .args([
            "reencrypt",
            "--decrypt",
            "-q",
            "--force-offline-reencrypt",
            "--header",
        ])
        .arg(&hdr)
        .arg("--key-file")
        .arg(&v.key)
        .arg(&img));
    let out = pread(&img, 0, v.plain.len());
    std::fs::remove_file(&img).unwrap();
    out
}

fn assert_finished(v: &Vol) {
    let j = dump(v);
    assert!(!in_reencryption(&j), "still in reencryption: {j:#}");
    assert!(j["config"].get("requirements").is_none(), "{j:#}");
    assert_eq!(regular_segments(&j), 1);
    assert!(
        udm_data(v) == v.plain,
        "udm reads other data after reencryption"
    );
}

/// cryptsetup resumes (and finishes) what is in progress on `v`.
fn cs_finishes(v: &Vol) {
    cs(
        &["reencrypt", "--resume-only", "--force-offline-reencrypt"],
        v,
    );
}

/// [`assert_finished`], and the data also reads back through cryptsetup
/// alone.
fn assert_finished_both(v: &Vol) {
    assert_finished(v);
    assert!(cs_data(v) == v.plain, "cryptsetup reads other data");
}

/// A running `udm serve` with a control socket and `v` opened on it as
/// `vol` by `udm cryptsetup open` (`extra`: its options).
fn served(v: &Vol, extra: &[&str]) -> (UdmServe, PathBuf) {
    let d = v.dir.path();
    let ctl = d.join("ctl");
    let srv = UdmServe::start(
        &d.join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    let o = udm()
        .args(["cryptsetup", "open", "--key-file"])
        .arg(&v.key)
        .args(extra)
        .arg(&v.img)
        .arg("vol")
        .env("UDM_CONTROL", &ctl)
        .output()
        .unwrap();
    check_ok(&o);
    (srv, ctl)
}

fn check_ok(o: &std::process::Output) {
    assert!(o.status.success(), "{}", show(o));
}

/// Start cryptsetup reencrypt and signal it once the header shows a state
/// `ready` accepts (polled on the primary JSON area).
fn cs_interrupted(v: &Vol, args: &[&str], sig: i32, ready: impl Fn(&str) -> bool) {
    let mut c = cryptsetup();
    c.args(["reencrypt", "-q", "--force-offline-reencrypt"])
        .args(args)
        .arg("--key-file")
        .arg(&v.key)
        .arg(&v.img);
    interrupted(v, c, sig, ready);
}

/// Run `c` and send it `sig` once the header of `v` satisfies `ready`.
fn interrupted(
    v: &Vol,
    c: std::process::Command,
    sig: i32,
    ready: impl Fn(&str) -> bool,
) -> std::process::ExitStatus {
    try_interrupt(v, c, sig, ready)
        .unwrap_or_else(|s| panic!("it ended ({s}) before it could be interrupted"))
}

/// [`interrupted`], or Err(status) if the program ended before the header
/// showed the wanted state (a loaded machine can miss a short state).
fn try_interrupt(
    v: &Vol,
    mut c: std::process::Command,
    sig: i32,
    ready: impl Fn(&str) -> bool,
) -> Result<std::process::ExitStatus, std::process::ExitStatus> {
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let start = Instant::now();
    loop {
        let meta = v.hdr.as_ref().unwrap_or(&v.img);
        // A header file the program has not written (whole) yet reads as
        // empty.
        let whole = std::fs::metadata(meta).is_ok_and(|m| m.len() >= 4096 + 12288);
        let json = if whole {
            String::from_utf8_lossy(&pread(meta, 4096, 12288)).into_owned()
        } else {
            String::new()
        };
        if ready(&json) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the program never reached the wanted state"
        );
        if let Some(s) = child.try_wait().unwrap() {
            return Err(s);
        }
    }
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, sig) };
    Ok(child.wait().unwrap())
}

fn progress_started(json: &str) -> bool {
    // A post table after the first hotzone: the new segment has a fixed size.
    json.contains("online-reencrypt") && !json.contains("in-reencryption") && {
        let v: Result<Value, _> = serde_json::from_str(json.trim_end_matches('\0'));
        v.is_ok_and(|j| in_reencryption(&j) && regular_segments(&j) == 2)
    }
}

#[test]
fn cryptsetup_init_only_then_udm_finishes_new_cipher() {
    let v = volume(4 << 20, false, &[]);
    cs(
        &[
            "reencrypt",
            "--init-only",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key-size",
            "256",
        ],
        &v,
    );
    assert!(in_reencryption(&dump(&v)));
    assert!(udm_data(&v) == v.plain, "initialised, nothing moved yet");
    // udm stops after two hotzones: old and new segments both mapped.
    let o = udm_cs(
        &["reencrypt", "--hotzone-size", "256K"],
        &v,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "2")],
    );
    check_ok(&o);
    let j = dump(&v);
    assert!(in_reencryption(&j) && regular_segments(&j) == 2, "{j:#}");
    assert!(
        udm_data(&v) == v.plain,
        "half-reencrypted device reads back"
    );
    check_ok(&udm_cs(&["reencrypt", "--resume-only"], &v, &[]));
    assert_finished(&v);
    assert_eq!(
        dump(&v)["segments"]["0"]["encryption"],
        "aes-cbc-essiv:sha256"
    );
    assert!(cs_data(&v) == v.plain, "cryptsetup decrypts udm's result");
}

#[test]
fn cryptsetup_sigint_then_udm_resumes() {
    let v = volume(24 << 20, false, &[]);
    cs_interrupted(
        &v,
        &["--hotzone-size", "64K", "--resilience", "journal"],
        2,
        progress_started,
    );
    let j = dump(&v);
    assert!(in_reencryption(&j), "SIGINT left resumable metadata");
    assert!(udm_data(&v) == v.plain, "interrupted by SIGINT: reads back");
    check_ok(&udm_cs(&["reencrypt", "--resume-only"], &v, &[]));
    assert_finished_both(&v);
}

#[test]
fn cryptsetup_sigkill_in_hotzone_then_udm_recovers() {
    let v = volume(32 << 20, false, &[]);
    let start = v.dir.path().join("start.img");
    std::fs::copy(&v.img, &start).unwrap();
    // Kill cryptsetup while a hotzone is committed as hot (checksums on
    // disk, data half written); a kill that lands just after the hotzone
    // is retried from the start.
    let mut crashed = false;
    for _ in 0..8 {
        std::fs::copy(&start, &v.img).unwrap();
        cs_interrupted(&v, &["--hotzone-size", "8M"], 9, |j| {
            j.contains("in-reencryption")
        });
        let j = dump(&v);
        assert!(in_reencryption(&j));
        if serde_json::to_string(&j)
            .unwrap()
            .contains("in-reencryption")
        {
            crashed = true;
            break;
        }
    }
    assert!(crashed, "SIGKILL never landed inside a hotzone");
    // udm refuses to map a crashed hotzone; `repair` recovers it (as
    // cryptsetup's), after which the data reads back and udm finishes.
    assert!(udm::luks::open(&v.img, None, PASS).is_err());
    let twin = v.dir.path().join("twin.img");
    std::fs::copy(&v.img, &twin).unwrap();
    check_ok(&udm_cs(&["repair"], &v, &[]));
    assert!(!serde_json::to_string(&dump(&v))
        .unwrap()
        .contains("in-reencryption"));
    assert!(udm_data(&v) == v.plain, "recovered hotzone reads back");
    check_ok(&udm_cs(&["reencrypt"], &v, &[]));
    assert_finished(&v);
    // The same crash, recovered by a plain resume.
    std::fs::copy(&twin, &v.img).unwrap();
    check_ok(&udm_cs(&["reencrypt"], &v, &[]));
    assert_finished_both(&v);
}

#[test]
fn udm_init_only_matches_cryptsetup_and_cryptsetup_finishes() {
    let v = volume(4 << 20, false, &[]);
    // The same header initialised by each program: equal but for salts,
    // digests and the digest iteration counts.
    let twin = v.dir.path().join("twin.img");
    std::fs::copy(&v.img, &twin).unwrap();
    check_ok(&udm_cs(
        &["reencrypt", "--init-only", "--resilience", "checksum"],
        &v,
        &[],
    ));
    run(cryptsetup()
        .args(["reencrypt", "--init-only", "-q", "--key-file"])
        .arg(&v.key)
        .arg(&twin));
    assert_eq!(normalised(dump(&v)), normalised(dump_of(&twin)));
    assert!(udm_data(&v) == v.plain);
    cs_finishes(&v);
    assert_finished_both(&v);
}

#[test]
fn udm_stopped_or_crashed_then_cryptsetup_finishes() {
    for (hook, resilience, extra) in [
        ("UDM_TEST_REENCRYPT_STOP_AFTER", "checksum", &[][..]),
        ("UDM_TEST_REENCRYPT_STOP_AFTER", "none", &[][..]),
        (
            "UDM_TEST_REENCRYPT_STOP_AFTER",
            "journal",
            &["--sector-size", "512", "--key-size", "256"][..],
        ),
        ("UDM_TEST_REENCRYPT_CRASH_IN", "checksum", &[][..]),
        ("UDM_TEST_REENCRYPT_CRASH_IN", "journal", &[][..]),
    ] {
        let v = volume(4 << 20, false, &[]);
        let mut args = vec![
            "reencrypt",
            "--hotzone-size",
            "512K",
            "--resilience",
            resilience,
        ];
        args.extend(extra);
        let o = udm_cs(&args, &v, &[(hook, "3")]);
        let crashed = hook.ends_with("CRASH_IN");
        assert_eq!(o.status.success(), !crashed, "{}", show(&o));
        let j = dump(&v);
        assert!(in_reencryption(&j));
        assert_eq!(
            serde_json::to_string(&j)
                .unwrap()
                .contains("in-reencryption"),
            crashed
        );
        if crashed {
            // cryptsetup recovers an interrupted hotzone with `repair`.
            cs(&["repair"], &v);
        }
        assert!(
            udm_data(&v) == v.plain,
            "3 hotzones reencrypted: reads back"
        );
        cs_finishes(&v);
        assert_finished_both(&v);
    }
}

#[test]
fn decrypt_both_ways_detached_header() {
    // cryptsetup starts, udm finishes.
    let v = volume(4 << 20, true, &[]);
    cs(
        &[
            "reencrypt",
            "--decrypt",
            "--init-only",
            "--force-offline-reencrypt",
        ],
        &v,
    );
    assert!(udm_data(&v) == v.plain);
    check_ok(&udm_cs(&["reencrypt", "--hotzone-size", "1M"], &v, &[]));
    assert!(
        pread(&v.img, 0, v.plain.len()) == v.plain,
        "plaintext on the device"
    );
    assert!(!in_reencryption(&dump(&v)));
    // udm starts and stops, cryptsetup finishes.
    let v = volume(4 << 20, true, &[]);
    let o = udm_cs(
        &["reencrypt", "--decrypt", "--hotzone-size", "512K"],
        &v,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "2")],
    );
    check_ok(&o);
    assert!(in_reencryption(&dump(&v)));
    assert!(udm_data(&v) == v.plain, "half-decrypted device reads back");
    cs_finishes(&v);
    assert!(pread(&v.img, 0, v.plain.len()) == v.plain);
}

#[test]
fn encrypt_detached_header_both_ways() {
    for udm_starts in [true, false] {
        let dir = scratch("reenc-enc");
        let key = dir.path().join("key");
        std::fs::write(&key, PASS).unwrap();
        let plain = fast_bytes(7, 4 << 20);
        let img = write_file(dir.path(), "disk.img", &plain);
        let v = Vol {
            hdr: Some(dir.path().join("hdr.img")),
            img,
            key,
            plain,
            dir,
        };
        let mut args = vec![
            "reencrypt",
            "--encrypt",
            "--type",
            "luks2",
            "--hotzone-size",
            "512K",
        ];
        args.extend(FAST_PBKDF);
        if udm_starts {
            check_ok(&udm_cs(
                &args,
                &v,
                &[("UDM_TEST_REENCRYPT_STOP_AFTER", "3")],
            ));
            assert!(in_reencryption(&dump(&v)));
            assert!(udm_data(&v) == v.plain);
            cs_finishes(&v);
        } else {
            args.push("--init-only");
            cs(&args, &v);
            assert!(udm_data(&v) == v.plain);
            check_ok(&udm_cs(&["reencrypt"], &v, &[]));
        }
        assert_finished_both(&v);
    }
}

/// A volume stopped half-way through reencryption, opened by `udm
/// cryptsetup open` on a running server (the multi-segment table), serves
/// the plaintext to an NBD client, takes writes on both sides of the
/// boundary, and cryptsetup finishes the reencryption with them.
#[test]
fn half_reencrypted_volume_served_over_nbd() {
    need("nbdcopy");
    let mut v = volume(4 << 20, false, &[]);
    let o = udm_cs(
        &["reencrypt", "--hotzone-size", "1M"],
        &v,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "2")],
    );
    check_ok(&o);
    assert_eq!(regular_segments(&dump(&v)), 2);
    let d = v.dir.path().to_path_buf();
    let (srv, _ctl) = served(&v, &[]);
    let out = d.join("out.bin");
    run(std::process::Command::new("nbdcopy")
        .arg(srv.uri("vol"))
        .arg(&out));
    assert!(std::fs::read(&out).unwrap() == v.plain, "served plaintext");
    // New data across the old/new boundary (at 2 MiB).
    v.plain = fast_bytes(99, v.plain.len());
    let src = write_file(&d, "new.bin", &v.plain);
    run(std::process::Command::new("nbdcopy")
        .arg(&src)
        .arg(srv.uri("vol")));
    srv.stop();
    assert!(udm_data(&v) == v.plain);
    cs_finishes(&v);
    assert_finished_both(&v);
}

/// Online: the volume is served (`udm cryptsetup open` on a running
/// server) while `udm cryptsetup reencrypt --active-name` moves it hotzone
/// by hotzone, suspending the device around each and loading its new
/// multi-segment table after; an NBD client writing and reading random
/// blocks the whole time always reads what it wrote. cryptsetup then sees
/// a finished volume holding the client's data.
#[test]
fn online_reencryption_while_an_nbd_client_writes() {
    need_python_module("nbd", "python3-libnbd");
    let mut v = volume(16 << 20, false, &[]);
    let d = v.dir.path().to_path_buf();
    let (srv, ctl) = served(&v, &[]);
    let initial = write_file(&d, "initial.bin", &v.plain);
    let (stop, model) = (d.join("stop"), d.join("model.bin"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/luks/nbd_model_io.py");
    let client = std::process::Command::new(PYTHON)
        .arg(script)
        .arg(srv.uri("vol"))
        .arg(&initial)
        .arg(&stop)
        .arg(&model)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = udm_cs(
        &[
            "reencrypt",
            "--active-name",
            "vol",
            "--hotzone-size",
            "64K",
            "--cipher",
            "serpent-xts-plain64",
        ],
        &v,
        &[("UDM_CONTROL", ctl.to_str().unwrap())],
    );
    std::fs::write(&stop, b"").unwrap();
    let c = client.wait_with_output().unwrap();
    check_ok(&o);
    assert!(c.status.success(), "NBD client: {}", show(&c));
    let ops: u64 = String::from_utf8_lossy(&c.stdout).trim().parse().unwrap();
    assert!(ops >= 50, "{ops}");
    eprintln!("NBD client: {ops} checked operations during the reencryption");
    v.plain = std::fs::read(&model).unwrap();
    let o = udm()
        .args(["dmsetup", "table", "vol"])
        .env("UDM_CONTROL", &ctl)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        table.lines().count() == 1 && table.contains("serpent-xts-plain64"),
        "live table after reencryption: {table}"
    );
    srv.stop();
    assert_finished_both(&v);
}

/// SIGINT stops udm after the current hotzone: exit 0, resumable
/// metadata, data readable; cryptsetup finishes.
#[test]
fn udm_sigint_then_cryptsetup_finishes() {
    let v = volume(32 << 20, false, &[]);
    let mut c = udm();
    c.args([
        "cryptsetup",
        "reencrypt",
        "-q",
        "--hotzone-size",
        "64K",
        "--key-file",
    ])
    .arg(&v.key)
    .arg(&v.img);
    let st = interrupted(&v, c, libc::SIGINT, progress_started);
    assert!(st.success(), "{st}");
    let j = dump(&v);
    assert!(in_reencryption(&j) && regular_segments(&j) == 2, "{j:#}");
    assert!(udm_data(&v) == v.plain);
    cs_finishes(&v);
    assert_finished_both(&v);
}

// ---- Encryption with data shift (`--encrypt --reduce-device-size`). ----

/// A plaintext device of `size` bytes whose first `size - reduce` bytes
/// are random data (what `--reduce-device-size` keeps).
fn plain_device(size: usize, reduce: usize) -> Vol {
    let dir = scratch("reenc-shift");
    let key = dir.path().join("key");
    std::fs::write(&key, PASS).unwrap();
    let img = dir.path().join("disk.img");
    let plain = fast_bytes(size as u64 ^ 0x5a, size - reduce);
    let mut all = plain.clone();
    all.extend(fast_bytes(7, reduce));
    std::fs::write(&img, &all).unwrap();
    Vol {
        img,
        hdr: None,
        key,
        plain,
        dir,
    }
}

/// The plaintext through udm's open path: during the run the mapping is
/// exactly the plaintext's size; once finished it is the shift larger.
fn assert_udm_reads_plain(v: &Vol, what: &str) {
    let d = udm_data(v);
    assert!(
        d.len() >= v.plain.len() && d[..v.plain.len()] == v.plain[..],
        "{what}: udm reads other data"
    );
}

/// Finished: one encrypted segment, no reencryption metadata, the data
/// reads back through udm and through cryptsetup's volume key with the
/// Python dm-crypt reference, and the moved copy of the plaintext's
/// start (the device's last `shift` bytes) is gone.
fn assert_shift_finished(v: &Vol, shift: usize) {
    let j = dump(v);
    assert!(!in_reencryption(&j), "still in reencryption: {j:#}");
    assert!(j["config"].get("requirements").is_none(), "{j:#}");
    assert_eq!(regular_segments(&j), 1);
    assert_eq!(j["segments"]["0"]["offset"], shift.to_string());
    assert_eq!(j["segments"]["0"]["size"], "dynamic");
    assert_udm_reads_plain(v, "finished");
    assert!(
        cs_data(v) == v.plain,
        "cryptsetup's key decrypts other data"
    );
    let len = std::fs::metadata(&v.img).unwrap().len();
    let tail = pread(&v.img, len - shift as u64, shift.min(v.plain.len()));
    assert!(
        tail[..] != v.plain[..tail.len()],
        "the moved plaintext is still on the device"
    );
}

fn shift_args(reduce: &str) -> Vec<&str> {
    let mut a = vec!["reencrypt", "--encrypt", "--reduce-device-size", reduce];
    a.extend(FAST_PBKDF);
    a
}

/// A header after at least one hotzone of a data shift: some data
/// encrypted, none in flight.
fn shift_started(json: &str) -> bool {
    json.contains("online-reencrypt") && !json.contains("in-reencryption") && {
        let v: Result<Value, _> = serde_json::from_str(json.trim_end_matches('\0'));
        v.is_ok_and(|j| {
            in_reencryption(&j)
                && j["segments"].as_object().unwrap().values().any(|s| {
                    s["type"] == "crypt" && s.get("flags").is_none() && s["size"] != "dynamic"
                })
        })
    }
}

/// cryptsetup starts (`--init-only`, and a run stopped by SIGINT after a
/// few hotzones), udm resumes and finishes.
#[test]
fn data_shift_cryptsetup_starts_udm_finishes() {
    let v = plain_device(24 << 20, 8 << 20);
    let mut a = shift_args("8M");
    a.push("--init-only");
    cs(&a, &v);
    let j = dump(&v);
    assert!(in_reencryption(&j));
    assert_udm_reads_plain(&v, "after cryptsetup --init-only");
    // udm stops after one hotzone, then finishes.
    check_ok(&udm_cs(
        &["reencrypt", "--resume-only"],
        &v,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "1")],
    ));
    assert!(in_reencryption(&dump(&v)));
    assert_udm_reads_plain(&v, "one hotzone by udm");
    check_ok(&udm_cs(&["reencrypt", "--resume-only"], &v, &[]));
    assert_shift_finished(&v, 4 << 20);

    // A 1 MiB reduction: 512 KiB hotzones, interrupted mid-run.
    let v = plain_device(48 << 20, 1 << 20);
    let mut c = cryptsetup();
    c.args(["reencrypt", "-q", "--hotzone-size", "64K"])
        .args(shift_args("1M").iter().skip(1))
        .arg("--key-file")
        .arg(&v.key)
        .arg(&v.img);
    interrupted(&v, c, libc::SIGINT, shift_started);
    let j = dump(&v);
    assert!(in_reencryption(&j), "SIGINT left resumable metadata");
    assert!(regular_segments(&j) >= 3, "{j:#}");
    assert_udm_reads_plain(&v, "cryptsetup interrupted by SIGINT");
    check_ok(&udm_cs(&["reencrypt", "--resume-only"], &v, &[]));
    assert_shift_finished(&v, 512 << 10);
}

/// udm starts: its `--init-only` header equals cryptsetup's (but for
/// salts, digests and iterations), and a udm run stopped after a few
/// hotzones, or crashed inside one, is finished by cryptsetup (after its
/// `repair` for the crash) or by udm.
#[test]
fn data_shift_udm_starts_cryptsetup_finishes() {
    let v = plain_device(24 << 20, 8 << 20);
    let twin = v.dir.path().join("twin.img");
    std::fs::copy(&v.img, &twin).unwrap();
    let mut a = shift_args("8M");
    a.push("--init-only");
    check_ok(&udm_cs(&a, &v, &[]));
    run(cryptsetup()
        .args(&a)
        .args(["-q", "--key-file"])
        .arg(&v.key)
        .arg(&twin));
    assert_eq!(normalised(dump(&v)), normalised(dump_of(&twin)));
    // Both moved the plaintext's start to the same place.
    assert!(std::fs::read(&v.img).unwrap()[4 << 20..] == std::fs::read(&twin).unwrap()[4 << 20..]);
    assert_udm_reads_plain(&v, "after udm --init-only");
    cs_finishes(&v);
    assert_shift_finished(&v, 4 << 20);

    for (hook, n) in [
        ("UDM_TEST_REENCRYPT_STOP_AFTER", "2"),
        ("UDM_TEST_REENCRYPT_CRASH_IN", "2"),
        ("UDM_TEST_REENCRYPT_CRASH_IN", "3"),
    ] {
        let v = plain_device(32 << 20, 4 << 20);
        let o = udm_cs(&shift_args("4M"), &v, &[(hook, n)]);
        let crashed = hook.ends_with("CRASH_IN");
        assert_eq!(o.status.success(), !crashed, "{}", show(&o));
        let j = dump(&v);
        assert!(in_reencryption(&j));
        let hot = serde_json::to_string(&j)
            .unwrap()
            .contains("in-reencryption");
        assert_eq!(hot, crashed, "{j:#}");
        let twin = v.dir.path().join("twin.img");
        std::fs::copy(&v.img, &twin).unwrap();
        if crashed {
            // udm refuses to map a crashed hotzone; cryptsetup's repair
            // redoes it.
            assert!(udm::luks::open(&v.img, None, PASS).is_err());
            cs(&["repair"], &v);
        }
        assert_udm_reads_plain(&v, hook);
        cs_finishes(&v);
        assert_shift_finished(&v, 2 << 20);
        // The same state finished by udm (recovering the hotzone itself).
        std::fs::copy(&twin, &v.img).unwrap();
        check_ok(&udm_cs(&["reencrypt", "--resume-only"], &v, &[]));
        assert_shift_finished(&v, 2 << 20);
    }
}

// ---- shared steps of the tests below ----

/// Either program's `reencrypt` on `img` (with `hdr` when given), the key
/// file or a passphrase pipe, and extra `env`; the raw output.
fn reenc_cmd(
    udm_side: bool,
    args: &[&str],
    img: &std::path::Path,
    hdr: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
    stdin: Option<&[u8]>,
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut c = if udm_side {
        let mut c = udm();
        c.arg("cryptsetup");
        c
    } else {
        cryptsetup()
    };
    c.arg("reencrypt")
        .args(args)
        .args(["-q", "--force-offline-reencrypt"]);
    if let Some(k) = key {
        c.arg("--key-file").arg(k);
    }
    if let Some(h) = hdr {
        c.arg("--header").arg(h);
    }
    c.arg(img);
    for (k, val) in env {
        c.env(k, val);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(s).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// [`reenc_cmd`] on `t` (its image, header and key file).
fn reenc_on(udm_side: bool, args: &[&str], t: &Vol, env: &[(&str, &str)]) -> std::process::Output {
    reenc_cmd(
        udm_side,
        args,
        &t.img,
        t.hdr.as_deref(),
        Some(&t.key),
        None,
        env,
    )
}

fn dump_of(path: &std::path::Path) -> Value {
    let mut c = cryptsetup();
    c.args(["luksDump", "--dump-json-metadata"]).arg(path);
    serde_json::from_str(&run_text(&mut c)).unwrap()
}

/// A header with salts, digests and benchmarked iterations blanked.
fn normalised(mut j: Value) -> String {
    for group in ["keyslots", "digests"] {
        for (_, o) in j[group].as_object_mut().unwrap() {
            for k in ["salt", "digest", "iterations"] {
                if o.get(k).is_some() {
                    o[k] = Value::Null;
                }
            }
            if let Some(kdf) = o.get_mut("kdf") {
                kdf["salt"] = Value::Null;
            }
        }
    }
    serde_json::to_string_pretty(&j).unwrap()
}

/// A copy of `v`'s image (and header) under `name`.
fn twin(v: &Vol, name: &str) -> Vol {
    let img = v.dir.path().join(format!("{name}.img"));
    std::fs::copy(&v.img, &img).unwrap();
    let hdr = v.hdr.as_ref().map(|h| {
        let t = v.dir.path().join(format!("{name}.hdr"));
        std::fs::copy(h, &t).unwrap();
        t
    });
    Vol {
        dir: scratch("reenc-twin"),
        img,
        hdr,
        key: v.key.clone(),
        plain: v.plain.clone(),
    }
}

// ---- decryption with data shift (header on the device) ----

/// The detached header a decryption with data shift starts from.
fn with_header(v: &Vol, name: &str) -> Vol {
    let mut t = twin(v, name);
    let h = v.dir.path().join(format!("{name}.newhdr"));
    let _ = std::fs::remove_file(&h);
    t.hdr = Some(h);
    t
}

/// Finished: the plaintext at byte 0 of the device, the detached header
/// holds one linear segment and no reencryption metadata.
fn assert_unshift_finished(v: &Vol, what: &str) {
    let j = dump(v);
    assert!(!in_reencryption(&j), "{what}: still in reencryption: {j:#}");
    assert!(j["config"].get("requirements").is_none(), "{what}: {j:#}");
    assert_eq!(regular_segments(&j), 1, "{what}: {j:#}");
    assert_eq!(j["segments"]["0"]["type"], "linear", "{what}");
    assert_eq!(j["segments"]["0"]["offset"], "0", "{what}");
    assert!(
        pread(&v.img, 0, v.plain.len()) == v.plain,
        "{what}: the plaintext is not at byte 0"
    );
}

/// cryptsetup starts a decryption of a volume whose header is on the
/// device (`--init-only`: header exported, first segment moved), udm
/// stops after one hotzone, resumes and finishes; the data reads back at
/// every step.
#[test]
fn decrypt_with_data_shift_cryptsetup_starts_udm_finishes() {
    let v = volume(40 << 20, false, &[]);
    for resilience in ["checksum", "journal"] {
        let t = with_header(&v, resilience);
        let hdr = t.hdr.as_deref().unwrap();
        let mut args = vec!["--decrypt", "--init-only", "--resilience", resilience];
        if resilience == "journal" {
            args.extend(["--hotzone-size", "8M"]);
        }
        let o = reenc_cmd(false, &args, &t.img, Some(hdr), Some(&t.key), None, &[]);
        check_ok(&o);
        let j = dump(&t);
        let ks = j["keyslots"]
            .as_object()
            .unwrap()
            .values()
            .find(|k| k["type"] == "reencrypt")
            .unwrap()
            .clone();
        assert_eq!(ks["area"]["type"], format!("datashift-{resilience}"));
        assert_eq!(ks["direction"], "forward");
        assert_eq!(
            j["config"]["requirements"]["mandatory"][0],
            "online-reencrypt-v3"
        );
        assert!(
            udm_data(&t) == t.plain,
            "{resilience}: after cryptsetup --init-only"
        );
        check_ok(&udm_cs(
            &["reencrypt", "--resume-only"],
            &t,
            &[("UDM_TEST_REENCRYPT_STOP_AFTER", "1")],
        ));
        assert!(in_reencryption(&dump(&t)));
        assert!(udm_data(&t) == t.plain, "{resilience}: one hotzone by udm");
        check_ok(&udm_cs(&["reencrypt", "--resume-only"], &t, &[]));
        assert_unshift_finished(&t, resilience);
    }
}

/// cryptsetup killed (SIGKILL) inside a hotzone of a decryption with
/// data shift, or stopped by SIGINT between two: udm recovers the
/// hotzone, resumes and finishes; the data reads back at every step.
#[test]
fn decrypt_with_data_shift_cryptsetup_killed_udm_recovers() {
    let v = volume(120 << 20, false, &[]);
    for sig in [libc::SIGKILL, libc::SIGINT] {
        let mut landed = false;
        for _ in 0..16 {
            let t = with_header(&v, "k");
            let mut c = cryptsetup();
            c.args(["reencrypt", "--decrypt", "-q", "--force-offline-reencrypt"])
                .arg("--header")
                .arg(t.hdr.as_ref().unwrap())
                .arg("--key-file")
                .arg(&t.key)
                .arg(&t.img);
            let hot = |j: &str| j.contains("in-reencryption");
            // After a hotzone or more (handlers surely installed): the
            // moved segment, plaintext so far, old ciphertext.
            let between = |j: &str| {
                j.contains("online-reencrypt") && !j.contains("in-reencryption") && {
                    let v: Result<Value, _> = serde_json::from_str(j.trim_end_matches('\0'));
                    v.is_ok_and(|j| regular_segments(&j) == 3)
                }
            };
            let r = if sig == libc::SIGKILL {
                try_interrupt(&t, c, sig, hot)
            } else {
                try_interrupt(&t, c, sig, between)
            };
            if r.is_err() {
                continue;
            }
            let j = dump(&t);
            if !in_reencryption(&j) {
                continue;
            }
            let crashed = serde_json::to_string(&j)
                .unwrap()
                .contains("in-reencryption");
            if crashed != (sig == libc::SIGKILL) {
                continue;
            }
            landed = true;
            if crashed {
                assert!(udm::luks::open(&t.img, t.hdr.as_deref(), PASS).is_err());
                let copy = twin(&t, "copy");
                check_ok(&udm_cs(&["repair"], &copy, &[]));
                if in_reencryption(&dump(&copy)) {
                    assert!(
                        udm_data(&copy) == copy.plain,
                        "recovered hotzone reads back"
                    );
                } else {
                    // The killed hotzone was the last (the moved segment):
                    // repairing it finishes, as cryptsetup's repair does.
                    assert_unshift_finished(&copy, "repair of the last hotzone");
                }
            } else {
                assert!(udm_data(&t) == t.plain, "stopped by SIGINT: reads back");
            }
            check_ok(&udm_cs(&["reencrypt", "--resume-only"], &t, &[]));
            assert_unshift_finished(&t, "cryptsetup interrupted, udm finished");
            break;
        }
        assert!(landed, "signal {sig} never landed where wanted");
    }
}

/// udm starts: its `--init-only` header and image equal cryptsetup's
/// (but for salts and digests); cryptsetup finishes it. udm runs stopped
/// after a hotzone or crashed inside one (moving, or the moved segment's
/// in-place hotzone under checksums or journal) are repaired and finished
/// by cryptsetup, and the same states by udm.
#[test]
fn decrypt_with_data_shift_udm_starts_cryptsetup_finishes() {
    let v = volume(40 << 20, false, &[]);
    let ours = with_header(&v, "ours");
    let theirs = with_header(&v, "theirs");
    for (side, t) in [(true, &ours), (false, &theirs)] {
        let o = reenc_on(side, &["--decrypt", "--init-only"], t, &[]);
        check_ok(&o);
    }
    assert_eq!(normalised(dump(&ours)), normalised(dump(&theirs)));
    assert!(
        std::fs::read(&ours.img).unwrap() == std::fs::read(&theirs.img).unwrap(),
        "udm moved other bytes than cryptsetup"
    );
    assert!(udm_data(&ours) == ours.plain);
    let o = reenc_on(false, &["--resume-only"], &ours, &[]);
    check_ok(&o);
    assert_unshift_finished(&ours, "udm init, cryptsetup finishes");

    // A moved segment smaller than the shift: a stop right before it is
    // put off (cryptsetup 2.6.1 cannot resume there), so udm finishes;
    // stopped one hotzone earlier, cryptsetup finishes.
    for (stop, done) in [("2", true), ("1", false)] {
        let t = with_header(&v, "small");
        let o = reenc_on(
            true,
            &["--decrypt", "--hotzone-size", "8M"],
            &t,
            &[("UDM_TEST_REENCRYPT_STOP_AFTER", stop)],
        );
        check_ok(&o);
        assert_eq!(!in_reencryption(&dump(&t)), done, "stop after {stop}");
        if !done {
            assert!(udm_data(&t) == t.plain);
            let o = reenc_on(false, &["--resume-only"], &t, &[]);
            check_ok(&o);
        }
        assert_unshift_finished(&t, &format!("small moved segment, stop after {stop}"));
    }

    for (resilience, hook, n) in [
        ("checksum", "UDM_TEST_REENCRYPT_STOP_AFTER", "1"),
        ("checksum", "UDM_TEST_REENCRYPT_CRASH_IN", "0"),
        ("checksum", "UDM_TEST_REENCRYPT_CRASH_IN", "2"),
        ("journal", "UDM_TEST_REENCRYPT_CRASH_IN", "2"),
    ] {
        let what = format!("{resilience} {hook}={n}");
        let t = with_header(&v, "run");
        let mut args = vec!["--decrypt", "--resilience", resilience];
        if resilience == "journal" {
            args.extend(["--hotzone-size", "8M"]);
        }
        let o = reenc_on(true, &args, &t, &[(hook, n)]);
        let crashed = hook.ends_with("CRASH_IN");
        assert_eq!(o.status.success(), !crashed, "{what}: {}", show(&o));
        let j = dump(&t);
        assert!(in_reencryption(&j), "{what}");
        let hot = serde_json::to_string(&j)
            .unwrap()
            .contains("in-reencryption");
        assert_eq!(hot, crashed, "{what}: {j:#}");
        let copy = twin(&t, "copy");
        if crashed {
            assert!(udm::luks::open(&t.img, t.hdr.as_deref(), PASS).is_err());
            run(cryptsetup()
                .args(["repair", "-q", "--key-file"])
                .arg(&t.key)
                .arg("--header")
                .arg(t.hdr.as_ref().unwrap())
                .arg(&t.img));
        }
        // Repairing the last hotzone (the moved segment) also finishes.
        if in_reencryption(&dump(&t)) {
            assert!(udm_data(&t) == t.plain, "{what}: before cryptsetup resumes");
            let o = reenc_on(false, &["--resume-only"], &t, &[]);
            check_ok(&o);
        } else {
            assert_eq!(n, "2", "{what}: repair finished early");
        }
        assert_unshift_finished(&t, &what);
        // The same state finished by udm (recovering the hotzone itself).
        check_ok(&udm_cs(&["reencrypt", "--resume-only"], &copy, &[]));
        assert_unshift_finished(&copy, &format!("{what}, udm"));
    }
}

/// What cryptsetup refuses around a decryption with data shift, udm
/// refuses with the same exit code (and writes no header file).
#[test]
fn decrypt_with_data_shift_refusals_match_cryptsetup() {
    let v = volume(8 << 20, false, &[]);
    for (args, hdr) in [
        (vec!["--decrypt"], false),
        (vec!["--decrypt", "--resilience", "none"], true),
        (vec!["--decrypt", "--resilience", "datashift"], true),
    ] {
        let mut codes = Vec::new();
        for side in [true, false] {
            let t = with_header(&v, if side { "u" } else { "c" });
            let h = t.hdr.clone().unwrap();
            let o = reenc_cmd(
                side,
                &args,
                &t.img,
                hdr.then_some(h.as_path()),
                Some(&t.key),
                None,
                &[],
            );
            assert!(!h.exists(), "{args:?}: a header file was left");
            codes.push(o.status.code());
        }
        assert_eq!(codes[0], codes[1], "{args:?}");
        assert_eq!(codes[0], Some(1), "{args:?}");
    }
    // Wrong passphrase: 2 on both sides, device untouched.
    let bad = v.dir.path().join("bad.key");
    std::fs::write(&bad, b"wrong").unwrap();
    for side in [true, false] {
        let t = with_header(&v, "w");
        let before = std::fs::read(&t.img).unwrap();
        let h = t.hdr.clone().unwrap();
        let o = reenc_cmd(
            side,
            &["--decrypt"],
            &t.img,
            Some(&h),
            Some(&bad),
            None,
            &[],
        );
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        assert!(!h.exists());
        assert!(std::fs::read(&t.img).unwrap() == before);
    }
}

// ---- new keyslots: KDF options, several keyslots, --keep-key ----

fn new_slot_kdfs(j: &Value, old: &[&str]) -> Vec<Value> {
    j["keyslots"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(n, k)| k["type"] == "luks2" && !old.contains(&n.as_str()))
        .map(|(_, k)| {
            let mut kdf = k["kdf"].clone();
            kdf["salt"] = Value::Null;
            serde_json::json!({"kdf": kdf, "af": k["af"]})
        })
        .collect()
}

/// `--pbkdf`, `--pbkdf-memory`, `--pbkdf-parallel`, `--hash` and
/// `--pbkdf-force-iterations` shape the new keyslot exactly as
/// cryptsetup's (which ignores memory/parallel alone and keeps the old
/// keyslot's KDF); cryptsetup finishes udm's and the data reads back.
#[test]
fn rekey_new_keyslot_kdf_options_match_cryptsetup() {
    let v = volume(4 << 20, false, &[]);
    for opts in [
        vec![
            "--pbkdf",
            "argon2i",
            "--pbkdf-memory",
            "40000",
            "--pbkdf-parallel",
            "2",
            "--pbkdf-force-iterations",
            "5",
        ],
        vec![
            "--pbkdf",
            "pbkdf2",
            "--hash",
            "sha512",
            "--pbkdf-force-iterations",
            "2345",
        ],
        vec!["--pbkdf-memory", "40000", "--pbkdf-parallel", "3"],
    ] {
        let mut found = Vec::new();
        for side in [true, false] {
            let t = twin(&v, if side { "u" } else { "c" });
            let mut a = vec!["--init-only"];
            a.extend(&opts);
            check_ok(&reenc_cmd(side, &a, &t.img, None, Some(&t.key), None, &[]));
            found.push(new_slot_kdfs(&dump(&t), &["0"]));
            if side {
                check_ok(&reenc_cmd(
                    false,
                    &["--resume-only"],
                    &t.img,
                    None,
                    Some(&t.key),
                    None,
                    &[],
                ));
                assert_finished(&t);
            }
        }
        assert_eq!(found[0].len(), 1, "{opts:?}");
        assert_eq!(found[0], found[1], "{opts:?}");
    }
    let kdf = &new_slot_kdfs(
        &{
            let t = twin(&v, "x");
            check_ok(&reenc_cmd(
                true,
                &[
                    "--init-only",
                    "--pbkdf",
                    "argon2id",
                    "--pbkdf-memory",
                    "33000",
                    "--pbkdf-parallel",
                    "1",
                    "--pbkdf-force-iterations",
                    "4",
                ],
                &t.img,
                None,
                Some(&t.key),
                None,
                &[],
            ));
            dump(&t)
        },
        &["0"],
    )[0]["kdf"];
    assert_eq!(kdf["type"], "argon2id");
    assert_eq!(kdf["memory"], 33000);
    assert_eq!(kdf["cpus"], 1);
    assert_eq!(kdf["time"], 4);
}

/// A re-key of a volume with two keyslots and no `--key-slot`: a key file
/// is refused (exit 1, cryptsetup's message); passphrases piped one per
/// line give each keyslot a keyslot for the new key (same header as
/// cryptsetup's), both open the result; a wrong second one exits 2.
#[test]
fn rekey_several_keyslots_as_cryptsetup() {
    let v = volume(4 << 20, false, &[]);
    let second = v.dir.path().join("second.key");
    std::fs::write(&second, b"second passphrase").unwrap();
    let mut c = cryptsetup();
    c.args(["luksAddKey", "-q"])
        .args(FAST_PBKDF)
        .arg("--key-file")
        .arg(&v.key)
        .arg(&v.img)
        .arg(&second);
    run(&mut c);
    let lines = [PASS, b"\nsecond passphrase\n"].concat();
    let wrong = [PASS, b"\nnot it\n"].concat();
    let mut heads = Vec::new();
    for side in [true, false] {
        let t = twin(&v, if side { "u" } else { "c" });
        let before = std::fs::read(&t.img).unwrap();
        let o = reenc_cmd(
            side,
            &["--init-only"],
            &t.img,
            None,
            Some(&t.key),
            None,
            &[],
        );
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(
            "Key file can be used only with --key-slot or with exactly one key slot active."
        ));
        let o = reenc_cmd(
            side,
            &["--init-only"],
            &t.img,
            None,
            None,
            Some(&wrong),
            &[],
        );
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        assert!(
            std::fs::read(&t.img).unwrap() == before,
            "a refused start changed the device"
        );
        // --keep-key with nothing else changed.
        let o = reenc_cmd(side, &["--keep-key"], &t.img, None, Some(&t.key), None, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr)
            .contains("No data segment parameters changed. Reencryption aborted."));
        let o = reenc_cmd(
            side,
            &["--init-only"],
            &t.img,
            None,
            None,
            Some(&lines),
            &[],
        );
        check_ok(&o);
        heads.push(normalised(dump(&t)));
        if side {
            check_ok(&reenc_cmd(
                false,
                &["--resume-only"],
                &t.img,
                None,
                Some(&t.key),
                None,
                &[],
            ));
            assert_finished(&t);
            let act = udm::luks::open(&t.img, None, b"second passphrase").expect("second keyslot");
            assert_eq!(act.keyslot, 3);
        }
    }
    assert_eq!(heads[0], heads[1]);
}

// ---- online: the active device's flags survive every reload ----

fn dmsetup(ctl: &std::path::Path, args: &[&str]) -> String {
    let o = udm()
        .arg("dmsetup")
        .args(args)
        .env("UDM_CONTROL", ctl)
        .output()
        .unwrap();
    check_ok(&o);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A device opened read-only with discards, same-CPU crypt and no
/// workqueues keeps all of them in each table `reencrypt --active-name`
/// loads (half-way: old and new segments; at the end: one), as
/// cryptsetup reloads with the active device's flags.
#[test]
fn online_reencryption_keeps_the_device_flags() {
    let v = volume(8 << 20, false, &[]);
    let (srv, ctl) = served(
        &v,
        &[
            "--readonly",
            "--allow-discards",
            "--perf-same_cpu_crypt",
            "--perf-no_read_workqueue",
            "--perf-no_write_workqueue",
        ],
    );
    let flags = [
        "allow_discards",
        "same_cpu_crypt",
        "no_read_workqueue",
        "no_write_workqueue",
    ];
    let check = |what: &str, lines: usize| {
        let table = dmsetup(&ctl, &["table", "vol"]);
        assert_eq!(table.lines().count(), lines, "{what}: {table}");
        for l in table.lines().filter(|l| l.contains(" crypt ")) {
            for f in flags {
                assert!(l.contains(f), "{what}: {f} lost: {l}");
            }
        }
        let info = dmsetup(&ctl, &["info", "vol"]);
        assert!(info.contains("READ-ONLY"), "{what}: {info}");
    };
    check("opened", 1);
    let env = [("UDM_CONTROL", ctl.to_str().unwrap())];
    let mut args = vec!["reencrypt", "--active-name", "vol", "--hotzone-size", "1M"];
    check_ok(&udm_cs(
        &args,
        &v,
        &[env[0], ("UDM_TEST_REENCRYPT_STOP_AFTER", "2")],
    ));
    check("half-way", 2);
    args.push("--resume-only");
    check_ok(&udm_cs(&args, &v, &env));
    check("finished", 1);
    srv.stop();
    assert_finished_both(&v);
}

/// A decryption-with-data-shift header (cryptsetup's `--init-only`) with
/// its segments edited by an attacker or damage: udm refuses to move a
/// byte, exits 1 naming the field, never panics; fields the reencryption
/// digest covers are refused as invalid metadata.
#[test]
fn decrypt_with_data_shift_hostile_segments_are_refused() {
    let v = volume(24 << 20, false, &[]);
    let base = with_header(&v, "base");
    check_ok(&reenc_on(false, &["--decrypt", "--init-only"], &base, &[]));
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|j| j["segments"]["1"]["offset"] = "4096".into()),
            "segments.0",
        ),
        (
            Box::new(|j| j["segments"]["1"]["offset"] = "18446744073709547520".into()),
            "segments.1",
        ),
        (
            Box::new(|j| {
                j["segments"]["0"]["size"] = "8192".into();
                j["segments"]["0"]["type"] = "linear".into();
                j["segments"]["0"]["flags"] = serde_json::json!(["in-reencryption"]);
            }),
            "segments.0",
        ),
        (
            Box::new(|j| {
                j["segments"]["1"] = serde_json::json!({"type": "linear",
                    "offset": "999999999", "size": "16777216",
                    "flags": ["in-reencryption"]});
            }),
            "segments.1",
        ),
        (
            Box::new(|j| j["keyslots"]["1"]["area"]["shift_size"] = "4096".into()),
            "Reencryption metadata is invalid",
        ),
        (
            Box::new(|j| j["segments"]["2"]["size"] = "33554432".into()),
            "Reencryption metadata is invalid",
        ),
    ];
    for (edit, want) in cases {
        let t = twin(&base, "hostile");
        common::luks::rewrite_json(t.hdr.as_ref().unwrap(), &*edit);
        let before = std::fs::read(&t.img).unwrap();
        let o = udm_cs(&["reencrypt", "--resume-only"], &t, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{want}: {}", show(&o));
        assert!(err.contains(want), "{want}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            std::fs::read(&t.img).unwrap() == before,
            "{want}: data moved"
        );
    }
}

// ---- --device-size: only the first SIZE bytes ----

/// `--device-size 4M` re-keys only the first 4 MiB, as cryptsetup: udm
/// stopped half-way leaves fixed-size segments ending at 4 MiB (the data
/// reads back), cryptsetup finishes with the same option; run whole by
/// each program the headers are equal and so is the first 4 MiB of
/// plaintext. Sizes cryptsetup refuses (misaligned, beyond the device)
/// fail on both sides with 1 before any metadata is written.
#[test]
fn device_size_reencrypts_only_the_start_as_cryptsetup() {
    let v = volume(8 << 20, false, &[]);
    let part = 4usize << 20;
    let t = twin(&v, "stop");
    check_ok(&reenc_cmd(
        true,
        &["--device-size", "4M", "--hotzone-size", "1M"],
        &t.img,
        None,
        Some(&t.key),
        None,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "2")],
    ));
    let j = dump(&t);
    assert!(in_reencryption(&j) && regular_segments(&j) == 2, "{j:#}");
    assert_eq!(
        j["segments"]["1"]["size"],
        (2u64 << 20).to_string(),
        "{j:#}"
    );
    assert!(udm_data(&t)[..] == t.plain[..part], "half-way: reads back");
    check_ok(&reenc_cmd(
        false,
        &["--resume-only", "--device-size", "4M"],
        &t.img,
        None,
        Some(&t.key),
        None,
        &[],
    ));
    assert!(!in_reencryption(&dump(&t)));
    assert!(
        udm_data(&t)[..part] == t.plain[..part],
        "udm stopped, cryptsetup finished"
    );

    let mut heads = Vec::new();
    for side in [true, false] {
        let t = twin(&v, if side { "u" } else { "c" });
        check_ok(&reenc_cmd(
            side,
            &["--device-size", "4M"],
            &t.img,
            None,
            Some(&t.key),
            None,
            &[],
        ));
        assert!(udm_data(&t)[..part] == t.plain[..part], "side {side}");
        heads.push(normalised(dump(&t)));
    }
    assert_eq!(heads[0], heads[1]);

    for size in ["6K", "64M"] {
        let mut codes = Vec::new();
        for side in [true, false] {
            let t = twin(&v, "bad");
            let o = reenc_cmd(
                side,
                &["--device-size", size],
                &t.img,
                None,
                Some(&t.key),
                None,
                &[],
            );
            codes.push(o.status.code());
            assert!(
                !in_reencryption(&dump(&t)),
                "{size} {side}: metadata written"
            );
        }
        assert_eq!(codes, [Some(1), Some(1)], "{size}");
    }
}

/// `--keep-key --sector-size 512`: the same volume key under a new
/// sector size, no new keyslot. udm's `--init-only` header equals
/// cryptsetup's; udm stopped after three hotzones is finished by
/// cryptsetup, cryptsetup's `--init-only` by udm; the data reads back
/// at every step and the volume key never changes.
#[test]
fn keep_key_new_sector_size_both_ways() {
    let v = volume(4 << 20, false, &[]);
    let key0 = cs_volume_key(&v.img, None, &v.key);
    let args = ["--keep-key", "--sector-size", "512", "--init-only"];
    let (ours, theirs) = (twin(&v, "u"), twin(&v, "c"));
    check_ok(&reenc_cmd(
        true,
        &args,
        &ours.img,
        None,
        Some(&ours.key),
        None,
        &[],
    ));
    check_ok(&reenc_cmd(
        false,
        &args,
        &theirs.img,
        None,
        Some(&theirs.key),
        None,
        &[],
    ));
    assert_eq!(normalised(dump(&ours)), normalised(dump(&theirs)));
    for t in [&ours, &theirs] {
        assert!(udm_data(t) == t.plain, "after --init-only");
    }
    check_ok(&udm_cs(
        &["reencrypt", "--hotzone-size", "512K"],
        &ours,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "3")],
    ));
    assert!(udm_data(&ours) == ours.plain, "three hotzones by udm");
    cs_finishes(&ours);
    check_ok(&udm_cs(&["reencrypt", "--resume-only"], &theirs, &[]));
    for t in [&ours, &theirs] {
        assert_finished_both(t);
        let j = dump(t);
        assert_eq!(j["segments"]["0"]["sector_size"], 512);
        assert_eq!(j["keyslots"].as_object().unwrap().len(), 1, "{j:#}");
        assert_eq!(cs_volume_key(&t.img, None, &t.key), key0);
    }
}

/// On a terminal, a re-key of two keyslots prompts "Enter passphrase for
/// key slot N: " for each, retries a wrong one (`--tries`, 3), and gives
/// up with exit 2: udm's transcript and exit code equal cryptsetup's,
/// and so do the resulting headers.
#[test]
fn rekey_several_keyslots_on_a_terminal() {
    need(PYTHON);
    let v = volume(4 << 20, false, &[]);
    let second = v.dir.path().join("second.key");
    std::fs::write(&second, b"second passphrase").unwrap();
    let mut c = cryptsetup();
    c.args(["luksAddKey", "-q"])
        .args(FAST_PBKDF)
        .arg("--key-file")
        .arg(&v.key)
        .arg(&v.img)
        .arg(&second);
    run(&mut c);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/luks/pty_answers.py");
    let pass = String::from_utf8(PASS.to_vec()).unwrap();
    for (answers, code) in [
        (format!("{pass},wrong,second passphrase"), 0),
        (format!("{pass},x,y,z"), 2),
    ] {
        let mut seen = Vec::new();
        for side in [true, false] {
            let t = twin(&v, if side { "u" } else { "c" });
            let mut c = std::process::Command::new(PYTHON);
            c.arg(script).arg(&answers).arg("--");
            if side {
                c.arg(env!("CARGO_BIN_EXE_udm")).arg("cryptsetup");
            } else {
                c.arg("cryptsetup");
            }
            c.args([
                "reencrypt",
                "--init-only",
                "-q",
                "--force-offline-reencrypt",
            ])
            .arg(&t.img);
            let o = c.output().unwrap();
            assert_eq!(o.status.code(), Some(code), "{}", show(&o));
            let text = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.starts_with("WARNING"))
                .collect::<Vec<_>>()
                .join("\n");
            seen.push((text, normalised(dump(&t))));
        }
        assert_eq!(seen[0], seen[1], "{answers}");
    }
}

// ---- online data shift (`--active-name`) ----

/// An NBD client writing and reading random blocks of `uri` against a
/// model until [`Client::finish`]; it starts from `plain`.
struct Client {
    child: std::process::Child,
    stop: PathBuf,
    model: PathBuf,
}

impl Client {
    fn start(d: &std::path::Path, uri: &str, plain: &[u8]) -> Client {
        need_python_module("nbd", "python3-libnbd");
        let initial = write_file(d, "initial.bin", plain);
        let (stop, model) = (d.join("stop"), d.join("model.bin"));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/luks/nbd_model_io.py");
        let child = std::process::Command::new(PYTHON)
            .arg(script)
            .arg(uri)
            .arg(&initial)
            .arg(&stop)
            .arg(&model)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Client { child, stop, model }
    }

    /// Stop the client (it checks every byte against its model first);
    /// the model, i.e. the device's data as the client left it.
    fn finish(self) -> Vec<u8> {
        std::fs::write(&self.stop, b"").unwrap();
        let c = self.child.wait_with_output().unwrap();
        assert!(c.status.success(), "NBD client: {}", show(&c));
        let ops: u64 = String::from_utf8_lossy(&c.stdout).trim().parse().unwrap();
        assert!(ops >= 50, "{ops}");
        std::fs::read(&self.model).unwrap()
    }
}

/// Online decryption with data shift, as cryptsetup 2.6 allows it
/// (`--decrypt --header NEW --active-name`, lib/luks2/luks2_reencrypt.c
/// reencrypt_decrypt_with_datashift_init with a name): the served device
/// is suspended while the first segment moves, reloaded with the moved
/// layout, and every hotzone after; an NBD client writes and reads the
/// whole time. SIGINT stops it (exit 0, resumable), an online
/// `--resume-only` finishes, and the client's data is at byte 0 of the
/// device, which the live table now maps linearly.
#[test]
fn online_decrypt_with_data_shift_sigint_and_resume() {
    let mut v = volume(96 << 20, false, &[]);
    let d = v.dir.path().to_path_buf();
    let (srv, ctl) = served(&v, &[]);
    let client = Client::start(&d, &srv.uri("vol"), &v.plain);
    let hdr = d.join("exported.hdr");
    v.hdr = Some(hdr.clone());
    let env = ("UDM_CONTROL", ctl.to_str().unwrap());
    let mut c = udm();
    c.args([
        "cryptsetup",
        "reencrypt",
        "--decrypt",
        "-q",
        "--active-name",
    ])
    .args(["vol", "--hotzone-size", "4M", "--key-file"])
    .arg(&v.key)
    .arg("--header")
    .arg(&hdr)
    .arg(&v.img)
    .env(env.0, env.1);
    // After at least one hotzone past the moved segment's copy.
    let between = |j: &str| {
        j.contains("online-reencrypt") && !j.contains("in-reencryption") && {
            let v: Result<Value, _> = serde_json::from_str(j.trim_end_matches('\0'));
            v.is_ok_and(|j| regular_segments(&j) == 3)
        }
    };
    let st = interrupted(&v, c, libc::SIGINT, between);
    assert!(st.success(), "{st}");
    let j = dump(&v);
    assert!(in_reencryption(&j), "SIGINT left resumable metadata: {j:#}");
    assert_eq!(
        j["config"]["requirements"]["mandatory"][0],
        "online-reencrypt-v3"
    );
    let table = dmsetup(&ctl, &["table", "vol"]);
    assert!(table.lines().count() >= 2, "half-way table: {table}");
    let o = udm_cs(
        &["reencrypt", "--resume-only", "--active-name", "vol"],
        &v,
        &[env],
    );
    check_ok(&o);
    v.plain = client.finish();
    let table = dmsetup(&ctl, &["table", "vol"]);
    assert!(
        table.lines().count() == 1 && table.contains(" linear ") && table.contains(" 0\n"),
        "live table after decryption: {table}"
    );
    assert_eq!(
        table.split_whitespace().nth(1),
        Some(((96u64 << 20) / 512).to_string().as_str()),
        "the device kept its size"
    );
    srv.stop();
    assert_unshift_finished(&v, "online");
}

/// udm starts an online decryption with data shift and stops after a
/// hotzone; the device is closed, and cryptsetup finishes offline what
/// udm started online; the data reads back before and after.
#[test]
fn online_decrypt_with_data_shift_cryptsetup_finishes_offline() {
    let mut v = volume(40 << 20, false, &[]);
    let d = v.dir.path().to_path_buf();
    let (srv, ctl) = served(&v, &[]);
    let hdr = d.join("exported.hdr");
    v.hdr = Some(hdr.clone());
    let env = ("UDM_CONTROL", ctl.to_str().unwrap());
    let o = udm_cs(
        &["reencrypt", "--decrypt", "--active-name", "vol"],
        &v,
        &[env, ("UDM_TEST_REENCRYPT_STOP_AFTER", "1")],
    );
    check_ok(&o);
    let out = d.join("out.bin");
    need("nbdcopy");
    run(std::process::Command::new("nbdcopy")
        .arg(srv.uri("vol"))
        .arg(&out));
    assert!(std::fs::read(&out).unwrap() == v.plain, "served half-way");
    srv.stop();
    assert!(in_reencryption(&dump(&v)));
    assert!(udm_data(&v) == v.plain, "offline half-way");
    let o = reenc_on(false, &["--resume-only"], &v, &[]);
    check_ok(&o);
    assert_unshift_finished(&v, "udm online, cryptsetup offline");
}

/// What cryptsetup 2.6.1 refuses online, udm refuses with its message
/// and exit code 1 (src/utils_reencrypt.c): `--active-name` naming no
/// active device ("Device NAME is not active."); an encryption with
/// `--reduce-device-size` (or a detached header) with `--active-name`:
/// the named device is an active LUKS2 device, so the device is "already
/// LUKS" (an encryption starts offline; cryptsetup goes online by
/// activating a name after the start); `--device-size` differing from
/// the active device's size. Nothing is written.
#[test]
fn online_data_shift_refusals_match_cryptsetup() {
    let v = volume(8 << 20, false, &[]);
    let (srv, ctl) = served(&v, &[]);
    let env = ("UDM_CONTROL", ctl.to_str().unwrap());
    let p = plain_device(16 << 20, 4 << 20);
    let before = std::fs::read(&p.img).unwrap();
    let code = |args: &[&str], vol: &Vol| {
        let o = udm_cs(args, vol, &[env]);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (rc, err) = code(
        &[
            "reencrypt",
            "--encrypt",
            "--reduce-device-size",
            "4M",
            "--active-name",
            "nosuch",
        ],
        &p,
    );
    assert_eq!(rc, Some(1), "{err}");
    assert!(err.contains("Device nosuch is not active."), "{err}");
    let (rc, err) = code(
        &[
            "reencrypt",
            "--encrypt",
            "--reduce-device-size",
            "4M",
            "--active-name",
            "vol",
        ],
        &p,
    );
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("is already LUKS device. Aborting operation."),
        "{err}"
    );
    assert!(
        std::fs::read(&p.img).unwrap() == before,
        "plaintext touched"
    );
    let mut t = twin(&v, "t");
    t.hdr = Some(v.dir.path().join("new.hdr"));
    let (rc, err) = code(
        &[
            "reencrypt",
            "--decrypt",
            "--active-name",
            "vol",
            "--device-size",
            "4M",
        ],
        &t,
    );
    assert_eq!(rc, Some(1), "{err}");
    assert!(
        err.contains("Active device size and requested reencryption size don't match."),
        "{err}"
    );
    srv.stop();
}

// ---- --device-size with a data shift ----

/// cryptsetup refuses `--reduce-device-size` with `--device-size` (an
/// argument check, "Options --reduce-device-size and --data-size cannot
/// be combined.", exit 1) and so does udm; a decryption with data shift
/// accepts `--device-size N` (src/utils_reencrypt.c passes it to
/// decrypt_luks2_datashift_init): only the first N bytes move and are
/// decrypted, the backup-previous segment has the fixed size N, the rest
/// of the device is left. udm's `--init-only` header equals cryptsetup's,
/// either finishes the other's start (with `--device-size` again: as
/// cryptsetup, a resume without it decrypts the whole device).
#[test]
fn device_size_with_data_shift_as_cryptsetup() {
    let p = plain_device(16 << 20, 4 << 20);
    let before = std::fs::read(&p.img).unwrap();
    for side in [true, false] {
        let o = reenc_cmd(
            side,
            &[
                "--encrypt",
                "--reduce-device-size",
                "4M",
                "--device-size",
                "8M",
            ],
            &p.img,
            None,
            Some(&p.key),
            None,
            &[],
        );
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("Options --reduce-device-size and --data-size cannot be combined."),
            "{err}"
        );
    }
    assert!(std::fs::read(&p.img).unwrap() == before);

    let v = volume(40 << 20, false, &[]);
    let n = 24usize << 20;
    let ours = with_header(&v, "ours");
    let theirs = with_header(&v, "theirs");
    for (side, t) in [(true, &ours), (false, &theirs)] {
        check_ok(&reenc_on(
            side,
            &["--decrypt", "--init-only", "--device-size", "24M"],
            t,
            &[],
        ));
    }
    let j = dump(&ours);
    let prev = j["segments"]
        .as_object()
        .unwrap()
        .values()
        .find(|s| s["flags"][0] == "backup-previous")
        .unwrap();
    assert_eq!(prev["size"], n.to_string());
    assert_eq!(normalised(j), normalised(dump(&theirs)));
    assert!(
        std::fs::read(&ours.img).unwrap() == std::fs::read(&theirs.img).unwrap(),
        "udm moved other bytes than cryptsetup"
    );
    // Each finishes the other's start, for the first N bytes only.
    let tail = pread(&ours.img, n as u64, 8 << 20);
    for (side, t) in [(false, &ours), (true, &theirs)] {
        check_ok(&reenc_on(
            side,
            &["--resume-only", "--device-size", "24M"],
            t,
            &[],
        ));
        let j = dump(t);
        assert!(!in_reencryption(&j), "{side}: {j:#}");
        assert_eq!(j["segments"]["0"]["type"], "linear");
        assert!(
            pread(&t.img, 0, n) == t.plain[..n],
            "{side}: the first N bytes are not the plaintext"
        );
        assert!(
            pread(&t.img, n as u64, 8 << 20) == tail,
            "{side}: bytes beyond N were touched"
        );
    }
    // A whole run by each: the same device.
    let a = with_header(&v, "a");
    let b = with_header(&v, "b");
    for (side, t) in [(true, &a), (false, &b)] {
        check_ok(&reenc_on(
            side,
            &["--decrypt", "--device-size", "24M"],
            t,
            &[],
        ));
        assert!(pread(&t.img, 0, n) == t.plain[..n], "{side}");
    }
    let (ia, ib) = (
        std::fs::read(&a.img).unwrap(),
        std::fs::read(&b.img).unwrap(),
    );
    // The last `shift` bytes are random on both sides.
    let keep = ia.len() - (16 << 20);
    assert!(
        ia[..keep] == ib[..keep],
        "udm left other bytes than cryptsetup"
    );
}

/// A running `udm serve` with a control socket and no device.
fn server(d: &std::path::Path) -> (UdmServe, PathBuf) {
    let ctl = d.join("ctl");
    let srv = UdmServe::start(
        &d.join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    (srv, ctl)
}

/// Online encryption with data shift, as cryptsetup 2.6 does it
/// (src/utils_reencrypt.c encrypt_luks2_init with a device name): the
/// start is offline (`reencrypt --encrypt --reduce-device-size N DEVICE
/// NAME` moves the data, writes the header, then activates NAME), the
/// rest online. Here `--init-only` stops after the activation, an NBD
/// client starts on NAME, an online `--resume-only --active-name NAME`
/// stopped by SIGINT after some hotzones and resumed finishes; the
/// client's data is what udm and cryptsetup's key read. Then a second
/// run stopped online is finished offline by cryptsetup.
#[test]
fn online_encrypt_with_data_shift_as_cryptsetup() {
    let mut v = plain_device(72 << 20, 8 << 20);
    let d = v.dir.path().to_path_buf();
    let (srv, ctl) = server(&d);
    let env = ("UDM_CONTROL", ctl.to_str().unwrap());
    let mut a = shift_args("8M");
    a.extend(["--init-only", "--hotzone-size", "1M"]);
    let mut c = udm();
    c.arg("cryptsetup")
        .args(&a)
        .args(["-q", "--key-file"])
        .arg(&v.key)
        .arg(&v.img)
        .arg("enc")
        .env(env.0, env.1);
    let o = c.output().unwrap();
    check_ok(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("enc is now active and ready for online encryption."),
        "{}",
        show(&o)
    );
    let client = Client::start(&d, &srv.uri("enc"), &v.plain);
    let mut c = udm();
    c.args([
        "cryptsetup",
        "reencrypt",
        "-q",
        "--resume-only",
        "--active-name",
        "enc",
    ])
    .arg("--key-file")
    .arg(&v.key)
    .arg(&v.img)
    .env(env.0, env.1);
    let st = interrupted(&v, c, libc::SIGINT, shift_started);
    assert!(st.success(), "{st}");
    assert!(in_reencryption(&dump(&v)), "SIGINT left resumable metadata");
    check_ok(&udm_cs(
        &["reencrypt", "--resume-only", "--active-name", "enc"],
        &v,
        &[env],
    ));
    v.plain = client.finish();
    let table = dmsetup(&ctl, &["table", "enc"]);
    assert!(
        table.lines().count() == 1 && table.contains(" crypt "),
        "live table after encryption: {table}"
    );
    assert_eq!(
        table.split_whitespace().nth(1),
        Some(((64u64 << 20) / 512).to_string().as_str()),
        "the device kept its size"
    );
    srv.stop();
    assert_shift_finished(&v, 4 << 20);

    // Stopped online after two hotzones, finished offline by cryptsetup.
    let v = plain_device(32 << 20, 4 << 20);
    let d = v.dir.path().to_path_buf();
    let (srv, ctl) = server(&d);
    let env = ("UDM_CONTROL", ctl.to_str().unwrap());
    let mut c = udm();
    c.arg("cryptsetup")
        .args(shift_args("4M"))
        .args(["-q", "--key-file"])
        .arg(&v.key)
        .arg(&v.img)
        .arg("enc")
        .env(env.0, env.1)
        .env("UDM_TEST_REENCRYPT_STOP_AFTER", "2");
    check_ok(&c.output().unwrap());
    assert!(in_reencryption(&dump(&v)));
    srv.stop();
    assert_udm_reads_plain(&v, "stopped online");
    cs_finishes(&v);
    assert_shift_finished(&v, 2 << 20);
}

// ---- --reduce-device-size with --offset ----

/// `--encrypt --reduce-device-size N --offset S` with the header on the
/// device, as cryptsetup 2.6.1's encrypt_luks2_init
/// (src/utils_reencrypt.c): S sectors above N/2 are refused ("Requested
/// data offset must be less than or equal to half of
/// --reduce-device-size parameter.", exit 1, nothing written); below, the
/// reduction becomes 2·S ("Adjusting --reduce-device-size value to twice
/// the --offset 2·S (sectors)."); equal, nothing changes. The started
/// headers (normalised) and devices are the same as cryptsetup's, and
/// cryptsetup finishes udm's start.
#[test]
fn reduce_device_size_with_offset_as_cryptsetup() {
    let v = plain_device(24 << 20, 8 << 20);
    let before = std::fs::read(&v.img).unwrap();
    for side in [true, false] {
        let o = reenc_on(
            side,
            &[
                "--encrypt",
                "--reduce-device-size",
                "8M",
                "--offset",
                "8200",
            ],
            &v,
            &[],
        );
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("Requested data offset must be less than or equal to half of --reduce-device-size parameter."),
            "{side}: {err}"
        );
        assert!(std::fs::read(&v.img).unwrap() == before);
    }
    for (offset, shift) in [("4096", 2usize << 20), ("8192", 4 << 20)] {
        let ours = twin(&v, "ours");
        let theirs = twin(&v, "theirs");
        let mut outs = Vec::new();
        for (side, t) in [(true, &ours), (false, &theirs)] {
            let mut a = shift_args("8M");
            a.remove(0);
            a.extend(["--offset", offset, "--init-only"]);
            let o = reenc_on(side, &a, t, &[]);
            check_ok(&o);
            outs.push(String::from_utf8_lossy(&o.stdout).into_owned());
        }
        let adjusted = "Adjusting --reduce-device-size value to twice the --offset 8192 (sectors).";
        for out in &outs {
            assert_eq!(out.contains(adjusted), offset == "4096", "{offset}: {out}");
        }
        let j = dump(&ours);
        let fin = j["segments"]
            .as_object()
            .unwrap()
            .values()
            .find(|s| s["flags"][0] == "backup-final")
            .unwrap();
        assert_eq!(fin["offset"], shift.to_string(), "{j:#}");
        assert_eq!(
            normalised(j),
            normalised(dump(&theirs)),
            "--offset {offset}"
        );
        let (a, b) = (
            std::fs::read(&ours.img).unwrap(),
            std::fs::read(&theirs.img).unwrap(),
        );
        assert!(
            a[shift..] == b[shift..],
            "--offset {offset}: other data moved"
        );
        cs_finishes(&ours);
        let mut ours = ours;
        let len = 24usize << 20;
        ours.plain.extend(fast_bytes(7, 8 << 20));
        ours.plain.truncate(len - 2 * shift);
        assert_shift_finished(&ours, shift);
    }
}

// ---- tokens ----

/// cryptsetup 2.6.1's reencrypt takes `--token-id`, `--token-only` and
/// `--token-type` (options of every action) but reads the passphrase as
/// always (src/utils_reencrypt.c uses tools_get_key, never a token: no
/// token unlocks a reencryption), even with `--token-only`; udm does the
/// same: with a key file, and with the passphrase on stdin, exit 0, and
/// the luks2-keyring token follows the new keyslot as cryptsetup's
/// assign_tokens moves it.
#[test]
fn token_options_on_reencrypt_as_cryptsetup() {
    let v = volume(4 << 20, false, &[]);
    run(cryptsetup()
        .args([
            "token",
            "add",
            "--key-description",
            "udm:reenc",
            "--key-slot",
            "0",
        ])
        .arg(&v.img));
    let opts = [
        "--token-id",
        "0",
        "--token-only",
        "--token-type",
        "luks2-keyring",
    ];
    let mut tokens = Vec::new();
    for side in [true, false] {
        let t = twin(&v, if side { "u" } else { "c" });
        let mut a: Vec<&str> = opts.to_vec();
        a.extend(FAST_PBKDF);
        let o = reenc_on(side, &a, &t, &[]);
        assert_eq!(o.status.code(), Some(0), "{side}: {}", show(&o));
        let a: Vec<&str> = ["--token-only"].iter().copied().chain(FAST_PBKDF).collect();
        let o = reenc_cmd(side, &a, &t.img, None, None, Some(PASS), &[]);
        assert_eq!(o.status.code(), Some(0), "{side}: {}", show(&o));
        let j = dump(&t);
        assert!(!in_reencryption(&j));
        let slots: Vec<String> = j["keyslots"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            j["tokens"]["0"]["keyslots"],
            serde_json::json!(slots),
            "{side}: {j:#}"
        );
        assert!(udm_data(&t) == t.plain, "{side}");
        tokens.push(j["tokens"].clone());
    }
    assert_eq!(tokens[0], tokens[1]);
}

// ---- --reduce-device-size with a detached header ----

/// `--encrypt --reduce-device-size N --header H` as cryptsetup 2.6.1 does
/// it (src/utils_reencrypt.c encrypt_luks2_init: metadata areas of 16
/// KiB, the keyslots area the rest of N; lib/luks2/luks2_reencrypt.c:
/// data offset 0, resilience datashift with shift N, backward, no moved
/// segment): nothing is reduced, the device is encrypted in place in
/// hotzones of N. udm's `--init-only` header (normalised) and header file
/// size equal cryptsetup's; either finishes the other's start (udm's
/// also after it stopped past a hotzone); the data reads back through
/// udm and through cryptsetup alone. A metadata size larger than N is
/// refused by both ("LUKS2 metadata size is larger than data shift
/// value.", exit 1).
#[test]
fn reduce_device_size_with_detached_header_as_cryptsetup() {
    let v = plain_device(32 << 20, 0);
    let args = |extra: &[&'static str]| {
        let mut a = vec!["--encrypt", "--reduce-device-size", "8M"];
        a.extend(FAST_PBKDF);
        a.extend(extra);
        a
    };
    for side in [true, false] {
        let t = with_header(&v, if side { "u" } else { "c" });
        let o = reenc_on(side, &args(&["--luks2-keyslots-size", "8M"]), &t, &[]);
        assert_eq!(o.status.code(), Some(1), "{side}: {}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("LUKS2 metadata size is larger than data shift value."),
            "{err}"
        );
    }
    let ours = with_header(&v, "ours");
    let theirs = with_header(&v, "theirs");
    for (side, t) in [(true, &ours), (false, &theirs)] {
        check_ok(&reenc_on(side, &args(&["--init-only"]), t, &[]));
        assert!(
            std::fs::read(&t.img).unwrap() == v.plain,
            "{side}: data moved"
        );
    }
    let (ju, jc) = (dump(&ours), dump(&theirs));
    assert_eq!(ju["config"]["keyslots_size"], "8355840", "{ju:#}");
    assert_eq!(normalised(ju), normalised(jc));
    let len = |t: &Vol| std::fs::metadata(t.hdr.as_ref().unwrap()).unwrap().len();
    assert_eq!(len(&ours), len(&theirs));
    assert!(udm_data(&ours) == v.plain);
    // Each finishes the other's start.
    check_ok(&reenc_on(false, &["--resume-only"], &ours, &[]));
    check_ok(&reenc_on(true, &["--resume-only"], &theirs, &[]));
    for t in [&ours, &theirs] {
        let j = dump(t);
        assert!(!in_reencryption(&j), "{j:#}");
        assert_eq!(j["segments"]["0"]["offset"], "0");
        assert_finished_both(t);
    }
    // Stopped past a hotzone: cryptsetup 2.6.1 cannot resume udm's state
    // half-way (its size check adds the shift once the encrypted segment
    // is dynamic: "Device … is too small.", exit 1; it fails so on some
    // of its own interrupted states too); udm finishes it, and finishes a
    // run of cryptsetup's stopped by SIGINT.
    let ours = with_header(&v, "stopped");
    check_ok(&reenc_on(
        true,
        &args(&[]),
        &ours,
        &[("UDM_TEST_REENCRYPT_STOP_AFTER", "2")],
    ));
    let j = dump(&ours);
    assert!(in_reencryption(&j) && regular_segments(&j) == 2, "{j:#}");
    assert!(udm_data(&ours) == v.plain, "stopped half-way");
    let o = reenc_on(false, &["--resume-only"], &ours, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is too small."));
    check_ok(&reenc_on(true, &["--resume-only"], &ours, &[]));
    assert_finished_both(&ours);

    let big = plain_device(96 << 20, 0);
    let mut landed = false;
    for _ in 0..8 {
        let t = with_header(&big, "sigint");
        let mut c = cryptsetup();
        c.args(["reencrypt", "-q", "--force-offline-reencrypt"])
            .args(["--encrypt", "--reduce-device-size", "1M"])
            .args(FAST_PBKDF)
            .arg("--header")
            .arg(t.hdr.as_ref().unwrap())
            .arg("--key-file")
            .arg(&t.key)
            .arg(&t.img);
        let between = |j: &str| {
            j.contains("online-reencrypt") && !j.contains("in-reencryption") && {
                let v: Result<Value, _> = serde_json::from_str(j.trim_end_matches('\0'));
                v.is_ok_and(|j| regular_segments(&j) == 2)
            }
        };
        if try_interrupt(&t, c, libc::SIGINT, between).is_err() || !in_reencryption(&dump(&t)) {
            continue;
        }
        landed = true;
        assert!(udm_data(&t) == t.plain, "cryptsetup interrupted");
        check_ok(&reenc_on(true, &["--resume-only"], &t, &[]));
        assert_finished_both(&t);
        break;
    }
    assert!(landed, "SIGINT never landed between two hotzones");
}

/// `--luks2-keyslots-size` with `--reduce-device-size N` and the header
/// on the device, as cryptsetup 2.6.1: a size that fits is taken, a
/// larger one shrinks to the shift less the metadata ("WARNING: LUKS2
/// keyslots area size changed to … bytes.", on stdout); the `--init-only` headers
/// (normalised) are equal. A resume's `--device-size` must be the
/// plaintext's size (the segments have fixed sizes): another is refused
/// by both ("Illegal device size requested in reencryption
/// parameters.", exit 1), that one is taken.
#[test]
fn reduce_device_size_keyslots_size_and_resume_size_as_cryptsetup() {
    let v = plain_device(32 << 20, 8 << 20);
    for ks in ["1M", "8M"] {
        let ours = twin(&v, "ours");
        let theirs = twin(&v, "theirs");
        let mut errs = Vec::new();
        for (side, t) in [(true, &ours), (false, &theirs)] {
            let mut a = shift_args("8M");
            a.remove(0);
            a.extend(["--luks2-keyslots-size", ks, "--init-only"]);
            let o = reenc_on(side, &a, t, &[]);
            check_ok(&o);
            errs.push(String::from_utf8_lossy(&o.stdout).into_owned());
        }
        let warned = "WARNING: LUKS2 keyslots area size changed to 4161536 bytes.";
        for e in &errs {
            assert_eq!(e.contains(warned), ks == "8M", "{ks}: {e}");
        }
        assert_eq!(normalised(dump(&ours)), normalised(dump(&theirs)), "{ks}");
    }
    for side in [true, false] {
        let t = twin(&v, "resume");
        let mut a = shift_args("8M");
        a.remove(0);
        a.push("--init-only");
        check_ok(&reenc_on(false, &a, &t, &[]));
        let o = reenc_on(side, &["--resume-only", "--device-size", "8M"], &t, &[]);
        assert_eq!(o.status.code(), Some(1), "{side}: {}", show(&o));
        assert!(String::from_utf8_lossy(&o.stderr)
            .contains("Illegal device size requested in reencryption parameters."));
        check_ok(&reenc_on(
            side,
            &["--resume-only", "--device-size", "24M"],
            &t,
            &[],
        ));
        assert_shift_finished(&t, 4 << 20);
    }
}

/// The same with `--offset S` (sectors): cryptsetup formats the detached
/// header with its data at S, shrinks the keyslots area below S
/// ("WARNING: LUKS2 keyslots area size changed to … bytes."), and
/// encrypts the data area in place from S; udm's start equals it, either
/// finishes the other's, and cryptsetup's volume key decrypts the result
/// (its `--decrypt` refuses a detached header with a data offset).
#[test]
fn reduce_device_size_with_detached_header_and_offset_as_cryptsetup() {
    let v = plain_device(33 << 20, 0);
    let ours = with_header(&v, "ours");
    let theirs = with_header(&v, "theirs");
    let mut a = vec![
        "--encrypt",
        "--reduce-device-size",
        "8M",
        "--offset",
        "2048",
    ];
    a.extend(FAST_PBKDF);
    a.push("--init-only");
    let mut outs = Vec::new();
    for (side, t) in [(true, &ours), (false, &theirs)] {
        let o = reenc_on(side, &a, t, &[]);
        check_ok(&o);
        outs.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    for out in &outs {
        assert!(
            out.contains("WARNING: LUKS2 keyslots area size changed to 1015808 bytes."),
            "{out}"
        );
    }
    assert_eq!(normalised(dump(&ours)), normalised(dump(&theirs)));
    check_ok(&reenc_on(false, &["--resume-only"], &ours, &[]));
    check_ok(&reenc_on(true, &["--resume-only"], &theirs, &[]));
    for t in [&ours, &theirs] {
        let j = dump(t);
        assert!(!in_reencryption(&j), "{j:#}");
        let seg = &j["segments"]["0"];
        assert_eq!(seg["offset"], "1048576");
        assert!(udm_data(t) == t.plain[1 << 20..], "udm reads other data");
        let key = cs_volume_key(&t.img, t.hdr.as_deref(), &t.key);
        let ct = pread(&t.img, 1 << 20, 32 << 20);
        let pt = py_crypt(
            t.dir.path(),
            "dec",
            seg["encryption"].as_str().unwrap(),
            &key,
            512,
            0,
            &ct,
        );
        assert!(
            pt == t.plain[1 << 20..],
            "cryptsetup's key decrypts other data"
        );
        assert!(
            pread(&t.img, 0, 1 << 20) == t.plain[..1 << 20],
            "bytes before the offset moved"
        );
    }
}

/// `--progress-json` prints cryptsetup's JSON progress objects on stdout,
/// one a line, the last at the device's full size with no time left;
/// options udm does not do are refused by name instead of ignored.
#[test]
fn progress_json_on_stdout_and_unsupported_options_refused() {
    let v = volume(8 << 20, false, &[]);
    let o = udm_cs(
        &["reencrypt", "--progress-json", "--hotzone-size", "1M"],
        &v,
        &[],
    );
    check_ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let objs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let last = objs
        .last()
        .unwrap_or_else(|| panic!("no JSON progress: {}", show(&o)));
    assert_eq!(last["device_bytes"], last["device_size"], "{out}");
    assert_eq!(last["eta_ms"], "0", "{out}");
    assert_eq!(last["device"], v.img.to_str().unwrap(), "{out}");
    for key in ["speed", "time_ms"] {
        assert!(
            last[key].as_str().is_some_and(|s| s.parse::<u64>().is_ok()),
            "{out}"
        );
    }
    for (args, opt) in [
        (&["open", "--persistent"][..], "--persistent"),
        (&["luksAddKey", "--new-token-id", "1"][..], "--new-token-id"),
    ] {
        let o = udm_cs(args, &v, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(opt) && err.contains("not supported by udm"),
            "{err}"
        );
    }
}
