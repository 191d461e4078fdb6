//! Executing one request against a device: block-aligned I/O, split at the
//! device's maximum I/O size, and read-modify-write of partial blocks.
//!
//! The caller (the engine) guarantees the request's widened range is not
//! touched by any conflicting request while this runs, which is what makes
//! the read-modify-write here atomic without a lock of its own.

use crate::core::{BlockDevice, DevError, DevResult, Extent, WriteBuf};

use super::request::{Op, Request, LEND_MIN};

/// Reads from this size up are offered to the device's `lend`:
/// [`LEND_MIN`], or `UDM_LEND_MIN` (bytes; `off` never lends), read once,
/// for benchmarks that compare both paths in one run and for tests that
/// run the suite's reads over both.
fn lend_min() -> u64 {
    static MIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| match std::env::var("UDM_LEND_MIN") {
        Ok(v) if v == "off" => u64::MAX,
        Ok(v) => v.parse().unwrap_or(LEND_MIN).max(1),
        Err(_) => LEND_MIN,
    })
}

/// Whether `req` is a read worth offering to `dev`'s `lend`, to a sink
/// that takes lent bytes.
pub(crate) fn lendable(dev: &dyn BlockDevice, req: &Request) -> bool {
    req.op == Op::Read && req.len >= lend_min() && req.sink.takes_lent() && dev.lends()
}

/// Answer a read from bytes the device lends where they lie (see
/// [`crate::core::BlockDevice::lend`]): `true` when it did (the sink has
/// completed the request), `false` when the device would not (nothing
/// happened; read it as usual).
pub(crate) fn lend(dev: &dyn BlockDevice, g: &Geometry, req: &mut Request) -> bool {
    if !lendable(dev, req) || req.buf.len() > g.max_io {
        return false;
    }
    let start = g.down(req.offset);
    let total = req.buf.len();
    if req.head as u64 != req.offset - start {
        return false;
    }
    let sink = req.sink.clone();
    dev.lend(start, total, &mut |data| sink.complete_lent(req, data))
}

/// What the engine caches about an export's device, read once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    /// Logical block size, a power of two.
    pub block: u64,
    /// Largest single device call, a multiple of `block`.
    pub max_io: usize,
    pub discard: bool,
    /// Device size; a device whose size is not a multiple of `block` has a
    /// short last block, and widened ranges stop at the end of the device.
    pub size: u64,
    /// The size was a whole number of blocks. Then there is no short last
    /// block whatever the size becomes later: a device reloaded with a
    /// bigger table (dm's live reload) keeps whole blocks, and requests of
    /// clients that saw the new size must not be clipped at the old one.
    pub whole: bool,
    /// Requests the device wants in flight ([`crate::core::Limits::queue_depth`]);
    /// 0 for a device that completes in the caller's time.
    pub depth: u32,
}

impl Geometry {
    pub fn of(dev: &dyn BlockDevice) -> Geometry {
        let l = dev.limits();
        let block = u64::from(l.logical_block_size.max(1)).next_power_of_two();
        let max_io = (l.max_io_size as u64 / block * block).max(block) as usize;
        let size = dev.size();
        Geometry {
            block,
            max_io,
            discard: l.discard,
            size,
            whole: size % block == 0,
            depth: l.queue_depth,
        }
    }

    pub fn down(&self, x: u64) -> u64 {
        x & !(self.block - 1)
    }

    pub fn up(&self, x: u64) -> u64 {
        x.saturating_add(self.block - 1) & !(self.block - 1)
    }

    /// End of the block-widened range for a request ending at `end`.
    pub fn widened_end(&self, end: u64) -> u64 {
        if self.whole {
            return self.up(end);
        }
        self.up(end).min(self.size.max(end))
    }

    /// Length of the block starting at `start` (short at the device end).
    fn block_len(&self, start: u64) -> usize {
        if self.whole {
            return self.block as usize;
        }
        self.block.min(self.size.saturating_sub(start)).max(1) as usize
    }
}

