//! Getting a passphrase the way cryptsetup does.
//!
//! - A key file (`--key-file F`): its bytes from `--keyfile-offset`, all of
//!   them up to the 8 MiB limit or exactly `--keyfile-size`; newlines are
//!   key bytes. `-` is standard input read the same way.
//! - No key file, standard input a terminal: a prompt, echo off, one line
//!   without its newline (at most 512 characters), optionally asked twice
//!   and with a timeout.
//! - No key file, standard input not a terminal: one line from standard
//!   input, the newline stripped.
//!
//! Every byte lands in a [`SecretBuf`] sized before reading (no growth, so
//! no unwiped copy), locked in RAM where permitted and wiped on drop.

use super::error::LuksError;
use super::secret::SecretBuf;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::termios::{OptionalActions, Termios};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zeroize::Zeroize;

/// cryptsetup's default key file size limit (8 MiB).
pub const MAX_KEYFILE: u64 = 8 * 1024 * 1024;
/// cryptsetup's limit on an interactive passphrase.
pub const MAX_PASSPHRASE: usize = 512;

/// Where a passphrase comes from, with cryptsetup's key file options.
#[derive(Clone, Debug, Default)]
pub struct KeySource {
    /// `--key-file`; `-` is standard input.
    pub key_file: Option<PathBuf>,
    /// `--keyfile-offset`: bytes skipped at the start.
    pub offset: u64,
    /// `--keyfile-size`: exactly this many bytes are read (0/None: all).
    pub size: Option<u64>,
    /// `--timeout` for the terminal prompt (None: wait forever).
    pub timeout: Option<Duration>,
    /// `--verify-passphrase`: ask twice on a terminal even for a
    /// passphrase that already exists (a typo would otherwise only show
    /// as a wrong passphrase, or, for plain mode, as a wrong key).
    pub verify: bool,
}

impl KeySource {
    /// A whole key file (or `-`), as `udm luks --key-file` reads it.
    pub fn file(p: Option<&Path>) -> KeySource {
        KeySource {
            key_file: p.map(Path::to_path_buf),
            ..KeySource::default()
        }
    }

    /// True when the passphrase will be typed on a terminal, so a wrong one
    /// may be asked again (`--tries`).
    pub fn interactive(&self) -> bool {
        let stdin_kf = self.key_file.as_deref().is_none_or(|p| p == Path::new("-"));
        stdin_kf && std::io::stdin().is_terminal_fd()
    }

    /// Read the passphrase. `verify` asks twice on a terminal (a new
    /// passphrase); `prompt` is shown only on a terminal.
    pub fn read(&self, prompt: &str, verify: bool) -> Result<SecretBuf, LuksError> {
        match self.key_file.as_deref() {
            Some(p) if p != Path::new("-") => {
                warn_if_readable_by_others(p);
                // cryptsetup: a key file that cannot be opened is a wrong
                // parameter (exit 1), not a wrong device.
                let f = std::fs::File::open(p).map_err(|e| {
                    LuksError::Usage(format!("Failed to open key file {}: {e}.", p.display()))
                })?;
                let regular = f.metadata().map(|m| m.is_file()).unwrap_or(false);
                let known = f.metadata().map(|m| m.len()).ok().filter(|_| regular);
                read_limited(
                    f,
                    known,
                    self.offset,
                    self.size,
                    false,
                    &p.display().to_string(),
                )
            }
            kf => {
                let stdin = std::io::stdin();
                if stdin.is_terminal_fd() {
                    if self.offset != 0 {
                        return Err(LuksError::Usage(
                            "Cannot use offset with terminal input.".into(),
                        ));
                    }
                    prompt_stdin_tty(prompt, verify || self.verify, self.timeout)
                } else {
                    // Without --key-file, a pipe gives one line; with
                    // --key-file=- it is read like a file.
                    let stop_eol = kf.is_none();
                    read_limited(
                        stdin.lock(),
                        None,
                        self.offset,
                        self.size,
                        stop_eol,
                        "standard input",
                    )
                }
            }
        }
    }
}

trait TerminalFd {
    fn is_terminal_fd(&self) -> bool;
}

impl<T: AsFd> TerminalFd for T {
    fn is_terminal_fd(&self) -> bool {
        rustix::termios::isatty(self)
    }
}

