//! thin-pool metadata (superblock, btree nodes, space maps) on a sparse image: pool and thin device opened, read, written, discarded, messages, commit, reopen.
//! Never a panic, whatever the bytes. The driver is `udm::fuzzing::thin_metadata`,
//! shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::thin_metadata(data);
});
