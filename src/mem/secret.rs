//! Memory for long-lived key material: page-aligned, locked into RAM
//! (`mlock`), left out of core dumps (`MADV_DONTDUMP`) and wiped on drop.
//!
//! Why: a crypt device keeps its key schedules for as long as it runs. If
//! their pages are swapped out, the key lands on a disk that may not be
//! encrypted; if the process dumps core, it lands in the dump. cryptsetup
//! and dm-crypt avoid both, and so does udm "where permitted": locking can
//! fail (no `CAP_IPC_LOCK` and a small `RLIMIT_MEMLOCK`), in which case the
//! memory is still wiped on drop and one debug message says so.
//!
//! Each object gets pages of its own because `mlock`/`munlock` work on
//! whole pages and do not nest: unlocking one object must never unlock a
//! neighbour that shares its page. Key objects are few (one per crypt
//! target and key slot), so a page each costs nothing that matters.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use zeroize::Zeroize;

use super::raw::{page_size, PAGE_SIZE};

/// A `T` on locked pages of its own; its bytes are zeroed after its own
/// `Drop` ran, whether or not `T` wipes itself.
pub struct Locked<T> {
    ptr: NonNull<T>,
    locked: bool,
}

// SAFETY: Locked<T> uniquely owns its T, like Box<T>.
unsafe impl<T: Send> Send for Locked<T> {}
// SAFETY: `&Locked<T>` only gives `&T`.
unsafe impl<T: Sync> Sync for Locked<T> {}

impl<T> Locked<T> {
    pub fn new(value: T) -> Locked<T> {
        let layout = Self::layout();
        // SAFETY: the layout's size is at least one page (never zero).
        let raw = unsafe { alloc_zeroed(layout) } as *mut T;
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is valid for writes of T (size and alignment come
        // from the layout) and uninhabited by any other value.
        unsafe { ptr.as_ptr().write(value) };
        let locked = protect(ptr.as_ptr() as *mut u8, layout.size());
        Locked { ptr, locked }
    }

    fn layout() -> Layout {
        let page = page_size();
        let size = std::mem::size_of::<T>().max(1).next_multiple_of(page);
        let align = std::mem::align_of::<T>().max(page);
        match Layout::from_size_align(size, align) {
            Ok(l) => l,
            // Only for types near usize::MAX bytes, which no key object is.
            Err(_) => panic!("a locked object of {size} bytes overflows a layout"),
        }
    }

    /// Whether the pages are locked in RAM (false where `mlock` was refused).
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl<T> Deref for Locked<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: `ptr` holds an initialised T owned by self until drop.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for Locked<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in deref; `&mut self` makes the access unique.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> Drop for Locked<T> {
    fn drop(&mut self) {
        let layout = Self::layout();
        let bytes = self.ptr.as_ptr() as *mut u8;
        // SAFETY: the T is initialised and dropped exactly once, here; after
        // that the pages are plain bytes we own (wiped with volatile writes
        // through zeroize), unlocked, and freed with the layout they were
        // allocated with.
        unsafe {
            std::ptr::drop_in_place(self.ptr.as_ptr());
            std::slice::from_raw_parts_mut(bytes, layout.size()).zeroize();
            unprotect(bytes, layout.size(), self.locked);
            dealloc(bytes, layout);
        }
    }
}

impl<T> std::fmt::Debug for Locked<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Locked(<hidden>, locked: {})", self.locked)
    }
}

/// Key bytes of a length known only at run time (a dm-crypt key from a
/// table line), on locked pages, wiped on drop.
pub struct SecretBytes {
    pages: Locked<[u8; PAGE_SIZE]>,
    len: usize,
}

/// Longest key a [`SecretBytes`] holds: one page (dm-crypt keys are at most
/// a few hundred bytes, 64 keys of 64 bytes for the largest keycount).
pub const SECRET_MAX: usize = PAGE_SIZE;

impl SecretBytes {
    /// Copy `key` into locked memory; `None` if it is longer than
    /// [`SECRET_MAX`].
    pub fn new(key: &[u8]) -> Option<SecretBytes> {
        if key.len() > SECRET_MAX {
            return None;
        }
        let mut pages = Locked::new([0u8; PAGE_SIZE]);
        pages[..key.len()].copy_from_slice(key);
        Some(SecretBytes {
            pages,
            len: key.len(),
        })
    }

