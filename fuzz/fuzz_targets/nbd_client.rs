//! The input is everything a hostile client sends: the fixed-newstyle
//! handshake, then requests, over a Unix socket pair against udm's
//! per-connection server code with two 1 MiB exports. The server must end
//! the connection (error or clean close) once the input is exhausted, and
//! never panic. The driver is `udm::fuzzing::nbd_client`, shared with
//! tests/fuzz_regress.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| udm::fuzzing::nbd_client(data));
