//! Where everything lives on a dm-integrity device, computed as the
//! kernel computes it (`calculate_journal_section_size`,
//! `calculate_device_limits`, `get_provided_data_sectors`): superblock,
//! journal sections, then areas of `metadata_run` sectors of tags
//! followed by `interleave_sectors` of data. A device formatted by udm
//! must map the same way in the kernel, so nothing here is udm's choice.
//!
//! With a separate metadata device (the kernel's `meta_device`) nothing
//! is interleaved: the superblock, journal and one run of tags (rounded
//! up to dm-bufio's buffer) sit on the metadata device from the target's
//! offset, and the data device holds only data, logical sector `s` at
//! its sector `s` (the offset does not apply to it), so it reads as a
//! plain device without the metadata. Its size is the provided size.

use super::superblock::{flags, Superblock, SB_SECTORS};

/// Sectors of journal entries at the head of each journal section.
pub const JOURNAL_BLOCK_SECTORS: u64 = 8;
/// Bytes of a journal sector before its 8-byte commit ID.
pub const JOURNAL_SECTOR_DATA: usize = 504;
/// MAC bytes per journal entry sector with `journal_mac`.
pub const JOURNAL_MAC_PER_SECTOR: usize = 8;
/// The largest tag: a journal entry for 8 sectors must fit one sector.
pub const MAX_TAG_SIZE: usize = JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR - (8 + 8 * 8);
/// The kernel's default interleave (sectors of data per area).
pub const DEFAULT_INTERLEAVE_SECTORS: u32 = 32768;
/// Journal size cap, in sectors, of a 64-bit kernel.
pub const DEFAULT_MAX_JOURNAL_SECTORS: u64 = 131_072;
/// Journal sectors the kernel gives a device by default: 1/128 of it.
pub const DEFAULT_JOURNAL_SIZE_FACTOR: u32 = 7;
/// `sectors_per_bit` of bitmap mode by default.
pub const DEFAULT_SECTORS_PER_BITMAP_BIT: u64 = 32768;
const METADATA_PADDING_SECTORS: u64 = 8;
/// log2 of the kernel's `DEFAULT_BUFFER_SECTORS` (128).
pub const DEFAULT_LOG2_BUFFER_SECTORS: u32 = 7;
/// The smallest dm-bufio buffer the kernel falls back to (8 sectors).
const MIN_LOG2_BUFFER_SECTORS: u32 = 3;
/// With a separate metadata device data and tags are each one run; runs
/// are cut at multiples of this many sectors only to bound buffers.
const SEPARATE_RUN_LOG2: u32 = 15;

/// The layout of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Target offset on the device, sectors.
    pub start: u64,
    pub tag_size: u64,
    pub log2_spb: u32,
    pub log2_interleave: u32,
    pub journal_sections: u64,
    pub journal_mac: bool,
    pub fixed_padding: bool,
    /// The device holding the superblock (with interleaved data, the one
    /// device), sectors.
    pub dev_sectors: u64,
    /// With a separate metadata device: the data device's size, sectors.
    /// `None`: data interleaved with the tags on one device.
    pub data_sectors: Option<u64>,
    /// log2 of dm-bufio's buffer (`buffer_sectors`), to which the tag run
    /// of a separate metadata device is rounded up.
    pub log2_buffer: u32,
    pub entry_size: u64,
    pub entries_per_sector: u64,
    pub section_entries: u64,
    pub section_sectors: u64,
    /// Superblock and journal, sectors.
    pub initial_sectors: u64,
    /// Tag sectors before each area's data.
    pub metadata_run: u64,
    pub provided_data_sectors: u64,
}

