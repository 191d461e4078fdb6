//! cryptsetup's own test scripts, run with udm as `cryptsetup`: the
//! strongest check that udm behaves as the tool it replaces. The scripts
//! and images are other projects' files kept beside the repository
//! (`shared/upstream/cryptsetup-tests`, found in an ancestor folder of the
//! crate or named by `UDM_UPSTREAM`); they are copied to a scratch folder
//! and never into the repository. FAILS (never skips) when the folder, jq
//! or xxd is missing.
//!
//! Each script's result is broken into cases (an image of
//! `luks2-validation-test`, one volume of a `*-compat-test`), every case is
//! printed, and the outcome is compared with [`EXPECTED_FAILURES`]: the
//! test fails on a case that fails without being listed (a regression), and
//! on a listed case that now passes (so the list only shrinks).
//!
//! A `[N/A]` is a skip, so it fails, with one exception that follows the
//! script's own verdict: `bitlk-compat-test` prints `[N/A]` when opening
//! a volume fails with exit code 1, which is what it expects of the
//! volumes cryptsetup refuses (encrypt-on-write, partly encrypted), and
//! `tcrypt-compat-test` when `tcryptOpen` fails with exit code 1 saying
//! "TCRYPT legacy mode" (TrueCrypt's legacy blowfish and CBC cascades).
//! Such a case passes only when the real cryptsetup refuses the same
//! image, run here the same way, with the same exit code and the same
//! first line as udm, and udm's message names its way out
//! (`--allow-partial-bitlk`, `--allow-tcrypt-legacy`); it is reported as
//! "PASS (refused as cryptsetup refuses it: ...)". Any other `[N/A]`
//! still fails.
//!
//! One fallback, for TrueCrypt only: cryptsetup decrypts those headers
//! with the kernel's ciphers (AF_ALG; OpenSSL has no serpent, twofish or
//! TrueCrypt's blowfish), so on a kernel without them it stops before the
//! header with "Required kernel crypto interface not available." and
//! never reaches its refusal. Then, and only then, udm's refusal is
//! checked against cryptsetup 2.6.1's source instead ([`TCRYPT_LEGACY`]:
//! its `TCRYPT_activate` refuses any mode containing `-tcrypt` with that
//! line, exit 1): udm's first line must be that one, exit 1, and udm's
//! `tcryptDump` of the volume must show such a mode.
//!
//! What runs: `luks2-validation-test` whole; the passphrase and dump parts
//! of `luks1-compat-test`, `tcrypt-compat-test`, `bitlk-compat-test` and
//! `fvault2-compat-test`, one volume at a time (each script stops at its
//! first failure, so a volume alone in its archive gives every volume a
//! result of its own). The scripts' activation parts read
//! `/dev/mapper/NAME` as a file and run only as root: with [`ACTIVATION`]
//! each script runs in a private mount namespace (`unshare -m`) where a
//! `udm serve --mapper-dir /dev/mapper` of its own shows udm's devices
//! there, with udm as `dmsetup` too, so the scripts compare each volume's
//! filesystem UUID and sha256 as they do on a kernel.
//!
//! `verity-compat-test` (a test of its own, [`verity_compat_test_against_udm`])
//! also tests `[ -b /dev/mapper/NAME ]` and runs `blockdev` on it, so its
//! server keeps the files in a private folder and puts block nodes on
//! /dev/mapper (`--mapper-block`, a tmpfs there); udm is `veritysetup` and
//! `dmsetup`. It runs whole, and when it fails, once per section (the
//! script stops at its first failure), with [`VERITY_EXPECTED_FAILURES`].
//!
//! `integrity-compat-test` ([`integrity_compat_test_against_udm`]) runs the
//! same way with udm as `integritysetup` (in integritysetup 2.8's wording,
//! which the script reads) and `dmsetup`, cut into sections by
//! [`integrity_sections`], with [`INTEGRITY_EXPECTED_FAILURES`].

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Cases known to fail, or skipped by the script, each with why (none
/// now). Keys are `script/case`.
const EXPECTED_FAILURES: &[(&str, &str)] = &[];

/// Scripts whose every case is expected to fail, with why (none now).
const EXPECTED_FAILING_SCRIPTS: &[(&str, &str)] = &[];

/// Run the scripts' activation parts: as root, inside `unshare -m` with a
/// server's mapper directory on /dev/mapper (see [`ACTIVATE_SH`]). Off,
/// a fake `id` answering 1000 makes the scripts stop before them.
const ACTIVATION: bool = true;

/// Runs its arguments with udm serving its devices as files on
/// /dev/mapper, in the private mount namespace it was started in; the
/// server stops when they end. `$W` is a scratch folder of its own.
const ACTIVATE_SH: &str = r#"#!/bin/bash
W=$(mktemp -d)
export UDM_CONTROL=$W/ctl
mount --make-rprivate / || exit 90
[ -d /dev/mapper ] || mkdir -p /dev/mapper
"$UDM_BIN" serve --socket "$W/nbd.sock" --control "$UDM_CONTROL" \
    --mapper-dir /dev/mapper 2>"$W/serve.log" &
srv=$!
for _ in $(seq 200); do
    grep -q ' /dev/mapper ' /proc/self/mountinfo && [ -S "$UDM_CONTROL" ] && break
    sleep 0.05
done
grep -q ' /dev/mapper ' /proc/self/mountinfo || { cat "$W/serve.log"; exit 91; }
"$@"
rc=$?
kill "$srv"
wait "$srv"
rm -rf "$W"
exit $rc
"#;

/// `losetup`, then for `-P` the partitions added one by one with `partx
/// -a`: this machine's kernel reads no partition tables itself (no MSDOS
/// or EFI partition support), so `losetup -P` alone makes no
/// `/dev/loopNpM`; with them, the TrueCrypt system volumes are opened
/// through their partitions as the script asks.
const LOSETUP_SH: &str = r#"#!/bin/bash
out=$(/usr/sbin/losetup "$@") || exit $?
[ -n "$out" ] && printf '%s\n' "$out"
for a in "$@"; do
    case "$a" in
        --partscan | -P | -[!-]*P*) [ -b "$out" ] && partx -a "$out" 2>/dev/null ;;
    esac
