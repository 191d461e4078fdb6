//! persistent snapshot COW device (header, metadata areas) on a sparse image over a 1 MiB origin: reads, writes through the snapshot and snapshot-origin, flush, reopen.
//! Never a panic, whatever the bytes. The driver is `udm::fuzzing::snapshot`,
//! shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::snapshot(data);
});
