//! BitLocker volumes cryptsetup will not map, mapped on request
//! (`--allow-partial-bitlk`): one whose conversion never finished, and
//! an encrypt-on-write ("used disk space only") one.
//!
//! Windows reads such a volume through a map of what is encrypted. A
//! volume converted the old way is encrypted from its start up to the FVE
//! information's state offset and still in the clear after it. A
//! used-space-only volume keeps one bit per chunk instead (set: the chunk
//! is encrypted), in bitmaps found through an `FVE-EOW` block, each bitmap
//! holding two `FVE-EOWBR` records of which the one with the highest
//! sequence number is current. Every block carries a CRC-32.
//!
//! The volume is mapped from that map: crypt where it says encrypted,
//! linear where it says clear, zero over every area Windows keeps for
//! itself (the three metadata copies, the relocated boot sectors' home,
//! the chunk map blocks and their conversion logs). The first sectors read
//! from their relocated home, encrypted or not as the map says of that
//! place. The map is never guessed: a volume whose map is missing, damaged
//! or of a shape not described here is refused, naming what is wrong.
//! Writes would have to keep the map current (an encrypt-on-write volume
//! encrypts a clear chunk when it is written and sets its bit), which udm
//! does not do, so these volumes are mapped read-only.

use super::bitlk::{le16, le32, le64, Metadata, Seg, Segments, FVE_SIZE};
use super::crc32;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;

const EOW_MAGIC: &[u8; 8] = b"FVE-EOW\0";
const BITMAP_MAGIC: &[u8; 10] = b"FVE-EOWBM\0";
const RECORD_MAGIC: &[u8; 10] = b"FVE-EOWBR\0";
/// Header sizes of the three blocks, the only ones known.
const EOW_HEAD: usize = 56;
const BITMAP_HEAD: usize = 60;
const RECORD_HEAD: usize = 36;
/// Largest chunk map block read (a bitmap of 16 MiB covers 128 Mi chunks).
const MAX_BLOCK: u64 = 16 << 20;
/// Most table lines a volume may need; a map more fragmented is refused.
const MAX_SEGMENTS: usize = 1 << 16;

/// One bitmap: a bit per chunk of its region, set where it is encrypted.
struct Bitmap {
    region: u64,
    size: u64,
    bits: Vec<u8>,
    nbits: u64,
}

impl Bitmap {
    fn bit(&self, i: u64) -> bool {
        (self.bits[(i / 8) as usize] >> (i % 8)) & 1 == 1
    }
}

/// Where the volume is encrypted, in bytes of the disk.
enum EncMap {
    /// Encrypted below this offset, clear from it on.
    Below(u64),
    /// The chunk bitmaps of a used-space-only volume.
    Chunks { chunk: u64, bitmaps: Vec<Bitmap> },
}

impl EncMap {
    /// Whether the byte at `at` is encrypted, and where that may change.
    fn run_at(&self, at: u64) -> Result<(bool, u64), String> {
        let (chunk, bitmaps) = match self {
            EncMap::Below(end) if at < *end => return Ok((true, *end)),
            EncMap::Below(_) => return Ok((false, u64::MAX)),
            EncMap::Chunks { chunk, bitmaps } => (*chunk, bitmaps),
        };
        let bm = bitmaps
            .iter()
            .find(|b| b.region <= at && at - b.region < b.size)
            .ok_or_else(|| format!("byte {at} is in no region of the chunk map"))?;
        let first = (at - bm.region) / chunk;
        if first >= bm.nbits {
            return Err(format!("byte {at} is past the end of its chunk bitmap"));
        }
        let v = bm.bit(first);
        let mut next = first + 1;
        while next < bm.nbits && bm.bit(next) == v {
            next += 1;
        }
        Ok((v, (bm.region + next * chunk).min(bm.region + bm.size)))
    }
}

fn read(disk: &Disk, at: u64, len: u64, what: &str) -> Result<Vec<u8>, String> {
    if len > MAX_BLOCK {
        return Err(format!("{what} at byte {at} claims {len} bytes"));
    }
    let mut b = vec![0u8; len as usize];
    disk.read_at(at, &mut b)
        .map_err(|e| format!("{what} at byte {at} cannot be read: {e}"))?;
    Ok(b)
}

