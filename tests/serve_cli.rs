//! `udm serve` end to end against real NBD clients: nbdinfo, nbdcopy,
//! qemu-img and fio. Every tool is required; a missing one fails the test
//! with the package to install (scripts/test.sh installs them).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

/// `udm serve` on `dir`/udm.sock.
fn serve(dir: &std::path::Path, args: &[&str]) -> UdmServe {
    UdmServe::start(&dir.join("udm.sock"), args)
}

#[test]
fn linear_table_round_trips_256_mib_with_nbdcopy() {
    let d = scratch("udm-test-");
    let backing = sparse(d.path(), "backing.img", 300 << 20);
    let size: u64 = 256 << 20;
    let table = d.path().join("lin.table");
    std::fs::write(
        &table,
        format!(
            "# 256 MiB at 1 MiB into the file\n0 {} linear {} 2048\n",
            size / 512,
            backing.display()
        ),
    )
    .unwrap();
    let srv = serve(d.path(), &["--table", &format!("lin={}", table.display())]);

    let info = run_text(Command::new(need("nbdinfo")).args(["--size", &srv.uri("lin")]));
    assert_eq!(info.trim(), size.to_string(), "nbdinfo size");
    // The first export is also the default one.
    let info = run_text(Command::new("nbdinfo").args(["--size", &srv.uri("")]));
    assert_eq!(info.trim(), size.to_string());

    let data = fast_bytes(7, size as usize);
    let src = d.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("lin")]));
    let dst = d.path().join("dst.bin");
    run(Command::new("nbdcopy").args([&srv.uri("lin"), dst.to_str().unwrap()]));
    let back = std::fs::read(&dst).unwrap();
    assert!(back == data, "nbdcopy round trip differs");
    // And the bytes sit 1 MiB into the backing file.
    let raw = std::fs::read(&backing).unwrap();
    assert!(
        raw[1 << 20..(1 << 20) + size as usize] == data[..],
        "linear offset"
    );
    // qemu-img agrees, through its own NBD client.
    run(Command::new(need("qemu-img")).args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        src.to_str().unwrap(),
        &srv.uri("lin"),
    ]));
    assert_eq!(srv.stop(), Some(0), "SIGTERM exits 0");
}

#[test]
fn striped_three_legs_land_at_dm_stripe_offsets() {
    let d = scratch("udm-test-");
    let chunk: u64 = 128; // sectors
    let leg_off = [0u64, 8, 2048]; // sectors
    let width: u64 = 32 << 20; // bytes per leg
    let mut legs = Vec::new();
    for (i, off) in leg_off.iter().enumerate() {
        let p = sparse(d.path(), &format!("leg{i}.img"), width + off * 512);
        legs.push(p);
    }
    let size = 3 * width;
    let table = d.path().join("st.table");
    std::fs::write(
        &table,
        format!(
            "0 {} striped 3 {chunk} {} {} {} {} {} {}\n",
            size / 512,
            legs[0].display(),
            leg_off[0],
            legs[1].display(),
            leg_off[1],
            legs[2].display(),
            leg_off[2]
        ),
    )
    .unwrap();
    let srv = serve(d.path(), &["--table", &format!("st={}", table.display())]);
    let data = fast_bytes(11, size as usize);
    let src = d.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("st")]));
    run(Command::new("nbdcopy").args([
        "--flush",
        &srv.uri("st"),
        d.path().join("back.bin").to_str().unwrap(),
    ]));
    assert!(std::fs::read(d.path().join("back.bin")).unwrap() == data);
    // Compute dm-stripe's placement independently and check every chunk.
    let leg_data: Vec<Vec<u8>> = legs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let cb = (chunk * 512) as usize;
    for (c, piece) in data.chunks(cb).enumerate() {
        let leg = c % 3;
        let row = c / 3;
        let at = (leg_off[leg] * 512) as usize + row * cb;
        assert!(
            leg_data[leg][at..at + cb] == *piece,
            "chunk {c} not on leg {leg} row {row}"
        );
    }
    assert_eq!(srv.stop(), Some(0));
}

fn fio_verify(uri: &str, size_per_job_mib: u64) {
    let out = run_text(Command::new(need("fio")).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=64k",
        "--iodepth=8",
        "--numjobs=4",
        &format!("--size={size_per_job_mib}M"),
        &format!("--offset_increment={size_per_job_mib}M"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]));
    assert!(out.contains("err= 0"), "fio reported errors:\n{out}");
    assert!(!out.contains("verify: bad"), "fio verify failed:\n{out}");
}

