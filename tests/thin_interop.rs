//! dm-thin against thin-provisioning-tools, both ways: a pool written by
//! `thin_restore` opens in udm and its devices read what the XML maps; a
//! pool udm made (a filesystem through thin 0, a snapshot, more writes)
//! passes `thin_check`, and `thin_dump`/`thin_ls` see both devices, their
//! mappings and the blocks they share. A snapshot keeps the old data while
//! its origin changes.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::dm::DmServer;
use common::*;

/// 64 KiB data blocks, the smallest the kernel takes.
const BLOCK: usize = 65536;

const NBD_IO: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
op, off = sys.argv[2], int(sys.argv[3])
if op == "read":
    n = int(sys.argv[4])
    while n > 0:
        k = min(n, 4 << 20)
        sys.stdout.buffer.write(h.pread(k, off))
        off += k
        n -= k
elif op == "stamp":
    n, bs = int(sys.argv[4]), int(sys.argv[5])
    for vb in range(off, off + n):
        h.pwrite(bytes([vb % 251 + 1]) * 4096, vb * bs + 8192)
    h.flush()
elif op == "trim":
    h.trim(int(sys.argv[4]), off)
    h.flush()
else:
    data = sys.stdin.buffer.read()
    h.pwrite(data, off)
    h.flush()
h.shutdown()
"#;

fn nbd_read(uri: &str, off: u64, len: usize) -> Vec<u8> {
    need_python_module("nbd", "python3-libnbd");
    let o = run(Command::new(PYTHON).args([
        "-c",
        NBD_IO,
        uri,
        "read",
        &off.to_string(),
        &len.to_string(),
    ]));
    assert_eq!(o.stdout.len(), len, "short read from {uri}");
    o.stdout
}

