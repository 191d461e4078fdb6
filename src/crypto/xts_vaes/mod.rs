//! Vectorised AES-XTS for x86-64 with VAES and VPCLMULQDQ, selected at run
//! time; the portable path in `modes` is used elsewhere.
//!
//! Why hand-written: a generic XTS calls the block cipher per block and
//! computes tweaks serially, which caps it far below what one core can
//! run AES at with VAES. Here a run of sectors is
//! handled in two passes per batch: (1) all sectors' IVs are encrypted with
//! K2, several per register; (2) each sector's blocks are processed in eight
//! registers whose tweaks are generated in SIMD (a power of x per lane, then
//! one shift-and-reduce per group), with the tweak XOR folded into the first
//! and last rounds, and the next group's tweaks computed while this group's
//! rounds run (software pipelining), so 512-byte sectors are as fast as
//! 4096-byte ones.
//!
//! Two widths of the same kernel, because CPUs with VAES differ in register
//! width: [`zmm`] (AVX-512, four blocks per register; Intel since Ice Lake,
//! AMD since Zen 4) and [`ymm`] (AVX2, two blocks per register; AMD Zen 3,
//! Intel Alder Lake cores without AVX-512). Measured in
//! docs/benchmarks/crypto.md.
//!
//! Round keys are expanded here with AES-NI (the `aes` crate does not expose
//! its schedule); they are stored as bytes and wiped on drop.

use std::arch::x86_64::*;

use zeroize::Zeroize;

use super::block::Block;

mod ymm;
mod zmm;

/// Register width of the kernel in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// 512-bit registers (AVX-512F/BW).
    Zmm,
    /// 256-bit registers (AVX2).
    Ymm,
}

impl Width {
    /// The widest kernel this CPU runs, if any.
    pub fn detect() -> Option<Width> {
        if zmm::supported() {
            Some(Width::Zmm)
        } else if ymm::supported() {
            Some(Width::Ymm)
        } else {
            None
        }
    }

    /// Whether this CPU runs the kernel of this width.
    pub fn supported(self) -> bool {
        match self {
            Width::Zmm => zmm::supported(),
            Width::Ymm => ymm::supported(),
        }
    }

    /// A short name for logs and benchmark output.
    pub fn name(self) -> &'static str {
        match self {
            Width::Zmm => "vaes-avx512",
            Width::Ymm => "vaes-avx2",
        }
    }
}

/// A keyed AES-XTS transform using VAES. Exists only when the CPU has the
/// features of its width (checked in [`VaesXts::new`]).
pub struct VaesXts {
    width: Width,
    /// 10 (AES-128) or 14 (AES-256).
    rounds: usize,
    /// K1 encryption schedule.
    enc1: [[u8; 16]; 15],
    /// K1 decryption schedule (equivalent inverse cipher).
    dec1: [[u8; 16]; 15],
    /// K2 encryption schedule (tweaks).
    enc2: [[u8; 16]; 15],
}

impl Drop for VaesXts {
    fn drop(&mut self) {
        self.enc1.zeroize();
        self.dec1.zeroize();
        self.enc2.zeroize();
    }
}

impl std::fmt::Debug for VaesXts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VaesXts(aes-{}, {}, key hidden)",
            (self.rounds - 6) * 32,
            self.width.name()
        )
    }
}

impl VaesXts {
    /// The widest kernel the CPU runs; `None` when it runs neither or the
    /// halves are not both 128- or both 256-bit (AES-192 XTS takes the
    /// portable path).
    pub fn new(k1: &[u8], k2: &[u8]) -> Option<VaesXts> {
        VaesXts::with_width(k1, k2, Width::detect()?)
    }

