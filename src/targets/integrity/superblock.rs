//! dm-integrity's superblock: the first 512 bytes of the 8-sector
//! superblock area at the target's start. Its fields decide the layout of
//! everything after it (journal size, interleave, tag size), so udm reads
//! and writes it field for field as the kernel does, and a device moves
//! between udm and the kernel (or `integritysetup dump`) unchanged.

/// `"integrt"` and a zero byte.
pub const MAGIC: &[u8; 8] = b"integrt\0";
/// Sectors the superblock area takes before the journal.
pub const SB_SECTORS: u64 = 8;
/// Bytes of salt mixed into every tag and journal MAC with `FIXED_HMAC`.
pub const SALT_SIZE: usize = 16;
/// The newest version udm reads; 6 is the kernel's inline mode, which
/// needs a disk with its own metadata space.
pub const MAX_VERSION: u8 = 5;

/// The superblock's flag bits.
pub mod flags {
    pub const HAVE_JOURNAL_MAC: u32 = 0x1;
    pub const RECALCULATING: u32 = 0x2;
    pub const DIRTY_BITMAP: u32 = 0x4;
    pub const FIXED_PADDING: u32 = 0x8;
    pub const FIXED_HMAC: u32 = 0x10;
    pub const INLINE: u32 = 0x20;
}

/// Every field of the on-disk superblock (little-endian on disk).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Superblock {
    pub version: u8,
    pub log2_interleave_sectors: u8,
    pub tag_size: u16,
    pub journal_sections: u32,
    /// What the device offers, in 512-byte sectors; userspace sizes the
    /// mapping from it.
    pub provided_data_sectors: u64,
    pub flags: u32,
    pub log2_sectors_per_block: u8,
    pub log2_blocks_per_bitmap_bit: u8,
    pub recalc_sector: u64,
    pub salt: [u8; SALT_SIZE],
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

impl Superblock {
    /// Reads the first sector of the superblock area. `Ok(None)` when the
    /// area is all zeros (a device never formatted, which the kernel
    /// formats when a table first maps it).
    pub fn parse(b: &[u8]) -> Result<Option<Superblock>, String> {
        if b.len() < 512 {
            return Err("integrity superblock: fewer than 512 bytes".into());
        }
        if b[..8] != MAGIC[..] {
            if b.iter().all(|&x| x == 0) {
                return Ok(None);
            }
            return Err(
                "no dm-integrity superblock (magic \"integrt\" missing): format the device \
                 with `udm integritysetup format` first"
                    .into(),
            );
        }
        let mut salt = [0u8; SALT_SIZE];
        salt.copy_from_slice(&b[48..48 + SALT_SIZE]);
        let sb = Superblock {
            version: b[8],
            log2_interleave_sectors: b[9],
            tag_size: le16(b, 10),
            journal_sections: le32(b, 12),
            provided_data_sectors: le64(b, 16),
            flags: le32(b, 24),
            log2_sectors_per_block: b[28],
            log2_blocks_per_bitmap_bit: b[29],
            recalc_sector: le64(b, 32),
            salt,
        };
        if sb.version == 0 || sb.version > MAX_VERSION {
            return Err(format!(
                "integrity superblock version {} is not supported (udm reads 1 to {MAX_VERSION})",
                sb.version
            ));
        }
        if sb.flags & flags::INLINE != 0 {
            return Err("integrity superblock: inline mode (version 6) is not supported".into());
        }
        if sb.tag_size == 0 {
            return Err("integrity superblock: tag size 0".into());
        }
        if sb.log2_sectors_per_block > 3 {
            return Err(format!(
                "integrity superblock: sector size {} is not 512 to 4096",
                512u64 << sb.log2_sectors_per_block.min(20)
            ));
        }
        Ok(Some(sb))
    }

    /// The superblock area's first sector as the kernel writes it (the
    /// other seven sectors of the area are zeros).
    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[..8].copy_from_slice(MAGIC);
        b[8] = self.version;
        b[9] = self.log2_interleave_sectors;
        b[10..12].copy_from_slice(&self.tag_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.journal_sections.to_le_bytes());
        b[16..24].copy_from_slice(&self.provided_data_sectors.to_le_bytes());
        b[24..28].copy_from_slice(&self.flags.to_le_bytes());
        b[28] = self.log2_sectors_per_block;
        b[29] = self.log2_blocks_per_bitmap_bit;
        b[32..40].copy_from_slice(&self.recalc_sector.to_le_bytes());
        b[48..48 + SALT_SIZE].copy_from_slice(&self.salt);
        b
    }

    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// The kernel's `sb_set_version`: the lowest version that can say
    /// what the flags and the mode say.
    pub fn set_version(&mut self, bitmap_mode: bool) {
        self.set_version_for(bitmap_mode, false);
    }

    /// [`Superblock::set_version`] for a device whose tags may live on a
    /// separate metadata device (`separate`), which needs version 2.
    pub fn set_version_for(&mut self, bitmap_mode: bool, separate: bool) {
        self.version = if self.has(flags::INLINE) {
            6
        } else if self.has(flags::FIXED_HMAC) {
            5
        } else if self.has(flags::FIXED_PADDING) {
            4
        } else if bitmap_mode || self.has(flags::DIRTY_BITMAP) {
            3
        } else if separate || self.has(flags::RECALCULATING) {
            2
        } else {
            1
        };
    }

    /// Bytes per integrity sector (512 to 4096).
    pub fn sector_size(&self) -> u32 {
        512 << self.log2_sectors_per_block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_at_the_kernels_offsets() {
        let sb = Superblock {
            version: 5,
            log2_interleave_sectors: 15,
            tag_size: 4,
            journal_sections: 5,
            provided_data_sectors: 126_000,
            flags: flags::FIXED_PADDING | flags::FIXED_HMAC,
            log2_sectors_per_block: 3,
            log2_blocks_per_bitmap_bit: 12,
            recalc_sector: 7,
            salt: [0xab; SALT_SIZE],
        };
        let b = sb.encode();
        assert_eq!(&b[..8], b"integrt\0");
        assert_eq!(b[10], 4);
        assert_eq!(b[24], 0x18);
        assert_eq!(b[48], 0xab);
        assert_eq!(Superblock::parse(&b).unwrap(), Some(sb));
        assert_eq!(Superblock::parse(&[0u8; 512]).unwrap(), None);
        let mut bad = b;
        bad[0] = b'x';
        assert!(Superblock::parse(&bad).unwrap_err().contains("format"));
        let mut v9 = b;
        v9[8] = 9;
        assert!(Superblock::parse(&v9).unwrap_err().contains("version 9"));
    }

    #[test]
    fn version_follows_the_flags() {
        let mut sb = Superblock::default();
        sb.set_version(false);
        assert_eq!(sb.version, 1);
        sb.set_version_for(false, true);
        assert_eq!(sb.version, 2, "a separate metadata device");
        sb.set_version_for(true, true);
        assert_eq!(sb.version, 3);
        sb.set_version(true);
        assert_eq!(sb.version, 3);
        sb.flags = flags::FIXED_PADDING;
        sb.set_version(false);
        assert_eq!(sb.version, 4);
        sb.flags |= flags::FIXED_HMAC;
        sb.set_version(false);
        assert_eq!(sb.version, 5);
    }
}
