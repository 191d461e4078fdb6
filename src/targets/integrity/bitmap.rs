//! Bitmap mode (`B`), as the kernel's: writes go straight to their
//! places, but first the region they touch (`sectors_per_bit` sectors a
//! bit) is marked dirty in a bitmap kept, durable, in the journal area.
//! Once the device is flushed and `bitmap_flush_interval` has passed,
//! the bits are cleared again. After a crash the superblock still says
//! `DIRTY_BITMAP` (it is cleared only by a clean close), so the next open
//! recomputes the tags of every dirty region: a torn write leaves a
//! sector whose data is old or new, never one whose tag fails. The kernel
//! recomputes in the background and leaves those regions unchecked until
//! then; udm does it before the device is served, which gives the same
//! result without a window of unchecked reads.
//!
//! The superblock is marked dirty at the first write rather than at
//! open (see [`Integrity::recover`]).
//!
//! On disk the bitmap starts at the journal's first sector, in blocks of
//! 4096 bytes; bit `k` (byte `k / 8`, bit `k % 8`) covers the sectors
//! from `k << log2_sectors_per_bit`.

use std::time::{Duration, Instant};

use super::format::write_superblock;
use super::layout::{log2_blocks_per_bitmap_bit, Geometry};
use super::params::Mode;
use super::superblock::{flags, Superblock};
use super::{Integrity, State};
use crate::core::{DevResult, WriteBuf};

/// Bytes of one bitmap block, the unit written to the journal area.
pub const BITMAP_BLOCK_BYTES: usize = 4096;
/// `bitmap_flush_interval` when the line gives none, milliseconds.
pub const DEFAULT_FLUSH_INTERVAL_MS: u32 = 10_000;

/// The dirty bitmap, as it is on disk.
pub struct Bitmap {
    /// log2 of the sectors one bit covers.
    shift: u32,
    provided: u64,
    bytes: Vec<u8>,
    interval: Duration,
    last_clear: Instant,
}

impl Bitmap {
    /// The bitmap of a device with geometry `g` and the superblock's
    /// `log2_blocks_per_bitmap_bit`, all clear.
    pub fn new(g: &Geometry, log2_blocks_per_bit: u8, interval_ms: Option<u32>) -> Bitmap {
        let shift = g.log2_spb + u32::from(log2_blocks_per_bit);
        let bits = g.provided_data_sectors.div_ceil(1 << shift);
        let blocks = bits.div_ceil(BITMAP_BLOCK_BYTES as u64 * 8) as usize;
        let ms = interval_ms.unwrap_or(DEFAULT_FLUSH_INTERVAL_MS);
        Bitmap {
            shift,
            provided: g.provided_data_sectors,
            bytes: vec![0; blocks.max(1) * BITMAP_BLOCK_BYTES],
            interval: Duration::from_millis(u64::from(ms)),
            last_clear: Instant::now(),
        }
    }

    /// The bits covering sectors `[s, s + n)` (`n` > 0).
    fn bit_range(&self, s: u64, n: u64) -> std::ops::RangeInclusive<u64> {
        (s >> self.shift)..=((s + n - 1) >> self.shift)
    }

    fn get(&self, bit: u64) -> bool {
        self.bytes[(bit / 8) as usize] & (1 << (bit % 8)) != 0
    }

    /// Sets the bits of `[s, s + n)`; the bitmap blocks that changed, or
    /// `None` when every bit was already set.
    pub fn set(&mut self, s: u64, n: u64) -> Option<std::ops::RangeInclusive<usize>> {
        let r = self.bit_range(s, n);
        if r.clone().all(|b| self.get(b)) {
            return None;
        }
        for b in r.clone() {
            self.bytes[(b / 8) as usize] |= 1 << (b % 8);
        }
        let per = BITMAP_BLOCK_BYTES as u64 * 8;
        Some((*r.start() / per) as usize..=(*r.end() / per) as usize)
    }

    pub fn any(&self) -> bool {
        self.bytes.iter().any(|&b| b != 0)
    }

    pub fn clear(&mut self) {
        self.bytes.fill(0);
    }