impl Geometry {
    /// The journal's section geometry for these parameters
    /// (`calculate_journal_section_size`); the rest is filled in by
    /// [`Geometry::limits`].
    pub fn sections(
        start: u64,
        dev_sectors: u64,
        tag_size: u64,
        log2_spb: u32,
        journal_mac: bool,
    ) -> Geometry {
        let spb = 1u64 << log2_spb;
        let entry_size = (8 + 8 * spb + tag_size).div_ceil(8) * 8;
        let mut space = JOURNAL_SECTOR_DATA as u64;
        if journal_mac {
            space -= JOURNAL_MAC_PER_SECTOR as u64;
        }
        let entries_per_sector = space / entry_size;
        let section_entries = entries_per_sector * JOURNAL_BLOCK_SECTORS;
        Geometry {
            start,
            tag_size,
            log2_spb,
            log2_interleave: 0,
            journal_sections: 0,
            journal_mac,
            fixed_padding: false,
            dev_sectors,
            data_sectors: None,
            log2_buffer: DEFAULT_LOG2_BUFFER_SECTORS,
            entry_size,
            entries_per_sector,
            section_entries,
            section_sectors: (section_entries << log2_spb) + JOURNAL_BLOCK_SECTORS,
            initial_sectors: 0,
            metadata_run: 0,
            provided_data_sectors: 0,
        }
    }

    /// The checks and journal geometry both layouts share.
    fn base(sb: &Superblock, start: u64, dev_sectors: u64) -> Result<Geometry, String> {
        let tag = u64::from(sb.tag_size);
        if tag as usize > MAX_TAG_SIZE {
            return Err(format!(
                "integrity: tag size {tag} is larger than {MAX_TAG_SIZE}"
            ));
        }
        if sb.journal_sections == 0 {
            return Err("integrity: corrupted superblock, journal_sections is 0".into());
        }
        let mut g = Geometry::sections(
            start,
            dev_sectors,
            tag,
            u32::from(sb.log2_sectors_per_block),
            sb.has(flags::HAVE_JOURNAL_MAC),
        );
        if g.section_entries == 0 {
            return Err(format!(
                "integrity: tag size {tag} leaves no room for journal entries"
            ));
        }
        g.journal_sections = u64::from(sb.journal_sections);
        Ok(g)
    }

    /// The geometry a superblock describes on a device of `dev_sectors`
    /// holding data and tags interleaved.
    pub fn of(sb: &Superblock, start: u64, dev_sectors: u64) -> Result<Geometry, String> {
        if sb.log2_interleave_sectors == 0 {
            return Err(
                "integrity: the superblock is of a device whose data lives on a \
                        separate data device (log2_interleave_sectors 0): give that device \
                        (meta_device: in a table, --data-device to integritysetup)"
                    .into(),
            );
        }
        if !(3..=31).contains(&sb.log2_interleave_sectors) {
            return Err(format!(
                "integrity: invalid interleave_sectors 2^{} in the superblock",
                sb.log2_interleave_sectors
            ));
        }
        let mut g = Geometry::base(sb, start, dev_sectors)?;
        g.log2_interleave = u32::from(sb.log2_interleave_sectors);
        g.fixed_padding = sb.has(flags::FIXED_PADDING);
        g.provided_data_sectors = g.max_provided();
        if g.provided_data_sectors == 0 || !g.limits() {
            return Err(format!(
                "integrity: the device ({dev_sectors} sectors) is too small for its journal \
                 and tags"
            ));
        }
        Ok(g)
    }

    /// The geometry a superblock describes on a metadata device of
    /// `meta_sectors` whose data device has `data_sectors`: the kernel's
    /// constructor, which tries smaller dm-bufio buffers (from
    /// `log2_buffer` down to 8 sectors) until the tags fit.
    pub fn of_separate(
        sb: &Superblock,
        start: u64,
        meta_sectors: u64,
        data_sectors: u64,
        log2_buffer: u32,
    ) -> Result<Geometry, String> {
        if sb.log2_interleave_sectors != 0 {
            return Err(format!(
                "integrity: the superblock is of a device with data and tags interleaved \
                 (log2_interleave_sectors {}), not of a separate metadata device: leave \
                 meta_device (--data-device) out",
                sb.log2_interleave_sectors
            ));
        }
        let mut g = Geometry::base(sb, start, meta_sectors)?;
        g.data_sectors = Some(data_sectors);
        g.log2_buffer = log2_buffer;
        g.provided_data_sectors = g.max_provided();
        if g.provided_data_sectors == 0 {
            return Err(format!(
                "integrity: the data device ({data_sectors} sectors) is smaller than one block"
            ));
        }
        while !g.limits() {
            if g.log2_buffer <= MIN_LOG2_BUFFER_SECTORS {
                return Err(format!(
                    "integrity: the metadata device ({meta_sectors} sectors) is too small for \
                     the journal and the tags of {} data sectors",
                    g.provided_data_sectors
                ));
            }
            g.log2_buffer -= 1;
        }
        // The kernel's fit leaves the offset out; the tags must still end
        // on the device, or their I/O would fail later.
        let tags_at = start
            .checked_add(g.initial_sectors)
            .and_then(|s| s.checked_mul(512));
        let tags_end = (g.provided_data_sectors >> g.log2_spb)
            .checked_mul(g.tag_size)
            .zip(tags_at)
            .and_then(|(t, at)| t.checked_add(at));
        if tags_end.is_none_or(|e| e > meta_sectors * 512) {
            return Err(format!(
                "integrity: the metadata device ({meta_sectors} sectors) is too small for the \
                 tags of {} data sectors after offset {start}",
                g.provided_data_sectors
            ));
        }
        Ok(g)
    }

