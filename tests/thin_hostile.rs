//! dm-thin against hostile metadata (issue 44, findings 1–4 and 12): pools
//! made by `thin_restore`, then one field or node changed and resealed as
//! an attacker with the metadata device would. Each must be refused with
//! an error naming what is wrong, or, when the damage appears under a
//! running pool, fail the request with EIO and put the pool in
//! `needs_check`; never take the server down, never hang. `thin_check`
//! refuses the same images. A healthy pool with multi-level trees still
//! opens and reads right.
//!
//! The dangerous steps run in other processes with a deadline (the server,
//! an NBD client), so a regression reports a failure instead of aborting
//! or hanging the suite.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::*;
use udm::targets::thin::pdata::block::{
    get32, get64, put32, put64, seal, Node, BLOCK_SIZE, SUPERBLOCK_XOR,
};

/// 64 KiB data blocks, the smallest the kernel takes.
const BLOCK: u64 = 65536;
const DATA_BLOCKS: u64 = 100;

/// Superblock offsets (dm-thin-metadata.c's `struct thin_disk_superblock`).
const SB_FLAGS: usize = 4;
const SB_DATA_SM: usize = 64;
const SB_MAPPING_ROOT: usize = 320;
const SB_DETAILS_ROOT: usize = 328;

/// Two devices: 0 maps blocks 0..3 and 50, 1 maps 0 and 3.
const XML: &str = r#"<superblock uuid="" time="1" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="100">
  <device dev_id="0" mapped_blocks="4" transaction="0" creation_time="0" snap_time="1">
    <range_mapping origin_begin="0" data_begin="10" length="3" time="0"/>
    <single_mapping origin_block="50" data_block="5" time="1"/>
  </device>
  <device dev_id="1" mapped_blocks="2" transaction="0" creation_time="1" snap_time="1">
    <single_mapping origin_block="0" data_block="30" time="0"/>
    <single_mapping origin_block="3" data_block="20" time="1"/>
  </device>
</superblock>
"#;

struct Pool {
    dir: tempfile::TempDir,
    meta: PathBuf,
    data: PathBuf,
}

/// `xml` restored by thin_restore onto a 4 MiB metadata file, with a data
/// file of `data_blocks` blocks, each holding its own pattern.
fn restore(prefix: &str, xml: &str, data_blocks: u64) -> Pool {
    need("thin_restore");
    let dir = scratch(prefix);
    let x = write_file(dir.path(), "pool.xml", xml.as_bytes());
    let meta = sparse(dir.path(), "meta", 4 << 20);
    run(Command::new("thin_restore").args([
        "-i",
        x.to_str().unwrap(),
        "-o",
        meta.to_str().unwrap(),
    ]));
    let data = sparse(dir.path(), "data", data_blocks * BLOCK);
    for db in 0..DATA_BLOCKS.min(data_blocks) {
        pwrite(&data, db * BLOCK, &pattern(db));
    }
    Pool { dir, meta, data }
}

fn pattern(db: u64) -> Vec<u8> {
    vec![(db % 251) as u8 + 1; 4096]
}

fn pool_line(p: &Pool, blocks: u64) -> String {
    format!(
        "0 {} thin-pool {} {} {} 0",
        blocks * (BLOCK / 512),
        p.meta.display(),
        p.data.display(),
        BLOCK / 512
    )
}

/// A thin device of 20000 blocks (past every mapping here).
fn thin_line(id: u64) -> String {
    format!("0 {} thin @pool {id}", 20_000 * (BLOCK / 512))
}

fn block(meta: &Path, b: u64) -> [u8; BLOCK_SIZE] {
    pread(meta, b * BLOCK_SIZE as u64, BLOCK_SIZE)
        .try_into()
        .unwrap()
}

fn superblock(meta: &Path) -> [u8; BLOCK_SIZE] {
    block(meta, 0)
}

/// Change the superblock with `f`, resealed.
fn patch_superblock(meta: &Path, f: impl FnOnce(&mut [u8; BLOCK_SIZE])) {
    let mut sb = superblock(meta);
    f(&mut sb);
    seal(&mut sb, 0, SUPERBLOCK_XOR);
    pwrite(meta, 0, &sb);
}

