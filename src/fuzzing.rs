//! Drivers shared by the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer)
//! and their stable-toolchain regression tests (`tests/fuzz_regress.rs`),
//! so that what CI replays and what the fuzzer explores is the same code.
//! Not an API: hidden from the docs, free to change.
//!
//! - [`table`]: bytes → dm table text → parse → build over small in-memory
//!   devices → a few reads and writes. Everything that parses must build or
//!   fail with an error, and every built device must survive I/O.
//! - [`NbdHarness`]: bytes played as a hostile client against the real
//!   per-connection server code over a Unix socket pair. The server side
//!   must end (error or clean close) once the input is exhausted.
//! - [`table_seeds`], [`nbd_seeds`]: the seed inputs of both targets, built
//!   from the table syntax and the protocol constants (the files under
//!   `fuzz/seeds/` are these, written by `tests/fuzz_regress.rs`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::core::table;
use crate::core::{BlockDevice, WriteBuf};
use crate::mapper::{self, MappedDevice};
use crate::nbd::proto::*;
use crate::nbd::server::{export_set, serve_connection};
use crate::nbd::sock::Sock;
use crate::nbd::{Export, ExportSet};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, TargetOptions};

/// Size of every in-memory device the drivers hand out.
pub const DEV_SIZE: u64 = 1 << 20;

/// Most distinct device names one table may resolve (bounds the memory a
/// fuzz input can make the resolver allocate: 8 MiB).
const MAX_DEVICES: usize = 8;

/// Hands out one 1 MiB [`MemStore`] per device name. Names starting with
/// `n` get a store without direct access, so crypt's copying paths (bounce
/// buffers, in-place encryption) are exercised as well as the direct one.
/// Only names a path could plausibly have are accepted: a name with
/// whitespace cannot be printed back into a table anyway.
#[derive(Default)]
pub struct MemResolver {
    devices: HashMap<String, Arc<dyn BlockDevice>>,
}

impl DeviceResolver for MemResolver {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if let Some(d) = self.devices.get(spec) {
            return Ok(d.clone());
        }
        let plausible = !spec.is_empty()
            && spec
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_@./:-+".contains(&b));
        if !plausible || self.devices.len() >= MAX_DEVICES {
            return Err(format!("{spec}: no such device"));
        }
        let dev: Arc<dyn BlockDevice> = if spec.starts_with('n') {
            Arc::new(MemStore::without_direct_access(DEV_SIZE))
        } else {
            Arc::new(MemStore::new(DEV_SIZE))
        };
        self.devices.insert(spec.to_string(), dev.clone());
        Ok(dev)
    }
}

/// The `table` fuzz target: must not panic, whatever `data` is. Returns
/// whether the input built a device (for the regression test's statistics).
pub fn table(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(lines) = table::parse(&text) else {
        return false;
    };
    let mut res = MemResolver::default();
    // One crypt thread: no worker pool per target (a pool per input would
    // make the fuzzer measure thread creation).
    let opts = TargetOptions {
        crypt_threads: 1,
        ..Default::default()
    };
    let Ok(dev) = mapper::build(&lines, &mut res, &opts) else {
        return false;
    };
    // What `table` prints must read back as the same table.
    let shown = dev.table_text(true);
    let _ = dev.table_text(false);
    let again = table::parse(&shown)
        .unwrap_or_else(|e| panic!("printed table does not parse: {e}\n{shown}"));
    let dev2 = mapper::build(&again, &mut res, &opts)
        .unwrap_or_else(|e| panic!("printed table does not build: {e}\n{shown}"));
    assert_eq!(dev2.table_text(true), shown, "table text is not stable");
    // A delay table holds every request for its delay (up to 49 days a
    // request): parsing, building and printing it is what can go wrong;
    // its I/O path is the linear one after a sleep.
    if dev.limits().queue_depth > 0 {
        return true;
    }
    // A lone linear or crypt segment stores what it is given (no aliasing).
    let stores = lines.len() == 1 && matches!(lines[0].target.as_str(), "linear" | "crypt");
    exercise(&dev, stores);
    true
}