fn nbd_write(uri: &str, off: u64, data: &[u8]) {
    need_python_module("nbd", "python3-libnbd");
    let mut c = Command::new(PYTHON)
        .args(["-c", NBD_IO, uri, "write", &off.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "write to {uri}: {}", show(&o));
}

fn tool(name: &str, args: &[&str]) -> String {
    need(name);
    let o = run(Command::new(name).args(args));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn pool_line(meta: &Path, data: &Path, blocks: u64, features: &str) -> String {
    format!(
        "0 {} thin-pool {} {} {} 0 {features}",
        blocks * (BLOCK as u64 / 512),
        meta.display(),
        data.display(),
        BLOCK / 512
    )
}

/// `(virtual block, data block it maps or None)` of one device.
type Expect = &'static [(u64, Option<u64>)];

fn thin_line(sectors: u64, id: u64) -> String {
    format!("0 {sectors} thin @pool {id}")
}

#[test]
fn restored_pool_reads_what_the_xml_maps() {
    let dir = scratch("thin-restore");
    let xml = r#"<superblock uuid="" time="1" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="100">
  <device dev_id="0" mapped_blocks="3" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="10" length="2" time="0"/>
    <single_mapping origin_block="50" data_block="5" time="1"/>
  </device>
  <device dev_id="7" mapped_blocks="2" transaction="0" creation_time="1" snap_time="1">
    <single_mapping origin_block="0" data_block="10" time="0"/>
    <single_mapping origin_block="3" data_block="20" time="1"/>
  </device>
</superblock>
"#;
    let x = write_file(dir.path(), "pool.xml", xml.as_bytes());
    let meta = sparse(dir.path(), "meta", 4 << 20);
    tool(
        "thin_restore",
        &["-i", x.to_str().unwrap(), "-o", meta.to_str().unwrap()],
    );
    // Every data block holds its own pattern.
    let data = sparse(dir.path(), "data", 100 * BLOCK as u64);
    for db in 0..100u64 {
        pwrite(&data, db * BLOCK as u64, &bytes(db + 1, BLOCK));
    }
    let srv = DmServer::start(dir.path(), &[]);
    srv.ok(&[
        "create",
        "pool",
        "--table",
        &pool_line(&meta, &data, 100, ""),
    ]);
    let st = srv.ok(&["status", "pool"]);
    assert!(st.contains(" thin-pool 3 "), "transaction id 3 in: {st}");
    assert!(st.contains("/100 "), "100 data blocks in: {st}");
    let sectors = 64 * (BLOCK as u64 / 512);
    srv.ok(&["create", "t0", "--table", &thin_line(sectors, 0)]);
    srv.ok(&["create", "t7", "--table", &thin_line(sectors, 7)]);
    let expect: &[(&str, Expect)] = &[
        (
            "t0",
            &[
                (0, Some(10)),
                (1, Some(11)),
                (2, None),
                (50, Some(5)),
                (63, None),
            ],
        ),
        ("t7", &[(0, Some(10)), (1, None), (3, Some(20))]),
    ];
    for (dev, maps) in expect {
        for &(vb, db) in maps.iter() {
            let got = nbd_read(&srv.uri(dev), vb * BLOCK as u64, BLOCK);
            let want = match db {
                Some(d) => bytes(d + 1, BLOCK),
                None => vec![0; BLOCK],
            };
            assert!(
                got == want,
                "{dev} block {vb} should read data block {db:?}"
            );
        }
    }
    let st = srv.ok(&["status", "t0"]);
    assert!(
        st.contains(&format!(" thin {} {}", 3 * 128, 51 * 128 - 1)),
        "{st}"
    );
    // The metadata cache is visible, under the pool's budget: the reads
    // above left the nodes they walked cached.
    let m = &srv.status_json("pool")["targets"][0]["memory"];
    let num = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k} in {m}"));
    assert!(num("cached_bytes") >= 2 * 4096, "{m}");
    assert_eq!(num("cached_bytes") % 4096, 0, "{m}");
    assert!(num("budget_bytes") >= 16 << 20, "{m}");
    assert!(
        num("cached_bytes") + num("pinned_bytes") <= num("budget_bytes"),
        "{m}"
    );
    let thin = &srv.status_json("t0")["targets"][0];
    assert!(
        thin.get("memory").is_none(),
        "a thin device keeps no memory: {thin}"
    );
    // A restored pool is not a udm pool: unknown device ids are refused.
    let e = srv.fails(&["create", "t9", "--table", &thin_line(sectors, 9)]);
    assert!(e.contains("create_thin 9"), "{e}");
    srv.ok(&["remove", "--retry", "t0"]);
    srv.ok(&["remove", "--retry", "t7"]);
    srv.ok(&["remove", "--retry", "pool"]);
    srv.serve.stop();
    tool("thin_check", &[meta.to_str().unwrap()]);
}

/// Detaches the mapper directory when dropped, also when a test fails.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .stderr(Stdio::null())
            .status();
    }
}

/// A server with a control socket and a mapper directory `dir/mapper`,
/// in which every device is a file (FUSE; the tests run as root).
fn mapper_server(dir: &Path) -> (DmServer, PathBuf, Unmount) {
    need("umount");
    let map = dir.join("mapper");
    let guard = Unmount(map.clone());
    let srv = DmServer::start(dir, &["--mapper-dir", map.to_str().unwrap()]);
    let want = map.to_str().unwrap().to_string();
    wait_for("the mapper directory", Duration::from_secs(10), || {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
    });
    (srv, map, guard)
}

/// `debugfs` on an unmounted ext4 image: `-w` writes; its stdout.
fn debugfs(img: &Path, write: bool, request: &str) -> String {
    let mut c = Command::new(need("debugfs"));
    if write {
        c.arg("-w");
    }
    let o = run(c.arg("-R").arg(request).arg(img));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fsck_clean(img: &Path) {
    let o = Command::new(need("e2fsck"))
        .args(["-f", "-n"])
        .arg(img)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "e2fsck -fn {}: {}",
        img.display(),
        show(&o)
    );
}

