//! dm table text (lossy UTF-8 of the input) through parse, build over 1 MiB
//! in-memory devices, and a few reads and writes: an error for whatever is
//! wrong, never a panic, and no allocation sized by a number in the table.
//! The driver is `udm::fuzzing::table`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::table(data);
});