/// Whether `b`'s CRC-32, computed with its own field at `crc_at`
/// zeroed, is the one stored there.
fn crc_holds(b: &mut [u8], crc_at: usize) -> bool {
    let stored = le32(b, crc_at);
    b[crc_at..crc_at + 4].fill(0);
    crc32(b) == stored
}

/// An `FVE-EOW` block: chunk size, conversion log size, its own size and
/// the bitmaps' offsets.
fn eow_block(disk: &Disk, at: u64) -> Result<(u64, u64, u64, Vec<u64>), String> {
    let head = read(disk, at, EOW_HEAD as u64, "the FVE-EOW block")?;
    if &head[..8] != EOW_MAGIC {
        return Err(format!("no FVE-EOW block at byte {at}"));
    }
    let (hsize, size) = (usize::from(le16(&head, 8)), usize::from(le16(&head, 10)));
    if hsize != EOW_HEAD || size < hsize || (size - hsize) % 8 != 0 {
        return Err(format!(
            "the FVE-EOW block at byte {at} has a layout udm does not know \
             (header {hsize}, size {size})"
        ));
    }
    let mut b = read(disk, at, size as u64, "the FVE-EOW block")?;
    if !crc_holds(&mut b, 36) {
        return Err(format!("the FVE-EOW block at byte {at} fails its CRC-32"));
    }
    let bitmaps: Vec<u64> = (hsize..size).step_by(8).map(|o| le64(&b, o)).collect();
    if le32(&b, 32) as usize != bitmaps.len() || bitmaps.is_empty() {
        return Err(format!(
            "the FVE-EOW block at byte {at} counts {} regions but lists {} bitmaps",
            le32(&b, 32),
            bitmaps.len()
        ));
    }
    Ok((
        u64::from(le32(&b, 20)),
        u64::from(le32(&b, 24)),
        size as u64,
        bitmaps,
    ))
}

/// The current record of an `FVE-EOWBM` bitmap block (the valid one with
/// the highest sequence number), with the block's region, size and
/// conversion log offset.
fn bitmap_block(disk: &Disk, at: u64) -> Result<(Bitmap, u64, u64), String> {
    let head = read(disk, at, BITMAP_HEAD as u64, "the FVE-EOWBM block")?;
    let size = u64::from(le32(&head, 12));
    let rec = [le32(&head, 44) as usize, le32(&head, 48) as usize];
    let rec_size = le32(&head, 52) as usize;
    if &head[..10] != BITMAP_MAGIC || usize::from(le16(&head, 10)) != BITMAP_HEAD {
        return Err(format!("no valid FVE-EOWBM block at byte {at}"));
    }
    // Both records must hold at least their own header and fit in the
    // block: the sizes are on disk, under a CRC anyone can compute.
    if rec_size < RECORD_HEAD
        || rec
            .iter()
            .any(|&r| r < BITMAP_HEAD || r.saturating_add(rec_size) > size as usize)
    {
        return Err(format!(
            "the FVE-EOWBM block at byte {at} places its records out of its bounds \
             (records at {} and {}, {rec_size} bytes each, block {size} bytes)",
            rec[0], rec[1]
        ));
    }
    let mut b = read(disk, at, size, "the FVE-EOWBM block")?;
    if !crc_holds(&mut b[..rec[0]], 56) {
        return Err(format!("the FVE-EOWBM block at byte {at} fails its CRC-32"));
    }
    let mut best: Option<(u64, Bitmap)> = None;
    for r in rec {
        if let Some((seq, bm)) = record(&mut b[r..r + rec_size]) {
            if best.as_ref().is_none_or(|(s, _)| seq > *s) {
                best = Some((seq, bm));
            }
        }
    }
    let (_, mut bm) = best
        .ok_or_else(|| format!("neither FVE-EOWBR record of the bitmap at byte {at} is valid"))?;
    (bm.region, bm.size) = (le64(&b, 20), le64(&b, 28));
    Ok((bm, size, le64(&b, 36)))
}

