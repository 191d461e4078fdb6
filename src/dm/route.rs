//! Routing a request over a device's ranges: the hot path of every mapped
//! device. A [`Routes`] is a sorted list of byte ranges, each sent to a
//! device at an offset (`shift`). A table's segments are routes to their
//! targets (shift 0); a compiled stack (see `flat`) has routes straight
//! to the stores and to the targets that transform data, with the linear
//! layers in between folded into the shifts.
//!
//! A request is cut exactly at route boundaries, as dm core cuts a bio
//! with its clones — but without cloning: each piece is a sub-slice of the
//! caller's buffer, so routing costs a binary search and no allocation.
//!
//! Direct access (see [`crate::core::device::Transform`]) is forwarded when
//! every route's device offers it and the request lies inside one route
//! (the common case, and the only one where forwarding is free); a request
//! that crosses a boundary takes the generic path, because a boundary need
//! not fall on a whole unit of the transform.

use std::sync::Arc;

use crate::core::device::{read_transformed_by_reading, write_transformed_by_writing, Transform};
use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Limits, WriteBuf};

/// `[start, start+len)` of the mapped device is `[shift, shift+len)` of `dev`.
#[derive(Clone)]
pub struct Route {
    pub start: u64,
    pub len: u64,
    pub dev: Arc<dyn BlockDevice>,
    pub shift: u64,
}

/// Contiguous routes from 0, with the limits of the device they form.
pub struct Routes {
    routes: Vec<Route>,
    size: u64,
    limits: Limits,
    /// Every route offers direct access (fixed at construction).
    direct: bool,
    /// Every route's device takes asynchronous submissions (fixed at
    /// construction).
    submit: bool,
}

impl Routes {
    /// `routes` must be contiguous from 0; `limits` are the device's (the
    /// stacked limits of the table they came from).
    pub fn new(routes: Vec<Route>, limits: Limits) -> Routes {
        debug_assert!(routes
            .windows(2)
            .all(|w| w[0].start + w[0].len == w[1].start));
        let size = routes.last().map(|r| r.start + r.len).unwrap_or(0);
        let direct = !routes.is_empty() && routes.iter().all(|r| r.dev.direct_access());
        let submit = !routes.is_empty() && routes.iter().all(|r| r.dev.can_submit());
        Routes {
            routes,
            size,
            limits,
            direct,
            submit,
        }
    }

    /// A device of `size` bytes on which every request fails: the table
    /// of a device removed with `--force`, as dm swaps in an error table.
    pub fn failing(size: u64, limits: Limits) -> Routes {
        Routes {
            routes: Vec::new(),
            size,
            limits,
            direct: false,
            submit: false,
        }
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The routes covering `[offset, offset+len)`, cut to that range and
    /// re-based so the range starts at `at`.
    pub fn slice(&self, offset: u64, len: u64, at: u64) -> Vec<Route> {
        let mut out = Vec::new();
        if len == 0 {
            return out;
        }
        let end = offset + len;
        let mut i = self.find(offset);
        while let Some(r) = self.routes.get(i) {
            if r.start >= end {
                break;
            }
            let s = r.start.max(offset);
            let e = (r.start + r.len).min(end);
            out.push(Route {
                start: at + (s - offset),
                len: e - s,
                dev: r.dev.clone(),
                shift: r.shift + (s - r.start),
            });
            i += 1;
        }
        out
    }

    #[inline]
    fn check(&self, offset: u64, len: u64) -> DevResult<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(DevError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        Ok(())
    }

    /// Index of the route containing byte `offset` (< size).
    #[inline]
    fn find(&self, offset: u64) -> usize {
        if self.routes.len() == 1 {
            return 0;
        }
        self.routes.partition_point(|r| r.start + r.len <= offset)
    }

    /// The route holding all of `[offset, offset+len)`, if one does.
    #[inline]
    fn within(&self, offset: u64, len: u64) -> Option<&Route> {
        let r = self.routes.get(self.find(offset))?;
        (offset + len <= r.start + r.len).then_some(r)
    }

    /// Visit the pieces of `[offset, offset+len)`, one per route:
    /// `f(route, offset_on_route_device, piece_len)`.
    #[inline]
    fn for_each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&Route, u64, u64) -> DevResult<()>,
    ) -> DevResult<()> {
        self.check(offset, len)?;
        if len > 0 && self.routes.is_empty() {
            return Err(gone());
        }
        let mut pos = offset;
        let end = offset + len;
        let mut i = self.find(offset);
        while pos < end {
            let r = &self.routes[i];
            let n = (r.start + r.len).min(end) - pos;
            f(r, pos - r.start + r.shift, n)?;
            pos += n;
            i += 1;
        }
        Ok(())
    }
}

