//! `udm cryptsetup` against cryptsetup 2.6 itself: one script of
//! cryptsetup command lines is run twice, once by `cryptsetup` and once by
//! udm started through a link named `cryptsetup` (argv[0] dispatch), each
//! on its own copy of the same images. After every step the exit codes
//! must be equal (and equal to the code the script expects, so a step that
//! fails for an unrelated reason on both sides is caught), printed output
//! equal where the step prints, and the resulting headers equal as
//! cryptsetup reads them (`luksDump --dump-json-metadata` for LUKS2,
//! `luksDump` for LUKS1), salts and digests aside. At the end each side's
//! volume opens with the other tool.
//!
//! FAILS if cryptsetup is missing (apt-get install cryptsetup-bin).

mod common;

use common::luks::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Which output of a step is compared.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Out {
    /// Exit code and header only.
    Code,
    /// Also stdout, byte for byte.
    Stdout,
    /// Also stdout, parsed as JSON and normalised.
    Json,
}

struct Step {
    args: Vec<String>,
    code: i32,
    out: Out,
}

const FAST: &str = "--pbkdf pbkdf2 --pbkdf-force-iterations 1000";

fn step(cmd: &str, code: i32, out: Out) -> Step {
    Step {
        args: cmd
            .replace("FAST", FAST)
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        code,
        out,
    }
}

/// A directory holding `cryptsetup` → the udm binary.
fn udm_as_cryptsetup(dir: &Path) -> PathBuf {
    let link = dir.join("cryptsetup");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_udm"), &link).unwrap();
    link
}

