//! The transmission phase of one connection.
//!
//! One reader thread per connection parses requests, checks them against
//! the export (every check that needs no device access happens here, so a
//! bad request never costs a worker), reads write payloads straight into
//! the request's buffer and hands requests to the shared engine. Workers
//! send the replies themselves, under a per-connection send lock, in
//! whatever order requests finish; a read's data goes out in the same
//! `writev` as its reply header.

use std::io::{self, IoSlice};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::DevResult;
use crate::engine::Buf;
use crate::engine::{Engine, Op, Request, Sink};

use super::handshake::Negotiated;
use super::proto::*;
use super::sock::{Reader, Sock};

/// A connection as seen by the workers that reply on it.
pub struct Conn {
    pub sock: Sock,
    send: Mutex<()>,
    structured: bool,
    dead: AtomicBool,
}

impl Conn {
    pub fn new(sock: Sock, structured: bool) -> Conn {
        Conn {
            sock,
            send: Mutex::new(()),
            structured,
            dead: AtomicBool::new(false),
        }
    }

    fn send(&self, bufs: &mut [IoSlice<'_>]) {
        if self.dead.load(Ordering::Relaxed) {
            return;
        }
        let _g = self.send.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = self.sock.write_all_vectored(bufs) {
            // The client vanished or stopped reading: drop the connection;
            // the reader sees the shutdown and winds the connection down.
            tracing::debug!("reply to {} failed: {e}", self.sock.peer());
            self.dead.store(true, Ordering::Relaxed);
            self.sock.shutdown(Shutdown::Both);
        }
    }

    fn send_ok(&self, cookie: u64) {
        let h = simple_reply(0, cookie);
        self.send(&mut [IoSlice::new(&h)]);
    }

    /// An error reply; reads with structured replies must get an error
    /// chunk, everything else may use a simple reply.
    fn send_error(&self, cookie: u64, error: u32, is_read: bool, msg: &str) {
        if is_read && self.structured {
            let msg = &msg.as_bytes()[..msg.len().min(1024)];
            let h = chunk_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_ERROR,
                cookie,
                6 + msg.len() as u32,
            );
            let mut body = [0u8; 6];
            body[0..4].copy_from_slice(&error.to_be_bytes());
            body[4..6].copy_from_slice(&(msg.len() as u16).to_be_bytes());
            self.send(&mut [IoSlice::new(&h), IoSlice::new(&body), IoSlice::new(msg)]);
        } else {
            let h = simple_reply(error, cookie);
            self.send(&mut [IoSlice::new(&h)]);
        }
    }

    fn send_read(&self, cookie: u64, offset: u64, data: &[u8]) {
        if !self.structured {
            let h = simple_reply(0, cookie);
            self.send(&mut [IoSlice::new(&h), IoSlice::new(data)]);
        } else if data.is_empty() {
            let h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0);
            self.send(&mut [IoSlice::new(&h)]);
        } else {
            // One data chunk for the whole read, so DF always holds.
            let h = chunk_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_OFFSET_DATA,
                cookie,
                8 + data.len() as u32,
            );
            let off = offset.to_be_bytes();
            self.send(&mut [IoSlice::new(&h), IoSlice::new(&off), IoSlice::new(data)]);
        }
    }

    fn send_block_status(&self, cookie: u64, id: u32, len: u32) {
        let h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, 12);
        let mut body = [0u8; 12];
        body[0..4].copy_from_slice(&id.to_be_bytes());
        body[4..8].copy_from_slice(&len.to_be_bytes());
        // Status 0: allocated data, not known to be zero. Always safe, and
        // the only honest answer for a crypt target.
        self.send(&mut [IoSlice::new(&h), IoSlice::new(&body)]);
    }
}

