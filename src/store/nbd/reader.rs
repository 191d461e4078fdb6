//! The reply reader: one thread per connection reads replies in whatever
//! order the server sends them, matches them to slots by cookie, and
//! reads read data straight into the waiting caller's buffer (no copy in
//! udm). Anything it cannot make sense of ends the connection, which the
//! store then reconnects.

use std::io::{self, Read};

use crate::protocol::be;
use crate::protocol::nbd::{
    ChunkHeader, SimpleReply, EIO, REPLY_FLAG_DONE, REPLY_TYPE_ERROR_BIT, REPLY_TYPE_NONE,
    REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};

use super::slots::{SlotTable, Waiting};

/// Longest error chunk accepted (its message is only logged).
const MAX_ERROR_CHUNK: usize = 64 << 10;

fn recv_error(e: io::Error) -> String {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        "server closed the connection".to_string()
    } else {
        format!("receive failed: {e}")
    }
}

/// Reads replies until the connection ends: `Ok` on a clean close at a
/// reply boundary, else why it broke.
pub fn read_replies(slots: &SlotTable, structured: bool, r: &mut impl Read) -> Result<(), String> {
    loop {
        let mut h = [0u8; 20];
        match r.read(&mut h[..1]) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(recv_error(e)),
        }
        r.read_exact(&mut h[1..4]).map_err(recv_error)?;
        match be::u32_at(&h, 0).unwrap_or(0) {
            SIMPLE_REPLY_MAGIC => {
                let mut s = [0u8; 16];
                s[..4].copy_from_slice(&h[..4]);
                r.read_exact(&mut s[4..]).map_err(recv_error)?;
                simple(slots, structured, SimpleReply::decode(&s), r)?;
            }
            STRUCTURED_REPLY_MAGIC => {
                r.read_exact(&mut h[4..]).map_err(recv_error)?;
                chunk(slots, ChunkHeader::decode(&h), r)?;
            }
            m => return Err(format!("bad reply magic {m:#x}")),
        }
    }
}

fn simple(
    slots: &SlotTable,
    structured: bool,
    rep: SimpleReply,
    r: &mut impl Read,
) -> Result<(), String> {
    let w = slots.waiting(rep.cookie)?;
    if w.is_read && rep.error == 0 {
        if structured {
            return Err("simple reply with data after structured replies were agreed".into());
        }
        slots.fill(r, w.index, 0, w.len).map_err(recv_error)?;
    }
    slots.finish(w.index, rep.error);
    Ok(())
}

fn chunk(slots: &SlotTable, c: ChunkHeader, r: &mut impl Read) -> Result<(), String> {
    let w = slots.waiting(c.cookie)?;
    let plen = c.len as usize;
    match c.ty {
        REPLY_TYPE_NONE if plen == 0 => {}
        REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => read_chunk(slots, &w, c.ty, plen, r)?,
        t if t & REPLY_TYPE_ERROR_BIT != 0 && plen >= 6 => {
            if plen > MAX_ERROR_CHUNK {
                return Err(format!("error chunk of {plen} bytes"));
            }
            let mut b = vec![0u8; plen];
            r.read_exact(&mut b).map_err(recv_error)?;
            // A zero error in an error chunk is a server bug; still an error.
            let errno = be::u32_at(&b, 0).unwrap_or(EIO).max(EIO);
            let mlen = usize::from(be::u16_at(&b, 4).unwrap_or(0));
            let msg = String::from_utf8_lossy(b.get(6..6 + mlen).unwrap_or(&[]));
            tracing::debug!("NBD server error {errno} for cookie {:#x}: {msg}", c.cookie);
            slots.note_error(w.index, errno);
        }
        t => return Err(format!("unknown reply chunk type {t} ({plen} bytes)")),
    }
    if c.flags & REPLY_FLAG_DONE != 0 {
        slots.finish_chunks(w.index, 0);
    }
    Ok(())
}

