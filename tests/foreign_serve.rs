//! `udm serve --tcrypt/--bitlk/--fvault2` and crypttab `tcrypt`/`bitlk`
//! lines, on cryptsetup's own images (the upstream suite's archives, read
//! from `../shared/upstream/`, never copied here): a TrueCrypt cascade, a
//! VeraCrypt volume with a PIM, BitLocker volumes (passphrase, recovery
//! password, startup key) and a FileVault2 volume are served at start and
//! read over NBD, where the filesystem UUID (and sha256, where the upstream
//! config gives one) must be what the upstream scripts expect. A wrong
//! passphrase stops the server with an error naming the volume, and no
//! key or passphrase reaches the log. FAILS if the upstream folder,
//! nbdcopy, nbdinfo or blkid is missing.

mod common;

use common::foreign::*;
use common::*;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TC_PASS: &str = "aaaaaaaaaaaa";
const VC_PIM_PASS: &str = "cccccccccccccccccccc";
/// A TrueCrypt cascade of three ciphers: served as tc over tc_1 over tc_2.
const TC_CASCADE: &str = "tc_5-sha512-xts-serpent-twofish-aes";
const VC_PIM: &str = "vcpim_1_1234-sha256-xts-aes";
const FV_PASS: &str = "heslo123";
const FV_KEY: &str = "20734d3389212774d7610c29d7328809\
                      16f3be14c4b12ac7aaf07e5ccc77b319";
const FV_UUID: &str = "de124d8a-2164-394e-924f-8e28db0a09cb";
const FV_SHA256: &str = "2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18";

