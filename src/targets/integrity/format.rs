//! Formatting: the superblock and empty journal the kernel writes when a
//! table first maps an all-zero device (`initialize_superblock`, then
//! `init_journal` in the constructor), and the wipe `integritysetup
//! format` does afterwards so that every sector reads back (zeros under
//! matching tags). `udm integritysetup format` and the target's
//! constructor both call [`format`], so a device is laid out one way.

use super::journal::{fill_section, set_section_mac};
use super::layout::{
    default_journal_sectors, log2_blocks_per_bitmap_bit, log2_buffer_of, Geometry,
};
use super::superblock::{flags, Superblock, SALT_SIZE, SB_SECTORS};
use super::tags::Alg;
use crate::core::{BlockDevice, DevResult, WriteBuf};

/// The journal MAC of section N over the bytes given (`journal_mac`).
pub type SectionMac<'a> = &'a dyn Fn(u64, &[u8]) -> Vec<u8>;
/// The superblock MAC over the bytes given (`journal_mac` with `FIXED_HMAC`).
pub type SbMac<'a> = &'a dyn Fn(&[u8]) -> Vec<u8>;

/// What a format decides; the rest comes from the device's size.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// Target offset on the device, sectors.
    pub start: u64,
    pub tag_size: u32,
    /// Bytes per integrity sector (512 to 4096).
    pub sector_size: u32,
    pub journal_sectors: Option<u64>,
    pub interleave_sectors: Option<u32>,
    pub journal_mac: bool,
    pub fix_padding: bool,
    /// Sets `FIXED_HMAC` (and a random salt) when an internal hash or
    /// journal MAC is given, as the kernel does.
    pub fix_hmac: bool,
    pub has_hash: bool,
    pub bitmap_mode: bool,
    pub sectors_per_bit: Option<u64>,
    /// The table's `buffer_sectors`, which with a separate metadata device
    /// rounds the tag run up (the kernel's default 128 when `None`).
    pub buffer_sectors: Option<u32>,
}

/// What both layouts' superblocks start from: tag size, block size,
/// journal MAC and salt flags, and the journal's section geometry on a
/// device (the metadata device) of `dev_sectors`.
fn start_superblock(
    spec: &Spec,
    dev_sectors: u64,
    salt: [u8; SALT_SIZE],
) -> Result<(Superblock, Geometry), String> {
    let log2_spb = spec.sector_size.trailing_zeros().saturating_sub(9);
    if !(512..=4096).contains(&spec.sector_size) || !spec.sector_size.is_power_of_two() {
        return Err(format!(
            "sector size {} is not 512, 1024, 2048 or 4096",
            spec.sector_size
        ));
    }
    let mut sb = Superblock {
        tag_size: u16::try_from(spec.tag_size).map_err(|_| "tag size too large".to_string())?,
        log2_sectors_per_block: log2_spb as u8,
        ..Superblock::default()
    };
    if spec.journal_mac {
        sb.flags |= flags::HAVE_JOURNAL_MAC;
    }
    let g = Geometry::sections(
        spec.start,
        dev_sectors,
        u64::from(spec.tag_size),
        log2_spb,
        spec.journal_mac,
    );
    if g.section_entries == 0 {
        return Err(format!(
            "tag size {} leaves no room for journal entries",
            spec.tag_size
        ));
    }
    if spec.fix_hmac && (spec.has_hash || spec.journal_mac) {
        sb.flags |= flags::FIXED_HMAC;
        sb.salt = salt;
    }
    Ok((sb, g))
}

/// The superblock the kernel's `initialize_superblock` writes for `spec`
/// on a device of `dev_sectors`, with its geometry.
pub fn superblock(
    spec: &Spec,
    dev_sectors: u64,
    salt: [u8; SALT_SIZE],
) -> Result<(Superblock, Geometry), String> {
    let (mut sb, mut g) = start_superblock(spec, dev_sectors, salt)?;
    let journal = spec
        .journal_sectors
        .unwrap_or_else(|| default_journal_sectors(dev_sectors));
    let sections = (journal / g.section_sectors).max(1);
    if spec.fix_padding {
        sb.flags |= flags::FIXED_PADDING;
    }
    sb.journal_sections = u32::try_from(sections).map_err(|_| "journal too large".to_string())?;
    let il = spec
        .interleave_sectors
        .filter(|&i| i != 0)
        .unwrap_or(super::layout::DEFAULT_INTERLEAVE_SECTORS);
    sb.log2_interleave_sectors = (31 - il.leading_zeros()).clamp(3, 31) as u8;
    g.log2_interleave = u32::from(sb.log2_interleave_sectors);
    g.journal_sections = sections;
    g.fixed_padding = spec.fix_padding;
    g.provided_data_sectors = g.max_provided();
    if g.provided_data_sectors == 0 {
        return Err(format!(
            "the device ({dev_sectors} sectors) is too small for a {sections}-section journal and tags"
        ));
    }
    sb.provided_data_sectors = g.provided_data_sectors;
    sb.log2_blocks_per_bitmap_bit = log2_blocks_per_bitmap_bit(&g, spec.sectors_per_bit);
    sb.set_version(spec.bitmap_mode);
    Ok((sb, g))
}