    /// `calculate_device_limits`: sets `initial_sectors` and
    /// `metadata_run`; whether `provided_data_sectors` fits the device.
    pub fn limits(&mut self) -> bool {
        let initial = SB_SECTORS + self.section_sectors * self.journal_sections;
        if initial + METADATA_PADDING_SECTORS >= self.dev_sectors || initial > u64::from(u32::MAX) {
            return false;
        }
        self.initial_sectors = initial;
        if self.data_sectors.is_some() {
            return self.separate_limits();
        }
        let padding: u64 = if self.fixed_padding {
            METADATA_PADDING_SECTORS << 9
        } else {
            1 << 9 << METADATA_PADDING_SECTORS
        };
        let bytes = self.tag_size << (self.log2_interleave - self.log2_spb);
        self.metadata_run = (bytes.div_ceil(padding) * padding) >> 9;
        if self.provided_data_sectors == 0 {
            return true;
        }
        let last = self.data_sector(self.provided_data_sectors - 1);
        last >= self.start && last < self.dev_sectors
    }

    /// `calculate_device_limits` with a separate metadata device: one tag
    /// run (`metadata_run` 1), rounded up to the buffer, after the journal.
    /// The kernel does not count the offset here, nor does this, so that a
    /// format picks the kernel's journal sections; [`Geometry::of_separate`]
    /// checks where the tags really end.
    fn separate_limits(&mut self) -> bool {
        self.metadata_run = 1;
        let unit = 512u64 << self.log2_buffer;
        let Some(bytes) = (self.provided_data_sectors >> self.log2_spb).checked_mul(self.tag_size)
        else {
            return false;
        };
        let meta = bytes.div_ceil(unit) << self.log2_buffer;
        self.initial_sectors
            .checked_add(meta)
            .is_some_and(|end| end <= self.dev_sectors)
    }

    /// `get_provided_data_sectors`: the most sectors (a multiple of 8)
    /// whose data and tags fit, found bit by bit from the top; with a
    /// separate metadata device the data device's whole blocks.
    pub fn max_provided(&mut self) -> u64 {
        if let Some(d) = self.data_sectors {
            self.provided_data_sectors = d & !(self.sectors_per_block() - 1);
            let p = self.provided_data_sectors;
            self.limits();
            return p;
        }
        self.provided_data_sectors = 0;
        if self.dev_sectors == 0 {
            return 0;
        }
        let top = 63 - self.dev_sectors.leading_zeros();
        for bit in (3..=top).rev() {
            let prev = self.provided_data_sectors;
            self.provided_data_sectors |= 1 << bit;
            if !self.limits() {
                self.provided_data_sectors = prev;
            }
        }
        let p = self.provided_data_sectors;
        self.limits();
        p
    }

    pub fn interleave(&self) -> u64 {
        1 << self.log2_interleave
    }

    pub fn sectors_per_block(&self) -> u64 {
        1 << self.log2_spb
    }

    pub fn block_bytes(&self) -> usize {
        512 << self.log2_spb
    }

    /// Whether tags and data are on devices of their own (`meta_device`).
    pub fn is_separate(&self) -> bool {
        self.data_sectors.is_some()
    }