/// Run one step with `prog`, `@IMG` being `img`, `@D` this side's
/// directory and `@K` the shared key directory. Stdin is empty (a pipe at
/// EOF), as in a script run from cron.
fn run_step(prog: &Path, s: &Step, img: &Path, side: &Path, keys: &Path) -> Output {
    let args: Vec<String> = s
        .args
        .iter()
        .map(|a| {
            a.replace("@IMG", &img.display().to_string())
                .replace("@D", &side.display().to_string())
                .replace("@K", &keys.display().to_string())
        })
        .collect();
    Command::new(prog)
        .args(&args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {prog:?}: {e}"))
}

/// Salts and digests are random per side; everything else must match.
fn normalise(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                if (k == "salt" || k == "digest") && x.is_string() {
                    let n = x.as_str().map_or(0, str::len);
                    *x = Value::String(format!("<base64 of {n} chars>"));
                } else {
                    normalise(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        _ => {}
    }
}

/// The header as cryptsetup reads it, normalised.
fn header_state(img: &Path) -> String {
    let o = cryptsetup()
        .args(["luksDump", "--dump-json-metadata"])
        .arg(img)
        .output()
        .unwrap();
    if o.status.success() {
        let mut v: Value = serde_json::from_slice(&o.stdout).unwrap();
        normalise(&mut v);
        // Key order inside objects is not part of the format.
        let mut s = serde_json::to_string_pretty(&sorted(&v)).unwrap();
        s.push_str(&dump_fields(img));
        return s;
    }
    let o = cryptsetup().arg("luksDump").arg(img).output().unwrap();
    if !o.status.success() {
        return format!(
            "(not a LUKS device: {})",
            String::from_utf8_lossy(&o.stderr).replace(&img.display().to_string(), "@IMG")
        );
    }
    // LUKS1: drop hex dumps (salts, digests) and their continuation lines.
    String::from_utf8_lossy(&o.stdout)
        .replace(&img.display().to_string(), "@IMG")
        .lines()
        .filter(|l| {
            let secret = l.contains("Salt:") || l.contains("MK digest") || l.contains("MK salt");
            let hex_continuation = l
                .trim_start()
                .chars()
                .take(3)
                .all(|c| c.is_ascii_hexdigit() || c == ' ');
            !secret && !hex_continuation
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// UUID, label and subsystem from the text dump (they live in the binary
/// header, not in the JSON).
fn dump_fields(img: &Path) -> String {
    let o = cryptsetup().arg("luksDump").arg(img).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| {
            l.starts_with("UUID:") || l.starts_with("Label:") || l.starts_with("Subsystem:")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let mut m = serde_json::Map::new();
            for k in keys {
                m.insert(k.clone(), sorted(&o[k]));
            }
            Value::Object(m)
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        x => x.clone(),
    }
}

fn compare_out(s: &Step, cs: &Output, ud: &Output, cs_img: &Path, ud_img: &Path) {
    let norm = |o: &Output, img: &Path| -> String {
        String::from_utf8_lossy(&o.stdout).replace(&img.display().to_string(), "@IMG")
    };
    match s.out {
        Out::Code => {}
        Out::Stdout => assert_eq!(
            norm(ud, ud_img),
            norm(cs, cs_img),
            "stdout of `{}` differs",
            s.args.join(" ")
        ),
        Out::Json => {
            let mut a: Value = serde_json::from_slice(&cs.stdout).unwrap();
            let mut b: Value = serde_json::from_slice(&ud.stdout).unwrap();
            normalise(&mut a);
            normalise(&mut b);
            assert_eq!(
                sorted(&b),
                sorted(&a),
                "JSON of `{}` differs",
                s.args.join(" ")
            );
        }
    }
}

/// Run `script` on copies of `image` with both tools, comparing as the
/// module docs say. Returns both sides' final images.
fn compare(
    name: &str,
    image: &Path,
    script: &[Step],
    keys: &Path,
    root: &Path,
) -> (PathBuf, PathBuf) {
    let cs_dir = root.join(format!("{name}-cryptsetup"));
    let ud_dir = root.join(format!("{name}-udm"));
    std::fs::create_dir_all(&cs_dir).unwrap();
    std::fs::create_dir_all(&ud_dir).unwrap();
    let udm_prog = udm_as_cryptsetup(&ud_dir);
    let cs_prog = PathBuf::from(need("cryptsetup"));
    let cs_img = cs_dir.join("img");
    let ud_img = ud_dir.join("img");
    std::fs::copy(image, &cs_img).unwrap();
    std::fs::copy(image, &ud_img).unwrap();
    for (i, s) in script.iter().enumerate() {
        let cs = run_step(&cs_prog, s, &cs_img, &cs_dir, keys);
        let ud = run_step(&udm_prog, s, &ud_img, &ud_dir, keys);
        let what = format!("{name} step {i} `cryptsetup {}`", s.args.join(" "));
        assert_eq!(
            cs.status.code(),
            Some(s.code),
            "{what}: cryptsetup's exit code is not the expected one:\n{}",
            show(&cs)
        );
        assert_eq!(
            ud.status.code(),
            cs.status.code(),
            "{what}: exit code differs from cryptsetup's\nudm:\n{}\ncryptsetup:\n{}",
            show(&ud),
            show(&cs)
        );
        compare_out(s, &cs, &ud, &cs_img, &ud_img);
        assert_eq!(
            header_state(&ud_img),
            header_state(&cs_img),
            "{what}: resulting header differs from cryptsetup's"
        );
    }
    (cs_img, ud_img)
}

fn keys(d: &Path) -> PathBuf {
    let k = d.join("keys");
    std::fs::create_dir_all(&k).unwrap();
    for (n, v) in [
        ("k0", "first"),
        ("k1", "second"),
        ("k2", "third"),
        ("k3", "fourth"),
        ("bad", "wrong"),
        ("vk32", "an unbound key of 32 bytes here!"),
    ] {
        let p = write_file(&k, n, v.as_bytes());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(
        k.join("tok.json"),
        br#"{"type":"x-udm-test","keyslots":[],"where":"a/b"}"#,
    )
    .unwrap();
    k
}

/// The verbs every LUKS version shares; `l2` marks LUKS2-only outcomes.
fn key_script(l2: bool) -> Vec<Step> {
    let only2 = |c: i32| if l2 { c } else { 1 };
    vec![
        step("luksAddKey FAST --key-file @K/k0 @IMG @K/k1", 0, Out::Code),
        step("luksAddKey FAST --key-file @K/bad @IMG @K/k2", 2, Out::Code),
        step("open --test-passphrase --key-file @K/k1 @IMG", 0, Out::Code),
        step("open --test-passphrase --key-file @K/bad @IMG", 2, Out::Code),
        step("open --test-passphrase --key-slot 5 --key-file @K/k1 @IMG", 1, Out::Code),
        step("open --test-passphrase --key-slot 1 --key-file @K/k1 @IMG", 0, Out::Code),
        step("luksAddKey -q FAST --key-slot 5 --key-file @K/k1 @IMG @K/k2", 0, Out::Code),
        step("luksAddKey -q FAST --key-slot 5 --key-file @K/k1 @IMG @K/k2", 1, Out::Code),
        step("luksAddKey FAST --new-key-slot 6 --key-slot 1 --key-file @K/k1 @IMG @K/k3", 0, Out::Code),
        step("luksKillSlot -q @IMG 6", 0, Out::Code),
        step("luksChangeKey FAST --key-file @K/k1 @IMG @K/k3", 0, Out::Code),
        step("open --test-passphrase --key-file @K/k1 @IMG", 2, Out::Code),
        step(
            "luksConvertKey --key-file @K/k3 --pbkdf argon2id --pbkdf-force-iterations 4 --pbkdf-memory 32 --pbkdf-parallel 1 @IMG",
            only2(0),
            Out::Code,
        ),
        step("luksKillSlot --key-file @K/k2 @IMG 5", 2, Out::Code),
        step("luksKillSlot --key-file @K/k0 @IMG 5", 0, Out::Code),
        step("luksKillSlot -q @IMG 7", 1, Out::Code),
        step("luksRemoveKey --key-file @K/k3 @IMG", 0, Out::Code),
        step("luksRemoveKey --key-file @K/k3 @IMG", 2, Out::Code),
        step("luksUUID @IMG", 0, Out::Stdout),
        step("luksUUID -q --uuid 12345678-1234-4234-8234-123456789abc @IMG", 0, Out::Code),
        step("luksUUID -q --uuid not-a-uuid @IMG", 1, Out::Code),
        step("luksUUID @IMG", 0, Out::Stdout),
        step("config --label lab --subsystem sub @IMG", only2(0), Out::Code),
        step("config --priority prefer --key-slot 0 @IMG", only2(0), Out::Code),
        step("config --priority ignore @IMG", 1, Out::Code),
        step("isLuks @IMG", 0, Out::Code),
        step(if l2 { "isLuks --type luks1 @IMG" } else { "isLuks --type luks2 @IMG" }, 1, Out::Code),
        step("isLuks @K/k0", 1, Out::Code),
        step("isLuks @IMG @IMG", 4, Out::Code),
        step("token add --key-description some-key @IMG", only2(0), Out::Code),
        step("token export --token-id 0 @IMG", only2(0), Out::Stdout),
        step("token import --json-file @K/tok.json --token-id 3 --key-slot 0 @IMG", only2(0), Out::Code),
        step("token import --json-file @K/tok.json --token-id 3 @IMG", 1, Out::Code),
        step("token unassign --token-id 3 --key-slot 0 @IMG", only2(0), Out::Code),
        step("token remove --token-id 0 @IMG", only2(0), Out::Code),
        step("token remove --token-id 0 @IMG", 1, Out::Code),
        step("luksDump --dump-json-metadata @IMG", only2(0), if l2 { Out::Json } else { Out::Code }),
        step("luksDump -q --dump-volume-key --key-file @K/k0 @IMG", 0, Out::Stdout),
        step("luksHeaderBackup --header-backup-file @D/bk @IMG", 0, Out::Code),
        step("luksHeaderBackup --header-backup-file @D/bk @IMG", 1, Out::Code),
        step("erase -q @IMG", 0, Out::Code),
        step("open --test-passphrase --key-file @K/k0 @IMG", 1, Out::Code),
        step("luksHeaderRestore -q --header-backup-file @D/bk @IMG", 0, Out::Code),
        step("open --test-passphrase --key-file @K/k0 @IMG", 0, Out::Code),
        step("repair -q @IMG", 0, Out::Code),
        step("luksDump --nonsense @IMG", 1, Out::Code),
        step("luksDump", 1, Out::Code),
        step("luksDump --label x @IMG", 1, Out::Code),
        step("notAnAction @IMG", 1, Out::Code),
        step("luksDump @D/missing.img", 4, Out::Code),
        step("luksAddKey --key-file @K/missing @IMG @K/k1", 1, Out::Code),
    ]
}

fn formatted(d: &Path, name: &str, opts: &str, size: u64) -> PathBuf {
    let img = sparse(d, name, size);
    let opts: Vec<&str> = opts.split_whitespace().collect();
    cs_format(&img, &opts, &d.join("keys/k0"));
    img
}

/// Unbound keys (LUKS2 keyslots whose key no segment uses): added with a
/// random key and with a known one, their passphrases tested, changed and
/// removed, the key dumped; a plain `open` does not take them (cryptsetup's
/// "No usable keyslot", exit 1), `--unbound` does.
fn unbound_script() -> Vec<Step> {
    vec![
        step(
            "luksAddKey FAST --unbound --key-size 256 --key-slot 3 @IMG @K/k2",
            0,
            Out::Code,
        ),
        step("luksAddKey FAST --unbound @IMG @K/k2", 1, Out::Code),
        step(
            "luksAddKey FAST --unbound --key-size 256 --volume-key-file @K/vk32 @IMG @K/k3",
            0,
            Out::Code,
        ),
        step("open --test-passphrase --key-file @K/k2 @IMG", 1, Out::Code),
        step(
            "open --test-passphrase --unbound --key-file @K/k2 @IMG",
            0,
            Out::Code,
        ),
        step(
            "open --test-passphrase --key-slot 3 --key-file @K/k2 @IMG",
            0,
            Out::Code,
        ),
        step(
            "open --test-passphrase --unbound --key-file @K/bad @IMG",
            2,
            Out::Code,
        ),
        step("open --unbound --key-file @K/k2 @IMG x", 1, Out::Code),
        step(
            "luksDump -q --unbound --key-slot 0 --key-file @K/k0 @IMG",
            1,
            Out::Code,
        ),
        step("luksDump -q --unbound --key-file @K/k3 @IMG", 1, Out::Code),
        step(
            "luksDump -q --unbound --key-slot 1 --key-file @K/k2 @IMG",
            2,
            Out::Code,
        ),
        step(
            "luksDump -q --unbound --key-slot 1 --key-file @K/k3 @IMG",
            0,
            Out::Stdout,
        ),
        step(
            "luksChangeKey FAST --key-file @K/k3 @IMG @K/k1",
            0,
            Out::Code,
        ),
        step(
            "luksDump -q --unbound --key-slot 1 --key-file @K/k1 @IMG",
            0,
            Out::Stdout,
        ),
        step("luksRemoveKey --key-file @K/k1 @IMG", 1, Out::Code),
        step("luksKillSlot -q @IMG 3", 0, Out::Code),
        step("luksKillSlot --key-file @K/k0 @IMG 1", 0, Out::Code),
        step("open --test-passphrase --key-file @K/k0 @IMG", 0, Out::Code),
    ]
}

/// Put a `user` key in the user keyring (where cryptsetup's
/// `luks2-keyring` token finds it through the session keyring).
fn keyring_put(description: &str, payload: &[u8]) {
    let ty = std::ffi::CString::new("user").unwrap();
    let desc = std::ffi::CString::new(description).unwrap();
    // SAFETY: add_key(2) reads the two NUL-terminated strings and
    // `payload.len()` bytes of `payload`, all alive for the call.
    let id = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            ty.as_ptr(),
            desc.as_ptr(),
            payload.as_ptr(),
            payload.len(),
            -4 as libc::c_int, // KEY_SPEC_USER_KEYRING
        )
    };
    assert!(
        id > 0,
        "add_key {description}: {}",
        std::io::Error::last_os_error()
    );
}

/// `luks2-keyring` tokens as the key source: `open --test-passphrase`
/// tries them before a passphrase (`--token-only`, `--token-id`,
/// `--token-type`), `luksAddKey --token-id` proves the existing key with
/// one; a token whose key is wrong or missing fails with exit 2, no usable
/// token with exit 1, as cryptsetup.
#[test]
fn keyring_tokens_unlock_as_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let tag = format!("udm-test:{}", std::process::id());
    keyring_put(&format!("{tag}:good"), b"second");
    keyring_put(&format!("{tag}:bad"), b"wrong");
    let img = formatted(
        d,
        "tok.img",
        "--type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000",
        20 << 20,
    );
    let script = vec![
        step("luksAddKey FAST --key-file @K/k0 @IMG @K/k1", 0, Out::Code),
        step(
            &format!("token add --key-description {tag}:good --key-slot 1 @IMG"),
            0,
            Out::Code,
        ),
        step(
            &format!("token add --key-description {tag}:bad --key-slot 0 @IMG"),
            0,
            Out::Code,
        ),
        step(
            &format!("token add --key-description {tag}:missing --key-slot 0 @IMG"),
            0,
            Out::Code,
        ),
        step("open --test-passphrase --token-only @IMG", 0, Out::Code),
        step(
            "open --test-passphrase --token-only -v @IMG",
            0,
            Out::Stdout,
        ),
        step(
            "open --test-passphrase --token-only --token-id 1 @IMG",
            2,
            Out::Code,
        ),
        step(
            "open --test-passphrase --token-only -v --token-id 2 @IMG",
            2,
            Out::Stdout,
        ),
        step(
            "open --test-passphrase --token-only --token-id 5 @IMG",
            1,
            Out::Code,
        ),
        step(
            "open --test-passphrase --token-only --token-type luks2-keyring @IMG",
            0,
            Out::Code,
        ),
        step(
            "open --test-passphrase --token-only --token-type other @IMG",
            1,
            Out::Code,
        ),
        step(
            "open --test-passphrase --token-id 1 --key-file @K/k0 @IMG",
            0,
            Out::Code,
        ),
        step("luksAddKey FAST --token-id 0 @IMG @K/k2", 0, Out::Code),
        step("luksAddKey FAST --token-id 1 @IMG @K/k3", 2, Out::Code),
        step("token remove --token-id 0 @IMG", 0, Out::Code),
        step("open --test-passphrase --token-only @IMG", 2, Out::Code),
        step("open --test-passphrase --key-file @K/k2 @IMG", 0, Out::Code),
    ];
    let (cs, ud) = compare("tokens", &img, &script, &k, d);
    assert!(udm::luks::open(&cs, None, b"third").is_ok());
    assert!(cs_test(&ud, None, &k.join("k2")));
}

/// `token export --json-file` over an existing, longer file replaces it
/// (it used to overwrite the start and leave the old tail, so the file was
/// no longer the token's JSON). cryptsetup 2.6 leaves the tail too; udm
/// deliberately differs, so the file is compared with the token as
/// exported to stdout.
#[test]
fn token_export_replaces_a_longer_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let img = formatted(d, "exp.img", &format!("--type luks2 {FAST}"), 20 << 20);
    let tok = d.join("tok.json");
    std::fs::write(&tok, br#"{"type":"t","keyslots":[]}"#).unwrap();
    let import = |prog: &Path| {
        let o = run_step(
            prog,
            &step(
                "token import --json-file @D/tok.json --token-id 1 @IMG",
                0,
                Out::Code,
            ),
            &img,
            d,
            &k,
        );
        assert!(o.status.success(), "{}", show(&o));
    };
    std::fs::create_dir(d.join("bin")).unwrap();
    let link = udm_as_cryptsetup(&d.join("bin"));
    import(&link);
    let export = |prog: &Path, out: &str| {
        let path = d.join(out);
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let cmd = format!("token export --token-id 1 --json-file @D/{out} @IMG");
        let o = run_step(prog, &step(&cmd, 0, Out::Code), &img, d, &k);
        assert!(o.status.success(), "{}", show(&o));
        std::fs::read(&path).unwrap()
    };
    let ours = export(&link, "ud.json");
    let v: Value = serde_json::from_slice(&ours)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&ours)));
    assert_eq!(v["type"], "t", "{v}");
    assert!(!ours.contains(&b'x'), "{}", String::from_utf8_lossy(&ours));
    let o = run_step(
        &link,
        &step("token export --token-id 1 @IMG", 0, Out::Code),
        &img,
        d,
        &k,
    );
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&ours).trim_end(),
        String::from_utf8_lossy(&o.stdout).trim_end()
    );
}

