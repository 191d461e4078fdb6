//! Zero heap allocations per request in steady state, counted with a
//! counting global allocator over the whole process (server threads and
//! the client): after a warm-up, thousands of NBD reads, writes (aligned
//! and partial-block) and flushes through the in-process server allocate
//! nothing at all. Payload buffers come from the recycling pool, request
//! descriptors from the engine's slab.

mod nbd_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nbd_support::*;
use udm::store::mem::MemStore;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Size of the latest allocation, to name the culprit in a failure.
static LAST_SIZE: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LAST_SIZE.store(l.size() as u64, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LAST_SIZE.store(n as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn handshake(s: &mut UnixStream) {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    // EXPORT_NAME "" (default export); reply: size + flags (no zeroes).
    let mut opt = [0u8; 16];
    opt[0..8].copy_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    opt[8..12].copy_from_slice(&1u32.to_be_bytes());
    s.write_all(&opt).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
}

fn request(cmd: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut b = [0u8; 28];
    b[0..4].copy_from_slice(&0x2560_9513u32.to_be_bytes());
    b[6..8].copy_from_slice(&cmd.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..28].copy_from_slice(&len.to_be_bytes());
    b
}

/// One round: `depth` writes then `depth` reads of 4 KiB (every 4th at a
/// partial-block offset), then a flush; every reply checked.
fn round(s: &mut UnixStream, payload: &[u8; 4096], back: &mut [u8; 4096], depth: u64) {
    let off = |i: u64| i * 8192 + if i % 4 == 3 { 100 } else { 0 };
    for i in 0..depth {
        s.write_all(&request(1, i, off(i), 4096)).unwrap();
        s.write_all(payload).unwrap();
    }
    let mut reply = [0u8; 16];
    for _ in 0..depth {
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[4..8], &[0, 0, 0, 0], "write failed");
    }
    for i in 0..depth {
        s.write_all(&request(0, 100 + i, off(i), 4096)).unwrap();
    }
    for _ in 0..depth {
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[4..8], &[0, 0, 0, 0], "read failed");
        s.read_exact(back).unwrap();
        assert!(back[..] == payload[..], "read returned other data");
    }
    s.write_all(&request(3, 999, 0, 0)).unwrap();
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..8], &[0, 0, 0, 0], "flush failed");
}

#[test]
fn steady_state_requests_do_not_allocate() {
    let srv = Server::start(
        vec![export("a", Arc::new(MemStore::new(16 << 20)), false)],
        2,
    );
    let mut s = UnixStream::connect(&srv.socket).unwrap();
    handshake(&mut s);
    let mut payload = [0u8; 4096];
    for (i, b) in payload.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mut back = [0u8; 4096];
    for _ in 0..50 {
        round(&mut s, &payload, &mut back, 32);
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    let rounds = 100u64;
    for _ in 0..rounds {
        round(&mut s, &payload, &mut back, 32);
    }
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    let requests = rounds * (32 * 2 + 1);
    println!("{allocs} allocations in {requests} requests");
    // After the warm-up every payload buffer comes from the pool's class
    // cache (its list reserved in full up front) and every request
    // descriptor from the engine's slab: not a single allocator call.
    assert_eq!(
        allocs,
        0,
        "{allocs} heap allocations in {requests} steady-state requests (last: {} bytes)",
        LAST_SIZE.load(Ordering::SeqCst)
    );
    drop(s);
    srv.stop().unwrap();
}
