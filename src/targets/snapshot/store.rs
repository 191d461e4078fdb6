//! The exception stores of dm-snapshot: which chunks of the origin have a
//! copy on the COW device, and where. `P` (persistent) keeps that record
//! on the COW device in the kernel's format, so a snapshot outlives the
//! server and moves to and from the kernel; `N` (transient) keeps it in
//! memory only.
//!
//! The persistent layout (dm-snap-persistent.c), in chunks of the table's
//! chunk size: chunk 0 is the header (`magic` "SnAp" 0x70416e53, `valid`,
//! `version` 1, `chunk_size` in sectors, little-endian u32s); then metadata
//! areas, each one chunk of `(old_chunk, new_chunk)` little-endian u64
//! pairs followed by as many data chunks as it has pairs. The first pair
//! whose `new_chunk` is 0 ends the list; when an area fills up, the next
//! one is zeroed before the full one is written, so the list always ends.
//!
//! Every boundary follows the kernel: area `i` is chunk
//! `1 + i * (pairs + 1)`; a new chunk that lands on an area's chunk moves
//! one on (`skip_metadata`), both when it is handed out and when a reopen
//! computes the first free chunk from the largest one recorded; a reopen
//! walks the areas while they are full, so an area exactly full is
//! followed by its zeroed successor, which becomes the current one.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::core::{BlockDevice, DevError, DevResult, WriteBuf};
use crate::mem::Pinned;

/// "SnAp", little-endian.
pub const MAGIC: u32 = 0x7041_6e53;
/// The one on-disk version there is.
pub const VERSION: u32 = 1;
/// Size of one `(old_chunk, new_chunk)` pair.
const PAIR: u64 = 16;
/// What one exception costs in the in-memory table (a B-tree of `u64`
/// pairs: the pair and its share of a node), charged as pinned memory.
const ENTRY_BYTES: u64 = 32;
/// Exceptions charged at once, so the ledger is not touched per entry.
const ENTRY_BATCH: u64 = 4096;
/// What to do when the pinned memory is short.
const PIN_FIX: &str = "give the snapshot a smaller chunk size (a COW header's chunk size \
                       overrides the table's: zero the COW device's first chunk to start anew)";

/// Which store a table line asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Persistent,
    Transient,
}

/// The COW device has no room for another chunk.
#[derive(Debug)]
pub struct Full;

/// What a store found when it was opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// A zeroed device: a fresh header and empty first area were written.
    New,
    /// Existing metadata, read back.
    Existing,
    /// A header marked invalid (the snapshot overflowed before): the
    /// snapshot stays invalid, as in the kernel.
    Invalid,
}

pub struct Store {
    cow: Arc<dyn BlockDevice>,
    kind: Kind,
    /// Chunk size in bytes.
    chunk: u64,
    map: BTreeMap<u64, u64>,
    /// Pairs per metadata area.
    per_area: u64,
    /// The current metadata area, as on disk plus the pairs committed since.
    area: Vec<u8>,
    current_area: u64,
    /// Pairs used in the current area.
    committed: u64,
    /// Next chunk to hand out (persistent: skipping metadata chunks;
    /// transient: from chunk 0).
    next_free: u64,
    /// The server's pinned memory this store holds: two chunks (the
    /// current metadata area, and the header or next area being written
    /// under the store's lock) and the exception table.
    pinned: Pinned,
    /// Exceptions `pinned` covers.
    charged_entries: u64,
}

