//! Load generator for `bench/load.sh`: N clients × QD requests in flight
//! on one NBD server (Unix socket, default export, simple replies), mixed
//! 4 KiB reads and writes with verification, for a given time. Prints one
//! line of JSON: requests, failures, p50/p99/p999 per op in microseconds.
//!
//! Each client owns a region of the export and each of its QD slots a part
//! of that region, so requests in flight never overlap and every read can
//! be checked against what the client last wrote there (a pattern derived
//! from the block and a write counter).
//!
//! Usage: nbd_load SOCKET CLIENTS QD SECONDS [READ_PERCENT]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BS: u64 = 4096;

fn handshake(s: &mut UnixStream) -> std::io::Result<u64> {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello)?;
    s.write_all(&3u32.to_be_bytes())?;
    let mut opt = [0u8; 16];
    opt[0..8].copy_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
    opt[8..12].copy_from_slice(&1u32.to_be_bytes());
    s.write_all(&opt)?;
    let mut info = [0u8; 10];
    s.read_exact(&mut info)?;
    Ok(u64::from_be_bytes(info[0..8].try_into().unwrap()))
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

fn pattern(block: u64, gen: u32, out: &mut [u8]) {
    let mut x = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(gen).wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1;
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

#[derive(Default)]
struct Stats {
    read: Vec<u32>,
    write: Vec<u32>,
    failures: u64,
}

/// One client: its slots each keep one request in flight.
fn client(
    sock: String,
    idx: u64,
    clients: u64,
    qd: u64,
    read_pct: u64,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Stats>>,
) {
    let mut s = match UnixStream::connect(&sock) {
        Ok(s) => s,
        Err(_) => {
            out.lock().unwrap().failures += 1;
            return;
        }
    };
    let size = match handshake(&mut s) {
        Ok(n) => n,
        Err(_) => {
            out.lock().unwrap().failures += 1;
            return;
        }
    };
    let region = size / clients / BS * BS;
    let per_slot = (region / qd / BS).max(1);
    let base = idx * region;
    // Per slot: its block (relative), the generation of every block
    // written (0: never, so not checked), what is in flight.
    let mut gens: HashMap<u64, u32> = HashMap::new();
    let mut rng = idx.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut inflight: HashMap<u64, (bool, u64, u32, Instant)> = HashMap::new();
    let mut st = Stats::default();
    let mut buf = vec![0u8; BS as usize];
    let mut want = vec![0u8; BS as usize];
    let mut cookie = 0u64;
    let mut issue = |s: &mut UnixStream,
                     slot: u64,
                     gens: &mut HashMap<u64, u32>,
                     inflight: &mut HashMap<u64, (bool, u64, u32, Instant)>,
                     read: bool,
                     blk: u64|
     -> std::io::Result<u64> {
        let block = slot * per_slot + blk;
        let off = base + block * BS;
        cookie += 1;
        if read {
            s.write_all(&request(0, cookie, off, BS as u32))?;
            let g = gens.get(&block).copied().unwrap_or(0);
            inflight.insert(cookie, (true, block, g, Instant::now()));
        } else {
            let g = gens.get(&block).copied().unwrap_or(0) + 1;
            let mut data = vec![0u8; BS as usize];
            pattern(block, g, &mut data);
            s.write_all(&request(1, cookie, off, BS as u32))?;
            s.write_all(&data)?;
            gens.insert(block, g);
            inflight.insert(cookie, (false, block, g, Instant::now()));
        }
        Ok(cookie)
    };
    let r = (|| -> std::io::Result<()> {
        let mut slot_of: HashMap<u64, u64> = HashMap::new();
        for slot in 0..qd {
            let rd = next(100) < read_pct;
            let b = next(per_slot.min(64));
            let c = issue(&mut s, slot, &mut gens, &mut inflight, rd, b)?;
            slot_of.insert(c, slot);
        }
        while !inflight.is_empty() {
            let mut h = [0u8; 16];
            s.read_exact(&mut h)?;
            let c = u64::from_be_bytes(h[8..16].try_into().unwrap());
            let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
            let Some((read, block, g, t0)) = inflight.remove(&c) else {
                st.failures += 1;
                return Ok(());
            };
            if read && err == 0 {
                s.read_exact(&mut buf)?;
                if g > 0 {
                    pattern(block, g, &mut want);
                    if buf != want {
                        st.failures += 1;
                    }
                }
            }
            if err != 0 {
                st.failures += 1;
            }
            let us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
            if read {
                st.read.push(us);
            } else {
                st.write.push(us);
            }
            let slot = slot_of.remove(&c).unwrap_or(0);
            if !stop.load(Ordering::Relaxed) {
                let rd = next(100) < read_pct;
                let b = next(per_slot.min(64));
                let c = issue(&mut s, slot, &mut gens, &mut inflight, rd, b)?;
                slot_of.insert(c, slot);
            }
        }
        let _ = s.write_all(&request(2, 0, 0, 0));
        Ok(())
    })();
    if r.is_err() {
        st.failures += 1;
    }
    let mut o = out.lock().unwrap();
    o.read.extend(st.read);
    o.write.extend(st.write);
    o.failures += st.failures;
}

fn pct(v: &mut [u32], p: f64) -> u32 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: nbd_load SOCKET CLIENTS QD SECONDS [READ_PERCENT]");
        std::process::exit(2);
    }
    let (sock, clients, qd, secs) = (
        a[1].clone(),
        a[2].parse::<u64>().unwrap(),
        a[3].parse::<u64>().unwrap(),
        a[4].parse::<f64>().unwrap(),
    );
    let read_pct = a.get(5).map_or(70, |v| v.parse().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let out = Arc::new(Mutex::new(Stats::default()));
    let started = AtomicU64::new(0);
    let t0 = Instant::now();
    let hs: Vec<_> = (0..clients)
        .map(|i| {
            let (sock, stop, out) = (sock.clone(), stop.clone(), out.clone());
            started.fetch_add(1, Ordering::Relaxed);
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || client(sock, i, clients, qd, read_pct, stop, out))
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        let _ = h.join();
    }
    let el = t0.elapsed().as_secs_f64();
    let mut o = out.lock().unwrap();
    let (nr, nw) = (o.read.len(), o.write.len());
    let failures = o.failures;
    let (r50, r99, r999) = (pct(&mut o.read, 0.5), pct(&mut o.read, 0.99), pct(&mut o.read, 0.999));
    let (w50, w99, w999) = (pct(&mut o.write, 0.5), pct(&mut o.write, 0.99), pct(&mut o.write, 0.999));
    println!(
        "{{\"clients\":{clients},\"qd\":{qd},\"seconds\":{el:.2},\"requests\":{},\"iops\":{:.0},\"failures\":{failures},\
         \"read\":{{\"n\":{nr},\"p50\":{r50},\"p99\":{r99},\"p999\":{r999}}},\
         \"write\":{{\"n\":{nw},\"p50\":{w50},\"p99\":{w99},\"p999\":{w999}}}}}",
        nr + nw,
        (nr + nw) as f64 / el
    );
}