    /// The sector ranges of the set bits, merged, clipped to the
    /// provided sectors.
    pub fn dirty(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let bits = self.provided.div_ceil(1 << self.shift);
        for b in (0..bits).filter(|&b| self.get(b)) {
            let s = b << self.shift;
            let e = ((b + 1) << self.shift).min(self.provided);
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => out.push((s, e)),
            }
        }
        out
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Blocks `r` of the bitmap, for their place in the journal area.
    pub fn blocks(&self, r: std::ops::RangeInclusive<usize>) -> &[u8] {
        &self.bytes[r.start() * BITMAP_BLOCK_BYTES..(r.end() + 1) * BITMAP_BLOCK_BYTES]
    }

    pub fn n_blocks(&self) -> usize {
        self.bytes.len() / BITMAP_BLOCK_BYTES
    }

    fn due(&self) -> bool {
        self.last_clear.elapsed() >= self.interval
    }
}

impl Integrity {
    /// `log2_blocks_per_bitmap_bit` this line asks for (the kernel's
    /// constructor: `sectors_per_bit`, raised until the bitmap fits).
    fn wanted_log2_bpb(&self) -> u8 {
        log2_blocks_per_bitmap_bit(&self.g, self.p.opts.sectors_per_bit)
    }

    fn write_bitmap(&self, b: &Bitmap, r: std::ops::RangeInclusive<usize>) -> DevResult<()> {
        let at = (self.g.journal_sector(0, 0) * 512) as usize + r.start() * BITMAP_BLOCK_BYTES;
        self.meta
            .write(at as u64, WriteBuf::Borrowed(b.blocks(r)), false)?;
        self.meta.flush()
    }

    /// The superblock, version set as the kernel's `sync_rw_sb` sets it,
    /// with its MAC under `journal_mac` (`FIXED_HMAC`), durable on
    /// return.
    pub(super) fn write_live_superblock(&self, sb: &mut Superblock) -> DevResult<()> {
        sb.set_version_for(self.p.mode == Mode::Bitmap, self.g.is_separate());
        let mac = self
            .seal
            .as_ref()
            .map(|s| move |b: &[u8]| s.sb_mac(b).unwrap_or_default());
        let mac = mac.as_ref().map(|f| f as &dyn Fn(&[u8]) -> Vec<u8>);
        write_superblock(&*self.meta, sb, self.g.start, mac)?;
        self.meta.flush()
    }

    /// The kernel's `dm_integrity_resume`: a device left with a dirty
    /// bitmap gets the tags of its dirty regions recomputed, and is left
    /// clean (empty journal, `DIRTY_BITMAP` cleared); otherwise the
    /// journal is replayed (what [`Integrity::replay`] returns). Bitmap
    /// mode marks the superblock dirty at the
    /// first write ([`Integrity::bitmap_mark`]), not here as the kernel
    /// does: udm may build a table's targets more than once, and an
    /// instance that never wrote must not touch the superblock when it
    /// goes.
    pub(super) fn recover(&self) -> DevResult<(u64, u8, bool)> {
        let grown = self.resize_superblock()?;
        if self.lock().sb.has(flags::DIRTY_BITMAP) {
            let ranges = self.dirty_ranges(grown)?;
            let n: u64 = ranges.iter().map(|&(s, e)| e - s).sum();
            if n <= SYNC_RECOVERY_MAX {
                self.recover_now(&ranges)?;
            } else {
                self.recover_later(ranges)?;
            }
            self.write_empty_journal(0)?;
            self.meta.flush()?;
            let mut st = self.lock();
            let mut sb = st.sb.clone();
            sb.flags &= !flags::DIRTY_BITMAP;
            self.write_live_superblock(&mut sb)?;
            st.sb = sb;
        }
        self.replay()
    }

    /// The kernel's resize at resume: when the device now provides another
    /// number of sectors than the superblock says (a data device that grew
    /// or shrank, with a separate metadata device; a larger device with
    /// interleaved tags), the superblock takes the new size. Returns the
    /// old size when it grew, whose new sectors a dirty bitmap covers.
    fn resize_superblock(&self) -> DevResult<Option<u64>> {
        let mut st = self.lock();
        let (old, new) = (st.sb.provided_data_sectors, self.g.provided_data_sectors);
        if old == new {
            return Ok(None);
        }
        tracing::info!(
            "integrity {}: the device provides {new} sectors, the superblock said {old}",
            self.p.dev
        );
        let mut sb = st.sb.clone();
        sb.provided_data_sectors = new;
        self.write_live_superblock(&mut sb)?;
        st.sb = sb;
        Ok((new > old).then_some(old))
    }

