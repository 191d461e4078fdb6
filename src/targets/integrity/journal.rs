//! The journal, in the kernel's on-disk format: sections of 8 sectors of
//! entries (logical sector, the last 8 bytes of each data sector, the
//! tag) followed by the entries' data sectors. Every journal sector ends
//! with a commit ID that encodes the section, the sector and one of four
//! sequence numbers, so a section written only in part (a crash in the
//! middle) is recognised and not replayed, and the ring's oldest section
//! is found by where the sequence number changes. The last 8 bytes of
//! every data sector are kept in the entry because the commit ID takes
//! their place.

use super::layout::{Geometry, JOURNAL_BLOCK_SECTORS, JOURNAL_MAC_PER_SECTOR, JOURNAL_SECTOR_DATA};

/// Sequence numbers a commit ID can carry.
pub const N_COMMIT_IDS: u8 = 4;

/// `sector_hi` of an entry no write uses.
const UNUSED_HI: u32 = u32::MAX;

pub fn next_seq(s: u8) -> u8 {
    (s + 1) % N_COMMIT_IDS
}

pub fn prev_seq(s: u8) -> u8 {
    (s + N_COMMIT_IDS - 1) % N_COMMIT_IDS
}

/// The base of each sequence number's commit IDs.
pub type Ids = [u64; N_COMMIT_IDS as usize];

/// The kernel's four bases, 0x1111… to 0x4444…, as a journal without
/// `journal_crypt` (or with a block cipher) uses them; a stream cipher
/// encrypts them ([`super::seal`]).
pub const KERNEL_IDS: Ids = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x3333_3333_3333_3333,
    0x4444_4444_4444_4444,
];

/// The commit ID of sector `j` of section `i` written with sequence
/// number `seq`.
pub fn commit_id(i: u64, j: u64, seq: u8) -> u64 {
    commit_id_in(&KERNEL_IDS, i, j, seq)
}

pub fn commit_id_in(ids: &Ids, i: u64, j: u64, seq: u8) -> u64 {
    ids[seq as usize % ids.len()] ^ ((i << 32) ^ j)
}