#[test]
fn udm_pool_passes_thin_check_with_a_filesystem_and_a_snapshot() {
    need("mkfs.ext4");
    let dir = scratch("thin-udm");
    let meta = sparse(dir.path(), "meta", 4 << 20);
    let data_blocks = 1024u64;
    let data = sparse(dir.path(), "data", data_blocks * BLOCK as u64);
    let fs_len = 32u64 << 20;
    let (srv, map, _unmount) = mapper_server(dir.path());
    srv.ok(&[
        "create",
        "pool",
        "--table",
        &pool_line(&meta, &data, data_blocks, ""),
    ]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    let sectors = fs_len / 512;
    srv.ok(&["create", "t0", "--table", &thin_line(sectors, 0)]);
    let t0 = map.join("t0");
    wait_for("the file of t0", Duration::from_secs(10), || t0.exists());
    // mkfs.ext4 on the device's file: it discards the whole device (punch
    // hole), zeroes the journal (zero range), writes and flushes.
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .arg(&t0));
    let first = fast_bytes(7, 3 << 20);
    let src_a = write_file(dir.path(), "a.src", &first);
    debugfs(&t0, true, &format!("write {} a", src_a.display()));
    fsck_clean(&t0);
    let st = srv.ok(&["status", "pool"]);
    assert!(
        data_used(&st) < fs_len / BLOCK as u64,
        "only what mkfs and the file wrote is provisioned: {st}"
    );
    let before = std::fs::read(&t0).unwrap();

    srv.ok(&["message", "pool", "0", "create_snap", "1", "0"]);
    srv.ok(&["create", "t1", "--table", &thin_line(sectors, 1)]);
    let t1 = map.join("t1");
    wait_for("the file of t1", Duration::from_secs(10), || t1.exists());
    // More through the origin: a new file, one removed, another changed
    // in place (ext4's 4 KiB blocks break shared 64 KiB thin blocks).
    let more = fast_bytes(8, 2 << 20);
    let src_b = write_file(dir.path(), "b.src", &more);
    debugfs(&t0, true, &format!("write {} b", src_b.display()));
    let blocks = debugfs(&t0, false, "blocks a");
    let first_block: u64 = blocks.split_whitespace().next().unwrap().parse().unwrap();
    let changed = bytes(99, 8192);
    pwrite(&t0, first_block * 4096 + 4096, &changed);
    fsck_clean(&t0);
    fsck_clean(&t1);
    assert!(
        std::fs::read(&t1).unwrap() == before,
        "the snapshot reads the filesystem as it was"
    );
    let ls0 = debugfs(&t0, false, "ls -l /");
    let ls1 = debugfs(&t1, false, "ls -l /");
    let has_b = |ls: &str| ls.lines().any(|l| l.trim_end().ends_with(" b"));
    assert!(has_b(&ls0) && !has_b(&ls1), "{ls0}\n{ls1}");
    let dump = |img: &Path, f: &str| {
        let out = dir.path().join("out");
        debugfs(img, false, &format!("dump {f} {}", out.display()));
        std::fs::read(&out).unwrap()
    };
    assert!(dump(&t1, "a") == first, "the snapshot's file a is intact");
    let mut want = first.clone();
    want[4096..4096 + 8192].copy_from_slice(&changed);
    let got = dump(&t0, "a");
    let diff = got.iter().zip(&want).position(|(x, y)| x != y);
    assert!(
        got == want,
        "the origin's a has its change: {} bytes, first difference at {diff:?}",
        got.len()
    );
    assert!(dump(&t0, "b") == more, "the origin's new file b");

    srv.ok(&["message", "pool", "0", "set_transaction_id", "0", "5"]);
    let st = srv.ok(&["status", "pool"]);
    assert!(st.contains(" thin-pool 5 "), "{st}");
    assert!(
        st.contains(" rw discard_passdown queue_if_no_space - "),
        "{st}"
    );

    for d in ["t1", "t0", "pool"] {
        srv.ok(&["remove", "--retry", d]);
    }
    srv.serve.stop();
    let m = meta.to_str().unwrap();
    tool("thin_check", &[m]);
    let dump = tool("thin_dump", &[m]);
    assert!(dump.contains("transaction=\"5\""), "{dump}");
    assert!(
        dump.contains("dev_id=\"0\"") && dump.contains("dev_id=\"1\""),
        "{dump}"
    );
    assert!(dump.contains("_mapping"), "{dump}");
    let ls = tool(
        "thin_ls",
        &[
            "--no-headers",
            "-o",
            "DEV,MAPPED_BLOCKS,EXCLUSIVE_BLOCKS,SHARED_BLOCKS",
            m,
        ],
    );
    let rows: Vec<Vec<u64>> = ls
        .lines()
        .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{ls}");
    // The origin has file b (32 blocks) and its broken blocks alone; the
    // snapshot keeps the old copies of the blocks the origin changed.
    for (r, least) in rows.iter().zip([32, 2]) {
        assert!(
            r[2] >= least,
            "each device maps the changed blocks exclusively: {ls}"
        );
        assert!(r[3] > 0, "and shares the rest: {ls}");
        assert_eq!(r[1], r[2] + r[3], "{ls}");
    }
}

