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
//!
//! It is also the fault boundary of the request path (`core::fault`): the
//! targets under it run inside [`Fault::contain`], so a panic in one fails
//! this device (its requests get EIO from then on, `status` says why) and
//! never the event loop or worker that carried the request. A device it
//! was compiled over that has failed fails its requests too (EIO naming
//! that device, [`Routes::check_lower`]), without failing this one: its
//! own code did not.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::route::Routes;
use super::stats::{StatOp, Stats, Timing};
use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Fault, Lent, Limits, WriteBuf};

/// The live device, from a completion that runs after `submit` returned.
#[derive(Clone, Copy)]
struct DevRef(*const LiveDevice);

// SAFETY: `LiveDevice` is Sync (atomics, arc-swap and mutexes); the
// pointer is only dereferenced while the device is alive
// (`BlockDevice::submit`'s contract).
unsafe impl Send for DevRef {}

/// A submitted request's completion, called exactly once even when the
/// code below drops it uncalled (a panic that unwound through the frame
/// holding it): then the request fails and so does the device, instead of
/// the client waiting for ever.
struct Completion {
    dev: DevRef,
    /// What the statistics count when it ends.
    started: Option<Timing>,
    op: StatOp,
    at: u64,
    n: u64,
    done: Option<Done>,
}

/// [`AsyncIo::done`]'s type.
type Done = Box<dyn FnOnce(Option<DevResult<()>>) + Send>;

impl Completion {
    fn dev(&self) -> &LiveDevice {
        // SAFETY: the caller of `submit` keeps the device alive until the
        // completion has run, and it runs (or drops) before that.
        unsafe { &*self.dev.0 }
    }

    fn finish(&mut self, r: Option<DevResult<()>>) {
        if let Some(t) = self.started.take() {
            let s = &self.dev().stats;
            match &r {
                Some(res) => s.done_at(t, self.op, self.at, self.n, res.is_ok()),
                // Not started here: the synchronous retry counts it.
                None => s.cancel(t),
            }
        }
        if let Some(done) = self.done.take() {
            done(r);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if self.done.is_some() {
            let fault = self.dev().fault.clone();
            fault.fail(match crate::core::fault::last_panic() {
                Some(m) => format!("a submitted request panicked: {m}"),
                None => "a request's completion was dropped without an answer".to_string(),
            });
            self.finish(Some(Err(fault.error())));
        }
    }
}

/// A device whose routes can be swapped at runtime.
pub struct LiveDevice {
    routes: ArcSwap<Routes>,
    stats: Stats,
    read_only: bool,
    fault: Arc<Fault>,
}

impl LiveDevice {
    /// A device with no table yet (size 0), as `dmsetup create --notable`.
    pub fn new(read_only: bool, histograms: bool) -> LiveDevice {
        crate::core::fault::remember_panics();
        LiveDevice {
            routes: ArcSwap::from_pointee(Routes::new(Vec::new(), Limits::default())),
            stats: Stats::new(histograms),
            read_only,
            fault: Arc::new(Fault::new()),
        }
    }

    /// The device's failure state, shared with its targets' background
    /// jobs (`TargetOptions::fault`).
    pub fn fault(&self) -> &Arc<Fault> {
        &self.fault
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
        self.fault.check()?;
        let t = self.stats.start();
        let n = buf.len() as u64;
        let r = self.fault.contain("a read", || {
            let routes = self.routes.load();
            routes.check_lower()?;
            routes.read(offset, buf)
        });
        self.stats.done_at(t, StatOp::Read, offset, n, r.is_ok());
        r
    }

    #[inline]
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        self.fault.check()?;
        let t = self.stats.start();
        let n = data.len() as u64;
        let r = self.fault.contain("a write", || {
            let routes = self.routes.load();
            routes.check_lower()?;
            routes.write(offset, data, fua)
        });
        self.stats.done_at(t, StatOp::Write, offset, n, r.is_ok());
        r
    }

