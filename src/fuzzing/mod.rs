//! Drivers shared by the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer)
//! and their stable-toolchain regression tests (`tests/fuzz_regress.rs`),
//! so that what CI replays and what the fuzzer explores is the same code.
//! Not an API: hidden from the docs, free to change.
//!
//! - [`table`] (`tables.rs`): bytes → dm table text → parse → build over small in-memory
//!   devices → a few reads and writes. Everything that parses must build or
//!   fail with an error, and every built device must survive I/O.
//! - [`NbdHarness`] (`nbd_client.rs`): bytes played as a hostile client against the real
//!   per-connection server code over a Unix socket pair. The server side
//!   must end (error or clean close) once the input is exhausted.
//! - [`table_seeds`], [`nbd_seeds`]: the seed inputs of both targets (beside
//!   their drivers), built
//!   from the table syntax and the protocol constants (the files under
//!   `fuzz/seeds/` are these, written by `tests/fuzz_regress.rs`).
//! - [`cipher_spec`] (`cipher_spec.rs`) and [`control`] (`control.rs`)
//!   likewise, one file per driver with its seeds; this file holds what
//!   they share: the in-memory device resolver and its size.
//! - The on-disk formats, one driver each, whose seeds are images the real
//!   tools wrote (`fuzz/seeds/<target>/`, made by `fuzz/make-seeds.sh`) or
//!   udm's own targets wrote: [`verity`] (`verity.rs`, which also holds the
//!   [`Named`] resolver and [`mem_dev`] the others use), [`log_writes`]
//!   (`log_writes.rs`), and [`tcrypt`], [`bitlk`], [`fvault2`]
//!   (`foreign.rs`, with the sparse disk their inputs describe and the
//!   [`Recorder`] that cuts seeds out of cryptsetup's upstream images),
//!   [`thin_metadata`] (`thin.rs`), [`snapshot`] (`snapshot.rs`) and
//!   [`integrity`] (`integrity.rs`), whose devices are sparse disks too.

use std::collections::HashMap;
use std::sync::Arc;

use crate::core::BlockDevice;
use crate::store::MemStore;
use crate::targets::DeviceResolver;

mod cipher_spec;
mod control;
mod foreign;
mod integrity;
mod log_writes;
mod nbd_client;
mod snapshot;
mod tables;
mod thin;
mod verity;

pub use cipher_spec::{cipher_spec, cipher_spec_seeds};
pub use control::{control, control_seeds, ControlHarness};
pub use foreign::{
    bitlk, bitlk_on, fvault2, fvault2_on, sparse_input, sparse_seed, sparse_seed_head, tcrypt,
    tcrypt_seed, FileDev, Recorder, SparseDev, MAX_FUZZ_ITERATIONS,
};
pub use integrity::{integrity, integrity_open};
pub use log_writes::{log_writes, log_writes_seeds};
pub use nbd_client::{nbd_client, nbd_seeds, NbdHarness};
pub use snapshot::{snapshot, snapshot_fill};
pub use tables::{table, table_seeds};
pub use thin::thin_metadata;
pub use verity::{mem_dev, verity, verity_seed, Named};

/// Size of every in-memory device the drivers hand out.
pub const DEV_SIZE: u64 = 1 << 20;

/// Most distinct device names one table may resolve (bounds the memory a
/// fuzz input can make the resolver allocate: 8 MiB).
const MAX_DEVICES: usize = 8;

/// Hands out one 1 MiB [`MemStore`] per device name. Names starting with
/// `n` get a store without direct access, so crypt's copying paths (bounce
/// buffers, in-place encryption) are exercised as well as the direct one.
/// Only names a path could plausibly have are accepted: a name with
/// whitespace cannot be printed back into a table anyway.
#[derive(Default)]
pub struct MemResolver {
    devices: HashMap<String, Arc<dyn BlockDevice>>,
}

impl DeviceResolver for MemResolver {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if let Some(d) = self.devices.get(spec) {
            return Ok(d.clone());
        }
        let plausible = !spec.is_empty()
            && spec
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_@./:-+".contains(&b));
        if !plausible || self.devices.len() >= MAX_DEVICES {
            return Err(format!("{spec}: no such device"));
        }
        let dev: Arc<dyn BlockDevice> = if spec.starts_with('n') {
            Arc::new(MemStore::without_direct_access(DEV_SIZE))
        } else {
            Arc::new(MemStore::new(DEV_SIZE))
        };
        self.devices.insert(spec.to_string(), dev.clone());
        Ok(dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolver_bounds_devices() {
        let mut r = MemResolver::default();
        for i in 0..MAX_DEVICES {
            r.resolve(&format!("d{i}")).unwrap();
        }
        assert!(r.resolve("d0").is_ok(), "known names stay resolvable");
        assert!(r.resolve("another").is_err());
        assert!(MemResolver::default().resolve("a b").is_err());
    }
}
