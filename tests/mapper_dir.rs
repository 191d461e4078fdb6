//! `udm serve --mapper-dir DIR`: every device as a regular file DIR/NAME,
//! driven by real programs (mkfs.ext4, mount -o loop, e2fsck, blkid,
//! sha256sum) and by plain file calls (pread/pwrite, fsync, fallocate,
//! SEEK_DATA/SEEK_HOLE). Needs root and /dev/fuse (FUSE mounts, loop
//! devices), as the tools do; e2fsprogs, util-linux and coreutils must be
//! installed (scripts/test.sh installs them).
//!
//! Every test unmounts what it mounted, also when it fails (`Unmount`).

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// Detaches a mount point when dropped (a failing test, a killed server),
/// so no test leaves a mount behind.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Whether a mount is at `dir` in this process's namespace.
fn mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = dir.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

/// A server with a control socket and its mapper directory.
struct Mapper {
    dir: tempfile::TempDir,
    ctl: PathBuf,
    map: PathBuf,
    srv: Option<UdmServe>,
    _unmount: Unmount,
}

impl Mapper {
    fn start(tag: &str, args: &[&str]) -> Mapper {
        need("mount");
        let dir = scratch(tag);
        let d = dir.path();
        let ctl = d.join("ctl");
        let map = d.join("mapper");
        let unmount = Unmount(map.clone());
        let mut all = vec![
            "--control".to_string(),
            ctl.display().to_string(),
            "--mapper-dir".to_string(),
            map.display().to_string(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let srv = UdmServe::start(&d.join("nbd.sock"), &all);
        wait_for("the mapper directory", Duration::from_secs(10), || {
            mounted(&map)
        });
        Mapper {
            dir,
            ctl,
            map,
            srv: Some(srv),
            _unmount: unmount,
        }
    }

    fn tool(&self, tool: &str, args: &[&str]) -> std::process::Output {
        udm()
            .arg(tool)
            .args(args)
            .env("UDM_CONTROL", &self.ctl)
            .output()
            .unwrap()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.map.join(name)
    }

    /// SIGTERM; the mount must be gone afterwards.
    fn stop(&mut self) {
        let code = self.srv.take().unwrap().stop();
        assert_eq!(code, Some(0));
        assert!(
            !mounted(&self.map),
            "the mapper directory outlived the server"
        );
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn luks2_volume_as_a_file_takes_ext4_through_a_loop_mount() {
    need("mkfs.ext4");
    need("e2fsck");
    let mut m = Mapper::start("mapper-luks", &[]);
    let d = m.dir.path().to_path_buf();
    let kf = write_file(&d, "k", b"mapper pass");
    let img = sparse(&d, "vol.img", 64 << 20);
    let o = udm()
        .args(["cryptsetup", "luksFormat", "-q", "--type", "luks2"])
        .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
        .arg("--key-file")
        .arg(&kf)
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));

    let o = m.tool(
        "cryptsetup",
        &[
            "open",
            "--type",
            "luks2",
            path(&img),
            "secret",
            "--key-file",
            path(&kf),
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    assert!(o.stdout.is_empty(), "open printed: {}", show(&o));
    let f = m.file("secret");
    let meta = std::fs::metadata(&f).expect("no file for the opened volume");
    assert_eq!(meta.len(), (64 << 20) - (16 << 20), "file size");
    // No --allow rule: the server's user's alone, as the NBD socket is.
    assert_eq!(meta.mode() & 0o7777, 0o600);

    let st = m.tool("cryptsetup", &["status", "secret"]);
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(st.starts_with(&format!("{} is active", path(&f))), "{st}");
    assert!(st.contains("  nbd uri: nbd+unix:///secret?socket="), "{st}");

    run(Command::new("mkfs.ext4").arg("-q").arg(&f));
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _m = Unmount(mnt.clone());
    run(Command::new("mount").args(["-o", "loop"]).arg(&f).arg(&mnt));
    let data = fast_bytes(9, 3 << 20);
    std::fs::write(mnt.join("hello.bin"), &data).unwrap();
    run(Command::new("umount").arg(&mnt));
    run(Command::new("e2fsck").arg("-fn").arg(&f));

    // The loop device lets go of the file asynchronously after umount.
    let mut closed = None;
    wait_for("cryptsetup close", Duration::from_secs(10), || {
        let o = m.tool("cryptsetup", &["close", "secret"]);
        let ok = o.status.success();
        closed = Some(o);
        ok
    });
    assert!(closed.unwrap().stdout.is_empty());
    assert!(!f.exists(), "the file outlived its device");

    // The data is on the volume: open again, mount read-only, compare.
    let o = m.tool(
        "cryptsetup",
        &[
            "open",
            "--readonly",
            path(&img),
            "again",
            "--key-file",
            path(&kf),
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let again = m.file("again");
    assert_eq!(
        std::fs::metadata(&again).unwrap().mode() & 0o777,
        0o400,
        "a read-only device's file"
    );
    run(Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(&again)
        .arg(&mnt));
    let back = std::fs::read(mnt.join("hello.bin")).unwrap();
    run(Command::new("umount").arg(&mnt));
    assert!(back == data, "the file read back differs");
    wait_for("cryptsetup close", Duration::from_secs(10), || {
        m.tool("cryptsetup", &["close", "again"]).status.success()
    });
    m.stop();
}

#[test]
fn files_follow_their_devices_and_take_every_file_operation() {
    let mut m = Mapper::start("mapper-ops", &[]);
    let d = m.dir.path().to_path_buf();
    let img = sparse(&d, "disk.img", 32 << 20);
    let table = format!("0 {} linear {} 0", (16 << 20) / 512, path(&img));
    let o = m.tool("dmsetup", &["create", "lin", "--table", &table]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(o.stdout.is_empty(), "create printed: {}", show(&o));
    let f = m.file("lin");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 16 << 20);
    let names: Vec<_> = std::fs::read_dir(&m.map)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["lin"]);

    // Data goes to the backing file at the table's offsets.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f)
        .unwrap();
    let data = fast_bytes(4, 3 << 20);
    file.write_all_at(&data, 1 << 20).unwrap();
    file.sync_all().unwrap();
    assert!(
        pread(&img, 1 << 20, data.len()) == data,
        "not on the device"
    );
    let mut back = vec![0u8; data.len()];
    file.read_exact_at(&mut back, 1 << 20).unwrap();
    assert!(back == data);
    // Unaligned, small, and across the end (cut there, as a block device).
    file.write_all_at(b"xyz", 7).unwrap();
    assert_eq!(pread(&img, 7, 3), b"xyz");
    assert_eq!(
        file.write_at(&[1u8; 8192], (16 << 20) - 4096).unwrap(),
        4096
    );
    let e = file.write_at(&[1u8; 1], 16 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");

    // SEEK_DATA / SEEK_HOLE from the device's extents (the image is sparse).
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: lseek on a descriptor this test owns.
    let data_at = unsafe { libc::lseek(fd, 4 << 20, libc::SEEK_DATA) };
    assert_eq!(data_at, (16 << 20) - 4096, "SEEK_DATA");
    // SAFETY: as above.
    let hole_at = unsafe { libc::lseek(fd, 1 << 20, libc::SEEK_HOLE) };
    assert_eq!(hole_at, 4 << 20, "SEEK_HOLE");

    // fallocate: ZERO_RANGE writes zeroes, PUNCH_HOLE discards.
    // SAFETY: fallocate on a descriptor this test owns.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, 1 << 20, 1 << 20) };
    assert_eq!(r, 0, "ZERO_RANGE: {}", std::io::Error::last_os_error());
    assert!(pread(&img, 1 << 20, 1 << 20).iter().all(|&b| b == 0));
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: as above.
    let r = unsafe { libc::fallocate(fd, punch, 2 << 20, 1 << 20) };
    assert_eq!(r, 0, "PUNCH_HOLE: {}", std::io::Error::last_os_error());
    assert!(pread(&img, 2 << 20, 1 << 20).iter().all(|&b| b == 0));
    // SAFETY: as above.
    let r = unsafe { libc::fallocate(fd, 0, 0, 4096) };
    assert_eq!(r, -1, "a plain allocation changes nothing on a device");

    // The open file keeps the device busy, as an open block device.
    let o = m.tool("dmsetup", &["remove", "lin"]);
    assert!(!o.status.success(), "removed while open");
    drop(file);

    // A resize shows at once.
    let bigger = format!("0 {} linear {} 0", (24 << 20) / 512, path(&img));
    for args in [
        &["load", "lin", "--table", &bigger][..],
        &["suspend", "lin"],
        &["resume", "lin"],
    ] {
        let o = m.tool("dmsetup", args);
        assert!(o.status.success(), "{}", show(&o));
    }
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 24 << 20, "resize");

    // sha256sum of the file is that of the device's bytes.
    if Path::new("/usr/bin/sha256sum").exists() {
        let a = run_text(Command::new("sha256sum").arg(&f));
        let b = run_text(Command::new("sha256sum").arg(&img)); // 32 MiB image
        let dev = write_file(&d, "dev.bin", &pread(&img, 0, 24 << 20));
        let c = run_text(Command::new("sha256sum").arg(&dev));
        assert_eq!(a.split(' ').next(), c.split(' ').next());
        assert_ne!(a.split(' ').next(), b.split(' ').next());
    }

    wait_for("dmsetup remove", Duration::from_secs(10), || {
        m.tool("dmsetup", &["remove", "lin"]).status.success()
    });
    assert!(!f.exists(), "the file outlived its device");
    m.stop();
}

#[test]
fn a_killed_server_leaves_no_mount_in_the_way_of_the_next() {
    let m = Mapper::start("mapper-kill", &[]);
    let d = m.dir.path().to_path_buf();
    let img = write_file(&d, "disk.img", &fast_bytes(2, 1 << 20));
    let table = format!("0 2048 linear {} 0", path(&img));
    let o = m.tool("dmsetup", &["create", "v", "--table", &table]);
    assert!(o.status.success(), "{}", show(&o));
    let open = std::fs::File::open(m.file("v")).unwrap();
    // A second server does not mount over a live mapper directory.
    let o = udm()
        .arg("serve")
        .arg("--socket")
        .arg(d.join("other.sock"))
        .args(["--no-control", "--mapper-dir", path(&m.map)])
        .arg("--file")
        .arg(format!("w={}", path(&img)))
        .output()
        .unwrap();
    assert!(!o.status.success(), "mounted over a live mapper directory");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("another udm server"), "{err}");
    let Mapper {
        dir,
        map,
        mut srv,
        _unmount,
        ..
    } = m;
    srv.take().unwrap().kill9();
    let mut b = [0u8; 16];
    let e = open.read_at(&mut b, 0).unwrap_err();
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
        ),
        "{e}"
    );
    assert!(mounted(&map), "expected the dead mount to be left");

    // The next server clears the dead mount and serves there.
    let srv = UdmServe::start(
        &dir.path().join("nbd2.sock"),
        &[
            "--no-control",
            "--mapper-dir",
            path(&map),
            "--file",
            &format!("v={}", path(&img)),
        ],
    );
    let mut got = vec![0u8; 1 << 20];
    wait_for("the new mount", Duration::from_secs(10), || {
        std::fs::File::open(map.join("v"))
            .and_then(|f| f.read_exact_at(&mut got, 0))
            .is_ok()
    });
    assert!(got == std::fs::read(&img).unwrap(), "the new server's file");
    drop(open);
    assert_eq!(srv.stop(), Some(0));
    assert!(!mounted(&map), "a mount was left behind");
}

/// In a private mount namespace the mapper directory can be /dev/mapper,
/// where scripts look: blkid, sha256sum, mkfs.ext4 and a loop mount work
/// on /dev/mapper/NAME as on a dm device.
#[test]
fn dev_mapper_in_a_private_namespace_serves_scripts() {
    need("unshare");
    need("blkid");
    need("mkfs.ext4");
    let d = scratch("mapper-ns");
    let img = sparse(d.path(), "disk.img", 32 << 20);
    let script = r#"set -e
udm=$1; img=$2; dir=$3
"$udm" serve --socket "$dir/nbd.sock" --control "$dir/ctl" --mapper-dir /dev/mapper \
    --file "disk=$img" 2>"$dir/serve.log" &
pid=$!
trap 'set +e; kill $pid 2>/dev/null; umount -l "$dir/mnt" 2>/dev/null; umount -l /dev/mapper 2>/dev/null; true' EXIT
for i in $(seq 100); do [ -e /dev/mapper/disk ] && break; sleep 0.1; done
mkfs.ext4 -q -U 2f1c53a8-63d5-4a58-9c44-1d6b2ac2e0a7 /dev/mapper/disk
echo "uuid=$(blkid -p -o value -s UUID /dev/mapper/disk)"
echo "file=$(sha256sum /dev/mapper/disk | cut -d' ' -f1)"
echo "img=$(sha256sum "$img" | cut -d' ' -f1)"
mkdir -p "$dir/mnt"
mount -o loop /dev/mapper/disk "$dir/mnt"
echo hello > "$dir/mnt/f"
umount "$dir/mnt"
kill $pid; wait $pid
echo "exit=$?"
"#;
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(env!("CARGO_BIN_EXE_udm"))
        .arg(&img)
        .arg(d.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let log = std::fs::read_to_string(d.path().join("serve.log")).unwrap_or_default();
    assert!(o.status.success(), "{}\nserver: {log}", show(&o));
    assert!(
        out.contains("uuid=2f1c53a8-63d5-4a58-9c44-1d6b2ac2e0a7"),
        "{out}"
    );
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        field("file="),
        field("img="),
        "sha256 of the file and the image"
    );
    assert_eq!(field("exit="), "0");
    // Nothing of it shows outside the namespace.
    assert!(!Path::new("/dev/mapper/disk").exists());
}

#[test]
fn attach_puts_a_loop_device_on_the_file_and_detach_removes_it() {
    need("losetup");
    let mut m = Mapper::start("mapper-attach", &[]);
    let d = m.dir.path().to_path_buf();
    let img = sparse(&d, "disk.img", 8 << 20);
    let table = format!("0 {} linear {} 0", (8 << 20) / 512, path(&img));
    let o = m.tool("dmsetup", &["create", "v", "--table", &table]);
    assert!(o.status.success(), "{}", show(&o));
    let info = String::from_utf8_lossy(&m.tool("dmsetup", &["info", "v"]).stdout).into_owned();
    assert!(
        info.contains(&format!("File:              {}", path(&m.file("v")))),
        "{info}"
    );
    assert!(
        info.contains("NBD URI:           nbd+unix:///v?socket="),
        "{info}"
    );

    for direct in [false, true] {
        let mut args = vec!["v"];
        if direct {
            args.push("--direct-io");
        }
        let o = m.tool("attach", &args);
        assert!(o.status.success(), "{}", show(&o));
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "attach printed {dev:?}");
        let _undo = LoopGuard(dev.clone());
        let size = run_text(Command::new("blockdev").args(["--getsize64", &dev]));
        assert_eq!(size.trim(), (8u64 << 20).to_string());
        let data = fast_bytes(u64::from(direct), 1 << 20);
        let f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
        f.write_all_at(&data, 2 << 20).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert!(
            pread(&img, 2 << 20, data.len()) == data,
            "not on the device"
        );
        let o = m.tool("detach", &["v"]);
        assert!(o.status.success(), "{}", show(&o));
        let left = run_text(Command::new("losetup").args(["-j", path(&m.file("v"))]));
        assert!(left.trim().is_empty(), "loop devices left: {left}");
    }
    let o = m.tool("detach", &["v"]);
    assert!(
        !o.status.success(),
        "detach with nothing attached succeeded"
    );
    let o = m.tool("attach", &["v", "--nbd"]);
    assert!(!o.status.success());
    if !Path::new("/dev/nbd0").exists() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no nbd module"), "{err}");
    }
    wait_for("dmsetup remove", Duration::from_secs(10), || {
        m.tool("dmsetup", &["remove", "v"]).status.success()
    });
    m.stop();
}

