//! The file store's two I/O paths, io_uring and pread/pwrite, each run
//! through the same NBD workload against a `udm serve` started with
//! `--file-io`: images on a disk filesystem (/var/tmp; the other tests'
//! scratch is tmpfs, which is mapped and takes neither path), a linear and
//! a crypt device, reads and writes of several sizes, FLUSH, TRIM,
//! WRITE_ZEROES, FUA, BLOCK_STATUS extents (a trimmed range is a hole), and a SIGKILL in the middle of
//! flushed writes with everything acknowledged read back after a restart.
//! `dmsetup status --json` must say the path was taken (and, on the ring
//! path, that writes have their writer thread), so a silent fallback
//! fails the test.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::dm::DmServer;
use common::*;

const SECTORS: u64 = 32768; // 16 MiB

/// One NBD session over libnbd: writes of 4 KiB, 64 KiB and 1 MiB at
/// QD 16, FUA, flush, trim, zero, then read back and compare; extents of
/// a trimmed range report a hole or zeros. Prints "ok".
const WORKLOAD: &str = r#"
import sys, nbd, random
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
size = h.get_size()
crypt = sys.argv[2] == "crypt"
rng = random.Random(7)
# what unwritten places read as (zeros, or over crypt their decryption)
model = bytearray(b"".join(h.pread(1 << 20, o) for o in range(0, size, 1 << 20)))
pending = []
for i in range(300):
    n = rng.choice([4096, 65536, 1 << 20])
    off = rng.randrange(0, (size - n) // 4096) * 4096
    data = bytes([rng.randrange(256)]) * n
    # no two writes to one place in flight: wait when full or overlapping
    if len(pending) >= 16 or any(o < off + n and off < o + l for (o, l, _) in pending):
        while pending:
            h.poll(-1)
            pending = [p for p in pending if not h.aio_command_completed(p[2])]
    c = h.aio_pwrite(data, off, flags=(nbd.CMD_FLAG_FUA if i % 50 == 0 else 0))
    pending.append((off, n, c))
    model[off:off + n] = data
while pending:
    h.poll(-1)
    pending = [p for p in pending if not h.aio_command_completed(p[2])]
h.flush()
h.zero(1 << 20, 5 << 20)
model[5 << 20:6 << 20] = bytes(1 << 20)
h.trim(1 << 20, 2 << 20)
model[2 << 20:3 << 20] = bytes(1 << 20)
h.pwrite(b"\xa5" * 512, 4 << 20)
model[4 << 20:(4 << 20) + 512] = b"\xa5" * 512
h.flush()
for off in range(0, size, 1 << 20):
    got = h.pread(1 << 20, off)
    want = bytes(model[off:off + (1 << 20)])
    if off == 2 << 20 and crypt:
        continue  # a trimmed crypt range reads as the decryption of zeros
    bad = next((i for i in range(len(want)) if got[i] != want[i]), None)
    assert bad is None, "mismatch at %d: %r, not %r" % (off + bad, got[bad:bad+8], want[bad:bad+8])
for off in range(0, size, 4096 * 97):
    n = min(4096, size - off)
    if crypt and (2 << 20) <= off < (3 << 20):
        continue
    assert h.pread(n, off) == bytes(model[off:off + n]), "4 KiB read at %d" % off
seen = []
def cb(meta, offset, entries, err):
    if meta == nbd.CONTEXT_BASE_ALLOCATION:
        seen.extend(entries)
h.block_status(1 << 20, 2 << 20, cb)  # the trimmed MiB
assert seen and all(f & nbd.STATE_HOLE for f in seen[1::2]), seen
print("ok")
"#;

fn disk_scratch(prefix: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap();
    let out = run_text(Command::new("stat").args(["-f", "-c", "%T"]).arg(d.path()));
    assert_ne!(out.trim(), "tmpfs", "/var/tmp must be a disk filesystem");
    d
}

fn start(dir: &Path, io: &str, lin: &Path, enc: &Path) -> DmServer {
    let srv = DmServer::start(dir, &["--file-io", io]);
    srv.ok(&[
        "create",
        "lin",
        "--table",
        &format!("0 {SECTORS} linear {} 0", lin.display()),
    ]);
    srv.ok(&[
        "create",
        "cr",
        "--table",
        &format!(
            "0 {SECTORS} crypt aes-xts-plain64 {} 0 {} 0 1 allow_discards",
            "3c".repeat(64),
            enc.display()
        ),
    ]);
    srv
}

/// The device's files take `io`, and a store that can block asks for
/// requests in flight.
fn assert_path(srv: &DmServer, dev: &str, io: &str) {
    let st = srv.status_json(dev);
    let files = st["files"].as_array().expect("status lists the files");
    assert_eq!(files.len(), 1, "{st}");
    assert_eq!(files[0]["io"], io, "{dev}: {st}");
    assert!(files[0]["queue_depth"].as_u64().unwrap() > 0, "{st}");
    assert!(st["queue_depth"].as_u64().unwrap() > 0, "{st}");
    // ext4 cannot take a buffered write without blocking: on the ring
    // path such a file's writes run on a writer thread of its own (XFS
    // and btrfs keep them on the ring).
    let fs = run_text(Command::new("stat").args(["-f", "-c", "%T", "/var/tmp"]));
    if fs.trim() == "ext2/ext3" {
        let want = u64::from(io == "uring");
        assert_eq!(files[0]["writers"].as_u64(), Some(want), "{dev}: {st}");
        assert_eq!(
            files[0]["sole_client_inline"].as_bool(),
            Some(io == "uring"),
            "{dev}: {st}"
        );
    }
}

/// Writes through one connection, then through the same connection once
/// every event loop has another: how often the file's writer thread woke
/// for each (its voluntary context switches). Prints "alone shared".
const SOLE: &str = r#"
import sys, os, nbd
pid, uri, loops = int(sys.argv[1]), sys.argv[2], os.cpu_count()
def wakes():
    n = 0
    for t in os.listdir("/proc/%d/task" % pid):
        d = "/proc/%d/task/%s/" % (pid, t)
        if open(d + "comm").read().strip() == "udm-write":
            for l in open(d + "status"):
                if l.startswith("voluntary_ctxt_switches:"):
                    n += int(l.split()[1])
    return n
def burst(h):
    before = wakes()
    cs = [h.aio_pwrite(bytes([i % 251]) * 4096, (i * 4096 * 7) % (8 << 20)) for i in range(400)]
    while cs:
        h.poll(-1)
        cs = [c for c in cs if not h.aio_command_completed(c)]
    h.flush()
    return wakes() - before
h = nbd.NBD(); h.connect_uri(uri)
alone = burst(h)
others = []
for _ in range(loops):
    o = nbd.NBD(); o.connect_uri(uri); o.get_size(); others.append(o)
print(alone, burst(h))
"#;

/// On the ring path over ext4, a client alone on its event loop has its
/// buffered writes run by that loop (no hand-off to the writer thread:
/// `core::sole`); once its loop serves another connection, its writes
/// go to the writer thread, so one client's stalled write never holds up
/// another's requests.
#[test]
fn a_lone_clients_writes_run_on_its_loop_and_a_shared_loop_hands_them_off() {
    need_python_module("nbd", "python3-libnbd");
    let d = disk_scratch("udm-fileio-sole-");
    let p = d.path();
    let fs = run_text(Command::new("stat").args(["-f", "-c", "%T", "/var/tmp"]));
    assert_eq!(
        fs.trim(),
        "ext2/ext3",
        "/var/tmp must be ext4 for this test"
    );
    let lin = sparse(p, "lin.img", SECTORS * 512);
    let enc = sparse(p, "enc.img", SECTORS * 512);
    let srv = start(p, "uring", &lin, &enc);
    assert_path(&srv, "lin", "uring");
    let out = run_text(Command::new(PYTHON).args([
        "-c",
        SOLE,
        &srv.serve.pid().to_string(),
        &srv.uri("lin"),
    ]));
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(v.len(), 2, "{out}");
    assert!(
        v[0] <= 2,
        "a lone client's writes woke the writer thread: {out}"
    );
    assert!(
        v[1] >= 5,
        "a shared loop's writes did not go to the writer thread: {out}"
    );
    assert_eq!(srv.serve.stop(), Some(0));
}

fn exercise(io: &str) {
    need_python_module("nbd", "python3-libnbd");
    let d = disk_scratch("udm-fileio-");
    let p = d.path();
    let lin = sparse(p, "lin.img", SECTORS * 512);
    let enc = sparse(p, "enc.img", SECTORS * 512);
    let srv = start(p, io, &lin, &enc);
    assert_path(&srv, "lin", io);
    assert_path(&srv, "cr", io);
    for (dev, kind) in [("lin", "plain"), ("cr", "crypt")] {
        let out = run_text(Command::new(PYTHON).args(["-c", WORKLOAD, &srv.uri(dev), kind]));
        assert_eq!(out.trim(), "ok", "{dev} over {io}");
    }
    // The linear device's reads of cached pages were sent straight from
    // the file's mapping (the workload checked their bytes); crypt's
    // never are (it decrypts into a buffer).
    let lent = |dev: &str| srv.status_json(dev)["files"][0]["lent_reads"].as_u64();
    assert!(
        lent("lin").is_some_and(|n| n >= 16),
        "lin: {:?}",
        lent("lin")
    );
    assert_eq!(lent("cr"), Some(0));
    // Writes to a disk file take the syscalls by default, crypt's too
    // (through its mapping only with UDM_FILE_WRITE_MAP=1: the store's
    // unit tests cover that path).
    let mapped = |dev: &str| srv.status_json(dev)["files"][0]["mapped_writes"].as_u64();
    assert_eq!(mapped("cr"), Some(0));
    assert_eq!(mapped("lin"), Some(0));
    // Where the file has a writer thread (the ring on ext4), crypt's
    // submitted writes are encrypted there; a linear device leaves it
    // nothing to do, and the pwrite path has no writer thread.
    let prepared = |dev: &str| srv.status_json(dev)["files"][0]["prepared_writes"].as_u64();
    let writers = srv.status_json("cr")["files"][0]["writers"].as_u64();
    if writers.is_some_and(|n| n > 0) {
        assert!(
            prepared("cr").is_some_and(|n| n >= 50),
            "cr: {:?}",
            prepared("cr")
        );
    } else {
        assert_eq!(prepared("cr"), Some(0), "{io}");
    }
    assert_eq!(prepared("lin"), Some(0));
    // What the linear device wrote is in the file, where another program
    // sees it.
    assert_eq!(pread(&lin, 4 << 20, 512), vec![0xa5; 512]);

    // SIGKILL while flushed writes run on the crypt device, then a
    // restart: every acknowledged write is intact.
    let script = format!("{}/tests/faults/crash_io.py", env!("CARGO_MANIFEST_DIR"));
    let state = p.join("state.json");
    let sock = srv.serve.sock.clone();
    let writer = Command::new(PYTHON)
        .arg(&script)
        .args(["write", sock.to_str().unwrap(), "cr"])
        .arg(&state)
        .arg("12345")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = p.join("state.json.ready");
    wait_for("the writer", Duration::from_secs(60), || ready.exists());
    std::thread::sleep(Duration::from_millis(400));
    srv.serve.kill9();
    let out = writer.wait_with_output().unwrap();
    assert!(out.status.success(), "writer failed:\n{}", show(&out));
    let _ = std::fs::remove_file(p.join("control"));
    let _ = std::fs::remove_file(&sock);
    let srv = start(p, io, &lin, &enc);
    assert_path(&srv, "cr", io);
    let v = run_text(
        Command::new(PYTHON)
            .arg(&script)
            .args(["verify", sock.to_str().unwrap(), "cr"])
            .arg(&state),
    );
    println!(
        "{io}: {} / {}",
        String::from_utf8_lossy(&out.stdout).trim(),
        v.trim()
    );
    assert_eq!(srv.serve.stop(), Some(0));
}

#[test]
fn file_stores_on_io_uring() {
    exercise("uring");
}

#[test]
fn file_stores_on_pwrite() {
    exercise("pwrite");
}
