//! Fixed-newstyle option haggling (protocol document, "Handshake"), as a
//! state machine fed one complete option at a time, so the event loop can
//! run thousands of handshakes without a thread each: it frames the
//! client's bytes (`conn.rs`) and sends what this module writes.
//!
//! Every option gets an answer except `EXPORT_NAME` (which cannot report an
//! error, so an unknown name ends the session). Unknown options get
//! `NBD_REP_ERR_UNSUP` and haggling continues. Lengths sent by the client
//! are bounded before anything is allocated, and parsing never panics.
//! With TLS required, everything but STARTTLS and ABORT is refused with
//! `NBD_REP_ERR_TLS_REQD` until the client has upgraded.

use std::io;
use std::sync::Arc;

use super::export::{Export, ExportSet, Exported};
use super::proto::*;
use super::tls::TlsMode;

/// What a client chose before entering transmission.
#[derive(Clone)]
pub struct Negotiated {
    pub export: Arc<Exported>,
    pub structured: bool,
    /// Context id of `base:allocation` if the client selected it.
    pub meta_base_allocation: Option<u32>,
}

/// The id we hand out for `base:allocation`.
const BASE_ALLOCATION_ID: u32 = 1;

/// The transmission flags of `ex`.
pub fn transmission_flags(ex: &Export, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_FUA | TF_SEND_CACHE;
    // No cache in the server: every connection sees the same device, and a
    // flush flushes the device for all of them, so multi-conn holds.
    f |= TF_CAN_MULTI_CONN;
    if ex.is_read_only() {
        f |= TF_READ_ONLY;
    } else {
        f |= TF_SEND_TRIM | TF_SEND_WRITE_ZEROES;
        // Only where zeroing is O(1) below (punched holes, a block
        // device's write-zeroes-unmap): a client asking for a fast zero
        // elsewhere is told to fall back to writing.
        if ex.device.limits().write_zeroes {
            f |= TF_SEND_FAST_ZERO;
        }
    }
    if structured {
        f |= TF_SEND_DF;
    }
    f
}

/// (minimum, preferred, maximum) block sizes advertised for `e`. We serve
/// any alignment (read-modify-write below the device's block size), so the
/// minimum is 1; the preferred size avoids that read-modify-write. The
/// maximum is also bounded by the export's memory budget: a request whose
/// buffer could never be admitted is refused, so clients are told not to
/// send one.
pub fn block_sizes(e: &Exported) -> (u32, u32, u32) {
    let ex = &e.export;
    let lbs = ex.device.limits().logical_block_size.max(1);
    let pref = lbs
        .max(4096)
        .checked_next_power_of_two()
        .unwrap_or(MAX_PAYLOAD);
    (1, pref.min(MAX_PAYLOAD), max_payload(e))
}

/// Largest data request `e` serves: 32 MiB, or less when the export's
/// memory budget is smaller (half of it, rounded down to a power of two,
/// so the buffer's size class and block widening still fit).
pub fn max_payload(e: &Exported) -> u32 {
    let budget = e.queue.pool().budget().limit().unwrap_or(u64::MAX);
    let half = (budget / 2).max(4096);
    let p2 = 1u64 << (63 - half.leading_zeros());
    p2.min(u64::from(MAX_PAYLOAD)) as u32
}

fn reply(out: &mut Vec<u8>, opt: u32, ty: u32, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.extend_from_slice(&option_reply_header(opt, ty, len as u32));
    for p in parts {
        out.extend_from_slice(p);
    }
}

fn reply_err(out: &mut Vec<u8>, opt: u32, ty: u32, msg: &str) {
    reply(out, opt, ty, &[msg.as_bytes()])
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Parse `u32 len, name, then the rest` (INFO/GO and the meta-context
/// options start this way).
fn name_prefix<'a>(c: &mut Cursor<'a>) -> Option<&'a [u8]> {
    let n = c.u32()? as usize;
    if n > MAX_STRING {
        return None;
    }
    c.bytes(n)
}

