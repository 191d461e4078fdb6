//! udm — a userspace device-mapper.
//!
//! Layers, bottom to top (see docs/ARCHITECTURE.md for a request's path):
//! - [`store`]: backing stores (files, block devices, memory);
//! - [`targets`]: dm targets, one module each (linear, striped, crypt, ...);
//! - [`core`]: the device trait, table parsing, mapped devices, registry;
//! - [`crypto`]: dm-crypt-compatible sector ciphers and IV generators;
//! - [`luks`]: LUKS1/LUKS2 headers, keyslots and formatting;
//! - [`mem`]: the seeds' memory machinery (mempool, per-core budget, block pool);
//! - [`engine`]: worker pool and request ordering;
//! - [`nbd`]: the NBD server that exports devices.

pub mod cli;
pub mod core;
pub mod crypto;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod luks;
pub mod mem;
pub mod nbd;
pub mod store;
pub mod targets;

pub use cli::main as cli_main;
