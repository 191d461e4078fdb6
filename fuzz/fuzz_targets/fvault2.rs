//! FileVault2 Core Storage headers on a sparse disk, and plaintext metadata blocks: parse, dump, unlock under a capped PBKDF2. Never a panic, whatever the bytes. The driver is
//! `udm::fuzzing::fvault2`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::fvault2(data);
});