    /// A kernel of the given width (tests and benchmarks compare them);
    /// `None` when the CPU cannot run it.
    pub fn with_width(k1: &[u8], k2: &[u8], width: Width) -> Option<VaesXts> {
        if k1.len() != k2.len()
            || !(k1.len() == 16 || k1.len() == 32)
            || !width.supported()
            || !is_x86_feature_detected!("aes")
        {
            return None;
        }
        let mut x = VaesXts {
            width,
            rounds: if k1.len() == 16 { 10 } else { 14 },
            enc1: [[0; 16]; 15],
            dec1: [[0; 16]; 15],
            enc2: [[0; 16]; 15],
        };
        // SAFETY: AES-NI was detected just above; the key lengths match the
        // expansion functions (checked above).
        unsafe {
            expand(k1, &mut x.enc1);
            expand(k2, &mut x.enc2);
            inverse_schedule(&x.enc1, &mut x.dec1, x.rounds);
        }
        Some(x)
    }

    /// The same keys in the AVX2 width, if the CPU runs it.
    pub fn narrowed(&self) -> Option<VaesXts> {
        if !Width::Ymm.supported() {
            return None;
        }
        Some(VaesXts {
            width: Width::Ymm,
            rounds: self.rounds,
            enc1: self.enc1,
            dec1: self.dec1,
            enc2: self.enc2,
        })
    }

    /// The register width of this kernel.
    pub fn width(&self) -> Width {
        self.width
    }

    /// Process `ivs.len()` sectors of `ss` bytes: read from `src` (or `dst`
    /// itself when `None`), write to `dst`. `ivs` are the raw (unencrypted)
    /// dm-crypt IVs of the sectors.
    ///
    /// Panics, in every build, unless `dst` (and `src`) are exactly one
    /// whole sector of `ss` (a multiple of 512) per IV: a partial or
    /// IV-less sector would otherwise be left as it was, i.e. plaintext
    /// written as if encrypted. Callers cut requests to whole sectors, so
    /// this is a bug check, never an answer to input.
    pub fn run(&self, src: Option<&[u8]>, dst: &mut [u8], ss: usize, ivs: &[Block], encrypt: bool) {
        assert!(
            ss != 0
                && ss % 512 == 0
                && Some(dst.len()) == ivs.len().checked_mul(ss)
                && src.is_none_or(|s| s.len() == dst.len()),
            "VaesXts::run: {} bytes (source {:?}) for {} IVs of {ss}-byte sectors",
            dst.len(),
            src.map(<[u8]>::len),
            ivs.len()
        );
        let n = ivs.len();
        if n == 0 {
            return;
        }
        let dptr = dst.as_mut_ptr();
        let sptr = src.map_or(dptr as *const u8, |s| s.as_ptr());
        let mut tweaks = [[0u8; 16]; BATCH];
        for (c, ivc) in ivs[..n].chunks(BATCH).enumerate() {
            let off = c * BATCH * ss;
            let tw = &mut tweaks[..ivc.len()];
            // SAFETY: the object exists only if its width's features (and
            // AES-NI) were detected. Every pointer stays inside its slice:
            // `ivc.len()` sectors of `ss` bytes from `off`, and
            // `(c * BATCH + ivc.len()) * ss <= n * ss`, which is the length
            // of both `src` and `dst` (asserted above). `tw` has one entry
            // per IV; `ss` is a multiple of 512 (asserted above).
            unsafe {
                let (s, d) = (sptr.add(off), dptr.add(off));
                match (self.width, self.rounds) {
                    (Width::Zmm, r) => {
                        zmm::tweak_batch(&self.enc2, r, ivc, tw);
                        if r == 10 {
                            zmm::sectors::<10>(self, s, d, ss, tw, encrypt)
                        } else {
                            zmm::sectors::<14>(self, s, d, ss, tw, encrypt)
                        }
                    }
                    (Width::Ymm, r) => {
                        ymm::tweak_batch(&self.enc2, r, ivc, tw);
                        if r == 10 {
                            ymm::sectors::<10>(self, s, d, ss, tw, encrypt)
                        } else {
                            ymm::sectors::<14>(self, s, d, ss, tw, encrypt)
                        }
                    }
                }
            }
        }
    }
}

/// Sectors whose tweaks are encrypted in one pass before their data.
const BATCH: usize = 64;

/// Software prefetch distance: out of place, the destination (store
/// memory) is usually not in the core's cache, and asking for its lines
/// (for writing) a few groups ahead hides the read-for-ownership misses.
const PREFETCH_AHEAD: usize = 4096;

