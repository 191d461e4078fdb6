//! The AVX2 width of the VAES XTS kernel: two blocks per register, eight
//! registers (256 bytes) per group. For CPUs that have VAES and VPCLMULQDQ
//! on 256-bit registers but no AVX-512 (AMD Zen 3, Intel's hybrid cores),
//! where the portable path reaches about a quarter of OpenSSL's AES-NI XTS
//! (docs/benchmarks/crypto.md). Zen 3 issues two 256-bit AES rounds per
//! cycle with a latency of four, so eight independent registers keep both
//! units busy; round keys stay in memory operands, as sixteen YMM registers
//! cannot hold the data, the tweaks and fifteen keys at once.
//!
//! The structure follows the AVX-512 width (`zmm.rs`): tweak registers carry
//! the last round key, and the next group's tweaks are computed before this
//! group's rounds.

use std::arch::x86_64::*;

use super::super::block::Block;
use super::{VaesXts, PREFETCH_AHEAD, REGS};

/// Whether this CPU can run this width.
pub fn supported() -> bool {
    is_x86_feature_detected!("aes")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("vaes")
        && is_x86_feature_detected!("vpclmulqdq")
}

/// Bytes per group: eight registers of two blocks.
const GROUP: usize = REGS * 32;

/// Broadcast round key `i` of `s` to both lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast(s: &[[u8; 16]; 15], i: usize) -> __m256i {
    // SAFETY: 16-byte load from a 16-byte array.
    let k = unsafe { _mm_loadu_si128(s[i].as_ptr() as *const __m128i) };
    _mm256_broadcastsi128_si256(k)
}

/// Encrypt the IVs with K2 into `out` (the first tweak of each sector),
/// eight per step in four registers so the rounds of independent registers
/// overlap.
///
/// # Safety
/// Requires the features of [`supported`].
#[target_feature(enable = "avx2,vaes,aes")]
pub(super) unsafe fn tweak_batch(
    enc2: &[[u8; 16]; 15],
    rounds: usize,
    ivs: &[Block],
    out: &mut [[u8; 16]],
) {
    let mut k = [_mm256_setzero_si256(); 15];
    for (i, slot) in k.iter_mut().enumerate().take(rounds + 1) {
        *slot = bcast(enc2, i);
    }
    let n = ivs.len().min(out.len());
    for (ivc, oc) in ivs[..n].chunks(8).zip(out[..n].chunks_mut(8)) {
        // A whole step's worth of blocks, so a short last chunk needs no
        // masked loads.
        let mut buf = [[0u8; 16]; 8];
        for (b, iv) in buf.iter_mut().zip(ivc) {
            *b = iv.0;
        }
        let p = buf.as_mut_ptr() as *mut __m256i;
        let mut x = [_mm256_setzero_si256(); 4];
        for (r, v) in x.iter_mut().enumerate() {
            // SAFETY: `buf` is 128 bytes; register r reads bytes 32r..32r+32.
            *v = _mm256_xor_si256(unsafe { _mm256_loadu_si256(p.add(r)) }, k[0]);
        }
        for key in &k[1..rounds] {
            for v in x.iter_mut() {
                *v = _mm256_aesenc_epi128(*v, *key);
            }
        }
        for (r, v) in x.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_si256(p.add(r), _mm256_aesenclast_epi128(*v, k[rounds])) };
        }
        oc.copy_from_slice(&buf[..oc.len()]);
    }
}

/// Multiply each 128-bit lane by x^k, k per lane in 0..=63 (given per qword
/// in `kv`, and 64 - k in `kc`).
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn mul_xk_var(v: __m256i, kv: __m256i, kc: __m256i, poly: __m256i) -> __m256i {
    let left = _mm256_sllv_epi64(v, kv);
    let carry = _mm256_srlv_epi64(v, kc);
    let zero = _mm256_setzero_si256();
    // Carry out of the low qword moves into the high qword.
    let up = _mm256_unpacklo_epi64(zero, carry);
    // Bits shifted out of the top are reduced by x^128 = x^7 + x^2 + x + 1.
    let over = _mm256_unpackhi_epi64(carry, zero);
    let red = _mm256_clmulepi64_epi128::<0x00>(over, poly);
    _mm256_xor_si256(_mm256_xor_si256(left, up), red)
}

