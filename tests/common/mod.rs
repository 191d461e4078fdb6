//! Helpers shared by the integration tests (`mod common;` in each file).
//!
//! Why one module: the tests talk to real peers (cryptsetup, qemu-img,
//! nbdkit, libnbd's tools, fio, Python's `cryptography`), and each of them
//! used to carry its own copy of "is the tool there", "run it and show its
//! output on failure" and "start `udm serve` and wait for the socket". One
//! copy keeps the rules the same everywhere: a missing peer FAILS the test
//! with the package to install (never a silent skip), and a failed command
//! shows its status, stdout and stderr.
//!
//! Every test binary compiles its own copy and uses a different subset,
//! hence the module-wide `dead_code` allowance.
#![allow(dead_code)]

pub mod alloc;
pub mod crash;
pub mod dm;
pub mod foreign;
pub mod fs;
pub mod integrity;
pub mod luks;
pub mod nbd;

use std::ffi::OsStr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use udm::core::BlockDevice;
use udm::store::file::{FileStore, OpenFlags};

/// Where the test peers come from (scripts/test.sh installs them all).
const PEERS: &str = "apt-get install qemu-utils cryptsetup-bin nbdkit libnbd-bin \
                     python3-libnbd python3-cryptography python3-jsonschema fio e2fsprogs xfsprogs fuse3 nbdfuse openssl thin-provisioning-tools; \
                     scripts/test.sh installs them";

/// Debian's python, which has the libnbd bindings.
pub const PYTHON: &str = "/usr/bin/python3";

/// Fail loudly (never skip) when a peer tool is missing. Returns the name,
/// so a call can sit inside `Command::new(need("nbdinfo"))`.
pub fn need(tool: &str) -> &str {
    let found = if tool.contains('/') {
        Path::new(tool).is_file()
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false)
    };
    assert!(found, "required tool `{tool}` is not installed ({PEERS})");
    tool
}

/// Fail loudly when [`PYTHON`] cannot import `module` (from Debian `package`).
pub fn need_python_module(module: &str, package: &str) {
    need(PYTHON);
    let ok = Command::new(PYTHON)
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{PYTHON} cannot import `{module}` (apt-get install {package}; scripts/test.sh installs it)"
    );
}

/// Status, stdout and stderr of a finished command, for failure messages.
pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run a command; panic with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed:\n{}", show(&out));
    out
}

/// [`run`], returning stdout as text.
pub fn run_text(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

/// The udm binary under test.
pub fn udm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_udm"))
}

/// Run tests/<script> with [`PYTHON`]; panic with its output unless it succeeds.
pub fn python<S: AsRef<OsStr>>(script: &str, args: &[S]) -> Output {
    need(PYTHON);
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    run(Command::new(PYTHON).arg(path).args(args))
}

/// Poll `f` every 20 ms until it holds; fail naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A scratch directory in tmpfs when there is one (fast), else /tmp.
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .unwrap()
}

/// Deterministic bytes (xorshift, one byte a step), so a failure reproduces.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Deterministic bytes (xorshift, eight bytes a step): fast enough for
/// hundreds of MiB.
pub fn fast_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// `dir/name` holding `data`.
pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

/// `dir/name`, a sparse file of `size` bytes.
pub fn sparse(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

pub fn pwrite(path: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
}

pub fn pread(path: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

/// Resolves table device arguments as file paths.
pub struct Files;

impl udm::targets::DeviceResolver for Files {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        FileStore::open(Path::new(spec), OpenFlags::default())
            .map(|f| Arc::new(f) as Arc<dyn BlockDevice>)
            .map_err(|e| e.to_string())
    }
}

/// Table geometry of one job for tests/crypt/dmcrypt_ref.py.
pub struct Geo<'a> {
    pub spec: &'a str,
    pub key: &'a [u8],
    pub ss: u32,
    pub large: bool,
    /// First sector's IV number (the table's iv_offset plus the position).
    pub iv_offset: u64,
}

/// One job for tests/crypt/dmcrypt_ref.py: `op` ("enc"/"dec") `input` into `output`.
pub fn ref_job(op: &str, g: &Geo<'_>, input: &Path, output: &Path) -> serde_json::Value {
    serde_json::json!({
        "op": op, "spec": g.spec, "key": hex::encode(g.key), "ss": g.ss, "large": g.large,
        "sector": g.iv_offset, "in": input, "out": output,
    })
}