/// One `FVE-EOWBR` record: its sequence number and bits, if it is whole.
fn record(r: &mut [u8]) -> Option<(u64, Bitmap)> {
    if r.len() < RECORD_HEAD {
        return None;
    }
    let size = le32(r, 12) as usize;
    if &r[..10] != RECORD_MAGIC
        || usize::from(le16(r, 10)) != RECORD_HEAD
        || !(RECORD_HEAD..=r.len()).contains(&size)
        || !crc_holds(&mut r[..size], 32)
    {
        return None;
    }
    let nbits = u64::from(le32(r, 16));
    let body = &r[RECORD_HEAD..size];
    if nbits > body.len() as u64 * 8 {
        return None;
    }
    // Only the bits it counts are kept: the record may be longer.
    let mut bits = Vec::new();
    bits.try_reserve_exact(nbits.div_ceil(8) as usize).ok()?;
    bits.extend_from_slice(&body[..nbits.div_ceil(8) as usize]);
    let bm = Bitmap {
        region: 0,
        size: 0,
        bits,
        nbits,
    };
    Some((le64(r, 20), bm))
}

/// The chunk map of a used-space-only volume, from the first valid
/// `FVE-EOW` copy, and the byte ranges its blocks take.
fn chunk_map(m: &Metadata, disk: &Disk, sectors: u64) -> Result<(EncMap, Vec<(u64, u64)>), String> {
    let mut why = Vec::new();
    for &at in &m.eow_offsets {
        match eow_block(disk, at) {
            Ok((chunk, log, size, offsets)) => {
                let unit = u64::from(m.sector_size);
                if chunk == 0 || chunk % unit != 0 {
                    return Err(format!(
                        "its chunk size {chunk} is not a whole number of sectors"
                    ));
                }
                let mut taken = vec![(at, size)];
                let bitmaps = bitmaps_of(disk, &offsets, chunk, unit, sectors, log, &mut taken)?;
                return Ok((EncMap::Chunks { chunk, bitmaps }, taken));
            }
            Err(e) => why.push(e),
        }
    }
    Err(format!(
        "neither copy of its chunk map is usable ({}), so which chunks are encrypted is \
         unknown (an image cut down to its headers keeps no chunk map)",
        why.join("; ")
    ))
}

/// The bitmaps at `offsets` of a volume of `sectors` sectors in chunks of
/// `chunk` bytes; the byte ranges their blocks and conversion logs (`log`
/// bytes each) take go to `taken`. Together they may count no more bits
/// than the volume has chunks (plus a partial chunk per region), checked
/// as each is read: each block may be 16 MiB, and an `FVE-EOW` block may
/// list thousands of offsets, the same one again and again.
fn bitmaps_of(
    disk: &Disk,
    offsets: &[u64],
    chunk: u64,
    unit: u64,
    sectors: u64,
    log: u64,
    taken: &mut Vec<(u64, u64)>,
) -> Result<Vec<Bitmap>, String> {
    let chunks = sectors.saturating_mul(512).div_ceil(chunk);
    let most = chunks.saturating_add(offsets.len() as u64);
    let mut bitmaps: Vec<Bitmap> = Vec::new();
    let mut bits = 0u64;
    for (k, &o) in offsets.iter().enumerate() {
        if offsets[..k].contains(&o) {
            return Err(format!("its chunk map lists the bitmap at byte {o} twice"));
        }
        let (bm, bm_size, log_at) = bitmap_block(disk, o)?;
        if bm.region % unit != 0 {
            return Err(format!(
                "a chunk bitmap's region starts mid-sector ({})",
                bm.region
            ));
        }
        bits = bits.saturating_add(bm.nbits);
        if bits > most {
            return Err(format!(
                "its chunk bitmaps count {bits} chunks or more, but the volume has {chunks} \
                 chunks of {chunk} bytes: the chunk map is corrupt"
            ));
        }
        taken.extend([(o, bm_size), (log_at, log)]);
        bitmaps.push(bm);
    }
    Ok(bitmaps)
}

