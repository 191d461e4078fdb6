//! dm-crypt cipher specs (after a key-length byte and a sector-size
//! byte): parse, key, and an encrypt/decrypt round trip of two sectors; an
//! error for a bad spec or key, never a panic. The driver is
//! `udm::fuzzing::cipher_spec`, shared with tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    udm::fuzzing::cipher_spec(data);
});
