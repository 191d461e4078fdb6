//! Fixed-capacity buffers for passphrases, key files and printed keys.
//!
//! Why not `Vec<u8>` or `String`: a growing vector reallocates, and the old
//! allocation goes back to the allocator with the secret still in it. These
//! buffers are sized once, before the first secret byte arrives (a key
//! file's size, cryptsetup's input limit, or the exact length of a key
//! dump), refuse to grow, sit on pages locked into RAM and left out of core
//! dumps where the system permits, and are wiped when dropped.

use crate::mem::RawBuf;
use std::fmt;
use std::ops::Deref;
use zeroize::Zeroize;

/// Secret bytes with a capacity fixed at creation.
pub struct SecretBuf {
    buf: RawBuf,
    len: usize,
    locked: bool,
}

impl SecretBuf {
    /// An empty buffer that can hold `cap` bytes without ever reallocating.
    pub fn with_capacity(cap: usize) -> SecretBuf {
        let mut buf = RawBuf::new(cap.max(1));
        let size = buf.size();
        let p = buf.as_mut_slice().as_mut_ptr();
        // SAFETY: `p..p+size` is the live allocation owned by `buf`;
        // mlock and madvise change only paging and core-dump attributes of
        // those pages, never their contents, and both fail harmlessly on
        // ranges they refuse.
        let locked = unsafe {
            libc::madvise(p as *mut libc::c_void, size, libc::MADV_DONTDUMP);
            libc::mlock(p as *const libc::c_void, size) == 0
        };
        SecretBuf {
            buf,
            len: 0,
            locked,
        }
    }

    /// A copy of `b` (exact capacity).
    pub fn from_slice(b: &[u8]) -> SecretBuf {
        let mut s = SecretBuf::with_capacity(b.len());
        s.extend(b).expect("capacity is the slice length");
        s
    }

    /// Bytes this buffer can hold.
    pub fn capacity(&self) -> usize {
        self.buf.size()
    }

    /// Whether the pages are locked into RAM.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Append; `Err(())` (nothing appended) if it would exceed the capacity.
    #[allow(clippy::result_unit_err)]
    pub fn extend(&mut self, b: &[u8]) -> Result<(), ()> {
        let end = self.len.checked_add(b.len()).ok_or(())?;
        if end > self.buf.size() {
            return Err(());
        }
        self.buf.as_mut_slice()[self.len..end].copy_from_slice(b);
        self.len = end;
        Ok(())
    }

    /// Append one byte (see [`SecretBuf::extend`]).
    #[allow(clippy::result_unit_err)]
    pub fn push(&mut self, b: u8) -> Result<(), ()> {
        self.extend(&[b])
    }

    /// The unused tail, for reading straight into it; commit with
    /// [`SecretBuf::advance`].
    pub fn spare(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf.as_mut_slice()[len..]
    }

    /// Count `n` bytes written into [`SecretBuf::spare`] as content.
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.size());
    }

    /// Drop bytes past `len` (wiping them).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.buf.as_mut_slice()[len..self.len].zeroize();
            self.len = len;
        }
    }

    /// Remove the first `n` bytes (wiping the vacated tail).
    pub fn drain_front(&mut self, n: usize) {
        let n = n.min(self.len);
        let len = self.len;
        self.buf.as_mut_slice().copy_within(n..len, 0);
        self.truncate(len - n);
    }
}

impl Deref for SecretBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }
}

impl PartialEq for SecretBuf {
    fn eq(&self, other: &SecretBuf) -> bool {
        super::keyslot::ct_eq(self, other)
    }
}

impl Drop for SecretBuf {
    fn drop(&mut self) {
        let size = self.buf.size();
        let s = self.buf.as_mut_slice();
        s.zeroize();
        if self.locked {
            // SAFETY: the same live range that was locked in with_capacity.
            unsafe {
                libc::munlock(s.as_ptr() as *const libc::c_void, size);
            }
        }
    }
}

impl fmt::Debug for SecretBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBuf({} bytes, hidden)", self.len)
    }
}

/// Text that contains key material (a volume key dump, a table with
/// `--showkeys`): written into a [`SecretBuf`] sized up front, so that no
/// reallocation leaves a copy behind. Writing past the capacity fails
/// instead of growing; callers size it from the key length.
pub struct SecretText(SecretBuf);

impl SecretText {
    pub fn with_capacity(cap: usize) -> SecretText {
        SecretText(SecretBuf::with_capacity(cap))
    }

    pub fn as_str(&self) -> &str {
        // Only `write_str` fills it, with whole UTF-8 strings.
        std::str::from_utf8(&self.0).unwrap_or("")
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Lower-case hex of `b`, bytes separated by `sep`, a line break plus
    /// `indent` after every `per_line` bytes (0 = never).
    pub fn hex(&mut self, b: &[u8], sep: &str, per_line: usize, indent: &str) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (i, x) in b.iter().enumerate() {
            if i > 0 {
                if per_line > 0 && i % per_line == 0 {
                    fmt::Write::write_str(self, "\n")?;
                    fmt::Write::write_str(self, indent)?;
                } else {
                    fmt::Write::write_str(self, sep)?;
                }
            }
            let pair = [HEX[(x >> 4) as usize], HEX[(x & 15) as usize]];
            self.0.extend(&pair).map_err(|_| fmt::Error)?;
        }
        Ok(())
    }
}

impl fmt::Write for SecretText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend(s.as_bytes()).map_err(|_| fmt::Error)
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretText({} bytes, hidden)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    #[test]
    fn never_grows_and_wipes_on_truncate() {
        let mut s = SecretBuf::with_capacity(8);
        let cap = s.capacity();
        assert!(cap >= 8);
        s.extend(b"abc").unwrap();
        assert!(s.extend(&vec![0u8; cap]).is_err());
        assert_eq!(&*s, b"abc");
        s.drain_front(1);
        assert_eq!(&*s, b"bc");
        s.truncate(1);
        assert_eq!(&*s, b"b");
    }

    #[test]
    fn text_refuses_to_overflow() {
        let mut t = SecretText::with_capacity(4096);
        t.hex(&[0xde, 0xad, 0xbe, 0xef], " ", 2, "\t").unwrap();
        write!(t, "!").unwrap();
        assert_eq!(t.as_str(), "de ad\n\tbe ef!");
        let mut small = SecretText(SecretBuf::with_capacity(1));
        let big = "x".repeat(small.0.capacity() + 1);
        assert!(write!(small, "{big}").is_err());
    }
}