fn stored_id(buf: &[u8], j: u64) -> u64 {
    let at = j as usize * 512 + JOURNAL_SECTOR_DATA;
    u64::from_le_bytes(buf[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// Byte offset of entry `n` inside its section.
fn entry_at(g: &Geometry, n: u64) -> usize {
    let rel = n % JOURNAL_BLOCK_SECTORS;
    let row = n / JOURNAL_BLOCK_SECTORS;
    (rel * 512 + row * g.entry_size) as usize
}

/// Byte offset of entry `n`'s first data sector inside its section.
fn data_at(g: &Geometry, n: u64) -> usize {
    (((n << g.log2_spb) + JOURNAL_BLOCK_SECTORS) * 512) as usize
}

/// One block of a section: where it goes, its data and its tag.
pub struct Block<'a> {
    pub sector: u64,
    pub data: &'a [u8],
    pub tag: &'a [u8],
}

/// Section `i` written with `seq`, holding `blocks` (at most
/// `section_entries`), the other entries unused; `buf` is the section
/// (`section_sectors` × 512 bytes) and is overwritten.
pub fn fill_section(g: &Geometry, buf: &mut [u8], i: u64, seq: u8, blocks: &[Block<'_>]) {
    fill_section_in(g, &KERNEL_IDS, buf, i, seq, blocks)
}

/// [`fill_section`] with the commit ID bases `ids`.
pub fn fill_section_in(
    g: &Geometry,
    ids: &Ids,
    buf: &mut [u8],
    i: u64,
    seq: u8,
    blocks: &[Block<'_>],
) {
    buf.fill(0);
    open_section(g, ids, buf, i, seq);
    for (n, b) in blocks.iter().enumerate() {
        put_block(g, ids, buf, (i, seq), n as u64, b);
    }
}

/// Starts section `i` in `buf` empty for sequence number `seq`: every
/// entry unused, every sector's commit ID in place. Only the entry
/// sectors are cleared: the data sectors of a section reused from an
/// earlier lap keep their old bytes until [`put_block`] overwrites them
/// or [`close_section`] clears those no entry used, so opening costs
/// 4 KiB of writes, not the section's size, per section of writes.
pub fn open_section(g: &Geometry, ids: &Ids, buf: &mut [u8], i: u64, seq: u8) {
    buf[..JOURNAL_BLOCK_SECTORS as usize * 512].fill(0);
    for n in 0..g.section_entries {
        let e = entry_at(g, n);
        buf[e + 4..e + 8].copy_from_slice(&UNUSED_HI.to_le_bytes());
    }
    for j in 0..g.section_sectors {
        let at = j as usize * 512 + JOURNAL_SECTOR_DATA;
        buf[at..at + 8].copy_from_slice(&commit_id_in(ids, i, j, seq).to_le_bytes());
    }
}

/// Clears the data sectors of entries `used..` of section `buf` (opened
/// by [`open_section`] with `i`, `seq`), commit IDs kept, so a section
/// committed part full is what [`fill_section`] makes of its blocks.
pub fn close_section(g: &Geometry, ids: &Ids, buf: &mut [u8], (i, seq): (u64, u8), used: u64) {
    if used >= g.section_entries {
        return;
    }
    let from = data_at(g, used);
    buf[from..].fill(0);
    for j in (from / 512) as u64..g.section_sectors {
        let at = j as usize * 512 + JOURNAL_SECTOR_DATA;
        buf[at..at + 8].copy_from_slice(&commit_id_in(ids, i, j, seq).to_le_bytes());
    }
}

/// Writes `b` as entry `n` of section `buf` (section `i`, sequence
/// number `seq`): its data in the entry's data sectors, the last 8 bytes
/// of each moved to the entry to make room for that sector's commit ID.
pub fn put_block(
    g: &Geometry,
    ids: &Ids,
    buf: &mut [u8],
    (i, seq): (u64, u8),
    n: u64,
    b: &Block<'_>,
) {
    let e = entry_at(g, n);
    let d = data_at(g, n);
    buf[d..d + b.data.len()].copy_from_slice(b.data);
    for k in 0..g.sectors_per_block() as usize {
        let last = d + k * 512 + JOURNAL_SECTOR_DATA;
        buf.copy_within(last..last + 8, e + 8 + 8 * k);
        let j = (d / 512 + k) as u64;
        buf[last..last + 8].copy_from_slice(&commit_id_in(ids, i, j, seq).to_le_bytes());
    }
    let t = e + 8 + 8 * g.sectors_per_block() as usize;
    buf[t..t + b.tag.len()].copy_from_slice(b.tag);
    buf[e..e + 8].copy_from_slice(&b.sector.to_le_bytes());
}

/// The logical sector of used entry `n` of section `buf`.
pub fn sector_of(g: &Geometry, buf: &[u8], n: u64) -> u64 {
    let e = entry_at(g, n);
    u64::from_le_bytes(buf[e..e + 8].try_into().unwrap_or([0; 8]))
}

/// The tag of entry `n` of section `buf`.
pub fn tag_of<'a>(g: &Geometry, buf: &'a [u8], n: u64) -> &'a [u8] {
    let t = entry_at(g, n) + 8 + 8 * g.sectors_per_block() as usize;
    &buf[t..t + g.tag_size as usize]
}

/// Where entry `n`'s data sits in its section (whole once
/// [`restore_block`] has put its last bytes back).
pub fn data_range(g: &Geometry, n: u64) -> std::ops::Range<usize> {
    let d = data_at(g, n);
    d..d + g.block_bytes()
}

/// Puts the last 8 bytes of each data sector of entry `n` back in place
/// of the commit IDs, so the entry's data can be written from the section
/// itself; the section is no longer the one on disk after this.
pub fn restore_block(g: &Geometry, buf: &mut [u8], n: u64) {
    let e = entry_at(g, n);
    let d = data_at(g, n);
    for k in 0..g.sectors_per_block() as usize {
        let last = d + k * 512 + JOURNAL_SECTOR_DATA;
        buf.copy_within(e + 8 + 8 * k..e + 16 + 8 * k, last);
    }
}

/// Entry `n`'s data into `data` (its last bytes restored) and its tag
/// into `tag`.
pub fn read_block(g: &Geometry, buf: &[u8], n: u64, data: &mut [u8], tag: &mut [u8]) {
    let e = entry_at(g, n);
    data.copy_from_slice(&buf[data_range(g, n)]);
    for k in 0..g.sectors_per_block() as usize {
        let last = k * 512 + JOURNAL_SECTOR_DATA;
        data[last..last + 8].copy_from_slice(&buf[e + 8 + 8 * k..e + 16 + 8 * k]);
    }
    tag.copy_from_slice(tag_of(g, buf, n));
}

/// Writes the section MAC of `journal_mac` into the 8 MAC bytes of each
/// entry sector: `mac` gets the entries' sector fields in order (after
/// the salt and section number, which the caller adds when the
/// superblock has `FIXED_HMAC`) and returns the digest.
pub fn set_section_mac(g: &Geometry, buf: &mut [u8], mac: &dyn Fn(&[u8]) -> Vec<u8>) {
    let mac_bytes = section_mac(g, buf, mac);
    for j in 0..JOURNAL_BLOCK_SECTORS as usize {
        let at = j * 512 + JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR;
        buf[at..at + JOURNAL_MAC_PER_SECTOR].copy_from_slice(
            &mac_bytes[j * JOURNAL_MAC_PER_SECTOR..(j + 1) * JOURNAL_MAC_PER_SECTOR],
        );
    }
}

/// The sector fields of every entry of section `buf`, in order: what
/// the section MAC covers after the salt and section number.
pub fn entry_sectors(g: &Geometry, buf: &[u8]) -> Vec<u8> {
    let mut sectors = Vec::with_capacity(g.section_entries as usize * 8);
    for n in 0..g.section_entries {
        let e = entry_at(g, n);
        sectors.extend_from_slice(&buf[e..e + 8]);
    }
    sectors
}

fn section_mac(g: &Geometry, buf: &[u8], mac: &dyn Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let mut m = mac(&entry_sectors(g, buf));
    m.resize(JOURNAL_MAC_PER_SECTOR * JOURNAL_BLOCK_SECTORS as usize, 0);
    m
}

/// Whether the MAC bytes of section `buf` match.
pub fn section_mac_ok(g: &Geometry, buf: &[u8], mac: &dyn Fn(&[u8]) -> Vec<u8>) -> bool {
    let m = section_mac(g, buf, mac);
    (0..JOURNAL_BLOCK_SECTORS as usize).all(|j| {
        let at = j * 512 + JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR;
        buf[at..at + JOURNAL_MAC_PER_SECTOR]
            == m[j * JOURNAL_MAC_PER_SECTOR..(j + 1) * JOURNAL_MAC_PER_SECTOR]
    })
}

/// A journal entry to write to its place at replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub sector: u64,
    pub data: Vec<u8>,
    pub tag: Vec<u8>,
}

/// The used entries of section `buf`, their data restored.
pub fn entries(g: &Geometry, buf: &[u8]) -> Vec<Entry> {
    let spb = g.sectors_per_block() as usize;
    let mut out = Vec::new();
    for n in 0..g.section_entries {
        let e = entry_at(g, n);
        let hi = u32::from_le_bytes(buf[e + 4..e + 8].try_into().unwrap_or([0; 4]));
        if hi == UNUSED_HI || hi == UNUSED_HI - 1 {
            continue;
        }
        let sector = u64::from_le_bytes(buf[e..e + 8].try_into().unwrap_or([0; 8]));
        let d = data_at(g, n);
        let mut data = buf[d..d + spb * 512].to_vec();
        for k in 0..spb {
            let last = k * 512 + JOURNAL_SECTOR_DATA;
            data[last..last + 8].copy_from_slice(&buf[e + 8 + 8 * k..e + 16 + 8 * k]);
        }
        let t = e + 8 + 8 * spb;
        let tag = buf[t..t + g.tag_size as usize].to_vec();
        out.push(Entry { sector, data, tag });
    }
    out
}

/// What the journal on disk says at open (the kernel's `replay_journal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Sections to replay, oldest first (section numbers).
    pub replay: Vec<u64>,
    /// Where the next commit goes, and with which sequence number.
    pub next_section: u64,
    pub seq: u8,
    /// `Some(seq)`: the journal is inconsistent or mixed; after replay it
    /// is rewritten empty with this sequence number.
    pub clear_with: Option<u8>,
}

