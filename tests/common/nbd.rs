//! NBD helpers: udm's server in-process (on a Unix socket or TCP, stopped
//! by its shutdown flag) and the few raw protocol frames the tests that
//! count allocations or time shutdowns send without a client library.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
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

/// Fixed-newstyle handshake for the default export ("") on a raw socket:
/// NBD_OPT_EXPORT_NAME, reply without the 124 zero bytes.
pub fn handshake(s: &mut UnixStream) {
    handshake_named(s, "");
}

/// The same for export `name`; the export's size in bytes.
pub fn handshake_named(s: &mut UnixStream, name: &str) -> u64 {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    // Client flags: FIXED_NEWSTYLE | NO_ZEROES.
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = Vec::with_capacity(16 + name.len());
    opt.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    opt.extend_from_slice(&1u32.to_be_bytes());
    opt.extend_from_slice(&(name.len() as u32).to_be_bytes());
    opt.extend_from_slice(name.as_bytes());
    s.write_all(&opt).unwrap();
    // Export size and transmission flags.
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    u64::from_be_bytes(info[..8].try_into().unwrap())
}

/// A 28-byte request header (compact form, no flags).
pub fn request(cmd: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut b = [0u8; 28];
    b[0..4].copy_from_slice(&0x2560_9513u32.to_be_bytes());
    b[6..8].copy_from_slice(&cmd.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..28].copy_from_slice(&len.to_be_bytes());
    b
}
