//! Hostile thin-pool metadata against `delete`: a `delete` message
//! (or `release_metadata_snap`) walks a mapping tree with `btree::del`,
//! which bounds the depth but not the number of visits. Nodes shared
//! many times over inside the tree being deleted make it exponential:
//! 252 children of one node naming the same child, on each of a few
//! levels, is 252^levels visits. The activation check lets this through:
//! it refuses a node reached twice inside one device's tree, but a node
//! already checked by an earlier device counts as "shared with a
//! snapshot" however many times a later device names it; and the tree
//! under a held metadata snapshot (superblock `held_root`) is never
//! checked at all.
//!
//! Found on 3a75f62 by the attacker's pass: the message never returned;
//! it held the control socket's operation lock, so every later `create`,
//! `remove`, `suspend`, `resume`, `message` and `status` of ANY device
//! hung, one core spun, and SIGTERM did not stop the server. Now `del`
//! refuses a node reached more often than its count says (freed already
//! in this walk), so each node is walked at most once: the message fails
//! with an error naming the damage, and the control socket answers.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::*;
use udm::targets::thin::pdata::block::{get64, put64, seal, Node, BLOCK_SIZE, SUPERBLOCK_XOR};

const BLOCK: u64 = 65536;

/// Eight devices, one mapping each: thin_restore gives each its own leaf.
fn xml() -> String {
    let mut s = String::from(
        "<superblock uuid=\"\" time=\"0\" transaction=\"1\" flags=\"0\" version=\"2\" \
         data_block_size=\"128\" nr_data_blocks=\"100\">\n",
    );
    for d in 0..8 {
        s += &format!(
            "  <device dev_id=\"{d}\" mapped_blocks=\"1\" transaction=\"0\" \
             creation_time=\"0\" snap_time=\"0\">\n    <single_mapping origin_block=\"0\" \
             data_block=\"{d}\" time=\"0\"/>\n  </device>\n"
        );
    }
    s + "</superblock>\n"
}

fn restore(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    need("thin_restore");
    let x = write_file(dir, "pool.xml", xml().as_bytes());
    let meta = sparse(dir, "meta", 4 << 20);
    let o = Command::new("thin_restore")
        .args(["-i", x.to_str().unwrap(), "-o", meta.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let data = sparse(dir, "data", 100 * BLOCK);
    (meta, data)
}

fn block(meta: &Path, b: u64) -> [u8; BLOCK_SIZE] {
    pread(meta, b * BLOCK_SIZE as u64, BLOCK_SIZE)
        .try_into()
        .unwrap()
}

fn put_node(meta: &Path, b: u64, n: &Node) {
    pwrite(meta, b * BLOCK_SIZE as u64, &n.encode(b)[..]);
}

/// An internal node of 252 entries (keys 0..252), every one naming `child`.
fn fan_to(child: u64) -> Node {
    let mut n = Node::empty(false, 8);
    for k in 0..252u64 {
        n.insert_at(k as usize, k, &child.to_le_bytes());
    }
    n
}

/// Device `dev`'s subtree root (the top-level tree is one leaf here).
fn subtree_root(meta: &Path, dev: u64) -> u64 {
    let b = get64(&block(meta, 0), 320);
    let top = Node::decode(&block(meta, b), b).unwrap();
    assert!(top.leaf(), "a small pool's top-level tree is one leaf");
    top.val64(top.search(dev).unwrap())
}

/// `udm dmsetup args` within `limit`; None if it had to be killed.
fn run_within(srv: &DmServer, args: &[&str], limit: Duration) -> Option<std::process::Output> {
    let mut child = srv
        .cmd()
        .args(args)
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
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

fn pool_line(meta: &Path, data: &Path) -> String {
    format!(
        "0 {} thin-pool {} {} 128 0",
        100 * (BLOCK / 512),
        meta.display(),
        data.display()
    )
}

/// The message must end (an error is fine) and an unrelated `create`
/// must answer afterwards.
fn message_ends_and_control_answers(srv: &DmServer, dir: &Path, msg: &str) {
    let m = run_within(srv, &["message", "pool", "0", msg], Duration::from_secs(20));
    let other = sparse(dir, "other", 1 << 20);
    let line = format!("0 2048 linear {} 0", other.display());
    let c = run_within(
        srv,
        &["create", "other", "--table", &line],
        Duration::from_secs(10),
    );
    assert!(
        m.is_some() && c.is_some_and(|o| o.status.success()),
        "'message pool 0 {msg}' did not return within 20 s, and an unrelated create then \
         hung: the control socket's operation lock is held by a runaway btree::del"
    );
}

/// Device k (1..=7)'s root: 252 children, all device k-1's root. The
/// activation check takes each as "shared with a snapshot"; deleting
/// device 7 visits device 0's leaf 252^7 times.
#[test]
fn deleting_a_device_whose_tree_repeats_another_device_s_nodes_ends() {
    let dir = scratch("attack-thin-del");
    let (meta, data) = restore(dir.path());
    let roots: Vec<u64> = (0..8).map(|d| subtree_root(&meta, d)).collect();
    for k in 1..8 {
        put_node(&meta, roots[k], &fan_to(roots[k - 1]));
    }
    let srv = DmServer::start(dir.path(), &[]);
    srv.ok(&["create", "pool", "--table", &pool_line(&meta, &data)]);
    message_ends_and_control_answers(&srv, dir.path(), "delete 7");
}

/// A held metadata snapshot (superblock `held_root`) whose mapping tree
/// is six levels of 252 children naming one node: activation never looks
/// at it; `release_metadata_snap` walks it 252^6 times.
#[test]
fn releasing_a_held_snapshot_with_repeated_children_ends() {
    let dir = scratch("attack-thin-held");
    let (meta, data) = restore(dir.path());
    put_node(&meta, 200, &Node::empty(true, 8));
    for b in 201..207u64 {
        put_node(&meta, b, &fan_to(b - 1));
    }
    let mut sb = block(&meta, 0);
    let mut held = sb;
    put64(&mut held, 320, 206);
    held[64..64 + 256].fill(0);
    seal(&mut held, 300, SUPERBLOCK_XOR);
    pwrite(&meta, 300 * BLOCK_SIZE as u64, &held);
    put64(&mut sb, 56, 300);
    seal(&mut sb, 0, SUPERBLOCK_XOR);
    pwrite(&meta, 0, &sb);
    let srv = DmServer::start(dir.path(), &[]);
    srv.ok(&["create", "pool", "--table", &pool_line(&meta, &data)]);
    message_ends_and_control_answers(&srv, dir.path(), "release_metadata_snap");
}
