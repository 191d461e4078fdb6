//! The terminal side of LUKS operations ([`Feedback`]): progress on a
//! terminal's stderr (nothing in a pipe), and confirmation questions.
//!
//! Two question styles. cryptsetup's (for `udm cryptsetup`): the question
//! goes to stdout, the answer is a line on stdin that must be `YES`; when
//! stdin is not a terminal the question is not asked and the answer is
//! yes, exactly as cryptsetup does. udm's own verbs are stricter: they ask
//! on /dev/tty and, with no terminal, refuse unless `--batch-mode`.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;

/// How to ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Cryptsetup,
    Strict,
}

pub struct Ui {
    pub batch: bool,
    pub style: Style,
    /// Show warnings (cryptsetup prints them also in batch mode).
    pub quiet_warnings: bool,
    bar: std::cell::RefCell<Option<indicatif::ProgressBar>>,
}

impl Ui {
    pub fn new(batch: bool, style: Style) -> Ui {
        Ui {
            batch,
            style,
            quiet_warnings: false,
            bar: std::cell::RefCell::new(None),
        }
    }
}

impl Feedback for Ui {
    fn begin(&self, what: &str, total: u64) {
        if !std::io::stderr().is_terminal() {
            return;
        }
        let pb = if total == 0 {
            let pb = indicatif::ProgressBar::new_spinner();
            pb.enable_steady_tick(Duration::from_millis(120));
            pb
        } else {
            indicatif::ProgressBar::new(total)
        };
        pb.set_message(what.to_string());
        *self.bar.borrow_mut() = Some(pb);
    }

    fn advance(&self, done: u64) {
        if let Some(pb) = &*self.bar.borrow() {
            pb.set_position(done);
        }
    }

    fn end(&self) {
        if let Some(pb) = self.bar.borrow_mut().take() {
            pb.finish_and_clear();
        }
    }

    fn confirm(&self, question: &str) -> Result<bool, LuksError> {
        if self.batch {
            return Ok(true);
        }
        match self.style {
            Style::Cryptsetup => {
                if !std::io::stdin().is_terminal() {
                    return Ok(true);
                }
                let mut out = std::io::stdout().lock();
                let _ = write!(
                    out,
                    "\nWARNING!\n========\n{question}\n\nAre you sure? (Type 'yes' in capital letters): "
                );
                let _ = out.flush();
                let mut line = String::new();
                std::io::stdin()
                    .lock()
                    .read_line(&mut line)
                    .map_err(|e| LuksError::io("Error reading response from terminal", e))?;
                Ok(line == "YES\n")
            }
            Style::Strict => crate::luks::passphrase::confirm(&format!(
                "\nWARNING!\n========\n{question}\n\nAre you sure? (Type 'YES' in capital letters): "
            )),
        }
    }

    fn always_confirm_last_slot(&self) -> bool {
        self.style == Style::Strict
    }

    fn warn(&self, msg: &str) {
        if !self.quiet_warnings {
            eprintln!("WARNING: {msg}");
        }
    }
}

/// Write `o` to stdout (plus a newline if `nl`); a closed pipe (`| head`)
/// ends quietly. Here, below every personality, so that none of them
/// reaches into another for it.
pub(crate) fn emit(o: &[u8], nl: bool) -> Result<(), LuksError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let r = out
        .write_all(o)
        .and_then(|_| if nl { out.write_all(b"\n") } else { Ok(()) })
        .and_then(|_| out.flush());
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(LuksError::io("cannot write to standard output", e)),
    }
}