/// What is encrypted and what Windows keeps for itself, or why udm
/// cannot tell.
fn enc_map(m: &Metadata, disk: &Disk, sectors: u64) -> Result<(EncMap, Vec<(u64, u64)>), String> {
    match (m.kind, m.state) {
        (1, _) => chunk_map(m, disk, sectors),
        // Switching (dirty or not), paused, or encrypted: the old way's
        // conversion runs from the start up to the state offset.
        (0, [2..=5, _]) => {
            let mut taken = Vec::new();
            if m.state[0] == 2 && m.state_size > 0 {
                taken.push((m.volume_size, u64::from(m.state_size)));
            }
            Ok((EncMap::Below(m.volume_size), taken))
        }
        (0, [c, n]) => Err(format!(
            "its conversion state ({c}, next {n}) is not one udm knows how to map"
        )),
        _ => Err("its type is unknown, so its layout is too".into()),
    }
}

/// The volume's segments over a disk of `sectors` sectors, from its map
/// of what is encrypted; the error says why it cannot be mapped.
pub fn layout(m: &Metadata, disk: &Disk, sectors: u64) -> Result<Segments, LuksError> {
    let refuse = |why: String| {
        LuksError::Unsupported(format!(
            "BITLK device {} cannot be mapped even partly: {why}.",
            disk.path().display()
        ))
    };
    let (map, mut taken) = enc_map(m, disk, sectors).map_err(refuse)?;
    taken.extend(m.metadata_offset.iter().map(|&o| (o, FVE_SIZE)));
    taken.push((m.volume_header_offset, m.volume_header_size));
    let zeros = sector_ranges(&taken, sectors);
    let hs = m.volume_header_size / 512;
    if zeros.first().is_some_and(|z| z.0 < hs) {
        return Err(refuse(
            "a reserved area overlaps its relocated boot sectors".into(),
        ));
    }
    let mut out = Vec::new();
    runs(&map, 0, hs, m.volume_header_offset / 512, &mut out).map_err(refuse)?;
    let mut pos = hs;
    for (z, end) in zeros {
        if z > pos {
            runs(&map, pos, z - pos, pos, &mut out).map_err(refuse)?;
        }
        out.push((z.max(pos), end - z.max(pos), Seg::Zero));
        pos = pos.max(end);
    }
    if pos < sectors {
        runs(&map, pos, sectors - pos, pos, &mut out).map_err(refuse)?;
    }
    let unit = u64::from(m.sector_size / 512);
    if out.iter().any(|s| s.0 % unit != 0 || s.1 % unit != 0) {
        return Err(refuse(format!(
            "its map cuts {}-byte sectors",
            m.sector_size
        )));
    }
    Ok(out)
}

/// Byte ranges as sorted, merged 512-byte sector ranges `(start, end)`
/// inside the disk (a range is widened to whole sectors).
fn sector_ranges(bytes: &[(u64, u64)], sectors: u64) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = bytes
        .iter()
        .filter(|(_, len)| *len > 0)
        .map(|&(o, len)| (o / 512, o.saturating_add(len).div_ceil(512).min(sectors)))
        .filter(|(s, e)| s < e)
        .collect();
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