done
exit 0
"#;

/// [`ACTIVATE_SH`] for scripts that want block devices: the files in a
/// folder of the namespace's own, the block nodes on a tmpfs over
/// /dev/mapper (nothing of it reaches the host's /dev).
const ACTIVATE_BLOCK_SH: &str = r#"#!/bin/bash
W=$(mktemp -d)
export UDM_CONTROL=$W/ctl
mount --make-rprivate / || exit 90
mkdir -p /dev/mapper && mount -t tmpfs -o mode=755 udm-nodes /dev/mapper || exit 90
"$UDM_BIN" serve --socket "$W/nbd.sock" --control "$UDM_CONTROL" \
    --mapper-dir "$W/files" --mapper-block /dev/mapper 2>"$W/serve.log" &
srv=$!
for _ in $(seq 200); do
    [ -S "$UDM_CONTROL" ] && grep -q " $W/files " /proc/self/mountinfo && break
    sleep 0.05
done
[ -S "$UDM_CONTROL" ] || { cat "$W/serve.log"; exit 91; }
"$@"
rc=$?
kill "$srv"
wait "$srv"
[ -n "$UDM_SERVE_LOG" ] && cp "$W/serve.log" "$UDM_SERVE_LOG"
rm -rf "$W"
exit $rc
"#;

/// Whether a volume (folder, file) is refused as cryptsetup refuses it:
/// what both said, or how they differ.
type RefusalCheck = fn(&Path, &str) -> Result<String, String>;

/// One per-volume script: its archive, the folder the archive holds, and
/// which of its files are volumes (the rest, key files and configs, go
/// with every volume).
struct PerVolume {
    script: &'static str,
    archive: &'static str,
    dir: &'static str,
    is_volume: fn(&str) -> bool,
    /// For a script whose `[N/A]` means "refused, as expected": whether
    /// the volume (folder, file) is refused as cryptsetup refuses it.
    refused_as_cryptsetup: Option<RefusalCheck>,
}

const PER_VOLUME: &[PerVolume] = &[
    PerVolume {
        script: "luks1-compat-test",
        archive: "luks1-images.tar.xz",
        dir: "luks1-images",
        is_volume: |f| f.starts_with("luks1_"),
        refused_as_cryptsetup: None,
    },
    PerVolume {
        script: "tcrypt-compat-test",
        archive: "tcrypt-images.tar.xz",
        dir: "tcrypt-images",
        is_volume: |f| !f.starts_with("keyfile") && f != "README",
        refused_as_cryptsetup: Some(tcrypt_refused_as_cryptsetup),
    },
    PerVolume {
        script: "bitlk-compat-test",
        archive: "bitlk-images.tar.xz",
        dir: "bitlk-images",
        is_volume: |f| f.starts_with("bitlk-"),
        refused_as_cryptsetup: Some(bitlk_refused_as_cryptsetup),
    },
    PerVolume {
        script: "fvault2-compat-test",
        archive: "fvault2-images.tar.xz",
        dir: "fvault2-images",
        is_volume: |f| f == "small",
        refused_as_cryptsetup: None,
    },
];

/// The upstream folder: `UDM_UPSTREAM`, else `shared/upstream/cryptsetup-tests`
/// in the nearest ancestor of the crate that has one.
fn upstream() -> PathBuf {
    common::upstream_cryptsetup_tests()
}

fn write_exe(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A scratch copy of the folder, writable, with udm as cryptsetup,
/// veritysetup and integritysetup in `bin/`, a `crypto-check` that says
/// every algorithm exists (so no volume is dropped and a missing one shows
/// as a failure), the activation wrapper, and, while [`ACTIVATION`] is
/// off, a fake `id` in `fake/`.
fn scratch(up: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().join("t");
    common::run(Command::new("cp").arg("-r").arg(up).arg(&t));
    common::run(Command::new("chmod").args(["-R", "u+w"]).arg(&t));
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    for name in ["cryptsetup", "veritysetup", "integritysetup", "dmsetup"] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_udm"), bin.join(name)).unwrap();
    }
    // Not in FIPS mode (that would change what the scripts expect); every
    // hash, cipher and PBKDF asked about "exists".
    write_exe(
        &t.join("crypto-check"),
        "#!/bin/sh\ncase \"$1\" in\n  fips_mode*) exit 1 ;;\n  version) echo udm; exit 0 ;;\n  *) exit 0 ;;\nesac\n",
    );
    write_exe(&tmp.path().join("activate.sh"), ACTIVATE_SH);
    write_exe(&tmp.path().join("activate-block.sh"), ACTIVATE_BLOCK_SH);
    let fake = tmp.path().join("fake");
    fs::create_dir(&fake).unwrap();
    write_exe(&fake.join("losetup"), LOSETUP_SH);
    if !ACTIVATION {
        write_exe(
            &fake.join("id"),
            "#!/bin/sh\n[ \"$1\" = -u ] && { echo 1000; exit 0; }\nexec /usr/bin/id \"$@\"\n",
        );
    }
    (tmp, t)
}

