//! Executing one request against a device: block-aligned I/O, split at the
//! device's maximum I/O size, and read-modify-write of partial blocks.
//!
//! The caller (the engine) guarantees the request's widened range is not
//! touched by any conflicting request while this runs, which is what makes
//! the read-modify-write here atomic without a lock of its own.

use crate::core::{BlockDevice, DevError, DevResult, WriteBuf};

use super::{Op, Request};

/// What the engine caches about an export's device, read once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    /// Logical block size, a power of two.
    pub block: u64,
    /// Largest single device call, a multiple of `block`.
    pub max_io: usize,
    pub discard: bool,
}

impl Geometry {
    pub fn of(dev: &dyn BlockDevice) -> Geometry {
        let l = dev.limits();
        let block = u64::from(l.logical_block_size.max(1)).next_power_of_two();
        let max_io = (l.max_io_size as u64 / block * block).max(block) as usize;
        Geometry {
            block,
            max_io,
            discard: l.discard,
        }
    }

    pub fn down(&self, x: u64) -> u64 {
        x & !(self.block - 1)
    }

    pub fn up(&self, x: u64) -> u64 {
        x.saturating_add(self.block - 1) & !(self.block - 1)
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
            size: dev.size(),
        })?;
    if req.len == 0 && req.op != Op::Flush {
        return Ok(());
    }
    match req.op {
        Op::Read => {
            let start = g.down(req.offset);
            let total = (g.up(end) - start) as usize;
            if req.buf.len() != total || req.head as u64 != req.offset - start {
                return Err(DevError::Target(
                    "internal error: read buffer does not match the request".into(),
                ));
            }
            let mut pos = 0;
            while pos < total {
                let n = (total - pos).min(g.max_io);
                dev.read(start + pos as u64, &mut req.buf[pos..pos + n])?;
                pos += n;
            }
            Ok(())
        }
        Op::Write => {
            // The connection laid the payload out over the widened range.
            let start = g.down(req.offset);
            let total = req.buf.len();
            let head = req.head;
            let tail_start = head + req.len as usize;
            let block = g.block as usize;
            if head > 0 || tail_start < total {
                if scratch.len() < block {
                    scratch.resize(block, 0);
                }
                let blk = &mut scratch[..block];
                let mut first_loaded = false;
                if head > 0 {
                    dev.read(start, blk)?;
                    req.buf[..head].copy_from_slice(&blk[..head]);
                    first_loaded = true;
                }
                if tail_start < total {
                    let last = total - block;
                    if !(first_loaded && last == 0) {
                        dev.read(start + last as u64, blk)?;
                    }
                    req.buf[tail_start..].copy_from_slice(&blk[tail_start - last..]);
                }
            }
            let mut pos = 0;
            while pos < total {
                let n = (total - pos).min(g.max_io);
                let last = pos + n == total;
                dev.write(
                    start + pos as u64,
                    WriteBuf::Owned(&mut req.buf[pos..pos + n]),
                    req.fua && last,
                )?;
                pos += n;
            }
            Ok(())
        }
        Op::Flush => dev.flush(),
        Op::Trim => {
            // A hint: only whole blocks inside the range are discarded.
            let s = g.up(req.offset);
            let e = g.down(end);
            if g.discard && s < e {
                dev.discard(s, e - s)?;
                if req.fua {
                    dev.flush()?;
                }
            }
            Ok(())
        }
        Op::WriteZeroes => {
            let s = g.up(req.offset);
            let e = g.down(end);
            if s < e {
                dev.write_zeroes(s, e - s, req.fua)?;
            }
            // Partial blocks at either end: read, zero the part, write.
            let first = g.down(req.offset);
            let last = g.down(end - 1);
            let first_partial = !(req.offset == first && end >= first + g.block);
            let last_partial = last != first && end != last + g.block;
            let block = g.block as usize;
            for (blk_start, partial) in [(first, first_partial), (last, last_partial)] {
                if !partial {
                    continue;
                }
                let zs = req.offset.max(blk_start);
                let ze = end.min(blk_start + g.block);
                if scratch.len() < block {
                    scratch.resize(block, 0);
                }
                let blk = &mut scratch[..block];
                dev.read(blk_start, blk)?;
                blk[(zs - blk_start) as usize..(ze - blk_start) as usize].fill(0);
                dev.write(blk_start, WriteBuf::Owned(blk), req.fua)?;
            }
            Ok(())
        }
    }
}
