//! One connection to the server: the send side (requests go out under one
//! lock, header and payload in one vectored write), the slot table the
//! callers wait in, and the reply reader thread that fills it.

use std::io::{self, IoSlice, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::protocol::nbd::{RequestHeader, CMD_DISC, ESHUTDOWN, REQUEST_MAGIC};

use super::handshake::{handshake, ExportInfo, Negotiated};
use super::reader::read_replies;
use super::slots::{lock, Outcome, SlotTable};
use super::sock::{write_all_vectored, ClientSock};
use super::spec::NbdSpec;

/// A request to send.
pub struct Cmd<'a> {
    pub ty: u16,
    pub flags: u16,
    pub offset: u64,
    pub len: u32,
    pub payload: &'a [IoSlice<'a>],
    pub read: Option<&'a mut [u8]>,
    /// When to stop waiting for the reply.
    pub deadline: Instant,
}

/// Why a call got no answer.
#[derive(Debug)]
pub enum CallError {
    /// The connection broke; the request may be sent again.
    Lost(String),
    /// No reply by the deadline; the connection has been ended (a server
    /// that holds one request may hold them all) and the request is not
    /// sent again.
    TimedOut,
}

/// A connection of the client store (named apart from the server's
/// `nbd::Conn`).
pub struct ClientConn {
    send: Mutex<ClientSock>,
    /// A handle for shutting the socket down from any thread.
    control: ClientSock,
    slots: Arc<SlotTable>,
    pub structured: bool,
    pub info: ExportInfo,
    reader: Mutex<Option<JoinHandle<()>>>,
}

/// The reader thread's body: runs until the connection breaks, then fails
/// every request still waiting.
fn reply_thread(slots: Arc<SlotTable>, structured: bool, sock: ClientSock, control: ClientSock) {
    let mut r = io::BufReader::with_capacity(64 << 10, sock);
    let why = match read_replies(&slots, structured, &mut r) {
        Ok(()) => "connection closed".to_string(),
        Err(e) => e,
    };
    slots.fail_pending(why);
    control.shutdown();
}

impl ClientConn {
    pub fn open(spec: &NbdSpec) -> Result<Arc<ClientConn>, String> {
        let Negotiated {
            sock,
            structured,
            info,
        } = handshake(spec)?;
        let clone = |s: &ClientSock| s.try_clone().map_err(|e| e.to_string());
        let (recv, control, reader_control) = (clone(&sock)?, clone(&sock)?, clone(&sock)?);
        let slots = Arc::new(SlotTable::new());
        let s = slots.clone();
        let h = std::thread::Builder::new()
            .name("udm-nbd-client".into())
            .spawn(move || reply_thread(s, structured, recv, reader_control))
            .map_err(|e| format!("cannot start the reply reader: {e}"))?;
        Ok(Arc::new(ClientConn {
            send: Mutex::new(sock),
            control,
            slots,
            structured,
            info,
            reader: Mutex::new(Some(h)),
        }))
    }

    pub fn is_dead(&self) -> Option<String> {
        self.slots.dead()
    }

    /// Mark the connection broken and wake the reader (which then fails
    /// every waiting request as lost).
    fn kill(&self, why: String) {
        self.slots.mark_dead(why);
        self.control.shutdown();
    }

    /// Send one request and wait for its reply until its deadline.
    /// `Ok(errno)` = the server's answer.
    pub fn call(&self, cmd: Cmd<'_>) -> Result<u32, CallError> {
        let (i, cookie) = self
            .slots
            .take(cmd.offset, cmd.read)
            .map_err(CallError::Lost)?;
        let h = RequestHeader {
            magic: REQUEST_MAGIC,
            flags: cmd.flags,
            cmd: cmd.ty,
            cookie,
            offset: cmd.offset,
            len: cmd.len,
        }
        .encode();
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(1 + cmd.payload.len());
        iov.push(IoSlice::new(&h));
        iov.extend_from_slice(cmd.payload);
        if let Err(e) = write_all_vectored(&mut *lock(&self.send), &mut iov) {
            self.kill(format!("send failed: {e}"));
        }
        // Wait for the outcome even after a failed send or a timeout: the
        // reader may be inside this slot's buffer until it has set one
        // (after `kill` it fails the slot as soon as its read returns).
        let Some(out) = self.slots.wait_until(i, Some(cmd.deadline)) else {
            self.kill("a request got no reply in time".into());
            self.slots.wait(i);
            return Err(CallError::TimedOut);
        };
        match out {
            (Outcome::Done(ESHUTDOWN), _) => {
                self.kill("server is shutting down (ESHUTDOWN)".into());
                Err(CallError::Lost(
                    "server is shutting down (ESHUTDOWN)".into(),
                ))
            }
            (Outcome::Done(e), _) => Ok(e),
            (Outcome::Lost | Outcome::Pending, why) => Err(CallError::Lost(
                why.unwrap_or_else(|| "connection lost".into()),
            )),
        }
    }

    /// Say goodbye and close.
    pub fn close(&self) {
        if self.is_dead().is_none() {
            let h = RequestHeader {
                magic: REQUEST_MAGIC,
                flags: 0,
                cmd: CMD_DISC,
                cookie: 0,
                offset: 0,
                len: 0,
            };
            let _ = lock(&self.send).write_all(&h.encode());
        }
        self.kill("closed".into());
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}