/// Run `script` in `t` with udm as cryptsetup (and dmsetup); (exit code,
/// stdout+stderr). With [`ACTIVATION`] it runs in a mount namespace of
/// its own with a server behind /dev/mapper.
fn run_script(tmp: &Path, t: &Path, script: &str) -> (i32, String) {
    run_script_with(tmp, t, script, "activate.sh")
}

/// [`run_script`] through the activation wrapper `activate` (a file of
/// [`scratch`]'s folder).
fn run_script_with(tmp: &Path, t: &Path, script: &str, activate: &str) -> (i32, String) {
    let path = format!(
        "{}:{}:{}",
        tmp.join("fake").display(),
        tmp.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = if ACTIVATION {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private"])
            .arg(tmp.join(activate))
            .arg("bash");
        c
    } else {
        Command::new("bash")
    };
    let o = cmd
        .arg(t.join(script))
        .env("UDM_BIN", env!("CARGO_BIN_EXE_udm"))
        .current_dir(t)
        .env("CRYPTSETUP_PATH", tmp.join("bin"))
        .env("PATH", path)
        .env("LANG", "C")
        .env_remove("_DEBUG")
        .env_remove("VALG")
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&o.stderr));
    (o.status.code().unwrap_or(-1), text)
}

/// Each case: passed (with a note when it passed as a refusal matching
/// cryptsetup's), or why it failed.
type Results = BTreeMap<String, Result<Option<String>, String>>;

/// `luks2-validation-test` whole: one case per "Test image:" line.
fn luks2_validation(tmp: &Path, t: &Path, out: &mut Results) {
    let (code, text) = run_script(tmp, t, "luks2-validation-test");
    let mut n = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("Test image: ") else {
            continue;
        };
        let Some((img, verdict)) = rest.split_once("...") else {
            continue;
        };
        n += 1;
        let r = if verdict == "OK" {
            Ok(None)
        } else {
            Err(verdict.to_string())
        };
        out.insert(format!("luks2-validation-test/{img}"), r);
    }
    let all_ok = out.values().all(Result::is_ok);
    // A script that stopped early (a generator failing, jq missing) or
    // whose exit code disagrees with its lines is a failure of its own.
    if n < 85 || (code == 0) != all_ok {
        out.insert(
            "luks2-validation-test/(script)".into(),
            Err(format!("exit {code} after {n} images: {}", tail(&text, 15))),
        );
    }
}

/// The "non compact json" images, made by the suite's own generators:
/// `token remove` through udm and through cryptsetup must leave the same
/// bytes (udm rewrites the JSON area as cryptsetup does, salts kept).
fn token_remove_matches_cryptsetup(t: &Path, out: &mut Results) {
    let imgs = t.join("tr-images");
    fs::create_dir_all(&imgs).unwrap();
    let orig = imgs.join("luks2_valid_hdr.img");
    let xz = Command::new("xz")
        .arg("-dkc")
        .arg(t.join("luks2_valid_hdr.img.xz"))
        .output()
        .unwrap();
    assert!(xz.status.success(), "xz failed");
    fs::write(&orig, xz.stdout).unwrap();
    for name in [
        "luks2-non-compact-json-token-0.img",
        "luks2-non-compact-json-4k-token-0.img",
    ] {
        common::run(
            Command::new(format!("./generate-{name}.sh"))
                .arg(&imgs)
                .arg(&orig)
                .current_dir(t.join("generators")),
        );
        let theirs = imgs.join(format!("{name}.cs"));
        fs::copy(imgs.join(name), &theirs).unwrap();
        let remove = |cmd: &mut Command, img: &Path| {
            cmd.args(["token", "remove", "--token-id", "0"])
                .arg(img)
                .output()
                .unwrap()
        };
        let ours = remove(common::udm().arg("cryptsetup"), &imgs.join(name));
        let cs = remove(&mut Command::new("cryptsetup"), &theirs);
        let same = fs::read(imgs.join(name)).unwrap() == fs::read(&theirs).unwrap();
        let r = if ours.status.success() && cs.status.success() && same {
            Ok(None)
        } else {
            Err(format!(
                "udm {:?}, cryptsetup {:?}, same bytes: {same}",
                ours.status.code(),
                cs.status.code()
            ))
        };
        out.insert(format!("token-remove-vs-cryptsetup/{name}"), r);
    }
    let _ = fs::remove_dir_all(&imgs);
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// How [`volume_result`] begins the error of a case the script skipped.
const NOT_APPLICABLE: &str = "skipped as not applicable";

/// A volume's result from the lines of `text` naming `dir/vol` (the
/// scripts print " DIR/VOLUME" and then " [OK]", " [N/A]" or the
/// failure): every one `[OK]` passes; a `[N/A]` (the script found the
/// case not applicable and skipped it) is not a pass, so it must be on
/// the expected list with why.
fn volume_result(text: &str, dir: &str, vol: &str) -> Result<(), String> {
    let needle = format!("{dir}/{vol}");
    let named: Vec<&str> = text
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == needle))
        .collect();
    if named.is_empty() {
        return Err("not checked by the script".into());
    }
    if let Some(l) = named.iter().find(|l| !l.ends_with("[OK]")) {
        let what = if l.ends_with("[N/A]") {
            NOT_APPLICABLE
        } else {
            "failed"
        };
        return Err(format!("{what}: {}", l.trim()));
    }
    Ok(())
}