    /// The area of logical sector `s`: sectors of one area are contiguous
    /// on the data device, and so are their tags (with a separate
    /// metadata device everything is one area).
    pub fn area(&self, s: u64) -> u64 {
        if self.is_separate() {
            0
        } else {
            s >> self.log2_interleave
        }
    }

    /// The data device's sector holding logical sector `s`.
    pub fn data_sector(&self, s: u64) -> u64 {
        if self.is_separate() {
            return s;
        }
        let area = s >> self.log2_interleave;
        let off = s & (self.interleave() - 1);
        self.start
            + self.initial_sectors
            + (area << self.log2_interleave)
            + (area + 1) * self.metadata_run
            + off
    }

    /// The metadata device's byte where the tag of the block at logical
    /// sector `s` starts.
    pub fn tag_byte(&self, s: u64) -> u64 {
        if self.is_separate() {
            return (self.start + self.initial_sectors) * 512
                + (s >> self.log2_spb) * self.tag_size;
        }
        let area = s >> self.log2_interleave;
        let off = s & (self.interleave() - 1);
        let run = area * (self.interleave() + self.metadata_run);
        (self.start + self.initial_sectors + run) * 512 + (off >> self.log2_spb) * self.tag_size
    }

    /// Sectors from `s` to the end of its area (a run of data and of
    /// tags that is contiguous on the device); with a separate metadata
    /// device, to the next multiple of 2^15 sectors, so that no buffer
    /// grows with the device.
    pub fn left_in_area(&self, s: u64) -> u64 {
        let unit = if self.is_separate() {
            1 << SEPARATE_RUN_LOG2
        } else {
            self.interleave()
        };
        unit - (s & (unit - 1))
    }

    /// Device sector of journal section `i`, sector `j`.
    pub fn journal_sector(&self, i: u64, j: u64) -> u64 {
        self.start + SB_SECTORS + i * self.section_sectors + j
    }
}

/// Sectors of the journal a superblock describes (its sections), which
/// needs neither device's size.
pub fn journal_sectors_of(sb: &Superblock) -> u64 {
    let g = Geometry::sections(
        0,
        0,
        u64::from(sb.tag_size),
        u32::from(sb.log2_sectors_per_block),
        sb.has(flags::HAVE_JOURNAL_MAC),
    );
    g.section_sectors * u64::from(sb.journal_sections)
}

/// Refuses a journal larger than half of `ram_bytes` (the machine's memory
/// when `None` is given): the kernel refuses one of more pages than the
/// machine has ("journal doesn't fit into memory"), and udm keeps J
/// mode's journal in memory, plus, with a stream cipher in
/// `journal_crypt`, a keystream as long. Replay reads one section at a
/// time whatever the size.
pub fn journal_fits_memory(g: &Geometry, ram_bytes: Option<u64>) -> Result<(), String> {
    let ram = ram_bytes
        .or_else(crate::mem::total_ram_bytes)
        .unwrap_or(4 << 30);
    let bytes = g
        .section_sectors
        .checked_mul(g.journal_sections)
        .and_then(|s| s.checked_mul(512));
    match bytes {
        Some(b) if b <= ram / 2 => Ok(()),
        _ => Err(format!(
            "integrity: journal doesn't fit into memory: {} sections of {} sectors are more \
             than half of the {ram} bytes of memory (a corrupt superblock, or format the \
             device with a smaller --journal-size)",
            g.journal_sections, g.section_sectors
        )),
    }
}

/// What one journal entry costs in `J` mode's index (sector to newest
/// entry), charged with the journal.
const INDEX_ENTRY_BYTES: u64 = 32;

/// The memory a device keeps for as long as it is active because its
/// superblock sizes the journal: in `J` mode (`in_memory`) the journal
/// itself and its index; with a stream cipher in `journal_crypt`
/// (`keystream`) a keystream as long as the journal, page-rounded. It is
/// reserved from the server's pinned memory before either is allocated.
pub fn pinned_journal_bytes(g: &Geometry, in_memory: bool, keystream: bool) -> u64 {
    let journal = g
        .section_sectors
        .saturating_mul(g.journal_sections)
        .saturating_mul(512);
    let entries = g.section_entries.saturating_mul(g.journal_sections);
    let mut n = 0u64;
    if in_memory {
        n = n.saturating_add(journal.saturating_add(entries.saturating_mul(INDEX_ENTRY_BYTES)));
    }
    if keystream {
        n = n.saturating_add(
            journal
                .div_ceil(4096)
                .saturating_mul(4096)
                .saturating_add(32),
        );
    }
    n
}