/// Segments for `len` sectors at `start` whose data is at disk sector
/// `data`, cut where the map changes between encrypted and clear.
fn runs(
    map: &EncMap,
    mut start: u64,
    mut len: u64,
    mut data: u64,
    out: &mut Segments,
) -> Result<(), String> {
    while len > 0 {
        let (enc, end) = map.run_at(data * 512)?;
        let n = (end / 512).saturating_sub(data).clamp(1, len);
        out.push((
            start,
            n,
            if enc {
                Seg::Crypt(data)
            } else {
                Seg::Clear(data)
            },
        ));
        if out.len() > MAX_SEGMENTS {
            return Err(format!(
                "its map is cut into more than {MAX_SEGMENTS} pieces"
            ));
        }
        (start, len, data) = (start + n, len - n, data + n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(bits: &[u8], nbits: u64) -> EncMap {
        EncMap::Chunks {
            chunk: 4096,
            bitmaps: vec![Bitmap {
                region: 0,
                size: nbits * 4096,
                bits: bits.to_vec(),
                nbits,
            }],
        }
    }

    #[test]
    fn old_style_conversion_is_encrypted_below_the_state_offset() {
        let mut out = Vec::new();
        runs(&EncMap::Below(10 * 512), 0, 16, 0, &mut out).unwrap();
        assert_eq!(out, vec![(0, 10, Seg::Crypt(0)), (10, 6, Seg::Clear(10))]);
    }

    #[test]
    fn chunk_bits_give_crypt_and_clear_runs() {
        // Chunks 0-1 encrypted, 2 clear, 3 encrypted; 8 sectors each.
        let map = chunks(&[0b1011], 4);
        let mut out = Vec::new();
        runs(&map, 4, 28, 4, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                (4, 12, Seg::Crypt(4)),
                (16, 8, Seg::Clear(16)),
                (24, 8, Seg::Crypt(24))
            ]
        );
        // Past the bitmap's last chunk: refused, not guessed.
        assert!(runs(&map, 32, 8, 32, &mut out).is_err());
    }

    #[test]
    fn reserved_ranges_merge_and_stay_inside_the_disk() {
        let r = sector_ranges(
            &[(4096, 1024), (4608, 4096), (0, 0), (100 * 512, 4096)],
            100,
        );
        assert_eq!(r, vec![(8, 17)]);
    }

    /// A bitmap block whose records are shorter than a record header
    /// (its CRC made to match) is refused with an error, not a panic on
    /// the record's magic.
    #[test]
    fn a_bitmap_with_records_shorter_than_their_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("eowbm");
        for rec_size in [0u32, 4, 9, 12, (RECORD_HEAD - 1) as u32] {
            let mut b = vec![0u8; 4096];
            b[..10].copy_from_slice(BITMAP_MAGIC);
            b[10..12].copy_from_slice(&(BITMAP_HEAD as u16).to_le_bytes());
            b[12..16].copy_from_slice(&4096u32.to_le_bytes());
            b[44..48].copy_from_slice(&(BITMAP_HEAD as u32).to_le_bytes());
            b[48..52].copy_from_slice(&200u32.to_le_bytes());
            b[52..56].copy_from_slice(&rec_size.to_le_bytes());
            let crc = crc32(&b[..BITMAP_HEAD]);
            b[56..60].copy_from_slice(&crc.to_le_bytes());
            std::fs::write(&p, &b).unwrap();
            let disk = Disk::open(&p, false).unwrap();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                bitmap_block(&disk, 0).map(|_| ())
            }));
            let e = r
                .unwrap_or_else(|_| panic!("rec_size {rec_size} panicked"))
                .unwrap_err();
            assert!(
                e.contains("out of its bounds") && e.contains("FVE-EOWBM"),
                "{e}"
            );
        }
        // A short slice handed to `record` directly is no record either.
        assert!(record(&mut [0u8; 9]).is_none());
    }

    #[test]
    fn a_record_needs_its_magic_and_crc() {
        let mut r = vec![0u8; RECORD_HEAD + 2];
        r[..10].copy_from_slice(RECORD_MAGIC);
        r[10..12].copy_from_slice(&(RECORD_HEAD as u16).to_le_bytes());
        let len = r.len() as u32;
        r[12..16].copy_from_slice(&len.to_le_bytes());
        r[16..20].copy_from_slice(&16u32.to_le_bytes());
        r[20..28].copy_from_slice(&7u64.to_le_bytes());
        r[RECORD_HEAD] = 0x5a;
        let crc = crc32(&r);
        r[32..36].copy_from_slice(&crc.to_le_bytes());
        let (seq, bm) = record(&mut r.clone()).unwrap();
        assert_eq!((seq, bm.nbits, bm.bits[0]), (7, 16, 0x5a));
        r[RECORD_HEAD + 1] ^= 1;
        assert!(record(&mut r).is_none());
    }
}