/// A per-volume script: first whole; if that fails, once for each
/// volume (in parallel, each in a folder of its own holding the script and
/// an archive of that volume and the shared files), so that every volume
/// gets a result. A script expected to fail whole that passes no volume
/// at all is one case, to keep the test short.
fn per_volume(tmp: &Path, t: &Path, pv: &PerVolume, out: &mut Results) {
    let full = tmp.join(format!("{}.full", pv.dir));
    fs::create_dir_all(&full).unwrap();
    common::run(
        Command::new("tar")
            .arg("xJf")
            .arg(t.join(pv.archive))
            .arg("--no-same-owner")
            .arg("-C")
            .arg(&full),
    );
    let src = full.join(pv.dir);
    let mut names: Vec<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let (volumes, shared): (Vec<String>, Vec<String>) =
        names.into_iter().partition(|n| (pv.is_volume)(n));
    assert!(
        !volumes.is_empty(),
        "{}: no volumes in {}",
        pv.script,
        pv.archive
    );

    let (code, text) = run_script(tmp, t, pv.script);
    let listed = EXPECTED_FAILING_SCRIPTS
        .iter()
        .any(|(s, _)| *s == pv.script);
    let prefix = format!(" {}/", pv.dir);
    let some_ok = text
        .lines()
        .any(|l| l.starts_with(&prefix) && l.ends_with("[OK]"));
    if code == 0 || (listed && !some_ok) {
        if code != 0 {
            out.insert(format!("{}/(script)", pv.script), Err(tail(&text, 6)));
        } else {
            for vol in &volumes {
                let r = judge(pv, &src, vol, volume_result(&text, pv.dir, vol));
                out.insert(format!("{}/{vol}", pv.script), r);
            }
        }
        let _ = fs::remove_dir_all(&full);
        return;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let found = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..3 {
            let (next, found, volumes, shared, src) = (&next, &found, &volumes, &shared, &src);
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(vol) = volumes.get(i) else { break };
                let r = one_volume(
                    tmp,
                    t,
                    pv,
                    &tmp.join(format!("w{w}")),
                    src,
                    shared,
                    volumes,
                    vol,
                );
                let r = match r {
                    Ok(()) => Ok(None),
                    Err((0, e)) => judge(pv, src, vol, Err(e)),
                    Err((_, e)) => Err(e),
                };
                found.lock().unwrap().push((vol.clone(), r));
            });
        }
    });
    for (vol, r) in found.into_inner().unwrap() {
        out.insert(format!("{}/{vol}", pv.script), r);
    }
    let _ = fs::remove_dir_all(&full);
}

/// One run of `pv.script` in folder `w` with only `vol` (and the shared
/// files) in its archive; a failure comes with the script's exit code.
#[allow(clippy::too_many_arguments)]
fn one_volume(
    tmp: &Path,
    t: &Path,
    pv: &PerVolume,
    w: &Path,
    src: &Path,
    shared: &[String],
    volumes: &[String],
    vol: &str,
) -> Result<(), (i32, String)> {
    let _ = fs::remove_dir_all(w);
    let dir = w.join("stage").join(pv.dir);
    fs::create_dir_all(&dir).unwrap();
    for f in [pv.script, "crypto-check"] {
        fs::copy(t.join(f), w.join(f)).unwrap();
    }
    // A TrueCrypt system volume alone makes the script skip ("No
    // remaining images"): one ordinary volume keeps it company.
    let mut with = vec![vol];
    if vol.starts_with("sys_") {
        with.extend(
            volumes
                .iter()
                .map(String::as_str)
                .find(|v| v.starts_with("tc_1-sha1-cbc-aes")),
        );
    }
    for f in shared.iter().map(String::as_str).chain(with) {
        fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    common::run(
        Command::new("tar")
            .env("XZ_OPT", "-0")
            .arg("cJf")
            .arg(w.join(pv.archive))
            .arg("-C")
            .arg(w.join("stage"))
            .arg(pv.dir),
    );
    let (code, text) = run_script(tmp, w, pv.script);
    let _ = fs::remove_dir_all(w);
    match volume_result(&text, pv.dir, vol) {
        Ok(()) if code == 0 => Ok(()),
        Err(e) if code == 0 => Err((0, e)),
        _ => Err((code, format!("exit {code}: {}", tail(&text, 6)))),
    }
}

/// A volume's result from a run that ended with exit code 0: a `[N/A]`
/// passes only where `pv` says the script's `[N/A]` is an expected
/// refusal and udm's refusal is cryptsetup's.
fn judge(
    pv: &PerVolume,
    src: &Path,
    vol: &str,
    r: Result<(), String>,
) -> Result<Option<String>, String> {
    match (r, pv.refused_as_cryptsetup) {
        (Ok(()), _) => Ok(None),
        (Err(e), Some(check)) if e.starts_with(NOT_APPLICABLE) => check(src, vol)
            .map(Some)
            .map_err(|why| format!("{e}; {why}")),
        (Err(e), _) => Err(e),
    }
}

/// The passphrase images.conf gives a BitLocker volume (`PW=`).
fn bitlk_passphrase(dir: &Path, vol: &str) -> String {
    let conf = fs::read_to_string(dir.join("images.conf")).unwrap_or_default();
    let section = format!("[{}]", vol.trim_end_matches(".img"));
    conf.lines()
        .skip_while(|l| *l != section)
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| l.strip_prefix("PW="))
        .unwrap_or("")
        .to_string()
}