/// `v·x^(8·BYTES) ^ c` in each lane: shift left whole bytes and reduce the
/// bits that fell off the top with one carry-less multiply.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn mul_x8n_xor<const BYTES: i32, const TOP: i32>(v: __m256i, poly: __m256i, c: __m256i) -> __m256i {
    let top = _mm256_bsrli_epi128::<TOP>(v);
    let shifted = _mm256_bslli_epi128::<BYTES>(v);
    let red = _mm256_clmulepi64_epi128::<0x00>(top, poly);
    _mm256_xor_si256(_mm256_xor_si256(shifted, red), c)
}

/// One AES round (`vaesenc`, or `vaesdec` when `DEC`) over all eight data
/// registers with the same round key, as one inline-assembly block.
///
/// Why assembly: with intrinsics, LLVM keeps the thirteen inner round keys
/// in registers and runs each data register through all its rounds before
/// the next one (which minimises register pressure with only sixteen YMM
/// registers), turning eight independent chains into one serial chain of
/// four-cycle rounds; that ran at about half the rate of round-major
/// order. A block that touches all eight registers per round
/// cannot be reordered that way.
#[inline]
#[target_feature(enable = "avx2,vaes")]
fn round8<const DEC: bool>(d: &mut [__m256i; REGS], key: __m256i) {
    macro_rules! round {
        ($op:literal) => {
            // SAFETY: register-only AES rounds (VAES, enabled for this
            // function); no memory, stack or flags are touched.
            unsafe {
                std::arch::asm!(
                    concat!($op, " {0}, {0}, {k}"),
                    concat!($op, " {1}, {1}, {k}"),
                    concat!($op, " {2}, {2}, {k}"),
                    concat!($op, " {3}, {3}, {k}"),
                    concat!($op, " {4}, {4}, {k}"),
                    concat!($op, " {5}, {5}, {k}"),
                    concat!($op, " {6}, {6}, {k}"),
                    concat!($op, " {7}, {7}, {k}"),
                    inout(ymm_reg) d[0],
                    inout(ymm_reg) d[1],
                    inout(ymm_reg) d[2],
                    inout(ymm_reg) d[3],
                    inout(ymm_reg) d[4],
                    inout(ymm_reg) d[5],
                    inout(ymm_reg) d[6],
                    inout(ymm_reg) d[7],
                    k = in(ymm_reg) key,
                    options(pure, nomem, nostack, preserves_flags),
                )
            }
        };
    }
    if DEC {
        round!("vaesdec")
    } else {
        round!("vaesenc")
    }
}

/// Constants of the tweak generator, built once per call.
struct TweakGen {
    poly: __m256i,
    /// Per-lane exponents 0,1 / 2,3 / 4,5 / 6,7 and their 64-complements.
    kv: [__m256i; 4],
    kc: [__m256i; 4],
    /// The last round key, carried inside every tweak register.
    klast: __m256i,
    /// `klast·x^16 ^ klast`: what a carried key turns into under ×x^16, so
    /// that stepping a key-carrying tweak stays one shift-and-reduce.
    kstep: __m256i,
}

impl TweakGen {
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn new(klast: __m256i) -> TweakGen {
        let poly = _mm256_set1_epi64x(0x87);
        let sixty4 = _mm256_set1_epi64x(64);
        let kv = [
            _mm256_set_epi64x(1, 1, 0, 0),
            _mm256_set_epi64x(3, 3, 2, 2),
            _mm256_set_epi64x(5, 5, 4, 4),
            _mm256_set_epi64x(7, 7, 6, 6),
        ];
        TweakGen {
            poly,
            kc: kv.map(|k| _mm256_sub_epi64(sixty4, k)),
            kv,
            klast,
            kstep: mul_x8n_xor::<2, 14>(klast, poly, klast),
        }
    }