/// Reads the commit IDs of the whole journal (`journal`: every section
/// back to back) and decides what to replay and where to go on.
pub fn plan(g: &Geometry, journal: &[u8], journal_mode: bool) -> Plan {
    plan_in(g, &KERNEL_IDS, journal, journal_mode)
}

/// [`plan`] with the commit ID bases `ids`.
pub fn plan_in(g: &Geometry, ids: &Ids, journal: &[u8], journal_mode: bool) -> Plan {
    let ss = (g.section_sectors * 512) as usize;
    let got: Result<Plan, std::convert::Infallible> = plan_by_section(g, ids, journal_mode, |i| {
        Ok(&journal[i as usize * ss..(i as usize + 1) * ss])
    });
    match got {
        Ok(p) => p,
        Err(e) => match e {},
    }
}

/// [`plan_in`] reading one section at a time through `section(i)`, so
/// that a journal is never held whole: each section is read once, and
/// what the ring walk needs of it is kept in one byte (the sequence
/// numbers every one of its sectors carries) and one flag (entries).
pub fn plan_by_section<S: AsRef<[u8]>, E>(
    g: &Geometry,
    ids: &Ids,
    journal_mode: bool,
    mut section: impl FnMut(u64) -> Result<S, E>,
) -> Result<Plan, E> {
    let n = g.journal_sections;
    let mut used = [false; N_COMMIT_IDS as usize];
    let mut max_section = [0u64; N_COMMIT_IDS as usize];
    let mut empty = true;
    // Bit k of `uniform[i]`: every sector of section i carries sequence k.
    let mut uniform: Vec<u8> = Vec::with_capacity(n.min(1 << 20) as usize);
    for i in 0..n {
        let buf = section(i)?;
        let s = buf.as_ref();
        let mut all = (1u8 << N_COMMIT_IDS) - 1;
        for j in 0..g.section_sectors {
            let id = stored_id(s, j);
            let Some(k) = (0..N_COMMIT_IDS).find(|&k| commit_id_in(ids, i, j, k) == id) else {
                return Ok(cleared(n, 0, 0));
            };
            used[k as usize] = true;
            max_section[k as usize] = i;
            all &= 1 << k;
        }
        uniform.push(all);
        if empty && !entries(g, s).is_empty() {
            empty = false;
        }
    }
    let unused = first_unused(&used);
    let Some(unused) = unused else {
        return Ok(cleared(n, 0, 0));
    };
    let last_used = prev_seq(unused);
    let mut want = prev_seq(last_used);
    if !used[want as usize] && used[prev_seq(want) as usize] {
        empty = true;
    }
    let mut start = max_section[last_used as usize] + 1;
    if start >= n {
        want = next_seq(want);
        start -= n;
    }
    let mut i = start;
    let mut good = Vec::new();
    while (good.len() as u64) < n {
        if uniform[i as usize] & (1 << want) == 0 {
            break;
        }
        good.push(i);
        i += 1;
        if i >= n {
            want = next_seq(want);
            i = 0;
        }
    }
    let replay = if empty { Vec::new() } else { good.clone() };
    if good.len() as u64 == n && (journal_mode || empty) {
        return Ok(Plan {
            replay,
            next_section: start,
            seq: want,
            clear_with: None,
        });
    }
    let mut p = cleared(n, last_used, start);
    p.replay = replay;
    Ok(p)
}