/// Run `cmd` (cryptsetup or udm's) in `dir` with `input` on standard
/// input: its exit code and standard error.
fn run_with_input(cmd: Command, args: &[&str], dir: &Path, input: &str) -> (Option<i32>, String) {
    let o = output_with_input(cmd, args, dir, input);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// [`run_with_input`], the whole output.
fn output_with_input(
    mut cmd: Command,
    args: &[&str],
    dir: &Path,
    input: &str,
) -> std::process::Output {
    let mut child = cmd
        .args(args)
        .current_dir(dir)
        .env("LANG", "C")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}

fn first_line(t: &str) -> String {
    t.lines().next().unwrap_or("").to_string()
}

/// Whether udm refuses to open BitLocker volume `vol` exactly as the
/// real cryptsetup does (`bitlkOpen -r --test-passphrase`, as the script
/// runs it): both exit 1 with the same first line, and udm's message also
/// names `--allow-partial-bitlk`. Ok: what both said.
fn bitlk_refused_as_cryptsetup(dir: &Path, vol: &str) -> Result<String, String> {
    let pw = format!("{}\n", bitlk_passphrase(dir, vol));
    let args = ["bitlkOpen", "-r", "--test-passphrase", vol];
    let (cs_code, cs_err) = run_with_input(Command::new("cryptsetup"), &args, dir, &pw);
    let mut ours = common::udm();
    ours.arg("cryptsetup");
    let (udm_code, udm_err) = run_with_input(ours, &args, dir, &pw);
    let (cs_first, udm_first) = (first_line(&cs_err), first_line(&udm_err));
    if cs_code != Some(1) || udm_code != cs_code || cs_first != udm_first {
        return Err(format!(
            "cryptsetup: exit {cs_code:?} {cs_first:?}; udm: exit {udm_code:?} {udm_first:?}"
        ));
    }
    if !udm_err.contains("--allow-partial-bitlk") {
        return Err(format!("udm's refusal names no way out: {udm_err:?}"));
    }
    Ok(format!("both exit 1: {cs_first}"))
}

/// The first line of cryptsetup 2.6.1's refusal of TrueCrypt's legacy
/// modes (`lib/tcrypt/tcrypt.c`, `TCRYPT_activate`, for a mode containing
/// `-tcrypt`; exit 1), which `tcrypt-compat-test` greps for.
const TCRYPT_LEGACY: &str = "Kernel does not support activation for this TCRYPT legacy mode.";

/// What cryptsetup says when its crypto backend lacks a kernel cipher it
/// needs for a TrueCrypt header (no AF_ALG, or no such cipher in it).
const TCRYPT_NO_KERNEL_CRYPTO: &str = "Required kernel crypto interface not available.";

/// udm as `cryptsetup` with no server to reach: a refusal must come before
/// any device is made.
fn udm_cryptsetup(dir: &Path) -> Command {
    let mut c = common::udm();
    c.arg("cryptsetup")
        .env("UDM_CONTROL", dir.join("no-server").join("control"));
    c
}

/// Whether udm refuses to open TrueCrypt volume `vol` exactly as the real
/// cryptsetup does, opened as `tcrypt-compat-test` opens it (`tcryptOpen
/// -r -h HASH -c CIPHER`, HASH and CIPHER cut from the file name, and for
/// a `-hidden` volume also with `--tcrypt-hidden` and its passphrase):
/// both exit 1 with the same first line, and udm's message names
/// `--allow-tcrypt-legacy`; or, where cryptsetup cannot decrypt the header
/// on this kernel, the fallback of the module doc. Ok: what both said.
fn tcrypt_refused_as_cryptsetup(dir: &Path, vol: &str) -> Result<String, String> {
    let parent = dir.parent().unwrap();
    let file = format!("tcrypt-images/{vol}");
    let field = |i: usize| file.split('-').nth(i).unwrap_or("").to_string();
    let (hash, cipher) = (field(2), field(4));
    let map = format!("udm-refusal-{vol}");
    let base = ["tcryptOpen", "-r", "-h", &hash, "-c", &cipher, &file, &map];
    let mut runs = vec![(base.to_vec(), "aaaaaaaaaaaa\n")];
    if vol.ends_with("-hidden") {
        let mut hidden = base.to_vec();
        hidden.push("--tcrypt-hidden");
        runs.push((hidden, "bbbbbbbbbbbb\n"));
    }
    let mut said = Vec::new();
    for (args, pw) in runs {
        let (cs_code, cs_err) = run_with_input(Command::new("cryptsetup"), &args, parent, pw);
        if cs_code == Some(0) {
            // It should not have, but leave nothing mapped behind.
            let _ = Command::new("cryptsetup").args(["close", &map]).status();
        }
        let (udm_code, udm_err) = run_with_input(udm_cryptsetup(parent), &args, parent, pw);
        let (cs_first, udm_first) = (first_line(&cs_err), first_line(&udm_err));
        if !udm_err.contains("--allow-tcrypt-legacy") {
            return Err(format!("udm's refusal names no way out: {udm_err:?}"));
        }
        if cs_code == Some(1) && cs_first == TCRYPT_NO_KERNEL_CRYPTO {
            said.push(tcrypt_refused_per_source(
                parent, &args, pw, udm_code, &udm_first,
            )?);
            continue;
        }
        if cs_code != Some(1) || udm_code != cs_code || cs_first != udm_first {
            return Err(format!(
                "cryptsetup: exit {cs_code:?} {cs_first:?}; udm: exit {udm_code:?} {udm_first:?}"
            ));
        }
        said.push(format!("both exit 1: {cs_first}"));
    }
    Ok(said.join("; "))
}

/// The fallback: cryptsetup could not decrypt the header here, so udm's
/// refusal (`udm_code`, `udm_first`) is held to cryptsetup 2.6.1's source:
/// exit 1 with [`TCRYPT_LEGACY`], for a volume whose mode, as udm's
/// `tcryptDump` with the same options prints it, contains `-tcrypt`.
fn tcrypt_refused_per_source(
    dir: &Path,
    open_args: &[&str],
    pw: &str,
    udm_code: Option<i32>,
    udm_first: &str,
) -> Result<String, String> {
    let mut dump: Vec<&str> = open_args.to_vec();
    dump[0] = "tcryptDump";
    dump.retain(|a| *a != "-r" && !a.starts_with("udm-refusal-"));
    let o = output_with_input(udm_cryptsetup(dir), &dump, dir, pw);
    let text = String::from_utf8_lossy(&o.stdout);
    let mode = text
        .lines()
        .find_map(|l| l.strip_prefix("Cipher mode:"))
        .map(str::trim)
        .unwrap_or("");
    if !o.status.success() || !mode.contains("-tcrypt") {
        return Err(format!(
            "cryptsetup cannot decrypt the header on this kernel ({TCRYPT_NO_KERNEL_CRYPTO}); \
             udm's tcryptDump shows no legacy mode: exit {:?}, mode {mode:?}",
            o.status.code()
        ));
    }
    if udm_code != Some(1) || udm_first != TCRYPT_LEGACY {
        return Err(format!(
            "cryptsetup 2.6.1 refuses mode {mode} with exit 1 {TCRYPT_LEGACY:?}; udm: exit \
             {udm_code:?} {udm_first:?}"
        ));
    }
    Ok(format!(
        "exit 1: {TCRYPT_LEGACY} (mode {mode}; cryptsetup 2.6.1's refusal per its source, \
         since this kernel gives cryptsetup no cipher to read the header with)"
    ))
}

fn expected_failure(case: &str) -> Option<&'static str> {
    EXPECTED_FAILURES
        .iter()
        .find(|(c, _)| *c == case)
        .map(|(_, why)| *why)
        .or_else(|| {
            let script = case.split('/').next().unwrap_or("");
            EXPECTED_FAILING_SCRIPTS
                .iter()
                .find(|(s, _)| *s == script)
                .map(|(_, why)| *why)
        })
}

