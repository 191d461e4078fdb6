//! dm-thin closed and reopened at every boundary a model reaches: after a
//! commit (FLUSH), a snapshot (`create_snap`), a metadata snapshot held and
//! released, a discard, a deleted device, a data device exactly full and
//! one write past it; and killed with SIGKILL right after a FLUSH. After
//! each, the server is started again over the same metadata and data
//! files, `thin_check` finds the metadata clean, and every block of every
//! thin device equals an in-memory model of what was acknowledged.
//!
//! `UDM_REOPEN_ROUNDS` (default 1) repeats the whole walk with other
//! random writes; `bench/reopen.sh` runs it longer.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::dm::DmServer;
use common::*;
use udm::core::{BlockDevice, WriteBuf};
use udm::store::{Location, OpenFlags};

/// 64 KiB data blocks; 32 of them, so a model can fill the pool exactly.
const BLOCK: u64 = 65536;
const DATA_BLOCKS: u64 = 32;
/// Each thin device is longer than the pool: it can run out of space.
const THIN_BLOCKS: u64 = 48;
const SECTOR: u64 = 512;

/// What each thin device should read back: its written 4 KiB pieces
/// (unwritten ones read zeros).
type Model = BTreeMap<u32, BTreeMap<u64, Vec<u8>>>;

struct Pool<'a> {
    dir: &'a Path,
    srv: Option<DmServer>,
    model: Model,
    seed: u64,
}

impl Pool<'_> {
    fn meta(&self) -> std::path::PathBuf {
        self.dir.join("meta")
    }

    /// Start the server and activate the pool and every modelled thin.
    fn start(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("nbd.sock"));
        let _ = std::fs::remove_file(self.dir.join("control"));
        let srv = DmServer::start(self.dir, &[]);
        let pool = format!(
            "0 {} thin-pool {} {} {} 0 1 error_if_no_space",
            DATA_BLOCKS * BLOCK / SECTOR,
            self.meta().display(),
            self.dir.join("data").display(),
            BLOCK / SECTOR
        );
        srv.ok(&["create", "pool", "--table", &pool]);
        for id in self.model.keys() {
            let line = format!("0 {} thin @pool {id}", THIN_BLOCKS * BLOCK / SECTOR);
            srv.ok(&["create", &format!("t{id}"), "--table", &line]);
        }
        self.srv = Some(srv);
    }

    fn srv(&self) -> &DmServer {
        self.srv.as_ref().expect("the server runs")
    }

    fn dev(&self, id: u32) -> Arc<dyn BlockDevice> {
        Location::parse(&self.srv().uri(&format!("t{id}")))
            .unwrap()
            .open(OpenFlags::default())
            .unwrap()
    }

    fn create_thin(&mut self, id: u32) {
        self.srv()
            .ok(&["message", "pool", "0", "create_thin", &id.to_string()]);
        let line = format!("0 {} thin @pool {id}", THIN_BLOCKS * BLOCK / SECTOR);
        self.srv()
            .ok(&["create", &format!("t{id}"), "--table", &line]);
        self.model.insert(id, BTreeMap::new());
    }

    /// A snapshot of `origin`, suspended meanwhile as the kernel wants.
    fn create_snap(&mut self, id: u32, origin: u32) {
        let o = format!("t{origin}");
        self.srv().ok(&["suspend", &o]);
        self.srv().ok(&[
            "message",
            "pool",
            "0",
            "create_snap",
            &id.to_string(),
            &origin.to_string(),
        ]);
        self.srv().ok(&["resume", &o]);
        let line = format!("0 {} thin @pool {id}", THIN_BLOCKS * BLOCK / SECTOR);
        self.srv()
            .ok(&["create", &format!("t{id}"), "--table", &line]);
        let copy = self.model[&origin].clone();
        self.model.insert(id, copy);
    }

    fn delete(&mut self, id: u32) {
        self.srv().ok(&["remove", &format!("t{id}")]);
        self.srv()
            .ok(&["message", "pool", "0", "delete", &id.to_string()]);
        self.model.remove(&id);
    }

    fn next(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    /// `n` random 4 KiB writes to `id` within its first `span` blocks,
    /// then a FLUSH; each acknowledged write enters the model.
    fn writes(&mut self, id: u32, n: usize, span: u64) {
        let d = self.dev(id);
        for _ in 0..n {
            let off = self.next() % (span * BLOCK / 4096) * 4096;
            let data = bytes(self.next(), 4096);
            d.write(off, WriteBuf::Borrowed(&data), false)
                .unwrap_or_else(|e| panic!("write t{id} at {off}: {e}"));
            self.model.get_mut(&id).unwrap().insert(off, data);
        }
        d.flush().unwrap();
    }

    /// Provision every block of the pool that is still free through
    /// `id`, one whole block at a time, until the pool is full; then one
    /// more block must fail (error_if_no_space) and change nothing.
    fn fill(&mut self, id: u32) {
        let d = self.dev(id);
        let mut b = 0;
        loop {
            let st = self.srv().ok(&["status", "pool"]);
            if st.contains(&format!(" {DATA_BLOCKS}/{DATA_BLOCKS} ")) {
                break;
            }
            assert!(b < THIN_BLOCKS, "the pool never filled: {st}");
            let off = b * BLOCK;
            let mapped = (0..BLOCK / 4096).any(|i| self.model[&id].contains_key(&(off + i * 4096)));
            if !mapped {
                let data = bytes(self.next(), BLOCK as usize);
                d.write(off, WriteBuf::Borrowed(&data), false)
                    .unwrap_or_else(|e| panic!("fill t{id} block {b}: {e}"));
                let m = self.model.get_mut(&id).unwrap();
                for i in 0..BLOCK / 4096 {
                    let at = (i * 4096) as usize;
                    m.insert(off + i * 4096, data[at..at + 4096].to_vec());
                }
            }
            b += 1;
        }
        d.flush().unwrap();
        // One past: an unmapped block of a full pool.
        let past = (0..THIN_BLOCKS)
            .find(|b| {
                (0..BLOCK / 4096).all(|i| !self.model[&id].contains_key(&(b * BLOCK + i * 4096)))
            })
            .expect("an unmapped block");
        let r = d.write(past * BLOCK, WriteBuf::Borrowed(&[1u8; 4096]), false);
        assert!(r.is_err(), "a write past a full pool fails");
    }

    fn discard(&mut self, id: u32, block: u64) {
        let d = self.dev(id);
        d.discard(block * BLOCK, BLOCK).unwrap();
        d.flush().unwrap();
        let m = self.model.get_mut(&id).unwrap();
        for i in 0..BLOCK / 4096 {
            m.remove(&(block * BLOCK + i * 4096));
        }
    }

    /// Every block of every thin device equals the model.
    fn verify(&self, at: &str) {
        for (id, m) in &self.model {
            let d = self.dev(*id);
            let mut buf = vec![0u8; BLOCK as usize];
            for b in 0..THIN_BLOCKS {
                d.read(b * BLOCK, &mut buf).unwrap();
                for i in 0..BLOCK / 4096 {
                    let off = b * BLOCK + i * 4096;
                    let got = &buf[(i * 4096) as usize..][..4096];
                    match m.get(&off) {
                        Some(want) => assert!(
                            got == &want[..],
                            "{at}: t{id} at {off} differs (zero: {}, equal to another device's: {:?})",
                            got.iter().all(|&x| x == 0),
                            self.model.iter().filter(|(_, o)| o.get(&off).is_some_and(|w| w[..] == *got)).map(|(i, _)| *i).collect::<Vec<_>>()
                        ),
                        None => assert!(got.iter().all(|&x| x == 0), "{at}: t{id} at {off} not zero"),
                    }
                }
            }
        }
    }

    fn thin_check(&self, at: &str) {
        let o = Command::new(need("thin_check"))
            .arg(self.meta())
            .output()
            .unwrap();
        assert!(o.status.success(), "{at}: thin_check:\n{}", show(&o));
    }

    /// Stop cleanly (or SIGKILL), check the metadata, start again and
    /// compare every block with the model.
    fn reopen(&mut self, at: &str, kill: bool) {
        let srv = self.srv.take().unwrap();
        if kill {
            srv.serve.kill9();
        } else {
            assert_eq!(srv.serve.stop(), Some(0), "{at}: clean stop");
        }
        self.thin_check(at);
        self.start();
        self.verify(at);
        eprintln!(
            "reopen after {at}: {} thin devices as modelled",
            self.model.len()
        );
    }
}

