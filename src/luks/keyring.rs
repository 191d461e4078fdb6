//! The kernel keyring, read the way cryptsetup's `luks2-keyring` token
//! reads it: a `user` key found by its description through the calling
//! process's keyrings (thread, process, session; the session keyring links
//! the user keyring). The key's bytes are the passphrase of the keyslots
//! the token names.

use linux_keyutils::{KeyRing, KeyRingIdentifier};
use std::io;
use zeroize::Zeroizing;

/// Largest payload a `user` key may hold (the kernel's limit).
const MAX_USER_KEY: usize = 32767;

/// The payload of the `user` key described by `description`, looked up
/// as request_key(2) without a callout looks: the thread, process and
/// session keyrings in turn, each searched recursively (the session
/// keyring links the user keyring). Nothing is linked anywhere.
pub fn user_key(description: &str) -> io::Result<Zeroizing<Vec<u8>>> {
    if description.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "key description holds a NUL",
        ));
    }
    let rings = [
        KeyRingIdentifier::Thread,
        KeyRingIdentifier::Process,
        KeyRingIdentifier::Session,
    ];
    let key = rings
        .into_iter()
        .filter_map(|r| KeyRing::from_special_id(r, false).ok())
        .find_map(|ring| ring.search(description).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such user key"))?;
    let mut buf = Zeroizing::new(vec![0u8; MAX_USER_KEY]);
    let n = key.read(&mut &mut buf[..]).map_err(io::Error::other)?;
    // The result is the payload's full length, which the buffer holds by
    // the kernel's own limit.
    let n = n.min(buf.len());
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
