//! The device a client sees: dm's "mapped device" (`struct mapped_device`),
//! whose table can be replaced while clients use it.
//!
//! It holds the compiled routes of the live table behind an atomic pointer
//! ([`arc_swap::ArcSwap`]): a request loads the pointer (no lock, no
//! reference count in the common case — arc-swap's thread-local debt
//! slots), routes itself and counts itself in the device's [`Stats`].
//! Swapping in a new table is one pointer store; whoever swaps first makes
//! sure no request is running (the engine's queue hold, see `control`),
//! so a request never sees half of one table and half of another, and the
//! old table is freed when its last request lets go of it.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::route::Routes;
use super::stats::{StatOp, Stats};
use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Lent, Limits, WriteBuf};

/// The statistics of a live device, from a completion that runs after
/// `submit` returned.
#[derive(Clone, Copy)]
struct StatsRef(*const Stats);

// SAFETY: `Stats` is Sync (atomics and a mutex); the pointer is only
// dereferenced while the device is alive (`BlockDevice::submit`'s contract).
unsafe impl Send for StatsRef {}

/// A device whose routes can be swapped at runtime.
pub struct LiveDevice {
    routes: ArcSwap<Routes>,
    stats: Stats,
    read_only: bool,
}

impl LiveDevice {
    /// A device with no table yet (size 0), as `dmsetup create --notable`.
    pub fn new(read_only: bool, histograms: bool) -> LiveDevice {
        LiveDevice {
            routes: ArcSwap::from_pointee(Routes::new(Vec::new(), Limits::default())),
            stats: Stats::new(histograms),
            read_only,
        }
    }

    /// Make `routes` live. The caller guarantees no request is running
    /// (or accepts that a running one finishes on the old routes).
    pub fn swap(&self, routes: Arc<Routes>) -> Arc<Routes> {
        self.routes.swap(routes)
    }

    /// The live routes.
    pub fn routes(&self) -> Arc<Routes> {
        self.routes.load_full()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }
}

impl BlockDevice for LiveDevice {
    fn size(&self) -> u64 {
        self.routes.load().size()
    }