#[test]
fn cryptsetup_test_scripts_against_udm() {
    common::need("jq");
    common::need("xxd");
    common::need("blkid");
    if ACTIVATION {
        common::need("unshare");
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert!(
            euid == 0,
            "the scripts' activation parts need root (mount namespaces, FUSE)"
        );
    }
    let up = upstream();
    let (tmp, t) = scratch(&up);
    let mut results = Results::new();
    luks2_validation(tmp.path(), &t, &mut results);
    token_remove_matches_cryptsetup(&t, &mut results);
    for pv in PER_VOLUME {
        per_volume(tmp.path(), &t, pv, &mut results);
    }

    let mut bad = Vec::new();
    let mut per_script: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (case, r) in &results {
        let script = case.split('/').next().unwrap_or("");
        let e = per_script.entry(script).or_default();
        e.1 += 1;
        let expected = expected_failure(case);
        match (r, expected) {
            (Ok(None), None) => {
                e.0 += 1;
                println!("PASS      {case}");
            }
            (Ok(Some(note)), None) => {
                e.0 += 1;
                println!("PASS (refused as cryptsetup refuses it: {note}) {case}");
            }
            (Ok(_), Some(why)) => {
                e.0 += 1;
                println!("PASS (listed as failing: {why}) {case}");
                // Whole-script entries shrink by hand once a script passes.
                if EXPECTED_FAILURES.iter().any(|(c, _)| c == case) {
                    bad.push(format!("{case}: passes now, take it off EXPECTED_FAILURES"));
                }
            }
            (Err(msg), Some(why)) => println!("XFAIL     {case} ({why}): {msg}"),
            (Err(msg), None) => {
                println!("FAIL      {case}: {msg}");
                bad.push(format!("{case}: {msg}"));
            }
        }
    }
    for (script, (pass, all)) in &per_script {
        println!("{script}: {pass} of {all} pass");
        let listed = EXPECTED_FAILING_SCRIPTS.iter().any(|(s, _)| s == script);
        if listed && pass == all {
            bad.push(format!(
                "{script}: every case passes, take it off EXPECTED_FAILING_SCRIPTS"
            ));
        }
    }
    for (case, _) in EXPECTED_FAILURES {
        if !results.contains_key(*case) {
            bad.push(format!("{case}: listed as failing but never ran"));
        }
    }
    assert!(bad.is_empty(), "upstream cases:\n{}", bad.join("\n"));
}

/// Sections of `verity-compat-test` known to fail, each with why (goal:
/// none). Keys are the section's first line as the script prints it.
const VERITY_EXPECTED_FAILURES: &[(&str, &str)] = &[];

/// The line that ends the script's definitions and starts its tests.
const VERITY_TESTS_MARK: &str = "# VERITYSETUP tests";

