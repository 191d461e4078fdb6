//! Fault containment: one device's failure stays that device's.
//!
//! Targets parse untrusted on-disk formats, and a bug in one of them (a
//! panic on a corrupt node, an allocation refused) must not take every
//! other device, the control socket or the process with it. The kernel
//! gets this from the block layer: a target that hits damage errors its
//! own bios and flips itself to a failure mode (dm-thin's `Fail`). udm
//! runs every target in one process, so the boundary is drawn here:
//!
//! - each managed device owns a [`Fault`]: once set, every request of the
//!   device fails with EIO and `status`/`info` say why;
//! - the places where device code runs on a thread it does not own (the
//!   request path under `dm::LiveDevice`, the control verbs, background
//!   jobs started with [`spawn_job`], completions run by a store's threads
//!   through [`run_callback`]) catch a panic there and turn it into that
//!   device's failure instead of unwinding through a shared thread.
//!
//! A runaway loop cannot be caught; the on-disk walks bound themselves
//! instead (see each format's reader).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::error::{DevError, DevResult};

/// Called once when a device fails, with the reason (the device's owner
/// raises an event and logs the device's name).
pub type FailHook = Box<dyn Fn(&str) + Send + Sync>;

/// Whether a device has failed, and why. The flag is read on every
/// request; it is written once, so its cache line stays shared clean on
/// every core.
#[derive(Default)]
pub struct Fault {
    failed: AtomicBool,
    reason: OnceLock<String>,
    hook: Mutex<Option<FailHook>>,
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fault")
            .field("reason", &self.reason.get())
            .finish()
    }
}

impl Fault {
    pub fn new() -> Fault {
        Fault::default()
    }

    /// `Ok` while the device works; its failure as an I/O error after.
    #[inline]
    pub fn check(&self) -> DevResult<()> {
        if self.failed.load(Ordering::Acquire) {
            Err(self.error())
        } else {
            Ok(())
        }
    }

    /// The error every request of a failed device gets (EIO).
    pub fn error(&self) -> DevError {
        DevError::Target(format!(
            "the device has failed ({}); remove it and create it again once the cause is \
             fixed",
            self.reason().unwrap_or("unknown reason")
        ))
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Why the device failed, if it has.
    pub fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }

    /// Fail the device for `why`. The first reason wins and is the only
    /// one reported; the hook runs once.
    pub fn fail(&self, why: impl Into<String>) {
        if self.reason.set(why.into()).is_err() {
            return;
        }
        self.failed.store(true, Ordering::Release);
        let reason = self.reason().unwrap_or_default();
        let hook = self.hook.lock().unwrap_or_else(|p| p.into_inner());
        match hook.as_ref() {
            Some(h) => h(reason),
            None => tracing::error!("a device failed: {reason}"),
        }
    }

    /// Who hears of the failure: set by the device's owner when it is
    /// created, replaced on rename (a failure is reported once, to the
    /// hook of that moment).
    pub fn on_fail(&self, hook: FailHook) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// Run `f`, device code, on the caller's thread: a panic inside fails
    /// this device and becomes an error for the caller.
    #[inline]
    pub fn contain<R>(&self, what: &str, f: impl FnOnce() -> DevResult<R>) -> DevResult<R> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(p) => {
                self.fail(format!("{what} panicked: {}", panic_message(&*p)));
                Err(self.error())
            }
        }
    }
}

/// The text a panic carried (`panic!`'s message), for the log and status.
pub fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Start a device's background job (merge, journal writeback, timed
/// commit, recalculation) on its own thread: a panic there fails
/// `fault`'s device, not the process, and the thread ends.
pub fn spawn_job<F>(
    name: String,
    fault: Option<Arc<Fault>>,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    let label = name.clone();
    std::thread::Builder::new().name(name).spawn(move || {
        if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
            let why = format!("background job {label} panicked: {}", panic_message(&*p));
            match fault {
                Some(f) => f.fail(why),
                None => tracing::error!("{why}"),
            }
        }
    })
}

/// Run a completion or other device callback on a store's own thread
/// (an io_uring reaper, a writer, librbd's callback, an NBD client's
/// reader): a panic in it is logged and the thread goes on serving the
/// other devices. Whoever waited for the callback learns of it through
/// the completion's own guard (a dropped completion fails its request
/// and its device; see `dm::LiveDevice::submit`).
pub fn run_callback(thread: &str, f: impl FnOnce()) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
        tracing::error!(
            "a device callback panicked on {thread}: {}; that request failed and the \
             thread goes on",
            panic_message(&*p)
        );
    }
}

/// Test-only fault injection: with the `test-hooks` feature, panic here
/// when `UDM_TEST_PANIC` (read once; a comma-separated list) names
/// `point`, e.g. `thin.io,thin.commit`, and, if `UDM_TEST_PANIC_ARM`
/// names a file, only once that file exists (so a test sets its devices
/// up first). Without the feature it compiles to nothing.
#[inline(always)]
pub fn inject(point: &str) {
    inject_at(point, "");
}

/// [`inject`] for a point of one kind of thing: `load` and `thin-pool`
/// fire on `UDM_TEST_PANIC=load:thin-pool`.
#[inline(always)]
pub fn inject_at(kind: &str, name: &str) {
    #[cfg(feature = "test-hooks")]
    {
        static ARMED: OnceLock<Vec<String>> = OnceLock::new();
        let armed = ARMED.get_or_init(|| {
            std::env::var("UDM_TEST_PANIC")
                .map(|v| v.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        });
        let hit = |a: &String| match a.split_once(':') {
            Some((k, n)) => k == kind && n == name,
            None => name.is_empty() && a == kind,
        };
        static ARM: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
        let fire = || {
            ARM.get_or_init(|| std::env::var_os("UDM_TEST_PANIC_ARM").map(Into::into))
                .as_ref()
                .is_none_or(|f| f.exists())
        };
        if armed.iter().any(hit) && fire() {
            panic!("injected panic at {kind}:{name} (UDM_TEST_PANIC)");
        }
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = (kind, name);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_contained_panic_fails_the_device_once_and_later_calls_get_eio() {
        let f = Arc::new(Fault::new());
        let heard = Arc::new(AtomicUsize::new(0));
        let h = heard.clone();
        f.on_fail(Box::new(move |why| {
            assert!(why.contains("boom"), "{why}");
            h.fetch_add(1, Ordering::SeqCst);
        }));
        assert!(f.check().is_ok());
        let r: DevResult<()> = f.contain("read", || panic!("boom"));
        assert!(matches!(r, Err(DevError::Target(ref m)) if m.contains("read panicked: boom")));
        assert!(f.is_failed());
        assert!(f.check().is_err());
        // A second failure keeps the first reason and does not re-notify.
        f.fail("later");
        assert!(f.reason().unwrap().contains("boom"));
        assert_eq!(heard.load(Ordering::SeqCst), 1);
        assert_eq!(f.check().unwrap_err().nbd_errno(false), 5);
    }

    #[test]
    fn a_panicking_job_fails_its_device_and_not_the_caller() {
        let f = Arc::new(Fault::new());
        let t = spawn_job("job".into(), Some(f.clone()), || panic!("in the job")).unwrap();
        t.join().unwrap();
        assert!(f
            .reason()
            .unwrap()
            .contains("background job job panicked: in the job"));
    }
}