    /// Bitmap mode's start, at the first write: the superblock says
    /// `DIRTY_BITMAP` (with this line's bit size) before any bit is set,
    /// and the bitmap on disk starts clear.
    fn activate_bitmap(&self, st: &mut State) -> DevResult<()> {
        let mut sb = st.sb.clone();
        sb.flags |= flags::DIRTY_BITMAP;
        sb.log2_blocks_per_bitmap_bit = self.wanted_log2_bpb();
        self.write_live_superblock(&mut sb)?;
        let b = Bitmap::new(
            &self.g,
            sb.log2_blocks_per_bitmap_bit,
            self.p.opts.bitmap_flush_interval,
        );
        self.write_bitmap(&b, 0..=b.n_blocks() - 1)?;
        st.sb = sb;
        st.bitmap = Some(b);
        Ok(())
    }

    /// The regions the on-disk bitmap marks dirty (all of the device when
    /// it was written with another bit size), and the sectors from `grown`
    /// on, which a device that grew added (the kernel sets their bits at
    /// resume).
    fn dirty_ranges(&self, grown: Option<u64>) -> DevResult<Vec<(u64, u64)>> {
        // Only a bitmap of the bit size this line computes is read: that
        // one fits the journal area; the superblock's own value may be
        // anything (a corrupt one is a shift past 63 bits).
        let sb_l2 = self.lock().sb.log2_blocks_per_bitmap_bit;
        let end = self.g.provided_data_sectors;
        if sb_l2 != self.wanted_log2_bpb() {
            return Ok(vec![(0, end)]);
        }
        let mut b = Bitmap::new(&self.g, sb_l2, None);
        let at = self.g.journal_sector(0, 0) * 512;
        self.meta.read(at, b.bytes_mut())?;
        let mut r = b.dirty();
        if let Some(old) = grown {
            r.push((old, end));
        }
        Ok(merged(r))
    }

    /// A few dirty regions are recomputed at once, as part of the resume.
    fn recover_now(&self, ranges: &[(u64, u64)]) -> DevResult<()> {
        let mut n = 0;
        for &(s, e) in ranges {
            self.recompute_tags(s, e)?;
            n += e - s;
        }
        if n > 0 {
            tracing::info!(
                "integrity {}: recomputed the tags of {n} sectors the bitmap marked dirty",
                self.p.dev
            );
        }
        self.flush_both()
    }

    /// Many are left to the background recalculation, as the kernel does
    /// (`dm_integrity_resume` turns a dirty bitmap into `RECALCULATING`
    /// from the start): a resume that recomputed a large device's tags
    /// would hold every control verb behind it for minutes. The superblock
    /// says `RECALCULATING` from the first dirty region before
    /// `DIRTY_BITMAP` is cleared, so a crash meanwhile recomputes
    /// everything from the position (more than needed, never less); reads
    /// past the position are not checked until the job passes them.
    fn recover_later(&self, ranges: Vec<(u64, u64)>) -> DevResult<()> {
        let o = &self.p.opts;
        let mut st = self.lock();
        let mut sb = st.sb.clone();
        let mut set = ranges;
        if sb.has(flags::RECALCULATING) && sb.recalc_sector < self.g.provided_data_sectors {
            set.push((sb.recalc_sector, self.g.provided_data_sectors));
        }
        let set = merged(set);
        let Some(&(first, _)) = set.first() else {
            return Ok(());
        };
        // A line asking for a recalculation of everything gets it (as the
        // options would give it: from the start unless one runs).
        let all = o.reset_recalculate || (o.recalculate && !sb.has(flags::RECALCULATING));
        sb.flags |= flags::RECALCULATING;
        sb.recalc_sector = if all { 0 } else { first };
        self.write_live_superblock(&mut sb)?;
        tracing::info!(
            "integrity {}: the bitmap marks {} sectors dirty; their tags are recomputed in the \
             background from sector {first}",
            self.p.dev,
            set.iter().map(|&(s, e)| e - s).sum::<u64>()
        );
        st.sb = sb;
        st.recover = (!all).then_some(set);
        Ok(())
    }

    /// A `D` or `B` write: in bitmap mode its regions are marked dirty
    /// (durably) first, and the bitmap is cleared when it is due.
    pub(super) fn write_direct(
        &self,
        st: &mut State,
        s: u64,
        data: &[u8],
        tags: &[u8],
    ) -> DevResult<()> {
        if self.p.mode != Mode::Bitmap {
            return self.place(s, data, tags);
        }
        self.bitmap_mark(st, s, data.len() as u64 / 512)?;
        self.place(s, data, tags)?;
        self.bitmap_tick(st)
    }