/// `verity-compat-test` cut into its sections: the definitions (up to the
/// first test) and, per section, the lines from one top-level `echo` (or
/// the `if check_version` around it) to the next. Each section is named
/// by its first `echo`'s text.
fn verity_sections(script: &str) -> (String, Vec<(String, String)>) {
    let (head, tests) = script
        .split_once(VERITY_TESTS_MARK)
        .expect("verity-compat-test has no '# VERITYSETUP tests' line");
    let mut prelude = format!("{head}{VERITY_TESTS_MARK}\n");
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in tests.lines() {
        let header = line.starts_with("echo ") && !line.starts_with("echo \"[");
        if header || line.starts_with("if check_version ") {
            sections.push((String::new(), String::new()));
        }
        let Some((name, body)) = sections.last_mut() else {
            prelude.push_str(line);
            prelude.push('\n');
            continue;
        };
        if let Some(text) = line
            .trim_start()
            .strip_prefix("echo ")
            .filter(|_| name.is_empty())
        {
            *name = text
                .trim_start_matches("-n ")
                .trim_matches('"')
                .trim()
                .to_string();
        }
        body.push_str(line);
        body.push('\n');
    }
    (prelude, sections)
}

/// Whether a section's output shows it passed: no "FAILED" backtrace and
/// no test of it skipped as not applicable.
fn verity_section_ok(code: i32, text: &str) -> Result<(), String> {
    if code == 0 && !text.contains("[N/A") {
        Ok(())
    } else {
        Err(format!("exit {code}: {}", tail(text, 8)))
    }
}

#[test]
fn verity_compat_test_against_udm() {
    common::need("unshare");
    common::need("blockdev");
    common::need("losetup");
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "verity-compat-test needs root (loop devices, mount namespaces, FUSE)"
    );
    let up = upstream();
    let (tmp, t) = scratch(&up);
    let script = "verity-compat-test";
    let (code, text) = run_script_with(tmp.path(), &t, script, "activate-block.sh");
    let whole = verity_section_ok(code, &text);
    println!("{script} whole: {whole:?}");
    let full = fs::read_to_string(t.join(script)).unwrap();
    let (prelude, sections) = verity_sections(&full);
    assert!(sections.len() >= 8, "sections: {sections:?}");
    let mut bad = Vec::new();
    for (i, (name, body)) in sections.iter().enumerate() {
        let r = if whole.is_ok() {
            Ok(())
        } else {
            let part = format!("{script}.part{i}");
            write_exe(
                &t.join(&part),
                &format!("{prelude}{body}\nremove_mapping\nexit 0\n"),
            );
            let (code, text) = run_script_with(tmp.path(), &t, &part, "activate-block.sh");
            verity_section_ok(code, &text)
        };
        let listed = VERITY_EXPECTED_FAILURES.iter().find(|(n, _)| n == name);
        match (&r, listed) {
            (Ok(()), None) => println!("PASS      {script}/{name}"),
            (Ok(()), Some(_)) => {
                println!("PASS (listed as failing) {script}/{name}");
                bad.push(format!(
                    "{name}: passes now, take it off VERITY_EXPECTED_FAILURES"
                ));
            }
            (Err(m), Some((_, why))) => println!("XFAIL     {script}/{name} ({why}): {m}"),
            (Err(m), None) => {
                println!("FAIL      {script}/{name}: {m}");
                bad.push(format!("{name}: {m}"));
            }
        }
    }
    if whole.is_ok() {
        assert!(
            VERITY_EXPECTED_FAILURES.is_empty(),
            "the whole script passes: empty VERITY_EXPECTED_FAILURES"
        );
    }
    assert!(
        bad.is_empty(),
        "verity-compat-test sections:\n{}",
        bad.join("\n")
    );
}

/// Sections of `integrity-compat-test` known to fail, each with why (goal:
/// none). Keys are [`integrity_sections`]' names.
const INTEGRITY_EXPECTED_FAILURES: &[(&str, &str)] = &[];

/// The line that ends the script's definitions and starts its tests.
const INTEGRITY_TESTS_MARK: &str = "\ndm_integrity_features\n";

/// `integrity-compat-test` cut into its sections: the definitions (with
/// the functions the test part defines on its way) and the sections, each
/// from one top-level `echo` (or `if` after a blank line) to the next, and
/// every `test_resize` call one of its own (one left inside an `if`
/// becomes `:` there). A section is named by its first `echo`'s text, a
/// `test_resize` call by its description and its detached and wipe
/// arguments.
fn integrity_sections(script: &str) -> (String, Vec<(String, String)>) {
    let (head, tests) = script
        .split_once(INTEGRITY_TESTS_MARK)
        .expect("integrity-compat-test has no dm_integrity_features call");
    let mut prelude = format!("{head}{INTEGRITY_TESTS_MARK}");
    let mut sections: Vec<(String, String)> = Vec::new();
    let mut cur: Option<usize> = None;
    let mut in_fn = false;
    let mut after_blank = false;
    for line in tests.lines() {
        let top = !line.starts_with(char::is_whitespace);
        let t = line.trim_start();
        if in_fn || (top && t.contains("() #")) {
            in_fn = line != "}";
            after_blank = !in_fn;
            prelude.push_str(line);
            prelude.push('\n');
            continue;
        }
        let blank_before = std::mem::replace(&mut after_blank, t.is_empty());
        if cur.is_none() && t.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("test_resize ") {
            let mut words = rest.split('"');
            let desc = words.nth(1).unwrap_or(rest);
            let flags: Vec<&str> = words.next().unwrap_or("").split_whitespace().collect();
            sections.push((format!("{desc} {}", flags.join(" ")), format!("{t}\n")));
            if top {
                cur = Some(sections.len() - 1);
            } else if let Some(c) = cur {
                sections[c].1.push_str("\t:\n");
            }
            continue;
        }
        let text = t.strip_prefix("echo ").map(|e| {
            e.trim_start_matches("-n ")
                .trim_matches('"')
                .trim()
                .to_string()
        });
        let header = top
            && ((blank_before && t.starts_with("if "))
                || text
                    .as_ref()
                    .is_some_and(|e| !e.starts_with('[') || e.starts_with("[INTEGRITY")));
        if header || cur.is_none() {
            sections.push((String::new(), String::new()));
            cur = Some(sections.len() - 1);
        }
        let s = &mut sections[cur.unwrap_or_default()];
        if let Some(e) = text.filter(|_| s.0.is_empty()) {
            s.0 = e;
        }
        s.1.push_str(line);
        s.1.push('\n');
    }
    for (name, body) in &mut sections {
        if name.is_empty() {
            *name = body.lines().next().unwrap_or("").trim().to_string();
        }
    }
    (prelude, sections)
}