    /// Lent by the live routes, counted as a read that succeeded (what
    /// the borrower does with the bytes is its own business).
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        let routes = self.routes.load();
        if !routes.lends() || self.fault.is_failed() || routes.check_lower().is_err() {
            return false;
        }
        let t = self.stats.start();
        // A panic before the borrower ran leaves the read to the usual
        // path (which then fails); after it, the request is answered.
        let mut ran = false;
        let lent = self
            .fault
            .contain("a lent read", || {
                Ok(routes.lend(offset, len, &mut |d| {
                    ran = true;
                    f(d)
                }))
            })
            .unwrap_or(ran);
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
        if let Err(e) = self.fault.check() {
            return (io.done)(Some(Err(e)));
        }
        let routes = self.routes.load_full();
        if let Err(e) = routes.check_lower() {
            return (io.done)(Some(Err(e)));
        }
        let t = self.stats.start();
        let (op, n) = if io.write {
            (StatOp::Write, io.len as u64)
        } else {
            (StatOp::Read, io.len as u64)
        };
        let at = io.offset;
        let mut done = Completion {
            dev: DevRef(self),
            started: Some(t),
            op,
            at,
            n,
            done: Some(io.done),
        };
        let keep = routes.clone();
        let io = AsyncIo {
            done: Box::new(move |r: Option<DevResult<()>>| {
                done.finish(r);
                crate::core::device::drop_outside_callback(keep);
            }),
            ..io
        };
        // A panic below drops `io` (and so answers the request through
        // `Completion`'s drop) unless another thread already holds it.
        let _ = self.fault.contain("a submitted request", || {
            // SAFETY: the caller's guarantee on the buffer is passed on.
            unsafe { routes.submit(io) };
            Ok(())
        });
    }

    fn direct_access(&self) -> bool {
        // Nothing stacks on a live device (stacks are compiled against its
        // routes), so there is no caller to offer direct access to.
        false
    }

    fn flush(&self) -> DevResult<()> {
        let t = self.stats.start();
        self.fault.check()?;
        let r = self.fault.contain("a flush", || {
            let routes = self.routes.load();
            routes.check_lower()?;
            routes.flush()
        });
        self.stats.done(t, StatOp::Flush, 0, r.is_ok());
        r
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let t = self.stats.start();
        self.fault.check()?;
        let r = self.fault.contain("a discard", || {
            let routes = self.routes.load();
            routes.check_lower()?;
            routes.discard(offset, len)
        });
        self.stats.done(t, StatOp::Discard, len, r.is_ok());
        r
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let t = self.stats.start();
        self.fault.check()?;
        let r = self.fault.contain("a zeroing write", || {
            let routes = self.routes.load();
            routes.check_lower()?;
            routes.write_zeroes(offset, len, fua)
        });
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
        self.fault.check()?;
        self.fault.contain("a block status query", || {
            let routes = self.routes.load();
            routes.check_lower()?;
            routes.extents(offset, len, out)
        })
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

    /// Panics in every call, as a target with a bug would on bad input.
    struct Panics;

    impl BlockDevice for Panics {
        fn size(&self) -> u64 {
            1 << 20
        }
        fn read(&self, _: u64, _: &mut [u8]) -> DevResult<()> {
            panic!("bad node in read")
        }
        fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
            panic!("bad node in write")
        }
        fn flush(&self) -> DevResult<()> {
            panic!("bad node in flush")
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
            // Holds the request (as a queue would) when it panics.
            let _held = io;
            panic!("bad node in submit")
        }
    }

    fn over(dev: Arc<dyn BlockDevice>) -> LiveDevice {
        let d = LiveDevice::new(false, false);
        d.swap(Arc::new(Routes::new(
            vec![Route {
                start: 0,
                len: 1 << 20,
                dev,
                shift: 0,
            }],
            Limits::default(),
        )));
        d
    }

    /// A panic below a live device fails that device: the caller gets an
    /// error (EIO) instead of the unwind, every later request fails at
    /// once, and the reason names what panicked.
    #[test]
    fn a_panic_in_a_target_fails_its_device_not_the_caller() {
        let d = over(Arc::new(Panics));
        let mut buf = vec![0u8; 4096];
        let e = d.read(0, &mut buf).unwrap_err();
        assert_eq!(e.nbd_errno(false), 5, "{e}");
        let why = d.fault().reason().unwrap().to_string();
        assert!(why.contains("a read panicked: bad node in read"), "{why}");
        assert!(d.write(0, WriteBuf::Borrowed(&buf), false).is_err());
        assert!(d.flush().is_err());
        // Failed devices fail fast: nothing below is called again.
        assert_eq!(d.fault().reason().unwrap(), why);
        let healthy = over(Arc::new(AtOnce {
            submitted: AtomicUsize::new(0),
        }));
        assert!(healthy.read(0, &mut buf).is_ok());
    }

    /// A submitted request whose device panics with the request in hand
    /// is still answered exactly once (with an error), so the client does
    /// not wait for ever, and the device is failed.
    #[test]
    fn a_panicking_submission_is_answered_with_an_error() {
        let d = over(Arc::new(Panics));
        let mut buf = vec![0u8; 4096];
        let r = submit(&d, false, &mut buf);
        assert!(matches!(r, Some(Err(_))), "answered with an error: {r:?}");
        assert!(d.fault().is_failed());
        // The next one is refused at the door.
        assert!(matches!(submit(&d, true, &mut buf), Some(Err(_))));
        assert_eq!(d.stats().snapshot().in_flight, 0);
    }

    /// Routes compiled over a device that has since failed answer every
    /// request, submitted or not, with an error naming it, and nothing
    /// reaches the device below; this device is not failed by it.
    #[test]
    fn requests_over_a_failed_lower_device_fail_without_reaching_it() {
        let inner = Arc::new(AtOnce {
            submitted: AtomicUsize::new(0),
        });
        let low = Arc::new(Fault::new());
        let d = LiveDevice::new(false, false);
        let route = Route {
            start: 0,
            len: 1 << 20,
            dev: inner.clone(),
            shift: 0,
        };
        let lower = vec![crate::dm::route::Lower {
            name: "low".into(),
            fault: low.clone(),
        }];
        d.swap(Arc::new(
            Routes::new(vec![route], Limits::default()).over(lower),
        ));
        let mut buf = vec![0u8; 4096];
        assert!(matches!(submit(&d, false, &mut buf), Some(Ok(()))));
        low.fail("a test");
        let r = submit(&d, true, &mut buf);
        assert!(
            matches!(&r, Some(Err(e)) if e.to_string().contains("device 'low' under this one")),
            "{r:?}"
        );
        assert_eq!(inner.submitted.load(Ordering::SeqCst), 1);
        assert_eq!(d.read(0, &mut buf).unwrap_err().nbd_errno(false), 5);
        assert!(!d.fault().is_failed());
        assert_eq!(d.stats().snapshot().in_flight, 0);
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