    /// In bitmap mode, marks `[s, s + n)` dirty on disk (durable on
    /// return) unless it already is; nothing in the other modes.
    pub(super) fn bitmap_mark(&self, st: &mut State, s: u64, n: u64) -> DevResult<()> {
        if self.p.mode != Mode::Bitmap {
            return Ok(());
        }
        if st.bitmap.is_none() {
            self.activate_bitmap(st)?;
        }
        let Some(b) = st.bitmap.as_mut() else {
            return Ok(());
        };
        match b.set(s, n) {
            Some(r) => self.write_bitmap(b, r),
            None => Ok(()),
        }
    }

    /// The kernel's `bitmap_flush_work`, run from the I/O path: once the
    /// interval has passed, everything written is flushed and the bitmap
    /// cleared on disk.
    pub(super) fn bitmap_tick(&self, st: &mut State) -> DevResult<()> {
        let Some(b) = st.bitmap.as_mut().filter(|b| b.due()) else {
            return Ok(());
        };
        b.last_clear = Instant::now();
        if !b.any() {
            return Ok(());
        }
        self.flush_both()?;
        b.clear();
        let n = b.n_blocks();
        self.write_bitmap(b, 0..=n - 1)
    }

    /// The kernel's `postsuspend` in bitmap mode: with every write
    /// durable the journal area is rewritten empty and `DIRTY_BITMAP`
    /// cleared, so the next open has nothing to recompute.
    pub(super) fn close_bitmap(&self) -> DevResult<()> {
        let mut st = self.lock();
        if st.bitmap.is_none() {
            return Ok(());
        }
        self.flush_both()?;
        self.write_empty_journal(0)?;
        self.meta.flush()?;
        let mut sb = st.sb.clone();
        sb.flags &= !flags::DIRTY_BITMAP;
        self.write_live_superblock(&mut sb)?;
        st.sb = sb;
        st.bitmap = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::integrity::superblock::Superblock;

    fn geometry() -> Geometry {
        let sb = Superblock {
            version: 5,
            log2_interleave_sectors: 15,
            tag_size: 4,
            journal_sections: 5,
            flags: flags::FIXED_PADDING,
            ..Superblock::default()
        };
        Geometry::of(&sb, 0, 1 << 18).unwrap()
    }

    #[test]
    fn bits_cover_their_regions_and_merge_back() {
        let g = geometry();
        // 2^3 blocks of 512 bytes a bit: 8 sectors.
        let mut b = Bitmap::new(&g, 3, Some(0));
        assert_eq!(b.set(0, 1), Some(0..=0));
        assert_eq!(b.set(7, 1), None, "same bit");
        assert_eq!(b.set(8, 16), Some(0..=0));
        assert_eq!(b.dirty(), vec![(0, 24)]);
        assert!(b.any() && b.due());
        b.clear();
        assert!(!b.any() && b.dirty().is_empty());
        // One sector a bit: bit 32768 is the first of the second block.
        let mut b = Bitmap::new(&g, 0, None);
        assert_eq!(b.set(32768, 1), Some(1..=1));
        assert_eq!(b.bytes[4096], 1);
        assert_eq!(b.dirty(), vec![(32768, 32769)]);
    }

    #[test]
    fn the_last_bit_stops_at_the_provided_sectors() {
        let g = geometry();
        let mut b = Bitmap::new(&g, 15, None);
        let p = g.provided_data_sectors;
        b.set(p - 8, 8);
        let d = b.dirty();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].1, p);
        assert!(!b.due(), "10 s by default");
    }
}

#[cfg(test)]
mod target_tests {
    use std::sync::Arc;

    use crate::core::{BlockDevice, WriteBuf};
    use crate::store::MemStore;
    use crate::targets::integrity::superblock::{flags, Superblock};
    use crate::targets::integrity::tests::{geometry, open, DEV};

    const B: &str = "d 0 4 B 4 sectors_per_bit:8 bitmap_flush_interval:3600000 fix_padding \
                     internal_hash:crc32c";

    fn sb(m: &MemStore) -> Superblock {
        let mut b = vec![0u8; 512];
        m.read(0, &mut b).unwrap();
        Superblock::parse(&b).unwrap().unwrap()
    }