fn nbd_op(uri: &str, op: &str, args: &[u64]) {
    need_python_module("nbd", "python3-libnbd");
    let mut c = Command::new(PYTHON);
    c.args(["-c", NBD_IO, uri, op]);
    c.args(args.iter().map(|a| a.to_string()));
    run(&mut c);
}

/// `<used>/<total>` data blocks from a pool's status line.
fn data_used(status: &str) -> u64 {
    let w: Vec<&str> = status.split_whitespace().collect();
    w[5].split('/').next().unwrap().parse().unwrap()
}

#[test]
fn discard_delete_and_metadata_snapshot() {
    let dir = scratch("thin-discard");
    let meta = sparse(dir.path(), "meta", 4 << 20);
    let data = sparse(dir.path(), "data", 1024 * BLOCK as u64);
    let srv = DmServer::start(dir.path(), &[]);
    srv.ok(&[
        "create",
        "pool",
        "--table",
        &pool_line(&meta, &data, 1024, ""),
    ]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    let sectors = 1024 * (BLOCK as u64 / 512);
    srv.ok(&["create", "t0", "--table", &thin_line(sectors, 0)]);
    let uri = srv.uri("t0");
    // 4 KiB into each of 600 new blocks: 600 mappings, a btree of
    // several levels, and the rest of each block zeroed.
    nbd_op(&uri, "stamp", &[0, 600, BLOCK as u64]);
    let b3 = nbd_read(&uri, 3 * BLOCK as u64, BLOCK);
    assert!(b3[..8192].iter().all(|&x| x == 0) && b3[12288..].iter().all(|&x| x == 0));
    assert!(b3[8192..12288].iter().all(|&x| x == 4));
    assert_eq!(data_used(&srv.ok(&["status", "pool"])), 600);

    srv.ok(&["message", "pool", "0", "reserve_metadata_snap"]);
    let st = srv.ok(&["status", "pool"]);
    assert!(!st.contains(" - rw "), "a held root in: {st}");
    let held = tool("thin_dump", &["-m", meta.to_str().unwrap()]);
    assert!(held.contains("mapped_blocks=\"600\""), "{held}");

    srv.ok(&["message", "pool", "0", "create_snap", "1", "0"]);
    nbd_op(&uri, "trim", &[0, 500 * BLOCK as u64]);
    assert!(nbd_read(&uri, 3 * BLOCK as u64, BLOCK)
        .iter()
        .all(|&x| x == 0));
    assert_eq!(
        data_used(&srv.ok(&["status", "pool"])),
        600,
        "the snapshot keeps them"
    );
    srv.ok(&["message", "pool", "0", "delete", "1"]);
    // The held metadata snapshot still maps them all.
    assert_eq!(data_used(&srv.ok(&["status", "pool"])), 600);
    srv.ok(&["message", "pool", "0", "release_metadata_snap"]);
    let st = srv.ok(&["status", "pool"]);
    assert!(st.contains(" - rw "), "{st}");
    assert_eq!(data_used(&st), 100, "{st}");
    let e = srv.fails(&["message", "pool", "0", "delete", "1"]);
    assert!(e.contains("does not exist"), "{e}");
    srv.ok(&["remove", "--retry", "t0"]);
    srv.ok(&["remove", "--retry", "pool"]);
    srv.serve.stop();
    tool("thin_check", &[meta.to_str().unwrap()]);
    let dump = tool("thin_dump", &[meta.to_str().unwrap()]);
    assert!(dump.contains("mapped_blocks=\"100\""), "{dump}");
    assert!(!dump.contains("dev_id=\"1\""), "{dump}");
}

/// What level `k` of the snapshot chain reads in block `j`: level `i`
/// wrote block `i` whole (byte `i + 1`) and 4 KiB at `4096 * i` of block
/// 12 (byte `101 + i`), each level on a snapshot of the one before.
fn chain_block(k: usize, j: usize) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    if j < 12 && j <= k {
        b.fill(j as u8 + 1);
    } else if j == 12 {
        for i in 0..=k {
            b[4096 * i..4096 * (i + 1)].fill(101 + i as u8);
        }
    }
    b
}