/// The `cipher_spec` fuzz target: a dm-crypt cipher spec (lossy UTF-8 of
/// the input after two bytes) keyed with a key of the first byte's length
/// (0 to 255 bytes) and the sector size the second byte picks; a spec that
/// keys must encrypt and decrypt two sectors back to the same bytes. Never
/// a panic, whatever the spec.
pub fn cipher_spec(data: &[u8]) -> bool {
    let (klen, ss_sel, spec) = match data {
        [k, s, rest @ ..] => (*k as usize, *s, String::from_utf8_lossy(rest)),
        _ => return false,
    };
    let _ = crate::crypto::spec::parse(&spec);
    let ss = 512u32 << (ss_sel % 5); // 512..8192: 8192 must be refused
    let large = ss_sel & 0x80 != 0;
    let key: Vec<u8> = (0..klen)
        .map(|i| (i as u8).wrapping_mul(151) ^ 0x5a)
        .collect();
    let Ok(sc) = crate::crypto::SectorCrypt::new(&spec, &key, ss, large) else {
        return false;
    };
    let plain: Vec<u8> = (0..2 * ss as usize).map(|i| (i % 251) as u8).collect();
    let mut buf = plain.clone();
    let sector = u64::from(ss_sel) << 20;
    sc.encrypt(&mut buf, sector);
    sc.decrypt(&mut buf, sector);
    assert!(
        buf == plain,
        "cipher spec '{spec}' does not decrypt what it encrypted"
    );
    true
}

/// Seed inputs for [`cipher_spec`]: key length, sector size selector, spec.
pub fn cipher_spec_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let seed = |k: u8, s: u8, spec: &str| {
        let mut v = vec![k, s];
        v.extend_from_slice(spec.as_bytes());
        v
    };
    vec![
        ("xts_plain64", seed(64, 0, "aes-xts-plain64")),
        ("xts_4k_large", seed(32, 0x83, "aes-xts-plain64")),
        ("cbc_essiv", seed(16, 0, "aes-cbc-essiv:sha256")),
        ("cbc_plain", seed(32, 1, "aes-cbc-plain")),
        ("ecb", seed(16, 0, "aes-ecb")),
        ("serpent_xts", seed(64, 0, "serpent-xts-plain64")),
        ("twofish_cbc", seed(32, 2, "twofish-cbc-essiv:sha256")),
        ("benbi", seed(16, 0, "aes-cbc-benbi")),
        ("null", seed(0, 0, "cipher_null-ecb")),
        ("keycount", seed(128, 0, "aes:2-xts-plain64")),
        ("kernel_form", seed(64, 0, "capi:xts(aes)-plain64")),
    ]
}

/// A few small reads and writes at in-range offsets (segment ends, the
/// middle, the last block), then requests that must be refused.
fn exercise(dev: &MappedDevice, stores: bool) {
    let size = dev.size();
    let lbs = u64::from(dev.limits().logical_block_size).clamp(512, 64 << 10);
    let mut offsets = vec![
        0,
        size / 2 / lbs * lbs,
        size.saturating_sub(lbs) / lbs * lbs,
    ];
    for s in dev.segments().iter().skip(1).take(4) {
        offsets.push(s.start.saturating_sub(lbs) / lbs * lbs);
    }
    let mut buf = vec![0u8; 2 * lbs as usize];
    let mut pat = vec![0u8; buf.len()];
    for (i, &off) in offsets.iter().enumerate() {
        let n = if off + 2 * lbs <= size { 2 * lbs } else { lbs };
        if off + n > size {
            continue;
        }
        let n = n as usize;
        for (j, b) in pat.iter_mut().enumerate() {
            *b = (j as u8).wrapping_mul(31).wrapping_add(i as u8);
        }
        let wrote = dev.write(off, WriteBuf::Borrowed(&pat[..n]), false).is_ok();
        if dev.read(off, &mut buf[..n]).is_ok() && wrote && stores {
            assert!(buf[..n] == pat[..n], "read back differs at {off}");
        }
        let mut owned = pat[..n].to_vec();
        let wrote = dev.write(off, WriteBuf::Owned(&mut owned), true).is_ok();
        if dev.read(off, &mut buf[..n]).is_ok() && wrote && stores {
            assert!(buf[..n] == pat[..n], "read back differs at {off}");
        }
        if dev.write_zeroes(off, lbs, false).is_ok()
            && dev.read(off, &mut buf[..lbs as usize]).is_ok()
            && stores
        {
            assert!(buf[..lbs as usize].iter().all(|&b| b == 0), "not zeroed");
        }
        let _ = dev.discard(off, lbs);
    }
    let _ = dev.flush();
    // Out of range, overflowing and misaligned requests: errors only.
    let _ = dev.read(size, &mut buf[..512]);
    let _ = dev.read(u64::MAX - 511, &mut buf[..512]);
    let _ = dev.write(size - 1, WriteBuf::Borrowed(&pat[..512]), false);
    let _ = dev.read(1, &mut buf[..511]);
    let _ = dev.write_zeroes(u64::MAX, 1, false);
    let _ = dev.discard(size, u64::MAX);
}

