//! The SIGKILL loop of the crash tests: a server with one table, a
//! writer (tests/faults/crash_io.py) that keeps writes in flight, a
//! SIGKILL at a random moment, then a restart whose reads of every block
//! must give each acknowledged write back (an EIO, such as a tag
//! mismatch, fails the checker). Shared so each mode of a target is
//! crashed the same way.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{need_python_module, report, run_text, show, wait_for, UdmServe, PYTHON};

/// A small random generator (xorshift) seeded from the clock, with the
/// seed printed so a failing round can be told apart: the crash moments
/// differ run to run, as a real crash's would.
pub fn seeded_rng() -> impl FnMut() -> u64 {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("random seed {seed}");
    let mut rng = seed | 1;
    move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    }
}

/// The end of one crash round: start `writer` (crash_io.py's `write`),
/// wait until it has writes in flight (its `ready` file), let `delay`
/// pass, `kill` the server, and read the writer's summary line. Returns
/// the writes it saw acknowledged and the flushes that completed. The
/// hooks are the callers' own: how the server dies, how long it lives.
pub fn kill_during(
    writer: &mut Command,
    ready: &Path,
    delay: Duration,
    kill: impl FnOnce(),
    round: u32,
) -> (u64, u64) {
    let writer = writer
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the writer", Duration::from_secs(60), || ready.exists());
    std::fs::remove_file(ready).unwrap();
    std::thread::sleep(delay);
    kill();
    let out = writer.wait_with_output().unwrap();
    assert!(out.status.success(), "writer failed:\n{}", show(&out));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    println!("round {round}: SIGKILL; {line}");
    let mut nums = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse::<u64>().ok());
    (nums.next().unwrap_or(0), nums.next().unwrap_or(0))
}

/// `kills` rounds over export `name` of `table` (a table file) served
/// from `dir`; returns the writes acknowledged in all rounds (asserted
/// above zero). `what` names the device in the printed summary. With
/// `flushed` (a device with a volatile write cache, such as J mode's
/// in-memory journal) the check is crash_io.py's `flushed` one: a write
/// acknowledged after the last completed FLUSH may be lost, the block
/// then holding an older acknowledged generation.
pub fn sigkill_rounds(
    dir: &Path,
    table: &Path,
    name: &str,
    kills: u32,
    what: &str,
    flushed: bool,
) -> u64 {
    need_python_module("nbd", "python3-libnbd");
    let script = format!("{}/tests/faults/crash_io.py", env!("CARGO_MANIFEST_DIR"));
    let state = dir.join("state.json");
    let sock = dir.join("s.sock");
    let tables = format!("{name}={}", table.display());
    let serve = || {
        let _ = std::fs::remove_file(&sock);
        UdmServe::start(&sock, &["--threads", "2", "--table", &tables])
    };
    let mut next = seeded_rng();
    let verify = |round: u32| {
        let mut c = Command::new(PYTHON);
        c.arg(&script)
            .args(["verify", sock.to_str().unwrap(), name])
            .arg(&state);
        if flushed {
            c.arg("flushed");
        }
        let out = run_text(&mut c);
        println!("round {round}: {}", out.trim());
    };
    let mut acked = 0u64;
    for round in 0..kills {
        let srv = serve();
        if round > 0 {
            verify(round);
        }
        let delay = Duration::from_millis(50 + next() % 750);
        let mut writer = Command::new(PYTHON);
        writer
            .arg(&script)
            .args(["write", sock.to_str().unwrap(), name])
            .arg(&state)
            .arg(next().to_string());
        let ready = dir.join("state.json.ready");
        acked += kill_during(&mut writer, &ready, delay, || srv.kill9(), round).0;
    }
    let srv = serve();
    verify(kills);
    srv.stop();
    assert!(acked > 0, "the writer never got going");
    let intact = if flushed {
        "every one flushed intact"
    } else {
        "all intact"
    };
    report(&format!(
        "{what} SIGKILL test: {kills} kills, {acked} writes acknowledged, {intact}, no tag \
         mismatch after each restart"
    ));
    acked
}
