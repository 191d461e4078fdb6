//! Fixed-newstyle option haggling (protocol document, "Handshake").
//!
//! Every option gets an answer except `EXPORT_NAME` (which cannot report an
//! error, so an unknown name ends the session). Unknown options get
//! `NBD_REP_ERR_UNSUP` and haggling continues. Lengths sent by the client
//! are bounded before anything is allocated, and parsing never panics.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::export::{Export, ExportSet, Exported};
use super::proto::*;
use super::sock::Sock;

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
        f |= TF_SEND_TRIM | TF_SEND_WRITE_ZEROES | TF_SEND_FAST_ZERO;
    }
    if structured {
        f |= TF_SEND_DF;
    }
    f
}

/// (minimum, preferred, maximum) block sizes advertised for `ex`. We serve
/// any alignment (read-modify-write below the device's block size), so the
/// minimum is 1; the preferred size avoids that read-modify-write.
pub fn block_sizes(ex: &Export) -> (u32, u32, u32) {
    let lbs = ex.device.limits().logical_block_size.max(1);
    let pref = lbs
        .max(4096)
        .checked_next_power_of_two()
        .unwrap_or(MAX_PAYLOAD);
    (1, pref.min(MAX_PAYLOAD), MAX_PAYLOAD)
}

fn reply(sock: &Sock, opt: u32, ty: u32, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let h = option_reply_header(opt, ty, len as u32);
    let mut v: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 1);
    v.push(IoSlice::new(&h));
    v.extend(parts.iter().map(|p| IoSlice::new(p)));
    sock.write_all_vectored(&mut v)
}