/// A server with two 1 MiB in-memory exports, `fuzz` (read-write, also
/// the default export) and `ro` (read-only), and one worker thread. Built
/// once and reused for every input, as a server is for every client.
pub struct NbdHarness {
    exports: Arc<ExportSet>,
    shutting_down: AtomicBool,
}

impl NbdHarness {
    pub fn new() -> NbdHarness {
        // The client side writes into a socket the server may have closed.
        // SAFETY: setting a signal disposition to ignore is always sound.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let export = |name: &str, read_only| Export {
            name: name.into(),
            description: format!("fuzz export {name}"),
            device: Arc::new(MemStore::new(DEV_SIZE)),
            read_only,
        };
        let exports = vec![export("fuzz", false), export("ro", true)];
        let exports =
            Arc::new(export_set(exports, 1, None).expect("cannot start the engine's worker"));
        NbdHarness {
            exports,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Play `data` as a client: write it all, shut the write half, drain
    /// the replies until the server closes. Returns what the server sent.
    /// Returns only once the server side has finished with the connection.
    pub fn run(&self, data: &[u8]) -> Vec<u8> {
        let (client, server) = UnixStream::pair().expect("socketpair");
        let reader = client.try_clone().expect("dup of the client socket");
        std::thread::scope(|s| {
            let srv = s
                .spawn(|| serve_connection(Sock::Unix(server), &self.exports, &self.shutting_down));
            let drain = s.spawn(move || {
                let mut out = Vec::new();
                let _ = (&reader).read_to_end(&mut out);
                out
            });
            // The server may stop reading early (a protocol error): then
            // the write fails, which is what a hostile client would see.
            let _ = (&client).write_all(data);
            let _ = client.shutdown(Shutdown::Write);
            srv.join().expect("server side panicked");
            // The connection is over: whatever the server did not close
            // (an aborted handshake drops the socket) ends the drain here.
            let _ = client.shutdown(Shutdown::Both);
            drain.join().expect("drain thread panicked")
        })
    }
}

impl Default for NbdHarness {
    fn default() -> Self {
        Self::new()
    }
}

/// The `nbd_client` fuzz target's driver for one input, on a harness built
/// once per process.
pub fn nbd_client(data: &[u8]) {
    static HARNESS: std::sync::OnceLock<NbdHarness> = std::sync::OnceLock::new();
    HARNESS.get_or_init(NbdHarness::new).run(data);
}

/// Seed tables: valid lines of every target over devices `a`, `b`, and
/// `nc` (a store without direct access).
pub fn table_seeds() -> Vec<(&'static str, String)> {
    let key64 = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                 202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
    let key32 = &key64[..64];
    vec![
        ("linear", "0 2048 linear a 0\n".into()),
        (
            "linear2",
            "0 1024 linear a 1024\n1024 512 linear nc 8\n".into(),
        ),
        ("striped", "0 2048 striped 2 8 a 0 b 1024\n".into()),
        ("zero", "0 409600 zero\n".into()),
        ("error", "0 8 error\n8 8 zero\n16 2032 linear a 16\n".into()),
        (
            "crypt_xts",
            format!("0 2048 crypt aes-xts-plain64 {key64} 0 a 0\n"),
        ),
        (
            "crypt_4k",
            format!(
                "0 2048 crypt aes-xts-plain64 {key64} 0 a 0 2 sector_size:4096 iv_large_sectors\n"
            ),
        ),
        (
            "crypt_nodirect",
            format!("0 1024 crypt aes-xts-plain64 {key64} 8 nc 1024 1 sector_size:4096\n"),
        ),
        (
            "crypt_cbc",
            format!("0 1024 crypt aes-cbc-essiv:sha256 {key32} 0 a 0 1 allow_discards\n"),
        ),
        ("flakey", "0 2048 flakey a 0 1 1\n".into()),
        (
            "flakey_features",
            "0 2048 flakey a 0 0 5 8 error_reads corrupt_bio_byte 32 w 1 0 random_write_corrupt 5\n"
                .into(),
        ),
        ("flakey_drop", "0 1024 flakey nc 8 0 1 1 drop_writes\n".into()),
        ("delay", "0 2048 delay a 0 0\n".into()),
        ("delay9", "0 1024 delay a 0 0 b 8 0 a 16 0\n".into()),
        ("delay_held", "0 1024 delay a 0 5 b 0 7\n".into()),
        ("dust", "0 2048 dust a 0 512\n".into()),
        ("dust_4k", "0 1024 dust b 8 4096\n".into()),
        ("log_writes", "0 1024 log-writes a b\n".into()),
        (
            "crypt_over_flakey",
            format!("0 1024 crypt aes-xts-plain64 {key64} 0 a 0\n1024 1024 flakey b 0 9 1 1 error_writes\n"),
        ),
        (
            "crypt_mixed",
            format!(
                "# a comment\n0 8 zero\n8 1000 crypt aes-cbc-plain {key32} 0 a 0\n\
                 1008 8 crypt cipher_null-ecb - 0 b 0\n1016 1032 linear b 16\n"
            ),
        ),
    ]
}

fn option(opt: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + payload.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn request(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> [u8; REQUEST_LEN] {
    RequestHeader {
        magic: REQUEST_MAGIC,
        flags,
        cmd,
        cookie,
        offset,
        len,
    }
    .encode()
}

/// `OPT_GO` (or `OPT_INFO`) for `name`, asking for the given info types.
fn go(opt: u32, name: &str, infos: &[u16]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&(name.len() as u32).to_be_bytes());
    p.extend_from_slice(name.as_bytes());
    p.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        p.extend_from_slice(&i.to_be_bytes());
    }
    option(opt, &p)
}

/// The transmission part of a seed: read, write, flush, then `tail`
/// requests, then disconnect. Cookies count from 1.
fn transmission(tail: &[[u8; REQUEST_LEN]]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&request(CMD_READ, 0, 1, 4096, 4096));
    v.extend_from_slice(&request(CMD_WRITE, 0, 2, 8192, 1024));
    v.extend((0..1024u32).map(|i| (i * 7) as u8));
    v.extend_from_slice(&request(CMD_FLUSH, 0, 3, 0, 0));
    for r in tail {
        v.extend_from_slice(r);
    }
    v.extend_from_slice(&request(CMD_DISC, 0, 99, 0, 0));
    v
}