#[test]
fn unbound_keys_match_cryptsetup_step_by_step() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let img = formatted(
        d,
        "ub.img",
        "--type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000",
        20 << 20,
    );
    let (cs, ud) = compare("unbound", &img, &unbound_script(), &k, d);
    assert!(udm::luks::open(&cs, None, b"first").is_ok());
    assert!(cs_test(&ud, None, &k.join("k0")));
    // LUKS1 has no unbound keys: both refuse with exit 1.
    let l1 = formatted(
        d,
        "l1.img",
        "--type luks1 --pbkdf-force-iterations 1000",
        8 << 20,
    );
    compare(
        "unbound-luks1",
        &l1,
        &[step(
            "luksAddKey FAST --unbound --key-size 256 @IMG @K/k2",
            1,
            Out::Code,
        )],
        &k,
        d,
    );
}

/// The keyslots area against a requested data offset, inside and with a
/// detached header: it fills the space below the offset, a given size
/// shrinks to fit, and libcryptsetup's two warnings (a very small area,
/// a changed size) appear on stdout as cryptsetup prints them. A new
/// detached header file is made readable by its owner only.
#[test]
fn keyslots_area_follows_the_data_offset_as_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let img = d.join("blank.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(48 << 20)
        .unwrap();
    let f = "luksFormat -q --type luks2 FAST --key-file @K/k0 \
             --uuid 0a1b2c3d-1111-4222-8333-444455556666";
    let script = [
        // Refused on the blank image (cryptsetup wipes an existing header
        // before it refuses; udm leaves it, so only a blank one compares).
        step(&format!("{f} --offset 40 @IMG"), 1, Out::Code),
        step(&format!("{f} --offset 4096 @IMG"), 0, Out::Stdout),
        step(
            &format!("{f} --offset 8192 --luks2-keyslots-size 8M @IMG"),
            0,
            Out::Stdout,
        ),
        step(&format!("{f} --offset 4000 @IMG"), 0, Out::Stdout),
        // cryptsetup's sector size for a requested offset (512 here).
        step(&format!("{f} --offset 6144 @IMG"), 0, Out::Stdout),
        step(
            &format!("{f} --luks2-keyslots-size 1M @IMG"),
            0,
            Out::Stdout,
        ),
        step(
            &format!("{f} --header @D/h1 --offset 4096 --luks2-keyslots-size 8M @IMG"),
            0,
            Out::Stdout,
        ),
        step("luksDump --dump-json-metadata @D/h1", 0, Out::Json),
        step(
            &format!("{f} --header @D/h2 --offset 65536 @IMG"),
            0,
            Out::Stdout,
        ),
        step("luksDump --dump-json-metadata @D/h2", 0, Out::Json),
    ];
    let (cs, ud) = compare("ks-offset", &img, &script, &k, d);
    for h in ["h1", "h2"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = |img: &Path| {
            let p = img.parent().unwrap().join(h);
            std::fs::metadata(p).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&ud), mode(&cs), "mode of the new header {h}");
        assert_eq!(mode(&ud), 0o600);
    }
    // Each side's detached header opens the other side's way.
    let h2 = |img: &Path| img.parent().unwrap().join("h2");
    assert!(udm::luks::open(&cs, Some(&h2(&cs)), b"first").is_ok());
    assert!(cs_test(&ud, Some(&h2(&ud)), &k.join("k0")));
}