fn reply_err(sock: &Sock, opt: u32, ty: u32, msg: &str) -> io::Result<()> {
    reply(sock, opt, ty, &[msg.as_bytes()])
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

/// Run the handshake. `Ok(None)`: the client aborted or went away.
pub fn negotiate(
    sock: &Sock,
    exports: &ExportSet,
    shutting_down: &AtomicBool,
) -> io::Result<Option<Negotiated>> {
    let mut greet = [0u8; 18];
    greet[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    greet[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greet[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    sock.write_all(&greet)?;

    let mut cf = [0u8; 4];
    if !sock.read_full(&mut cf)? {
        return Ok(None);
    }
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(invalid("client sent unknown client flags"));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;

    let mut structured = false;
    // (export name the contexts were chosen for, selected?)
    let mut meta: Option<(Vec<u8>, bool)> = None;

    loop {
        let mut h = [0u8; 16];
        if !sock.read_full(&mut h)? {
            return Ok(None);
        }
        let magic = u64::from_be_bytes(h[0..8].try_into().unwrap_or([0; 8]));
        let opt = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let len = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        if magic != IHAVEOPT {
            return Err(invalid("bad option magic"));
        }
        if len > MAX_OPTION_LEN {
            return Err(invalid("option payload too large"));
        }
        let mut data = vec![0u8; len as usize];
        sock.read_exact(&mut data)?;

        if shutting_down.load(Ordering::Relaxed) && opt != OPT_ABORT {
            if opt == OPT_EXPORT_NAME {
                return Ok(None);
            }
            reply_err(sock, opt, REP_ERR_SHUTDOWN, "server is shutting down")?;
            continue;
        }

        match opt {
            OPT_EXPORT_NAME => {
                let Some(found) = exports.find(&data) else {
                    // This option cannot carry an error: end the session.
                    return Err(invalid("client asked for an unknown export"));
                };
                let ex = &found.export;
                let mut out = [0u8; 10 + 124];
                out[0..8].copy_from_slice(&ex.device.size().to_be_bytes());
                out[8..10].copy_from_slice(&transmission_flags(ex, structured).to_be_bytes());
                let n = if no_zeroes { 10 } else { out.len() };
                sock.write_all(&out[..n])?;
                return Ok(Some(Negotiated {
                    export: found,
                    structured,
                    meta_base_allocation: None,
                }));
            }
            OPT_ABORT => {
                // The client may already have closed; either way we end.
                let _ = reply(sock, opt, REP_ACK, &[]);
                return Ok(None);
            }
            OPT_LIST => {
                if len != 0 {
                    reply_err(sock, opt, REP_ERR_INVALID, "LIST takes no data")?;
                    continue;
                }
                for e in exports.list() {
                    let ex = &e.export;
                    let n = (ex.name.len() as u32).to_be_bytes();
                    reply(
                        sock,
                        opt,
                        REP_SERVER,
                        &[&n, ex.name.as_bytes(), ex.description.as_bytes()],
                    )?;
                }
                reply(sock, opt, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let mut c = Cursor::new(&data);
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
                    reply_err(sock, opt, REP_ERR_INVALID, "malformed INFO/GO request")?;
                    continue;
                };
                let Some(found) = exports.find(name) else {
                    reply_err(sock, opt, REP_ERR_UNKNOWN, "no such export")?;
                    continue;
                };
                let ex = &found.export;
                let mut info = [0u8; 12];
                info[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
                info[2..10].copy_from_slice(&ex.device.size().to_be_bytes());
                info[10..12].copy_from_slice(&transmission_flags(ex, structured).to_be_bytes());
                reply(sock, opt, REP_INFO, &[&info])?;
                if wanted[INFO_NAME as usize] {
                    reply(
                        sock,
                        opt,
                        REP_INFO,
                        &[&INFO_NAME.to_be_bytes(), ex.name.as_bytes()],
                    )?;
                }
                if wanted[INFO_DESCRIPTION as usize] && !ex.description.is_empty() {
                    reply(
                        sock,
                        opt,
                        REP_INFO,
                        &[&INFO_DESCRIPTION.to_be_bytes(), ex.description.as_bytes()],
                    )?;
                }
                // Block sizes are always sent: a client that did not ask
                // may ignore them, and we cope with any alignment anyway.
                let (min, pref, max) = block_sizes(ex);
                let mut bs = [0u8; 14];
                bs[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                bs[2..6].copy_from_slice(&min.to_be_bytes());
                bs[6..10].copy_from_slice(&pref.to_be_bytes());
                bs[10..14].copy_from_slice(&max.to_be_bytes());
                reply(sock, opt, REP_INFO, &[&bs])?;
                reply(sock, opt, REP_ACK, &[])?;
                if opt == OPT_GO {
                    let selected = match &meta {
                        Some((n, true))
                            if exports.find(n).is_some_and(|e| Arc::ptr_eq(&e, &found)) =>
                        {
                            Some(BASE_ALLOCATION_ID)
                        }
                        _ => None,
                    };
                    return Ok(Some(Negotiated {
                        export: found,
                        structured,
                        meta_base_allocation: selected,
                    }));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if len != 0 {
                    reply_err(sock, opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data")?;
                    continue;
                }
                structured = true;
                reply(sock, opt, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = opt == OPT_SET_META_CONTEXT;
                if set {
                    meta = None;
                }
                if !structured {
                    reply_err(
                        sock,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    )?;
                    continue;
                }
                let mut c = Cursor::new(&data);
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
                    reply_err(sock, opt, REP_ERR_INVALID, "malformed meta context request")?;
                    continue;
                };
                if exports.find(name).is_none() {
                    reply_err(sock, opt, REP_ERR_UNKNOWN, "no such export")?;
                    continue;
                }
                // SET ignores the bare namespace; LIST treats it (and no
                // query at all) as "everything".
                let chosen = base || (!set && all);
                if chosen {
                    let id = if set { BASE_ALLOCATION_ID } else { 0 };
                    reply(
                        sock,
                        opt,
                        REP_META_CONTEXT,
                        &[&id.to_be_bytes(), META_BASE_ALLOCATION.as_bytes()],
                    )?;
                }
                if set {
                    meta = Some((name.to_vec(), chosen));
                }
                reply(sock, opt, REP_ACK, &[])?;
            }
            _ => {
                // Includes STARTTLS: we run without TLS (NOTLS mode).
                reply_err(sock, opt, REP_ERR_UNSUP, "option not supported by udm")?;
            }
        }
    }
}
