//! Shared helpers of the NBD integration tests: an in-process server on a
//! Unix socket (or TCP) and checks that the client tools exist.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use udm::core::BlockDevice;
use udm::nbd::{serve_with_shutdown, Export, Listen, ServerConfig};

pub struct Server {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

pub fn export(name: &str, dev: Arc<dyn BlockDevice>, read_only: bool) -> Export {
    Export {
        name: name.to_string(),
        description: format!("test export {name}"),
        device: dev,
        read_only,
    }
}

impl Server {
    /// Start a server on a fresh Unix socket with `exports`.
    pub fn start(exports: Vec<Export>, threads: usize) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let listen = Listen::Unix(socket.clone());
        Self::start_on(dir, socket, listen, exports, threads)
    }

    pub fn start_on(
        dir: tempfile::TempDir,
        socket: PathBuf,
        listen: Listen,
        exports: Vec<Export>,
        threads: usize,
    ) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let cfg = ServerConfig {
            listen,
            exports,
            threads,
        };
        let thread = std::thread::spawn(move || serve_with_shutdown(cfg, s2));
        let t0 = Instant::now();
        while !socket.exists() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Server {
            dir,
            socket,
            stop,
            thread: Some(thread),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// Stop the server and return what `serve_with_shutdown` returned.
    pub fn stop(mut self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Fail loudly (never skip) when a client tool is missing.
pub fn need(tool: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "required tool `{tool}` is not installed (apt: qemu-utils libnbd-bin python3-libnbd fio nbdkit)"
    );
}

/// Run a command; panic with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run one of the python-libnbd scripts under tests/nbd/ with Debian's
/// python (which has the libnbd bindings).
pub fn python(script: &str, args: &[&str]) -> Output {
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "/usr/bin/python3 is required (with python3-libnbd)"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nbd")
        .join(script);
    run(Command::new("/usr/bin/python3").arg(path).args(args))
}

/// Deterministic pseudo-random bytes (xorshift), no extra crate needed.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
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
