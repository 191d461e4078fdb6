//! The `table` driver: bytes → dm table text → parse → build over small
//! in-memory devices → a few reads and writes; and its seed tables.

use super::MemResolver;
use crate::core::table;
use crate::core::{BlockDevice, WriteBuf};
use crate::mapper::{self, MappedDevice};
use crate::targets::TargetOptions;

/// The `table` fuzz target: must not panic, whatever `data` is. Returns
/// whether the input built a device (for the regression test's statistics).
pub fn table(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(lines) = table::parse(&text) else {
        return false;
    };
    let mut res = MemResolver::default();
    // One crypt thread: no worker pool per target (a pool per input would
    // make the fuzzer measure thread creation).
    let opts = TargetOptions {
        crypt_threads: 1,
        ..Default::default()
    };
    let Ok(dev) = mapper::build(&lines, &mut res, &opts) else {
        return false;
    };
    // What `table` prints must read back as the same table.
    let shown = dev.table_text(true);
    let _ = dev.table_text(false);
    let again = table::parse(&shown)
        .unwrap_or_else(|e| panic!("printed table does not parse: {e}\n{shown}"));
    let dev2 = mapper::build(&again, &mut res, &opts)
        .unwrap_or_else(|e| panic!("printed table does not build: {e}\n{shown}"));
    assert_eq!(dev2.table_text(true), shown, "table text is not stable");
    // A delay table holds every request for its delay (up to 49 days a
    // request): parsing, building and printing it is what can go wrong;
    // its I/O path is the linear one after a sleep.
    if dev.limits().queue_depth > 0 {
        return true;
    }
    // A lone linear or crypt segment stores what it is given (no aliasing).
    let stores = lines.len() == 1 && matches!(lines[0].target.as_str(), "linear" | "crypt");
    exercise(&dev, stores);
    true
}

/// A few small reads and writes at in-range offsets (segment ends, the
/// middle, the last block), then requests that must be refused.
fn exercise(dev: &MappedDevice, stores: bool) {
    let size = dev.size();
    let lbs = u64::from(dev.limits().logical_block_size).clamp(512, 64 << 10);
    let mut offsets = vec![
        0,
        size / 2 / lbs * lbs,
        size.saturating_sub(lbs) / lbs * lbs,
    ];
    for s in dev.segments().iter().skip(1).take(4) {
        offsets.push(s.start.saturating_sub(lbs) / lbs * lbs);
    }
    let mut buf = vec![0u8; 2 * lbs as usize];
    let mut pat = vec![0u8; buf.len()];
    for (i, &off) in offsets.iter().enumerate() {
        let n = if off + 2 * lbs <= size { 2 * lbs } else { lbs };
        if off + n > size {
            continue;
        }
        let n = n as usize;
        for (j, b) in pat.iter_mut().enumerate() {
            *b = (j as u8).wrapping_mul(31).wrapping_add(i as u8);
        }
        let wrote = dev.write(off, WriteBuf::Borrowed(&pat[..n]), false).is_ok();
        if dev.read(off, &mut buf[..n]).is_ok() && wrote && stores {
            assert!(buf[..n] == pat[..n], "read back differs at {off}");
        }
        let mut owned = pat[..n].to_vec();
        let wrote = dev.write(off, WriteBuf::Owned(&mut owned), true).is_ok();
        if dev.read(off, &mut buf[..n]).is_ok() && wrote && stores {
            assert!(buf[..n] == pat[..n], "read back differs at {off}");
        }
        if dev.write_zeroes(off, lbs, false).is_ok()
            && dev.read(off, &mut buf[..lbs as usize]).is_ok()
            && stores
        {
            assert!(buf[..lbs as usize].iter().all(|&b| b == 0), "not zeroed");
        }
        let _ = dev.discard(off, lbs);
    }
    let _ = dev.flush();
    // Out of range, overflowing and misaligned requests: errors only.
    let _ = dev.read(size, &mut buf[..512]);
    let _ = dev.read(u64::MAX - 511, &mut buf[..512]);
    let _ = dev.write(size - 1, WriteBuf::Borrowed(&pat[..512]), false);
    let _ = dev.read(1, &mut buf[..511]);
    let _ = dev.write_zeroes(u64::MAX, 1, false);
    let _ = dev.discard(size, u64::MAX);
}

/// Seed tables: valid lines of every target over devices `a`, `b`, and
/// `nc` (a store without direct access).
pub fn table_seeds() -> Vec<(&'static str, String)> {
    let key64 = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                 202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
    let key32 = &key64[..64];
    vec![
        ("linear", "0 2048 linear a 0\n".into()),
        (
            "linear2",
            "0 1024 linear a 1024\n1024 512 linear nc 8\n".into(),
        ),
        ("striped", "0 2048 striped 2 8 a 0 b 1024\n".into()),
        ("zero", "0 409600 zero\n".into()),
        ("error", "0 8 error\n8 8 zero\n16 2032 linear a 16\n".into()),
        (
            "crypt_xts",
            format!("0 2048 crypt aes-xts-plain64 {key64} 0 a 0\n"),
        ),
        (
            "crypt_4k",
            format!(
                "0 2048 crypt aes-xts-plain64 {key64} 0 a 0 2 sector_size:4096 iv_large_sectors\n"
            ),
        ),
        (
            "crypt_nodirect",
            format!("0 1024 crypt aes-xts-plain64 {key64} 8 nc 1024 1 sector_size:4096\n"),
        ),
        (
            "crypt_cbc",
            format!("0 1024 crypt aes-cbc-essiv:sha256 {key32} 0 a 0 1 allow_discards\n"),
        ),
        ("flakey", "0 2048 flakey a 0 1 1\n".into()),
        (
            "flakey_features",
            "0 2048 flakey a 0 0 5 8 error_reads corrupt_bio_byte 32 w 1 0 random_write_corrupt 5\n"
                .into(),
        ),
        ("flakey_drop", "0 1024 flakey nc 8 0 1 1 drop_writes\n".into()),
        ("delay", "0 2048 delay a 0 0\n".into()),
        ("delay9", "0 1024 delay a 0 0 b 8 0 a 16 0\n".into()),
        ("delay_held", "0 1024 delay a 0 5 b 0 7\n".into()),
        ("dust", "0 2048 dust a 0 512\n".into()),
        ("dust_4k", "0 1024 dust b 8 4096\n".into()),
        ("log_writes", "0 1024 log-writes a b\n".into()),
        (
            "crypt_over_flakey",
            format!("0 1024 crypt aes-xts-plain64 {key64} 0 a 0\n1024 1024 flakey b 0 9 1 1 error_writes\n"),
        ),
        (
            "crypt_mixed",
            format!(
                "# a comment\n0 8 zero\n8 1000 crypt aes-cbc-plain {key32} 0 a 0\n\
                 1008 8 crypt cipher_null-ecb - 0 b 0\n1016 1032 linear b 16\n"
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_tables_build_and_keep_data() {
        for (name, t) in table_seeds() {
            let lines = table::parse(&t).unwrap_or_else(|e| panic!("{name}: {e}"));
            let dev = mapper::build(
                &lines,
                &mut MemResolver::default(),
                &TargetOptions {
                    crypt_threads: 1,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(dev.size() > 0);
            assert!(table(t.as_bytes()), "{name}");
        }
    }
}
