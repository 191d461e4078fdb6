//! Where everything lives on a dm-integrity device, computed as the
//! kernel computes it (`calculate_journal_section_size`,
//! `calculate_device_limits`, `get_provided_data_sectors`): superblock,
//! journal sections, then areas of `metadata_run` sectors of tags
//! followed by `interleave_sectors` of data. A device formatted by udm
//! must map the same way in the kernel, so nothing here is udm's choice.

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
    /// The whole device, sectors.
    pub dev_sectors: u64,
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
            entry_size,
            entries_per_sector,
            section_entries,
            section_sectors: (section_entries << log2_spb) + JOURNAL_BLOCK_SECTORS,
            initial_sectors: 0,
            metadata_run: 0,
            provided_data_sectors: 0,
        }
    }

    /// The geometry a superblock describes on a device of `dev_sectors`.
    pub fn of(sb: &Superblock, start: u64, dev_sectors: u64) -> Result<Geometry, String> {
        let tag = u64::from(sb.tag_size);
        if tag as usize > MAX_TAG_SIZE {
            return Err(format!(
                "integrity: tag size {tag} is larger than {MAX_TAG_SIZE}"
            ));
        }
        if !(3..=31).contains(&sb.log2_interleave_sectors) {
            return Err(format!(
                "integrity: invalid interleave_sectors 2^{} in the superblock",
                sb.log2_interleave_sectors
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
        g.log2_interleave = u32::from(sb.log2_interleave_sectors);
        g.journal_sections = u64::from(sb.journal_sections);
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

    /// `calculate_device_limits`: sets `initial_sectors` and
    /// `metadata_run`; whether `provided_data_sectors` fits the device.
    pub fn limits(&mut self) -> bool {
        let initial = SB_SECTORS + self.section_sectors * self.journal_sections;
        if initial + METADATA_PADDING_SECTORS >= self.dev_sectors || initial > u64::from(u32::MAX) {
            return false;
        }
        self.initial_sectors = initial;
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

    /// `get_provided_data_sectors`: the most sectors (a multiple of 8)
    /// whose data and tags fit, found bit by bit from the top.
    pub fn max_provided(&mut self) -> u64 {
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

    /// The device sector holding logical sector `s`.
    pub fn data_sector(&self, s: u64) -> u64 {
        let area = s >> self.log2_interleave;
        let off = s & (self.interleave() - 1);
        self.start
            + self.initial_sectors
            + (area << self.log2_interleave)
            + (area + 1) * self.metadata_run
            + off
    }

    /// The device byte where the tag of the block at logical sector `s`
    /// starts.
    pub fn tag_byte(&self, s: u64) -> u64 {
        let area = s >> self.log2_interleave;
        let off = s & (self.interleave() - 1);
        let run = area * (self.interleave() + self.metadata_run);
        (self.start + self.initial_sectors + run) * 512 + (off >> self.log2_spb) * self.tag_size
    }

    /// Sectors from `s` to the end of its area (a run of data and of
    /// tags that is contiguous on the device).
    pub fn left_in_area(&self, s: u64) -> u64 {
        self.interleave() - (s & (self.interleave() - 1))
    }

    /// Device sector of journal section `i`, sector `j`.
    pub fn journal_sector(&self, i: u64, j: u64) -> u64 {
        self.start + SB_SECTORS + i * self.section_sectors + j
    }
}

/// The journal size the kernel picks when none is given.
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
}
