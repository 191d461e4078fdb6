//! A Ceph RBD image as a backing store, through the distribution's librbd.
//! The FFI (`ffi.rs`) is hand-written because no maintained Rust binding
//! of librbd's C API exists.
//!
//! Every request is one librbd asynchronous call (`rbd_aio_read`,
//! `rbd_aio_write`/`rbd_aio_writev`, `rbd_aio_discard`,
//! `rbd_aio_write_zeroes`, `rbd_aio_flush`) whose completion callback, run
//! on librbd's finisher thread, wakes the calling worker. The call stays
//! synchronous, like every `BlockDevice`; many requests are in flight per
//! image because the store asks the engine for [`QUEUE_DEPTH`] workers
//! (`Limits::queue_depth`, see docs/REMOTE.md for why this design).
//! Reads and writes may also be *submitted* ([`BlockDevice::submit`]): the
//! callback then completes the request itself, so no thread waits and
//! none is woken (the engine does this for reads and whole-block writes).
//!
//! Cluster settings, applied in this order: the config file (`conf=` or
//! librados' own search), udm's defaults (below), then every `KEY=VALUE` of
//! the path, so the path always wins.
//! - `rados_osd_op_timeout`, `rados_mon_op_timeout`, `client_mount_timeout`:
//!   librados waits forever (0) or 300 s by default, so a stopped OSD would
//!   hang the requests for it. Where the config leaves the library default,
//!   udm sets 30 s: a request for an unreachable OSD then fails with EIO
//!   after at most 30 s. `:rados_osd_op_timeout=N` in the path sets another
//!   bound (0 = wait forever).
//! - `rbd_cache=false` unless the path says `:rbd_cache=true`: with the
//!   cache off an acknowledged write is on the OSDs (no flush needed for
//!   FUA) and librbd holds no dirty data outside udm's memory budget.
//! - Zero-copy writes (`rbd_disable_zero_copy_writes=false`: librbd sends
//!   udm's buffer instead of copying it) only with the cache off *and* no
//!   OSD op timeout (`:rados_osd_op_timeout=0`); otherwise librbd copies
//!   (forced, whatever the path says). Correctness first: a timed-out op
//!   completes with ETIMEDOUT while its message may still sit in the
//!   messenger's queue pointing at the buffer, which udm then reuses for
//!   another request, so a late send would put other data on disk; with
//!   the cache on, librbd may keep the data past the completion. Without a
//!   timeout the completion is the end of librbd's use of the buffer, and
//!   udm keeps every buffer until then.

mod ffi;

use std::ffi::{CStr, CString};
use std::io::IoSlice;
use std::os::raw::{c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;

use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Limits, WriteBuf};

use super::rbd_spec::RbdSpec;

/// Requests the store asks the engine to keep in flight per device.
pub const QUEUE_DEPTH: u32 = 64;
/// udm's bound on librados waits where the config leaves them unbounded.
pub const DEFAULT_OP_TIMEOUT_SECS: u32 = 30;
/// Largest single librbd call.
const MAX_IO: usize = 32 << 20;

/// An open RBD image.
pub struct RbdStore {
    cluster: ffi::rados_t,
    ioctx: ffi::rados_ioctx_t,
    image: ffi::rbd_image_t,
    size: u64,
    read_only: bool,
    /// Whether librbd's cache is on (then FUA needs a flush).
    cache: bool,
    queue_depth: u32,
    name: String,
}

// SAFETY: the handles are used only through librbd/librados calls, which
// are thread-safe for one image handle (qemu and fio's rbd engine issue
// concurrent aio on one handle the same way); the handles are released
// only in Drop, when no call is running (`&mut self`).
unsafe impl Send for RbdStore {}
// SAFETY: as above: every method takes `&self` and only passes the handles
// to librbd, which synchronises internally.
unsafe impl Sync for RbdStore {}

fn cstr(what: &str, s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{what} '{s}' contains a NUL byte"))
}

fn errno_text(r: c_int) -> String {
    std::io::Error::from_raw_os_error(-r).to_string()
}

