//! Process death: udm is killed with SIGKILL at random moments while an NBD
//! client writes crypt-over-striped on files with flushes; after every
//! restart, every write acknowledged before the last completed FLUSH (and,
//! since udm keeps no cache of its own, every acknowledged write) reads
//! back intact. Alternate rounds serve the files through tmpfs mappings
//! and through pread/pwrite (`--no-mmap`). The counts are printed.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const KILLS: u32 = 24;

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write() {
    need_python_module("nbd", "python3-libnbd");
    let d = scratch("udm-kill-");
    let p = d.path();
    let leg0 = sparse(p, "leg0.img", 8 << 20);
    let leg1 = sparse(p, "leg1.img", 8 << 20);
    let st = p.join("st.table");
    std::fs::write(
        &st,
        format!(
            "0 32768 striped 2 64 {} 0 {} 0\n",
            leg0.display(),
            leg1.display()
        ),
    )
    .unwrap();
    let cr = p.join("cr.table");
    std::fs::write(
        &cr,
        format!(
            "0 32768 crypt aes-xts-plain64 {} 0 @st 0\n",
            "5c".repeat(64)
        ),
    )
    .unwrap();
    let state = p.join("state.json");
    let script = format!("{}/tests/faults/crash_io.py", env!("CARGO_MANIFEST_DIR"));
    let sock = p.join("s.sock");
    let mut next = common::crash::seeded_rng();
    let serve = |round: u32| {
        let _ = std::fs::remove_file(&sock);
        let tables = [
            format!("st={}", st.display()),
            format!("cr={}", cr.display()),
        ];
        let mut args = vec![
            "--threads",
            "2",
            "--table",
            &tables[0],
            "--table",
            &tables[1],
        ];
        if round % 2 == 1 {
            args.push("--no-mmap");
        }
        UdmServe::start(&sock, &args)
    };
    let verify = |round: u32| {
        let out = run_text(
            Command::new(need(PYTHON))
                .arg(&script)
                .args(["verify", sock.to_str().unwrap(), "cr"])
                .arg(&state),
        );
        println!("round {round}: {}", out.trim());
    };
    let (mut acked, mut flushes) = (0u64, 0u64);
    for round in 0..KILLS {
        let srv = serve(round);
        if round > 0 {
            verify(round);
        }
        // A random moment: 50 to 800 ms after the writer started writing.
        let delay = Duration::from_millis(50 + next() % 750);
        let (a, f) = common::crash::kill_during(
            Command::new(PYTHON)
                .arg(&script)
                .args(["write", sock.to_str().unwrap(), "cr"])
                .arg(&state)
                .arg(next().to_string()),
            &p.join("state.json.ready"),
            delay,
            || srv.kill9(),
            round,
        );
        acked += a;
        flushes += f;
    }
    let srv = serve(KILLS);
    verify(KILLS);
    srv.stop();
    assert!(acked > 0 && flushes > 0, "the writer never got going");
    common::report(&format!(
        "SIGKILL crash test: {KILLS} kills, {acked} writes acknowledged, {flushes} flushes \
         completed, every acknowledged write intact after each restart"
    ));
}
