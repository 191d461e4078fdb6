//! The kernel keyring, read the way cryptsetup's `luks2-keyring` token
//! reads it: a `user` key found by its description through the calling
//! process's keyrings (thread, process, session; the session keyring links
//! the user keyring). The key's bytes are the passphrase of the keyslots
//! the token names.

use std::ffi::CString;
use std::io;
use zeroize::Zeroizing;

/// Largest payload a `user` key may hold (the kernel's limit).
const MAX_USER_KEY: usize = 32767;
const KEYCTL_READ: libc::c_long = 11;

/// The payload of the `user` key described by `description`.
pub fn user_key(description: &str) -> io::Result<Zeroizing<Vec<u8>>> {
    let ty = CString::new("user").map_err(io::Error::other)?;
    let desc = CString::new(description)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "key description holds a NUL"))?;
    // SAFETY: request_key(2) reads two NUL-terminated strings that live
    // across the call; a null callout and keyring 0 (the default) are
    // valid arguments.
    let id = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            ty.as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_int,
        )
    };
    if id < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = Zeroizing::new(vec![0u8; MAX_USER_KEY]);
    // SAFETY: KEYCTL_READ writes at most `buf.len()` bytes into `buf`,
    // which is valid and exclusively borrowed for the call.
    let n = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            id as libc::c_int,
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // The result is the payload's full length, which the buffer holds by
    // the kernel's own limit.
    let n = (n as usize).min(buf.len());
    let mut out = Zeroizing::new(Vec::with_capacity(n));
    out.extend_from_slice(&buf[..n]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_key_is_an_error_not_a_panic() {
        assert!(user_key("udm-test:surely-not-there").is_err());
        assert!(user_key("bad\0desc").is_err());
    }
}