/// Registers of blocks per group: enough independent AES chains to hide
/// the round latency (four cycles, two rounds issued per cycle).
const REGS: usize = 8;

// ---------------------------------------------------------------------------
// Key schedule (AES-NI).

macro_rules! assist {
    ($k:expr, $rcon:literal) => {
        _mm_aeskeygenassist_si128::<$rcon>($k)
    };
}

#[inline]
#[target_feature(enable = "aes,sse2")]
fn mix(k: __m128i, t: __m128i) -> __m128i {
    let mut k = k;
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    _mm_xor_si128(k, t)
}

/// Expand a 16- or 32-byte key into `out[0..=rounds]`.
///
/// # Safety
/// Requires AES-NI; `key.len()` is 16 or 32.
#[target_feature(enable = "aes,sse2")]
unsafe fn expand(key: &[u8], out: &mut [[u8; 16]; 15]) {
    let mut rk = [_mm_setzero_si128(); 15];
    // SAFETY: loads of 16 bytes from a slice of at least 16 (or 32) bytes.
    let k0 = unsafe { _mm_loadu_si128(key.as_ptr() as *const __m128i) };
    if key.len() == 16 {
        rk[0] = k0;
        macro_rules! r128 {
            ($i:literal, $rcon:literal) => {
                rk[$i] = mix(
                    rk[$i - 1],
                    _mm_shuffle_epi32::<0xff>(assist!(rk[$i - 1], $rcon)),
                );
            };
        }
        r128!(1, 0x01);
        r128!(2, 0x02);
        r128!(3, 0x04);
        r128!(4, 0x08);
        r128!(5, 0x10);
        r128!(6, 0x20);
        r128!(7, 0x40);
        r128!(8, 0x80);
        r128!(9, 0x1b);
        r128!(10, 0x36);
    } else {
        rk[0] = k0;
        // SAFETY: key.len() == 32 here, so bytes 16..32 exist.
        rk[1] = unsafe { _mm_loadu_si128(key.as_ptr().add(16) as *const __m128i) };
        macro_rules! even {
            ($i:literal, $rcon:literal) => {
                rk[$i] = mix(
                    rk[$i - 2],
                    _mm_shuffle_epi32::<0xff>(assist!(rk[$i - 1], $rcon)),
                );
            };
        }
        macro_rules! odd {
            ($i:literal) => {
                rk[$i] = mix(
                    rk[$i - 2],
                    _mm_shuffle_epi32::<0xaa>(assist!(rk[$i - 1], 0)),
                );
            };
        }
        even!(2, 0x01);
        odd!(3);
        even!(4, 0x02);
        odd!(5);
        even!(6, 0x04);
        odd!(7);
        even!(8, 0x08);
        odd!(9);
        even!(10, 0x10);
        odd!(11);
        even!(12, 0x20);
        odd!(13);
        even!(14, 0x40);
    }
    for (o, k) in out.iter_mut().zip(rk.iter()) {
        // SAFETY: 16-byte store into a 16-byte array.
        unsafe { _mm_storeu_si128(o.as_mut_ptr() as *mut __m128i, *k) };
    }
    rk.zeroize_m128();
}

/// Decryption schedule for `aesdec`: reversed, with InvMixColumns applied to
/// the inner round keys.
///
/// # Safety
/// Requires AES-NI.
#[target_feature(enable = "aes,sse2")]
unsafe fn inverse_schedule(enc: &[[u8; 16]; 15], dec: &mut [[u8; 16]; 15], rounds: usize) {
    for i in 0..=rounds {
        // SAFETY: 16-byte loads/stores of 16-byte arrays.
        unsafe {
            let k = _mm_loadu_si128(enc[rounds - i].as_ptr() as *const __m128i);
            let k = if i == 0 || i == rounds {
                k
            } else {
                _mm_aesimc_si128(k)
            };
            _mm_storeu_si128(dec[i].as_mut_ptr() as *mut __m128i, k);
        }
    }
}

/// Wiping of register-typed temporaries that held key material.
trait ZeroizeM128 {
    fn zeroize_m128(&mut self);
}