/// Detaches a loop device when dropped (a failing test).
struct LoopGuard(String);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .args(["-d", &self.0])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[test]
fn the_allow_rules_decide_who_opens_a_file() {
    need("setpriv");
    let mut m = Mapper::start("mapper-allow", &[]);
    let d = m.dir.path().to_path_buf();
    // Other users must reach the directory at all.
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let img = write_file(&d, "disk.img", &fast_bytes(5, 1 << 20));
    let table = format!("0 2048 linear {} 0", path(&img));
    let o = m.tool(
        "dmsetup",
        &["create", "mine", "--allow", "uid:65534", "--table", &table],
    );
    assert!(o.status.success(), "{}", show(&o));
    let f = m.file("mine");
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
    let read_as = |uid: &str| {
        Command::new("setpriv")
            .args(["--reuid", uid, "--regid", uid, "--clear-groups"])
            .args(["head", "-c", "16"])
            .arg(&f)
            .output()
            .unwrap()
    };
    let o = read_as("65534");
    assert!(o.status.success(), "uid:65534 refused: {}", show(&o));
    assert_eq!(o.stdout, pread(&img, 0, 16));
    let o = read_as("65533");
    assert!(
        !o.status.success(),
        "a user the rule does not name read the file"
    );
    // To a user the rules do not admit the name does not exist.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("No such file or directory"),
        "{}",
        show(&o)
    );
    wait_for("dmsetup remove", Duration::from_secs(10), || {
        m.tool("dmsetup", &["remove", "mine"]).status.success()
    });
    m.stop();
}

