//! A file's pages mapped into udm, for direct access to files on tmpfs.
//!
//! On tmpfs the page cache *is* the storage, so a `pwrite` is a copy into
//! it under the file's inode lock, and an encrypted write through the crypt
//! target costs a cipher pass plus that copy. Mapped, the cipher writes the
//! ciphertext straight into the file's pages (and reads decrypt straight
//! out of them), the way the kernel's DAX lets dm-crypt's peers skip the
//! page cache on persistent memory.
//!
//! The price of a mapping is SIGBUS: when the file shrinks under udm
//! (another program truncates it) or tmpfs cannot allocate a page for a
//! hole (the filesystem is full), touching the page raises SIGBUS instead
//! of returning an error. A crash there would be a data-losing surprise, so
//! every mapping is registered with a process-wide SIGBUS handler: a fault
//! inside a registered mapping replaces the faulting page with an anonymous
//! one (the access completes, harmlessly) and counts the fault. Callers read
//! the count before and after each access; any fault fails the request with
//! an I/O error, and the store stops using the mapping for good (back to
//! `pread`/`pwrite`, which report such conditions as errors). Faults
//! outside udm's mappings are passed to the handler that was there before
//! (Rust's stack-overflow reporter, or the default action).

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// One registered mapping, read by the signal handler without locks.
struct Slot {
    used: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    faults: AtomicU64,
}

/// How many mappings may exist at once; a store that finds no free slot is
/// simply not mapped (it keeps the `pread`/`pwrite` path).
const SLOTS: usize = 64;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    used: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faults: AtomicU64::new(0),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The SIGBUS action that was installed before ours, for faults that are
/// not ours. Written once, before our handler is installed.
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The page size, read once at install time: `sysconf` is not on the list
/// of functions a signal handler may call.
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn page_size() -> usize {
    match PAGE_SIZE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf has no memory-safety preconditions.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let p = if p > 0 { p as usize } else { 4096 };
            PAGE_SIZE.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // A fault has a positive si_code; a SIGBUS sent with kill() or
    // raise() (si_code <= 0) is never ours, whatever si_addr holds.
    let fault = code > 0;
    for slot in TABLE.iter().filter(|_| fault) {
        let start = slot.start.load(Ordering::Acquire);
        if start != 0 && addr >= start && addr < slot.end.load(Ordering::Acquire) {
            let page = addr & !(PAGE_SIZE.load(Ordering::Relaxed) - 1);
            // Count first: a reader racing this fault that finds the
            // swapped-in page (zeros) must also find the fault counted, so
            // it fails instead of returning those zeros as data.
            slot.faults.fetch_add(1, Ordering::AcqRel);
            // SAFETY: the page lies inside a mapping udm owns (registered
            // in the table until just before it is unmapped); replacing it
            // with anonymous memory lets the faulting access complete. mmap
            // is a plain system call, safe to make in a signal handler.
            unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    page_size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            return;
        }
    }
    // Not ours: hand over to whoever was there before.
    // SAFETY: PREVIOUS was written before this handler was installed and
    // never again.
    let prev = unsafe { (*std::ptr::addr_of!(PREVIOUS)).assume_init_ref() };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // Restore the default action; returning re-runs the faulting
        // instruction, which now takes it (a core dump, as without udm). A
        // sent signal is sent again: it stays pending until we return.
        // SAFETY: resetting a signal disposition (the struct is zeroed) and
        // raise are both async-signal-safe.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            if !fault {
                libc::raise(sig);
            }
        }
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed as an SA_SIGINFO
        // handler with this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

fn install() -> bool {
    INSTALL.call_once(|| {
        page_size();
        // SAFETY: sigaction with a zeroed struct, our handler and an empty
        // mask; PREVIOUS receives the old action before the new one can
        // run (the kernel writes oldact before installing act).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            let prev = (*std::ptr::addr_of_mut!(PREVIOUS)).as_mut_ptr();
            if libc::sigaction(libc::SIGBUS, &act, prev) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
    INSTALLED.load(Ordering::Acquire)
}

/// A shared mapping of a whole file, registered with the SIGBUS handler.
pub(crate) struct FileMap {
    ptr: *mut u8,
    len: usize,
    slot: &'static Slot,
}

// SAFETY: the mapping is plain memory shared by the process; the users
// (MemStore's region locks) order the accesses.
unsafe impl Send for FileMap {}
// SAFETY: as above; the slot is atomics only.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Map the first `len` bytes of `file` (read-write when `writable`).
    /// `None` when the process cannot take another mapping or the handler
    /// could not be installed; the caller then keeps its syscall path.
    pub(crate) fn new(file: &File, len: usize, writable: bool) -> std::io::Result<Option<FileMap>> {
        if len == 0 || !install() {
            return Ok(None);
        }
        let Some(slot) = TABLE.iter().find(|s| {
            s.used
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }) else {
            return Ok(None);
        };
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of an open descriptor; the kernel
        // picks the address, nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            slot.used.store(false, Ordering::Release);
            return Err(std::io::Error::last_os_error());
        }
        slot.faults.store(0, Ordering::Relaxed);
        slot.end.store(p as usize + len, Ordering::Release);
        slot.start.store(p as usize, Ordering::Release);
        Ok(Some(FileMap {
            ptr: p as *mut u8,
            len,
            slot,
        }))
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// SIGBUS faults taken inside this mapping so far.
    pub(crate) fn faults(&self) -> u64 {
        self.slot.faults.load(Ordering::Acquire)
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        self.slot.start.store(0, Ordering::Release);
        self.slot.end.store(0, Ordering::Release);
        // SAFETY: the mapping was created by `new` with this length and no
        // reference into it outlives the store that owns it.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        self.slot.used.store(false, Ordering::Release);
    }
}

/// Whether `file` lives on tmpfs, where mapping pays (see the module doc).
pub(crate) fn on_tmpfs(file: &File) -> bool {
    const TMPFS_MAGIC: libc::c_long = 0x0102_1994;
    // SAFETY: fstatfs writes one statfs struct through a valid pointer.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut st) == 0 && st.f_type as libc::c_long == TMPFS_MAGIC
    }
}