/// The kernel's choice of the first unused sequence number.
fn first_unused(used: &[bool; N_COMMIT_IDS as usize]) -> Option<u8> {
    let last = N_COMMIT_IDS as usize - 1;
    if !used[last] {
        let mut u = last;
        while u > 0 && !used[u - 1] {
            u -= 1;
        }
        Some(u as u8)
    } else {
        (0..N_COMMIT_IDS).find(|&k| !used[k as usize])
    }
}

fn cleared(_n: u64, last_used: u8, _start: u64) -> Plan {
    let erase = prev_seq(prev_seq(last_used));
    Plan {
        replay: Vec::new(),
        next_section: 0,
        seq: next_seq(erase),
        clear_with: Some(erase),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        let mut g = Geometry::sections(0, 1 << 16, 4, 0, false);
        g.journal_sections = 3;
        g
    }

    fn ring(g: &Geometry, seqs: &[u8]) -> Vec<u8> {
        let ss = (g.section_sectors * 512) as usize;
        let mut j = vec![0u8; ss * seqs.len()];
        for (i, &s) in seqs.iter().enumerate() {
            fill_section(g, &mut j[i * ss..(i + 1) * ss], i as u64, s, &[]);
        }
        j
    }

    #[test]
    fn entries_round_trip_with_their_last_bytes() {
        let g = geo();
        let mut buf = vec![0u8; (g.section_sectors * 512) as usize];
        let data: Vec<u8> = (0..512).map(|x| x as u8).collect();
        let data2 = vec![9u8; 512];
        let blocks = [
            Block {
                sector: 77,
                data: &data,
                tag: &[1, 2, 3, 4],
            },
            Block {
                sector: 5,
                data: &data2,
                tag: &[5, 6, 7, 8],
            },
        ];
        fill_section(&g, &mut buf, 2, 1, &blocks);
        // The data sector on disk ends with the commit ID, not the data.
        let d = data_at(&g, 0) + 504;
        assert_eq!(
            u64::from_le_bytes(buf[d..d + 8].try_into().unwrap()),
            commit_id(2, 8, 1)
        );
        let e = entries(&g, &buf);
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].sector, &e[0].data, &e[0].tag[..]),
            (77, &data, &[1, 2, 3, 4][..])
        );
        assert_eq!((e[1].sector, &e[1].data[..]), (5, &data2[..]));
    }

    #[test]
    fn a_fresh_journal_continues_at_section_zero() {
        let g = geo();
        let p = plan(&g, &ring(&g, &[0, 0, 0]), true);
        assert_eq!((p.replay.len(), p.next_section, p.clear_with), (0, 0, None));
        assert_eq!(p.seq, 1);
    }

    #[test]
    fn a_wrapped_ring_replays_oldest_first_and_stops_at_a_torn_section() {
        let g = geo();
        let ss = (g.section_sectors * 512) as usize;
        let mut j = ring(&g, &[2, 1, 1]);
        let data = vec![3u8; 512];
        for (i, s) in [(0usize, 2u8), (1, 1), (2, 1)] {
            let b = [Block {
                sector: i as u64 * 8,
                data: &data,
                tag: &[0; 4],
            }];
            fill_section(&g, &mut j[i * ss..(i + 1) * ss], i as u64, s, &b);
        }
        let p = plan(&g, &j, true);
        assert_eq!(p.replay, vec![1, 2, 0]);
        assert_eq!((p.next_section, p.seq, p.clear_with), (1, 2, None));
        // Section 1 torn: half of its sectors already carry the next ID.
        let torn = ss / 2;
        let mut t = j.clone();
        let mut newer = vec![0u8; ss];
        fill_section(&g, &mut newer, 1, 2, &[]);
        t[ss..ss + torn].copy_from_slice(&newer[..torn]);
        let p = plan(&g, &t, true);
        assert_eq!(p.replay, vec![2, 0]);
        assert!(p.clear_with.is_some());
    }
}