/// A `udm serve` with its log kept at info level (device tables are
/// logged there), killed on drop.
struct Server {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl Server {
    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    /// SIGTERM, wait, and return the log.
    fn stop(mut self) -> String {
        // SAFETY: kill(2) with the pid of a child this test owns and a
        // valid signal.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "serve ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_cmd(dir: &Path, tag: &str, args: &[OsString]) -> (Command, PathBuf, PathBuf) {
    let sock = dir.join(format!("{tag}.sock"));
    let log = dir.join(format!("{tag}.log"));
    let mut cmd = udm();
    cmd.arg("serve")
        .arg("--socket")
        .arg(&sock)
        .arg("--no-control")
        .args(args)
        .current_dir(dir)
        .env("UDM_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (cmd, sock, log)
}

/// Start `udm serve ARGS` in `dir`; returns once it listens. Unlocking
/// (a full KDF search) happens before that, on a shared machine.
fn serve(dir: &Path, tag: &str, args: &[OsString]) -> Server {
    let (mut cmd, sock, log) = serve_cmd(dir, tag, args);
    let mut s = Server {
        child: cmd.spawn().unwrap(),
        sock,
        log,
    };
    let t = Instant::now();
    while UnixStream::connect(&s.sock).is_err() {
        if let Some(st) = s.child.try_wait().unwrap() {
            panic!(
                "udm serve {args:?} exited ({st}):\n{}",
                std::fs::read_to_string(&s.log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "udm serve did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

/// `udm serve ARGS` that must fail before serving: its exit code and log.
fn serve_fails(dir: &Path, tag: &str, args: &[OsString]) -> (Option<i32>, String) {
    let (mut cmd, _, log) = serve_cmd(dir, tag, args);
    let st = cmd.status().unwrap();
    (st.code(), std::fs::read_to_string(log).unwrap())
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Copy `export` out over NBD: its filesystem UUID and sha256.
fn read_export(dir: &Path, srv: &Server, export: &str) -> (String, String) {
    let copy = dir.join(format!("{export}.copy"));
    run(Command::new(need("nbdcopy"))
        .arg(srv.uri(export))
        .arg(&copy));
    let found = (fs_uuid(&copy, 0), sha256_of(&copy));
    std::fs::remove_file(&copy).unwrap();
    found
}

/// The export names the server lists.
fn exports(srv: &Server) -> String {
    run_text(
        Command::new(need("nbdinfo"))
            .arg("--list")
            .arg("--json")
            .arg(srv.uri("")),
    )
}

/// bitlk-images/images.conf: one section per image, KEY=VALUE lines.
fn bitlk_conf(dir: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("images.conf")).unwrap();
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut cur = String::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            cur = name.to_string();
            out.entry(cur.clone()).or_default();
        } else if let Some((k, v)) = line.split_once('=') {
            out.entry(cur.clone())
                .or_default()
                .insert(k.into(), v.into());
        }
    }
    out
}

/// The volume key `udm cryptsetup` dumps for `args`, as one hex string.
/// The volume key of TrueCrypt volume `file` (passphrase [`TC_PASS`],
/// KDFs narrowed to `hash`).
fn tcrypt_key(dir: &Path, hash: &str, file: &str) -> String {
    let args = ["tcryptDump", "-q", "--dump-volume-key", "-h", hash, file];
    dumped_key(dir, &args, TC_PASS)
}

fn dumped_key(dir: &Path, args: &[&str], pass: &str) -> String {
    let o = cs_piped(dir, None, args, pass);
    assert!(o.status.success(), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let at = text
        .find("MK dump:")
        .unwrap_or_else(|| panic!("no key dump:\n{text}"));
    text[at + 8..]
        .split_whitespace()
        .take_while(|w| w.len() == 2 && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

/// No 16-byte piece of `key` (hex), nor `pass`, in `log`.
fn assert_no_secret(log: &str, key: &str, pass: &str) {
    assert!(key.len() >= 32, "key dump too short: {key}");
    for i in (0..=key.len() - 32).step_by(32) {
        assert!(
            !log.to_lowercase().contains(&key[i..i + 32]),
            "key bytes in the log:\n{log}"
        );
    }
    assert!(!log.contains(pass), "passphrase in the log:\n{log}");
}

fn write(dir: &Path, name: &str, data: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

#[test]
fn serve_options_open_each_format() {
    need("blkid");
    let (_k1, tc) = unpack_upstream("tcrypt-images.tar.xz", "tcrypt-images");
    let (_k2, bl) = unpack_upstream("bitlk-images.tar.xz", "bitlk-images");
    let (_k3, fv) = unpack_upstream("fvault2-images.tar.xz", "fvault2-images");

    // A cascade: three stacked devices, the volume's own on top. The key
    // file's first line is the passphrase, as systemd reads it.
    write(&tc, "pass", &format!("{TC_PASS}\n"));
    let srv = serve(
        &tc,
        "tc",
        &os(&[
            "--tcrypt",
            &format!("ro:tc={TC_CASCADE}"),
            "--key-file",
            "pass",
        ]),
    );
    let list = exports(&srv);
    for e in ["\"tc\"", "\"tc_1\"", "\"tc_2\""] {
        assert!(list.contains(e), "{e} not listed:\n{list}");
    }
    assert_eq!(read_export(&tc, &srv, "tc").0, "DEAD-BABE");
    let key = tcrypt_key(&tc, "sha512", TC_CASCADE);
    assert_eq!(key.len(), 192 * 2, "three 512-bit XTS keys");
    assert_no_secret(&srv.stop(), &key, TC_PASS);

    // VeraCrypt with a PIM, the KDF search narrowed by --hash.
    write(&tc, "pim-pass", VC_PIM_PASS);
    let srv = serve(
        &tc,
        "vc",
        &os(&[
            "--tcrypt",
            &format!("vc={VC_PIM}"),
            "--key-file",
            "pim-pass",
            "--veracrypt-pim",
            "1234",
            "--hash",
            "sha256",
        ]),
    );
    assert_eq!(read_export(&tc, &srv, "vc").0, "DEAD-BABE");
    srv.stop();

    // BitLocker by passphrase.
    let conf = bitlk_conf(&bl);
    let c = &conf["bitlk-aes-xts-128"];
    write(&bl, "pw", &c["PW"]);
    let srv = serve(
        &bl,
        "bl",
        &os(&["--bitlk", "bl=bitlk-aes-xts-128.img", "--key-file", "pw"]),
    );
    assert_eq!(
        read_export(&bl, &srv, "bl"),
        (c["UUID"].clone(), c["SHA256SUM"].clone())
    );
    let key = dumped_key(
        &bl,
        &[
            "bitlkDump",
            "-q",
            "--dump-volume-key",
            "bitlk-aes-xts-128.img",
        ],
        &c["PW"],
    );
    assert_no_secret(&srv.stop(), &key, &c["PW"]);

    // FileVault2.
    write(&fv, "pw", FV_PASS);
    let srv = serve(
        &fv,
        "fv",
        &os(&["--fvault2", "fv=small", "--key-file", "pw"]),
    );
    assert_eq!(
        read_export(&fv, &srv, "fv"),
        (FV_UUID.to_string(), FV_SHA256.to_string())
    );
    assert_no_secret(&srv.stop(), FV_KEY, FV_PASS);
}

#[test]
fn crypttab_lines_open_truecrypt_and_bitlocker() {
    need("blkid");
    let (_k1, tc) = unpack_upstream("tcrypt-images.tar.xz", "tcrypt-images");
    let (_k2, bl) = unpack_upstream("bitlk-images.tar.xz", "bitlk-images");
    let conf = bitlk_conf(&bl);
    let rp = &conf["bitlk-aes-cbc-128"];
    let sk = &conf["bitlk-aes-xts-128-startup-key"];
    let tc_pass = write(&tc, "pass", &format!("{TC_PASS}\n"));
    let vc_pass = write(&tc, "pim-pass", VC_PIM_PASS);
    let rp_file = write(&bl, "rp", &rp["RP"]);
    let bek = bl.join(format!("{}.BEK", sk["SK_VMK_GUID"].to_uppercase()));
    let table = format!(
        "# TrueCrypt cascade, VeraCrypt with a PIM, BitLocker by recovery password and by startup key\n\
         tc {}/{TC_CASCADE} {} tcrypt,readonly\n\
         vc {}/{VC_PIM} {} tcrypt-veracrypt,veracrypt-pim=1234,hash=sha256,noauto\n\
         rp {}/bitlk-aes-cbc-128.img {} bitlk\n\
         sk {}/bitlk-aes-xts-128-startup-key.img {} bitlk,discard\n",
        tc.display(),
        tc_pass.display(),
        tc.display(),
        vc_pass.display(),
        bl.display(),
        rp_file.display(),
        bl.display(),
        bek.display(),
    );
    let ct = write(&bl, "crypttab", &table);
    let srv = serve(
        &bl,
        "ct",
        &[OsString::from("--crypttab"), ct.clone().into()],
    );
    let list = exports(&srv);
    for e in [
        "\"tc\"", "\"tc_1\"", "\"tc_2\"", "\"vc\"", "\"rp\"", "\"sk\"",
    ] {
        assert!(list.contains(e), "{e} not listed:\n{list}");
    }
    assert_eq!(read_export(&bl, &srv, "tc").0, "DEAD-BABE");
    assert_eq!(read_export(&bl, &srv, "vc").0, "DEAD-BABE");
    for (name, c) in [("rp", rp), ("sk", sk)] {
        assert_eq!(
            read_export(&bl, &srv, name),
            (c["UUID"].clone(), c["SHA256SUM"].clone()),
            "{name}"
        );
    }
    // The readonly line's devices (all three) are read-only exports; the
    // others are not.
    for (name, ro) in [("tc", true), ("tc_2", true), ("rp", false)] {
        let info = run_text(Command::new("nbdinfo").arg("--json").arg(srv.uri(name)));
        let flag = info
            .lines()
            .find(|l| l.contains("\"is_read_only\""))
            .unwrap_or_else(|| panic!("no is_read_only in:\n{info}"));
        assert_eq!(flag.contains("true"), ro, "{name}: {flag}");
    }
    // SIGHUP with the cascade's line gone closes all three of its
    // devices and keeps the others.
    let kept: String = table
        .lines()
        .filter(|l| !l.starts_with("tc "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&ct, kept).unwrap();
    // SAFETY: kill(2) with the pid of a child this test owns and a valid
    // signal.
    unsafe { libc::kill(srv.child.id() as i32, libc::SIGHUP) };
    wait_for("the cascade to close", Duration::from_secs(60), || {
        !exports(&srv).contains("\"tc_2\"")
    });
    let list = exports(&srv);
    assert!(
        !list.contains("\"tc\"") && !list.contains("\"tc_1\""),
        "{list}"
    );
    assert!(list.contains("\"vc\"") && list.contains("\"sk\""), "{list}");
    let log = srv.stop();
    assert_no_secret(&log, &rp["RP"].replace('-', ""), &rp["RP"]);
    assert!(
        !log.contains(VC_PIM_PASS) && !log.contains(TC_PASS),
        "{log}"
    );
}

#[test]
fn a_wrong_passphrase_names_the_volume() {
    let (_k1, tc) = unpack_upstream("tcrypt-images.tar.xz", "tcrypt-images");
    let (_k2, fv) = unpack_upstream("fvault2-images.tar.xz", "fvault2-images");
    write(&fv, "bad", "heslo124");
    let (code, log) = serve_fails(
        &fv,
        "fv",
        &os(&["--fvault2", "mac=small", "--key-file", "bad"]),
    );
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("--fvault2 mac: FVAULT2 volume on small")
            && log.contains("No key available with this passphrase."),
        "{log}"
    );
    assert!(!log.contains("heslo124"), "{log}");

    write(&tc, "bad", "bbbbbbbbbbbb\n");
    let ct = write(
        &tc,
        "crypttab",
        &format!("secret {TC_CASCADE} bad tcrypt\n"),
    );
    let (code, log) = serve_fails(&tc, "ct", &[OsString::from("--crypttab"), ct.into()]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("crypttab line 1 (secret): TCRYPT volume on")
            && log.contains("No key available with this passphrase."),
        "{log}"
    );
    assert!(!log.contains("bbbbbbbbbbbb"), "{log}");

    // Not a BitLocker volume at all: named too.
    let (code, log) = serve_fails(
        &tc,
        "bl",
        &os(&["--bitlk", "win=keyfile1", "--key-file", "bad"]),
    );
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("--bitlk win: BITLK volume on keyfile1"),
        "{log}"
    );
}

/// A TrueCrypt legacy blowfish volume (cryptsetup's archive keeps its
/// header and image sector 35, encrypted zeros).
const TC_LEGACY: &str = "tc_1-sha1-cbc-blowfish";

/// Copy `export` out over NBD: whether device sector 34 (image sector 35,
/// behind the 512-byte header) reads as the zeros TrueCrypt encrypted.
fn zero_sector_reads_zeros(dir: &Path, srv: &Server, export: &str) -> bool {
    let copy = dir.join(format!("{export}.copy"));
    run(Command::new(need("nbdcopy"))
        .arg(srv.uri(export))
        .arg(&copy));
    let zeros = pread(&copy, 34 * 512, 512).iter().all(|&b| b == 0);
    std::fs::remove_file(&copy).unwrap();
    zeros
}

/// TrueCrypt's legacy CBC volumes are refused by `--tcrypt` and by a
/// crypttab `tcrypt` line as cryptsetup refuses them (its message), with
/// udm's way out named; `--allow-tcrypt-legacy` and crypttab's
/// `tcrypt-legacy` serve them with udm's own crypt line.
#[test]
fn legacy_truecrypt_volumes_need_their_option() {
    need("nbdcopy");
    let (_k, tc) = unpack_upstream("tcrypt-images.tar.xz", "tcrypt-images");
    let pass = write(&tc, "pass", &format!("{TC_PASS}\n"));
    let vol = format!("old={TC_LEGACY}");
    let args = ["--tcrypt", &vol, "--key-file", "pass", "--hash", "sha1"];
    let (code, log) = serve_fails(&tc, "legacy", &os(&args));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("Kernel does not support activation for this TCRYPT legacy mode.")
            && log.contains("add --allow-tcrypt-legacy"),
        "{log}"
    );
    let mut with = os(&args);
    with.push("--allow-tcrypt-legacy".into());
    let srv = serve(&tc, "legacy", &with);
    assert!(zero_sector_reads_zeros(&tc, &srv, "old"));
    let key = tcrypt_key(&tc, "sha1", TC_LEGACY);
    assert_no_secret(&srv.stop(), &key, TC_PASS);

    let ct = tc.join("crypttab");
    let line = |opts: &str| {
        let text = format!(
            "old {}/{TC_LEGACY} {} {opts}\n",
            tc.display(),
            pass.display()
        );
        std::fs::write(&ct, text).unwrap();
        vec![OsString::from("--crypttab"), ct.clone().into()]
    };
    let (code, log) = serve_fails(&tc, "ct-legacy", &line("tcrypt,hash=sha1"));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("crypttab line 1 (old)") && log.contains("tcrypt-legacy to its crypttab line"),
        "{log}"
    );
    let srv = serve(&tc, "ct-legacy", &line("tcrypt,tcrypt-legacy,hash=sha1"));
    assert!(zero_sector_reads_zeros(&tc, &srv, "old"));
    srv.stop();
}
