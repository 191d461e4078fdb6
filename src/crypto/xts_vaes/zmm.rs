//! The AVX-512 width of the VAES XTS kernel: four blocks per register,
//! eight registers (512 bytes) per group, so a 512-byte sector is one group.
//! The software pipelining's gain at 512-byte sectors is measured in
//! docs/benchmarks/crypto.md.

use std::arch::x86_64::*;

use super::super::block::Block;
use super::{VaesXts, PREFETCH_AHEAD, REGS};

/// Whether this CPU can run this width.
pub fn supported() -> bool {
    is_x86_feature_detected!("aes")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("vaes")
        && is_x86_feature_detected!("vpclmulqdq")
}

/// Broadcast round key `i` of `s` to all four lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn bcast(s: &[[u8; 16]; 15], i: usize) -> __m512i {
    // SAFETY: 16-byte load from a 16-byte array.
    let k = unsafe { _mm_loadu_si128(s[i].as_ptr() as *const __m128i) };
    _mm512_broadcast_i32x4(k)
}

/// Encrypt the IVs with K2: the first tweak of each sector. Sixteen IVs per
/// step in four registers, so the rounds of independent registers overlap.
///
/// # Safety
/// Requires the features of [`supported`].
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes")]
pub(super) unsafe fn tweak_batch(
    enc2: &[[u8; 16]; 15],
    rounds: usize,
    ivs: &[Block],
    out: &mut [[u8; 16]],
) {
    let mut k = [_mm512_setzero_si512(); 15];
    for (i, slot) in k.iter_mut().enumerate().take(rounds + 1) {
        *slot = bcast(enc2, i);
    }
    let n = ivs.len().min(out.len());
    let mut i = 0;
    while i < n {
        let mut x = [_mm512_setzero_si512(); 4];
        let mut masks = [0u8; 4];
        for (r, m) in masks.iter_mut().enumerate() {
            let have = n.saturating_sub(i + 4 * r).min(4);
            *m = ((1u16 << (2 * have)) - 1) as u8;
            // SAFETY: the masked load touches only the first `have` blocks
            // from index i + 4r, all inside `ivs[..n]`; with `have == 0`
            // nothing is accessed.
            x[r] = unsafe {
                _mm512_maskz_loadu_epi64(*m, ivs.as_ptr().add((i + 4 * r).min(n)) as *const i64)
            };
            x[r] = _mm512_xor_si512(x[r], k[0]);
        }
        for key in &k[1..rounds] {
            for v in x.iter_mut() {
                *v = _mm512_aesenc_epi128(*v, *key);
            }
        }
        for (r, v) in x.iter().enumerate() {
            let y = _mm512_aesenclast_epi128(*v, k[rounds]);
            // SAFETY: as for the load: only the blocks inside `out[..n]`
            // (n <= out.len()) are written.
            unsafe {
                _mm512_mask_storeu_epi64(
                    out.as_mut_ptr().add((i + 4 * r).min(n)) as *mut i64,
                    masks[r],
                    y,
                )
            };
        }
        i += 16;
    }
}

/// Multiply each 128-bit lane by x^k, k per lane in 0..=63 (given per qword
/// in `kv`, and 64 - k in `kc`).
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn mul_xk_var(v: __m512i, kv: __m512i, kc: __m512i, poly: __m512i) -> __m512i {
    let left = _mm512_sllv_epi64(v, kv);
    let carry = _mm512_srlv_epi64(v, kc);
    let zero = _mm512_setzero_si512();
    // Carry out of the low qword moves into the high qword.
    let up = _mm512_unpacklo_epi64(zero, carry);
    // Bits shifted out of the top are reduced by x^128 = x^7 + x^2 + x + 1.
    let over = _mm512_unpackhi_epi64(carry, zero);
    let red = _mm512_clmulepi64_epi128::<0x00>(over, poly);
    _mm512_ternarylogic_epi64::<0x96>(left, up, red)
}

/// `v·x^(8·BYTES) ^ c` in each lane: shift left whole bytes, reduce the bits
/// that fell off the top (byte shifts and carry-less multiplies run on a
/// different port than the AES rounds), with a constant folded into the
/// final XOR (a three-way XOR costs the same as a two-way one).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn mul_x8n_xor<const BYTES: i32, const TOP: i32>(v: __m512i, poly: __m512i, c: __m512i) -> __m512i {
    let top = _mm512_bsrli_epi128::<TOP>(v);
    let shifted = _mm512_bslli_epi128::<BYTES>(v);
    _mm512_ternarylogic_epi64::<0x96>(shifted, _mm512_clmulepi64_epi128::<0x00>(top, poly), c)
}

/// Constants of the tweak generator, built once per call.
struct TweakGen {
    poly: __m512i,
    kv0: __m512i,
    kc0: __m512i,
    kv1: __m512i,
    kc1: __m512i,
    /// The last round key, carried inside every tweak register.
    klast: __m512i,
    /// `klast·x^32 ^ klast`: what a carried key turns into under ×x^32, so
    /// that stepping a key-carrying tweak stays one shift-and-reduce.
    kstep: __m512i,
}