/// `cmd ARGS` as user `uid` (no supplementary groups).
fn as_user(uid: &str, cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid", uid, "--regid", uid, "--clear-groups", cmd])
        .args(args)
        .output()
        .unwrap()
}

/// A root server's device without an --allow rule (a decrypted volume,
/// here a linear map of a file) is the server user's alone: mode 0600, the
/// directory 0700, and another local user can neither read nor write it,
/// whatever the mode bits say (the open checks the uid itself).
#[test]
fn with_no_rule_another_local_user_cannot_reach_a_device_file() {
    need("setpriv");
    let mut m = Mapper::start("mapper-norule", &[]);
    let d = m.dir.path().to_path_buf();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let img = write_file(&d, "disk.img", &fast_bytes(6, 1 << 20));
    let table = format!("0 2048 linear {} 0", path(&img));
    let o = m.tool("dmsetup", &["create", "plain", "--table", &table]);
    assert!(o.status.success(), "{}", show(&o));
    let f = m.file("plain");
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&m.map).unwrap().mode() & 0o777,
        0o700,
        "the mount root with no export for others"
    );
    let o = as_user("65534", "head", &["-c", "16", path(&f)]);
    assert!(
        !o.status.success() && o.stdout.is_empty(),
        "another user read the device: {}",
        show(&o)
    );
    let o = as_user(
        "65534",
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", path(&f)),
            "bs=512",
            "count=1",
            "conv=notrunc",
        ],
    );
    assert!(
        !o.status.success(),
        "another user wrote the device: {}",
        show(&o)
    );
    assert_eq!(pread(&img, 0, 512), fast_bytes(6, 1 << 20)[..512].to_vec());
    // The server's own user (root) still reads it.
    assert_eq!(pread(&f, 0, 16), pread(&img, 0, 16));
    wait_for("dmsetup remove", Duration::from_secs(10), || {
        m.tool("dmsetup", &["remove", "plain"]).status.success()
    });
    m.stop();
}