#[test]
fn luks2_verbs_match_cryptsetup_step_by_step() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let img = formatted(
        d,
        "l2.img",
        "--type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000",
        20 << 20,
    );
    let (cs, ud) = compare("luks2", &img, &key_script(true), &k, d);
    // Each side's result opens in the other tool.
    assert!(udm::luks::open(&cs, None, b"first").is_ok());
    assert!(cs_test(&ud, None, &k.join("k0")));
}

#[test]
fn luks1_verbs_match_cryptsetup_step_by_step() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let img = formatted(
        d,
        "l1.img",
        "--type luks1 --pbkdf-force-iterations 1000",
        8 << 20,
    );
    let (cs, ud) = compare("luks1", &img, &key_script(false), &k, d);
    assert!(udm::luks::open(&cs, None, b"first").is_ok());
    assert!(cs_test(&ud, None, &k.join("k0")));
}

/// luksFormat with the same explicit choices (the UUID too) gives the same
/// header; conversion both ways gives cryptsetup's layout.
#[test]
fn format_and_convert_match_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let k = keys(d);
    let blank = sparse(d, "blank.img", 24 << 20);
    let u = "--uuid 0badc0de-1234-4234-8234-123456789abc";
    let script = vec![
        step(&format!("luksFormat -q FAST {u} --label L @IMG @K/k0"), 0, Out::Code),
        step("open --test-passphrase --key-file @K/k0 @IMG", 0, Out::Code),
        step(&format!("luksFormat -q FAST {u} --type luks2 --sector-size 512 --key-size 256 --luks2-metadata-size 64k @IMG --key-file @K/k1"), 0, Out::Code),
        step(&format!("luksFormat -q FAST {u} --type luks2 --cipher aes-cbc-essiv:sha256 --key-size 256 --offset 65536 @IMG @K/k1"), 0, Out::Code),
        step(&format!("luksFormat -q FAST {u} --type luks1 --hash sha1 @IMG @K/k0"), 0, Out::Code),
        step("luksAddKey FAST --key-file @K/k0 --key-slot 3 -q @IMG @K/k2", 0, Out::Code),
        step("convert -q --type luks1 @IMG", 1, Out::Code),
        step("convert -q --type luks2 @IMG", 0, Out::Code),
        step("open --test-passphrase --key-file @K/k2 @IMG", 0, Out::Code),
        step("convert -q --type luks2 @IMG", 1, Out::Code),
        step("convert -q --type luks1 @IMG", 0, Out::Code),
        step("open --test-passphrase --key-file @K/k0 @IMG", 0, Out::Code),
        step(&format!("luksFormat -q {u} --type luks2 --pbkdf argon2id --pbkdf-force-iterations 4 --pbkdf-memory 64 --pbkdf-parallel 1 @IMG @K/k0"), 0, Out::Code),
        step("convert -q --type luks1 @IMG", 1, Out::Code),
        step("luksFormat -q --type plain @IMG @K/k0", 1, Out::Code),
        step("luksFormat -q --sector-size 1000 @IMG @K/k0", 1, Out::Code),
        step("luksFormat -q --offset 8 --align-payload 8 @IMG @K/k0", 1, Out::Code),
        step("luksFormat -q FAST @D/missing.img @K/k0", 4, Out::Code),
    ];
    let (cs, ud) = compare("format", &blank, &script, &k, d);
    assert!(udm::luks::open(&cs, None, b"first").is_ok());
    assert!(cs_test(&ud, None, &k.join("k0")));
    // The LUKS1 → LUKS2 → LUKS1 round trip is byte-identical to
    // cryptsetup's (no random salt survives in a LUKS1 header).
    let l1 = formatted(
        d,
        "rt.img",
        "--type luks1 --pbkdf-force-iterations 1000",
        8 << 20,
    );
    let (a, b) = (d.join("rt-cs.img"), d.join("rt-udm.img"));
    std::fs::copy(&l1, &a).unwrap();
    std::fs::copy(&l1, &b).unwrap();
    let link_dir = d.join("link");
    std::fs::create_dir_all(&link_dir).unwrap();
    let prog = udm_as_cryptsetup(&link_dir);
    for to in ["luks2", "luks1"] {
        run(cryptsetup().args(["convert", "-q", "--type", to]).arg(&a));
        run(Command::new(&prog)
            .args(["convert", "-q", "--type", to])
            .arg(&b));
    }
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "round trip differs from cryptsetup's"
    );
}