/// Seed client sessions: valid handshakes (`OPT_GO`, `OPT_EXPORT_NAME`,
/// structured replies with `base:allocation`), then a read, a write, a
/// flush (and more), and a disconnect.
pub fn nbd_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();

    let mut simple = flags.to_vec();
    simple.extend(go(OPT_GO, "fuzz", &[]));
    simple.extend(transmission(&[]));

    let mut old = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    old.extend(option(OPT_EXPORT_NAME, b"fuzz"));
    old.extend(transmission(&[request(CMD_WRITE, CMD_FLAG_FUA, 4, 100, 0)]));

    let mut structured = flags.to_vec();
    structured.extend(option(OPT_LIST, &[]));
    structured.extend(option(OPT_STRUCTURED_REPLY, &[]));
    let mut meta = Vec::new();
    meta.extend_from_slice(&4u32.to_be_bytes());
    meta.extend_from_slice(b"fuzz");
    meta.extend_from_slice(&1u32.to_be_bytes());
    let q = b"base:allocation";
    meta.extend_from_slice(&(q.len() as u32).to_be_bytes());
    meta.extend_from_slice(q);
    structured.extend(option(OPT_SET_META_CONTEXT, &meta));
    structured.extend(go(OPT_INFO, "ro", &[INFO_BLOCK_SIZE]));
    structured.extend(go(
        OPT_GO,
        "fuzz",
        &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
    ));
    structured.extend(transmission(&[
        request(CMD_READ, CMD_FLAG_DF, 4, 0, 512),
        request(CMD_BLOCK_STATUS, 0, 5, 0, 65536),
        request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 6, 0, 4096),
        request(CMD_TRIM, 0, 7, 65536, 4096),
        request(CMD_CACHE, 0, 8, 0, 4096),
        request(CMD_READ, 0, 9, DEV_SIZE - 100, 100),
    ]));

    let mut ro = flags.to_vec();
    ro.extend(go(OPT_GO, "ro", &[]));
    ro.extend(transmission(&[]));

    vec![
        ("go_read_write_flush", simple),
        ("export_name", old),
        ("structured", structured),
        ("read_only", ro),
    ]
}

