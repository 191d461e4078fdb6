//! Reed–Solomon RS(255, 255 - roots) over GF(2^8), with the parameters
//! dm-verity's FEC uses (field polynomial 0x11d, first consecutive root
//! α^0, primitive element α): the parity is an on-disk format, so the
//! generator polynomial and the symbol order must be exactly those that
//! veritysetup encodes with and the kernel decodes with.
//!
//! A codeword is `n = 255` symbols, the first `255 - roots` data and the
//! last `roots` parity; symbol `k` is the coefficient of x^(n-1-k).

use std::sync::OnceLock;

const NN: usize = 255;

struct Gf {
    exp: [u8; 512],
    log: [u8; 256],
}

fn gf() -> &'static Gf {
    static T: OnceLock<Gf> = OnceLock::new();
    T.get_or_init(|| {
        let mut g = Gf {
            exp: [0; 512],
            log: [0; 256],
        };
        let mut x: u16 = 1;
        for i in 0..NN {
            g.exp[i] = x as u8;
            g.log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
        }
        for i in NN..512 {
            g.exp[i] = g.exp[i - NN];
        }
        g
    })
}

fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    let g = gf();
    g.exp[g.log[a as usize] as usize + g.log[b as usize] as usize]
}

fn inv(a: u8) -> u8 {
    let g = gf();
    g.exp[NN - g.log[a as usize] as usize]
}

/// α^e.
fn pow_a(e: usize) -> u8 {
    gf().exp[e % NN]
}

/// Evaluates the polynomial `p` (lowest degree first) at `x`.
fn eval(p: &[u8], x: u8) -> u8 {
    p.iter().rev().fold(0, |acc, &c| mul(acc, x) ^ c)
}

/// A code with `roots` parity symbols per codeword.
pub struct Rs {
    roots: usize,
    /// The generator polynomial ∏ (x - α^i), i < roots, highest degree
    /// first without its leading 1.
    gen: Vec<u8>,
}

impl Rs {
    pub fn new(roots: usize) -> Rs {
        assert!((1..NN).contains(&roots), "RS roots {roots} out of range");
        // Lowest degree first while building.
        let mut g = vec![1u8];
        for i in 0..roots {
            let r = pow_a(i);
            let mut next = vec![0u8; g.len() + 1];
            for (j, &c) in g.iter().enumerate() {
                next[j + 1] ^= c;
                next[j] ^= mul(c, r);
            }
            g = next;
        }
        let gen = g[..roots].iter().rev().copied().collect();
        Rs { roots, gen }
    }

    pub fn roots(&self) -> usize {
        self.roots
    }

    /// Data symbols per codeword.
    pub fn rsn(&self) -> usize {
        NN - self.roots
    }

    /// The parity of `data` (`rsn` symbols): the remainder of
    /// data(x)·x^roots divided by the generator, highest degree first.
    pub fn encode(&self, data: &[u8], parity: &mut [u8]) {
        let r = self.roots;
        parity[..r].fill(0);
        for &d in data {
            let fb = d ^ parity[0];
            parity.copy_within(1..r, 0);
            parity[r - 1] = 0;
            if fb != 0 {
                for (p, &g) in parity[..r].iter_mut().zip(&self.gen) {
                    *p ^= mul(fb, g);
                }
            }
        }
    }