/// log2 of the table's `buffer_sectors` as the kernel's constructor
/// takes it (0 counts as 1, at most 2^22).
pub fn log2_buffer_of(buffer_sectors: Option<u32>) -> u32 {
    match buffer_sectors {
        None => DEFAULT_LOG2_BUFFER_SECTORS,
        Some(n) => (31 - n.max(1).leading_zeros()).min(22),
    }
}

/// The journal size the kernel picks when none is given (from the data
/// device's size, also with a separate metadata device).
pub fn default_journal_sectors(dev_sectors: u64) -> u64 {
    DEFAULT_MAX_JOURNAL_SECTORS.min(dev_sectors >> DEFAULT_JOURNAL_SIZE_FACTOR)
}

/// `log2_blocks_per_bitmap_bit` as the kernel's constructor computes it:
/// `sectors_per_bit` (default 32768), raised until the bitmap fits the
/// journal area.
pub fn log2_blocks_per_bitmap_bit(g: &Geometry, sectors_per_bit: Option<u64>) -> u8 {
    let mut l: u32 = match sectors_per_bit {
        Some(0) => 0,
        Some(n) => 63 - n.leading_zeros(),
        None => 63 - DEFAULT_SECTORS_PER_BITMAP_BIT.leading_zeros(),
    };
    l = l.max(g.log2_spb);
    let bits = ((g.section_sectors * g.journal_sections) << 12).min(u64::from(u32::MAX));
    if bits > 0 {
        while bits < (g.provided_data_sectors + (1u64 << l) - 1) >> l {
            l += 1;
        }
    }
    (l - g.log2_spb) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(tag: u16, il: u8, sections: u32) -> Superblock {
        Superblock {
            version: 5,
            log2_interleave_sectors: il,
            tag_size: tag,
            journal_sections: sections,
            flags: flags::FIXED_PADDING,
            ..Superblock::default()
        }
    }

    #[test]
    fn pinned_bytes_count_the_journal_its_index_and_the_keystream() {
        let mut g = Geometry::sections(0, 1 << 40, 4, 0, false);
        g.journal_sections = 10;
        let j = g.section_sectors * 10 * 512;
        assert_eq!(pinned_journal_bytes(&g, false, false), 0);
        assert_eq!(
            pinned_journal_bytes(&g, true, false),
            j + g.section_entries * 10 * INDEX_ENTRY_BYTES
        );
        assert_eq!(
            pinned_journal_bytes(&g, false, true),
            j.div_ceil(4096) * 4096 + 32
        );
        g.journal_sections = u64::MAX;
        assert_eq!(
            pinned_journal_bytes(&g, true, true),
            u64::MAX,
            "no overflow"
        );
    }

    #[test]
    fn a_journal_over_half_of_memory_is_refused_before_any_buffer() {
        let mut g = Geometry::sections(0, 1 << 40, 4, 0, false);
        g.journal_sections = 1_000_000;
        let bytes = g.section_sectors * 1_000_000 * 512;
        assert!(journal_fits_memory(&g, Some(2 * bytes)).is_ok());
        let e = journal_fits_memory(&g, Some(2 * bytes - 1)).unwrap_err();
        assert!(e.contains("journal doesn't fit into memory"), "{e}");
        g.journal_sections = u64::MAX;
        assert!(
            journal_fits_memory(&g, Some(u64::MAX)).is_err(),
            "no overflow"
        );
    }

    #[test]
    fn sections_as_the_kernel_sizes_them() {
        // crc32c, 512-byte sectors: 24-byte entries, 21 a sector.
        let g = Geometry::sections(0, 1 << 17, 4, 0, false);
        assert_eq!(
            (g.entry_size, g.entries_per_sector, g.section_entries),
            (24, 21, 168)
        );
        assert_eq!(g.section_sectors, 176);
        // sha256 with 4 KiB blocks and a journal MAC.
        let g = Geometry::sections(0, 1 << 17, 32, 3, true);
        assert_eq!((g.entry_size, g.entries_per_sector), (104, 4));
        assert_eq!(g.section_sectors, 32 * 8 + 8);
    }

    #[test]
    fn areas_interleave_tags_and_data() {
        let g = Geometry::of(&sb(4, 15, 5), 0, 131_072).unwrap();
        assert_eq!(g.initial_sectors, 8 + 5 * 176);
        // 32768 tags of 4 bytes = 128 KiB = 256 sectors, padded to 4 KiB.
        assert_eq!(g.metadata_run, 256);
        assert_eq!(g.data_sector(0), g.initial_sectors + 256);
        assert_eq!(g.tag_byte(0), g.initial_sectors * 512);
        assert_eq!(g.tag_byte(1), g.initial_sectors * 512 + 4);
        assert_eq!(g.data_sector(32768), g.initial_sectors + 32768 + 2 * 256);
        assert_eq!(g.tag_byte(32768), (g.initial_sectors + 32768 + 256) * 512);
        // Everything provided fits, one sector more would not.
        let p = g.provided_data_sectors;
        assert!(g.data_sector(p - 1) < 131_072);
        assert_eq!(p % 8, 0);
        assert!(p > 120_000, "{p}");
        assert!(Geometry::of(&sb(4, 15, 5), 0, 800).is_err());
    }

    #[test]
    fn a_separate_metadata_device_holds_one_tag_run() {
        let mut s = sb(4, 0, 2);
        s.flags = 0;
        // 32 MiB of data, 4 MiB of metadata: 2 sections of 176 sectors,
        // 65536 tags of 4 bytes = 512 sectors (four 64 KiB buffers).
        let g = Geometry::of_separate(&s, 0, 8192, 65536, 7).unwrap();
        assert!(g.is_separate());
        assert_eq!(g.initial_sectors, 8 + 2 * 176);
        assert_eq!(g.provided_data_sectors, 65536);
        // Data at its own sector, no offset, no areas.
        assert_eq!(g.data_sector(0), 0);
        assert_eq!(g.data_sector(40_000), 40_000);
        assert_eq!(g.area(40_000), g.area(0));
        assert_eq!(g.tag_byte(0), g.initial_sectors * 512);
        assert_eq!(g.tag_byte(40_000), g.initial_sectors * 512 + 160_000);
        // The offset moves the metadata only.
        let o = Geometry::of_separate(&s, 16, 8192, 65536, 7).unwrap();
        assert_eq!(o.data_sector(5), 5);
        assert_eq!(o.tag_byte(0), (16 + o.initial_sectors) * 512);
        assert_eq!(o.journal_sector(0, 0), 16 + 8);
        // Runs are cut only to bound buffers.
        assert_eq!(g.left_in_area(1), 32767);
        // 65544 tags need five 64 KiB buffers (640 sectors), or 65 of
        // 4 KiB (520): the kernel falls back to the smaller buffer.
        let g = Geometry::of_separate(&s, 0, 360 + 520, 65544, 7).unwrap();
        assert_eq!(g.log2_buffer, 3);
        assert_eq!(
            Geometry::of_separate(&s, 0, 2000, 65544, 7)
                .unwrap()
                .log2_buffer,
            7
        );
        // Too small a metadata device is refused by name.
        let e = Geometry::of_separate(&s, 0, 360 + 519, 65544, 7).unwrap_err();
        assert!(e.contains("metadata device"), "{e}");
        // An odd data size is cut to whole blocks.
        let mut b = s.clone();
        b.log2_sectors_per_block = 3;
        let g = Geometry::of_separate(&b, 0, 8192, 65541, 7).unwrap();
        assert_eq!(g.provided_data_sectors, 65536);
        // The superblocks of the two layouts are not mixed up.
        assert!(Geometry::of(&s, 0, 1 << 20)
            .unwrap_err()
            .contains("separate"));
        let e = Geometry::of_separate(&sb(4, 15, 2), 0, 8192, 65536, 7).unwrap_err();
        assert!(e.contains("meta_device"), "{e}");
        assert_eq!(journal_sectors_of(&s), 352);
        assert_eq!((log2_buffer_of(None), log2_buffer_of(Some(64))), (7, 6));
        assert_eq!(log2_buffer_of(Some(0)), 0);
    }
}