fn node(meta: &Path, b: u64) -> Node {
    Node::decode(&block(meta, b), b).unwrap()
}

/// Write `n` at block `b`, sealed as a valid btree node there.
fn put_node(meta: &Path, b: u64, n: &Node) {
    pwrite(meta, b * BLOCK_SIZE as u64, &n.encode(b)[..]);
}

/// An internal node whose only child is itself.
fn self_loop(b: u64) -> Node {
    let mut n = Node::empty(false, 8);
    n.insert_at(0, 0, &b.to_le_bytes());
    n
}

/// The root of device `dev`'s mapping subtree.
fn subtree_root(meta: &Path, dev: u64) -> u64 {
    let top = node(meta, get64(&superblock(meta), SB_MAPPING_ROOT));
    assert!(
        top.leaf(),
        "a small pool's top-level mapping tree is one leaf"
    );
    let i = top.search(dev).expect("device in the mapping tree");
    top.val64(i)
}

/// Whether thin_check accepts the metadata.
fn thin_check_ok(meta: &Path) -> bool {
    need("thin_check");
    let o = Command::new("thin_check").arg(meta).output().unwrap();
    o.status.success()
}

/// Run `c` for at most `limit`; `None` if it had to be killed.
fn run_for(c: &mut Command, limit: Duration) -> Option<Output> {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

const NBD_RW: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
op, off = sys.argv[2], int(sys.argv[3])
try:
    if op == "read":
        sys.stdout.buffer.write(h.pread(4096, off))
    else:
        h.pwrite(bytes([0x5a]) * 4096, off)
        h.flush()
except nbd.Error as e:
    print("nbd error:", e.errno, e, file=sys.stderr)
    sys.exit(3)
"#;

/// A 4 KiB read or write at `off` of an export, given 20 s: `Ok(bytes)`,
/// `Err(stderr)` when the server answered with an error; a hang fails.
fn nbd_io(srv: &DmServer, export: &str, op: &str, off: u64) -> Result<Vec<u8>, String> {
    need_python_module("nbd", "python3-libnbd");
    let o = run_for(
        Command::new(PYTHON).args(["-c", NBD_RW, &srv.uri(export), op, &off.to_string()]),
        Duration::from_secs(20),
    )
    .unwrap_or_else(|| panic!("a 4 KiB {op} of {export} at {off} did not finish in 20 s"));
    match o.status.code() {
        Some(0) => Ok(o.stdout),
        Some(3) => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
        _ => panic!("nbd {op} of {export}: {}", show(&o)),
    }
}

/// `udm dmsetup args`, given 20 s, must fail; its stderr.
fn dm_fails(srv: &DmServer, args: &[&str]) -> String {
    let o = run_for(srv.cmd().args(args), Duration::from_secs(20))
        .unwrap_or_else(|| panic!("dmsetup {args:?} hung"));
    assert_eq!(o.status.code(), Some(1), "dmsetup {args:?}: {}", show(&o));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `udm dmsetup args`, given 20 s, must succeed; its stdout.
fn dm_ok(srv: &DmServer, args: &[&str]) -> String {
    let o = run_for(srv.cmd().args(args), Duration::from_secs(20))
        .unwrap_or_else(|| panic!("dmsetup {args:?} hung"));
    assert!(o.status.success(), "dmsetup {args:?}: {}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The server is still there and answers: `ls` lists `want`, and a linear
/// device made now reads.
fn server_alive(srv: &DmServer, p: &Pool, want: &[&str]) {
    let ls = dm_ok(srv, &["ls"]);
    for w in want {
        assert!(ls.contains(w), "{w} in ls: {ls}");
    }
    let other = sparse(p.dir.path(), "other", 1 << 20);
    pwrite(&other, 0, &[0xc3; 4096]);
    let line = format!("0 2048 linear {} 0", other.display());
    dm_ok(srv, &["create", "other", "--table", &line]);
    assert_eq!(nbd_io(srv, "other", "read", 0).unwrap(), vec![0xc3; 4096]);
}

/// The pool's activation fails with an error containing every `needles`,
/// and the server lives on.
fn refused(p: &Pool, needles: &[&str]) {
    let srv = DmServer::start(p.dir.path(), &[]);
    let e = dm_fails(
        &srv,
        &["create", "pool", "--table", &pool_line(p, DATA_BLOCKS)],
    );
    for n in needles {
        assert!(e.contains(n), "'{n}' in the refusal: {e}");
    }
    server_alive(&srv, p, &[]);
}

/// Finding 1: the device-details root is an internal node naming itself.
/// Before: `btree::walk` recursed until the stack overflowed and the
/// process aborted.
#[test]
fn a_details_tree_that_names_itself_is_refused_not_a_stack_overflow() {
    let p = restore("thin-hostile-1", XML, DATA_BLOCKS);
    let root = get64(&superblock(&p.meta), SB_DETAILS_ROOT);
    put_node(&p.meta, root, &self_loop(root));
    refused(
        &p,
        &[
            "thin pool",
            "device details",
            "reached twice",
            &format!("block {root}"),
        ],
    );
}

/// Finding 2: a thin device's mapping subtree becomes a self-loop under a
/// running pool. Before: a 4 KiB read spun for ever in `lookup64`, and
/// `dmsetup status` in `highest()`. Now the read gets EIO, the thin status
/// says `Fail`, the pool turns read-only with `needs_check` (on disk too),
/// and everything else answers.
#[test]
fn a_mapping_loop_fails_the_read_and_sets_needs_check() {
    let p = restore("thin-hostile-2", XML, DATA_BLOCKS);
    let srv = DmServer::start(p.dir.path(), &[]);
    dm_ok(
        &srv,
        &["create", "pool", "--table", &pool_line(&p, DATA_BLOCKS)],
    );
    dm_ok(&srv, &["create", "t0", "--table", &thin_line(0)]);
    dm_ok(&srv, &["create", "t1", "--table", &thin_line(1)]);
    let sub = subtree_root(&p.meta, 0);
    put_node(&p.meta, sub, &self_loop(sub));

    let e = nbd_io(&srv, "t0", "read", 0).expect_err("a read through a loop");
    assert!(e.contains("EIO"), "EIO: {e}");
    let st = dm_ok(&srv, &["status", "t0"]);
    assert!(st.contains(" thin Fail"), "{st}");
    let st = dm_ok(&srv, &["status", "pool"]);
    assert!(st.contains(" ro ") && st.contains("needs_check"), "{st}");
    // Device 1 shares nothing with the loop: it still reads its block.
    assert_eq!(nbd_io(&srv, "t1", "read", 0).unwrap(), pattern(30));
    // A failed pool takes no writes, even to a healthy device.
    let e = nbd_io(&srv, "t1", "write", 5 * BLOCK).expect_err("write to a failed pool");
    assert!(e.contains("EIO"), "EIO: {e}");
    // needs_check reaches the superblock (the pool's timer, within a second).
    wait_for("needs_check on disk", Duration::from_secs(10), || {
        get32(&superblock(&p.meta), SB_FLAGS) & 1 == 1
    });
    server_alive(&srv, &p, &["pool", "t0", "t1"]);
    drop(srv);
    // Activated again, the pool is refused: the check finds the loop.
    let dir = p.dir.path().join("again");
    std::fs::create_dir(&dir).unwrap();
    let srv = DmServer::start(&dir, &[]);
    let e = dm_fails(
        &srv,
        &["create", "pool", "--table", &pool_line(&p, DATA_BLOCKS)],
    );
    assert!(
        e.contains("thin device 0") && e.contains("deeper than 16 levels"),
        "{e}"
    );
}

/// Finding 3: the data space map claims 2^36 blocks. Before: a 256 GiB
/// `vec!` before any comparison with the data device aborted the process.
#[test]
fn a_data_space_map_larger_than_the_data_device_is_refused_before_allocating() {
    let p = restore("thin-hostile-3", XML, DATA_BLOCKS);
    patch_superblock(&p.meta, |sb| put64(&mut sb[..], SB_DATA_SM, 1 << 36));
    refused(
        &p,
        &[
            "data space map",
            &format!("{}", 1u64 << 36),
            &format!("holds {DATA_BLOCKS}"),
        ],
    );
}

/// Finding 4: a mapping leaf with 16-byte values (a well-formed node of
/// another tree). Before: it passed `Node::from_buf`, and a write to an
/// unmapped block panicked in `insert_at`, killing an event loop.
#[test]
fn a_mapping_leaf_with_16_byte_values_is_refused() {
    let widen = |meta: &Path| {
        let sub = subtree_root(meta, 0);
        let old = node(meta, sub);
        assert!(old.leaf());
        let mut wide = Node::empty(true, 16);
        for i in 0..old.len() {
            let mut v = [0u8; 16];
            v[..8].copy_from_slice(old.val(i));
            wide.insert_at(i, old.key(i), &v);
        }
        put_node(meta, sub, &wide);
        sub
    };
    let p = restore("thin-hostile-4", XML, DATA_BLOCKS);
    let sub = widen(&p.meta);
    assert!(!thin_check_ok(&p.meta), "thin_check refuses it too");
    refused(&p, &["16-byte values", &format!("block {sub}")]);

    // The same leaf appearing under a running pool: the write to an
    // unmapped block that panicked gets EIO, and the server serves on.
    let p = restore("thin-hostile-4b", XML, DATA_BLOCKS);
    let srv = DmServer::start(p.dir.path(), &[]);
    dm_ok(
        &srv,
        &["create", "pool", "--table", &pool_line(&p, DATA_BLOCKS)],
    );
    dm_ok(&srv, &["create", "t0", "--table", &thin_line(0)]);
    widen(&p.meta);
    let e = nbd_io(&srv, "t0", "write", 7 * BLOCK).expect_err("a write into a 16-byte leaf");
    assert!(e.contains("EIO"), "EIO: {e}");
    let st = dm_ok(&srv, &["status", "pool"]);
    assert!(st.contains("needs_check"), "{st}");
    server_alive(&srv, &p, &["pool", "t0"]);
}

/// A mapping node with a bad checksum (one byte flipped), which thin_check
/// refuses: the activation check reads every mapping node, so udm refuses
/// it too, at activation rather than at the first read of that device.
/// Before: the pool opened, and the damage surfaced at a read.
#[test]
fn a_mapping_node_thin_check_refuses_is_refused_at_activation() {
    let p = restore("thin-hostile-csum", XML, DATA_BLOCKS);
    let sub = subtree_root(&p.meta, 1);
    let mut b = block(&p.meta, sub);
    b[200] ^= 0x40;
    pwrite(&p.meta, sub * BLOCK_SIZE as u64, &b);
    assert!(!thin_check_ok(&p.meta), "thin_check refuses it");
    refused(&p, &[&format!("block {sub}"), "bad checksum"]);
}

/// Finding 12: a mapping points past the data device. Before: nothing
/// checked it, and `db * block size` wrapped. Refused at activation, and
/// when it appears under a running pool the read fails (EIO).
#[test]
fn a_mapping_past_the_data_device_is_refused_and_fails_its_read() {
    let far = 1u64 << 39;
    let point_far = |meta: &Path| {
        let sub = subtree_root(meta, 0);
        let mut n = node(meta, sub);
        let i = n.search(50).unwrap();
        let time = n.val64(i) & 0xff_ffff;
        n.set_val(i, &((far << 24) | time).to_le_bytes());
        put_node(meta, sub, &n);
    };
    let p = restore("thin-hostile-12", XML, DATA_BLOCKS);
    point_far(&p.meta);
    refused(
        &p,
        &[
            "thin device 0 maps block 50",
            &format!("data block {far}"),
            "past the data device",
        ],
    );

    let p = restore("thin-hostile-12b", XML, DATA_BLOCKS);
    let srv = DmServer::start(p.dir.path(), &[]);
    dm_ok(
        &srv,
        &["create", "pool", "--table", &pool_line(&p, DATA_BLOCKS)],
    );
    dm_ok(&srv, &["create", "t0", "--table", &thin_line(0)]);
    point_far(&p.meta);
    let e = nbd_io(&srv, "t0", "read", 50 * BLOCK).expect_err("a read past the data device");
    assert!(e.contains("EIO"), "EIO: {e}");
    let st = dm_ok(&srv, &["status", "pool"]);
    assert!(st.contains("needs_check"), "{st}");
    // The data file did not grow to the mapped offset.
    let len = std::fs::metadata(&p.data).unwrap().len();
    assert_eq!(len, DATA_BLOCKS * BLOCK);
    server_alive(&srv, &p, &["pool", "t0"]);
}

/// `needs_check` in the superblock: the pool comes up read-only, as the
/// kernel's (writes fail, reads go on), and says why in its status.
/// Before: it came up read-write and took the write.
#[test]
fn needs_check_keeps_a_pool_read_only() {
    let p = restore("thin-hostile-nc", XML, DATA_BLOCKS);
    patch_superblock(&p.meta, |sb| {
        let f = get32(&sb[..], SB_FLAGS) | 1;
        put32(&mut sb[..], SB_FLAGS, f);
    });
    let srv = DmServer::start(p.dir.path(), &[]);
    dm_ok(
        &srv,
        &["create", "pool", "--table", &pool_line(&p, DATA_BLOCKS)],
    );
    let st = dm_ok(&srv, &["status", "pool"]);
    assert!(st.contains(" ro ") && st.contains("needs_check"), "{st}");
    dm_ok(&srv, &["create", "t0", "--table", &thin_line(0)]);
    assert_eq!(nbd_io(&srv, "t0", "read", BLOCK).unwrap(), pattern(11));
    let e = nbd_io(&srv, "t0", "write", 7 * BLOCK).expect_err("a write to a needs_check pool");
    assert!(e.contains("EIO"), "EIO: {e}");
    let e = dm_fails(&srv, &["message", "pool", "0", "create_thin", "5"]);
    assert!(e.contains("thin_check"), "{e}");
    srv.serve.stop();
    assert_eq!(get32(&superblock(&p.meta), SB_FLAGS) & 1, 1, "flag kept");
}

/// A pool thin_restore writes with trees of several levels (thousands of
/// mappings per device) passes the activation check, reads what the XML
/// maps, and thin_check still accepts the metadata after udm used it.
#[test]
fn a_large_restored_pool_opens_and_passes_the_check() {
    let blocks = 20_000u64;
    let mut xml = format!(
        r#"<superblock uuid="" time="1" transaction="1" flags="0" version="2" data_block_size="128" nr_data_blocks="{blocks}">"#
    );
    // Device 0: every other block of 0..16000; device 1: a range.
    xml.push_str(r#"<device dev_id="0" mapped_blocks="8000" transaction="0" creation_time="0" snap_time="0">"#);
    for i in 0..8000u64 {
        xml.push_str(&format!(
            r#"<single_mapping origin_block="{}" data_block="{i}" time="0"/>"#,
            2 * i
        ));
    }
    xml.push_str("</device>");
    xml.push_str(r#"<device dev_id="1" mapped_blocks="9000" transaction="0" creation_time="0" snap_time="0"><range_mapping origin_begin="0" data_begin="8000" length="9000" time="0"/></device>"#);
    xml.push_str("</superblock>\n");
    let p = restore("thin-hostile-big", &xml, blocks);
    pwrite(&p.data, 8091 * BLOCK, &pattern(8091));
    let sub = subtree_root(&p.meta, 0);
    assert!(!node(&p.meta, sub).leaf(), "device 0's tree has levels");
    let srv = DmServer::start(p.dir.path(), &[]);
    let t = Instant::now();
    dm_ok(&srv, &["create", "pool", "--table", &pool_line(&p, blocks)]);
    let opened = t.elapsed();
    dm_ok(&srv, &["create", "t0", "--table", &thin_line(0)]);
    dm_ok(&srv, &["create", "t1", "--table", &thin_line(1)]);
    for (dev, vb, db) in [("t0", 0, 0), ("t0", 98, 49), ("t1", 91, 8091)] {
        assert_eq!(
            nbd_io(&srv, dev, "read", vb * BLOCK).unwrap(),
            pattern(db),
            "{dev} block {vb}"
        );
    }
    assert_eq!(nbd_io(&srv, "t0", "read", BLOCK).unwrap(), vec![0; 4096]);
    assert!(nbd_io(&srv, "t0", "write", BLOCK).is_ok());
    let st = dm_ok(&srv, &["status", "pool"]);
    assert!(!st.contains("needs_check"), "{st}");
    srv.serve.stop();
    assert!(thin_check_ok(&p.meta), "thin_check after udm used the pool");
    report(&format!(
        "thin: opening a 17000-mapping restored pool: {opened:?}"
    ));
}
