//! `udm cryptsetup open/status/resize/close` against a running server:
//! `open` unlocks a cryptsetup-made LUKS2 volume (or a plain one) and
//! creates a named device and NBD export through the control socket, as
//! cryptsetup creates /dev/mapper/NAME; data written through the export is
//! what cryptsetup's key decrypts; `status` reports it as cryptsetup does;
//! `resize` changes its size; `close` removes it; exit codes are
//! cryptsetup's (5 exists, 4 not active). FAILS if cryptsetup or nbdcopy
//! is missing.

mod common;

use common::luks::*;
use common::*;
use std::process::Command;
use udm::crypto::SectorCrypt;

/// A cryptsetup-formatted LUKS2 image and a `udm serve` with a control
/// socket, the starting point of every test here.
struct Served {
    dir: tempfile::TempDir,
    kf: std::path::PathBuf,
    img: std::path::PathBuf,
    key: Vec<u8>,
    ctl: std::path::PathBuf,
    srv: UdmServe,
}

impl Served {
    fn start(tag: &str, pass: &[u8], size: u64) -> Served {
        let dir = scratch(tag);
        let d = dir.path();
        let kf = write_file(d, "k", pass);
        let img = sparse(d, "v.img", size);
        cs_format(&img, &FAST_PBKDF, &kf);
        let key = cs_volume_key(&img, None, &kf);
        let ctl = d.join("ctl");
        let srv = UdmServe::start(
            &d.join("nbd.sock"),
            &[std::ffi::OsStr::new("--control"), ctl.as_os_str()],
        );
        Served {
            dir,
            kf,
            img,
            key,
            ctl,
            srv,
        }
    }

    /// `udm TOOL ARGS…` against this server's control socket.
    fn tool(&self, tool: &str, args: &[&str]) -> std::process::Output {
        udm()
            .arg(tool)
            .args(args)
            .env("UDM_CONTROL", &self.ctl)
            .output()
            .unwrap()
    }
}

