//! Vectorised AES-XTS for x86-64 with VAES, VPCLMULQDQ and AVX-512,
//! selected at run time; the portable path in `modes` is used elsewhere.
//!
//! Why hand-written: a generic XTS calls the block cipher per block and
//! computes tweaks serially, which caps it near 1 GB/s although one core can
//! run AES at ~10 GB/s with 512-bit VAES. Here a run of sectors is handled in
//! two passes per batch: (1) all sectors' IVs are encrypted with K2 four per
//! register; (2) each sector's 32-block groups are processed in eight ZMM
//! registers whose tweaks are generated in SIMD (T·x^0..x^31 over eight
//! registers, then ×x^32 per 512-byte group), with the tweak XOR folded into
//! the first (three-way XOR) and last (`aesenclast` with key ^ tweak)
//! rounds. Sector boundaries cost a few instructions, not a call, and the
//! next sector's tweaks are computed while this sector's rounds run
//! (software pipelining), which is what makes 512-byte sectors as fast as
//! 4096-byte ones: 13.96 -> 17.75 GB/s at 512 bytes on the development
//! machine (docs/benchmarks/crypto.md).
//!
//! Round keys are expanded here with AES-NI (the `aes` crate does not expose
//! its schedule); they are stored as bytes and wiped on drop.

use std::arch::x86_64::*;

use zeroize::Zeroize;

use super::block::Block;

/// A keyed AES-XTS transform using VAES. Exists only when the CPU has the
/// features (checked in [`VaesXts::new`]).
pub struct VaesXts {
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
        write!(f, "VaesXts(aes-{}, key hidden)", (self.rounds - 6) * 32)
    }
}

/// Whether this CPU can run the kernel.
pub fn supported() -> bool {
    is_x86_feature_detected!("aes")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("vaes")
        && is_x86_feature_detected!("vpclmulqdq")
}

impl VaesXts {
    /// `None` when the CPU lacks the features or the halves are not both
    /// 128- or both 256-bit (AES-192 XTS takes the portable path).
    pub fn new(k1: &[u8], k2: &[u8]) -> Option<VaesXts> {
        if k1.len() != k2.len() || !(k1.len() == 16 || k1.len() == 32) || !supported() {
            return None;
        }
        let mut x = VaesXts {
            rounds: if k1.len() == 16 { 10 } else { 14 },
            enc1: [[0; 16]; 15],
            dec1: [[0; 16]; 15],
            enc2: [[0; 16]; 15],
        };
        // SAFETY: `supported()` confirmed AES-NI; the key lengths match the
        // expansion functions (checked above).
        unsafe {
            expand(k1, &mut x.enc1);
            expand(k2, &mut x.enc2);
            inverse_schedule(&x.enc1, &mut x.dec1, x.rounds);
        }
        Some(x)
    }

    /// Process `ivs.len()` sectors of `ss` bytes: read from `src` (or `dst`
    /// itself when `None`), write to `dst`. `ivs` are the raw (unencrypted)
    /// dm-crypt IVs of the sectors.
    pub fn run(&self, src: Option<&[u8]>, dst: &mut [u8], ss: usize, ivs: &[Block], encrypt: bool) {
        let n = ivs.len().min(dst.len() / ss);
        let n = src.map_or(n, |s| n.min(s.len() / ss));
        if n == 0 || ss % 512 != 0 {
            return;
        }
        let dptr = dst.as_mut_ptr();
        let sptr = src.map_or(dptr as *const u8, |s| s.as_ptr());
        let mut tweaks = [[0u8; 16]; 64];
        for (c, ivc) in ivs[..n].chunks(64).enumerate() {
            let off = c * 64 * ss;
            // SAFETY: the object exists only if `supported()` held. Every
            // pointer stays inside its slice: `ivc.len()` sectors of `ss`
            // bytes from `off`, and `(c * 64 + ivc.len()) * ss <= n * ss`,
            // which is within both `src` and `dst` (n was clamped to both).
            // `tweaks` holds 64 entries >= ivc.len().
            unsafe {
                tweak_batch(&self.enc2, self.rounds, ivc, &mut tweaks);
                if self.rounds == 10 {
                    sectors::<10>(
                        self,
                        sptr.add(off),
                        dptr.add(off),
                        ss,
                        &tweaks[..ivc.len()],
                        encrypt,
                    );
                } else {
                    sectors::<14>(
                        self,
                        sptr.add(off),
                        dptr.add(off),
                        ss,
                        &tweaks[..ivc.len()],
                        encrypt,
                    );
                }
            }
        }
    }
}

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

// ---------------------------------------------------------------------------
// The kernel.

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
unsafe fn tweak_batch(
    enc2: &[[u8; 16]; 15],
    rounds: usize,
    ivs: &[Block],
    out: &mut [[u8; 16]; 64],
) {
    let mut k = [_mm512_setzero_si512(); 15];
    for (i, slot) in k.iter_mut().enumerate().take(rounds + 1) {
        *slot = bcast(enc2, i);
    }
    let n = ivs.len().min(64);
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
            // (n <= 64) are written.
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

/// Software prefetch distance: out of place, the destination (store
/// memory) is usually not in the core's cache, and asking for its lines
/// (for writing) a few groups ahead hides the read-for-ownership misses.
const PREFETCH_AHEAD: usize = 4096;

/// Blocks per group: eight registers of four blocks (512 bytes), enough
/// independent AES chains to hide the round latency.
const REGS: usize = 8;

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
unsafe fn sectors<const NR: usize>(
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

    /// The kernel against the portable path (the `aes` crate's own key
    /// schedule and block function) for random keys, sizes and IVs.
    #[test]
    fn matches_portable_xts() {
        if !supported() {
            eprintln!("VAES/AVX-512 not available: kernel not exercised on this CPU");
            return;
        }
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
            let v = VaesXts::new(&key[..half], &key[half..]).unwrap();
            let mut got = plain.clone();
            v.run(None, &mut got, ss, &ivs, true);
            assert!(got == want, "encrypt case {case} ss {ss} n {nsec}");
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