#[test]
fn fio_verify_on_linear_and_striped() {
    let d = scratch("udm-test-");
    let a = sparse(d.path(), "a.img", 64 << 20);
    let b = sparse(d.path(), "b.img", 64 << 20);
    let lin = d.path().join("lin.table");
    std::fs::write(
        &lin,
        format!("0 {} linear {} 0\n", (64 << 20) / 512, a.display()),
    )
    .unwrap();
    let st = d.path().join("st.table");
    std::fs::write(
        &st,
        format!(
            "0 {} striped 2 16 {} 0 {} 0\n",
            (128u64 << 20) / 512,
            a.display(),
            b.display()
        ),
    )
    .unwrap();
    // Two servers: the striped table reuses the linear one's file.
    let d2 = scratch("udm-test-");
    let s1 = serve(d.path(), &["--table", &format!("lin={}", lin.display())]);
    fio_verify(&s1.uri("lin"), 16);
    drop(s1);
    let s2 = serve(d2.path(), &["--table", &format!("st={}", st.display())]);
    fio_verify(&s2.uri("st"), 32);
}

#[test]
fn list_exports_and_stacking() {
    let d = scratch("udm-test-");
    let f = sparse(d.path(), "f.img", 8 << 20);
    let base = d.path().join("base.table");
    std::fs::write(&base, format!("0 16384 linear {} 0\n", f.display())).unwrap();
    let top = d.path().join("top.table");
    std::fs::write(&top, "0 8192 linear @base 8192\n4096 8 zero\n").unwrap();
    // A malformed table is refused with its line and field.
    let out = udm()
        .args([
            "serve",
            "--socket",
            d.path().join("x.sock").to_str().unwrap(),
        ])
        .args(["--table", &format!("top={}", top.display())])
        .args(["--table", &format!("base={}", base.display())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("overlap"), "{err}");

    std::fs::write(&top, "0 8192 linear @base 8192\n8192 8192 zero\n").unwrap();
    let srv = serve(
        d.path(),
        &[
            "--table",
            &format!("top={}", top.display()),
            "--table",
            &format!("base={}", base.display()),
            "--file",
            &format!("raw={}", f.display()),
        ],
    );
    let list = run_text(Command::new(need("nbdinfo")).args([
        "--list",
        "--json",
        &format!("nbd+unix://?socket={}", srv.sock.display()),
    ]));
    for name in ["\"top\"", "\"base\"", "\"raw\""] {
        assert!(list.contains(name), "export {name} missing from {list}");
    }
    // Write through the stacked device, read through the file.
    let mut child = Command::new(need("nbdcopy"))
        .args(["-", &srv.uri("top")])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let data = fast_bytes(3, 8 << 20);
    child.stdin.take().unwrap().write_all(&data).unwrap();
    assert!(child.wait().unwrap().success());
    let raw = std::fs::read(&f).unwrap();
    assert!(
        raw[8192 * 512..] == data[..4 << 20],
        "stacked linear lands at base offset"
    );
}

#[test]
fn table_check_and_show() {
    let d = scratch("udm-test-");
    let f = sparse(d.path(), "f.img", 1 << 20);
    let t = d.path().join("t.table");
    std::fs::write(
        &t,
        format!("0 1024 linear {} 1024\n1024 1024 zero\n", f.display()),
    )
    .unwrap();
    let out = run_text(udm().args(["table", "check", t.to_str().unwrap()]));
    assert!(out.contains("2 segment(s), 2048 sectors"), "{out}");
    let out = run_text(udm().args(["table", "show", t.to_str().unwrap()]));
    assert_eq!(
        out,
        format!("0 1024 linear {} 1024\n1024 1024 zero \n", f.display())
    );
    std::fs::write(&t, "0 1024 striped 2 x\n").unwrap();
    let out = udm()
        .args(["table", "show", t.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 1") && err.contains("chunk_size"),
        "{err}"
    );
}

/// The three ways a store reaches a file — O_DIRECT (`--direct`), the page
/// cache through `pread`/`pwrite` (`--no-mmap`), and udm's mapping of a
/// tmpfs file (the default there) — must hold the same ciphertext for the
/// same crypt table: write through one, read back through the others.
#[test]
fn direct_no_mmap_and_mapped_files_hold_the_same_bytes() {
    // O_DIRECT needs a disk filesystem: Cargo's scratch directory for
    // integration tests lives in the target directory.
    let disk = tempfile::Builder::new()
        .prefix("udm-direct-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let shm = scratch("udm-mapped-");
    let size: u64 = 16 << 20;
    let key = "3f".repeat(64);
    let table = |dir: &std::path::Path, img: &std::path::Path| {
        let t = dir.join("crypt.table");
        std::fs::write(
            &t,
            format!(
                "0 {} crypt aes-xts-plain64 {key} 0 {} 0 1 sector_size:4096\n",
                size / 512,
                img.display()
            ),
        )
        .unwrap();
        t
    };
    let data = fast_bytes(31, size as usize);
    let src = write_file(disk.path(), "src.bin", &data);
    let copy_in = |srv: &UdmServe| {
        run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &srv.uri("c")]));
    };
    let read_back = |srv: &UdmServe, dir: &std::path::Path| -> Vec<u8> {
        let out = dir.join("back.bin");
        run(Command::new("nbdcopy").args([&srv.uri("c"), out.to_str().unwrap()]));
        std::fs::read(&out).unwrap()
    };

    // 1. Written with O_DIRECT on the disk filesystem.
    let img = sparse(disk.path(), "crypt.img", size);
    let t = table(disk.path(), &img);
    let srv = serve(
        disk.path(),
        &["--direct", "--table", &format!("c={}", t.display())],
    );
    copy_in(&srv);
    assert!(read_back(&srv, disk.path()) == data, "O_DIRECT round trip");
    assert_eq!(srv.stop(), Some(0));
    let cipher = std::fs::read(&img).unwrap();
    assert!(cipher[..4096] != data[..4096], "the file holds ciphertext");

    // 2. The same file read through the page cache (`--no-mmap`).
    let srv = serve(
        disk.path(),
        &["--no-mmap", "--table", &format!("c={}", t.display())],
    );
    assert!(
        read_back(&srv, disk.path()) == data,
        "pread reads what O_DIRECT wrote"
    );
    assert_eq!(srv.stop(), Some(0));

    // 3. A copy on tmpfs, served mapped: the same plaintext comes out, and
    // rewriting it through the mapping leaves the same ciphertext.
    let shm_img = write_file(shm.path(), "crypt.img", &cipher);
    let t = table(shm.path(), &shm_img);
    let srv = serve(shm.path(), &["--table", &format!("c={}", t.display())]);
    assert!(
        read_back(&srv, shm.path()) == data,
        "the mapping reads what O_DIRECT wrote"
    );
    // Zeroed in place (not truncated, which would pull the pages out from
    // under the mapping), then written again through udm.
    pwrite(&shm_img, 0, &vec![0u8; size as usize]);
    copy_in(&srv);
    assert_eq!(srv.stop(), Some(0));
    assert!(
        std::fs::read(&shm_img).unwrap() == cipher,
        "mapped writes store the same ciphertext"
    );
}