/// The server's greeting (fixed newstyle, no zeroes offered).
pub fn greeting() -> [u8; 18] {
    let mut greet = [0u8; 18];
    greet[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    greet[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greet[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    greet
}

/// What the haggling state machine wants next.
pub enum Step {
    /// Send what was written and wait for the next option.
    Continue,
    /// Send what was written (the ACK), then start TLS on the socket; the
    /// next option comes encrypted.
    StartTls,
    /// Send what was written, then enter transmission.
    Done(Negotiated),
    /// End the session (after sending what was written).
    Close,
}

pub use super::export::Peer;

/// The environment of one handshake.
pub struct Ctx<'a> {
    pub exports: &'a ExportSet,
    pub shutting_down: bool,
    pub tls: TlsMode,
    pub peer: &'a Peer,
}

/// One client's option haggling.
#[derive(Default)]
pub struct Negotiation {
    no_zeroes: bool,
    structured: bool,
    /// (export name the contexts were chosen for, selected?)
    meta: Option<(Vec<u8>, bool)>,
    /// The session runs over TLS.
    pub tls_active: bool,
    /// The TLS client presented a certificate the server verified: the
    /// only thing an allow rule's `tls` entry accepts.
    pub tls_verified: bool,
}

impl Negotiation {
    /// Check the client flags (the 4 bytes after the greeting).
    pub fn client_flags(&mut self, client_flags: u32) -> io::Result<()> {
        if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(invalid("client sent unknown client flags"));
        }
        self.no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
        Ok(())
    }

    /// The export `name`, if it exists and this client may use it.
    fn find(&self, cx: &Ctx<'_>, name: &[u8]) -> Option<Arc<Exported>> {
        cx.exports
            .find(name)
            .filter(|e| e.allows(cx.peer, self.tls_verified))
    }

    /// Handle one option (`opt`, its payload `data`, at most
    /// [`MAX_OPTION_LEN`] bytes), appending the replies to `out`.
    pub fn option(
        &mut self,
        cx: &Ctx<'_>,
        opt: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<Step> {
        let len = data.len();
        if cx.shutting_down && opt != OPT_ABORT {
            if opt == OPT_EXPORT_NAME {
                return Ok(Step::Close);
            }
            reply_err(out, opt, REP_ERR_SHUTDOWN, "server is shutting down");
            return Ok(Step::Continue);
        }
        if cx.tls == TlsMode::Require
            && !self.tls_active
            && !matches!(opt, OPT_STARTTLS | OPT_ABORT)
        {
            if opt == OPT_EXPORT_NAME {
                // Cannot carry an error: hang up, as nbdkit does.
                return Err(invalid(
                    "client asked for an export without TLS, which is required",
                ));
            }
            reply_err(
                out,
                opt,
                REP_ERR_TLS_REQD,
                "this server requires TLS: use STARTTLS (nbds:// URIs, qemu tls-creds)",
            );
            return Ok(Step::Continue);
        }

        match opt {
            OPT_EXPORT_NAME => self.export_name(cx, data, out),
            OPT_ABORT => {
                // The client may already have closed; either way we end.
                reply(out, opt, REP_ACK, &[]);
                Ok(Step::Close)
            }
            OPT_STARTTLS => self.starttls(cx, len, out),
            OPT_LIST => self.list(cx, len, out),
            OPT_INFO | OPT_GO => self.info_go(cx, opt, data, out),
            OPT_STRUCTURED_REPLY => {
                if len != 0 {
                    reply_err(out, opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
                    return Ok(Step::Continue);
                }
                self.structured = true;
                reply(out, opt, REP_ACK, &[]);
                Ok(Step::Continue)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(cx, opt, data, out),
            _ => {
                reply_err(out, opt, REP_ERR_UNSUP, "option not supported by udm");
                Ok(Step::Continue)
            }
        }
    }

    /// The old way in: no error can be sent, the answer is the export.
    fn export_name(&mut self, cx: &Ctx<'_>, data: &[u8], out: &mut Vec<u8>) -> io::Result<Step> {
        let Some(found) = self.find(cx, data) else {
            // This option cannot carry an error: end the session.
            return Err(invalid("client asked for an unknown export"));
        };
        let ex = &found.export;
        let mut info = [0u8; 10 + 124];
        info[0..8].copy_from_slice(&ex.device.size().to_be_bytes());
        info[8..10].copy_from_slice(&transmission_flags(ex, self.structured).to_be_bytes());
        let n = if self.no_zeroes { 10 } else { info.len() };
        out.extend_from_slice(&info[..n]);
        Ok(Step::Done(Negotiated {
            export: found,
            structured: self.structured,
            meta_base_allocation: None,
        }))
    }

    fn starttls(&mut self, cx: &Ctx<'_>, len: usize, out: &mut Vec<u8>) -> io::Result<Step> {
        let opt = OPT_STARTTLS;
        if cx.tls == TlsMode::Off {
            reply_err(
                out,
                opt,
                REP_ERR_UNSUP,
                "TLS is not enabled on this server (udm serve --tls=on)",
            );
        } else if len != 0 {
            reply_err(out, opt, REP_ERR_INVALID, "STARTTLS takes no data");
        } else if self.tls_active {
            reply_err(out, opt, REP_ERR_INVALID, "TLS is already active");
        } else {
            reply(out, opt, REP_ACK, &[]);
            // Everything negotiated in plain text is forgotten.
            self.structured = false;
            self.meta = None;
            return Ok(Step::StartTls);
        }
        Ok(Step::Continue)
    }

    /// Only the exports this client may use are listed.
    fn list(&self, cx: &Ctx<'_>, len: usize, out: &mut Vec<u8>) -> io::Result<Step> {
        let opt = OPT_LIST;
        if len != 0 {
            reply_err(out, opt, REP_ERR_INVALID, "LIST takes no data");
            return Ok(Step::Continue);
        }
        for e in cx.exports.list() {
            if !e.allows(cx.peer, self.tls_verified) {
                continue;
            }
            let ex = &e.export;
            let n = (ex.name.len() as u32).to_be_bytes();
            reply(
                out,
                opt,
                REP_SERVER,
                &[&n, ex.name.as_bytes(), ex.description.as_bytes()],
            );
        }
        reply(out, opt, REP_ACK, &[]);
        Ok(Step::Continue)
    }

    fn info_go(&self, cx: &Ctx<'_>, opt: u32, data: &[u8], out: &mut Vec<u8>) -> io::Result<Step> {
        let mut c = Cursor::new(data);
        let parsed = (|| {
            let name = name_prefix(&mut c)?;
            let n = c.u16()? as usize;
            let mut wanted = [false; 4];
            for _ in 0..n {
                let t = c.u16()?;
                if let Some(w) = wanted.get_mut(t as usize) {
                    *w = true;
                }
            }
            (c.remaining() == 0).then_some((name, wanted))
        })();
        let Some((name, wanted)) = parsed else {
            reply_err(out, opt, REP_ERR_INVALID, "malformed INFO/GO request");
            return Ok(Step::Continue);
        };
        let Some(found) = self.find(cx, name) else {
            reply_err(out, opt, REP_ERR_UNKNOWN, "no such export");
            return Ok(Step::Continue);
        };
        let ex = &found.export;
        let mut info = [0u8; 12];
        info[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
        info[2..10].copy_from_slice(&ex.device.size().to_be_bytes());
        info[10..12].copy_from_slice(&transmission_flags(ex, self.structured).to_be_bytes());
        reply(out, opt, REP_INFO, &[&info]);
        if wanted[INFO_NAME as usize] {
            reply(
                out,
                opt,
                REP_INFO,
                &[&INFO_NAME.to_be_bytes(), ex.name.as_bytes()],
            );
        }
        if wanted[INFO_DESCRIPTION as usize] && !ex.description.is_empty() {
            reply(
                out,
                opt,
                REP_INFO,
                &[&INFO_DESCRIPTION.to_be_bytes(), ex.description.as_bytes()],
            );
        }
        // Block sizes are always sent: a client that did not ask
        // may ignore them, and we cope with any alignment anyway.
        let (min, pref, max) = block_sizes(&found);
        let mut bs = [0u8; 14];
        bs[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        bs[2..6].copy_from_slice(&min.to_be_bytes());
        bs[6..10].copy_from_slice(&pref.to_be_bytes());
        bs[10..14].copy_from_slice(&max.to_be_bytes());
        reply(out, opt, REP_INFO, &[&bs]);
        reply(out, opt, REP_ACK, &[]);
        if opt == OPT_GO {
            let selected = match &self.meta {
                Some((n, true)) if cx.exports.find(n).is_some_and(|e| Arc::ptr_eq(&e, &found)) => {
                    Some(BASE_ALLOCATION_ID)
                }
                _ => None,
            };
            return Ok(Step::Done(Negotiated {
                export: found,
                structured: self.structured,
                meta_base_allocation: selected,
            }));
        }
        Ok(Step::Continue)
    }

    fn meta_context(
        &mut self,
        cx: &Ctx<'_>,
        opt: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<Step> {
        let set = opt == OPT_SET_META_CONTEXT;
        if set {
            self.meta = None;
        }
        if !self.structured {
            reply_err(
                out,
                opt,
                REP_ERR_INVALID,
                "negotiate structured replies first",
            );
            return Ok(Step::Continue);
        }
        let mut c = Cursor::new(data);
        let parsed = (|| {
            let name = name_prefix(&mut c)?;
            let n = c.u32()?;
            let mut all = n == 0;
            let mut base = false;
            for _ in 0..n {
                let q = name_prefix(&mut c)?;
                if q == META_BASE_ALLOCATION.as_bytes() {
                    base = true;
                } else if q == b"base:" {
                    all = true;
                }
            }
            (c.remaining() == 0).then_some((name, all, base))
        })();
        let Some((name, all, base)) = parsed else {
            reply_err(out, opt, REP_ERR_INVALID, "malformed meta context request");
            return Ok(Step::Continue);
        };
        if self.find(cx, name).is_none() {
            reply_err(out, opt, REP_ERR_UNKNOWN, "no such export");
            return Ok(Step::Continue);
        }
        // SET ignores the bare namespace; LIST treats it (and no
        // query at all) as "everything".
        let chosen = base || (!set && all);
        if chosen {
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            reply(
                out,
                opt,
                REP_META_CONTEXT,
                &[&id.to_be_bytes(), META_BASE_ALLOCATION.as_bytes()],
            );
        }
        if set {
            self.meta = Some((name.to_vec(), chosen));
        }
        reply(out, opt, REP_ACK, &[]);
        Ok(Step::Continue)
    }
}