/// The marker printed after section `i` of a run.
fn section_mark(i: usize) -> String {
    format!("@@udm-section {i} done")
}

/// Runs `which` sections of the script, in order, in one script (the
/// definitions first, with fresh images and udm's 2.8 wording, see
/// `udm integritysetup`); each section's result, up to the first that
/// stops the script. A section passes when the script goes on after it
/// and it printed no `[N/A` (a case it skipped).
fn run_integrity_sections(
    tmp: &Path,
    t: &Path,
    prelude: &str,
    sections: &[(String, String)],
    which: &[usize],
    run: usize,
) -> Vec<(usize, Result<(), String>)> {
    let mut text = prelude.replacen('\n', "\nexport UDM_INTEGRITYSETUP_OUTPUT=2.8\n", 1);
    text.push_str("add_device\n");
    for &i in which {
        text.push_str(&sections[i].1);
        text.push_str(&format!("printf '\\n%s\\n' '{}'\n", section_mark(i)));
    }
    text.push_str("cleanup\nexit 0\n");
    let part = format!("integrity-compat-test.run{run}");
    write_exe(&t.join(&part), &text);
    let (code, out) = run_script_with(tmp, t, &part, "activate-block.sh");
    let mut found = Vec::new();
    let mut rest = out.as_str();
    for &i in which {
        let Some((own, after)) = rest.split_once(&section_mark(i)) else {
            found.push((i, Err(format!("exit {code}: {}", tail(rest, 8)))));
            break;
        };
        let r = if own.contains("[N/A") {
            Err(format!("skipped as not applicable: {}", tail(own, 4)))
        } else {
            Ok(())
        };
        found.push((i, r));
        rest = after;
    }
    found
}

#[test]
fn integrity_compat_test_against_udm() {
    for tool in [
        "unshare",
        "blockdev",
        "losetup",
        "hexdump",
        "xxd",
        "sha256sum",
    ] {
        common::need(tool);
    }
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "integrity-compat-test needs root (loop devices, mount namespaces, FUSE)"
    );
    let up = upstream();
    let (tmp, t) = scratch(&up);
    let full = fs::read_to_string(t.join("integrity-compat-test")).unwrap();
    let (prelude, sections) = integrity_sections(&full);
    assert!(sections.len() >= 20, "sections: {sections:?}");
    let listed = |name: &str| {
        INTEGRITY_EXPECTED_FAILURES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, why)| *why)
    };
    for (name, _) in INTEGRITY_EXPECTED_FAILURES {
        assert!(
            sections.iter().any(|(n, _)| n == name),
            "{name}: listed in INTEGRITY_EXPECTED_FAILURES but no such section"
        );
    }
    // The sections expected to pass run as the script runs them, in one
    // go; a failure stops the script, so the rest go on in a new run.
    // The listed ones run one by one.
    let mut results: Vec<Option<Result<(), String>>> = vec![None; sections.len()];
    let mut todo: Vec<usize> = (0..sections.len())
        .filter(|&i| listed(&sections[i].0).is_none())
        .collect();
    let mut run = 0;
    while !todo.is_empty() {
        for (i, r) in run_integrity_sections(tmp.path(), &t, &prelude, &sections, &todo, run) {
            results[i] = Some(r);
        }
        todo.retain(|&i| results[i].is_none());
        run += 1;
    }
    let alone: Vec<usize> = (0..sections.len())
        .filter(|&i| results[i].is_none())
        .collect();
    for i in alone {
        let r = run_integrity_sections(tmp.path(), &t, &prelude, &sections, &[i], run);
        results[i] = r.into_iter().next().map(|(_, r)| r);
        run += 1;
    }
    let mut bad = Vec::new();
    for ((name, _), r) in sections.iter().zip(&results) {
        let r = r.clone().unwrap_or(Err("never ran".into()));
        match (&r, listed(name)) {
            (Ok(()), None) => println!("PASS      integrity-compat-test/{name}"),
            (Ok(()), Some(_)) => {
                println!("PASS (listed as failing) integrity-compat-test/{name}");
                bad.push(format!(
                    "{name}: passes now, take it off INTEGRITY_EXPECTED_FAILURES"
                ));
            }
            (Err(m), Some(why)) => println!("XFAIL     integrity-compat-test/{name} ({why}): {m}"),
            (Err(m), None) => {
                println!("FAIL      integrity-compat-test/{name}: {m}");
                bad.push(format!("{name}: {m}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "integrity-compat-test sections:\n{}",
        bad.join("\n")
    );
}
