//! The request path's memory machinery: approximate per-core budget
//! counter, mempool with bulk allocation, recycling payload buffer pool, and
//! the fixed-size block pool with a free list through the free blocks.
//!
//! Why a module of its own: every request on the data path needs memory
//! (an NBD payload, a crypt bounce buffer, a request descriptor). Taking it
//! from the general allocator per request costs syscalls, page faults and
//! lock traffic, and lets a busy device take unbounded memory. These pools
//! recycle memory, bound it per device, and still guarantee forward
//! progress when the bound is reached.
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
//! /// Per-device in-flight memory budget counted in per-core shards.
//! pub struct Budget;
//! impl Budget { pub fn new(limit_bytes: u64) -> std::sync::Arc<Budget>; pub fn unlimited() -> std::sync::Arc<Budget>; }
//! ```
//!
//! Budget sizing: [`default_total_budget`] (2 % of RAM, as dm-crypt) divided
//! among devices by [`per_device_budget`]; `--memory-budget SIZE` is parsed by
//! [`crate::core::units::parse_size`].
//!
//! Memory a device holds for its lifetime because its on-disk format says
//! how much is charged to a separate server-wide ledger ([`PinnedLedger`],
//! `--pinned-memory`, default half of RAM) before it is allocated.

pub mod blockpool;
pub mod budget;
pub mod bufpool;
pub mod mempool;
pub mod percpu;
pub mod pinned;
pub mod raw;
pub mod secret;

/// The size parser lives in `core::units`; named here too for callers that
/// take it together with the budget functions.
pub use crate::core::units::parse_size;
pub use blockpool::{BlockPool, PoolBox, RawBlockPool, SpinLock};
pub use budget::{default_total_budget, per_device_budget, total_ram_bytes, Budget};
pub use bufpool::{BufPool, PooledBuf, MAX_LEN};
pub use mempool::{MemPool, PageList, BIO_MAX_VECS};
pub use percpu::PerCpuCounter;
pub use pinned::{default_pinned_total, try_zeroed, Pinned, PinnedLedger};
pub use raw::{page_size, RawBuf, PAGE_SIZE};
pub use secret::{Locked, SecretBytes, SecretText};
