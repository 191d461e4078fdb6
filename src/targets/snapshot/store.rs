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

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::core::{BlockDevice, DevError, DevResult, WriteBuf};

/// "SnAp", little-endian.
pub const MAGIC: u32 = 0x7041_6e53;
/// The one on-disk version there is.
pub const VERSION: u32 = 1;
/// Size of one `(old_chunk, new_chunk)` pair.
const PAIR: u64 = 16;

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
    pub fn open(
        cow: Arc<dyn BlockDevice>,
        kind: Kind,
        chunk_sectors: u64,
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
        };
        if kind == Kind::Transient {
            return Ok((s, Opened::New));
        }
        s.next_free = 2;
        let opened = s.open_persistent()?;
        Ok((s, opened))
    }

    fn open_persistent(&mut self) -> Result<Opened, String> {
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
        let disk_chunk = u64::from(le32(&hdr, 12));
        if !disk_chunk.is_power_of_two() || disk_chunk > (i32::MAX as u64) >> 9 {
            return Err(format!(
                "the snapshot header's chunk size {disk_chunk} is not a power of two of at most \
                 4194303 sectors: the header is corrupt"
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
        if le32(&hdr, 4) == 0 {
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
        self.chunk = bytes;
        self.per_area = bytes / PAIR;
        self.area = vec![0; bytes as usize];
        Ok(())
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
        let mut h = vec![0u8; self.chunk as usize];
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

    fn read_areas(&mut self) -> DevResult<()> {
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
    /// pair pointing outside the COW device or the origin's chunk range
    /// is corrupt metadata, refused rather than followed.
    fn insert_area(&mut self) -> DevResult<bool> {
        let chunks = self.cow.size() / self.chunk;
        for i in 0..self.per_area {
            let (old, new) = self.pair(i);
            if new == 0 {
                self.committed = i;
                return Ok(false);
            }
            if new >= chunks || old > u64::MAX / self.chunk {
                return Err(DevError::Target(format!(
                    "exception {i} of metadata area {} ({old} -> {new}) points outside \
                     the devices: the snapshot's metadata is corrupt",
                    self.current_area
                )));
            }
            self.next_free = self.next_free.max(new + 1);
            self.map.insert(old, new);
        }
        Ok(true)
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
        let size_chunks = self.cow.size() / self.chunk;
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
                if self.next_free % (self.per_area + 1) == 1 {
                    self.next_free += 1;
                }
                Ok(new)
            }
        }
    }

    /// Record `old -> new` once the chunk's data is on the COW device: the
    /// data is flushed, then the area written (FUA), as the kernel's
    /// `commit_exception` does. A full area first gets its successor zeroed.
    pub fn commit(&mut self, old: u64, new: u64) -> DevResult<()> {
        if self.kind == Kind::Persistent {
            self.set_pair(self.committed, old, new);
            self.committed += 1;
            let full = self.committed == self.per_area;
            if full {
                let zero = vec![0u8; self.chunk as usize];
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

    #[test]
    fn transient_allocates_from_chunk_zero() {
        let (mut s, _) = Store::open(cow(8192), Kind::Transient, 8).unwrap();
        assert_eq!(s.allocate().unwrap(), 0);
        assert_eq!(s.allocate().unwrap(), 1);
        assert!(s.allocate().is_err());
        assert_eq!(s.usage(), (16, 16, 0));
    }
}
