//! The `snapshot` driver: a snapshot over an in-memory COW device built
//! from the input (the persistent store's header and its metadata areas)
//! and a 1 MiB origin: every chunk read, writes through the snapshot and
//! through `snapshot-origin`, a flush, then the snapshot opened again over
//! what it wrote.
//!
//! Input: `kind` (P, PO or N), `chunk` (1 to 16 sectors), `ops`, a spare
//! byte, then the COW device as [`super::sparse_input`] reads a disk (its
//! size cut to 4 MiB).

use std::collections::HashMap;
use std::sync::Arc;

use super::foreign::sparse_input;
use super::verity::Named;
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::{Target, TargetArgs, TargetOptions};

/// The COW device is cut to this size.
const MAX_COW: u64 = 4 << 20;
/// The origin's size.
const ORIGIN: u64 = 1 << 20;

fn build(ty: &str, line: &str, r: &mut Named) -> Option<Arc<dyn Target>> {
    let ty = crate::targets::lookup(ty)?;
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    (ty.new)(TargetArgs {
        args: &args,
        len: ORIGIN,
        resolver: r,
        options: &TargetOptions::default(),
    })
    .ok()
}

/// The origin's bytes: each 4 KiB block holds its number.
fn origin() -> Arc<MemStore> {
    let o = MemStore::new(ORIGIN);
    let pat: Vec<u8> = (0..ORIGIN as u32).map(|i| (i / 4096) as u8).collect();
    o.write(0, WriteBuf::Borrowed(&pat), false)
        .expect("a write inside a fresh store");
    Arc::new(o)
}

fn line(kind: u8, chunk: u8) -> (String, u64) {
    let kind = ["P", "PO", "N", "P"][usize::from(kind & 3)];
    let chunk = 1u64 << (chunk % 5);
    (format!("o c {kind} {chunk}"), chunk)
}

/// A COW device as udm's snapshot target writes it (for making seeds):
/// the snapshot the control bytes choose over [`origin`], then `n` chunks
/// of the origin changed through `snapshot-origin`, each one exception.
pub fn snapshot_fill(cow: &Arc<MemStore>, kind: u8, chunk: u8, n: u64) -> Option<()> {
    let (line, chunk) = line(kind, chunk);
    let cb = chunk * 512;
    let mut r = Named(HashMap::from([
        ("o", origin() as Arc<dyn BlockDevice>),
        ("c", cow.clone() as Arc<dyn BlockDevice>),
    ]));
    let snap = build("snapshot", &line, &mut r)?;
    let o = build("snapshot-origin", "o", &mut r)?;
    let w = vec![0xa5u8; cb as usize];
    for k in 0..n {
        o.write((k * cb) % ORIGIN, WriteBuf::Borrowed(&w), false)
            .ok()?;
    }
    o.flush().ok()?;
    snap.flush().ok()?;
    drop(o);
    drop(snap);
    Some(())
}

/// Runs one input; true if the snapshot opened.
pub fn snapshot(input: &[u8]) -> bool {
    let Some((head, sparse, _)) = sparse_input(input) else {
        return false;
    };
    let [kind, chunk, ops, _] = head;
    let size = sparse.size().min(MAX_COW) / 512 * 512;
    if size == 0 {
        return false;
    }
    let cow = Arc::new(MemStore::new(size));
    let mut b = vec![0u8; size as usize];
    if sparse.read(0, &mut b).is_err() || cow.write(0, WriteBuf::Borrowed(&b), false).is_err() {
        return false;
    }
    drop(b);
    let (line, chunk) = line(kind, chunk);
    let o = origin();
    let mut opened = false;
    for round in 0..2 {
        let mut r = Named(HashMap::from([
            ("o", o.clone() as Arc<dyn BlockDevice>),
            ("c", cow.clone() as Arc<dyn BlockDevice>),
        ]));
        let Some(snap) = build("snapshot", &line, &mut r) else {
            return opened;
        };
        opened = true;
        let _ = snap.status();
        // Every chunk the first 64 KiB and a few beyond, whole.
        let cb = (chunk * 512) as usize;
        let mut buf = vec![0u8; cb];
        for i in 0..(65536 / cb as u64) {
            let _ = snap.read(i * cb as u64, &mut buf);
        }
        for at in [
            ORIGIN / 2,
            ORIGIN - cb as u64,
            u64::from(ops) * 4096 % ORIGIN,
        ] {
            let _ = snap.read(at / cb as u64 * cb as u64, &mut buf);
        }
        if round == 0 {
            let w: Vec<u8> = (0..cb).map(|i| (i % 251) as u8 ^ ops).collect();
            if ops & 0x01 != 0 {
                let _ = snap.write(0, WriteBuf::Borrowed(&w), false);
            }
            if ops & 0x02 != 0 {
                if let Some(origin_t) = build("snapshot-origin", "o", &mut r) {
                    for k in 0..u64::from(ops >> 4) + 1 {
                        let at = (k * 3 * cb as u64) % ORIGIN;
                        let _ = origin_t.write(at, WriteBuf::Borrowed(&w), false);
                    }
                    let _ = origin_t.flush();
                }
            }
            if ops & 0x04 != 0 {
                let _ = snap.write(ORIGIN - cb as u64, WriteBuf::Borrowed(&w), true);
            }
            let _ = snap.flush();
        }
        let _ = snap.status();
        drop(r);
        drop(snap);
    }
    opened
}