    pub fn is_locked(&self) -> bool {
        self.pages.is_locked()
    }
}

impl Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.pages[..self.len]
    }
}

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes({} bytes, hidden)", self.len)
    }
}

/// Text that may hold keys (a loaded table line with a crypt key in hex),
/// of any length, on locked pages of its own that are left out of core
/// dumps and wiped on drop: the mapper keeps a table's text for as long as
/// the table is loaded, to re-compile it when a device under it changes.
pub struct SecretText {
    ptr: NonNull<u8>,
    len: usize,
    locked: bool,
}

// SAFETY: SecretText uniquely owns its pages, like Box<str>.
unsafe impl Send for SecretText {}
// SAFETY: `&SecretText` only gives `&str`.
unsafe impl Sync for SecretText {}

impl SecretText {
    pub fn new(text: &str) -> SecretText {
        let layout = Self::layout(text.len());
        // SAFETY: the layout's size is at least one page (never zero).
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `ptr` has room for at least `text.len()` bytes and does
        // not overlap `text`.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), ptr.as_ptr(), text.len()) };
        let locked = protect(ptr.as_ptr(), layout.size());
        SecretText {
            ptr,
            len: text.len(),
            locked,
        }
    }

    fn layout(len: usize) -> Layout {
        let page = page_size();
        let size = len.max(1).next_multiple_of(page);
        match Layout::from_size_align(size, page) {
            Ok(l) => l,
            // Only for texts near usize::MAX bytes, which no table is.
            Err(_) => panic!("a locked text of {size} bytes overflows a layout"),
        }
    }

    pub fn as_str(&self) -> &str {
        // SAFETY: the first `len` bytes were copied from a `&str` and are
        // never changed until drop, so they are valid UTF-8.
        unsafe {
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(self.ptr.as_ptr(), self.len))
        }
    }

    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl Clone for SecretText {
    fn clone(&self) -> SecretText {
        SecretText::new(self.as_str())
    }
}

impl Drop for SecretText {
    fn drop(&mut self) {
        let layout = Self::layout(self.len);
        let bytes = self.ptr.as_ptr();
        // SAFETY: the pages are ours, allocated with this layout; they are
        // wiped (volatile writes through zeroize), unlocked if locked, and
        // freed once.
        unsafe {
            std::slice::from_raw_parts_mut(bytes, layout.size()).zeroize();
            unprotect(bytes, layout.size(), self.locked);
            dealloc(bytes, layout);
        }
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretText({} bytes, hidden)", self.len)
    }
}

/// Lock `len` bytes at page-aligned `p` and keep them out of core dumps.
/// Returns whether the lock held; a refusal is reported once.
fn protect(p: *mut u8, len: usize) -> bool {
    static WARNED: AtomicBool = AtomicBool::new(false);
    // SAFETY: `p..p+len` is a live, page-aligned allocation owned by the
    // caller; mlock and madvise(MADV_DONTDUMP) change only paging and dump
    // attributes of those pages, never their contents.
    let (lock, _) = unsafe {
        (
            libc::mlock(p as *const libc::c_void, len),
            libc::madvise(p as *mut libc::c_void, len, libc::MADV_DONTDUMP),
        )
    };
    if lock != 0 && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "key memory could not be locked into RAM (raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK); keys are still wiped on drop"
        );
    }
    lock == 0
}

/// Undo [`protect`] before the pages go back to the allocator: unlocked,
/// and dumpable again. Why the second: `MADV_DONTDUMP` is a flag of the
/// mapping, so pages that keep it after they are freed split the heap's
/// mappings from their neighbours' for good; a server that opens and
/// closes volumes (or tries many headers) then grows its mapping count
/// until `mmap` fails at `vm.max_map_count`. With the flags back as they
/// were, the kernel merges the pieces again.
///
/// # Safety
/// `p..p+len` is a live, page-aligned allocation owned by the caller that
/// [`protect`] was called on.
unsafe fn unprotect(p: *mut u8, len: usize, locked: bool) {
    // SAFETY: as the caller promises; munlock and MADV_DODUMP change only
    // paging and dump attributes of those pages.
    unsafe {
        if locked {
            libc::munlock(p as *const libc::c_void, len);
        }
        libc::madvise(p as *mut libc::c_void, len, libc::MADV_DODUMP);
    }
}

