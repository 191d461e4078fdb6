//! The seeds' memory machinery (filled by the mem work).
//!
//! CONTRACT used by the NBD layer and the crypt target (keep these names):
//!
//! ```ignore
//! /// Recycling pool of contiguous payload buffers, in size classes, each class a
//! /// mempool with a reserve; charges a per-device budget; Send + Sync.
//! pub struct BufPool;
//! impl BufPool {
//!     pub fn new(budget: std::sync::Arc<Budget>) -> std::sync::Arc<BufPool>;
//!     /// A buffer of exactly `len` bytes (contents unspecified). Blocks while the
//!     /// device is over budget (backpressure); never fails. len <= 32 MiB + 4 KiB.
//!     pub fn get(self: &std::sync::Arc<Self>, len: usize) -> PooledBuf;
//! }
//! /// Deref/DerefMut<Target = [u8]>; returns its memory to the pool on drop.
//! pub struct PooledBuf;
//! /// Per-device in-flight memory budget counted in per-core shards (seed 003).
//! pub struct Budget;
//! impl Budget { pub fn new(limit_bytes: u64) -> std::sync::Arc<Budget>; pub fn unlimited() -> std::sync::Arc<Budget>; }
//! ```
