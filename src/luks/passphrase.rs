//! Getting a passphrase the way cryptsetup does: the whole key file (`-` is
//! stdin), or a prompt on the terminal with echo switched off.

use super::error::LuksError;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use zeroize::Zeroizing;

/// cryptsetup's default key file size limit (8 MiB).
pub const MAX_KEYFILE: u64 = 8 * 1024 * 1024;
/// cryptsetup's limit on an interactive passphrase.
pub const MAX_PASSPHRASE: usize = 512;

/// The passphrase from `key_file` (whole content; `-` = stdin), or prompted
/// on the terminal without echo.
pub fn read_passphrase(
    key_file: Option<&Path>,
    prompt: &str,
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    match key_file {
        Some(p) if p == Path::new("-") => read_all(std::io::stdin().lock(), "standard input"),
        Some(p) => {
            let f = std::fs::File::open(p)
                .map_err(|e| LuksError::io(format!("cannot open key file {}", p.display()), e))?;
            read_all(f, &p.display().to_string())
        }
        None => prompt_tty(prompt),
    }
}

fn read_all(r: impl Read, what: &str) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let mut buf = Zeroizing::new(Vec::new());
    r.take(MAX_KEYFILE + 1)
        .read_to_end(&mut buf)
        .map_err(|e| LuksError::io(format!("cannot read key file {what}"), e))?;
    if buf.len() as u64 > MAX_KEYFILE {
        return Err(LuksError::Usage(format!(
            "key file {what} is larger than {MAX_KEYFILE} bytes"
        )));
    }
    Ok(buf)
}

/// Restores terminal attributes on drop (also on error paths).
struct EchoGuard {
    fd: i32,
    saved: libc::termios,
}

impl Drop for EchoGuard {
    fn drop(&mut self) {
        // SAFETY: fd is an open terminal and `saved` came from tcgetattr on it.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved);
        }
    }
}

/// Prompt on /dev/tty without echo; strips the trailing newline.
pub fn prompt_tty(prompt: &str) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|_| {
            LuksError::Usage(
                "no terminal to ask for a passphrase; use --key-file FILE (or - for stdin)".into(),
            )
        })?;
    let fd = tty.as_raw_fd();
    // SAFETY: termios is plain data; tcgetattr fills it for the open fd.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid for the lifetime of `tty`; `t` is a valid out pointer.
    if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
        return Err(LuksError::io(
            "cannot read terminal settings",
            std::io::Error::last_os_error(),
        ));
    }
    let guard = EchoGuard { fd, saved: t };
    let mut quiet = t;
    quiet.c_lflag &= !(libc::ECHO | libc::ECHONL);
    quiet.c_lflag |= libc::ICANON;
    // SAFETY: fd is valid; `quiet` is a fully initialised termios.
    if unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &quiet) } != 0 {
        return Err(LuksError::io(
            "cannot switch off terminal echo",
            std::io::Error::last_os_error(),
        ));
    }
    let _ = tty.write_all(prompt.as_bytes());
    let _ = tty.flush();
    let mut line = Zeroizing::new(Vec::new());
    let mut byte = [0u8; 1];
    loop {
        match tty.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                if line.len() >= MAX_PASSPHRASE {
                    drop(guard);
                    return Err(LuksError::Usage(format!(
                        "passphrase longer than {MAX_PASSPHRASE} characters"
                    )));
                }
                line.push(byte[0]);
            }
            Err(e) => return Err(LuksError::io("cannot read passphrase from the terminal", e)),
        }
    }
    drop(guard);
    let _ = tty.write_all(b"\n");
    Ok(line)
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
}