#[test]
fn a_chain_of_ten_snapshots_reads_right_at_each_level() {
    let dir = scratch("thin-chain");
    let meta = sparse(dir.path(), "meta", 4 << 20);
    let data = sparse(dir.path(), "data", 256 * BLOCK as u64);
    let srv = DmServer::start(dir.path(), &[]);
    srv.ok(&[
        "create",
        "pool",
        "--table",
        &pool_line(&meta, &data, 256, ""),
    ]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    let sectors = 16 * (BLOCK as u64 / 512);
    for k in 0..10usize {
        if k > 0 {
            let (id, origin) = (k.to_string(), (k - 1).to_string());
            srv.ok(&["message", "pool", "0", "create_snap", &id, &origin]);
        }
        let name = format!("t{k}");
        srv.ok(&["create", &name, "--table", &thin_line(sectors, k as u64)]);
        let uri = srv.uri(&name);
        nbd_write(&uri, (k * BLOCK) as u64, &vec![k as u8 + 1; BLOCK]);
        let at = 12 * BLOCK + 4096 * k;
        nbd_write(&uri, at as u64, &[101 + k as u8; 4096]);
    }
    // Every level, read after the whole chain is built.
    for k in 0..10usize {
        let got = nbd_read(&srv.uri(&format!("t{k}")), 0, 16 * BLOCK);
        for j in 0..16 {
            assert!(
                got[j * BLOCK..(j + 1) * BLOCK] == chain_block(k, j)[..],
                "snapshot level {k}, block {j}"
            );
        }
    }
    for k in 0..10 {
        srv.ok(&["remove", "--retry", &format!("t{k}")]);
    }
    srv.ok(&["remove", "--retry", "pool"]);
    srv.serve.stop();
    tool("thin_check", &[meta.to_str().unwrap()]);
    let ls = tool(
        "thin_ls",
        &["--no-headers", "-o", "DEV", meta.to_str().unwrap()],
    );
    assert_eq!(ls.lines().count(), 10, "ten devices: {ls}");
}

/// The `dmsetup message` round trips of three `create_snap`s of
/// `origin`, as new ids `first..first + 3`, in ms.
fn snap_times(srv: &DmServer, origin: u64, first: u64) -> Vec<f64> {
    (first..first + 3)
        .map(|id| {
            let (id, origin) = (id.to_string(), origin.to_string());
            let t = std::time::Instant::now();
            srv.ok(&["message", "pool", "0", "create_snap", &id, &origin]);
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

#[test]
fn snapshot_time_is_the_same_at_1_gib_and_100_gib() {
    let dir = scratch("thin-snaptime");
    let meta = sparse(dir.path(), "meta", 16 << 20);
    let gib_blocks = (1u64 << 30) / BLOCK as u64;
    let data_blocks = gib_blocks + 64;
    let data = sparse(dir.path(), "data", data_blocks * BLOCK as u64);
    let srv = DmServer::start(dir.path(), &[]);
    let line = pool_line(&meta, &data, data_blocks, "1 skip_block_zeroing");
    srv.ok(&["create", "pool", "--table", &line]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    srv.ok(&["message", "pool", "0", "create_thin", "1"]);
    let bs = BLOCK as u64 / 512;
    srv.ok(&["create", "g1", "--table", &thin_line(gib_blocks * bs, 0)]);
    srv.ok(&[
        "create",
        "g100",
        "--table",
        &thin_line(100 * gib_blocks * bs, 1),
    ]);
    // Every block of the 1 GiB device mapped; a few of the 100 GiB one,
    // spread over it.
    nbd_op(&srv.uri("g1"), "stamp", &[0, gib_blocks, BLOCK as u64]);
    for vb in [0, 12_345, 800_000, 100 * gib_blocks - 1] {
        nbd_op(&srv.uri("g100"), "stamp", &[vb, 1, BLOCK as u64]);
    }
    let st = srv.ok(&["status", "pool"]);
    assert_eq!(data_used(&st), gib_blocks + 4, "{st}");
    // What a `udm dmsetup` round trip costs without a commit.
    let base: Vec<f64> = (0..3)
        .map(|_| {
            let t = std::time::Instant::now();
            srv.ok(&["status", "pool"]);
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    let small = snap_times(&srv, 0, 10);
    let big = snap_times(&srv, 1, 20);
    let min = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    common::report(&format!(
        "thin create_snap round trip (udm dmsetup message, incl. commit): \
         1 GiB fully mapped {small:.1?} ms, 100 GiB sparse {big:.1?} ms \
         (a status round trip: {base:.1?} ms)"
    ));
    assert!(min(&small) < 100.0, "1 GiB snapshot took {small:?} ms");
    assert!(min(&big) < 100.0, "100 GiB snapshot took {big:?} ms");
    srv.ok(&["remove", "--retry", "g1"]);
    srv.ok(&["remove", "--retry", "g100"]);
    srv.ok(&["remove", "--retry", "pool"]);
    srv.serve.stop();
    tool("thin_check", &[meta.to_str().unwrap()]);
}

/// 512-byte sectors the data file takes on its filesystem.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks()
}

/// A discard that frees data blocks whole punches them out of the data
/// file (`discard_passdown`, the default); blocks a snapshot still maps
/// stay; `no_discard_passdown` unmaps without touching the data file.
#[test]
fn discards_pass_freed_blocks_down_to_the_data_file() {
    let dir = scratch("thin-passdown");
    let meta = sparse(dir.path(), "meta", 4 << 20);
    let data = sparse(dir.path(), "data", 256 * BLOCK as u64);
    let srv = DmServer::start(dir.path(), &[]);
    let pool = |features: &str| pool_line(&meta, &data, 256, features);
    srv.ok(&["create", "pool", "--table", &pool("")]);
    srv.ok(&["message", "pool", "0", "create_thin", "0"]);
    srv.ok(&["create", "t0", "--table", &thin_line(64 * 128, 0)]);
    let uri = srv.uri("t0");
    let b = BLOCK as u64;
    // A stamp writes 4 KiB into each block, and the rest of a new block
    // is zeroed by punching it (tmpfs) or as unwritten extents: at least
    // that page of every block is in the file (sectors).
    let per_block = 4096 / 512;
    nbd_op(&uri, "stamp", &[0, 32, b]);
    let full = allocated(&data);
    assert!(full >= 32 * per_block, "32 blocks written: {full}");

    // Blocks only t0 maps: freed and punched out.
    nbd_op(&uri, "trim", &[0, 8 * b]);
    let st = srv.ok(&["status", "pool"]);
    assert_eq!(data_used(&st), 24, "{st}");
    assert!(st.contains(" discard_passdown "), "{st}");
    let after = allocated(&data);
    assert!(
        after <= full - 8 * per_block,
        "the data file gave back 8 blocks: {full} -> {after}"
    );
    assert!(nbd_read(&uri, 0, 8 * BLOCK).iter().all(|&x| x == 0));

    // Blocks a snapshot shares: unmapped from t0, kept, not passed down.
    srv.ok(&["message", "pool", "0", "create_snap", "1", "0"]);
    nbd_op(&uri, "trim", &[8 * b, 8 * b]);
    assert_eq!(data_used(&srv.ok(&["status", "pool"])), 24);
    assert_eq!(allocated(&data), after, "shared blocks stay in the file");
    let snap_block = nbd_read(&uri, 8 * b, BLOCK);
    assert!(snap_block.iter().all(|&x| x == 0), "t0 no longer maps it");
    srv.ok(&["message", "pool", "0", "delete", "1"]);

    // no_discard_passdown: freed in the pool, the file keeps its blocks.
    srv.ok(&["reload", "pool", "--table", &pool("1 no_discard_passdown")]);
    srv.ok(&["resume", "pool"]);
    let st = srv.ok(&["status", "pool"]);
    assert!(st.contains(" no_discard_passdown "), "{st}");
    let before = allocated(&data);
    nbd_op(&uri, "trim", &[16 * b, 8 * b]);
    assert_eq!(data_used(&srv.ok(&["status", "pool"])), 8);
    assert_eq!(allocated(&data), before, "nothing passed down");

    srv.ok(&["reload", "pool", "--table", &pool("1 ignore_discard")]);
    srv.ok(&["resume", "pool"]);
    let st = srv.ok(&["status", "pool"]);
    assert!(st.contains(" ignore_discard "), "{st}");
    srv.ok(&["remove", "--retry", "t0"]);
    srv.ok(&["remove", "--retry", "pool"]);
    srv.serve.stop();
    tool("thin_check", &[meta.to_str().unwrap()]);
}

/// `serve --no-flatten` keeps every device a layer of its own: a thin
/// line still finds its pool. The pool refuses to delete a thin device
/// that has a table, as the kernel does, and deletes it once it is gone.
#[test]
fn thin_finds_its_pool_without_flattening_and_delete_refuses_an_open_device() {
    let dir = scratch("thin-noflat");
    let meta = sparse(dir.path(), "meta", 4 << 20);
    let data = sparse(dir.path(), "data", 64 * BLOCK as u64);
    let srv = DmServer::start(dir.path(), &["--no-flatten"]);
    srv.ok(&[
        "create",
        "pool",
        "--table",
        &pool_line(&meta, &data, 64, ""),
    ]);
    srv.ok(&["message", "pool", "0", "create_thin", "3"]);
    srv.ok(&["create", "t3", "--table", &thin_line(16 * 128, 3)]);
    let data_in = bytes(3, 2 * BLOCK);
    nbd_write(&srv.uri("t3"), BLOCK as u64, &data_in);
    assert!(nbd_read(&srv.uri("t3"), BLOCK as u64, 2 * BLOCK) == data_in);
    let e = srv.fails(&["message", "pool", "0", "delete", "3"]);
    assert!(e.contains("thin device 3") && e.contains("in use"), "{e}");
    srv.ok(&["remove", "--retry", "t3"]);
    srv.ok(&["message", "pool", "0", "delete", "3"]);
    srv.ok(&["remove", "--retry", "pool"]);
    srv.serve.stop();
    tool("thin_check", &[meta.to_str().unwrap()]);
}