#[test]
fn open_status_resize_close_through_the_control_socket() {
    need("nbdcopy");
    need("nbdinfo");
    let f = Served::start("csactive", b"active pass", 24 << 20);
    let (d, kf, img, key, ctl, srv) = (f.dir.path(), &f.kf, &f.img, &f.key, &f.ctl, &f.srv);
    let cs = |args: &[&str]| f.tool("cryptsetup", args);
    let kfs = kf.display().to_string();
    let imgs = img.display().to_string();

    let o = cs(&["open", "--key-file", &kfs, &imgs, "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let o = cs(&["open", "--key-file", &kfs, &imgs, "vol"]);
    assert_eq!(o.status.code(), Some(5), "{}", show(&o));
    let o = cs(&[
        "open",
        "--key-file",
        &kfs,
        "--key-slot",
        "3",
        &imgs,
        "other",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));

    // 8 MiB through the export; cryptsetup's key decrypts it.
    let data = fast_bytes(3, 8 << 20);
    let src = write_file(d, "data", &data);
    run(Command::new("nbdcopy").arg(&src).arg(srv.uri("vol")));
    let sc = SectorCrypt::new("aes-xts-plain64", key, 4096, false).unwrap();
    let mut got = pread(img, 16 << 20, 8 << 20);
    sc.decrypt(&mut got, 0);
    assert!(
        got == data,
        "data written through `cryptsetup open` does not decrypt with cryptsetup's key"
    );

    // A /dev/mapper path names the same device, as in cryptsetup.
    let o = cs(&["status", "/dev/mapper/vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "/dev/mapper/vol is active",
        "  type:    LUKS2",
        "  cipher:  aes-xts-plain64",
        "  keysize: 512 bits",
        "  sector size:  4096",
        "  offset:  32768 sectors",
        "  size:    16384 sectors",
        "  mode:    read/write",
    ] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }
    assert!(!text.contains(&hex::encode(key)), "status printed the key");

    let o = cs(&["resize", "--size", "8192", "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let size = run_text(Command::new("nbdinfo").arg("--size").arg(srv.uri("vol")));
    assert_eq!(size.trim(), (8192u64 * 512).to_string());

    let o = cs(&["close", "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let o = cs(&["close", "vol"]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    let o = cs(&["status", "vol"]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("/dev/mapper/vol is inactive."));

    // Plain, passphrase from a pipe: the key cryptsetup derives for it.
    let plain = sparse(d, "p.img", 4 << 20);
    let o = udm()
        .args([
            "cryptsetup",
            "open",
            "--type",
            "plain",
            "--hash",
            "sha256",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
        ])
        .arg(&plain)
        .arg("pvol")
        .env("UDM_CONTROL", ctl)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            use std::io::Write;
            ch.stdin.take().unwrap().write_all(b"xxx\n")?;
            ch.wait_with_output()
        })
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let o = cs(&["status", "pvol"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("  type:    PLAIN"),
        "{}",
        show(&o)
    );
    // 4 MiB of the data through it: the cipher of cryptsetup's plain key.
    let small = write_file(d, "small", &data[..4 << 20]);
    run(Command::new("nbdcopy").arg(&small).arg(srv.uri("pvol")));
    let pk =
        hex::decode("cd2eb0837c9b4c962c22d2ff8b5441b7b45805887f051d39bf133b583baf6860").unwrap();
    let sc = SectorCrypt::new("aes-xts-plain64", &pk, 512, false).unwrap();
    let mut got = std::fs::read(&plain).unwrap();
    sc.decrypt(&mut got, 0);
    assert!(
        got == data[..4 << 20],
        "plain volume does not decrypt with cryptsetup's plain key"
    );
    assert_eq!(f.srv.stop(), Some(0));
}

/// `luksSuspend` holds the device's I/O and wipes its key; `dmsetup
/// resume` alone cannot bring it back; `luksResume` with a wrong
/// passphrase fails with cryptsetup's 2 and leaves it suspended; with the
/// right one the held read completes and returns the data written before.
#[test]
fn luks_suspend_wipes_the_key_and_luks_resume_restores_it() {
    need("nbdcopy");
    let f = Served::start("cssuspend", b"suspend pass", 20 << 20);
    let (d, kf, img, key, srv) = (f.dir.path(), &f.kf, &f.img, &f.key, &f.srv);
    let bad = write_file(d, "bad", b"not the pass");
    let cs = |args: &[&str]| f.tool("cryptsetup", args);
    let dm = |args: &[&str]| f.tool("dmsetup", args);
    let (kfs, bads, imgs) = (
        kf.display().to_string(),
        bad.display().to_string(),
        img.display().to_string(),
    );
    let o = cs(&["open", "--key-file", &kfs, &imgs, "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let data = fast_bytes(11, 4 << 20);
    let src = write_file(d, "data", &data);
    run(Command::new("nbdcopy").arg(&src).arg(srv.uri("vol")));

    // Not active, not suspended: cryptsetup's codes.
    let o = cs(&["luksSuspend", "nothere"]);
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    let o = cs(&["luksResume", "--key-file", &kfs, "vol"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Volume vol is not suspended."));
    // A key message on a running device is refused, as the kernel does.
    let o = dm(&["message", "vol", "0", "key", "wipe"]);
    assert!(
        !o.status.success(),
        "key wipe on a running device: {}",
        show(&o)
    );

    let o = cs(&["luksSuspend", "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let o = cs(&["luksSuspend", "vol"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Volume vol is already suspended."));
    let o = dm(&["table", "--showkeys", "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        !table.contains(&hex::encode(key)) && table.contains(&"0".repeat(128)),
        "the wiped key still shows in `table --showkeys`: {table}"
    );
    let o = cs(&["status", "vol"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("  mode:    read/write (suspended)\n"));

    // A reader now waits for the device.
    let out = d.join("out");
    let mut reader = Command::new("nbdcopy")
        .arg(srv.uri("vol"))
        .arg(&out)
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(
        reader.try_wait().unwrap().is_none(),
        "a read completed while the device was suspended"
    );
    // Without the key the device cannot resume.
    let o = dm(&["resume", "vol"]);
    assert!(!o.status.success(), "resumed without a key: {}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("key"),
        "{}",
        show(&o)
    );
    let o = cs(&["luksResume", "--key-file", &bads, "vol"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(
        reader.try_wait().unwrap().is_none(),
        "the read went on after failed resumes"
    );
    let o = cs(&["luksResume", "--key-file", &kfs, "vol"]);
    assert!(o.status.success(), "{}", show(&o));
    let st = reader.wait().unwrap();
    assert!(st.success(), "the held read failed after luksResume");
    let got = std::fs::read(&out).unwrap();
    assert!(
        got[..data.len()] == data[..],
        "data differs after luksSuspend/luksResume"
    );
    let o = dm(&["table", "--showkeys", "vol"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&hex::encode(key)));
    assert_eq!(f.srv.stop(), Some(0));
}