/// Another local user sees in the directory only the names it may open,
/// as NBD_OPT_LIST shows a client only its exports: `ls` lists its one
/// device, `stat` of another's is "No such file", `df` counts its own.
#[test]
fn another_user_lists_only_the_files_it_may_open() {
    need("setpriv");
    let mut m = Mapper::start("mapper-list", &[]);
    let d = m.dir.path().to_path_buf();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let img = write_file(&d, "disk.img", &fast_bytes(7, 3 << 20));
    for (i, (name, allow)) in [
        ("theirs", Some("uid:65534")),
        ("secret", None),
        ("neighbour", Some("uid:65533")),
    ]
    .into_iter()
    .enumerate()
    {
        let table = format!("0 2048 linear {} {}", path(&img), i * 2048);
        let mut args = vec!["create", name, "--table", &table];
        if let Some(a) = allow {
            args.extend(["--allow", a]);
        }
        let o = m.tool("dmsetup", &args);
        assert!(o.status.success(), "{}", show(&o));
    }
    let o = as_user("65534", "ls", &["-a", path(&m.map)]);
    assert!(o.status.success(), "{}", show(&o));
    let mut seen: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [".", "..", "theirs"],
        "uid 65534 listed others' devices"
    );
    for hidden in ["secret", "neighbour"] {
        let o = as_user("65534", "stat", &[path(&m.file(hidden))]);
        assert!(!o.status.success(), "{hidden} found: {}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("No such file"),
            "{}",
            show(&o)
        );
    }
    let o = as_user("65534", "stat", &["-c", "%s", path(&m.file("theirs"))]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "1048576",
        "{}",
        show(&o)
    );
    // Root, the server's user, sees all three.
    let mut all: Vec<String> = std::fs::read_dir(&m.map)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    all.sort();
    assert_eq!(all, ["neighbour", "secret", "theirs"]);
    for name in ["theirs", "secret", "neighbour"] {
        wait_for("dmsetup remove", Duration::from_secs(10), || {
            m.tool("dmsetup", &["remove", name]).status.success()
        });
    }
    m.stop();
}