    /// Flips a byte of logical sector `s`'s data on the device below.
    fn flip(m: &MemStore, s: u64) {
        let at = geometry(m).data_sector(s) * 512;
        let mut b = [0u8; 512];
        m.read(at, &mut b).unwrap();
        b[7] ^= 0x40;
        m.write(at, WriteBuf::Borrowed(&b), false).unwrap();
    }

    #[test]
    fn dirty_while_open_clean_after_close_and_data_round_trips() {
        let m = Arc::new(MemStore::new(DEV));
        let t = open(&m, B, 1 << 20).unwrap();
        // A second instance that never writes changes nothing when it goes.
        drop(open(&m, B, 1 << 20).unwrap());
        assert!(!sb(&m).has(flags::DIRTY_BITMAP));
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 1) as u8).collect();
        t.write(16 * 512, WriteBuf::Borrowed(&data), false).unwrap();
        let s = sb(&m);
        assert!(s.has(flags::DIRTY_BITMAP) && s.version >= 3, "{s:?}");
        assert_eq!(s.log2_blocks_per_bitmap_bit, 3);
        // Bits 2 and 3 (sectors 16 to 31) are set on disk.
        let g = geometry(&m);
        let mut bm = [0u8; 512];
        m.read(g.journal_sector(0, 0) * 512, &mut bm).unwrap();
        assert_eq!(bm[0], 0b1100);
        drop(t);
        let s = sb(&m);
        assert!(!s.has(flags::DIRTY_BITMAP), "{s:?}");
        let t = open(&m, B, 1 << 20).unwrap();
        let mut back = vec![0u8; data.len()];
        t.read(16 * 512, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_crash_recomputes_the_dirty_regions_only() {
        let m = Arc::new(MemStore::new(DEV));
        let t = open(&m, B, 1 << 20).unwrap();
        t.write(0, WriteBuf::Borrowed(&[7u8; 4096]), false).unwrap();
        drop(t);
        let t = open(&m, B, 1 << 20).unwrap();
        t.write(64 * 512, WriteBuf::Borrowed(&[9u8; 4096]), false)
            .unwrap();
        // A crash: the target never closes; a torn write changed data
        // without its tag in a dirty region (sector 65) and in a clean one
        // (sector 1, by something else: still a mismatch).
        std::mem::forget(t);
        flip(&m, 65);
        flip(&m, 1);
        let t = open(&m, B, 1 << 20).unwrap();
        let mut b = [0u8; 512];
        t.read(65 * 512, &mut b).unwrap();
        assert_eq!(b[7], 9 ^ 0x40);
        assert!(
            t.read(512, &mut b).is_err(),
            "a clean region is not recomputed"
        );
    }

    /// A dirty bitmap covering more than a resume should recompute (here
    /// one of another bit size: the whole device) goes to the background
    /// recalculation, as the kernel's: the resume returns with the
    /// superblock saying `RECALCULATING` from the first dirty sector, and
    /// the job brings every tag back. Before, the resume recomputed the
    /// whole device while every control verb waited.
    #[test]
    fn a_large_dirty_bitmap_is_recovered_in_the_background() {
        const BIG: u64 = 512 << 20;
        let m = Arc::new(MemStore::new(BIG));
        let t = open(&m, B, 1 << 20).unwrap();
        t.write(0, WriteBuf::Borrowed(&[7u8; 4096]), false).unwrap();
        std::mem::forget(t);
        let other = B.replace("sectors_per_bit:8", "sectors_per_bit:16");
        let t = crate::targets::integrity::tests::load(&m, &other, 1 << 20).unwrap();
        t.resume();
        t.postsuspend();
        let s = sb(&m);
        assert!(!s.has(flags::DIRTY_BITMAP), "{s:?}");
        assert!(s.has(flags::RECALCULATING), "{s:?}");
        assert!(
            s.recalc_sector < s.provided_data_sectors,
            "the resume recomputed all {} sectors itself",
            s.provided_data_sectors
        );
        t.resume();
        let t0 = std::time::Instant::now();
        while sb(&m).recalc_sector < s.provided_data_sectors {
            assert!(t0.elapsed() < std::time::Duration::from_secs(120));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut b = [0u8; 4096];
        t.read(0, &mut b).unwrap();
        assert_eq!(b, [7u8; 4096]);
    }

    #[test]
    fn merged_joins_touching_and_overlapping_regions() {
        assert_eq!(
            super::merged(vec![(8, 16), (0, 8), (20, 24), (22, 30), (40, 40)]),
            vec![(0, 16), (20, 30)]
        );
    }

    #[test]
    fn a_due_flush_clears_the_bitmap() {
        let m = Arc::new(MemStore::new(DEV));
        let line = "d 0 4 B 3 sectors_per_bit:8 bitmap_flush_interval:0 internal_hash:crc32c";
        let t = open(&m, line, 1 << 20).unwrap();
        t.write(0, WriteBuf::Borrowed(&[3u8; 4096]), false).unwrap();
        t.flush().unwrap();
        let g = geometry(&m);
        let mut bm = [0u8; 512];
        m.read(g.journal_sector(0, 0) * 512, &mut bm).unwrap();
        assert_eq!(bm[0], 0);
        std::mem::forget(t);
        flip(&m, 2);
        let t = open(&m, line, 1 << 20).unwrap();
        let mut b = [0u8; 512];
        assert!(t.read(2 * 512, &mut b).is_err());
    }

    /// With `journal_mac` (`fix_hmac`) every superblock rewrite of bitmap
    /// mode carries the MAC, and the journal area is left sealed: the
    /// device opens again in B and J mode with the key, after a clean
    /// close and after a crash, and a wrong key is still refused.
    #[test]
    fn bitmap_mode_keeps_the_superblock_mac_and_a_sealed_journal() {
        let m = Arc::new(MemStore::new(DEV));
        let mac = "journal_mac:hmac(sha256):00112233445566778899aabbccddeeff";
        let b = format!(
            "d 0 4 B 6 sectors_per_bit:8 bitmap_flush_interval:3600000 fix_padding fix_hmac \
             {mac} internal_hash:crc32c"
        );
        let j = format!("d 0 4 J 4 fix_padding fix_hmac {mac} internal_hash:crc32c");
        let t = open(&m, &b, 1 << 20).unwrap();
        t.write(0, WriteBuf::Borrowed(&[1u8; 4096]), false).unwrap();
        assert!(sb(&m).has(flags::DIRTY_BITMAP));
        drop(t);
        let t = open(&m, &j, 1 << 20).unwrap();
        t.write(4096, WriteBuf::Borrowed(&[2u8; 4096]), false)
            .unwrap();
        drop(t);
        let t = open(&m, &b, 1 << 20).unwrap();
        t.write(8192, WriteBuf::Borrowed(&[3u8; 4096]), false)
            .unwrap();
        std::mem::forget(t);
        let t = open(&m, &j, 1 << 20).unwrap();
        let mut back = [0u8; 12288];
        t.read(0, &mut back).unwrap();
        for (k, c) in back.chunks(4096).enumerate() {
            assert_eq!(c, [k as u8 + 1; 4096]);
        }
        drop(t);
        let wrong = j.replace("0011223344", "ffffffffff");
        let e = open(&m, &wrong, 1 << 20).err().unwrap();
        assert!(e.contains("journal_mac"), "{e}");
    }

    #[test]
    fn journal_mode_takes_over_a_dirty_device() {
        let m = Arc::new(MemStore::new(DEV));
        let t = open(&m, B, 1 << 20).unwrap();
        t.write(0, WriteBuf::Borrowed(&[5u8; 4096]), false).unwrap();
        std::mem::forget(t);
        flip(&m, 3);
        let j = "d 0 4 J 2 fix_padding internal_hash:crc32c";
        let t = open(&m, j, 1 << 20).unwrap();
        assert!(!sb(&m).has(flags::DIRTY_BITMAP));
        let mut b = [0u8; 4096];
        t.read(0, &mut b).unwrap();
        assert_eq!(b[3 * 512 + 7], 5 ^ 0x40);
        t.write(8192, WriteBuf::Borrowed(&[6u8; 4096]), false)
            .unwrap();
        drop(t);
        let t = open(&m, j, 1 << 20).unwrap();
        t.read(8192, &mut b).unwrap();
        assert_eq!(b, [6u8; 4096]);
    }
}

/// Dirty regions recomputed within the resume; more go to the background
/// recalculation (64 MiB of data: well under a second of hashing).
const SYNC_RECOVERY_MAX: u64 = 1 << 17;

/// `r` sorted, with overlapping or touching regions joined.
fn merged(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.retain(|&(s, e)| e > s);
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}
