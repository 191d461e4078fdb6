//! Request validation: every check of a request against its export that
//! needs no device access, so a bad request never costs a worker; the
//! answers that need no device are sent here.

use std::io;
use std::sync::atomic::Ordering;

use super::super::proto::*;
use super::reply::Conn;

pub(super) fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// What validation needs to know about the export, read once when the
/// session enters transmission.
pub(super) struct ExportView {
    pub size: u64,
    pub read_only: bool,
    /// The device zeroes without writing every byte (FAST_ZERO possible).
    pub fast_zero: bool,
    /// The largest payload the export accepts (its advertised maximum).
    pub max_payload: u64,
    /// Context id of `base:allocation`, if the client negotiated it.
    pub meta: Option<u32>,
}

pub(super) enum Checked {
    /// Answered here (an error or a no-op).
    Done,
    /// Refused with this error, sent once its payload is skipped.
    Skip(u64, u32),
    /// Valid: admit and run it.
    Admit,
    Disconnect,
}

/// Check a request against the export; answer what needs no device.
pub(super) fn check(tx: &ExportView, conn: &Conn, h: &RequestHeader) -> io::Result<Checked> {
    let len = u64::from(h.len);
    let in_range = h.offset.checked_add(len).is_some_and(|e| e <= tx.size);
    let bad_flags = |allowed: u16| h.flags & !allowed != 0;
    Ok(match h.cmd {
        CMD_READ => check_read(tx, conn, h, in_range),
        CMD_WRITE => check_write(tx, conn, h, in_range)?,
        CMD_DISC => Checked::Disconnect,
        CMD_FLUSH => {
            if bad_flags(CMD_FLAG_FUA) || h.offset != 0 || len != 0 {
                conn.send_error(h.cookie, EINVAL, false, "");
                Checked::Done
            } else {
                Checked::Admit
            }
        }
        CMD_TRIM | CMD_WRITE_ZEROES => check_trim_zero(tx, conn, h, in_range),
        CMD_CACHE => {
            // A prefetch hint; with no cache of our own there is
            // nothing to do beyond checking the request.
            if bad_flags(CMD_FLAG_FUA) || !in_range {
                conn.send_error(h.cookie, EINVAL, false, "");
            } else {
                conn.send_ok(h.cookie);
            }
            Checked::Done
        }
        CMD_BLOCK_STATUS
            if tx.meta.is_some()
                && !bad_flags(CMD_FLAG_FUA | CMD_FLAG_REQ_ONE)
                && in_range
                && len > 0 =>
        {
            Checked::Admit
        }
        _ => {
            conn.send_error(h.cookie, EINVAL, false, "");
            Checked::Done
        }
    })
}

fn check_read(tx: &ExportView, conn: &Conn, h: &RequestHeader, in_range: bool) -> Checked {
    let len = u64::from(h.len);
    let df = if conn.structured.load(Ordering::Relaxed) {
        CMD_FLAG_DF
    } else {
        0
    };
    let err = if h.flags & !(CMD_FLAG_FUA | df) != 0 {
        Some((EINVAL, "unsupported flags on READ"))
    } else if h.len > MAX_PAYLOAD {
        Some((EINVAL, "READ larger than the 32 MiB maximum"))
    } else if len > tx.max_payload {
        Some((
            EINVAL,
            "READ larger than the export's advertised maximum block size \
             (its memory budget is small: raise --memory-budget)",
        ))
    } else if !in_range {
        Some((EINVAL, "READ beyond the end of the export"))
    } else {
        None
    };
    if let Some((e, msg)) = err {
        conn.send_error(h.cookie, e, true, msg);
        Checked::Done
    } else if len == 0 {
        conn.send_read(h.cookie, h.offset, None);
        Checked::Done
    } else {
        Checked::Admit
    }
}

fn check_write(
    tx: &ExportView,
    conn: &Conn,
    h: &RequestHeader,
    in_range: bool,
) -> io::Result<Checked> {
    let len = u64::from(h.len);
    if h.len > MAX_DISCARDED_PAYLOAD {
        return Err(invalid("absurd WRITE length"));
    }
    let err = if h.flags & !CMD_FLAG_FUA != 0 {
        Some(EINVAL)
    } else if tx.read_only {
        Some(EPERM)
    } else if h.len > MAX_PAYLOAD || len > tx.max_payload {
        Some(EINVAL)
    } else if !in_range {
        Some(ENOSPC)
    } else {
        None
    };
    Ok(if let Some(e) = err {
        // The payload is already on the wire: consume it so the stream
        // stays in sync, then refuse the request.
        Checked::Skip(len, e)
    } else if len == 0 {
        conn.send_ok(h.cookie);
        Checked::Done
    } else {
        Checked::Admit
    })
}

fn check_trim_zero(tx: &ExportView, conn: &Conn, h: &RequestHeader, in_range: bool) -> Checked {
    let zero = h.cmd == CMD_WRITE_ZEROES;
    let allowed = if zero {
        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
    } else {
        CMD_FLAG_FUA
    };
    let err = if h.flags & !allowed != 0 {
        Some(EINVAL)
    } else if tx.read_only {
        Some(EPERM)
    } else if !in_range {
        Some(if zero { ENOSPC } else { EINVAL })
    } else if zero && h.flags & CMD_FLAG_FAST_ZERO != 0 && !tx.fast_zero {
        Some(ENOTSUP)
    } else {
        None
    };
    if let Some(e) = err {
        conn.send_error(h.cookie, e, false, "");
        Checked::Done
    } else if h.len == 0 {
        conn.send_ok(h.cookie);
        Checked::Done
    } else {
        Checked::Admit
    }
}