/// A zeroed buffer of one chunk, refused rather than aborting when the
/// memory is not there (a header may name chunks of up to 1 GiB); the
/// store's pinned reservation covers it.
fn zeroed(bytes: u64) -> Result<Vec<u8>, String> {
    crate::mem::try_zeroed(bytes, "a chunk buffer")
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Store {
    /// Open the store on `cow` with chunks of `chunk_sectors`. A persistent
    /// header's chunk size overrides the table's, as in the kernel; the
    /// chunk size in effect is [`Store::chunk_bytes`].
    /// `pinned` (usually empty) grows by what the store keeps: refused
    /// before anything chunk-sized is allocated when the server's pinned
    /// memory is short.
    pub fn open_pinned(
        cow: Arc<dyn BlockDevice>,
        kind: Kind,
        chunk_sectors: u64,
        pinned: Pinned,
    ) -> Result<(Store, Opened), String> {
        let mut s = Store {
            cow,
            kind,
            chunk: chunk_sectors * 512,
            map: BTreeMap::new(),
            per_area: chunk_sectors * 512 / PAIR,
            area: Vec::new(),
            current_area: 0,
            committed: 0,
            next_free: 0,
            pinned,
            charged_entries: 0,
        };
        if kind == Kind::Transient {
            return Ok((s, Opened::New));
        }
        s.next_free = 2;
        let opened = s.open_persistent()?;
        Ok((s, opened))
    }

    fn open_persistent(&mut self) -> Result<Opened, String> {
        if self.cow.size() < 512 {
            return Err(format!(
                "the COW device ({} bytes) is too small for a snapshot header: give it at \
                 least two chunks",
                self.cow.size()
            ));
        }
        let mut hdr = vec![0u8; 512];
        self.cow
            .read(0, &mut hdr)
            .map_err(|e| format!("cannot read the snapshot header of the COW device: {e}"))?;
        match le32(&hdr, 0) {
            0 => {
                self.set_chunk(self.chunk)?;
                // A read-only COW (`table check --open`) is left as it is;
                // the snapshot's writes fail there anyway.
                if !self.cow.limits().read_only {
                    self.format().map_err(|e| {
                        format!("cannot write a new snapshot header on the COW device: {e}")
                    })?;
                }
                return Ok(Opened::New);
            }
            MAGIC => {}
            m => {
                return Err(format!(
                    "the COW device holds no snapshot (magic {m:#010x}, not 'SnAp' \
                     {MAGIC:#010x}): zero its first chunk to start a new snapshot on it"
                ))
            }
        }
        let version = le32(&hdr, 8);
        if version != VERSION {
            return Err(format!(
                "unable to handle snapshot disk version {version} (udm knows version {VERSION})"
            ));
        }
        let valid = le32(&hdr, 4);
        if valid > 1 {
            return Err(format!(
                "the snapshot header's valid flag is {valid}, not 0 or 1: the header is corrupt"
            ));
        }
        let disk_chunk = u64::from(le32(&hdr, 12));
        if !disk_chunk.is_power_of_two() || disk_chunk > (i32::MAX as u64) >> 9 {
            return Err(format!(
                "the snapshot header's chunk size {disk_chunk} is not a power of two of at most \
                 4194303 sectors: the header is corrupt"
            ));
        }
        let lbs = u64::from(self.cow.limits().logical_block_size.max(512)) / 512;
        if disk_chunk % lbs != 0 {
            return Err(format!(
                "the snapshot header's chunk size {disk_chunk} is not a multiple of the COW \
                 device's block size ({lbs} sectors): the header is corrupt"
            ));
        }
        if disk_chunk * 512 != self.chunk {
            tracing::warn!(
                "snapshot: chunk size {disk_chunk} in device metadata overrides table chunk \
                 size of {}",
                self.chunk / 512
            );
        }
        self.set_chunk(disk_chunk * 512)?;
        if valid == 0 {
            return Ok(Opened::Invalid);
        }
        self.read_areas()
            .map_err(|e| format!("cannot read the snapshot's exceptions: {e}"))?;
        Ok(Opened::Existing)
    }

    fn set_chunk(&mut self, bytes: u64) -> Result<(), String> {
        if self.cow.size() < 2 * bytes {
            return Err(format!(
                "the COW device ({} bytes) cannot hold a header and a metadata area of \
                 {bytes}-byte chunks: give it at least {} bytes",
                self.cow.size(),
                2 * bytes
            ));
        }
        let more = (2 * bytes).saturating_sub(self.pinned.bytes());
        self.pinned.grow(
            more,
            &format!("a snapshot with {bytes}-byte chunks (two chunk buffers)"),
            PIN_FIX,
        )?;
        self.chunk = bytes;
        self.per_area = bytes / PAIR;
        self.area = zeroed(bytes).map_err(|e| format!("snapshot metadata area: {e}"))?;
        Ok(())
    }

    /// Chunks of the COW device (a partial last chunk is unused).
    fn size_chunks(&self) -> u64 {
        self.cow.size() / self.chunk
    }

    /// Whether chunk `c` is the header or a metadata area.
    fn is_metadata(&self, c: u64) -> bool {
        c == 0 || c % (self.per_area + 1) == 1
    }

    /// The kernel's `skip_metadata`: a free chunk never is a metadata area.
    fn skip_metadata(&mut self) {
        if self.next_free % (self.per_area + 1) == 1 {
            self.next_free += 1;
        }
    }

    /// Header, then a zeroed first area (the header goes first as in the
    /// kernel; a crash between leaves a header over a zeroed device,
    /// which reads back as an empty snapshot).
    fn format(&mut self) -> DevResult<()> {
        self.write_header(true)?;
        self.area.fill(0);
        self.write_area(0, false)
    }

    fn write_header(&self, valid: bool) -> DevResult<()> {
        let mut h = zeroed(self.chunk).map_err(DevError::Target)?;
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&u32::from(valid).to_le_bytes());
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&((self.chunk / 512) as u32).to_le_bytes());
        self.cow.write(0, WriteBuf::Borrowed(&h), true)
    }

    /// Where metadata area `i` lives, in chunks.
    pub fn area_location(per_area: u64, i: u64) -> u64 {
        1 + (per_area + 1) * i
    }

    fn area_offset(&self, i: u64) -> u64 {
        Self::area_location(self.per_area, i) * self.chunk
    }

    /// Write the in-memory area as area `i`; `barrier`: the data chunks
    /// it points at reach the device first (the kernel's PREFLUSH|FUA).
    fn write_area(&self, i: u64, barrier: bool) -> DevResult<()> {
        if barrier {
            self.cow.flush()?;
        }
        self.cow
            .write(self.area_offset(i), WriteBuf::Borrowed(&self.area), true)
    }

    /// The kernel's `read_exceptions`: areas in order while they are full,
    /// then the first free chunk past the largest one recorded, moved off
    /// a metadata area (without that, the chunk after an exactly full
    /// area would be handed out as data while it is the next area).
    fn read_areas(&mut self) -> DevResult<()> {
        self.walk_areas()?;
        self.check_distinct_chunks()?;
        self.skip_metadata();
        Ok(())
    }

    fn walk_areas(&mut self) -> DevResult<()> {
        self.current_area = 0;
        loop {
            let at = self.area_offset(self.current_area);
            if at + self.chunk > self.cow.size() {
                return Err(DevError::Target(format!(
                    "metadata area {} lies beyond the end of the COW device",
                    self.current_area
                )));
            }
            let mut area = std::mem::take(&mut self.area);
            self.cow.read(at, &mut area)?;
            self.area = area;
            if !self.insert_area()? {
                return Ok(());
            }
            self.current_area += 1;
        }
    }

    /// Take the pairs of the in-memory area; false at the terminator. A
    /// pair pointing outside the COW device or the origin's chunk range,
    /// at the header or a metadata area, or at an origin chunk another
    /// pair already names, is corrupt metadata, refused rather than
    /// followed.
    fn insert_area(&mut self) -> DevResult<bool> {
        let chunks = self.size_chunks();
        for i in 0..self.per_area {
            let (old, new) = self.pair(i);
            if new == 0 {
                self.committed = i;
                return Ok(false);
            }
            self.charge_entry().map_err(DevError::Target)?;
            let corrupt = |why: &str| {
                DevError::Target(format!(
                    "exception {i} of metadata area {} ({old} -> {new}) {why}: the snapshot's \
                     metadata is corrupt (remove the snapshot and zero its COW device's first \
                     chunk to start again)",
                    self.current_area
                ))
            };
            if new >= chunks || old > u64::MAX / self.chunk {
                return Err(corrupt("points outside the devices"));
            }
            if self.is_metadata(new) {
                return Err(corrupt("points at a metadata chunk"));
            }
            if self.map.insert(old, new).is_some() {
                return Err(corrupt("names an origin chunk an earlier exception names"));
            }
            self.next_free = self.next_free.max(new + 1);
        }
        Ok(true)
    }

    /// No two exceptions share a COW chunk (the data of one would be the
    /// other's). Checked once the areas are read, by sorting a copy of
    /// the chunks, whose length is bounded by the COW device's chunks.
    fn check_distinct_chunks(&self) -> DevResult<()> {
        let mut news: Vec<u64> = Vec::new();
        news.try_reserve_exact(self.map.len()).map_err(|_| {
            DevError::Target(format!(
                "cannot check the {} exceptions of the snapshot: out of memory",
                self.map.len()
            ))
        })?;
        news.extend(self.map.values().copied());
        news.sort_unstable();
        if let Some(w) = news.windows(2).find(|w| w[0] == w[1]) {
            return Err(DevError::Target(format!(
                "two exceptions of the snapshot share COW chunk {}: the snapshot's metadata is \
                 corrupt (remove the snapshot and zero its COW device's first chunk to start \
                 again)",
                w[0]
            )));
        }
        Ok(())
    }

    /// Charge the exception table's next entry (a batch at a time).
    fn charge_entry(&mut self) -> Result<(), String> {
        if (self.map.len() as u64) < self.charged_entries {
            return Ok(());
        }
        self.pinned.grow(
            ENTRY_BATCH * ENTRY_BYTES,
            &format!(
                "a snapshot's exception table past {} exceptions",
                self.map.len()
            ),
            PIN_FIX,
        )?;
        self.charged_entries += ENTRY_BATCH;
        Ok(())
    }

    fn pair(&self, i: u64) -> (u64, u64) {
        let at = (i * PAIR) as usize;
        (le64(&self.area, at), le64(&self.area, at + 8))
    }

    fn set_pair(&mut self, i: u64, old: u64, new: u64) {
        let at = (i * PAIR) as usize;
        self.area[at..at + 8].copy_from_slice(&old.to_le_bytes());
        self.area[at + 8..at + 16].copy_from_slice(&new.to_le_bytes());
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    /// Where origin chunk `old` was copied, if it was.
    pub fn lookup(&self, old: u64) -> Option<u64> {
        self.map.get(&old).copied()
    }

    /// Exceptions recorded.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// A chunk of the COW device for a new exception (the kernel's
    /// `prepare_exception`).
    pub fn allocate(&mut self) -> Result<u64, Full> {
        let size_chunks = self.size_chunks();
        match self.kind {
            Kind::Transient => {
                if self.next_free + 1 > size_chunks {
                    return Err(Full);
                }
                self.next_free += 1;
                Ok(self.next_free - 1)
            }
            Kind::Persistent => {
                if self.next_free + 1 > size_chunks {
                    return Err(Full);
                }
                let new = self.next_free;
                self.next_free += 1;
                self.skip_metadata();
                Ok(new)
            }
        }
    }

    /// Record `old -> new` once the chunk's data is on the COW device: the
    /// data is flushed, then the area written (FUA), as the kernel's
    /// `commit_exception` does. A full area first gets its successor zeroed;
    /// a successor past the end of the COW device fails the commit (the
    /// kernel's write there fails and invalidates the snapshot), checked
    /// here rather than left to a device that might grow instead.
    pub fn commit(&mut self, old: u64, new: u64) -> DevResult<()> {
        // Before anything reaches the disk: out of pinned memory fails the
        // commit, which invalidates the snapshot, as the kernel's failed
        // exception allocation does.
        self.charge_entry().map_err(DevError::Target)?;
        if self.kind == Kind::Persistent {
            let full = self.committed + 1 == self.per_area;
            let next = Self::area_location(self.per_area, self.current_area + 1);
            if full && next >= self.size_chunks() {
                return Err(DevError::Target(format!(
                    "the COW device is full: metadata area {} (chunk {next}) lies past its end",
                    self.current_area + 1
                )));
            }
            self.set_pair(self.committed, old, new);
            self.committed += 1;
            if full {
                let zero = zeroed(self.chunk).map_err(DevError::Target)?;
                self.cow.write(
                    self.area_offset(self.current_area + 1),
                    WriteBuf::Borrowed(&zero),
                    false,
                )?;
            }
            self.write_area(self.current_area, true)?;
            if full {
                self.committed = 0;
                self.current_area += 1;
                self.area.fill(0);
            }
        }
        self.map.insert(old, new);
        Ok(())
    }

    /// Mark the header invalid (the kernel's `drop_snapshot`).
    pub fn invalidate(&self) -> DevResult<()> {
        match self.kind {
            Kind::Persistent => self.write_header(false),
            Kind::Transient => Ok(()),
        }
    }

    /// `(sectors allocated, total sectors, metadata sectors)`, as the
    /// kernel's `usage` of each store computes them.
    pub fn usage(&self) -> (u64, u64, u64) {
        let cs = self.chunk / 512;
        let total = self.cow.size() / 512;
        match self.kind {
            Kind::Transient => (self.next_free * cs, total, 0),
            Kind::Persistent => (self.next_free * cs, total, (self.current_area + 2) * cs),
        }
    }

    /// The exception to merge next: the last one committed (the kernel
    /// merges from the end of the list back, so that clearing it keeps
    /// the list's terminator). `None` when every one is merged.
    pub fn last_exception(&mut self) -> DevResult<Option<(u64, u64)>> {
        if self.committed == 0 {
            if self.current_area == 0 {
                return Ok(None);
            }
            self.current_area -= 1;
            let mut area = std::mem::take(&mut self.area);
            let r = self
                .cow
                .read(self.area_offset(self.current_area), &mut area);
            self.area = area;
            r?;
            self.committed = self.per_area;
        }
        Ok(Some(self.pair(self.committed - 1)))
    }

    /// The last exception's chunk is in the origin: clear its pair and
    /// write the area (FUA, after a flush), as `commit_merge`.
    pub fn commit_merge(&mut self) -> DevResult<()> {
        let i = self.committed - 1;
        let (old, _) = self.pair(i);
        self.set_pair(i, 0, 0);
        self.write_area(self.current_area, true)?;
        self.committed = i;
        self.next_free = Self::area_location(self.per_area, self.current_area) + i + 1;
        self.map.remove(&old);
        Ok(())
    }
}