/// Run `req` on `dev`. Data requests carry a buffer laid out over the
/// block-widened range ([`super::Engine::buffer`]); a read fills it so that
/// the client's bytes are `req.buf[req.head..req.head + req.len]`.
pub(crate) fn execute(
    dev: &dyn BlockDevice,
    g: &Geometry,
    req: &mut Request,
    scratch: &mut Vec<u8>,
) -> DevResult<()> {
    let end = req
        .offset
        .checked_add(req.len)
        .ok_or(DevError::OutOfRange {
            offset: req.offset,
            len: req.len,
            size: g.size,
        })?;
    if req.len == 0 && req.op != Op::Flush {
        return Ok(());
    }
    if scratch.len() < g.block as usize {
        scratch.resize(g.block as usize, 0);
    }
    match req.op {
        Op::Read | Op::Write => {
            let start = g.down(req.offset);
            let total = (g.widened_end(end) - start) as usize;
            if req.buf.len() != total || req.head as u64 != req.offset - start {
                return Err(DevError::Target(
                    "internal error: request buffer does not match the request".into(),
                ));
            }
            if req.op == Op::Write {
                fill_partial_blocks(dev, g, req, start, scratch)?;
            }
            let mut pos = 0;
            while pos < total {
                let n = (total - pos).min(g.max_io);
                let at = start + pos as u64;
                let chunk = &mut req.buf[pos..pos + n];
                if req.op == Op::Read {
                    dev.read(at, chunk)?;
                } else {
                    // FUA on every piece: with a striped device each piece
                    // may land on a different leg.
                    dev.write(at, WriteBuf::Owned(chunk), req.fua)?;
                }
                pos += n;
            }
            Ok(())
        }
        Op::Extents { max } => extents(dev, req, max as usize),
        Op::Flush => dev.flush(),
        Op::Trim => {
            // A hint: only whole blocks inside the range are discarded.
            let s = g.up(req.offset);
            let e = if end == g.size && !g.whole {
                end
            } else {
                g.down(end)
            };
            if g.discard && s < e {
                dev.discard(s, e - s)?;
                if req.fua {
                    dev.flush()?;
                }
            }
            Ok(())
        }
        Op::WriteZeroes => write_zeroes(dev, g, req, end, scratch),
    }
}

/// Zero `[req.offset, end)`: the device's own write-zeroes for whole
/// blocks, read-modify-write for partial ones at either end.
fn write_zeroes(
    dev: &dyn BlockDevice,
    g: &Geometry,
    req: &Request,
    end: u64,
    scratch: &mut [u8],
) -> DevResult<()> {
    let first = g.down(req.offset);
    let last = g.down(end - 1);
    let covers = |b: u64| req.offset <= b && end >= b + g.block_len(b) as u64;
    // Whole blocks in the middle: the device's own write-zeroes.
    let s = if covers(first) {
        first
    } else {
        first + g.block
    };
    let e = if covers(last) {
        end.max(last + g.block_len(last) as u64)
    } else {
        last
    };
    if s < e {
        dev.write_zeroes(s, e - s, req.fua)?;
    }
    // Partial blocks at either end: read, zero the part, write.
    for b in [first, last] {
        if covers(b) || (b == last && last == first && b != first) {
            continue;
        }
        let blen = g.block_len(b);
        let blk = &mut scratch[..blen];
        dev.read(b, blk)?;
        let zs = (req.offset.max(b) - b) as usize;
        let ze = (end.min(b + blen as u64) - b) as usize;
        blk[zs..ze].fill(0);
        dev.write(b, WriteBuf::Owned(blk), req.fua)?;
        if first == last {
            break;
        }
    }
    Ok(())
}

/// The extents of `req`'s range into `req.extents`: at most `max` (at
/// least one), adjacent ones of the same kind merged (a striped device
/// reports one per chunk), one data extent for the whole range when the
/// device reports none.
fn extents(dev: &dyn BlockDevice, req: &mut Request, max: usize) -> DevResult<()> {
    let max = max.max(1);
    let out = &mut req.extents;
    out.clear();
    let mut run: Option<Extent> = None;
    crate::core::extents_of(dev, req.offset, req.len, &mut |e| match &mut run {
        Some(r) if r.hole == e.hole && r.zero == e.zero => {
            r.len += e.len;
            true
        }
        _ => {
            if let Some(r) = run.take() {
                out.push(r);
            }
            run = Some(e);
            out.len() < max
        }
    })?;
    if let Some(r) = run {
        if out.len() < max {
            out.push(r);
        }
    }
    if out.is_empty() {
        out.push(Extent::data(req.len));
    }
    Ok(())
}

/// Complete the head and tail blocks of a write that does not cover them
/// with the device's current bytes (the client's bytes are already in
/// place at `req.head`).
fn fill_partial_blocks(
    dev: &dyn BlockDevice,
    g: &Geometry,
    req: &mut Request,
    start: u64,
    scratch: &mut [u8],
) -> DevResult<()> {
    let total = req.buf.len();
    let head = req.head;
    let tail_start = head + req.len as usize;
    let mut first_loaded = None;
    if head > 0 {
        let blen = g.block_len(start);
        dev.read(start, &mut scratch[..blen])?;
        req.buf[..head].copy_from_slice(&scratch[..head]);
        first_loaded = Some(blen);
    }
    if tail_start < total {
        let last = g.down(start + total as u64 - 1) - start;
        let blen = total - last as usize;
        if !(last == 0 && first_loaded == Some(blen)) {
            dev.read(start + last, &mut scratch[..blen])?;
        }
        let from = tail_start - last as usize;
        req.buf[tail_start..].copy_from_slice(&scratch[from..blen]);
    }
    Ok(())
}
