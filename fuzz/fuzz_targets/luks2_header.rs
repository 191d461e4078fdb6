//! LUKS2 binary header plus JSON area, as read from disk: the first 4096
//! bytes are the binary header (checked for both copy positions), the rest
//! is the JSON area. The checksum step is exercised by `parse_copy`, the
//! JSON validation (which a fuzzer cannot reach through a checksum) by
//! `parse_json_area` directly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udm::luks::luks2;

fuzz_target!(|data: &[u8]| {
    if data.len() < luks2::BIN_LEN {
        return;
    }
    let (bin, area) = data.split_at(luks2::BIN_LEN);
    for (off, secondary) in [(0u64, false), (16384, true)] {
        if let Ok((h, _)) = luks2::parse_bin(bin, off, secondary) {
            let _ = luks2::parse_copy(bin, area, off, secondary);
            let _ = luks2::parse_json_area(area, h.hdr_size, "fuzz");
        }
    }
    let _ = luks2::parse_json_area(area, 16384, "fuzz");
});