/// The superblock the kernel writes on a separate metadata device of
/// `meta_sectors` for a data device of `data_sectors`
/// (`initialize_superblock` with `meta_dev`): nothing interleaved, no
/// `fix_padding` flag, the whole data device provided, and the most
/// journal sections up to the size asked for (chosen bit by bit, with a
/// smaller dm-bufio buffer when even one does not fit) that leave room
/// for the tags.
pub fn superblock_separate(
    spec: &Spec,
    meta_sectors: u64,
    data_sectors: u64,
    salt: [u8; SALT_SIZE],
) -> Result<(Superblock, Geometry), String> {
    let (mut sb, mut g) = start_superblock(spec, meta_sectors, salt)?;
    let journal = spec
        .journal_sectors
        .unwrap_or_else(|| default_journal_sectors(data_sectors));
    let wanted = (journal / g.section_sectors).clamp(1, u64::from(u32::MAX));
    g.data_sectors = Some(data_sectors);
    g.log2_buffer = log2_buffer_of(spec.buffer_sectors);
    g.provided_data_sectors = g.max_provided();
    if g.provided_data_sectors == 0 {
        return Err(format!(
            "the data device ({data_sectors} sectors) is smaller than one block"
        ));
    }
    g.journal_sections = most_sections(&mut g, wanted).ok_or_else(|| {
        format!(
            "the metadata device ({meta_sectors} sectors) is too small for a journal and the \
             tags of {} data sectors",
            g.provided_data_sectors
        )
    })?;
    g.limits();
    sb.journal_sections = g.journal_sections as u32;
    sb.provided_data_sectors = g.provided_data_sectors;
    sb.log2_blocks_per_bitmap_bit = log2_blocks_per_bitmap_bit(&g, spec.sectors_per_bit);
    sb.set_version_for(spec.bitmap_mode, true);
    Ok((sb, g))
}

/// The kernel's search for journal sections on a separate metadata
/// device: bit by bit from the top, the most sections up to `wanted`
/// that fit; with none, again with half the buffer, down to 8 sectors.
fn most_sections(g: &mut Geometry, wanted: u64) -> Option<u64> {
    loop {
        let mut sections = 0u64;
        for bit in (0..=63 - wanted.leading_zeros()).rev() {
            let test = sections | 1 << bit;
            if test > wanted {
                continue;
            }
            g.journal_sections = test;
            if g.limits() {
                sections = test;
            }
        }
        if sections > 0 {
            return Some(sections);
        }
        if g.log2_buffer <= 3 {
            return None;
        }
        g.log2_buffer -= 1;
    }
}

/// Writes an empty journal (every section with sequence number `seq`)
/// at its place; `mac` is the journal MAC, if the superblock has one.
pub fn write_empty_journal(
    dev: &dyn BlockDevice,
    g: &Geometry,
    seq: u8,
    mac: Option<SectionMac<'_>>,
) -> DevResult<()> {
    let mut buf = vec![0u8; (g.section_sectors * 512) as usize];
    for i in 0..g.journal_sections {
        fill_section(g, &mut buf, i, seq, &[]);
        if let Some(m) = mac {
            set_section_mac(g, &mut buf, &|s| m(i, s));
        }
        dev.write(
            g.journal_sector(i, 0) * 512,
            WriteBuf::Borrowed(&buf),
            false,
        )?;
    }
    Ok(())
}

/// Writes `sb` and an empty journal: the kernel's first activation of a
/// zeroed device. Durable on return.
pub fn format(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    g: &Geometry,
    mac: Option<SectionMac<'_>>,
    sb_mac: Option<SbMac<'_>>,
) -> DevResult<()> {
    write_empty_journal(dev, g, 0, mac)?;
    write_superblock(dev, sb, g.start, sb_mac)?;
    dev.flush()
}

/// The superblock area (8 sectors) at `start`; with `FIXED_HMAC` and a
/// journal MAC, the MAC of the sector before it fills its tail.
pub fn write_superblock(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    start: u64,
    sb_mac: Option<SbMac<'_>>,
) -> DevResult<()> {
    let mut area = vec![0u8; (SB_SECTORS * 512) as usize];
    area[..512].copy_from_slice(&sb.encode());
    if let Some(m) = sb_mac.filter(|_| sb.has(flags::FIXED_HMAC)) {
        let probe = m(&[]);
        let at = 512 - probe.len();
        let mac = m(&area[..at]);
        area[at..512].copy_from_slice(&mac);
    }
    dev.write(start * 512, WriteBuf::Borrowed(&area), false)
}

/// `integritysetup format`'s wipe: every provided sector zeroed under its
/// tag (zeros for a device without an internal hash), so reads succeed.
pub fn wipe(
    dev: &dyn BlockDevice,
    g: &Geometry,
    alg: Option<&Alg>,
    salt: Option<&[u8]>,
) -> DevResult<()> {
    wipe_to(dev, dev, g, alg, salt)
}

/// [`wipe`] with the data on `data` and the tags on `meta` (the same
/// device unless the layout has a separate metadata device).
pub fn wipe_to(
    data: &dyn BlockDevice,
    meta: &dyn BlockDevice,
    g: &Geometry,
    alg: Option<&Alg>,
    salt: Option<&[u8]>,
) -> DevResult<()> {
    let bb = g.block_bytes();
    let zeros = vec![0u8; bb];
    let mut s = 0;
    while s < g.provided_data_sectors {
        let n = g.left_in_area(s).min(g.provided_data_sectors - s);
        data.write_zeroes(g.data_sector(s) * 512, n * 512, false)?;
        let blocks = n >> g.log2_spb;
        let mut tags = vec![0u8; (blocks * g.tag_size) as usize];
        if let Some(a) = alg {
            for (k, t) in tags.chunks_mut(g.tag_size as usize).enumerate() {
                a.tag(salt, s + ((k as u64) << g.log2_spb), &zeros, t);
            }
        }
        super::io::write_bytes(meta, g.tag_byte(s), &tags)?;
        s += n;
    }
    super::io::flush_both(data, meta, g)
}
