//! cryptsetup options that udm once accepted and ignored: each is now
//! honoured or refused with its name. And `open` hands the server device
//! paths it can resolve (absolute), whatever this command's working
//! directory was.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// A small LUKS2 volume with a cheap KDF and its key file.
fn volume(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let kf = write_file(dir, "key", b"options pass");
    let img = sparse(dir, "vol.img", 32 << 20);
    run(udm()
        .args(["cryptsetup", "luksFormat", "-q", "--type", "luks2"])
        .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
        .arg("--key-file")
        .arg(&kf)
        .arg(&img));
    (img, kf)
}

#[test]
fn options_without_an_effect_in_udm_are_refused_by_name() {
    let dir = scratch("cs-opts");
    let (img, kf) = volume(dir.path());
    for (opt, verb) in [
        ("--serialize-memory-hard-pbkdf", "open"),
        ("--block-size=4", "reencrypt"),
        ("--use-directio", "reencrypt"),
        ("--use-fsync", "reencrypt"),
        ("--write-log", "reencrypt"),
        ("--persistent", "open"),
    ] {
        let o = udm()
            .args(["cryptsetup", verb, opt, "--key-file"])
            .arg(&kf)
            .arg(&img)
            .arg("x")
            .output()
            .unwrap();
        let name = opt.split('=').next().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{opt}: {}", show(&o));
        assert!(
            err.contains(&format!("Option {name} is not supported by udm")),
            "{opt}: {err}"
        );
    }
}

#[test]
fn options_that_turn_off_what_udm_never_does_say_so() {
    let dir = scratch("cs-opts2");
    let (img, kf) = volume(dir.path());
    for opt in [
        "--disable-external-tokens",
        "--disable-keyring",
        "--disable-locks",
        "--force-password",
    ] {
        let o = udm()
            .args([
                "cryptsetup",
                "open",
                "--test-passphrase",
                "-v",
                opt,
                "--key-file",
            ])
            .arg(&kf)
            .arg(&img)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{opt}: {}", show(&o));
        assert!(
            out.contains(&format!("Option {opt} holds: udm ")),
            "{opt}: {out}"
        );
        // Quiet without --verbose.
        let o = udm()
            .args(["cryptsetup", "open", "--test-passphrase", opt, "--key-file"])
            .arg(&kf)
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            o.status.success() && o.stdout.is_empty(),
            "{opt}: {}",
            show(&o)
        );
    }
    // --debug-json is --debug: the verbose lines appear.
    let o = udm()
        .args([
            "cryptsetup",
            "open",
            "--test-passphrase",
            "--debug-json",
            "--key-file",
        ])
        .arg(&kf)
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("Command successful."),
        "{}",
        show(&o)
    );
}

/// `-y` on a terminal: the passphrase is asked twice and two different
/// answers are refused; the same one twice opens. Driven through a
/// pseudo-terminal by python3's pty module.
#[test]
fn verify_passphrase_asks_twice_on_a_terminal() {
    need("python3");
    let dir = scratch("cs-opts3");
    let (img, _kf) = volume(dir.path());
    let drive = |answers: &str| {
        let code = r#"
import os, pty, subprocess, sys, time
m, s = pty.openpty()
p = subprocess.Popen(sys.argv[1:-1], stdin=s, stdout=s, stderr=s, close_fds=True)
os.close(s)
out = b""
for a in sys.argv[-1].split(","):
    time.sleep(0.5)
    os.write(m, a.encode() + b"\n")
deadline = time.time() + 20
while time.time() < deadline:
    try:
        chunk = os.read(m, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
p.wait()
sys.stdout.write(out.decode(errors="replace"))
sys.exit(p.returncode)
"#;
        Command::new("python3")
            .arg("-c")
            .arg(code)
            .arg(env!("CARGO_BIN_EXE_udm"))
            .args(["cryptsetup", "open", "--test-passphrase", "-y", "-T", "1"])
            .arg(&img)
            .arg(answers)
            .output()
            .unwrap()
    };
    let o = drive("options pass,another pass");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("Verify passphrase"), "{out}");
    assert!(out.contains("Passphrases do not match"), "{out}");
    let o = drive("options pass,options pass");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("Verify passphrase"), "{out}");
}

/// A device named by a relative path reaches the server as an absolute
/// one, for LUKS and plain as for the foreign types (the server does not
/// share this command's working directory).
#[test]
fn open_hands_the_server_absolute_paths() {
    let dir = scratch("cs-paths");
    let d = dir.path();
    let (img, _kf) = volume(d);
    let ctl = d.join("ctl");
    let _srv = UdmServe::start(
        &d.join("nbd.sock"),
        &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
    );
    let abs = std::fs::canonicalize(&img).unwrap();
    // Plain mode reads exactly the key's 64 bytes from its key file.
    write_file(d, "pkey", &[7u8; 64]);
    for (name, args) in [
        (
            "rel-luks",
            vec!["open", "--key-file", "key", "vol.img", "rel-luks"],
        ),
        (
            "rel-plain",
            vec![
                "open",
                "--type",
                "plain",
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "512",
                "--key-file",
                "pkey",
                "vol.img",
                "rel-plain",
            ],
        ),
    ] {
        let o = udm()
            .arg("cryptsetup")
            .args(&args)
            .current_dir(d)
            .env("UDM_CONTROL", &ctl)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", show(&o));
        let t = udm()
            .args(["dmsetup", "table", name])
            .env("UDM_CONTROL", &ctl)
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&t.stdout);
        assert!(
            table.contains(&format!(" {} ", abs.display())),
            "{name}: {table}"
        );
    }
}