/// Run tests/crypt/dmcrypt_ref.py (an independent dm-crypt sector transform
/// on Python `cryptography` and libgcrypt) on `jobs`, written to `jobs_file`.
pub fn dmcrypt_ref(jobs: &serde_json::Value, jobs_file: &Path) {
    need(PYTHON);
    std::fs::write(jobs_file, serde_json::to_vec(jobs).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crypt/dmcrypt_ref.py");
    let o = Command::new(PYTHON)
        .arg(script)
        .arg(jobs_file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}"));
    assert!(
        o.status.success(),
        "dmcrypt_ref.py failed (apt-get install python3-cryptography libgcrypt20):\n{}",
        show(&o)
    );
}

/// `udm serve --socket SOCK ...` as a child process, killed on drop.
pub struct UdmServe {
    child: Child,
    pub sock: PathBuf,
}

impl UdmServe {
    /// Start `udm serve` on `sock` with `args` and return once the socket
    /// accepts connections. Its stderr goes to `<sock>.log`, shown if it
    /// exits before that.
    pub fn start<S: AsRef<OsStr>>(sock: &Path, args: &[S]) -> UdmServe {
        UdmServe::start_with_input(sock, args, None)
    }

    /// [`UdmServe::start`] with `input` on its standard input (passphrases
    /// it reads as a pipe), closed after.
    pub fn start_with_input<S: AsRef<OsStr>>(
        sock: &Path,
        args: &[S],
        input: Option<&[u8]>,
    ) -> UdmServe {
        let log_path = sock.with_extension("log");
        let log = std::fs::File::create(&log_path).unwrap();
        let mut child = udm()
            .arg("serve")
            .arg("--socket")
            .arg(sock)
            .args(args)
            .env("UDM_LOG", "warn")
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start udm serve");
        if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write;
            stdin.write_all(data).expect("write udm serve's stdin");
        }
        let mut s = UdmServe {
            child,
            sock: sock.to_path_buf(),
        };
        let t = Instant::now();
        while UnixStream::connect(sock).is_err() {
            if let Some(st) = s.child.try_wait().unwrap() {
                let err = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("udm serve exited ({st}): {err}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "udm serve did not come up on {}",
                sock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    /// Threads of the server process (from /proc).
    pub fn threads(&self) -> usize {
        let st = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("Threads: line in /proc/PID/status")
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(mut self) -> Option<i32> {
        // SAFETY: kill(2) with the pid of a child we own and a valid signal.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "udm serve ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl UdmServe {
    /// SIGKILL (no cleanup of any kind, as a crash) and reap the process.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process id, for tests that signal it themselves.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for UdmServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A result line that must reach the test log even when libtest captures
/// output (the counts the crash tests promise to print): written to the
/// process's stderr directly, which libtest's capture of `print!` and
/// `eprint!` does not intercept.
#[allow(dead_code)]
pub fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// cryptsetup's own `tests/` folder with its images (read-only data from
/// `../shared/upstream/`, never copied into the repository). Looked for in
/// `UDM_UPSTREAM`, then as `shared/upstream/cryptsetup-tests` above the
/// crate (a checkout beside `shared/`, or a worktree one level deeper),
/// then at the machines' fixed place `/work/shared/...`, so a clean clone
/// elsewhere (CI's scratch folder) finds it too. Missing: the test fails
/// and says where it looked.
pub fn upstream_cryptsetup_tests() -> PathBuf {
    const REL: &str = "shared/upstream/cryptsetup-tests";
    if let Some(p) = std::env::var_os("UDM_UPSTREAM") {
        return PathBuf::from(p);
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .map(|a| a.join(REL))
        .chain(std::iter::once(Path::new("/work").join(REL)))
        .find(|p| p.join("luks2-validation-test").is_file())
        .unwrap_or_else(|| {
            panic!(
                "cryptsetup's test folder is missing: no {REL} above {} nor in /work; \
                 put it there or name it with UDM_UPSTREAM",
                crate_dir.display()
            )
        })
}
