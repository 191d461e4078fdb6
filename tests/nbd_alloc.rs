//! Zero heap allocations per request in steady state, counted with a
//! counting global allocator over the whole process (server threads and
//! the client): after a warm-up, thousands of NBD reads, writes (aligned
//! and partial-block) and flushes through the in-process server allocate
//! nothing at all. Payload buffers come from the recycling pool, request
//! descriptors from the engine's slab.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use common::alloc::{allocs, last_size, Counting};
use common::nbd::*;
use udm::store::mem::MemStore;

#[global_allocator]
static A: Counting = Counting;

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
    let before = allocs();
    let rounds = 100u64;
    for _ in 0..rounds {
        round(&mut s, &payload, &mut back, 32);
    }
    let n = allocs() - before;
    let requests = rounds * (32 * 2 + 1);
    println!("{n} allocations in {requests} requests");
    // After the warm-up every payload buffer comes from the pool's class
    // cache (its list reserved in full up front) and every request
    // descriptor from the engine's slab: not a single allocator call.
    assert_eq!(
        n,
        0,
        "{n} heap allocations in {requests} steady-state requests (last: {} bytes)",
        last_size()
    );
    drop(s);
    srv.stop().unwrap();
}