/// A data or hole chunk of a read: checked to lie inside the request.
fn read_chunk(
    slots: &SlotTable,
    w: &Waiting,
    ty: u16,
    plen: usize,
    r: &mut impl Read,
) -> Result<(), String> {
    if plen < 8 || (ty == REPLY_TYPE_OFFSET_HOLE && plen != 12) {
        return Err(format!("bad chunk length {plen}"));
    }
    let mut b = [0u8; 12];
    let head = if ty == REPLY_TYPE_OFFSET_DATA { 8 } else { 12 };
    r.read_exact(&mut b[..head]).map_err(recv_error)?;
    let off = be::u64_at(&b, 0).unwrap_or(0);
    let n = if ty == REPLY_TYPE_OFFSET_DATA {
        plen - 8
    } else {
        be::u32_at(&b, 8).unwrap_or(0) as usize
    };
    let (base, len) = (w.offset, w.len);
    let at = match off.checked_sub(base).map(|a| a as usize) {
        Some(a) if a <= len && n <= len - a => a,
        _ => {
            return Err(format!(
                "read chunk [{off}, +{n}) outside the request [{base}, +{len})"
            ))
        }
    };
    slots.cover(w.index, at, n)?;
    if ty == REPLY_TYPE_OFFSET_DATA {
        slots.fill(r, w.index, at, n).map_err(recv_error)
    } else {
        slots.zero(w.index, at, n).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::nbd::{chunk_header, simple_reply, REPLY_TYPE_ERROR};
    use crate::store::nbd::slots::Outcome;

    #[test]
    fn data_hole_and_error_chunks_land_in_the_right_request() {
        let slots = SlotTable::new();
        let mut buf = [9u8; 8];
        let (i, read) = slots.take(100, Some(&mut buf)).unwrap();
        let (j, flush) = slots.take(0, None).unwrap();
        let mut wire = Vec::new();
        wire.extend_from_slice(&chunk_header(0, REPLY_TYPE_OFFSET_DATA, read, 12));
        wire.extend_from_slice(&100u64.to_be_bytes());
        wire.extend_from_slice(&[1, 2, 3, 4]);
        wire.extend_from_slice(&chunk_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_HOLE,
            read,
            12,
        ));
        wire.extend_from_slice(&104u64.to_be_bytes());
        wire.extend_from_slice(&4u32.to_be_bytes());
        wire.extend_from_slice(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, flush, 6));
        wire.extend_from_slice(&[0, 0, 0, 28, 0, 0]);
        read_replies(&slots, true, &mut wire.as_slice()).unwrap();
        assert_eq!(slots.wait(i).0, Outcome::Done(0));
        assert_eq!(slots.wait(j).0, Outcome::Done(28));
        assert_eq!(buf, [1, 2, 3, 4, 0, 0, 0, 0]);
    }

    #[test]
    fn hostile_replies_end_the_connection_instead_of_panicking() {
        let slots = SlotTable::new();
        let mut buf = [0u8; 8];
        let (_, read) = slots.take(100, Some(&mut buf)).unwrap();
        let mut outside = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, read, 16).to_vec();
        outside.extend_from_slice(&104u64.to_be_bytes());
        let err = read_replies(&slots, true, &mut outside.as_slice()).unwrap_err();
        assert!(err.contains("outside the request"), "{err}");
        let unknown = simple_reply(0, 0xdead_0000);
        let err = read_replies(&slots, true, &mut unknown.as_slice()).unwrap_err();
        assert!(err.contains("unknown cookie"), "{err}");
        let short = &simple_reply(0, read)[..9];
        let err = read_replies(&slots, true, &mut &short[..]).unwrap_err();
        assert_eq!(err, "server closed the connection");
        let err = read_replies(&slots, true, &mut &[1u8, 2, 3, 4][..]).unwrap_err();
        assert!(err.contains("bad reply magic"), "{err}");
    }

    /// A read's chunks, as (type, offset, data-or-hole length), then DONE
    /// with no payload: what a hostile upstream sends.
    fn read_reply(cookie: u64, chunks: &[(u16, u64, usize)]) -> Vec<u8> {
        let mut wire = Vec::new();
        for &(ty, off, n) in chunks {
            if ty == REPLY_TYPE_OFFSET_DATA {
                wire.extend_from_slice(&chunk_header(0, ty, cookie, 8 + n as u32));
                wire.extend_from_slice(&off.to_be_bytes());
                wire.extend(std::iter::repeat_n(7u8, n));
            } else {
                wire.extend_from_slice(&chunk_header(0, ty, cookie, 12));
                wire.extend_from_slice(&off.to_be_bytes());
                wire.extend_from_slice(&(n as u32).to_be_bytes());
            }
        }
        wire.extend_from_slice(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0));
        wire
    }

    #[test]
    fn a_read_whose_chunks_miss_part_of_the_range_fails_with_eio() {
        let cases: [&[(u16, u64, usize)]; 3] = [
            &[],
            &[(REPLY_TYPE_OFFSET_DATA, 100, 4)],
            &[
                (REPLY_TYPE_OFFSET_HOLE, 100, 2),
                (REPLY_TYPE_OFFSET_DATA, 104, 4),
            ],
        ];
        for chunks in cases {
            let slots = SlotTable::new();
            let mut buf = [9u8; 8];
            let (i, read) = slots.take(100, Some(&mut buf)).unwrap();
            read_replies(&slots, true, &mut read_reply(read, chunks).as_slice()).unwrap();
            assert_eq!(slots.wait(i).0, Outcome::Done(EIO), "{chunks:?}");
        }
        // Covered in full, out of order: success.
        let slots = SlotTable::new();
        let mut buf = [9u8; 8];
        let (i, read) = slots.take(100, Some(&mut buf)).unwrap();
        let full = [
            (REPLY_TYPE_OFFSET_DATA, 104, 4),
            (REPLY_TYPE_OFFSET_HOLE, 100, 4),
        ];
        read_replies(&slots, true, &mut read_reply(read, &full).as_slice()).unwrap();
        assert_eq!(slots.wait(i).0, Outcome::Done(0));
        assert_eq!(buf, [0, 0, 0, 0, 7, 7, 7, 7]);
    }

    #[test]
    fn overlapping_or_empty_read_chunks_end_the_connection() {
        let bad: [&[(u16, u64, usize)]; 3] = [
            &[
                (REPLY_TYPE_OFFSET_DATA, 100, 8),
                (REPLY_TYPE_OFFSET_HOLE, 104, 4),
            ],
            &[
                (REPLY_TYPE_OFFSET_DATA, 104, 4),
                (REPLY_TYPE_OFFSET_DATA, 102, 4),
            ],
            &[(REPLY_TYPE_OFFSET_HOLE, 100, 0)],
        ];
        for chunks in bad {
            let slots = SlotTable::new();
            let mut buf = [9u8; 8];
            let (_, read) = slots.take(100, Some(&mut buf)).unwrap();
            let err =
                read_replies(&slots, true, &mut read_reply(read, chunks).as_slice()).unwrap_err();
            assert!(err.contains("read chunk"), "{chunks:?}: {err}");
        }
    }
}
