//! How a LUKS operation talks to its user without knowing the terminal:
//! the command-line layers implement [`Feedback`] (a spinner or bar on a
//! terminal, nothing in a pipe; `YES` typed at a prompt, or batch mode),
//! and `luks` stays free of argv and tty handling.

use super::error::LuksError;

/// Progress and questions of a long or destructive LUKS operation.
pub trait Feedback {
    /// A step starts: `total` bytes of work, or 0 for a step of unknown
    /// length (a KDF benchmark).
    fn begin(&self, _what: &str, _total: u64) {}
    /// `done` bytes of the current step are finished.
    fn advance(&self, _done: u64) {}
    /// The current step is over.
    fn end(&self) {}
    /// Ask before something irreversible; true only if the user agrees
    /// (cryptsetup's rule: typing `YES`). Batch mode answers true.
    fn confirm(&self, question: &str) -> Result<bool, LuksError>;
    /// udm's own verbs ask before destroying the last keyslot even when
    /// the passphrase came from a key file; cryptsetup does not.
    fn always_confirm_last_slot(&self) -> bool {
        false
    }
    /// A warning for the user (stderr).
    fn warn(&self, msg: &str) {
        eprintln!("WARNING: {msg}");
    }
    /// A warning libcryptsetup prints on its normal log, i.e. stdout
    /// (scripts that compare cryptsetup's output see it there).
    fn notice(&self, msg: &str) {
        println!("WARNING: {msg}");
    }
}

/// No output, every question answered yes: tests and callers that have
/// already asked.
pub struct Quiet;

impl Feedback for Quiet {
    fn confirm(&self, _question: &str) -> Result<bool, LuksError> {
        Ok(true)
    }
    fn warn(&self, _msg: &str) {}
    fn notice(&self, _msg: &str) {}
}
