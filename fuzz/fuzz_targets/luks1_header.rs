//! LUKS1 header parser: any 1024 bytes and any device size must give a
//! header or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udm::luks::luks1::Header;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (size, hdr) = data.split_at(8);
    let mut s = [0u8; 8];
    s.copy_from_slice(size);
    if let Ok(h) = Header::parse(hdr, u64::from_le_bytes(s)) {
        // A parsed header must serialize and re-parse to the same fields.
        let again = Header::parse(&h.to_bytes(), u64::MAX).expect("re-parse of a valid header");
        assert_eq!(again.slots, h.slots);
        assert_eq!(again.cipher_spec(), h.cipher_spec());
        let _ = h.areas_end();
    }
});