/// A control service with a few devices to act on, built once and reused
/// for every input (as a server's is for every client).
pub struct ControlHarness {
    service: crate::control::service::Service,
}

impl ControlHarness {
    pub fn new() -> ControlHarness {
        use crate::mapper::{BuildOptions, Devices};
        use crate::nbd::export::BudgetPolicy;
        let devices = Arc::new(Devices::new(BuildOptions::default(), true, false));
        let engine = Arc::new(crate::engine::Engine::start(1).expect("engine"));
        let exports = Arc::new(ExportSet::new(
            engine,
            BudgetPolicy {
                total: Some(8 << 20),
                exports: 4,
            },
        ));
        ControlHarness {
            service: crate::control::service::Service::new(devices, exports, false),
        }
    }

    /// Read messages from `data` as the control server does and run each.
    /// Tables that name a path are refused here (a fuzzer must not open
    /// the machine's files); `@NAME`, `zero` and `error` tables run.
    pub fn run(&self, data: &[u8]) -> usize {
        use crate::control::proto::{read_message, Request};
        let mut r = std::io::Cursor::new(data);
        let mut ran = 0;
        for _ in 0..32 {
            let Ok(msg) = read_message(&mut r, || {}) else {
                break;
            };
            let Ok(req) = serde_json::from_slice::<Request>(&msg.json) else {
                continue;
            };
            if msg.payload.contains(&b'/') || req.op == "wait" {
                continue;
            }
            let _ = self.service.handle(&req, msg.payload, &|| false);
            ran += 1;
        }
        ran
    }
}

impl Default for ControlHarness {
    fn default() -> Self {
        Self::new()
    }
}

static CONTROL: std::sync::OnceLock<ControlHarness> = std::sync::OnceLock::new();

/// The `control` fuzz target: a stream of control messages (header, JSON
/// request, payload) against one long-lived service; never a panic.
pub fn control(data: &[u8]) -> usize {
    CONTROL.get_or_init(ControlHarness::new).run(data)
}

fn control_msg(json: serde_json::Value, payload: &str) -> Vec<u8> {
    let j = serde_json::to_vec(&json).expect("json");
    let mut v = Vec::new();
    crate::control::proto::write_message(&mut v, &j, payload.as_bytes()).expect("vec");
    v
}

