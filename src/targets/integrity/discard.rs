//! `allow_discards`, as the kernel's: a discard fills the tags of its
//! blocks with [`DISCARD_FILLER`] and then discards the data below, and
//! a read accepts a stored tag whose bytes, where they differ from the
//! computed tag, are all the filler. So a discarded block reads back
//! (whatever the device below returns for it) instead of failing its
//! check. The tags go first and durably: a crash between the two leaves
//! filler tags over the old data, which still reads.

use super::{io, Integrity};
use crate::core::{DevError, DevResult};

/// The byte the kernel fills a discarded block's tag with.
pub const DISCARD_FILLER: u8 = 0xf6;

/// The kernel's tag comparison: equal, or (with discards allowed) every
/// differing byte is the filler.
pub fn tag_ok(want: &[u8], got: &[u8], discards: bool) -> bool {
    want == got
        || (discards
            && want
                .iter()
                .zip(got)
                .all(|(w, g)| w == g || *g == DISCARD_FILLER))
}

impl Integrity {
    /// Discards the whole blocks inside `[offset, offset + len)`; a
    /// discard is a hint, so the parts of blocks at its ends are kept.
    pub(super) fn discard_blocks(&self, offset: u64, len: u64) -> DevResult<()> {
        if !self.p.opts.allow_discards {
            return Err(DevError::NotSupported(
                "integrity: discards are not enabled (allow_discards)",
            ));
        }
        let bb = self.g.block_bytes() as u64;
        let end = offset.saturating_add(len);
        if end > self.len {
            return Err(DevError::OutOfRange {
                offset,
                len,
                size: self.len,
            });
        }
        let (a, e) = (offset.div_ceil(bb) * bb, end / bb * bb);
        if a >= e {
            return Ok(());
        }
        let run = self.running()?;
        let mut st = self.lock();
        let (s0, n) = (a / 512, (e - a) / 512);
        self.bitmap_mark(&mut st, s0, n)?;
        // In J mode the journal's older copies of these blocks go to their
        // places first, so none lands over the discard later.
        self.around_journal(&run, true, || self.discard_places(s0, n))?;
        self.bitmap_tick(&mut st)
    }

    /// The tags of logical sectors `[s0, s0 + n)` (whole blocks) filled,
    /// durably, then their data discarded below when it can be.
    fn discard_places(&self, s0: u64, n: u64) -> DevResult<()> {
        let g = &self.g;
        let lower = self.dev.limits().discard;
        let mut runs = Vec::new();
        let mut s = s0;
        while s < s0 + n {
            let k = g.left_in_area(s).min(s0 + n - s);
            let fill = vec![DISCARD_FILLER; ((k >> g.log2_spb) * g.tag_size) as usize];
            io::write_bytes(&*self.meta, g.tag_byte(s), &fill)?;
            runs.push((g.data_sector(s) * 512, k * 512));
            s += k;
        }
        self.meta.flush()?;
        if lower {
            for (at, bytes) in runs {
                self.dev.discard(at, bytes)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::WriteBuf;
    use crate::store::MemStore;
    use crate::targets::integrity::tests::{geometry, open, DEV};

    #[test]
    fn filler_bytes_pass_only_with_discards() {
        let want = [1, 2, 3, 4];
        assert!(tag_ok(&want, &want, false));
        assert!(tag_ok(&want, &[DISCARD_FILLER; 4], true));
        assert!(tag_ok(&want, &[1, DISCARD_FILLER, 3, DISCARD_FILLER], true));
        assert!(!tag_ok(&want, &[DISCARD_FILLER; 4], false));
        assert!(!tag_ok(&want, &[DISCARD_FILLER, 0, 3, 4], true));
    }

    #[test]
    fn a_discarded_block_reads_and_its_tag_is_the_filler() {
        for mode in ["J", "D", "B"] {
            let m = Arc::new(MemStore::new(DEV));
            let line = format!("d 0 4 {mode} 3 allow_discards fix_padding internal_hash:crc32c");
            let t = open(&m, &line, 1 << 20).unwrap();
            assert!(t.limits().discard);
            t.write(0, WriteBuf::Borrowed(&[0x33; 8192]), false)
                .unwrap();
            // Sectors 2 to 9; the ragged ends are not discarded.
            t.discard(2 * 512 - 100, 8 * 512 + 200).unwrap();
            let g = geometry(&m);
            let mut tags = [0u8; 16 * 4];
            crate::targets::integrity::io::read_bytes(&*m, g.tag_byte(0), &mut tags).unwrap();
            assert_ne!(tags[4..8], [DISCARD_FILLER; 4], "{mode}: sector 1 kept");
            assert!(tags[8..40].iter().all(|&b| b == DISCARD_FILLER), "{mode}");
            assert_ne!(tags[40..44], [DISCARD_FILLER; 4], "{mode}: sector 10 kept");
            let mut all = vec![0u8; 8192];
            t.read(0, &mut all).unwrap();
            assert_eq!(all[512..1024], [0x33; 512]);
            assert_eq!(all[10 * 512..11 * 512], [0x33; 512]);
            // A write over a discarded block gives it a real tag again (in
            // J mode once placed: at the latest when the device closes).
            t.write(4 * 512, WriteBuf::Borrowed(&[0x44; 512]), false)
                .unwrap();
            t.read(4 * 512, &mut all[..512]).unwrap();
            assert_eq!(all[..512], [0x44; 512], "{mode}");
            drop(t);
            crate::targets::integrity::io::read_bytes(&*m, g.tag_byte(0), &mut tags).unwrap();
            assert_ne!(tags[16..20], [DISCARD_FILLER; 4], "{mode}");
            let without = format!("d 0 4 {mode} 2 fix_padding internal_hash:crc32c");
            let t = open(&m, &without, 1 << 20).unwrap();
            assert!(t.discard(0, 4096).is_err());
            assert!(
                t.read(2 * 512, &mut all[..512]).is_err(),
                "{mode}: filler without allow_discards"
            );
        }
    }
}