impl Sink for Conn {
    fn complete(&self, req: &Request, result: DevResult<()>) {
        match result {
            Ok(()) if req.op == Op::Read => self.send_read(req.cookie, req.offset, req.data()),
            Ok(()) => self.send_ok(req.cookie),
            Err(e) => {
                tracing::warn!(
                    "{:?} of {} bytes at offset {} failed: {e}",
                    req.op,
                    req.len,
                    req.offset
                );
                let msg = e.to_string();
                self.send_error(
                    req.cookie,
                    e.nbd_errno(req.op.is_write()),
                    req.op == Op::Read,
                    &msg,
                );
            }
        }
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Serve requests until the client disconnects; then wait for every
/// request of this client to be answered. Errors are protocol violations
/// or socket failures of this client only.
pub fn transmission(conn: &Arc<Conn>, neg: Negotiated, engine: &Engine) -> io::Result<()> {
    // `dmsetup remove --force` ends the connection through this hook.
    let closing = conn.clone();
    let _attached = neg
        .export
        .connect_closable(Box::new(move || closing.sock.shutdown(Shutdown::Both)));
    let client = engine.add_client();
    let r = reader_loop(conn, neg, engine, client);
    engine.remove_client(client);
    r
}

fn reader_loop(
    conn: &Arc<Conn>,
    neg: Negotiated,
    engine: &Engine,
    client: crate::engine::ClientId,
) -> io::Result<()> {
    let ex = &neg.export.export;
    let queue = &neg.export.queue;
    let size = ex.device.size();
    let read_only = ex.is_read_only();
    let fast_zero = ex.device.limits().write_zeroes;
    let structured = neg.structured;
    let sink: Arc<dyn Sink> = conn.clone();
    let sock = &conn.sock;
    let mut input = Reader::new();
    let mut hb = [0u8; REQUEST_LEN];
    loop {
        if !input.read_full(sock, &mut hb)? {
            return Ok(());
        }
        let h = RequestHeader::decode(&hb);
        if h.magic != REQUEST_MAGIC {
            return Err(invalid(
                "bad request magic (not an NBD client, or out of sync)",
            ));
        }
        let len = u64::from(h.len);
        let in_range = h.offset.checked_add(len).is_some_and(|e| e <= size);
        let fua = h.flags & CMD_FLAG_FUA != 0;
        let bad_flags = |allowed: u16| h.flags & !allowed != 0;
        let request = |op: Op, buf, head| Request {
            op,
            cookie: h.cookie,
            flags: h.flags,
            offset: h.offset,
            len,
            fua,
            buf,
            head,
            sink: sink.clone(),
        };
        match h.cmd {
            CMD_READ => {
                let df = if structured { CMD_FLAG_DF } else { 0 };
                let err = if bad_flags(CMD_FLAG_FUA | df) {
                    Some((EINVAL, "unsupported flags on READ"))
                } else if h.len > MAX_PAYLOAD {
                    Some((EINVAL, "READ larger than the 32 MiB maximum"))
                } else if !in_range {
                    Some((EINVAL, "READ beyond the end of the export"))
                } else {
                    None
                };
                if let Some((e, msg)) = err {
                    conn.send_error(h.cookie, e, true, msg);
                } else if len == 0 {
                    conn.send_read(h.cookie, h.offset, &[]);
                } else {
                    let t = engine.admit(client, len);
                    let (buf, head) = engine.buffer(queue, h.offset, len);
                    engine.submit_or_run(t, queue, request(Op::Read, buf, head));
                }
            }
            CMD_WRITE => {
                if h.len > MAX_DISCARDED_PAYLOAD {
                    return Err(invalid("absurd WRITE length"));
                }
                let err = if bad_flags(CMD_FLAG_FUA) {
                    Some(EINVAL)
                } else if read_only {
                    Some(EPERM)
                } else if h.len > MAX_PAYLOAD {
                    Some(EINVAL)
                } else if !in_range {
                    Some(ENOSPC)
                } else {
                    None
                };
                if let Some(e) = err {
                    // The payload is already on the wire: consume it so the
                    // stream stays in sync, then refuse the request.
                    input.skip(sock, len)?;
                    conn.send_error(h.cookie, e, false, "");
                } else if len == 0 {
                    conn.send_ok(h.cookie);
                } else {
                    let t = engine.admit(client, len);
                    // The payload lands straight in a buffer laid out over
                    // whole device blocks, so a partial-block write needs
                    // no second buffer and no copy.
                    let (mut buf, head) = engine.buffer(queue, h.offset, len);
                    if let Err(e) = input.read_exact(sock, &mut buf[head..head + len as usize]) {
                        engine.cancel(t);
                        return Err(e);
                    }
                    engine.submit_or_run(t, queue, request(Op::Write, buf, head));
                }
            }
            CMD_DISC => return Ok(()),
            CMD_FLUSH => {
                if bad_flags(CMD_FLAG_FUA) || h.offset != 0 || len != 0 {
                    conn.send_error(h.cookie, EINVAL, false, "");
                } else {
                    let t = engine.admit(client, 0);
                    engine.submit(t, queue, request(Op::Flush, Buf::empty(), 0));
                }
            }
            CMD_TRIM | CMD_WRITE_ZEROES => {
                let zero = h.cmd == CMD_WRITE_ZEROES;
                let allowed = if zero {
                    CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
                } else {
                    CMD_FLAG_FUA
                };
                let err = if bad_flags(allowed) {
                    Some(EINVAL)
                } else if read_only {
                    Some(EPERM)
                } else if !in_range {
                    Some(if zero { ENOSPC } else { EINVAL })
                } else if zero && h.flags & CMD_FLAG_FAST_ZERO != 0 && !fast_zero {
                    Some(ENOTSUP)
                } else {
                    None
                };
                if let Some(e) = err {
                    conn.send_error(h.cookie, e, false, "");
                } else if len == 0 {
                    conn.send_ok(h.cookie);
                } else {
                    let op = if zero { Op::WriteZeroes } else { Op::Trim };
                    let t = engine.admit(client, 0);
                    engine.submit(t, queue, request(op, Buf::empty(), 0));
                }
            }
            CMD_CACHE => {
                // A prefetch hint; with no cache of our own there is
                // nothing to do beyond checking the request.
                if bad_flags(CMD_FLAG_FUA) || !in_range {
                    conn.send_error(h.cookie, EINVAL, false, "");
                } else {
                    conn.send_ok(h.cookie);
                }
            }
            CMD_BLOCK_STATUS => match neg.meta_base_allocation {
                Some(id) if !bad_flags(CMD_FLAG_FUA | CMD_FLAG_REQ_ONE) && in_range && len > 0 => {
                    conn.send_block_status(h.cookie, id, h.len);
                }
                _ => conn.send_error(h.cookie, EINVAL, false, ""),
            },
            _ => conn.send_error(h.cookie, EINVAL, false, ""),
        }
    }
}