impl<const N: usize> ZeroizeM128 for [__m128i; N] {
    fn zeroize_m128(&mut self) {
        for k in self.iter_mut() {
            // SAFETY: `k` is a valid, aligned, exclusive reference; a
            // volatile write keeps the wipe from being optimised away.
            unsafe { std::ptr::write_volatile(k, _mm_setzero_si128()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block::BlockCipher;
    use super::super::modes;
    use super::super::spec::Alg;
    use super::*;

    fn bytes(case: u64, n: usize) -> Vec<u8> {
        let mut x = case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    fn partial_sector_panics(dst_len: usize, src_len: Option<usize>, nivs: usize) -> bool {
        let Some(v) = VaesXts::new(&[1; 32], &[2; 32]) else {
            eprintln!("no VAES on this CPU: the vector kernels are not exercised");
            return true;
        };
        let ivs = vec![Block::default(); nivs];
        let src = src_len.map(|n| vec![0u8; n]);
        std::panic::catch_unwind(move || {
            let mut dst = vec![7u8; dst_len];
            v.run(src.as_deref(), &mut dst, 512, &ivs, true);
        })
        .is_err()
    }

    /// In release builds too: a tail that is not a whole sector, or a
    /// sector without an IV, is refused instead of being left plaintext.
    #[test]
    fn partial_or_uncovered_sectors_are_refused_in_every_build() {
        assert!(partial_sector_panics(2 * 512 + 100, None, 2));
        assert!(partial_sector_panics(3 * 512, None, 2));
        assert!(partial_sector_panics(2 * 512, Some(512), 2));
        assert!(partial_sector_panics(2 * 512, None, 3));
        assert!(!partial_sector_panics(2 * 512, Some(2 * 512), 2));
        assert!(!partial_sector_panics(0, None, 0));
    }

    /// Each width the CPU runs against the portable path (the `aes` crate's
    /// own key schedule and block function) for random keys, sizes and IVs.
    #[test]
    fn matches_portable_xts() {
        let widths: Vec<Width> = [Width::Zmm, Width::Ymm]
            .into_iter()
            .filter(|w| w.supported())
            .collect();
        if widths.is_empty() {
            eprintln!("no VAES on this CPU: the vector kernels are not exercised");
        }
        for w in widths {
            check_width(w);
        }
    }

    fn check_width(w: Width) {
        for case in 0..24u64 {
            let half = if case % 2 == 0 { 16 } else { 32 };
            let key = bytes(case, 2 * half);
            let ss = [512usize, 1024, 2048, 4096][(case / 2 % 4) as usize];
            let nsec = 1 + (case as usize * 7) % 70;
            let plain = bytes(case + 99, ss * nsec);
            let ivs: Vec<Block> = (0..nsec)
                .map(|i| {
                    Block::from(
                        bytes(case * 1000 + i as u64, 16)
                            .try_into()
                            .unwrap_or([0; 16]),
                    )
                })
                .collect();
            let k1 = BlockCipher::new(Alg::Aes, &key[..half]).unwrap();
            let k2 = BlockCipher::new(Alg::Aes, &key[half..]).unwrap();
            let mut want = plain.clone();
            modes::xts(&k1, &k2, ss, &mut want, &mut ivs.clone(), true);
            let v = VaesXts::with_width(&key[..half], &key[half..], w).unwrap();
            assert_eq!(v.width(), w);
            let mut got = plain.clone();
            v.run(None, &mut got, ss, &ivs, true);
            assert!(got == want, "{w:?} encrypt case {case} ss {ss} n {nsec}");
            let mut out = vec![0u8; plain.len()];
            v.run(Some(&plain), &mut out, ss, &ivs, true);
            assert!(out == want, "encrypt_to case {case}");
            let mut back = vec![0u8; plain.len()];
            v.run(Some(&want), &mut back, ss, &ivs, false);
            assert!(back == plain, "decrypt_to case {case}");
            v.run(None, &mut got, ss, &ivs, false);
            assert!(got == plain, "decrypt case {case}");
        }
    }
}
