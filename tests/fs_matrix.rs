//! The end-to-end filesystem matrix: ext4 and xfs on LUKS2, on LUKS1
//! (both made by `udm luks format`, served with `--luks`), on plain crypt
//! over striped, and on linear over flakey with `drop_writes` switched on
//! between fsync points. Each case: mkfs, mount, a couple of thousand
//! files of known content, unmount, fsck clean, remount, every file
//! compared. The flakey case cuts the power as the filesystem sees it:
//! writes after the switch are acknowledged and lost; after recovery the
//! filesystem is clean, every file fsynced before the cut is intact, and
//! the files written after it are gone.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::fs::{need_fs_tools, FuseDisk, Mount};
use common::*;
use udm::core::BlockDevice;

#[derive(Clone, Copy, Debug)]
enum Fs {
    Ext4,
    Xfs,
}

impl Fs {
    fn tools(self) -> [&'static str; 2] {
        match self {
            Fs::Ext4 => ["mkfs.ext4", "e2fsck"],
            Fs::Xfs => ["mkfs.xfs", "xfs_repair"],
        }
    }
    /// Volume size: xfs refuses filesystems under 300 MiB.
    fn size(self) -> u64 {
        match self {
            Fs::Ext4 => 96 << 20,
            Fs::Xfs => 320 << 20,
        }
    }
    fn mkfs(self, disk: &Path) {
        match self {
            Fs::Ext4 => run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(disk)),
            Fs::Xfs => run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(disk)),
        };
    }
    fn fsck(self, disk: &Path) {
        match self {
            Fs::Ext4 => run(Command::new("e2fsck").args(["-f", "-n"]).arg(disk)),
            Fs::Xfs => run(Command::new("xfs_repair").arg("-n").arg(disk)),
        };
    }
}

/// `n` files of known content under a few directories.
fn files(n: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let len = 300 + (i * 2654435761) % 7900;
            (
                format!("d{}/f{seed}-{i}", i % 16),
                bytes(seed * 100_000 + i as u64, len),
            )
        })
        .collect()
}

fn write_files(mnt: &Path, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let p = mnt.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
}

fn verify_files(mnt: &Path, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let back = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(back == *data, "{name} differs");
    }
}

/// mkfs, files, unmount, fsck, remount, verify — on the export `uri`.
fn exercise(fs: Fs, dir: &Path, uri: &str, what: &str) {
    let t = std::time::Instant::now();
    let fuse = FuseDisk::start(&dir.join("fuse"), uri);
    let disk = fuse.disk();
    fs.mkfs(&disk);
    let want = files(2000, 1);
    let m = Mount::new(&disk, &dir.join("mnt"), "");
    write_files(&m.dir, &want);
    m.unmount();
    fs.fsck(&disk);
    let m = Mount::new(&disk, &dir.join("mnt"), "");
    verify_files(&m.dir, &want);
    m.unmount();
    fuse.stop();
    println!(
        "{fs:?} on {what}: mkfs, {} files written, fsck clean, all read back after remount ({:.1} s)",
        want.len(),
        t.elapsed().as_secs_f64()
    );
}

fn on_luks(fs: Fs, version: u32) {
    need_fs_tools(&fs.tools());
    let d = scratch("udm-fsm-");
    let p = d.path();
    let img = sparse(p, "vol.img", fs.size() + (16 << 20));
    let kf = write_file(p, "key", b"matrix passphrase");
    let mut fmt = udm();
    fmt.args(["luks", "format", "-q"])
        .arg(format!("--type=luks{version}"))
        .args(["--cipher=aes-xts-plain64", "--key-size=512"])
        .args([
            "--pbkdf=pbkdf2",
            "--pbkdf-force-iterations=1000",
            "--key-file",
        ])
        .arg(&kf)
        .arg(&img);
    run(&mut fmt);
    let sock = p.join("s.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--luks".to_string(),
            format!("vol={}", img.display()),
            "--key-file".into(),
            kf.display().to_string(),
        ],
    );
    exercise(fs, p, &srv.uri("vol"), &format!("LUKS{version}"));
    assert_eq!(srv.stop(), Some(0));
}

fn on_crypt_over_striped(fs: Fs) {
    need_fs_tools(&fs.tools());
    let d = scratch("udm-fsm-");
    let p = d.path();
    let half = fs.size() / 2;
    let l0 = sparse(p, "leg0.img", half);
    let l1 = sparse(p, "leg1.img", half);
    let st = write_file(
        p,
        "st.table",
        format!(
            "0 {} striped 2 128 {} 0 {} 0\n",
            fs.size() / 512,
            l0.display(),
            l1.display()
        )
        .as_bytes(),
    );
    let cr = write_file(
        p,
        "cr.table",
        format!(
            "0 {} crypt aes-xts-plain64 {} 0 @st 0\n",
            fs.size() / 512,
            "7e".repeat(64)
        )
        .as_bytes(),
    );
    let sock = p.join("s.sock");
    let srv = UdmServe::start(
        &sock,
        &[
            "--table".to_string(),
            format!("st={}", st.display()),
            "--table".into(),
            format!("cr={}", cr.display()),
        ],
    );
    exercise(fs, p, &srv.uri("cr"), "plain crypt over striped");
    assert_eq!(srv.stop(), Some(0));
}