    /// Corrects `cw` (255 symbols) in place, given the positions known to
    /// be wrong (`erasures`); returns how many symbols it changed, or
    /// `None` when the errors are beyond what the code can correct
    /// (2·errors + erasures > roots).
    pub fn decode(&self, cw: &mut [u8], erasures: &[usize]) -> Option<usize> {
        let r = self.roots;
        let syn: Vec<u8> = (0..r)
            .map(|j| cw.iter().fold(0, |acc, &c| mul(acc, pow_a(j)) ^ c))
            .collect();
        if syn.iter().all(|&s| s == 0) {
            return Some(0);
        }
        if erasures.len() > r {
            return None;
        }
        let lambda = self.locator(&syn, erasures);
        let deg = lambda.iter().rposition(|&c| c != 0).unwrap_or(0);
        // Chien search: symbol k is wrong when Λ(α^-(n-1-k)) = 0.
        let mut wrong = Vec::with_capacity(deg);
        for k in 0..NN {
            let xinv = pow_a(NN - (NN - 1 - k) % NN);
            if eval(&lambda, xinv) == 0 {
                wrong.push(k);
            }
        }
        if deg == 0 || wrong.len() != deg {
            return None;
        }
        // Ω = S·Λ mod x^roots; Forney (first root α^0): e = X·Ω(X⁻¹)/Λ'(X⁻¹).
        let mut omega = vec![0u8; r];
        for (i, &s) in syn.iter().enumerate() {
            for (j, &l) in lambda.iter().enumerate().take(r - i) {
                omega[i + j] ^= mul(s, l);
            }
        }
        let dlambda: Vec<u8> = (1..lambda.len())
            .map(|i| if i % 2 == 1 { lambda[i] } else { 0 })
            .collect();
        for &k in &wrong {
            let x = pow_a(NN - 1 - k);
            let xinv = inv(x);
            let den = eval(&dlambda, xinv);
            if den == 0 {
                return None;
            }
            cw[k] ^= mul(mul(x, eval(&omega, xinv)), inv(den));
        }
        Some(wrong.len())
    }

    /// The error-and-erasure locator Λ (lowest degree first) by
    /// Berlekamp–Massey, started from the erasures' locator.
    fn locator(&self, syn: &[u8], erasures: &[usize]) -> Vec<u8> {
        let r = self.roots;
        let mut lambda = vec![0u8; r + 1];
        lambda[0] = 1;
        for &e in erasures {
            let x = pow_a(NN - 1 - e);
            for j in (1..=r).rev() {
                lambda[j] ^= mul(lambda[j - 1], x);
            }
        }
        let mut b = lambda.clone();
        let ne = erasures.len();
        let mut el = ne;
        for step in ne + 1..=r {
            let mut d = 0u8;
            for i in 0..step {
                d ^= mul(lambda[i], syn[step - i - 1]);
            }
            // B(x) ← x·B(x) in both branches below unless replaced.
            let shifted: Vec<u8> = std::iter::once(0).chain(b[..r].iter().copied()).collect();
            if d == 0 {
                b = shifted;
                continue;
            }
            let t: Vec<u8> = lambda
                .iter()
                .zip(&shifted)
                .map(|(&l, &s)| l ^ mul(d, s))
                .collect();
            if 2 * el < step + ne {
                el = step + ne - el;
                let di = inv(d);
                b = lambda.iter().map(|&l| mul(l, di)).collect();
            } else {
                b = shifted;
            }
            lambda = t;
        }
        lambda
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codeword(rs: &Rs, seed: u8) -> Vec<u8> {
        let mut cw: Vec<u8> = (0..rs.rsn())
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        let mut par = vec![0u8; rs.roots()];
        rs.encode(&cw, &mut par);
        cw.extend_from_slice(&par);
        cw
    }

    #[test]
    fn a_codeword_is_divisible_by_the_generator() {
        for roots in [2, 3, 8, 24] {
            let rs = Rs::new(roots);
            let cw = codeword(&rs, 7);
            for j in 0..roots {
                let s = cw.iter().fold(0, |acc, &c| mul(acc, pow_a(j)) ^ c);
                assert_eq!(s, 0, "roots {roots}: syndrome {j}");
            }
        }
        // RS(255,253): g = (x - 1)(x - α) = x^2 + 3x + 2 (α = 2).
        let rs = Rs::new(2);
        assert_eq!(rs.gen, [3, 2]);
    }

    #[test]
    fn corrects_up_to_half_the_roots_and_erasures_up_to_all() {
        let rs = Rs::new(8);
        let good = codeword(&rs, 0x5a);
        let mut cw = good.clone();
        for k in [0, 100, 200, 254] {
            cw[k] ^= 0x3c;
        }
        assert_eq!(rs.decode(&mut cw, &[]), Some(4));
        assert_eq!(cw, good);
        let mut cw = good.clone();
        let eras = [3, 9, 27, 81, 100, 120];
        for &k in &eras {
            cw[k] = 0;
        }
        cw[250] ^= 1;
        assert_eq!(rs.decode(&mut cw, &eras).map(|_| ()), Some(()));
        assert_eq!(cw, good);
        let mut cw = good.clone();
        assert_eq!(rs.decode(&mut cw, &[]), Some(0));
    }
}