    /// Tweaks of blocks 0..15 of a sector whose encrypted IV is `t0`, each
    /// XORed with the last round key; register r holds blocks 2r and 2r+1.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn first(&self, t0: &[u8; 16]) -> [__m256i; REGS] {
        // SAFETY: 16-byte load of a 16-byte array.
        let t =
            _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(t0.as_ptr() as *const __m128i) });
        let a = [0, 1, 2, 3].map(|i| mul_xk_var(t, self.kv[i], self.kc[i], self.poly));
        let (p, k) = (self.poly, self.klast);
        [
            _mm256_xor_si256(a[0], k),
            _mm256_xor_si256(a[1], k),
            _mm256_xor_si256(a[2], k),
            _mm256_xor_si256(a[3], k),
            mul_x8n_xor::<1, 15>(a[0], p, k),
            mul_x8n_xor::<1, 15>(a[1], p, k),
            mul_x8n_xor::<1, 15>(a[2], p, k),
            mul_x8n_xor::<1, 15>(a[3], p, k),
        ]
    }

    /// The next 16 blocks' key-carrying tweaks (×x^16).
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn step(&self, tw: &[__m256i; REGS]) -> [__m256i; REGS] {
        let mut out = *tw;
        for t in out.iter_mut() {
            *t = mul_x8n_xor::<2, 14>(*t, self.poly, self.kstep);
        }
        out
    }
}

/// The data pass, software-pipelined as in the AVX-512 width: the next
/// group's tweaks (the next sector's first ones when a sector ends) are
/// computed before this group's rounds in program order.
///
/// # Safety
/// Requires the features of [`supported`]; `src` and `dst` are valid for
/// `tweaks.len() * ss` bytes (they may be equal, not otherwise overlapping);
/// `ss` is a multiple of 512.
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes")]
pub(super) unsafe fn sectors<const NR: usize>(
    x: &VaesXts,
    src: *const u8,
    dst: *mut u8,
    ss: usize,
    tweaks: &[[u8; 16]],
    encrypt: bool,
) {
    let n = tweaks.len();
    if n == 0 {
        return;
    }
    let sched = if encrypt { &x.enc1 } else { &x.dec1 };
    let mut k = [_mm256_setzero_si256(); 15];
    for (i, slot) in k.iter_mut().enumerate().take(NR + 1) {
        *slot = bcast(sched, i);
    }
    let gen = TweakGen::new(k[NR]);
    let k0x = _mm256_xor_si256(k[0], k[NR]);
    let groups = ss / GROUP;
    let out_of_place = !std::ptr::eq(src, dst);
    let mut tw = gen.first(&tweaks[0]);
    for s in 0..n {
        for g in 0..groups {
            let off = s * ss + g * GROUP;
            let mut d = [_mm256_setzero_si256(); REGS];
            // SAFETY: off + GROUP <= n * ss, inside both buffers (caller
            // contract). All loads happen before the stores, so in-place
            // operation (src == dst) is fine.
            unsafe {
                let p = src.add(off) as *const __m256i;
                for (r, v) in d.iter_mut().enumerate() {
                    let t = _mm256_xor_si256(tw[r], k0x);
                    *v = _mm256_xor_si256(_mm256_loadu_si256(p.add(r)), t);
                }
            }
            if out_of_place {
                for line in 0..GROUP / 64 {
                    let ahead = off + PREFETCH_AHEAD + line * 64;
                    // Prefetches never fault, so addresses past the end are
                    // harmless; `wrapping_add` keeps the arithmetic defined.
                    _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(ahead) as *const i8);
                    _mm_prefetch::<_MM_HINT_ET0>(dst.wrapping_add(ahead) as *const i8);
                }
            }
            let next = if g + 1 < groups {
                gen.step(&tw)
            } else {
                gen.first(&tweaks[(s + 1).min(n - 1)])
            };
            if encrypt {
                for key in &k[1..NR] {
                    round8::<false>(&mut d, *key);
                }
                for (v, t) in d.iter_mut().zip(&tw) {
                    *v = _mm256_aesenclast_epi128(*v, *t);
                }
            } else {
                for key in &k[1..NR] {
                    round8::<true>(&mut d, *key);
                }
                for (v, t) in d.iter_mut().zip(&tw) {
                    *v = _mm256_aesdeclast_epi128(*v, *t);
                }
            }
            // SAFETY: same range as the loads above.
            unsafe {
                let q = dst.add(off) as *mut __m256i;
                for (r, v) in d.iter().enumerate() {
                    _mm256_storeu_si256(q.add(r), *v);
                }
            }
            tw = next;
        }
    }
}