/// Names of the engine's request workers of process `pid`.
fn engine_workers(pid: u32) -> usize {
    threads_named(pid, "udm-worker-")
}

/// Threads of `pid` whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm)
                .map(|c| c.starts_with(prefix))
                .unwrap_or(false)
        })
        .count()
}

/// A device that waits on a network (here a remote NBD export; an RBD
/// image the same) gets its queue depth in engine workers once, whether
/// served raw or under crypt: the crypt export has exactly the workers of
/// the raw one (the depth stacks through crypt, no extra queue), and `udm
/// serve` does not count a device's reservation twice while it puts the
/// exports in command-line order (which once left 2 + 2×depth idle threads
/// behind). Crypto helper threads are the only extra ones: over a device
/// with a queue depth crypt splits only the cipher work of a large request
/// across them (its I/O stays on the worker), so the raw export has none
/// and the crypt export no more than its crypto threads.
#[test]
fn remote_device_gets_its_queue_depth_in_workers_once_raw_or_under_crypt() {
    let d = scratch("udm-test-");
    let p = d.path();
    let disk = sparse(p, "disk.img", 8 << 20);
    let back = UdmServe::start(
        &p.join("back.sock"),
        &["--file".to_string(), format!("d={}", disk.display())],
    );
    let remote = format!("nbd+unix:///d?socket={}", back.sock.display());
    let key = "11".repeat(64);
    let lines = [
        ("raw", format!("0 16384 linear {remote} 0\n")),
        (
            "enc",
            format!("0 16384 crypt aes-xts-plain64 {key} 0 {remote} 0 1 sector_size:4096\n"),
        ),
    ];
    let data = fast_bytes(3, 1 << 20);
    let src = p.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let mut counts = Vec::new();
    for (name, line) in &lines {
        let t = p.join(format!("{name}.table"));
        std::fs::write(&t, line).unwrap();
        let srv = UdmServe::start(
            &p.join(format!("{name}.sock")),
            &[
                "--threads".to_string(),
                "2".into(),
                "--table".into(),
                format!("{name}={}", t.display()),
            ],
        );
        // The export works: a round trip through the remote device.
        run(Command::new(need("nbdcopy")).args([src.to_str().unwrap(), &srv.uri(name)]));
        let out = p.join("out.bin");
        run(Command::new("nbdcopy").args([&srv.uri(name), out.to_str().unwrap()]));
        assert!(std::fs::read(&out).unwrap()[..data.len()] == data[..]);
        counts.push(engine_workers(srv.pid()));
        let helpers = threads_named(srv.pid(), "udm-crypt");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if *name == "raw" {
            assert_eq!(helpers, 0, "raw: no crypto helper threads");
        } else {
            assert!(helpers < cores, "{name}: {helpers} crypto helpers");
        }
        assert_eq!(srv.stop(), Some(0));
    }
    let depth = 64; // store::nbd::QUEUE_DEPTH
    assert_eq!(
        counts[0],
        2 + depth,
        "raw: --threads 2 plus the depth, once"
    );
    assert_eq!(counts[1], counts[0], "crypt over it: the same workers");
    assert_eq!(back.stop(), Some(0));
}