    fn limits(&self) -> Limits {
        let mut l = self.routes.load().limits();
        l.read_only |= self.read_only;
        l
    }

    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let t = self.stats.start();
        let n = buf.len() as u64;
        let r = self.routes.load().read(offset, buf);
        self.stats.done_at(t, StatOp::Read, offset, n, r.is_ok());
        r
    }

    #[inline]
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let t = self.stats.start();
        let n = data.len() as u64;
        let r = self.routes.load().write(offset, data, fua);
        self.stats.done_at(t, StatOp::Write, offset, n, r.is_ok());
        r
    }

    /// Lent by the live routes, counted as a read that succeeded (what
    /// the borrower does with the bytes is its own business).
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        let routes = self.routes.load();
        if !routes.lends() {
            return false;
        }
        let t = self.stats.start();
        let lent = routes.lend(offset, len, f);
        if lent {
            self.stats
                .done_at(t, StatOp::Read, offset, len as u64, true);
        } else {
            self.stats.cancel(t);
        }
        lent
    }

    /// Asked of the live routes: a reload may change it.
    fn lends(&self) -> bool {
        self.routes.load().lends()
    }

    /// Read-only devices take submissions too: their reads are the whole
    /// load, and `submit` declines a write (the synchronous retry then
    /// fails it with [`DevError::ReadOnly`]).
    fn can_submit(&self) -> bool {
        self.routes.load().can_submit()
    }

    fn takes_prepare(&self) -> bool {
        self.routes.load().takes_prepare()
    }

    /// Forwarded to the live routes, counted in the statistics when it
    /// completes. The completion keeps those routes alive: a table swapped
    /// while the request is in flight (only without a suspend) is freed
    /// after it, never under it.
    unsafe fn submit(&self, io: AsyncIo) {
        if self.read_only && io.write {
            return io.decline();
        }
        let routes = self.routes.load_full();
        let t = self.stats.start();
        let (op, n) = if io.write {
            (StatOp::Write, io.len as u64)
        } else {
            (StatOp::Read, io.len as u64)
        };
        let at = io.offset;
        let stats = StatsRef(&self.stats);
        let keep = routes.clone();
        let done = io.done;
        let io = AsyncIo {
            done: Box::new(move |r: Option<DevResult<()>>| {
                let stats = stats;
                // SAFETY: the caller of `submit` keeps this device (and so
                // its statistics) alive until `done` has run.
                let s = unsafe { &*stats.0 };
                match &r {
                    Some(res) => s.done_at(t, op, at, n, res.is_ok()),
                    // Not started here: the synchronous retry counts it.
                    None => s.cancel(t),
                }
                done(r);
                crate::core::device::drop_outside_callback(keep);
            }),
            ..io
        };
        // SAFETY: the caller's guarantee on the buffer is passed on.
        unsafe { routes.submit(io) }
    }

    fn direct_access(&self) -> bool {
        // Nothing stacks on a live device (stacks are compiled against its
        // routes), so there is no caller to offer direct access to.
        false
    }

    fn flush(&self) -> DevResult<()> {
        let t = self.stats.start();
        let r = self.routes.load().flush();
        self.stats.done(t, StatOp::Flush, 0, r.is_ok());
        r
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let t = self.stats.start();
        let r = self.routes.load().discard(offset, len);
        self.stats.done(t, StatOp::Discard, len, r.is_ok());
        r
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let t = self.stats.start();
        let r = self.routes.load().write_zeroes(offset, len, fua);
        self.stats.done_at(t, StatOp::Write, offset, len, r.is_ok());
        r
    }

    /// The current table's extents (through its routes).
    fn extents(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(crate::core::Extent) -> bool,
    ) -> DevResult<()> {
        self.routes.load().extents(offset, len, out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::dm::route::Route;

    /// Takes every submission and completes it at once.
    struct AtOnce {
        submitted: AtomicUsize,
    }

    impl BlockDevice for AtOnce {
        fn size(&self) -> u64 {
            1 << 20
        }
        fn read(&self, _: u64, buf: &mut [u8]) -> DevResult<()> {
            buf.fill(0);
            Ok(())
        }
        fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
            Ok(())
        }
        fn flush(&self) -> DevResult<()> {
            Ok(())
        }
        fn limits(&self) -> Limits {
            Limits::default()
        }
        fn discard(&self, _: u64, _: u64) -> DevResult<()> {
            Ok(())
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
            Ok(())
        }
        fn can_submit(&self) -> bool {
            true
        }
        unsafe fn submit(&self, io: AsyncIo) {
            self.submitted.fetch_add(1, Ordering::SeqCst);
            (io.done)(Some(Ok(())))
        }
    }

    fn submit(d: &LiveDevice, write: bool, buf: &mut [u8]) -> Option<DevResult<()>> {
        crate::core::device::submit_and_wait(d, write, 0, buf, None)
    }

    /// A read-only export over a device that takes submissions sends its
    /// reads down that path and declines writes, which then fail the
    /// synchronous way.
    #[test]
    fn read_only_device_submits_reads_and_declines_writes() {
        let inner = Arc::new(AtOnce {
            submitted: AtomicUsize::new(0),
        });
        let d = LiveDevice::new(true, false);
        d.swap(Arc::new(Routes::new(
            vec![Route {
                start: 0,
                len: 1 << 20,
                dev: inner.clone(),
                shift: 0,
            }],
            Limits::default(),
        )));
        assert!(d.can_submit());
        let mut buf = vec![1u8; 4096];
        assert!(matches!(submit(&d, false, &mut buf), Some(Ok(()))));
        assert_eq!(inner.submitted.load(Ordering::SeqCst), 1);
        assert!(submit(&d, true, &mut buf).is_none());
        assert_eq!(inner.submitted.load(Ordering::SeqCst), 1);
        let r = d.write(0, WriteBuf::Borrowed(&buf), false);
        assert!(matches!(r, Err(DevError::ReadOnly)));
        assert_eq!(d.stats().snapshot().read.ios, 1);
    }
}