/// cryptsetup's rules for a key file or piped input: skip `offset`, read
/// exactly `size` bytes if given (fewer is an error), else everything up to
/// [`MAX_KEYFILE`] (more is an error); `stop_eol` ends at a newline, which
/// is not part of the passphrase. The buffer is sized from the file size
/// when it is known, else from the limit.
fn read_limited(
    mut r: impl Read,
    known_len: Option<u64>,
    offset: u64,
    size: Option<u64>,
    stop_eol: bool,
    what: &str,
) -> Result<SecretBuf, LuksError> {
    let size = size.filter(|&s| s > 0);
    let limit = size.unwrap_or(MAX_KEYFILE + 1);
    if let Some(n) = known_len {
        if offset > n {
            return Err(LuksError::Usage(format!(
                "Cannot seek to requested keyfile offset in {what}."
            )));
        }
    }
    let cap = match known_len {
        Some(n) => (n - offset).min(limit),
        None => limit,
    };
    if offset > 0 {
        let skipped = std::io::copy(&mut (&mut r).take(offset), &mut std::io::sink())
            .map_err(|e| LuksError::io(format!("Cannot read {what}"), e))?;
        if skipped != offset {
            return Err(LuksError::Usage(format!(
                "Cannot seek to requested keyfile offset in {what}."
            )));
        }
    }
    let mut buf = SecretBuf::with_capacity(cap as usize);
    let mut newline = false;
    loop {
        if buf.len() as u64 >= limit {
            break;
        }
        let want = if stop_eol {
            1
        } else {
            (limit - buf.len() as u64).min(buf.spare().len() as u64) as usize
        };
        if want == 0 {
            break;
        }
        let n = {
            let spare = buf.spare();
            let want = want.min(spare.len());
            if want == 0 {
                break;
            }
            match r.read(&mut spare[..want]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(LuksError::io(
                        format!("Error reading passphrase from {what}"),
                        e,
                    ))
                }
            }
        };
        if n == 0 {
            break;
        }
        if stop_eol && buf.spare()[0] == b'\n' {
            buf.spare()[0] = 0;
            newline = true;
            break;
        }
        buf.advance(n);
    }
    if buf.is_empty() && known_len.is_none() && !newline {
        return Err(LuksError::NoInput(what.to_string()));
    }
    if size.is_none() && buf.len() as u64 > MAX_KEYFILE {
        return Err(LuksError::Usage(format!(
            "Maximum keyfile size exceeded ({what} is larger than {MAX_KEYFILE} bytes)."
        )));
    }
    if let Some(s) = size {
        if buf.len() as u64 != s {
            return Err(LuksError::Usage(format!(
                "Cannot read requested amount of data ({s} bytes) from {what}."
            )));
        }
    }
    Ok(buf)
}

/// A key file that group or others may read is a key anyone on the machine
/// may use; say so (as systemd-cryptsetup does), but go on.
pub fn warn_if_readable_by_others(p: &Path) {
    static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    if let Ok(mut w) = WARNED.lock() {
        if w.iter().any(|x| x == p) {
            return;
        }
        w.push(p.to_path_buf());
    }
    if let Ok(m) = std::fs::metadata(p) {
        if m.is_file() && m.mode() & 0o077 != 0 {
            eprintln!(
                "WARNING: key file {} is readable by group or others (mode {:04o}); \
                 restrict it with chmod 600.",
                p.display(),
                m.mode() & 0o7777
            );
        }
    }
}

/// A table file holding a crypt key is a key file by another name: warn
/// the same way when group or others may read it. A key given as a
/// keyring reference (`:SIZE:TYPE:DESC`) or `-` is not in the file.
pub fn warn_if_table_key_readable(p: &Path, text: &str) {
    let holds_key = text.lines().any(|l| {
        let mut f = l.split_whitespace();
        f.nth(2) == Some("crypt")
            && f.nth(1)
                .is_some_and(|key| key != "-" && !key.starts_with(':'))
    });
    if !holds_key {
        return;
    }
    if let Ok(m) = std::fs::metadata(p) {
        if m.is_file() && m.mode() & 0o077 != 0 {
            eprintln!(
                "WARNING: table file {} holds a crypt key and is readable by group or \
                 others (mode {:04o}); restrict it with chmod 600.",
                p.display(),
                m.mode() & 0o7777
            );
        }
    }
}

/// Restores terminal attributes on drop (also on error paths).
struct EchoGuard<'a> {
    fd: BorrowedFd<'a>,
    saved: Termios,
}

impl Drop for EchoGuard<'_> {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(self.fd, OptionalActions::Flush, &self.saved);
    }
}

/// Switch echo off on terminal `fd` (canonical mode on, so the line
/// arrives whole); the guard puts the old settings back.
fn echo_off(fd: BorrowedFd<'_>) -> Result<EchoGuard<'_>, LuksError> {
    let saved = rustix::termios::tcgetattr(fd)
        .map_err(|e| LuksError::io("cannot read terminal settings", e.into()))?;
    let mut quiet = saved.clone();
    quiet.local_modes -= rustix::termios::LocalModes::ECHO | rustix::termios::LocalModes::ECHONL;
    quiet.local_modes |= rustix::termios::LocalModes::ICANON;
    let guard = EchoGuard { fd, saved };
    rustix::termios::tcsetattr(fd, OptionalActions::Flush, &quiet)
        .map_err(|e| LuksError::io("cannot switch off terminal echo", e.into()))?;
    Ok(guard)
}

/// False if nothing arrives on `fd` within `timeout` (capped at
/// i32::MAX milliseconds, poll(2)'s limit); a poll error lets the read
/// report it.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let t = timeout.min(Duration::from_millis(i32::MAX as u64));
    let Ok(ts) = Timespec::try_from(t) else {
        return true;
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    !matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(0))
}