/// Shutdown closes the mapper directory before the server's final flush:
/// a process writing through the file while SIGTERM arrives sees every
/// write it was told succeeded in the backing store, covered by that
/// flush. The device is a log-writes target, so the log shows the order:
/// each acknowledged write is logged before the last flush entry.
#[test]
fn writes_through_the_file_during_sigterm_precede_the_final_flush() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use udm::store::file::{FileStore, OpenFlags};
    use udm::targets::log_replay::LogReader;

    const SIZE: u64 = 64 << 20;
    const BLOCK: u64 = 4096;
    let dir = scratch("mapper-stop");
    let d = dir.path();
    let data = d.join("data.img");
    let log = d.join("log.img");
    std::fs::File::create(&data).unwrap().set_len(SIZE).unwrap();
    std::fs::File::create(&log)
        .unwrap()
        .set_len(4 * SIZE)
        .unwrap();
    let table = write_file(
        d,
        "lw.table",
        format!(
            "0 {} log-writes {} {}\n",
            SIZE / 512,
            path(&data),
            path(&log)
        )
        .as_bytes(),
    );
    let mut m = Mapper::start(
        "mapper-stop-srv",
        &["--table", &format!("lw={}", path(&table))],
    );
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(m.file("lw"))
        .unwrap();
    // Blocks written in order, each filled with its number + 1; `acked`
    // counts the ones whose write returned success.
    let acked = Arc::new(AtomicU64::new(0));
    let a = acked.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..SIZE / BLOCK {
            let b = vec![(i % 251) as u8 + 1; BLOCK as usize];
            if file.write_at(&b, i * BLOCK).is_err() {
                break;
            }
            a.store(i + 1, Ordering::SeqCst);
        }
    });
    wait_for("writes through the file", Duration::from_secs(20), || {
        acked.load(Ordering::SeqCst) >= 200
    });
    m.stop();
    writer.join().unwrap();
    let n = acked.load(Ordering::SeqCst);
    assert!(n < SIZE / BLOCK, "the writer never saw the mount close");

    // Every acknowledged block is in the backing file...
    let got = std::fs::read(&data).unwrap();
    for i in 0..n {
        let at = (i * BLOCK) as usize;
        let want = (i % 251) as u8 + 1;
        assert!(
            got[at..at + BLOCK as usize].iter().all(|&x| x == want),
            "block {i} of {n} acknowledged writes is missing from the backing file"
        );
    }
    // ...and was logged before the server's last flush.
    let store = FileStore::open(
        &log,
        OpenFlags {
            read_only: true,
            ..OpenFlags::default()
        },
    )
    .unwrap();
    let mut r = LogReader::open(Arc::new(store)).unwrap();
    let ss = u64::from(r.sectorsize);
    let mut written = vec![false; (SIZE / BLOCK) as usize];
    let mut before_flush = Vec::new();
    while let Some(e) = r.next_entry().unwrap() {
        if e.is_flush() {
            before_flush = written.clone();
        }
        if e.nr_sectors > 0 && !e.is_discard() && !e.is_mark() {
            let first = e.sector * ss / BLOCK;
            let end = ((e.sector + e.nr_sectors) * ss).div_ceil(BLOCK);
            for b in first..end.min(SIZE / BLOCK) {
                written[b as usize] = true;
            }
        }
    }
    let late: Vec<u64> = (0..n).filter(|&i| !before_flush[i as usize]).collect();
    assert!(
        late.is_empty(),
        "{} of {n} acknowledged writes came after the final flush (first: block {})",
        late.len(),
        late[0]
    );
}
