//! dm-thin under process death: `udm serve` is killed with SIGKILL at
//! random moments while an NBD client writes random 4 KiB blocks with
//! flushes to a thin device whose blocks are still being provisioned
//! (every round writes a new thin device and deletes the last one, so
//! provisioning, frees and commits all race the kill).
//! After every kill `thin_check` must find the metadata clean, and after
//! every restart every write acknowledged before a completed FLUSH reads
//! back intact (a write acknowledged after it may be lost: its mapping is
//! committed by the next FLUSH or the 1 s timer, as in the kernel).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::dm::DmServer;
use common::*;

const KILLS: u32 = 20;
/// 64 KiB data blocks: each 4 KiB write to a new one provisions it.
const BLOCK: u64 = 65536;
/// A 64 MiB thin device on a data device just as big.
const BLOCKS: u64 = 1024;

fn start_pool(dir: &Path, meta: &Path, data: &Path) -> DmServer {
    let _ = std::fs::remove_file(dir.join("nbd.sock"));
    let _ = std::fs::remove_file(dir.join("control"));
    let srv = DmServer::start(dir, &["--threads", "2"]);
    let pool = format!(
        "0 {} thin-pool {} {} {} 0",
        BLOCKS * BLOCK / 512,
        meta.display(),
        data.display(),
        BLOCK / 512
    );
    srv.ok(&["create", "pool", "--table", &pool]);
    srv
}

/// Serve thin device `id` as export `t`.
fn open_thin(srv: &DmServer, id: u32) {
    let thin = format!("0 {} thin @pool {id}", BLOCKS * BLOCK / 512);
    srv.ok(&["create", "t", "--table", &thin]);
}

fn thin_check(meta: &Path, round: u32) {
    need("thin_check");
    let o = Command::new("thin_check").arg(meta).output().unwrap();
    assert!(
        o.status.success(),
        "round {round}: thin_check after SIGKILL:\n{}",
        show(&o)
    );
}

#[test]
fn sigkill_during_provisioning_keeps_metadata_clean_and_flushed_writes() {
    need_python_module("nbd", "python3-libnbd");
    need("thin_check");
    let t0 = Instant::now();
    let d = scratch("thin-kill-");
    let p = d.path();
    let meta = sparse(p, "meta", 4 << 20);
    let data = sparse(p, "data", BLOCKS * BLOCK);
    let script = format!("{}/tests/faults/crash_io.py", env!("CARGO_MANIFEST_DIR"));
    let sock = p.join("nbd.sock");
    let mut next = crash::seeded_rng();
    let state = |round: u32| p.join(format!("state{round}.json"));
    let py = |mode: &str, round: u32| {
        let mut c = Command::new(need(PYTHON));
        c.arg(&script)
            .args([mode, sock.to_str().unwrap(), "t"])
            .arg(state(round));
        c
    };
    let (mut acked, mut flushes) = (0u64, 0u64);
    for round in 0..KILLS {
        let srv = start_pool(p, &meta, &data);
        if round > 0 {
            let last = (round - 1).to_string();
            open_thin(&srv, round - 1);
            let out = run_text(py("verify", round - 1).arg("flushed"));
            println!("round {round}: {}", out.trim());
            srv.ok(&["remove", "--retry", "t"]);
            srv.ok(&["message", "pool", "0", "delete", &last]);
        }
        srv.ok(&["message", "pool", "0", "create_thin", &round.to_string()]);
        open_thin(&srv, round);
        let ready = p.join(format!("state{round}.json.ready"));
        // A random moment, 20 to 1200 ms in: some rounds die while most
        // writes still provision, some after the 1 s timer's commit.
        let delay = Duration::from_millis(20 + next() % 1180);
        let (a, f) = crash::kill_during(
            py("write", round).arg(next().to_string()),
            &ready,
            delay,
            || srv.serve.kill9(),
            round,
        );
        acked += a;
        flushes += f;
        thin_check(&meta, round);
    }
    let srv = start_pool(p, &meta, &data);
    open_thin(&srv, KILLS - 1);
    let out = run_text(py("verify", KILLS - 1).arg("flushed"));
    println!("final: {}", out.trim());
    srv.serve.stop();
    thin_check(&meta, KILLS);
    assert!(acked > 0 && flushes > 0, "the writer never got going");
    common::report(&format!(
        "thin SIGKILL test: {KILLS} kills in {:.1} s, {acked} writes acknowledged, \
         {flushes} flushes completed; thin_check clean and every flushed write intact \
         after each",
        t0.elapsed().as_secs_f64()
    ));
}
