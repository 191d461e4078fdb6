//! Routing a request over a device's ranges: the hot path of every mapped
//! device. A [`Routes`] is a sorted list of byte ranges, each sent to a
//! device at an offset (`shift`). A table's segments are routes to their
//! targets (shift 0); a compiled stack (see `mapper::compile`) has routes straight
//! to the stores and to the targets that transform data, with the linear
//! layers in between folded into the shifts.
//!
//! A request is cut exactly at route boundaries, and inside a route at
//! the multiples of the I/O boundary its device declares
//! ([`Limits::io_boundary`], dm's `max_io_len`: a striped target's chunk),
//! as dm core cuts a bio with its clones — but without cloning: each piece
//! is a sub-slice of the caller's buffer, so routing costs a binary search
//! and no allocation. This is the one place requests are cut for a
//! target's sake; a target maps pieces that never cross its boundary.
//!
//! Direct access (see [`crate::core::device::Transform`]) is forwarded when
//! every route's device offers it and the request is one piece (the common
//! case, and the only one where forwarding is free); a request that must be
//! cut takes the generic path, because a boundary need not fall on a whole
//! unit of the transform.
//!
//! Because a compiled stack skips the devices it folds, their failure
//! (`core::fault`) cannot stop a request on its way through them: the
//! routes carry the [`Fault`] of every device they were compiled over
//! instead ([`Routes::lower`]), and the live device checks them before
//! routing, as a kernel dm device over an errored dm device gets its
//! errors.

use std::sync::Arc;

use crate::core::device::{read_transformed_by_reading, write_transformed_by_writing, Transform};
use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Fault, Lent, Limits, WriteBuf};

/// `[start, start+len)` of the mapped device is `[shift, shift+len)` of `dev`.
#[derive(Clone)]
pub struct Route {
    pub start: u64,
    pub len: u64,
    pub dev: Arc<dyn BlockDevice>,
    pub shift: u64,
}

/// A udm device these routes were compiled over (named in the table, or
/// under one that is), by the name it had then.
#[derive(Clone)]
pub struct Lower {
    pub name: Arc<str>,
    pub fault: Arc<Fault>,
}

