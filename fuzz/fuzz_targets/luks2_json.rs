//! LUKS2 JSON metadata validation on arbitrary JSON-area bytes, and the
//! keyslot edits udm makes on whatever validates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use udm::luks::luks2;

fuzz_target!(|data: &[u8]| {
    let mut area = data.to_vec();
    area.resize(12288, 0);
    if let Ok(m) = luks2::parse_json_area(&area, 16384, "fuzz") {
        let ids: Vec<u32> = m.keyslots.keys().copied().collect();
        for id in ids {
            if let Ok(m2) = m.without_keyslot(16384, id) {
                assert!(!m2.keyslots.contains_key(&id));
            }
        }
        let _ = m.to_bytes();
    }
});
