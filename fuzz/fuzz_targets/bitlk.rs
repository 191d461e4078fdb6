//! BitLocker metadata on a sparse disk: parse, dump, segments, partial-encryption map, unlock by clear key or startup key. Never a panic, whatever the bytes. The driver is
//! `udm::fuzzing::bitlk`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::bitlk(data);
});
