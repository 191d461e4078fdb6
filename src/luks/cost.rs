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

/// Sum of PBKDF2 iterations over the slots tried (about a minute of SHA-256
/// on a current core; a 2 s cryptsetup slot is a few million).
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

impl CostLimit {
    /// Refuse before deriving anything if trying `slots` (number, KDF) in
    /// order would exceed a limit; the error names the slot that crosses it
    /// and its cost.
    pub fn check(&self, slots: &[(u32, Kdf)]) -> Result<(), LuksError> {
        let mut pbkdf2 = 0u64;
        let mut work = 0u64;
        for (n, kdf) in slots {
            match *kdf {
                Kdf::Pbkdf2 { hash, iterations } => {
                    pbkdf2 += u64::from(iterations);
                    if pbkdf2 > self.pbkdf2_total {
                        return Err(LuksError::Cost {
                            what: format!(
                                "keyslot {n} demands {iterations} PBKDF2-{} iterations, which \
                                 makes {pbkdf2} for the {} keyslot(s) to try (limit {})",
                                hash.name(),
                                slots.iter().take_while(|(m, _)| m != n).count() + 1,
                                self.pbkdf2_total
                            ),
                            memory: false,
                        });
                    }
                }
                Kdf::Argon2 {
                    time, memory_kib, ..
                } => {
                    let bytes = u64::from(memory_kib) * 1024;
                    if bytes > self.argon2_memory {
                        return Err(LuksError::Cost {
                            what: format!(
                                "keyslot {n} demands {} MiB of {} memory (limit {} MiB, below \
                                 physical RAM)",
                                bytes >> 20,
                                kdf.type_name(),
                                self.argon2_memory >> 20
                            ),
                            memory: true,
                        });
                    }
                    work += u64::from(time) * u64::from(memory_kib);
                    if work > self.argon2_total_work {
                        return Err(LuksError::Cost {
                            what: format!(
                                "keyslot {n} demands {time} {} passes over {memory_kib} KiB, \
                                 which makes {work} KiB passes for the keyslots to try \
                                 (limit {})",
                                kdf.type_name(),
                                self.argon2_total_work
                            ),
                            memory: false,
                        });
                    }
                }
            }
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
        let slots: Vec<(u32, Kdf)> = (0..32).map(|n| (n, slow)).collect();
        let e = l.check(&slots).unwrap_err().to_string();
        assert!(e.contains("keyslot 0") && e.contains("1073741824"), "{e}");
        let big = Kdf::Argon2 {
            kind: Argon2Kind::Id,
            time: 4,
            memory_kib: 4 << 20,
            cpus: 4,
        };
        let e = l.check(&[(3, big)]).unwrap_err();
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
        let ok: Vec<(u32, Kdf)> = (0..32)
            .map(|n| (n, if n % 2 == 0 { normal } else { fast }))
            .collect();
        l.check(&ok).unwrap();
    }
}
