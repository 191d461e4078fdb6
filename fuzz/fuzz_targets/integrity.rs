//! dm-integrity device (superblock, journal, bitmap, tags) on a sparse image: reads, writes, flush, discard, reopen with journal replay.
//! Never a panic, whatever the bytes. The driver is `udm::fuzzing::integrity`,
//! shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::integrity(data);
});
