//! What a header may make udm spend before a passphrase is even tried.
//!
//! Every keyslot names its own KDF cost, and unlocking without `--key-slot`
//! runs the KDF of every slot in turn. A damaged or hostile header (32
//! slots of 2^30 PBKDF2 iterations, or Argon2 asking for 4 GiB) would tie
//! up a CPU for hours or push the machine into the OOM killer. cryptsetup
//! only notices when the allocation fails; udm adds up the cost of the slots
//! it is about to try and refuses up front, naming the slot and its cost,
//! unless the user lifts the limit. The limits sit far above anything
//! cryptsetup writes by default (2 s of PBKDF2 per slot, at most 1 GiB of
//! Argon2 memory, half of RAM on small machines).

use super::error::LuksError;
use super::kdf::Kdf;

/// Sum of PBKDF2 block-iterations (iterations × output blocks) over the
/// slots tried (about a minute of SHA-256 on a current core; a 2 s
/// cryptsetup slot is a few million).
pub const MAX_PBKDF2_TOTAL: u64 = 1 << 29;
/// Largest Argon2 memory cost, unless half of RAM is less (2 GiB: twice
/// cryptsetup's default ceiling for new keyslots).
pub const MAX_ARGON2_MEMORY: u64 = 2 << 30;
/// Sum of Argon2 time × memory (KiB passes) over the slots tried.
pub const MAX_ARGON2_TOTAL_WORK: u64 = 1 << 30;

/// Cost ceilings applied before any KDF runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostLimit {
    pub pbkdf2_total: u64,
    pub argon2_memory: u64,
    pub argon2_total_work: u64,
}

impl Default for CostLimit {
    fn default() -> Self {
        let half_ram = crate::mem::total_ram_bytes()
            .map(|r| r / 2)
            .unwrap_or(MAX_ARGON2_MEMORY);
        CostLimit {
            pbkdf2_total: MAX_PBKDF2_TOTAL,
            argon2_memory: MAX_ARGON2_MEMORY.min(half_ram),
            argon2_total_work: MAX_ARGON2_TOTAL_WORK,
        }
    }
}

/// One keyslot to try: its KDF, and the PBKDF2 digest (always a
/// `Kdf::Pbkdf2`) the derived key is checked against. The digest runs
/// once per slot tried, so a header can hide its cost there as well as in
/// the keyslot (LUKS1 stores up to 2^32 digest iterations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotCost {
    pub slot: u32,
    pub kdf: Kdf,
    pub digest: Option<Kdf>,
    /// Bytes the keyslot's KDF derives (its area key) and the digest's:
    /// PBKDF2 runs its iterations once per hash-sized block of output, so
    /// a 512-byte key from SHA-1 costs 26 times the iterations.
    pub key_len: usize,
    pub digest_len: usize,
}

/// PBKDF2 block-iterations: `iterations` once per block of `len` bytes.
fn pbkdf2_work(hash: super::hash::HashAlg, iterations: u32, len: usize) -> (u64, u64) {
    let blocks = len.div_ceil(hash.digest_len().max(1)).max(1) as u64;
    (u64::from(iterations) * blocks, blocks)
}