/// Resolves `@fl` to the flakey device and paths to files.
struct WithFlakey(Arc<dyn BlockDevice>);

impl udm::targets::DeviceResolver for WithFlakey {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if spec == "@fl" {
            Ok(self.0.clone())
        } else {
            Files.resolve(spec)
        }
    }
}

fn on_linear_over_flakey(fs: Fs) {
    need_fs_tools(&fs.tools());
    let d = scratch("udm-fsm-");
    let p = d.path();
    let img = sparse(p, "disk.img", fs.size());
    let sectors = fs.size() / 512;
    // Up for an hour (the cycle is driven by hand below), drop_writes when
    // down. The test holds the target and switches it itself, exactly
    // between two fsync points (tests/faults_nbd.rs does the same switch
    // with `udm dmsetup reload`).
    let args: Vec<String> = format!("{} 0 3600 1 1 drop_writes", img.display())
        .split(' ')
        .map(String::from)
        .collect();
    let flakey = udm::targets::flakey::build(udm::targets::TargetArgs {
        args: &args,
        len: fs.size(),
        resolver: &mut Files,
        options: &Default::default(),
    })
    .unwrap();
    let lines = udm::core::table::parse(&format!("0 {sectors} linear @fl 0\n")).unwrap();
    let lin = udm::mapper::build(
        &lines,
        &mut WithFlakey(flakey.clone() as Arc<dyn BlockDevice>),
        &Default::default(),
    )
    .unwrap();
    let srv = nbd::Server::start(vec![nbd::export("lin", Arc::new(lin), false)], 2);
    let uri = srv.uri("lin");
    let t = std::time::Instant::now();

    let fuse = FuseDisk::start(&p.join("fuse"), &uri);
    let disk = fuse.disk();
    fs.mkfs(&disk);
    let kept = files(1500, 2);
    let lost = files(500, 3);
    let m = Mount::new(&disk, &p.join("mnt"), "");
    write_files(&m.dir, &kept);
    // The fsync point: everything so far is durable.
    run(Command::new("sync").arg("-f").arg(&m.dir));
    flakey.force_state(Some(true));
    assert!(flakey.is_down());
    write_files(&m.dir, &lost);
    // fsync succeeds: the device acknowledges and drops.
    run(Command::new("sync").arg("-f").arg(&m.dir));
    m.unmount();
    fuse.stop();
    flakey.force_state(Some(false));

    // After the "power cut": a fresh view of the device (no cached
    // pages), journal/log recovery by a mount, then the check.
    let fuse = FuseDisk::start(&p.join("fuse"), &uri);
    let disk = fuse.disk();
    Mount::new(&disk, &p.join("mnt"), "").unmount();
    fs.fsck(&disk);
    let m = Mount::new(&disk, &p.join("mnt"), "");
    verify_files(&m.dir, &kept);
    let gone = lost.iter().filter(|(n, _)| !m.dir.join(n).exists()).count();
    assert!(
        gone == lost.len(),
        "{} of {} files written while writes were dropped survived the cut",
        lost.len() - gone,
        lost.len()
    );
    m.unmount();
    fuse.stop();
    srv.stop().unwrap();
    println!(
        "{fs:?} on linear over flakey: {} files fsynced before drop_writes intact, {} written \
         after it gone, fsck clean after recovery ({:.1} s)",
        kept.len(),
        lost.len(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn ext4_on_luks2() {
    on_luks(Fs::Ext4, 2);
}

#[test]
fn xfs_on_luks2() {
    on_luks(Fs::Xfs, 2);
}

#[test]
fn ext4_on_luks1() {
    on_luks(Fs::Ext4, 1);
}

#[test]
fn xfs_on_luks1() {
    on_luks(Fs::Xfs, 1);
}

#[test]
fn ext4_on_crypt_over_striped() {
    on_crypt_over_striped(Fs::Ext4);
}

#[test]
fn xfs_on_crypt_over_striped() {
    on_crypt_over_striped(Fs::Xfs);
}

#[test]
fn ext4_on_linear_over_flakey_with_drop_writes() {
    on_linear_over_flakey(Fs::Ext4);
}

#[test]
fn xfs_on_linear_over_flakey_with_drop_writes() {
    on_linear_over_flakey(Fs::Xfs);
}