fn gone() -> DevError {
    DevError::Target("the device was removed with --force: every request fails".into())
}

impl BlockDevice for Routes {
    fn size(&self) -> u64 {
        self.size
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        // Fast path: inside one route (the common case).
        if let Some(r) = self.within(offset, buf.len() as u64) {
            return r.dev.read(offset - r.start + r.shift, buf);
        }
        let mut rest = buf;
        self.for_each_piece(offset, rest.len() as u64, |r, off, n| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n as usize);
            rest = tail;
            r.dev.read(off, head)
        })
    }

    #[inline]
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.check(offset, data.len() as u64)?;
        if let Some(r) = self.within(offset, data.len() as u64) {
            return r.dev.write(offset - r.start + r.shift, data, fua);
        }
        let mut rest = Some(data);
        self.for_each_piece(
            offset,
            rest.as_ref().map_or(0, |d| d.len()) as u64,
            |r, off, n| {
                let (head, tail) = rest
                    .take()
                    .expect("piece within request")
                    .split_at(n as usize);
                rest = Some(tail);
                r.dev.write(off, head, fua)
            },
        )
    }

    fn direct_access(&self) -> bool {
        self.direct
    }

    fn can_submit(&self) -> bool {
        self.submit
    }

    /// Forwarded when the request lies inside one route (as direct
    /// access); one that crosses a boundary is declined and runs the
    /// synchronous way, which cuts it.
    unsafe fn submit(&self, io: AsyncIo) {
        if self.check(io.offset, io.len as u64).is_err() {
            return io.decline();
        }
        match self.within(io.offset, io.len as u64) {
            Some(r) if self.submit => {
                let at = io.offset - r.start + r.shift;
                // SAFETY: the caller's guarantee on the buffer is passed on.
                unsafe { r.dev.submit(io.at(at)) }
            }
            _ => io.decline(),
        }
    }

    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        if let Some(r) = self.within(offset, buf.len() as u64) {
            return r.dev.read_transformed(offset - r.start + r.shift, buf, t);
        }
        read_transformed_by_reading(self, offset, buf, t)
    }

    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.check(offset, src.len() as u64)?;
        if let Some(r) = self.within(offset, src.len() as u64) {
            return r
                .dev
                .write_transformed(offset - r.start + r.shift, src, fua, t);
        }
        write_transformed_by_writing(self, offset, src, fua, t)
    }

    fn flush(&self) -> DevResult<()> {
        // Each distinct device once: a striped table's legs appear in one
        // route, a compiled stack may route many ranges to one file.
        let mut seen: Vec<*const u8> = Vec::new();
        for r in &self.routes {
            let p = Arc::as_ptr(&r.dev) as *const u8;
            if seen.contains(&p) {
                continue;
            }
            seen.push(p);
            r.dev.flush()?;
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.for_each_piece(offset, len, |r, off, n| r.dev.discard(off, n))
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.for_each_piece(offset, len, |r, off, n| r.dev.write_zeroes(off, n, fua))
    }

    /// Each route's piece asks its device, in order (a flattened stack
    /// asks the bottom devices directly).
    fn extents(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(crate::core::Extent) -> bool,
    ) -> DevResult<()> {
        let mut more = true;
        self.for_each_piece(offset, len, |r, off, n| {
            if more {
                more = crate::core::extents_of(r.dev.as_ref(), off, n, out)?;
            }
            Ok(())
        })
    }
}