#[cfg(test)]
impl Store {
    /// A store charging the process's ledger.
    pub fn open(
        cow: Arc<dyn BlockDevice>,
        kind: Kind,
        chunk_sectors: u64,
    ) -> Result<(Store, Opened), String> {
        let pinned = crate::mem::PinnedLedger::global().reserve(None, "a snapshot", 0, "")?;
        Self::open_pinned(cow, kind, chunk_sectors, pinned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn cow(size: u64) -> Arc<dyn BlockDevice> {
        Arc::new(MemStore::new(size))
    }

    #[test]
    fn a_zeroed_device_gets_the_kernels_header_and_reopens_empty() {
        let c = cow(1 << 20);
        let (s, o) = Store::open(c.clone(), Kind::Persistent, 8).unwrap();
        assert_eq!(o, Opened::New);
        assert_eq!(s.usage(), (16, 2048, 16));
        let mut h = [0u8; 16];
        c.read(0, &mut h).unwrap();
        assert_eq!(&h[..4], b"SnAp");
        assert_eq!(le32(&h, 4), 1);
        assert_eq!(le32(&h, 8), 1);
        assert_eq!(le32(&h, 12), 8);
        let (s, o) = Store::open(c, Kind::Persistent, 8).unwrap();
        assert_eq!((o, s.len()), (Opened::Existing, 0));
    }

    #[test]
    fn allocation_skips_metadata_areas_and_exceptions_survive_reopening() {
        // 512-byte chunks: 32 pairs per area; areas at chunks 1, 34, 67.
        let c = cow(64 << 10);
        let (mut s, _) = Store::open(c.clone(), Kind::Persistent, 1).unwrap();
        let mut got = Vec::new();
        for old in 0..40 {
            let new = s.allocate().unwrap();
            s.commit(old * 3, new).unwrap();
            got.push(new);
        }
        assert_eq!(got[0], 2);
        assert_eq!(got[31], 33);
        assert_eq!(got[32], 35, "chunk 34 is the second area");
        let (r, o) = Store::open(c, Kind::Persistent, 4).unwrap();
        assert_eq!(o, Opened::Existing);
        assert_eq!(r.chunk_bytes(), 512, "the header's chunk size wins");
        assert_eq!(r.len(), 40);
        assert_eq!(r.lookup(39 * 3), Some(got[39]));
        assert_eq!(r.usage().0, (got[39] + 1));
    }

    #[test]
    fn a_full_cow_refuses_and_an_invalid_header_reopens_invalid() {
        let c = cow(4 * 4096);
        let (mut s, _) = Store::open(c.clone(), Kind::Persistent, 8).unwrap();
        assert_eq!(s.allocate().unwrap(), 2);
        assert_eq!(s.allocate().unwrap(), 3);
        assert!(s.allocate().is_err());
        s.invalidate().unwrap();
        let (_, o) = Store::open(c, Kind::Persistent, 8).unwrap();
        assert_eq!(o, Opened::Invalid);
    }

    #[test]
    fn garbage_is_refused_with_a_fix() {
        let c = cow(1 << 20);
        c.write(0, WriteBuf::Borrowed(b"not a snapshot"), false)
            .unwrap();
        let e = Store::open(c, Kind::Persistent, 8).err().unwrap();
        assert!(e.contains("zero its first chunk"), "{e}");
    }

    #[test]
    fn merging_clears_from_the_end_and_a_reopen_sees_the_rest() {
        let c = cow(64 << 10);
        let (mut s, _) = Store::open(c.clone(), Kind::Persistent, 1).unwrap();
        for old in 0..35 {
            let n = s.allocate().unwrap();
            s.commit(old, n).unwrap();
        }
        for want in (30..35).rev() {
            let (old, _) = s.last_exception().unwrap().unwrap();
            assert_eq!(old, want);
            s.commit_merge().unwrap();
        }
        let (mut r, _) = Store::open(c, Kind::Persistent, 1).unwrap();
        assert_eq!(r.len(), 30);
        while r.last_exception().unwrap().is_some() {
            r.commit_merge().unwrap();
        }
        assert!(r.is_empty());
        let (a, _, m) = r.usage();
        assert_eq!(a, m, "allocated equals metadata once merged, as lvm checks");
    }

    #[test]
    fn a_pair_pointing_beyond_the_cow_is_refused() {
        let c = cow(64 << 10);
        Store::open(c.clone(), Kind::Persistent, 8).unwrap();
        let mut pair = [0u8; 16];
        pair[8..].copy_from_slice(&u64::MAX.to_le_bytes());
        c.write(4096, WriteBuf::Borrowed(&pair), false).unwrap();
        let e = Store::open(c, Kind::Persistent, 8).err().unwrap();
        assert!(e.contains("corrupt"), "{e}");
    }

    /// Finding 5 of issue 44: the first area exactly full, then a reopen.
    /// The kernel's reload walks to the (zeroed) second area and skips
    /// its chunk when handing out the next one.
    #[test]
    fn a_reopen_after_an_exactly_full_area_skips_the_next_area() {
        let c = cow(2 << 20);
        let (mut s, _) = Store::open(c.clone(), Kind::Persistent, 8).unwrap();
        for old in 0..256 {
            let n = s.allocate().unwrap();
            s.commit(old, n).unwrap();
        }
        assert_eq!(s.usage(), (259 * 8, 4096, 3 * 8));
        let (mut r, _) = Store::open(c.clone(), Kind::Persistent, 8).unwrap();
        assert_eq!(r.usage(), s.usage(), "a reopen agrees with the live store");
        let n = r.allocate().unwrap();
        assert_eq!(n, 259, "chunk 258 is the second metadata area");
        r.commit(300, n).unwrap();
        let (r2, _) = Store::open(c, Kind::Persistent, 8).unwrap();
        assert_eq!((r2.len(), r2.lookup(300)), (257, Some(259)));
    }

    /// The kernel's layout, computed from dm-snap-persistent.c's rules
    /// alone: exception `j` committed in order is pair `j % pairs` of area
    /// `j / pairs`, its data in the `j`-th chunk that is neither the
    /// header nor an area; the area after the last full one is zeroed.
    fn kernel_metadata(chunk: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
        let pairs = chunk / 16;
        let stride = pairs + 1;
        let mut hdr = vec![0u8; chunk as usize];
        hdr[..4].copy_from_slice(b"SnAp");
        hdr[4..8].copy_from_slice(&1u32.to_le_bytes());
        hdr[8..12].copy_from_slice(&1u32.to_le_bytes());
        hdr[12..16].copy_from_slice(&((chunk / 512) as u32).to_le_bytes());
        let mut out = vec![(0, hdr)];
        for a in 0..=n / pairs {
            let mut area = vec![0u8; chunk as usize];
            for i in 0..pairs.min(n - a * pairs) {
                let j = a * pairs + i;
                let new = 1 + a * stride + 1 + i;
                area[(16 * i) as usize..][..8].copy_from_slice(&(j * 7).to_le_bytes());
                area[(16 * i + 8) as usize..][..8].copy_from_slice(&new.to_le_bytes());
            }
            out.push((1 + a * stride, area));
        }
        out
    }

    /// The two chunk buffers and the exception table are reserved from
    /// the server's pinned memory: a reopen whose table would pass it is
    /// refused by name, a live commit past it fails before the disk is
    /// touched, and a dropped store gives everything back.
    #[test]
    fn the_exception_table_is_charged_to_the_pinned_memory() {
        use crate::mem::PinnedLedger;
        let c = cow(4400 * 512);
        let pin = |l: &Arc<PinnedLedger>| l.reserve(Some("snap"), "a snapshot", 0, "").unwrap();
        let big = PinnedLedger::new(1 << 30);
        let (mut s, _) = Store::open_pinned(c.clone(), Kind::Persistent, 1, pin(&big)).unwrap();
        assert_eq!(big.used(), 2 * 512, "two chunks before any exception");
        for old in 0..=ENTRY_BATCH {
            let new = s.allocate().unwrap();
            s.commit(old, new).unwrap();
        }
        assert_eq!(big.used(), 2 * 512 + 2 * ENTRY_BATCH * ENTRY_BYTES);
        drop(s);
        assert_eq!(big.used(), 0);

        let tight = PinnedLedger::new(2 * 512 + ENTRY_BATCH * ENTRY_BYTES);
        let e = Store::open_pinned(c.clone(), Kind::Persistent, 1, pin(&tight))
            .err()
            .unwrap();
        assert!(
            e.contains("device 'snap'")
                && e.contains("exception table")
                && e.contains("--pinned-memory"),
            "{e}"
        );
        assert_eq!(tight.used(), 0);

        let fresh = cow(4400 * 512);
        let (mut s, _) =
            Store::open_pinned(fresh.clone(), Kind::Persistent, 1, pin(&tight)).unwrap();
        for old in 0..ENTRY_BATCH {
            let new = s.allocate().unwrap();
            s.commit(old, new).unwrap();
        }
        let new = s.allocate().unwrap();
        let area = s.area.clone();
        let e = s.commit(ENTRY_BATCH, new).unwrap_err().to_string();
        assert!(e.contains("pinned metadata memory"), "{e}");
        assert_eq!(s.area, area, "the refused commit changed nothing");
        assert_eq!(s.len() as u64, ENTRY_BATCH);
    }

    /// The growing ledger refuses chunk buffers before allocating them.
    #[test]
    fn chunk_buffers_are_refused_before_they_are_allocated() {
        let l = crate::mem::PinnedLedger::new(2 * 4096 - 1);
        let p = l.reserve(None, "a snapshot", 0, "").unwrap();
        let e = Store::open_pinned(cow(1 << 20), Kind::Persistent, 8, p)
            .err()
            .unwrap();
        assert!(
            e.contains("4096-byte chunks") && e.contains("smaller chunk size"),
            "{e}"
        );
        assert_eq!(l.used(), 0);
    }

    /// Every boundary of the layout, with a close and reopen before each
    /// exception at and around an area's end: the metadata chunks equal
    /// the kernel's byte for byte, and the usage a reopen reports equals
    /// the live store's.
    #[test]
    fn the_layout_is_the_kernels_at_every_area_boundary_across_reopens() {
        for sectors in [1u64, 8] {
            let chunk = sectors * 512;
            let pairs = chunk / 16;
            let total = 3 * pairs + 2;
            let c = cow((4 * (pairs + 1) + 2) * chunk);
            let (mut s, _) = Store::open(c.clone(), Kind::Persistent, sectors).unwrap();
            for j in 0..total {
                let at = j % pairs;
                if at == 0 || at == 1 || at == pairs - 1 {
                    let live = s.usage();
                    s = Store::open(c.clone(), Kind::Persistent, sectors).unwrap().0;
                    assert_eq!(
                        s.usage(),
                        live,
                        "chunk {chunk}: reopen before exception {j}"
                    );
                    assert_eq!(s.len() as u64, j);
                }
                let new = s.allocate().unwrap();
                s.commit(j * 7, new).unwrap();
            }
            let s = Store::open(c.clone(), Kind::Persistent, sectors).unwrap().0;
            assert_eq!(s.len() as u64, total);
            for (at, want) in kernel_metadata(chunk, total) {
                let mut got = vec![0u8; chunk as usize];
                c.read(at * chunk, &mut got).unwrap();
                assert!(got == want, "chunk {chunk}: metadata chunk {at} differs");
            }
        }
    }

    #[test]
    fn a_full_area_whose_successor_lies_past_the_end_fails_its_commit() {
        // 512-byte chunks: area 1 at chunk 34; a COW of 34 chunks ends
        // just before it, so the 32nd exception cannot be committed.
        let c = cow(34 * 512);
        let (mut s, _) = Store::open(c.clone(), Kind::Persistent, 1).unwrap();
        for old in 0..31 {
            let n = s.allocate().unwrap();
            s.commit(old, n).unwrap();
        }
        let n = s.allocate().unwrap();
        assert_eq!(n, 33);
        let e = s.commit(31, n).unwrap_err().to_string();
        assert!(e.contains("full"), "{e}");
        assert_eq!(c.size(), 34 * 512, "nothing written past the end");
        let (r, _) = Store::open(c, Kind::Persistent, 1).unwrap();
        assert_eq!(r.len(), 31);
    }

    fn refused(c: &Arc<dyn BlockDevice>, at: u64, bytes: &[u8], want: &str) {
        c.write(at, WriteBuf::Borrowed(bytes), false).unwrap();
        let e = Store::open(c.clone(), Kind::Persistent, 8).err().unwrap();
        assert!(e.contains(want), "{want}: {e}");
    }

    fn pair_bytes(old: u64, new: u64) -> [u8; 16] {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&old.to_le_bytes());
        p[8..].copy_from_slice(&new.to_le_bytes());
        p
    }

    #[test]
    fn hostile_headers_and_areas_are_refused_by_name() {
        let fresh = || {
            let c = cow(4 << 20);
            Store::open(c.clone(), Kind::Persistent, 8).unwrap();
            c
        };
        refused(&fresh(), 4, &7u32.to_le_bytes(), "valid flag is 7");
        refused(&fresh(), 8, &2u32.to_le_bytes(), "version 2");
        refused(&fresh(), 12, &0u32.to_le_bytes(), "chunk size 0");
        refused(&fresh(), 12, &24u32.to_le_bytes(), "chunk size 24");
        refused(
            &fresh(),
            12,
            &(1u32 << 30).to_le_bytes(),
            "not a power of two",
        );
        // A 1 GiB chunk on a 4 MiB COW: refused before any buffer.
        refused(&fresh(), 12, &(1u32 << 21).to_le_bytes(), "cannot hold");
        refused(&fresh(), 4096, &pair_bytes(5, 1), "metadata chunk");
        refused(&fresh(), 4096, &pair_bytes(5, 0x1_0000_0000), "outside");
        let mut two = pair_bytes(5, 2).to_vec();
        two.extend_from_slice(&pair_bytes(5, 3));
        refused(&fresh(), 4096, &two, "earlier exception");
        let mut shared = pair_bytes(5, 2).to_vec();
        shared.extend_from_slice(&pair_bytes(6, 2));
        refused(&fresh(), 4096, &shared, "share COW chunk 2");
        // A full first area whose successor is past the end.
        let c = cow(258 * 4096);
        Store::open(c.clone(), Kind::Persistent, 8).unwrap();
        let area: Vec<u8> = (0..256).flat_map(|i| pair_bytes(i, 2 + i)).collect();
        refused(&c, 4096, &area, "beyond the end");
        let tiny: Arc<dyn BlockDevice> = cow(256);
        let e = Store::open(tiny, Kind::Persistent, 8).err().unwrap();
        assert!(e.contains("too small"), "{e}");
    }

    #[test]
    fn transient_allocates_from_chunk_zero() {
        let (mut s, _) = Store::open(cow(8192), Kind::Transient, 8).unwrap();
        assert_eq!(s.allocate().unwrap(), 0);
        assert_eq!(s.allocate().unwrap(), 1);
        assert!(s.allocate().is_err());
        assert_eq!(s.usage(), (16, 16, 0));
    }
}
