//! verity target over a hash device image (veritysetup superblock and tree) and a data device: build, read every block, refuse writes. Never a panic, whatever the bytes. The driver is
//! `udm::fuzzing::verity`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::verity(data);
});
