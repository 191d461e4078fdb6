//! Power loss, with log-writes: ext4 on a LUKS2 volume (`udm luks
//! format`) over a log-writes target, a workload of creates, writes,
//! fsyncs, renames and deletes through nbdfuse -> loop -> mount; then the
//! log is replayed onto the volume as it was before the workload, and at
//! every flush and every FUA write the decrypted volume is checked as a
//! mount after a power cut there would find it: the ext4 journal replayed
//! (`e2fsck -E journal_only`, on a copy), then `e2fsck -fn`, which must
//! find it clean. The last state is mounted and every file compared. The
//! counts are printed.

mod common;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::fs::{fsync, need_fs_tools, FuseDisk, Mount};
use common::*;
use udm::core::{BlockDevice, WriteBuf};
use udm::store::file::{FileStore, OpenFlags};
use udm::targets::log_replay::LogReader;

const DATA: u64 = 48 << 20;

fn serve_tables(dir: &Path, tables: &[(&str, &str)], sock: &Path) -> UdmServe {
    let mut args = vec!["--threads".to_string(), "2".to_string()];
    for (name, text) in tables {
        let p = dir.join(format!("{name}.table"));
        std::fs::write(&p, text).unwrap();
        args.push("--table".into());
        args.push(format!("{name}={}", p.display()));
    }
    let _ = std::fs::remove_file(sock);
    UdmServe::start(sock, &args)
}

fn open(path: &Path, read_only: bool) -> Arc<dyn BlockDevice> {
    Arc::new(
        FileStore::open(
            path,
            OpenFlags {
                read_only,
                ..OpenFlags::default()
            },
        )
        .unwrap(),
    )
}

/// The workload: files created, written, fsynced, renamed and deleted;
/// returns what the filesystem should hold at the end.
fn workload(mnt: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut want = BTreeMap::new();
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..60u64 {
        let name = format!("d/f{i}");
        let data = fast_bytes(i + 1, 2048 + (i as usize * 7919) % (192 << 10));
        std::fs::write(mnt.join(&name), &data).unwrap();
        if i % 3 == 0 {
            fsync(&mnt.join(&name));
        }
        if i % 5 == 4 {
            // Rename over: write a new version, fsync it, rename it in.
            let tmp = format!("d/f{i}.tmp");
            let v2 = fast_bytes(1000 + i, data.len() / 2 + 1);
            std::fs::write(mnt.join(&tmp), &v2).unwrap();
            fsync(&mnt.join(&tmp));
            std::fs::rename(mnt.join(&tmp), mnt.join(&name)).unwrap();
            fsync(&mnt.join("d"));
            want.insert(name, v2);
        } else {
            want.insert(name, data);
        }
        if i % 7 == 6 {
            let victim = format!("d/f{}", i - 3);
            std::fs::remove_file(mnt.join(&victim)).unwrap();
            want.remove(&victim);
        }
        if i % 10 == 9 {
            fsync(&mnt.join("d"));
        }
    }
    // Appends with fdatasync, as a log file sees them.
    let mut log = Vec::new();
    for k in 0..20u64 {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(mnt.join("journal.log"))
            .unwrap();
        let rec = fast_bytes(5000 + k, 3000);
        f.write_all(&rec).unwrap();
        f.sync_data().unwrap();
        log.extend_from_slice(&rec);
    }
    want.insert("journal.log".into(), log);
    want
}

/// Merge `r` into a sorted list of disjoint ranges.
fn add_range(v: &mut Vec<Range<u64>>, r: Range<u64>) {
    v.push(r);
    v.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(v.len());
    for r in v.drain(..) {
        match out.last_mut() {
            Some(l) if r.start <= l.end => l.end = l.end.max(r.end),
            _ => out.push(r),
        }
    }
    *v = out;
}