/// Seed control sessions: create, reload, suspend/resume, status,
/// messages to the fault targets, remove.
pub fn control_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use serde_json::json;
    let mut life = Vec::new();
    for (j, p) in [
        (
            json!({"v":1,"op":"create","names":["z"],"has_table":true}),
            "0 8192 zero\n",
        ),
        (
            json!({"v":1,"op":"create","names":["l"],"has_table":true}),
            "0 4096 linear @z 0\n",
        ),
        (
            json!({"v":1,"op":"reload","names":["l"]}),
            "0 8192 linear @z 0\n",
        ),
        (json!({"v":1,"op":"suspend","names":["l"]}), ""),
        (json!({"v":1,"op":"resume","names":["l"]}), ""),
        (json!({"v":1,"op":"status","names":["l"]}), ""),
        (json!({"v":1,"op":"table","names":[]}), ""),
        (json!({"v":1,"op":"remove","names":["l"]}), ""),
        (json!({"v":1,"op":"remove","names":["z"]}), ""),
    ] {
        life.extend(control_msg(j, p));
    }
    let mut dust = Vec::new();
    for (j, p) in [
        (
            json!({"v":1,"op":"create","names":["z2"],"has_table":true}),
            "0 8192 zero\n",
        ),
        (
            json!({"v":1,"op":"create","names":["d"],"has_table":true}),
            "0 8192 dust @z2 0 512\n",
        ),
        (
            json!({"v":1,"op":"message","names":["d"],"sector":0,"message":["addbadblock","7"]}),
            "",
        ),
        (
            json!({"v":1,"op":"message","names":["d"],"sector":0,"message":["enable"]}),
            "",
        ),
        (
            json!({"v":1,"op":"message","names":["d"],"sector":0,"message":["listbadblocks"]}),
            "",
        ),
        (json!({"v":1,"op":"status","names":["d"]}), ""),
        (json!({"v":1,"op":"remove","names":["d"],"force":true}), ""),
        (json!({"v":1,"op":"remove","names":["z2"]}), ""),
    ] {
        dust.extend(control_msg(j, p));
    }
    let mut flakey = Vec::new();
    for (j, p) in [
        (
            json!({"v":1,"op":"create","names":["z3"],"has_table":true}),
            "0 8192 zero\n",
        ),
        (
            json!({"v":1,"op":"create","names":["f"],"has_table":true}),
            "0 8192 flakey @z3 0 1 1 1 drop_writes\n",
        ),
        (
            json!({"v":1,"op":"create","names":["lw"],"has_table":true}),
            "0 4096 log-writes @z3 @f\n",
        ),
        (
            json!({"v":1,"op":"message","names":["lw"],"sector":0,"message":["mark","m"]}),
            "",
        ),
        (json!({"v":1,"op":"ls"}), ""),
        (json!({"v":1,"op":"remove_all","force":true}), ""),
    ] {
        flakey.extend(control_msg(j, p));
    }
    vec![
        ("version", control_msg(json!({"v":1,"op":"version"}), "")),
        ("targets", control_msg(json!({"v":1,"op":"targets"}), "")),
        ("lifecycle", life),
        ("dust_messages", dust),
        ("flakey_log_writes", flakey),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn seed_sessions_are_served() {
        let h = NbdHarness::new();
        let seeds = nbd_seeds();
        // OPT_EXPORT_NAME: greeting, then size and flags (no zeroes asked
        // for: 124 zero bytes follow), then a success reply per request.
        let out = h.run(&seeds[1].1);
        assert_eq!(&out[..8], &NBD_MAGIC.to_be_bytes());
        assert_eq!(&out[18..26], &DEV_SIZE.to_be_bytes());
        for cookie in 1..=4 {
            assert!(find(&out, &simple_reply(0, cookie)).is_some(), "{cookie}");
        }
        assert_eq!(out.len(), 18 + 10 + 124 + 4 * 16 + 4096);
        // The write of the first session landed and reads back.
        let mut s = seeds[0].1.clone();
        s.truncate(s.len() - 2 * REQUEST_LEN);
        s.extend_from_slice(&request(CMD_READ, 0, 7, 8192, 1024));
        let out = h.run(&s);
        let at = find(&out, &simple_reply(0, 7)).expect("read reply") + 16;
        let data = &out[at..at + 1024];
        assert!(data.iter().enumerate().all(|(i, &b)| b == (i * 7) as u8));
        // Writes to the read-only export are refused.
        let out = h.run(&seeds[3].1);
        assert!(find(&out, &simple_reply(EPERM, 2)).is_some());
        // Structured replies: block status and the last read's data chunk.
        let out = h.run(&seeds[2].1);
        // (Its length depends on how many extents the export reports.)
        let bs = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, 5, 12);
        assert!(find(&out, &bs[..16]).is_some(), "no block status chunk");
        let rd = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 9, 108);
        let at = find(&out, &rd).expect("read chunk") + 20;
        assert_eq!(&out[at..at + 8], &(DEV_SIZE - 100).to_be_bytes());
    }

    #[test]
    fn seed_tables_build_and_keep_data() {
        for (name, t) in table_seeds() {
            let lines = table::parse(&t).unwrap_or_else(|e| panic!("{name}: {e}"));
            let dev = mapper::build(
                &lines,
                &mut MemResolver::default(),
                &TargetOptions {
                    crypt_threads: 1,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(dev.size() > 0);
            assert!(table(t.as_bytes()), "{name}");
        }
    }

    #[test]
    fn resolver_bounds_devices() {
        let mut r = MemResolver::default();
        for i in 0..MAX_DEVICES {
            r.resolve(&format!("d{i}")).unwrap();
        }
        assert!(r.resolve("d0").is_ok(), "known names stay resolvable");
        assert!(r.resolve("another").is_err());
        assert!(MemResolver::default().resolve("a b").is_err());
    }
}