/// One line from terminal `fd` with echo off, into a buffer of
/// [`MAX_PASSPHRASE`] + 1 bytes; `timeout` bounds the wait for each byte.
fn read_tty_line(
    fd: BorrowedFd<'_>,
    out: &mut dyn Write,
    prompt: &str,
    timeout: Option<Duration>,
) -> Result<SecretBuf, LuksError> {
    let guard = echo_off(fd)?;
    let _ = out.write_all(prompt.as_bytes());
    let _ = out.flush();
    let mut line = SecretBuf::with_capacity(MAX_PASSPHRASE + 1);
    let mut byte = [0u8; 1];
    let result = loop {
        if timeout.is_some_and(|t| !wait_readable(fd, t)) {
            drop(guard);
            let _ = out.write_all(b"\n");
            return Err(LuksError::Usage(
                "Timeout reached while waiting for the passphrase.".into(),
            ));
        }
        let n = match rustix::io::read(fd, &mut byte) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                break Err(LuksError::io(
                    "Error reading passphrase from terminal",
                    e.into(),
                ))
            }
        };
        if n == 0 || byte[0] == b'\n' {
            break Ok(());
        }
        if line.push(byte[0]).is_err() || line.len() > MAX_PASSPHRASE {
            break Err(LuksError::Usage(format!(
                "passphrase longer than {MAX_PASSPHRASE} characters"
            )));
        }
    };
    byte.zeroize();
    drop(guard);
    result?;
    let _ = out.write_all(b"\n");
    Ok(line)
}

fn prompt_stdin_tty(
    prompt: &str,
    verify: bool,
    timeout: Option<Duration>,
) -> Result<SecretBuf, LuksError> {
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let mut err = std::io::stderr();
    let p = read_tty_line(fd, &mut err, prompt, timeout)?;
    if verify {
        let again = read_tty_line(fd, &mut err, "Verify passphrase: ", timeout)?;
        if again != p {
            return Err(LuksError::Mismatch);
        }
    }
    Ok(p)
}

/// The passphrase from `key_file` (whole content; `-` = stdin), or asked
/// for on the terminal.
pub fn read_passphrase(key_file: Option<&Path>, prompt: &str) -> Result<SecretBuf, LuksError> {
    KeySource::file(key_file).read(prompt, false)
}

/// Prompt on /dev/tty without echo; strips the trailing newline.
pub fn prompt_tty(prompt: &str) -> Result<SecretBuf, LuksError> {
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|_| {
            LuksError::Usage(
                "no terminal to ask for a passphrase; use --key-file FILE (or - for stdin)".into(),
            )
        })?;
    // A second descriptor of the same terminal to read from while the
    // first one takes the prompt.
    let input = tty
        .try_clone()
        .map_err(|e| LuksError::io("cannot open /dev/tty", e))?;
    read_tty_line(input.as_fd(), &mut tty, prompt, None)
}

/// Ask a yes/no question on the terminal; true only for "YES" (cryptsetup's rule).
pub fn confirm(question: &str) -> Result<bool, LuksError> {
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|_| LuksError::Usage("no terminal to confirm on; use --batch-mode".into()))?;
    let _ = write!(tty, "{question}");
    let _ = tty.flush();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while let Ok(1) = tty.read(&mut byte) {
        if byte[0] == b'\n' || line.len() > 64 {
            break;
        }
        line.push(byte[0]);
    }
    Ok(line == b"YES")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_is_read_whole_including_newlines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, b"pass\nword\n").unwrap();
        assert_eq!(&read_passphrase(Some(&p), "").unwrap()[..], b"pass\nword\n");
    }

    #[test]
    fn offset_size_and_limits_as_cryptsetup() {
        let r = |data: &[u8], known: bool, off, size, eol| {
            read_limited(
                data,
                known.then_some(data.len() as u64),
                off,
                size,
                eol,
                "t",
            )
            .map(|b| b.to_vec())
        };
        assert_eq!(r(b"0123456789", true, 2, Some(3), false).unwrap(), b"234");
        assert_eq!(r(b"0123456789", true, 8, None, false).unwrap(), b"89");
        assert!(r(b"0123", true, 2, Some(3), false).is_err());
        assert!(r(b"0123", true, 5, None, false).is_err());
        assert_eq!(r(b"line\nrest", false, 0, None, true).unwrap(), b"line");
        assert_eq!(r(b"\n", false, 0, None, true).unwrap(), b"");
        assert!(r(b"", false, 0, None, true).is_err());
        let big = vec![b'x'; MAX_KEYFILE as usize + 1];
        assert!(r(&big, true, 0, None, false).is_err());
        assert_eq!(r(&big, true, 0, Some(5), false).unwrap(), b"xxxxx");
    }
}
