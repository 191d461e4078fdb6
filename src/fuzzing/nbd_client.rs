//! The `nbd_client` driver: bytes played as a hostile client against the
//! real per-connection server code; and its seed sessions.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::DEV_SIZE;
use crate::nbd::proto::*;
use crate::nbd::server::{export_set, serve_connection};
use crate::nbd::sock::Sock;
use crate::nbd::{Export, ExportSet};
use crate::store::MemStore;

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
}
