//! udm — a userspace device-mapper.
//!
//! Layers, bottom to top; a module uses only modules of lower layers
//! (tests/layers.rs checks it; docs/ARCHITECTURE.md follows a request):
//! 0. [`core`]: the device trait, errors, the table syntax; [`protocol`]:
//!    the NBD wire format (server and client store);
//! 1. [`mem`]: mempool with bulk allocation, per-core budget counter,
//!    fixed-size block pool, payload buffers, locked key memory;
//! 2. [`crypto`] (dm-crypt sector ciphers and IVs) and [`store`] (files,
//!    block devices, memory);
//! 3. [`targets`] (one module per dm target, and their list),
//!    [`engine`] (workers, ordering, fairness) and [`dm`] (the dm core:
//!    a request over a device's routes, cut at their boundaries and at
//!    the limits a device declares; the live device and its statistics);
//! 4. [`mapper`]: tables into routes, the named devices of a server;
//! 5. [`luks`] (LUKS1/LUKS2 volumes) and [`nbd`] (the server);
//! 6. [`control`]: the control socket (dmsetup's verbs on a running
//!    server), over the named devices and the exports;
//! 7. [`cli`], and `fuzzing` (behind the `fuzzing` feature).

// Every unsafe block says why it is sound, and an `unsafe fn` body is not
// an unsafe block by itself: each unsafe operation in it is marked.
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cli;
pub mod control;
pub mod core;
pub mod crypto;
pub mod dm;
pub mod engine;
pub mod fuse;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod luks;
pub mod mapper;
pub mod mem;
pub mod nbd;
pub mod protocol;
pub mod store;
pub mod targets;

pub use cli::main as cli_main;