fn walk(dir: &Path, seed: u64) {
    sparse(dir, "meta", 4 << 20);
    sparse(dir, "data", DATA_BLOCKS * BLOCK);
    let mut p = Pool {
        dir,
        srv: None,
        model: Model::new(),
        seed,
    };
    p.start();
    p.create_thin(0);
    p.writes(0, 24, 12);
    p.reopen("a commit", false);
    p.create_snap(1, 0);
    p.writes(0, 8, 12);
    p.writes(1, 8, 12);
    p.reopen("a snapshot", false);
    p.srv()
        .ok(&["message", "pool", "0", "reserve_metadata_snap"]);
    p.writes(1, 16, 16);
    p.reopen("writes under a held metadata snapshot", false);
    p.srv()
        .ok(&["message", "pool", "0", "release_metadata_snap"]);
    p.writes(0, 4, 12);
    p.reopen("a released metadata snapshot", false);
    p.discard(0, 3);
    p.verify("a discard, before the reopen");
    p.reopen("a discard", false);
    p.create_thin(2);
    p.writes(2, 8, 8);
    p.delete(1);
    p.reopen("a deleted device", false);
    p.fill(2);
    p.reopen("a full pool and a write past it", false);
    p.discard(2, 0);
    p.writes(2, 4, 1);
    p.reopen("SIGKILL after a flush", true);
    p.srv.take().unwrap().serve.stop();
}

#[test]
fn thin_reopens_at_every_boundary_as_modelled() {
    need("thin_check");
    let rounds: u64 = std::env::var("UDM_REOPEN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for r in 0..rounds {
        let d = tempfile::Builder::new()
            .prefix("udm-reopen-thin-")
            .tempdir_in("/dev/shm")
            .unwrap();
        walk(d.path(), 0x9E37_79B9_7F4A_7C15 ^ (r + 1));
    }
}