impl TweakGen {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
    fn new(klast: __m512i) -> TweakGen {
        let poly = _mm512_set1_epi64(0x87);
        let kv0 = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
        let kv1 = _mm512_set_epi64(7, 7, 6, 6, 5, 5, 4, 4);
        let sixty4 = _mm512_set1_epi64(64);
        TweakGen {
            poly,
            kv0,
            kc0: _mm512_sub_epi64(sixty4, kv0),
            kv1,
            kc1: _mm512_sub_epi64(sixty4, kv1),
            klast,
            kstep: mul_x8n_xor::<4, 12>(klast, poly, klast),
        }
    }

    /// Tweaks of blocks 0..31 of a sector whose encrypted IV is `t0`, each
    /// XORed with the last round key.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
    fn first(&self, t0: &[u8; 16]) -> [__m512i; REGS] {
        // SAFETY: 16-byte load of a 16-byte array.
        let t = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(t0.as_ptr() as *const __m128i) });
        let a = mul_xk_var(t, self.kv0, self.kc0, self.poly);
        let b = mul_xk_var(t, self.kv1, self.kc1, self.poly);
        let (p, k) = (self.poly, self.klast);
        [
            _mm512_xor_si512(a, k),
            _mm512_xor_si512(b, k),
            mul_x8n_xor::<1, 15>(a, p, k),
            mul_x8n_xor::<1, 15>(b, p, k),
            mul_x8n_xor::<2, 14>(a, p, k),
            mul_x8n_xor::<2, 14>(b, p, k),
            mul_x8n_xor::<3, 13>(a, p, k),
            mul_x8n_xor::<3, 13>(b, p, k),
        ]
    }

    /// The next 32 blocks' key-carrying tweaks (×x^32).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
    fn step(&self, tw: &[__m512i; REGS]) -> [__m512i; REGS] {
        let mut out = *tw;
        for t in out.iter_mut() {
            *t = mul_x8n_xor::<4, 12>(*t, self.poly, self.kstep);
        }
        out
    }
}

/// The data pass, software-pipelined: the tweaks of the next 512-byte group
/// (the next sector's first ones when a sector ends) are computed before the
/// current group's rounds in program order, so their latency (a load, a
/// broadcast, shifts and carry-less multiplies, ~20 cycles) overlaps the
/// AES rounds instead of stalling at every sector start. Tweak registers
/// carry the last round key (`tw ^ klast`), which removes one XOR per
/// register: round 0 uses `k0 ^ klast` in its three-way XOR, the last round
/// uses the register as its key directly.
///
/// # Safety
/// Requires the features of [`supported`]; `src` and `dst` are valid for
/// `tweaks.len() * ss` bytes (they may be equal, not otherwise overlapping);
/// `ss` is a multiple of 512.
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes")]
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
    let mut k = [_mm512_setzero_si512(); 15];
    for (i, slot) in k.iter_mut().enumerate().take(NR + 1) {
        *slot = bcast(sched, i);
    }
    let gen = TweakGen::new(k[NR]);
    let k0x = _mm512_xor_si512(k[0], k[NR]);
    let groups = ss / (REGS * 64);
    let out_of_place = !std::ptr::eq(src, dst);
    let mut tw = gen.first(&tweaks[0]);
    for s in 0..n {
        for g in 0..groups {
            let off = s * ss + g * REGS * 64;
            let mut d = [_mm512_setzero_si512(); REGS];
            // SAFETY: off + 512 <= n * ss, inside both buffers (caller
            // contract). All loads happen before the stores, so in-place
            // operation (src == dst) is fine.
            unsafe {
                let p = src.add(off) as *const __m512i;
                for (r, v) in d.iter_mut().enumerate() {
                    *v =
                        _mm512_ternarylogic_epi64::<0x96>(_mm512_loadu_si512(p.add(r)), tw[r], k0x);
                }
            }
            if out_of_place {
                for line in 0..REGS {
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
                    for v in d.iter_mut() {
                        *v = _mm512_aesenc_epi128(*v, *key);
                    }
                }
                for (v, t) in d.iter_mut().zip(&tw) {
                    *v = _mm512_aesenclast_epi128(*v, *t);
                }
            } else {
                for key in &k[1..NR] {
                    for v in d.iter_mut() {
                        *v = _mm512_aesdec_epi128(*v, *key);
                    }
                }
                for (v, t) in d.iter_mut().zip(&tw) {
                    *v = _mm512_aesdeclast_epi128(*v, *t);
                }
            }
            // SAFETY: same range as the loads above.
            unsafe {
                let q = dst.add(off) as *mut __m512i;
                for (r, v) in d.iter().enumerate() {
                    _mm512_storeu_si512(q.add(r), *v);
                }
            }
            tw = next;
        }
    }
}