/// Tear-down of what was set up so far when opening fails half-way.
struct Partial {
    cluster: ffi::rados_t,
    ioctx: ffi::rados_ioctx_t,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.ioctx.is_null() {
            // SAFETY: a valid ioctx created by rados_ioctx_create, not used
            // by anything else (the image was not opened).
            unsafe { ffi::rados_ioctx_destroy(self.ioctx) };
        }
        if !self.cluster.is_null() {
            // SAFETY: a valid cluster handle from rados_create, no ioctx
            // left on it.
            unsafe { ffi::rados_shutdown(self.cluster) };
        }
    }
}

impl Partial {
    fn conf_get(&self, key: &CStr) -> Option<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: valid cluster handle, NUL-terminated key, and a buffer
        // of the length given; librados NUL-terminates what it writes.
        let r =
            unsafe { ffi::rados_conf_get(self.cluster, key.as_ptr(), buf.as_mut_ptr(), buf.len()) };
        if r < 0 {
            return None;
        }
        // SAFETY: rados_conf_get succeeded, so `buf` holds a NUL-terminated
        // string within its length.
        Some(
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Errors name the key only: a value may be a secret or a path the
    /// log has no business with.
    fn conf_set(&self, key: &str, value: &str) -> Result<(), String> {
        let (k, v) = (cstr("option", key)?, cstr("value", value)?);
        // SAFETY: valid cluster handle (not yet connected) and two
        // NUL-terminated strings that outlive the call.
        let r = unsafe { ffi::rados_conf_set(self.cluster, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(format!(
                "cannot set Ceph option {key} to the value given: {}",
                errno_text(r)
            ));
        }
        Ok(())
    }
}

impl RbdStore {
    /// Connect to the cluster and open the image (its snapshot, read-only,
    /// when the path names one).
    pub fn open(spec: &RbdSpec, read_only: bool) -> Result<RbdStore, String> {
        let name = match &spec.snap {
            Some(s) => format!("rbd:{}/{}@{s}", spec.pool, spec.image),
            None => format!("rbd:{}/{}", spec.pool, spec.image),
        };
        Self::open_inner(spec, read_only, &name).map_err(|e| format!("RBD image {name}: {e}"))
    }

    fn open_inner(spec: &RbdSpec, read_only: bool, name: &str) -> Result<RbdStore, String> {
        let id = spec
            .id
            .as_deref()
            .map(|i| cstr("client id", i))
            .transpose()?;
        let pool = cstr("pool", &spec.pool)?;
        let image = cstr("image", &spec.image)?;
        let snap = spec
            .snap
            .as_deref()
            .map(|s| cstr("snapshot", s))
            .transpose()?;
        let mut p = Partial {
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
        };
        // SAFETY: `p.cluster` is a valid out-pointer; `id` is NULL (the
        // default client.admin) or a NUL-terminated string alive for the
        // call.
        let r = unsafe {
            ffi::rados_create(
                &mut p.cluster,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            p.cluster = std::ptr::null_mut();
            return Err(format!("cannot create a cluster handle: {}", errno_text(r)));
        }
        match &spec.conf {
            Some(path) => {
                let c = cstr("config path", &path.to_string_lossy())?;
                // SAFETY: valid cluster handle, NUL-terminated path.
                let r = unsafe { ffi::rados_conf_read_file(p.cluster, c.as_ptr()) };
                if r < 0 {
                    return Err(format!(
                        "cannot read Ceph config {}: {}",
                        path.display(),
                        errno_text(r)
                    ));
                }
            }
            None => read_default_conf(&p)?,
        }
        let timeout = DEFAULT_OP_TIMEOUT_SECS.to_string();
        for (key, lib_default) in [
            (c"rados_osd_op_timeout", "0"),
            (c"rados_mon_op_timeout", "0"),
            (c"client_mount_timeout", "300"),
        ] {
            if p.conf_get(key).is_none_or(|v| v == lib_default) {
                p.conf_set(&key.to_string_lossy(), &timeout)?;
            }
        }
        for (k, v) in &spec.options {
            p.conf_set(k, v)?;
        }
        // udm's required settings last, so neither the config file nor a
        // path (which cannot name it anyway) turns the cache on.
        p.conf_set("rbd_cache", "false")?;
        let cache = p.conf_get(c"rbd_cache").is_some_and(|v| v == "true");
        let timeout = p.conf_get(c"rados_osd_op_timeout");
        let copy = !zero_copy_writes(cache, timeout.as_deref());
        // Not every librbd knows the option; those copy, the safe way.
        let _ = p.conf_set("rbd_disable_zero_copy_writes", &copy.to_string());
        // SAFETY: valid, configured, not yet connected cluster handle.
        let r = unsafe { ffi::rados_connect(p.cluster) };
        if r < 0 {
            return Err(format!(
                "cannot connect to the cluster: {} (check conf= and that the monitors are up)",
                errno_text(r)
            ));
        }
        // SAFETY: connected cluster, NUL-terminated pool name, valid
        // out-pointer.
        let r = unsafe { ffi::rados_ioctx_create(p.cluster, pool.as_ptr(), &mut p.ioctx) };
        if r < 0 {
            p.ioctx = std::ptr::null_mut();
            return Err(format!(
                "cannot open pool '{}': {}",
                spec.pool,
                errno_text(r)
            ));
        }
        let read_only = read_only || snap.is_some();
        let mut img: ffi::rbd_image_t = std::ptr::null_mut();
        let snap_ptr = snap.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        // SAFETY: valid ioctx, NUL-terminated names alive for the call,
        // valid out-pointer.
        let r = unsafe {
            if read_only {
                ffi::rbd_open_read_only(p.ioctx, image.as_ptr(), &mut img, snap_ptr)
            } else {
                ffi::rbd_open(p.ioctx, image.as_ptr(), &mut img, snap_ptr)
            }
        };
        if r < 0 {
            return Err(format!("cannot open the image: {}", errno_text(r)));
        }
        let mut size = 0u64;
        // SAFETY: open image handle, valid out-pointer.
        let r = unsafe { ffi::rbd_get_size(img, &mut size) };
        if r < 0 {
            // SAFETY: the image was opened above and nothing else uses it.
            unsafe { ffi::rbd_close(img) };
            return Err(format!("cannot read the image size: {}", errno_text(r)));
        }
        let store = RbdStore {
            cluster: p.cluster,
            ioctx: p.ioctx,
            image: img,
            size,
            read_only,
            cache,
            queue_depth: spec.queue_depth.unwrap_or(QUEUE_DEPTH),
            name: name.to_string(),
        };
        // The store owns the handles now.
        std::mem::forget(p);
        Ok(store)
    }

    /// Run one asynchronous librbd call and wait for its completion;
    /// returns librbd's result (bytes for reads, 0 otherwise).
    fn aio(&self, submit: impl FnOnce(ffi::rbd_completion_t) -> c_int) -> DevResult<isize> {
        // On the heap: if librbd refused the submission we cannot be sure
        // the callback will never run, so the waiter is then leaked rather
        // than freed under it.
        let waiter = Box::new(Waiter {
            done: AtomicBool::new(false),
            thread: std::thread::current(),
        });
        let arg = &*waiter as *const Waiter as *mut c_void;
        let mut c: ffi::rbd_completion_t = std::ptr::null_mut();
        // SAFETY: `arg` points to the boxed waiter, which lives until the
        // callback has run (we wait for `done` below, or leak it);
        // `on_complete` matches rbd_callback_t; `c` is a valid out-pointer.
        let r = unsafe { ffi::rbd_aio_create_completion(arg, on_complete, &mut c) };
        if r < 0 {
            return Err(self.err(r));
        }
        let r = submit(c);
        if r < 0 {
            // The waiter stays leaked (see above), but our reference to the
            // completion is released: librbd counts references, so this is
            // safe even if it had taken one of its own.
            std::mem::forget(waiter);
            // SAFETY: `c` was created above and this is our only release.
            unsafe { ffi::rbd_aio_release(c) };
            return Err(self.err(r));
        }
        while !waiter.done.load(Ordering::Acquire) {
            std::thread::park();
        }
        // SAFETY: the completion finished (its callback ran); reading its
        // value and releasing our reference are the last uses of `c`.
        let ret = unsafe { ffi::rbd_aio_get_return_value(c) };
        // SAFETY: as above.
        unsafe { ffi::rbd_aio_release(c) };
        if ret < 0 {
            return Err(self.err(ret as c_int));
        }
        Ok(ret)
    }

    fn err(&self, r: c_int) -> DevError {
        let e = std::io::Error::from_raw_os_error(-r);
        tracing::debug!("RBD image {}: {e}", self.name);
        DevError::Io(e)
    }

    fn writable(&self) -> DevResult<()> {
        if self.read_only {
            Err(DevError::ReadOnly)
        } else {
            Ok(())
        }
    }

    fn flush_if_cached(&self, fua: bool) -> DevResult<()> {
        if fua && self.cache {
            self.flush()?;
        }
        Ok(())
    }
}

/// Without `conf=`, only [`DEFAULT_CONF`], named explicitly: librados'
/// own search (NULL) also reads `$CEPH_CONF`, `~/.ceph/ceph.conf` and
/// `./ceph.conf` in the working directory, which whoever can write there
/// (or set the environment) would control, monitors and file paths alike.
/// A missing default file is fine when the path gives `mon_host=`.
fn read_default_conf(p: &Partial) -> Result<(), String> {
    if !Path::new(DEFAULT_CONF).exists() {
        return Ok(());
    }
    let c = cstr("config path", DEFAULT_CONF)?;
    // SAFETY: valid cluster handle, NUL-terminated path alive for the call.
    let r = unsafe { ffi::rados_conf_read_file(p.cluster, c.as_ptr()) };
    if r < 0 {
        return Err(format!(
            "cannot read Ceph config {DEFAULT_CONF}: {}",
            errno_text(r)
        ));
    }
    Ok(())
}

/// The Ceph config read when a path gives no `conf=`.
pub const DEFAULT_CONF: &str = "/etc/ceph/ceph.conf";

/// Whether librbd may send udm's write buffers without copying them: only
/// when nothing can complete an op while librbd still holds the buffer,
/// i.e. no cache and no OSD op timeout (`timeout` as librados prints it;
/// unknown or unreadable counts as a timeout).
fn zero_copy_writes(cache: bool, timeout: Option<&str>) -> bool {
    let no_timeout = timeout
        .and_then(|t| t.trim().parse::<f64>().ok())
        .is_some_and(|t| t == 0.0);
    !cache && no_timeout
}

struct Waiter {
    done: AtomicBool,
    thread: Thread,
}

/// librbd's completion callback: wake the worker that waits for it.
extern "C" fn on_complete(_c: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Waiter registered in `RbdStore::aio`, alive until
    // its waiting thread sees `done`, which is set last below.
    let w = unsafe { &*(arg as *const Waiter) };
    // Take the handle before `done`: once `done` is set the waiter may be
    // freed.
    let t = w.thread.clone();
    w.done.store(true, Ordering::Release);
    t.unpark();
}

/// A request started by [`RbdStore::submit`], owned by librbd's
/// completion until its callback.
struct Submitted {
    done: Box<dyn FnOnce(Option<DevResult<()>>) + Send>,
    /// A read's buffer (zero-filled past what librbd returned).
    read: Option<(*mut u8, usize)>,
    store: *const RbdStore,
}

/// librbd's completion callback of a submitted request: hand the result to
/// the submitter's completion, here on librbd's thread.
extern "C" fn on_submitted(c: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the `Submitted` boxed and leaked by `submit` for
    // this completion, whose callback runs once; nothing else owns it.
    let op = unsafe { Box::from_raw(arg as *mut Submitted) };
    // SAFETY: the completion finished (this is its callback); reading its
    // value and releasing it are the last uses (qemu's rbd driver does the
    // same from its callback).
    let ret = unsafe { ffi::rbd_aio_get_return_value(c) };
    // SAFETY: as above.
    unsafe { ffi::rbd_aio_release(c) };
    let res = if ret < 0 {
        // SAFETY: the submitter keeps the store alive until `done` ran
        // (`BlockDevice::submit`'s contract).
        Err(unsafe { &*op.store }.err(ret as c_int))
    } else {
        if let Some((ptr, len)) = op.read {
            let n = (ret as usize).min(len);
            if n < len {
                // Past the image end (only after a shrink): zeros.
                // SAFETY: the submitter's buffer, valid for writes and ours
                // until `done` (the contract); librbd is finished with it.
                unsafe { std::ptr::write_bytes(ptr.add(n), 0, len - n) };
            }
        }
        Ok(())
    };
    // Never unwind into librbd (a panic across this C callback aborts the
    // process): the completion's own guard fails the request instead.
    crate::core::fault::run_callback("librbd's callback thread", move || (op.done)(Some(res)));
}

impl Drop for RbdStore {
    fn drop(&mut self) {
        // SAFETY: the handles were created in `open` and are released once,
        // here, in reverse order; no call is running (`&mut self`).
        unsafe {
            ffi::rbd_close(self.image);
            ffi::rados_ioctx_destroy(self.ioctx);
            ffi::rados_shutdown(self.cluster);
        }
    }
}

impl BlockDevice for RbdStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn limits(&self) -> Limits {
        Limits {
            logical_block_size: 512,
            optimal_io_size: 4096,
            max_io_size: MAX_IO as u32,
            discard: !self.read_only,
            write_zeroes: !self.read_only,
            read_only: self.read_only,
            queue_depth: self.queue_depth,
            io_boundary: 0,
        }
    }

    fn can_submit(&self) -> bool {
        true
    }

    /// One `rbd_aio_read`/`rbd_aio_write` whose callback completes the
    /// request (see [`AsyncIo`]): no thread waits for it. Declined, so run
    /// the synchronous way: larger than one librbd call, a write to a
    /// read-only image (which fails there), and FUA with librbd's cache on
    /// (which needs a flush after the write).
    unsafe fn submit(&self, mut io: AsyncIo) {
        if io.len > MAX_IO || (io.write && (self.read_only || (io.fua && self.cache))) {
            return io.decline();
        }
        if let Err(e) = io.ready() {
            return (io.done)(Some(Err(e)));
        }
        let (write, offset, buf, len) = (io.write, io.offset, io.buf, io.len);
        let op = Box::new(Submitted {
            done: io.done,
            read: (!write).then_some((buf, len)),
            store: self,
        });
        let arg = Box::into_raw(op) as *mut c_void;
        let mut c: ffi::rbd_completion_t = std::ptr::null_mut();
        // SAFETY: `arg` is the leaked box, reclaimed exactly once: by the
        // callback, or below if the completion is never used; `c` is a
        // valid out-pointer.
        let r = unsafe { ffi::rbd_aio_create_completion(arg, on_submitted, &mut c) };
        let r = if r < 0 {
            r
        } else if write {
            // SAFETY: `buf[..len]` stays valid and unchanged until the
            // completion (the caller's contract); librbd only reads it.
            unsafe { ffi::rbd_aio_write(self.image, offset, len, buf as *const c_char, c) }
        } else {
            // SAFETY: as above, and librbd writes it only until the
            // completion.
            unsafe { ffi::rbd_aio_read(self.image, offset, len, buf as *mut c_char, c) }
        };
        if r < 0 {
            // librbd reports a failure from these calls only before taking
            // the completion (errors of the I/O come through it), so the
            // callback will not run: release both here.
            if !c.is_null() {
                // SAFETY: a completion we created and librbd did not take.
                unsafe { ffi::rbd_aio_release(c) };
            }
            // SAFETY: the box leaked above, not reclaimed by any callback.
            let op = unsafe { Box::from_raw(arg as *mut Submitted) };
            (op.done)(Some(Err(self.err(r))));
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let total = buf.len();
        let mut pos = 0;
        while pos < total {
            let part = &mut buf[pos..(pos + MAX_IO).min(total)];
            let (ptr, len) = (part.as_mut_ptr() as *mut c_char, part.len());
            let at = offset + pos as u64;
            // SAFETY: `ptr`/`len` is a live mutable buffer that `aio` keeps
            // borrowed until librbd's completion, after which librbd no
            // longer touches it.
            let n = self.aio(|c| unsafe { ffi::rbd_aio_read(self.image, at, len, ptr, c) })?;
            let n = (n as usize).min(len);
            if n < len {
                // Past the image end (only after a shrink): zeros.
                part[n..].fill(0);
            }
            pos += len;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.writable()?;
        let b = data.as_slice();
        let mut pos = 0;
        while pos < b.len() {
            let part = &b[pos..(pos + MAX_IO).min(b.len())];
            let (ptr, len) = (part.as_ptr() as *const c_char, part.len());
            let at = offset + pos as u64;
            // SAFETY: `ptr`/`len` is a live buffer borrowed until the
            // completion; librbd only reads it (zero-copy or not).
            self.aio(|c| unsafe { ffi::rbd_aio_write(self.image, at, len, ptr, c) })?;
            pos += len;
        }
        self.flush_if_cached(fua)
    }

    fn write_vectored(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        self.writable()?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total > MAX_IO || bufs.len() > 1024 {
            let mut pos = offset;
            for b in bufs {
                self.write(pos, WriteBuf::Borrowed(b), false)?;
                pos += b.len() as u64;
            }
            return self.flush_if_cached(fua);
        }
        let iov: Vec<ffi::iovec> = bufs
            .iter()
            .map(|b| ffi::iovec {
                iov_base: b.as_ptr() as *mut c_void,
                iov_len: b.len(),
            })
            .collect();
        let (ptr, n) = (iov.as_ptr(), iov.len() as c_int);
        // SAFETY: `iov` and the slices it points to stay alive until the
        // completion; librbd only reads them.
        self.aio(|c| unsafe { ffi::rbd_aio_writev(self.image, ptr, n, offset, c) })?;
        self.flush_if_cached(fua)
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only {
            return Ok(());
        }
        // SAFETY: open image handle and a fresh completion.
        self.aio(|c| unsafe { ffi::rbd_aio_flush(self.image, c) })
            .map(|_| ())
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.writable()?;
        // SAFETY: open image handle and a fresh completion.
        self.aio(|c| unsafe { ffi::rbd_aio_discard(self.image, offset, len, c) })
            .map(|_| ())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.writable()?;
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(1 << 30);
            let at = offset + pos;
            // SAFETY: open image handle and a fresh completion; no buffer.
            self.aio(|c| unsafe {
                ffi::rbd_aio_write_zeroes(self.image, at, n as usize, c, 0, 0)
            })?;
            pos += n;
        }
        self.flush_if_cached(fua)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_copied_unless_no_op_can_time_out() {
        // udm's default (30 s timeout): copy, the buffer may be reused while
        // a timed-out message still points at it.
        assert!(!zero_copy_writes(false, Some("30")));
        assert!(!zero_copy_writes(false, Some("30.000000")));
        assert!(!zero_copy_writes(false, None));
        assert!(!zero_copy_writes(false, Some("soon")));
        // The cache may keep the data past the completion.
        assert!(!zero_copy_writes(true, Some("0")));
        assert!(zero_copy_writes(false, Some("0")));
        assert!(zero_copy_writes(false, Some("0.000000")));
    }

    /// Without `conf=`, `$CEPH_CONF` (and librados' search with it, which
    /// also covers `./ceph.conf`) is not consulted.
    #[test]
    fn the_default_config_ignores_ceph_conf_and_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let planted = dir.path().join("ceph.conf");
        std::fs::write(&planted, "[global]\nmon_host = 192.0.2.77\n").unwrap();
        std::env::set_var("CEPH_CONF", &planted);
        let mut p = Partial {
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
        };
        // SAFETY: valid out-pointer; NULL id = client.admin.
        let r = unsafe { ffi::rados_create(&mut p.cluster, std::ptr::null()) };
        assert_eq!(r, 0, "rados_create");
        read_default_conf(&p).unwrap();
        let mon = p.conf_get(c"mon_host").unwrap_or_default();
        std::env::remove_var("CEPH_CONF");
        assert!(
            !mon.contains("192.0.2.77"),
            "planted config was read: {mon}"
        );
    }
}
