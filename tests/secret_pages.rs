//! Key memory gives back what it took from the process's mappings: pages
//! freed by `mem::secret` are dumpable again, so the kernel can merge the
//! heap's mappings and a long-running server does not creep towards
//! `vm.max_map_count` (fuzzing TCRYPT headers ran out of mappings so).
//! Its own process, one test: no other test's keys share the heap.

use udm::mem::secret::Locked;

/// `(start, end, dontdump)` of every mapping of this process.
fn mappings() -> Vec<(usize, usize, bool)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                out.push((a, b, false));
                continue;
            }
        }
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(last) = out.last_mut() {
                last.2 = flags.split_whitespace().any(|f| f == "dd");
            }
        }
    }
    out
}

#[test]
fn freed_key_pages_leave_no_mapping_split_behind() {
    let before = mappings().len();
    let mut at = Vec::new();
    for round in 0..4 {
        // Keys and ordinary page-sized allocations interleaved, as a
        // server's heap has them.
        let mut keys = Vec::new();
        let mut plain = Vec::new();
        for i in 0..400u32 {
            let k = Locked::new([(i + round) as u8; 64]);
            at.push(&*k as *const [u8; 64] as usize);
            keys.push(k);
            plain.push(vec![1u8; 4096 + (i as usize % 3) * 100]);
        }
        drop(keys);
        drop(plain);
    }
    let now = mappings();
    let still: Vec<_> = at
        .iter()
        .filter(|&&a| now.iter().any(|&(s, e, dd)| dd && (s..e).contains(&a)))
        .collect();
    assert!(
        still.is_empty(),
        "{} freed key pages still marked MADV_DONTDUMP",
        still.len()
    );
    assert!(
        now.len() < before + 50,
        "mappings grew from {before} to {} over 1600 keys",
        now.len()
    );
}
