//! The one big-endian field codec: NBD's wire headers and the LUKS on-disk
//! headers are big-endian, and every reader of them goes through here, so
//! a short buffer is a `None` for the caller to turn into its own error
//! rather than an index panic on hostile input.

/// `N` bytes at `at`, if `b` holds them.
fn array_at<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    let end = at.checked_add(N)?;
    b.get(at..end)?.try_into().ok()
}

/// The big-endian `u16` at byte `at` of `b`.
pub fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    array_at(b, at).map(u16::from_be_bytes)
}

/// The big-endian `u32` at byte `at` of `b`.
pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    array_at(b, at).map(u32::from_be_bytes)
}

/// The big-endian `u64` at byte `at` of `b`.
pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    array_at(b, at).map(u64::from_be_bytes)
}

/// A sequential reader for variable-length payloads (NBD option data,
/// reply chunks), where offsets depend on earlier fields.
pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.bytes(2).and_then(|b| u16_at(b, 0))
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.bytes(4).and_then(|b| u32_at(b, 0))
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.bytes(8).and_then(|b| u64_at(b, 0))
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_offsets_read_big_endian_and_refuse_short_input() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(u16_at(&b, 0), Some(0x0102));
        assert_eq!(u32_at(&b, 1), Some(0x0203_0405));
        assert_eq!(u64_at(&b, 1), Some(0x0203_0405_0607_0809));
        assert_eq!(u64_at(&b, 2), None);
        assert_eq!(u32_at(&b, 6), None);
        assert_eq!(u16_at(&b, usize::MAX), None, "no overflow on a huge offset");
    }

    #[test]
    fn cursor_never_panics_on_short_input() {
        let mut c = Cursor::new(&[0, 0, 0, 9, 1]);
        assert_eq!(c.u32(), Some(9));
        assert_eq!(c.u32(), None);
        assert_eq!(c.u64(), None);
        assert_eq!(c.bytes(usize::MAX), None);
        assert_eq!(c.remaining(), 1);
        assert_eq!(Cursor::new(&[0, 0, 0, 0, 0, 0, 1, 0]).u64(), Some(256));
    }
}