/// Makes the process non-dumpable and gives it no core file size, for
/// the processes that hold volume keys (`udm serve`, the cryptsetup and
/// LUKS verbs). Locked pages are already `MADV_DONTDUMP`, but keys also
/// pass through ordinary heap and thread stacks (parsed table words, hash
/// states, hex text) where a crash's core dump or a same-uid `ptrace`
/// would find them. Non-dumpable also makes `/proc/PID/mem` readable only
/// with `CAP_SYS_PTRACE`. Call it early, before any key is read.
pub fn forbid_core_dumps() -> std::io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes plain integers and touches no memory
    // of ours.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `none` is a valid, initialised rlimit that outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// [`forbid_core_dumps`] for a command's start: a failure is logged, not
/// fatal (the keys are still locked and wiped).
pub fn forbid_core_dumps_or_warn() {
    if let Err(e) = forbid_core_dumps() {
        tracing::warn!("cannot keep keys out of core dumps (prctl/setrlimit): {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Whether this process may lock a few pages: root (CAP_IPC_LOCK) or a
    /// memlock limit with room.
    fn may_lock() -> bool {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit through a valid pointer.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
        // SAFETY: geteuid has no preconditions.
        (unsafe { libc::geteuid() } == 0) || (ok && r.rlim_cur >= 1 << 20)
    }

    #[test]
    fn locked_objects_are_page_aligned_locked_and_dropped() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Key([u8; 64]);
        impl Drop for Key {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let k = Locked::new(Key([7; 64]));
        assert_eq!(&*k as *const Key as usize % page_size(), 0);
        assert_eq!(k.0, [7; 64]);
        if may_lock() {
            assert!(k.is_locked(), "mlock refused although permitted");
        }
        assert!(!format!("{k:?}").contains('7'));
        drop(k);
        assert_eq!(DROPS.load(Ordering::SeqCst), 1, "T's own Drop must run");
    }

    #[test]
    fn secret_bytes_hold_the_key_and_refuse_oversize() {
        let s = SecretBytes::new(&[0xab; 64]).unwrap();
        assert_eq!(&s[..], &[0xab; 64][..]);
        assert_eq!(s.len(), 64);
        if may_lock() {
            assert!(s.is_locked());
        }
        assert!(!format!("{s:?}").contains("ab"));
        assert!(SecretBytes::new(&[0; SECRET_MAX + 1]).is_none());
        assert_eq!(SecretBytes::new(&[]).unwrap().len(), 0);
    }

    #[test]
    fn forbid_core_dumps_makes_the_process_non_dumpable_with_no_core_limit() {
        // SAFETY: the child only makes system calls (no allocation on the
        // success path) and leaves with `_exit`, so forking a threaded
        // test process is sound; the parent waits for it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: PR_GET_DUMPABLE takes no pointer.
            let before = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
            let ok = forbid_core_dumps().is_ok();
            // SAFETY: PR_GET_DUMPABLE takes no pointer.
            let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE) };
            let mut lim = libc::rlimit {
                rlim_cur: 1,
                rlim_max: 1,
            };
            // SAFETY: `lim` is a valid out-pointer for the call.
            let r = unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut lim) };
            let code = if !ok || before != 1 {
                2
            } else if dumpable != 0 {
                3
            } else if r != 0 || lim.rlim_cur != 0 || lim.rlim_max != 0 {
                4
            } else {
                0
            };
            // SAFETY: ends the forked child without running the parent's
            // destructors or atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` a valid out-pointer.
        let w = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(w, pid);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "2 = call failed or already non-dumpable, 3 = still dumpable, 4 = core limit not 0"
        );
    }

    #[test]
    fn secret_text_of_any_length_reads_back_and_clones() {
        let long = "0 8 crypt aes-xts-plain64 ".repeat(400);
        for t in ["", "x", long.as_str()] {
            let s = SecretText::new(t);
            assert_eq!(s.as_str(), t);
            assert_eq!(s.clone().as_str(), t);
            assert!(!format!("{s:?}").contains("crypt"));
        }
    }
}
