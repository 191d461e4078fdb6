//! TrueCrypt/VeraCrypt decrypted header parsed as a KDF and chain would find it, dumped, its table worked out (no KDF runs). Never a panic, whatever the bytes. The driver is
//! `udm::fuzzing::tcrypt`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::tcrypt(data);
});
