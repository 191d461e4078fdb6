//! dm-log-writes log replayed by the reader of udm replay-log under a plan the first bytes choose. Never a panic, whatever the bytes. The driver is
//! `udm::fuzzing::log_writes`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::log_writes(data);
});