#[test]
fn ext4_on_luks2_over_log_writes_fscks_clean_at_every_flush_and_fua() {
    need_fs_tools(&["mkfs.ext4", "e2fsck"]);
    let d = scratch("udm-lw-");
    let p = d.path();
    let data = sparse(p, "data.img", DATA);
    let log = sparse(p, "log.img", 512 << 20);
    let kf = write_file(p, "key", b"log-writes test");
    run(udm()
        .args(["luks", "format", "-q", "--type=luks2"])
        .args([
            "--cipher=aes-xts-plain64",
            "--key-size=512",
            "--sector-size=4096",
        ])
        .args([
            "--pbkdf=pbkdf2",
            "--pbkdf-force-iterations=1000",
            "--key-file",
        ])
        .arg(&kf)
        .arg(&data));
    let act = udm::luks::open(&data, None, b"log-writes test").unwrap();
    let seg = &act.segments[0];
    let payload = seg.offset_sectors * 512;
    let vol_len = seg.len_sectors * 512;
    let sock = p.join("s.sock");

    // mkfs before logging starts: the replay begins from a filesystem.
    let srv = serve_tables(p, &[("vol", &act.table(data.to_str().unwrap()))], &sock);
    let fuse = FuseDisk::start(&p.join("fuse"), &srv.uri("vol"));
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(fuse.disk()));
    fuse.stop();
    assert_eq!(srv.stop(), Some(0));
    let base = p.join("base.img");
    std::fs::copy(&data, &base).unwrap();
    let base2 = p.join("base2.img");
    std::fs::copy(&data, &base2).unwrap();

    // The workload, logged.
    let lw = format!(
        "0 {} log-writes {} {}\n",
        DATA / 512,
        data.display(),
        log.display()
    );
    let srv = serve_tables(p, &[("lw", &lw), ("vol", &act.table("@lw"))], &sock);
    let fuse = FuseDisk::start(&p.join("fuse"), &srv.uri("vol"));
    let mnt = Mount::new(&fuse.disk(), &p.join("mnt"), "");
    let want = workload(&mnt.dir);
    mnt.unmount();
    fuse.stop();
    // A clean stop drops the target: the end mark and the superblock.
    assert_eq!(srv.stop(), Some(0));

    // Replay onto the base copy; keep a decrypted copy of the volume up to
    // date for e2fsck (only the ranges written since the last check are
    // decrypted again).
    let crypt_lines = udm::core::table::parse(&act.table(base.to_str().unwrap())).unwrap();
    let crypt = udm::mapper::build(&crypt_lines, &mut Files, &Default::default()).unwrap();
    let plain_path = p.join("plain.img");
    let plain = std::fs::File::create(&plain_path).unwrap();
    plain.set_len(vol_len).unwrap();
    drop(plain);
    let plain = open(&plain_path, false);
    let copy = |r: Range<u64>| {
        let mut buf = vec![0u8; 1 << 20];
        let mut at = r.start;
        while at < r.end {
            let n = (r.end - at).min(1 << 20) as usize;
            crypt.read(at, &mut buf[..n]).unwrap();
            plain
                .write(at, WriteBuf::Borrowed(&buf[..n]), false)
                .unwrap();
            at += n as u64;
        }
    };
    copy(0..vol_len);
    let replay_dev = open(&base, false);
    let check_img = p.join("check.img");
    let mut reader = LogReader::open(open(&log, true)).unwrap();
    let ss = u64::from(reader.sectorsize);
    let (mut entries, mut flushes, mut fuas, mut checks) = (0u64, 0u64, 0u64, 0u64);
    let mut dirty: Vec<Range<u64>> = Vec::new();
    let mut end_mark = false;
    while let Some(e) = reader.next_entry().unwrap() {
        reader.apply(&e, replay_dev.as_ref()).unwrap();
        entries += 1;
        if e.nr_sectors > 0 {
            // Device bytes -> volume bytes, widened to crypt sectors.
            let (s, t) = (e.sector * ss, (e.sector + e.nr_sectors) * ss);
            let (s, t) = (s.max(payload), t.min(payload + vol_len));
            if s < t {
                let (s, t) = ((s - payload) & !4095, (t - payload + 4095) & !4095);
                add_range(&mut dirty, s..t.min(vol_len));
            }
        }
        end_mark |= e.mark.as_deref() == Some(udm::targets::log_writes::END_MARK);
        if e.is_flush() || e.is_fua() {
            flushes += u64::from(e.is_flush());
            fuas += u64::from(e.is_fua());
            for r in dirty.drain(..) {
                copy(r);
            }
            // As a mount after the power cut would: replay the ext4 journal
            // (on a copy), then the read-only full check.
            std::fs::copy(&plain_path, &check_img).unwrap();
            let rec = Command::new("e2fsck")
                .args(["-y", "-E", "journal_only"])
                .arg(&check_img)
                .output()
                .unwrap();
            assert!(
                rec.status.code().is_some_and(|c| c <= 1),
                "e2fsck could not replay the journal at {}:\n{}",
                e.describe(),
                show(&rec)
            );
            let out = Command::new(need("e2fsck"))
                .args(["-f", "-n"])
                .arg(&check_img)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "e2fsck -fn found the filesystem inconsistent at {}:\n{}",
                e.describe(),
                show(&out)
            );
            checks += 1;
        }
    }
    for r in dirty.drain(..) {
        copy(r);
    }
    assert!(
        end_mark,
        "the log has no end mark (the target was not dropped)"
    );
    assert!(checks > 10, "only {checks} flush/FUA points in the log");

    // The end of the log is the end of the workload: every file is there.
    let m = Mount::new(&plain_path, &p.join("check"), "ro");
    for (name, data) in &want {
        let back = std::fs::read(m.dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(back == *data, "{name} differs after the replay");
    }
    m.unmount();
    common::report(&format!(
        "log-writes replay: {entries} entries, {flushes} flushes and {fuas} FUA writes, \
         {checks} replayed images checked with e2fsck -fn, all clean; {} files intact at the end; \
         an independent reader of the format replays the same bytes",
        want.len()
    ));
}