/// The costliest PBKDF2 run seen so far, to name in the error: slot,
/// iterations, hash and whether it is the slot's digest.
type WorstPbkdf2 = Option<(u32, u32, &'static str, bool, u64)>;

impl CostLimit {
    /// Refuse before deriving anything if trying `slots` in order would
    /// exceed a limit; the error names the slot (or its digest) that
    /// weighs most and its cost.
    pub fn check(&self, slots: &[SlotCost]) -> Result<(), LuksError> {
        // PBKDF2 iterations of the keyslots and of their digests.
        let mut pbkdf2 = [0u64; 2];
        let mut work = 0u64;
        let mut worst_pbkdf2: WorstPbkdf2 = None;
        // (slot, time, memory, type) of the costliest Argon2 slot.
        let mut worst_argon2: Option<(u32, u32, u32, &'static str)> = None;
        for c in slots {
            let runs = std::iter::once((c.kdf, false, c.key_len))
                .chain(c.digest.map(|d| (d, true, c.digest_len)));
            for (kdf, is_digest, len) in runs {
                match kdf {
                    Kdf::Pbkdf2 { hash, iterations } => {
                        let (w, blocks) = pbkdf2_work(hash, iterations, len);
                        pbkdf2[usize::from(is_digest)] += w;
                        let heavier =
                            |(_, i, _, _, b): (u32, u32, &str, bool, u64)| w > u64::from(i) * b;
                        if worst_pbkdf2.is_none_or(heavier) {
                            worst_pbkdf2 =
                                Some((c.slot, iterations, hash.name(), is_digest, blocks));
                        }
                    }
                    Kdf::Argon2 {
                        time, memory_kib, ..
                    } => {
                        self.check_argon2_memory(c.slot, &kdf, memory_kib)?;
                        let w = u64::from(time) * u64::from(memory_kib);
                        work += w;
                        if worst_argon2.is_none_or(|(_, t, m, _)| w > u64::from(t) * u64::from(m)) {
                            worst_argon2 = Some((c.slot, time, memory_kib, kdf.type_name()));
                        }
                    }
                }
            }
        }
        let [slot_its, digest_its] = pbkdf2;
        if slot_its + digest_its > self.pbkdf2_total {
            let (n, it, h, is_digest, blocks) = worst_pbkdf2.unwrap_or((0, 0, "", false, 1));
            let who = if is_digest {
                format!("the digest of keyslot {n}")
            } else {
                format!("keyslot {n}")
            };
            return Err(LuksError::Cost {
                what: format!(
                    "{who} demands {it} PBKDF2-{h} iterations{}; the {} keyslot(s) to try \
                     demand {slot_its} in all and their digests {digest_its} more, above \
                     udm's limit of {}",
                    if blocks > 1 {
                        format!(" for each of {blocks} output blocks")
                    } else {
                        String::new()
                    },
                    slots.len(),
                    self.pbkdf2_total
                ),
                memory: false,
            });
        }
        if work > self.argon2_total_work {
            let (n, t, m, ty) = worst_argon2.unwrap_or((0, 0, 0, ""));
            return Err(LuksError::Cost {
                what: format!(
                    "keyslot {n} demands {t} {ty} passes over {m} KiB; the {} keyslot(s) to try \
                     demand {work} KiB-passes in all, above udm's limit of {}",
                    slots.len(),
                    self.argon2_total_work
                ),
                memory: false,
            });
        }
        Ok(())
    }

    /// [`CostLimit::check`] for a volume of another system, whose header
    /// names its KDF runs in its own terms: the error says which format
    /// and which of its key protectors `slot` numbers.
    pub fn check_foreign(&self, format: &str, slots: &[SlotCost]) -> Result<(), LuksError> {
        self.check(slots).map_err(|e| match e {
            LuksError::Cost { what, memory } => LuksError::Cost {
                what: format!("{format}: {what}"),
                memory,
            },
            e => e,
        })
    }

    /// One Argon2 run must fit in memory on its own, whatever the sum.
    fn check_argon2_memory(&self, n: u32, kdf: &Kdf, memory_kib: u32) -> Result<(), LuksError> {
        let bytes = u64::from(memory_kib) * 1024;
        if bytes > self.argon2_memory {
            return Err(LuksError::Cost {
                what: format!(
                    "keyslot {n} demands {} MiB of {} memory, above udm's limit of {} MiB \
                     (below physical RAM)",
                    bytes >> 20,
                    kdf.type_name(),
                    self.argon2_memory >> 20
                ),
                memory: true,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::luks::hash::HashAlg;
    use crate::luks::kdf::Argon2Kind;

    #[test]
    fn hostile_costs_are_refused_with_slot_and_cost() {
        let l = CostLimit::default();
        let slow = Kdf::Pbkdf2 {
            hash: HashAlg::Sha256,
            iterations: 1 << 30,
        };
        let slots: Vec<SlotCost> = (0..32).map(|n| cost(n, slow, None)).collect();
        let e = l.check(&slots).unwrap_err().to_string();
        assert!(e.contains("keyslot 0") && e.contains("1073741824"), "{e}");
        let big = Kdf::Argon2 {
            kind: Argon2Kind::Id,
            time: 4,
            memory_kib: 4 << 20,
            cpus: 4,
        };
        let e = l.check(&[cost(3, big, None)]).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("keyslot 3 demands 4096 MiB"), "{e}");
        let normal = Kdf::Argon2 {
            kind: Argon2Kind::Id,
            time: 4,
            memory_kib: 1 << 20,
            cpus: 4,
        };
        let fast = Kdf::Pbkdf2 {
            hash: HashAlg::Sha256,
            iterations: 4_000_000,
        };
        let digest = Kdf::Pbkdf2 {
            hash: HashAlg::Sha256,
            iterations: 200_000,
        };
        let ok: Vec<SlotCost> = (0..32)
            .map(|n| cost(n, if n % 2 == 0 { normal } else { fast }, Some(digest)))
            .collect();
        l.check(&ok).unwrap();
    }

    fn cost(slot: u32, kdf: Kdf, digest: Option<Kdf>) -> SlotCost {
        SlotCost {
            slot,
            kdf,
            digest,
            key_len: 20,
            digest_len: 20,
        }
    }

    /// PBKDF2 derives its output a hash block at a time, each block
    /// costing every iteration: a 512-byte key from SHA-1 (26 blocks)
    /// just under the iteration limit is refused, a 20-byte one passes.
    #[test]
    fn pbkdf2_cost_counts_output_blocks() {
        let l = CostLimit::default();
        let kdf = Kdf::Pbkdf2 {
            hash: HashAlg::Sha1,
            iterations: (MAX_PBKDF2_TOTAL - 10_000) as u32,
        };
        let digest = Kdf::Pbkdf2 {
            hash: HashAlg::Sha1,
            iterations: 1000,
        };
        assert!(l.check(&[cost(0, kdf, Some(digest))]).is_ok());
        let big = SlotCost {
            key_len: 512,
            ..cost(0, kdf, Some(digest))
        };
        let e = l.check(&[big]).unwrap_err().to_string();
        assert!(e.contains("for each of 26 output blocks"), "{e}");
    }

    /// The digest's PBKDF2 runs for every keyslot tried, so a cheap
    /// keyslot behind a 2^30-iteration digest is refused, naming the
    /// digest; a normal digest passes.
    #[test]
    fn digest_iterations_count_towards_the_limit() {
        let l = CostLimit::default();
        let cheap = Kdf::Pbkdf2 {
            hash: HashAlg::Sha1,
            iterations: 1000,
        };
        let slow_digest = Kdf::Pbkdf2 {
            hash: HashAlg::Sha1,
            iterations: 1 << 30,
        };
        let e = l
            .check(&[cost(0, cheap, Some(slow_digest))])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the digest of keyslot 0 demands 1073741824 PBKDF2-sha1 iterations")
                && e.contains("demand 1000 in all and their digests 1073741824 more"),
            "{e}"
        );
        // Eight slots behind a digest just under the limit / 8 each pass
        // alone, but not all together.
        let digest = Kdf::Pbkdf2 {
            hash: HashAlg::Sha1,
            iterations: 1 << 26,
        };
        let eight: Vec<SlotCost> = (0..8).map(|n| cost(n, cheap, Some(digest))).collect();
        assert!(l.check(&eight[..1]).is_ok());
        let e = l.check(&eight).unwrap_err().to_string();
        assert!(e.contains("the digest of keyslot 0"), "{e}");
    }
}
