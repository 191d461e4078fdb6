//! "This thread reads for one client only": set by an NBD event loop
//! while it drives a connection and serves no other, read by stores whose
//! calls may block (a buffered write to an ext4 file) to run such a call
//! right here instead of handing it to a writer thread.
//!
//! Why: the hand-off costs a wake-up and a context switch each way, which
//! on two cores was about half the server's CPU for 4 KiB writes, which
//! then ran behind nbdkit's file plugin (whose threads call `pwrite`
//! themselves) and ahead of it inline (docs/BENCHMARKS.md). A call that blocks here delays only the one client this loop
//! reads for, which could not have been served sooner: the filesystem runs
//! one file's buffered writes one at a time anyway. A loop with a second
//! connection never sets the flag, so one client's stalled write never
//! holds up another's requests.

use std::cell::Cell;

thread_local! {
    static SOLE: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with the flag set to `sole` on this thread (restored after).
pub fn with_sole_client<R>(sole: bool, f: impl FnOnce() -> R) -> R {
    let was = SOLE.with(|s| s.replace(sole));
    let r = f();
    SOLE.with(|s| s.set(was));
    r
}

/// Whether this thread reads for one client only (see the module doc).
pub fn sole_client() -> bool {
    SOLE.with(|s| s.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_holds_inside_and_is_restored_after() {
        assert!(!sole_client());
        with_sole_client(true, || {
            assert!(sole_client());
            with_sole_client(false, || assert!(!sole_client()));
            assert!(sole_client());
        });
        assert!(!sole_client());
        // Another thread never sees this one's flag.
        with_sole_client(true, || {
            std::thread::spawn(|| assert!(!sole_client()))
                .join()
                .unwrap();
        });
    }
}
