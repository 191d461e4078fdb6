//! The PBKDF of a new keyslot, from cryptsetup's options (`--pbkdf`,
//! `--iter-time`, `--pbkdf-force-iterations`, `--pbkdf-memory`,
//! `--pbkdf-parallel`, `--hash`) and its defaults: argon2id for LUKS2,
//! pbkdf2 for LUKS1, 2 s of work calibrated on this machine unless the cost
//! is forced.

use super::error::LuksError;
use super::feedback::Feedback;
use super::hash::HashAlg;
use super::kdf::{self, Argon2Kind, Kdf};

/// PBKDF options as given on the command line (None: cryptsetup's default).
#[derive(Clone, Debug, Default)]
pub struct PbkdfChoice {
    /// pbkdf2, argon2i or argon2id.
    pub pbkdf: Option<String>,
    /// Target unlock time in milliseconds.
    pub iter_time: Option<u32>,
    /// Exact iterations (PBKDF2) or passes (Argon2); no benchmark.
    pub force_iterations: Option<u32>,
    /// Argon2 memory in KiB.
    pub memory: Option<u32>,
    /// Argon2 lanes.
    pub parallel: Option<u32>,
    /// PBKDF2 hash; also the LUKS1 header hash and the LUKS2 AF/digest hash.
    pub hash: Option<String>,
}

/// cryptsetup's default unlock time for a new keyslot.
pub const DEFAULT_ITER_TIME_MS: u32 = 2000;

impl PbkdfChoice {
    /// The hash (`--hash`, default sha256).
    pub fn hash(&self) -> Result<HashAlg, LuksError> {
        match &self.hash {
            None => Ok(HashAlg::Sha256),
            Some(h) => HashAlg::from_name(h).ok_or_else(|| {
                LuksError::Usage(format!(
                    "Hash {h} is not supported (sha1, sha224, sha256, sha384, sha512)."
                ))
            }),
        }
    }

    /// Resolve to a KDF with costs for a LUKS`version` keyslot holding a
    /// `key_len`-byte key, benchmarking unless the cost is forced.
    pub fn resolve(
        &self,
        version: u8,
        key_len: usize,
        fb: &dyn Feedback,
    ) -> Result<Kdf, LuksError> {
        let hash = self.hash()?;
        let name = self.pbkdf.clone().unwrap_or_else(|| {
            if version == 1 {
                "pbkdf2".into()
            } else {
                "argon2id".into()
            }
        });
        let iter_time = self.iter_time.unwrap_or(DEFAULT_ITER_TIME_MS);
        match name.as_str() {
            "pbkdf2" => {
                let iterations = match self.force_iterations {
                    Some(n) if n < kdf::MIN_PBKDF2_ITERATIONS => {
                        return Err(LuksError::Usage(format!(
                            "Forced iteration count is too low for pbkdf2 (minimum is {}).",
                            kdf::MIN_PBKDF2_ITERATIONS
                        )));
                    }
                    Some(n) => n,
                    None => {
                        fb.begin("Benchmarking PBKDF2...", 0);
                        let n = kdf::calibrate_pbkdf2(hash, key_len, iter_time);
                        fb.end();
                        n
                    }
                };
                Ok(Kdf::Pbkdf2 { hash, iterations })
            }
            "argon2i" | "argon2id" => {
                if version == 1 {
                    return Err(LuksError::Usage(
                        "LUKS1 supports only the pbkdf2 PBKDF.".into(),
                    ));
                }
                let kind = if name == "argon2i" {
                    Argon2Kind::I
                } else {
                    Argon2Kind::Id
                };
                let cpus = self.parallel.unwrap_or_else(kdf::default_parallel);
                let memory = self.memory.unwrap_or_else(kdf::default_memory_kib);
                if !(32..=kdf::MAX_ARGON2_MEMORY_KIB).contains(&memory) {
                    return Err(LuksError::Usage(format!(
                        "Requested PBKDF memory {memory} KiB is outside 32..{} KiB.",
                        kdf::MAX_ARGON2_MEMORY_KIB
                    )));
                }
                let (time, memory) = match self.force_iterations {
                    Some(n) if n < kdf::MIN_ARGON2_TIME => {
                        return Err(LuksError::Usage(format!(
                            "Forced iteration count is too low for {name} (minimum is {}).",
                            kdf::MIN_ARGON2_TIME
                        )));
                    }
                    Some(n) => (n, memory),
                    None => {
                        fb.begin("Benchmarking Argon2...", 0);
                        let r = kdf::calibrate_argon2(kind, memory, cpus, key_len, iter_time);
                        fb.end();
                        r
                    }
                };
                let k = Kdf::Argon2 {
                    kind,
                    time,
                    memory_kib: memory,
                    cpus,
                };
                k.check("--pbkdf")?;
                Ok(k)
            }
            other => Err(LuksError::Usage(format!(
                "Unknown PBKDF {other} (pbkdf2, argon2i, argon2id)."
            ))),
        }
    }

    /// Iterations of the volume key digest: cryptsetup benchmarks 125 ms,
    /// or uses the minimum when the keyslot cost is forced (tests, scripts).
    pub fn digest_iterations(&self, hash: HashAlg, key_len: usize) -> u32 {
        if self.force_iterations.is_some() {
            kdf::MIN_PBKDF2_ITERATIONS
        } else {
            kdf::calibrate_pbkdf2(hash, key_len, 125)
        }
    }
}
