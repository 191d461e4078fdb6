//! Control-socket requests (the framing, the JSON request, the table
//! payload) run against one long-lived control service with in-memory
//! devices: errors in replies, never a panic. The driver is
//! `udm::fuzzing::control`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::control(data);
});
