//! Vectorised AES-XTS (VAES + AVX-512), selected at run time.
//! (Placeholder until the kernel lands: `new` returns None, so the portable
//! path in `modes` is used.)

/// A keyed VAES AES-XTS transform.
pub struct VaesXts {}

impl VaesXts {
    /// `None` when the CPU lacks the features or the key size is not one the
    /// kernel handles.
    pub fn new(_k1: &[u8], _k2: &[u8]) -> Option<VaesXts> {
        None
    }

    pub fn run(
        &self,
        _src: Option<&[u8]>,
        _dst: &mut [u8],
        _ss: usize,
        _ivs: &[super::block::Block],
        _encrypt: bool,
    ) {
        unreachable!("VaesXts is never constructed yet")
    }
}