/// Contiguous routes from 0, with the limits of the device they form.
pub struct Routes {
    routes: Vec<Route>,
    /// The devices compiled into these routes, transitively, once each:
    /// usually none, a handful for a deep stack.
    lower: Box<[Lower]>,
    /// Each route's device's [`Limits::io_boundary`] (0: none), read once
    /// here so a request does not ask its device.
    bounds: Vec<u64>,
    size: u64,
    limits: Limits,
    /// Every route offers direct access (fixed at construction).
    direct: bool,
    /// Every route's device takes asynchronous submissions (fixed at
    /// construction).
    submit: bool,
    /// Every route's device runs a write's deferred step itself.
    prepare: bool,
    /// Some route's device lends (fixed at construction).
    lends: bool,
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
        let prepare = submit && routes.iter().all(|r| r.dev.takes_prepare());
        let lends = routes.iter().any(|r| r.dev.lends());
        let bounds = routes.iter().map(|r| r.dev.limits().io_boundary).collect();
        Routes {
            routes,
            lower: Box::default(),
            bounds,
            size,
            limits,
            direct,
            submit,
            prepare,
            lends,
        }
    }

    /// The same routes, failing while any device of `lower` has failed.
    pub fn over(mut self, lower: Vec<Lower>) -> Routes {
        self.lower = lower.into_boxed_slice();
        self
    }

    /// The devices these routes were compiled over.
    pub fn lower(&self) -> &[Lower] {
        &self.lower
    }

    /// The first device under these routes that has failed.
    pub fn failed_lower(&self) -> Option<&Lower> {
        self.lower.iter().find(|l| l.fault.is_failed())
    }

    /// `Ok` while every device under these routes works: one load of a
    /// flag written once per device, so nothing here is written by the
    /// cores that read it.
    #[inline]
    pub fn check_lower(&self) -> DevResult<()> {
        match self.lower.iter().any(|l| l.fault.is_failed()) {
            false => Ok(()),
            true => Err(self.lower_error()),
        }
    }

    /// The error (EIO) of a request over a failed device: it names the
    /// device and its reason, so the cause is found from the device the
    /// client uses.
    #[cold]
    fn lower_error(&self) -> DevError {
        let Some(l) = self.failed_lower() else {
            return DevError::Target("a device under this one has failed".into());
        };
        DevError::Target(format!(
            "device '{}' under this one has failed ({}); remove this device and '{}', fix the \
             cause and create them again",
            l.name,
            l.fault.reason().unwrap_or("unknown reason"),
            l.name
        ))
    }

    /// A device of `size` bytes on which every request fails: the table
    /// of a device removed with `--force`, as dm swaps in an error table.
    pub fn failing(size: u64, limits: Limits) -> Routes {
        Routes {
            routes: Vec::new(),
            lower: Box::default(),
            bounds: Vec::new(),
            size,
            limits,
            direct: false,
            submit: false,
            prepare: false,
            lends: false,
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

    /// The route that takes all of `[offset, offset+len)` in one call, and
    /// the offset on its device: the range lies inside the route and
    /// crosses no I/O boundary of its device. `None`: it must be cut.
    #[inline]
    fn whole(&self, offset: u64, len: u64) -> Option<(&Route, u64)> {
        let i = self.find(offset);
        let r = self.routes.get(i)?;
        if offset + len > r.start + r.len {
            return None;
        }
        let at = offset - r.start + r.shift;
        let b = self.bounds[i];
        if b != 0 && len > 0 && at / b != (at + len - 1) / b {
            return None;
        }
        Some((r, at))
    }

    /// Visit the pieces of `[offset, offset+len)`, cut at route boundaries
    /// and at the I/O boundaries of each route's device:
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
            let route_end = (r.start + r.len).min(end);
            let b = self.bounds[i];
            while pos < route_end {
                let at = pos - r.start + r.shift;
                let mut n = route_end - pos;
                if b != 0 {
                    n = n.min(b - at % b);
                }
                f(r, at, n)?;
                pos += n;
            }
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
        // Fast path: one piece (the common case).
        if let Some((r, at)) = self.whole(offset, buf.len() as u64) {
            return r.dev.read(at, buf);
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
        if let Some((r, at)) = self.whole(offset, data.len() as u64) {
            return r.dev.write(at, data, fua);
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

    fn takes_prepare(&self) -> bool {
        self.prepare
    }

    /// Asked of the one route that holds the whole range; a range that
    /// would be cut is not.
    fn resident(&self, offset: u64, len: usize) -> bool {
        self.check(offset, len as u64).is_ok()
            && self
                .whole(offset, len as u64)
                .is_some_and(|(r, at)| r.dev.resident(at, len))
    }

    /// As `resident`: the one route that holds the whole range.
    fn resident_for_write(&self, offset: u64, len: usize) -> bool {
        self.check(offset, len as u64).is_ok()
            && self
                .whole(offset, len as u64)
                .is_some_and(|(r, at)| r.dev.resident_for_write(at, len))
    }

    fn lends(&self) -> bool {
        self.lends
    }

    /// Lent by the one route that holds the whole range, as `resident`.
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        self.lends
            && self.check(offset, len as u64).is_ok()
            && self
                .whole(offset, len as u64)
                .is_some_and(|(r, at)| r.dev.lend(at, len, f))
    }

    /// Forwarded when the request is one piece (as direct access); one
    /// that would be cut, at a route's end or at its device's I/O
    /// boundary, is declined and runs the synchronous way, which cuts it.
    unsafe fn submit(&self, io: AsyncIo) {
        if self.check(io.offset, io.len as u64).is_err() {
            return io.decline();
        }
        // A deferred step goes only to devices that run it (a table
        // reloaded since the layer above asked may have others).
        if io.prepare.is_some() && !self.prepare {
            return io.decline();
        }
        match self.whole(io.offset, io.len as u64) {
            Some((r, at)) if self.submit => {
                // SAFETY: the caller's guarantee on the buffer is passed on.
                unsafe { r.dev.submit(io.at(at)) }
            }
            _ => io.decline(),
        }
    }

    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        if let Some((r, at)) = self.whole(offset, buf.len() as u64) {
            return r.dev.read_transformed(at, buf, t);
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
        if let Some((r, at)) = self.whole(offset, src.len() as u64) {
            return r.dev.write_transformed(at, src, fua, t);
        }
        write_transformed_by_writing(self, offset, src, fua, t)
    }

    /// Tags exist only where one device serves the whole table (the
    /// integrity device under an authenticated crypt target is one target
    /// over its whole length); a request is then forwarded whole.
    fn tag_layout(&self) -> Option<crate::core::device::TagLayout> {
        match self.routes.as_slice() {
            [r] if r.start == 0 && r.len == self.size => r.dev.tag_layout(),
            _ => None,
        }
    }

    fn read_tagged(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        match self.whole(offset, buf.len() as u64) {
            Some((r, at)) => r.dev.read_tagged(at, buf, tags),
            None => Err(DevError::NotSupported("tagged read across targets")),
        }
    }

    fn write_tagged(&self, offset: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        self.check(offset, data.len() as u64)?;
        match self.whole(offset, data.len() as u64) {
            Some((r, at)) => r.dev.write_tagged(at, data, tags, fua),
            None => Err(DevError::NotSupported("tagged write across targets")),
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records each call's (offset, len), declares a 4 KiB I/O boundary,
    /// and takes submissions (completing them at once).
    struct Chunked {
        calls: Mutex<Vec<(u64, u64)>>,
    }

    impl Chunked {
        fn take(&self) -> Vec<(u64, u64)> {
            std::mem::take(&mut self.calls.lock().unwrap())
        }
        fn note(&self, offset: u64, len: u64) -> DevResult<()> {
            let crosses = offset / 4096 != (offset + len.max(1) - 1) / 4096;
            self.calls.lock().unwrap().push((offset, len));
            match crosses {
                true => Err(DevError::Target("crossed a boundary".into())),
                false => Ok(()),
            }
        }
    }

    impl BlockDevice for Chunked {
        fn size(&self) -> u64 {
            1 << 20
        }
        fn limits(&self) -> Limits {
            Limits {
                io_boundary: 4096,
                ..Limits::default()
            }
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
            self.note(offset, buf.len() as u64)
        }
        fn write(&self, offset: u64, data: WriteBuf<'_>, _: bool) -> DevResult<()> {
            self.note(offset, data.len() as u64)
        }
        fn flush(&self) -> DevResult<()> {
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
            self.note(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, _: bool) -> DevResult<()> {
            self.note(offset, len)
        }
        fn can_submit(&self) -> bool {
            true
        }
        unsafe fn submit(&self, io: AsyncIo) {
            let r = self.note(io.offset, io.len as u64);
            (io.done)(Some(r))
        }
    }

    /// The device starts at byte 1024 of the routes and is used from its
    /// byte 512: boundaries fall where the device counts them.
    fn routes() -> (Arc<Chunked>, Arc<Chunked>, Routes) {
        let dev = Arc::new(Chunked {
            calls: Mutex::new(Vec::new()),
        });
        let first = Arc::new(Chunked {
            calls: Mutex::new(Vec::new()),
        });
        let r = Routes::new(
            vec![
                Route {
                    start: 0,
                    len: 1024,
                    dev: first.clone(),
                    shift: 0,
                },
                Route {
                    start: 1024,
                    len: 64 << 10,
                    dev: dev.clone(),
                    shift: 512,
                },
            ],
            Limits::default(),
        );
        (first, dev, r)
    }

    #[test]
    fn requests_are_cut_at_the_io_boundary_of_the_route_device() {
        let (first, dev, r) = routes();
        let mut buf = vec![0u8; 10 << 10];
        // Device bytes 512.. : cut at 4096 and 8192.
        r.read(1024, &mut buf).unwrap();
        assert_eq!(dev.take(), [(512, 3584), (4096, 4096), (8192, 2560)]);
        // Across the route boundary too: 512 bytes before it elsewhere.
        r.write(512, WriteBuf::Borrowed(&buf[..4096]), false)
            .unwrap();
        assert_eq!(first.take(), [(512, 512)]);
        assert_eq!(dev.take(), [(512, 3584)]);
        r.discard(1024 + 3584, 8192).unwrap();
        assert_eq!(dev.take(), [(4096, 4096), (8192, 4096)]);
        // One piece goes down as it is.
        r.write_zeroes(1024 + 3584, 4096, false).unwrap();
        assert_eq!(dev.take(), [(4096, 4096)]);
    }

    /// A write whose step is left to the device is declined by routes
    /// whose devices would not run it (the buffer stays as it was), and
    /// the routes say so up front.
    #[test]
    fn a_deferred_step_is_declined_unless_every_device_runs_it() {
        let (_, dev, r) = routes();
        assert!(r.can_submit() && !r.takes_prepare());
        let mut buf = vec![7u8; 512];
        let step: crate::core::Prepare = Box::new(|b: &mut [u8]| {
            b.fill(0);
            Ok(())
        });
        let r = crate::core::device::submit_and_wait(&r, true, 1024, &mut buf, Some(step));
        assert!(r.is_none(), "declined");
        assert!(buf.iter().all(|&b| b == 7), "the step did not run");
        assert!(dev.take().is_empty(), "nothing reached the device");
    }

    fn submit(r: &Routes, offset: u64, buf: &mut [u8]) -> Option<DevResult<()>> {
        crate::core::device::submit_and_wait(r, false, offset, buf, None)
    }

    /// A request that is one piece is submitted; one that would be cut is
    /// declined (and then runs the synchronous way, which cuts it).
    #[test]
    fn a_request_that_would_be_cut_declines_submission() {
        let dev = Arc::new(Chunked {
            calls: Mutex::new(Vec::new()),
        });
        let r = Routes::new(
            vec![Route {
                start: 0,
                len: 64 << 10,
                dev: dev.clone(),
                shift: 0,
            }],
            Limits::default(),
        );
        assert!(r.can_submit());
        let mut buf = vec![0u8; 4096];
        assert!(matches!(submit(&r, 8192, &mut buf), Some(Ok(()))));
        assert_eq!(dev.take(), [(8192, 4096)]);
        assert!(submit(&r, 2048, &mut buf).is_none());
        assert!(dev.take().is_empty());
    }
}
