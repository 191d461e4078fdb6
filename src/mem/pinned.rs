//! The server-wide ledger of pinned metadata memory: memory a device keeps
//! for as long as it is active because its on-disk format says how much
//! (a snapshot's chunk-sized metadata area and exception table, an
//! integrity journal kept in memory and its keystream).
//!
//! Why a ledger of its own: each such amount is bounded per device (by the
//! device's size, by half of RAM as the kernel bounds an integrity
//! journal), but a server serves many devices, and a few hostile images
//! each asking for a legal maximum would together take the host's memory.
//! The per-device [`super::Budget`] cannot carry this: it bounds buffers
//! that come and go and waits when short, while this memory is taken once
//! at activation and held. So every such amount is reserved here before it
//! is allocated; a reservation that does not fit is refused at activation
//! with an error naming the device, the bytes and the fix, and a device
//! already active keeps what it has. A [`Pinned`] gives its bytes back when
//! it is dropped, with the target that held it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What the pinned memory of all devices may add up to.
pub struct PinnedLedger {
    total: u64,
    used: AtomicU64,
}

/// Bytes reserved in a [`PinnedLedger`], given back on drop.
pub struct Pinned {
    ledger: Arc<PinnedLedger>,
    bytes: u64,
    /// The device, for the error of a [`Pinned::grow`].
    device: Option<Arc<str>>,
}

/// The default total: half of RAM. The kernel lets one integrity journal
/// take up to half of RAM, so every device it would accept still activates
/// alone; all devices together are held to that half, which leaves the
/// other for the page cache, the buffer budget and the rest of the host.
pub fn default_pinned_total() -> u64 {
    super::total_ram_bytes().unwrap_or(4 << 30) / 2
}

impl PinnedLedger {
    pub fn new(total: u64) -> Arc<PinnedLedger> {
        Arc::new(PinnedLedger {
            total,
            used: AtomicU64::new(0),
        })
    }

    /// The ledger of targets built without a server's (`udm table check`,
    /// `udm cryptsetup`, tests), and of a server given no
    /// `--pinned-memory`: one per process, of [`default_pinned_total`].
    pub fn global() -> Arc<PinnedLedger> {
        static G: OnceLock<Arc<PinnedLedger>> = OnceLock::new();
        G.get_or_init(|| PinnedLedger::new(default_pinned_total()))
            .clone()
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Reserve `bytes`, all or nothing; `Err` carries what was left. The
    /// compare-and-swap makes concurrent activations add up exactly:
    /// their sum never passes the total.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Result<Pinned, u64> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let left = self.total.saturating_sub(used);
            if bytes > left {
                return Err(left);
            }
            match self.used.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Pinned {
                        ledger: self.clone(),
                        bytes,
                        device: None,
                    })
                }
                Err(now) => used = now,
            }
        }
    }

    /// [`PinnedLedger::try_reserve`] with the activation error: `device`
    /// (its name, if known) asked for `bytes` for `what`; `fix` says how a
    /// smaller amount is had from the image or the table.
    pub fn reserve(
        self: &Arc<Self>,
        device: Option<&str>,
        what: &str,
        bytes: u64,
        fix: &str,
    ) -> Result<Pinned, String> {
        let mut p = self
            .try_reserve(bytes)
            .map_err(|left| self.refusal(device, what, bytes, left, fix))?;
        p.device = device.map(Arc::from);
        Ok(p)
    }

    fn refusal(
        &self,
        device: Option<&str>,
        what: &str,
        bytes: u64,
        left: u64,
        fix: &str,
    ) -> String {
        let dev = device.map_or_else(String::new, |d| format!("device '{d}': "));
        format!(
            "{dev}{what} needs {bytes} bytes of pinned metadata memory, but only {left} of the \
             server's {} bytes are left (devices and tables being loaded hold the rest): raise `udm serve \
             --pinned-memory`, or {fix}",
            self.total
        )
    }
}

impl Pinned {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Add `bytes` to this reservation (memory that grows with what is
    /// read, as a snapshot's exception table), all or nothing.
    pub fn grow(&mut self, bytes: u64, what: &str, fix: &str) -> Result<(), String> {
        let mut more = self.ledger.try_reserve(bytes).map_err(|left| {
            self.ledger
                .refusal(self.device.as_deref(), what, bytes, left, fix)
        })?;
        // The bytes move into this reservation; `more` must not give them
        // back when it goes.
        self.bytes += more.bytes;
        more.bytes = 0;
        Ok(())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.ledger.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pinned({} bytes)", self.bytes)
    }
}

impl std::fmt::Debug for PinnedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedLedger")
            .field("total", &self.total)
            .field("used", &self.used())
            .finish()
    }
}

/// A zeroed buffer of `bytes` whose size an on-disk field decided: an
/// allocation failure is an error naming `what`, not an abort.
pub fn try_zeroed(bytes: u64, what: &str) -> Result<Vec<u8>, String> {
    let n = usize::try_from(bytes).map_err(|_| format!("{what} of {bytes} bytes is too large"))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| format!("cannot allocate {what} of {bytes} bytes: out of memory"))?;
    v.resize(n, 0);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release_and_refusal_names_the_fix() {
        let l = PinnedLedger::new(100);
        let a = l.try_reserve(60).unwrap();
        assert_eq!(l.used(), 60);
        assert_eq!(l.try_reserve(41).unwrap_err(), 40);
        let e = l
            .reserve(Some("dev1"), "the journal", 41, "a smaller journal")
            .unwrap_err();
        for want in [
            "device 'dev1'",
            "41 bytes",
            "only 40",
            "100 bytes",
            "--pinned-memory",
        ] {
            assert!(e.contains(want), "{want} missing in: {e}");
        }
        let mut b = l.reserve(Some("dev2"), "x", 30, "y").unwrap();
        b.grow(10, "the table", "less").unwrap();
        let e = b.grow(1, "the table", "less").unwrap_err();
        assert!(e.contains("device 'dev2': the table needs 1 bytes"), "{e}");
        assert_eq!(b.bytes(), 40);
        assert_eq!(l.used(), 100);
        drop(a);
        assert_eq!(l.used(), 40);
        drop(b);
        assert_eq!(l.used(), 0);
        assert!(l.try_reserve(101).is_err());
        assert_eq!(l.used(), 0, "a refusal takes nothing");
    }

    #[test]
    fn concurrent_reservations_never_pass_the_total() {
        let l = PinnedLedger::new(1000);
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (l, peak) = (l.clone(), peak.clone());
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for n in 0..2000u64 {
                        if let Ok(p) = l.try_reserve(1 + (n * 7 + i) % 97) {
                            held.push(p);
                        }
                        peak.fetch_max(l.used(), Ordering::Relaxed);
                        if n % 3 == 0 {
                            held.pop();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= 1000);
        assert!(peak.load(Ordering::Relaxed) > 0);
        assert_eq!(l.used(), 0, "every reservation was given back");
    }

    #[test]
    fn default_is_half_of_ram() {
        assert_eq!(default_pinned_total(), total_ram() / 2);
        assert_eq!(PinnedLedger::global().total(), default_pinned_total());
    }

    fn total_ram() -> u64 {
        crate::mem::total_ram_bytes().unwrap()
    }

    #[test]
    fn try_zeroed_refuses_what_cannot_be_had() {
        assert_eq!(try_zeroed(16, "x").unwrap(), vec![0u8; 16]);
        let e = try_zeroed(u64::MAX / 2, "a chunk buffer").unwrap_err();
        assert!(e.contains("a chunk buffer"), "{e}");
    }
}
