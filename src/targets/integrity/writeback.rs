//! J mode as the kernel runs it (`dm-integrity.c`: the journal in memory,
//! `integrity_commit`, `integrity_writer`). A write is copied into the
//! in-memory journal and acknowledged at once: the device has a volatile
//! write cache, as any disk has. A FLUSH or FUA commits every section
//! filled since the last commit with one journal write and one flush of
//! the device below, whoever's writes they hold (group commit); so do the
//! journal filling to `journal_watermark` and `commit_time` passing after
//! the first uncommitted write. A writer thread copies committed entries
//! to their places in batches (data runs merged, the tags of each tag
//! block read and written once per batch) and frees their sections only
//! after a flush has made those copies durable, so the journal on disk
//! always holds whatever the places may still lack, and replay at open
//! finishes the job after a crash.
//!
//! With a separate metadata device the journal and the tags are written
//! there and the data to the data device; a placed batch is made durable
//! on both before its sections are freed.
//!
//! Reads see the newest data: an entry stays in the in-memory index until
//! its place has it. No lock is held across device I/O by a request
//! except the commit's, which FLUSHes share.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::IoSlice;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::io;
use super::journal::{self, Block};
use super::layout::Geometry;
use super::seal::Seal;
use super::tags::Alg;
use crate::core::{BlockDevice, DevError, DevResult, WriteBuf};

/// The kernel's `DEFAULT_JOURNAL_WATERMARK` (percent).
pub const DEFAULT_WATERMARK: u32 = 50;
/// The kernel's `DEFAULT_COMMIT_TIME` (milliseconds).
pub const DEFAULT_COMMIT_TIME_MS: u32 = 10_000;
/// Bytes of tags read and written as one unit when placing entries.
const TAG_BLOCK: u64 = 4096;
/// Bytes of tags a write computes on the stack before it copies their
/// blocks into the journal: tags are hashed outside the ring's lock, and
/// a buffer on the heap would cost an allocation per write.
const TAG_STEP: usize = 4096;

/// Reads data and tags of a request's blocks from their places.
pub type RawRead<'a> = &'a dyn Fn(&mut [u8], &mut [u8]) -> DevResult<()>;

/// The tags of a write's blocks.
#[derive(Clone, Copy)]
pub enum Tags<'a> {
    /// The caller's, one per block (tagged writes).
    Given(&'a [u8]),
    /// Computed here with the internal hash, once per block.
    Hash {
        alg: &'a Alg,
        salt: Option<&'a [u8]>,
    },
    /// All zeros (a plain write to a device whose tags are the caller's).
    Zero,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sec {
    Free,
    /// Taking writes.
    Open,
    /// Full (or closed by a commit), not yet committed.
    Closed,
    /// Being written to the journal.
    Committing,
    /// In the journal on disk, not yet in place.
    Committed,
    /// Being copied to its places.
    Placing,
}

/// The index's hasher: one multiply by a per-device random odd key and a
/// fold of the high half. The index is updated for every block written,
/// and SipHash showed in profiles; the random key keeps a client from
/// choosing sectors that collide (which would only slow its own device).
#[derive(Clone, Copy)]
struct SectorHash(u64);

impl BuildHasher for SectorHash {
    type Hasher = SectorHasher;
    fn build_hasher(&self) -> SectorHasher {
        SectorHasher(self.0, 0)
    }
}

struct SectorHasher(u64, u64);

impl Hasher for SectorHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        let m = (x ^ self.1).wrapping_mul(self.0);
        self.1 = m ^ (m >> 32);
    }
    fn finish(&self) -> u64 {
        self.1
    }
}

/// A key for [`SectorHash`], from the standard library's random seed.
fn sector_hash() -> SectorHash {
    SectorHash(std::collections::hash_map::RandomState::new().hash_one(0u64) | 1)
}

struct Ring {
    state: Vec<Sec>,
    /// Entries in each section.
    used: Vec<u64>,
    seqs: Vec<u8>,
    /// The next section to open and the sequence number of its lap.
    next: u64,
    seq: u8,
    open: Option<u64>,
    /// The oldest section not committed / not free, in ring order.
    commit_from: u64,
    place_from: u64,
    /// Where the newest entry of each sector still in the journal is:
    /// section × `section_entries` + entry. Its capacity is the journal's
    /// entries, so it never grows after open.
    newest: HashMap<u64, u32, SectorHash>,
    /// Sections closed or beyond, and closed ones (kept as counts: the
    /// watermark is checked at every section a write fills).
    full: u64,
    closed: u64,
    /// Placement batches whose sections were freed: a read whose two
    /// looks at the index saw none freed in between missed no entry.
    freed: u64,
    /// Entries appended and committed since open (commits are in order).
    appended: u64,
    committed: u64,
    /// When the oldest uncommitted entry was appended.
    since: Option<Instant>,
    /// Writes waiting for a free section.
    waiting: usize,
    stop: bool,
    /// A commit went to the journal since open.
    wrote: bool,
    failed: Option<String>,
}

impl Ring {
    fn n(&self) -> u64 {
        self.state.len() as u64
    }

    fn check(&self) -> DevResult<()> {
        match &self.failed {
            Some(e) => Err(DevError::Target(format!(
                "integrity: the journal failed earlier ({e}); the device is out of service \
                 until it is reopened"
            ))),
            None => Ok(()),
        }
    }

    /// Moves section `i` to state `s`, keeping the counts.
    fn set(&mut self, i: u64, s: Sec) {
        let counted = |s: Sec| !matches!(s, Sec::Free | Sec::Open);
        let old = std::mem::replace(&mut self.state[i as usize], s);
        self.full = self.full + u64::from(counted(s)) - u64::from(counted(old));
        self.closed = self.closed + u64::from(s == Sec::Closed) - u64::from(old == Sec::Closed);
    }

    /// The section the next entry goes to, opening the next one when the
    /// open one is full (then `true`: it must be cleared before use);
    /// `None` while that one is not free yet.
    fn slot(&mut self, per: u64) -> Option<(u64, bool)> {
        if let Some(o) = self.open {
            if self.used[o as usize] < per {
                return Some((o, false));
            }
            self.set(o, Sec::Closed);
            self.open = None;
        }
        let i = self.next;
        if self.state[i as usize] != Sec::Free {
            return None;
        }
        self.set(i, Sec::Open);
        self.seqs[i as usize] = self.seq;
        self.used[i as usize] = 0;
        self.open = Some(i);
        self.next = (self.next + 1) % self.n();
        if self.next == 0 {
            self.seq = journal::next_seq(self.seq);
        }
        Some((i, true))
    }

    /// Whether the journal is filled to the watermark (percent).
    fn over(&self, watermark: u32) -> bool {
        self.full > 0 && self.full * 100 >= self.n() * u64::from(watermark)
    }

    fn uncommitted_open(&self) -> bool {
        self.open.is_some_and(|o| self.used[o as usize] > 0)
    }
}

/// The writer thread's buffers, kept from batch to batch.
#[derive(Default)]
struct PlaceScratch {
    /// Sections of the batch, in ring order, and their entries.
    taken: Vec<(u64, u64)>,
    /// (sector, position in the batch) of each entry, then only the newest
    /// of each sector, sorted by sector.
    list: Vec<(u64, u32)>,
    tags: Vec<u8>,
}

/// State shared by requests and the writer thread.
struct Shared {
    /// The data device.
    dev: Arc<dyn BlockDevice>,
    /// The device of the journal and the tags (`dev` unless separate).
    meta: Arc<dyn BlockDevice>,
    g: Geometry,
    name: String,
    seal: Option<Arc<Seal>>,
    watermark: u32,
    commit_time: Option<Duration>,
    ring: Mutex<Ring>,
    /// The journal in memory, a section each, in the on-disk format (but
    /// not sealed; a commit seals a copy): the journal write is these
    /// bytes, and placement writes the data from here too, so a block is
    /// copied once, into its section. Writes change a section only while
    /// it is open, holding the ring's lock, under which reads of it look
    /// too; from closed until free a section is only read, but for its
    /// data's last bytes put back once when placement takes it. Lock
    /// order: ring, then a section.
    sections: Vec<RwLock<Box<[u8]>>>,
    cv: Condvar,
    /// Held by the one commit in progress, with its list of sections.
    commit_lock: Mutex<Vec<u64>>,
    /// Held while entries are written to their places.
    place_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// The J-mode journal of one open device and its writer thread.
pub struct Writeback {
    sh: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// How a journal is run, from the table line.
pub struct Config {
    pub name: String,
    /// Percent of the journal filled that starts a commit and writeback.
    pub watermark: u32,
    /// Milliseconds; 0: no timed commits.
    pub commit_time_ms: u32,
    /// `journal_crypt`/`journal_mac`.
    pub seal: Option<Arc<Seal>>,
    /// Replay at open placed entries: the journal is emptied at close.
    pub replayed: bool,
    /// The device the writer thread fails when it panics (`core::fault`).
    pub fault: Option<Arc<crate::core::Fault>>,
}

impl Writeback {
    /// Starts the journal where replay left it: section `next` is the
    /// next to fill, with sequence number `seq`. `devs` are the data
    /// device and the device of the journal and tags (the same one
    /// unless `g` is separate).
    pub fn start(
        devs: (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>),
        g: Geometry,
        next: u64,
        seq: u8,
        cfg: Config,
    ) -> DevResult<Writeback> {
        let n = g.journal_sections as usize;
        let ss = (g.section_sectors * 512) as usize;
        let entries = n * g.section_entries as usize;
        if u32::try_from(entries).is_err() {
            return Err(DevError::Target(format!(
                "integrity {}: a journal of {entries} entries is more than udm indexes",
                cfg.name
            )));
        }
        let (dev, meta) = devs;
        let sh = Arc::new(Shared {
            dev,
            meta,
            name: cfg.name,
            seal: cfg.seal,
            watermark: cfg.watermark.min(100),
            commit_time: (cfg.commit_time_ms > 0)
                .then(|| Duration::from_millis(u64::from(cfg.commit_time_ms))),
            ring: Mutex::new(Ring {
                state: vec![Sec::Free; n],
                used: vec![0; n],
                seqs: vec![0; n],
                next: next % g.journal_sections,
                seq,
                open: None,
                commit_from: next % g.journal_sections,
                place_from: next % g.journal_sections,
                newest: HashMap::with_capacity_and_hasher(entries, sector_hash()),
                full: 0,
                closed: 0,
                freed: 0,
                appended: 0,
                committed: 0,
                since: None,
                waiting: 0,
                stop: false,
                wrote: cfg.replayed,
                failed: None,
            }),
            sections: (0..n)
                .map(|_| RwLock::new(vec![0u8; ss].into_boxed_slice()))
                .collect(),
            g,
            cv: Condvar::new(),
            commit_lock: Mutex::new(Vec::with_capacity(n)),
            place_lock: Mutex::new(()),
        });
        let w = sh.clone();
        let thread =
            crate::core::fault::spawn_job("udm-integrity".into(), cfg.fault.clone(), move || {
                w.run()
            })
            .map_err(DevError::Io)?;
        Ok(Writeback {
            sh,
            thread: Some(thread),
        })
    }

    /// Copies whole blocks from logical sector `s0` into the journal, with
    /// their tags; with `fua`, commits them before returning. Waits only
    /// while the journal has no free section.
    pub fn write(&self, s0: u64, data: &[u8], tags: Tags<'_>, fua: bool) -> DevResult<()> {
        let g = &self.sh.g;
        let (bb, ts) = (g.block_bytes(), g.tag_size as usize);
        let step = (TAG_STEP / ts.max(1)).max(1);
        let mut tbuf = [0u8; TAG_STEP];
        let mut upto = 0;
        for (c, d) in data.chunks(step * bb).enumerate() {
            let s = s0 + (((c * step) as u64) << g.log2_spb);
            let n = d.len() / bb * ts;
            let t = match tags {
                Tags::Given(t) => &t[c * step * ts..][..n],
                Tags::Hash { alg, salt } => {
                    let blocks = d.chunks(bb).zip(tbuf[..n].chunks_mut(ts.max(1)));
                    for (k, (blk, out)) in blocks.enumerate() {
                        alg.tag(salt, s + ((k as u64) << g.log2_spb), blk, out);
                    }
                    &tbuf[..n]
                }
                Tags::Zero => &tbuf[..n],
            };
            upto = self.sh.append(s, d, t)?;
        }
        if fua {
            self.sh.commit(upto, true)?;
        }
        Ok(())
    }

    /// Commits every write acknowledged so far (a FLUSH).
    pub fn flush(&self) -> DevResult<()> {
        let upto = lock(&self.sh.ring).appended;
        self.sh.commit(upto, true)
    }

    /// Runs `f` while no entry is being written to its place, so `f` can
    /// write tags and data around the journal (recalculation, discards)
    /// without racing the writer's read-modify-write of tag blocks. With
    /// `drain`, every write acknowledged before the call is in its place
    /// first, so none of them lands later over what `f` writes.
    pub fn exclusive<R>(&self, drain: bool, f: impl FnOnce() -> DevResult<R>) -> DevResult<R> {
        if drain {
            self.drain()?;
        }
        let _p = lock(&self.sh.place_lock);
        lock(&self.sh.ring).check()?;
        f()
    }

    /// Commits every write acknowledged so far and waits until the
    /// sections committed then are placed.
    fn drain(&self) -> DevResult<()> {
        self.flush()?;
        let sh = &*self.sh;
        let mut r = lock(&sh.ring);
        let busy = |r: &Ring, i: usize| matches!(r.state[i], Sec::Committed | Sec::Placing);
        let pending: Vec<usize> = (0..r.state.len()).filter(|&i| busy(&r, i)).collect();
        while pending.iter().any(|&i| busy(&r, i)) {
            r.check()?;
            // Counted as a waiting write: the writer places at once.
            r.waiting += 1;
            sh.cv.notify_all();
            r = sh.cv.wait(r).unwrap_or_else(|e| e.into_inner());
            r.waiting -= 1;
        }
        r.check()
    }

    /// Reads whole blocks at logical sector `s0`: `raw` reads their places,
    /// then entries still in the journal replace what it read. Returns,
    /// per block, whether it came from the journal (its tag is ours, no
    /// need to check it).
    pub fn read(
        &self,
        s0: u64,
        buf: &mut [u8],
        tags: &mut [u8],
        raw: RawRead<'_>,
    ) -> DevResult<Vec<bool>> {
        let sh = &*self.sh;
        let g = &sh.g;
        let blocks = buf.len() / g.block_bytes();
        let sector = |k: usize| s0 + ((k as u64) << g.log2_spb);
        let mut attempt = 0;
        loop {
            // After two reads that raced with placement, wait one out.
            let _p = (attempt >= 2).then(|| lock(&sh.place_lock));
            let (freed, all) = {
                let r = lock(&sh.ring);
                let all =
                    !r.newest.is_empty() && (0..blocks).all(|k| r.newest.contains_key(&sector(k)));
                (r.freed, all)
            };
            if !all {
                raw(buf, tags)?;
            }
            let r = lock(&sh.ring);
            // Entries freed while the places were read may have been
            // half-written there then, and are gone from the index now:
            // read again. Holding the place lock, a batch freed in between
            // was in place before the read began, unless nothing was read.
            if r.freed != freed && (attempt < 2 || all) {
                attempt += 1;
                continue;
            }
            return Ok(sh.overlay(&r, s0, buf, tags));
        }
    }

    /// Commits and places everything, stops the writer, and rewrites the
    /// journal empty (the kernel's `postsuspend`), so the next open has
    /// nothing to replay.
    pub fn close(mut self) -> DevResult<()> {
        self.stop_thread();
        let sh = &*self.sh;
        let r = lock(&sh.ring);
        r.check()?;
        if !r.wrote {
            return Ok(());
        }
        let g = &sh.g;
        let ids = sh.ids();
        let mut buf = vec![0u8; (g.section_sectors * 512) as usize];
        for i in 0..g.journal_sections {
            let s = if i >= r.next {
                r.seq
            } else {
                journal::next_seq(r.seq)
            };
            journal::fill_section_in(g, ids, &mut buf, i, s, &[]);
            if let Some(seal) = &sh.seal {
                seal.seal(g, i, &mut buf);
            }
            let at = g.journal_sector(i, 0) * 512;
            sh.meta.write(at, WriteBuf::Borrowed(&buf), false)?;
        }
        sh.meta.flush()
    }

    fn stop_thread(&mut self) {
        lock(&self.sh.ring).stop = true;
        self.sh.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

impl Shared {
    fn ids(&self) -> &journal::Ids {
        self.seal.as_ref().map_or(&journal::KERNEL_IDS, |s| s.ids())
    }

    fn per(&self) -> u64 {
        self.g.section_entries
    }

    /// Copies whole blocks from sector `s0` and their tags into the open
    /// section, opening sections as they fill; returns the count of
    /// entries appended so far, which a FUA commits.
    fn append(&self, s0: u64, data: &[u8], tags: &[u8]) -> DevResult<u64> {
        let g = &self.g;
        let (bb, ts, per) = (g.block_bytes(), g.tag_size as usize, self.per());
        let blocks = data.len() / bb;
        let mut r = lock(&self.ring);
        let mut opened = false;
        let mut k = 0;
        while k < blocks {
            let (i, fresh) = loop {
                r.check()?;
                if let Some(s) = r.slot(per) {
                    break s;
                }
                r.waiting += 1;
                self.cv.notify_all();
                r = self.cv.wait(r).unwrap_or_else(|e| e.into_inner());
                r.waiting -= 1;
            };
            opened |= fresh;
            let seq = r.seqs[i as usize];
            let mut sec = write(&self.sections[i as usize]);
            if fresh {
                journal::open_section(g, self.ids(), &mut sec, i, seq);
            }
            while k < blocks && r.used[i as usize] < per {
                let n = r.used[i as usize];
                let b = Block {
                    sector: s0 + ((k as u64) << g.log2_spb),
                    data: &data[k * bb..(k + 1) * bb],
                    tag: &tags[k * ts..(k + 1) * ts],
                };
                journal::put_block(g, self.ids(), &mut sec, (i, seq), n, &b);
                r.newest.insert(b.sector, (i * per + n) as u32);
                r.used[i as usize] += 1;
                r.appended += 1;
                k += 1;
            }
        }
        // The writer sleeps until there is something for it: the first
        // uncommitted entry (for commit_time), or a section closed with
        // the journal at the watermark; not at every write (a wake-up is
        // a system call).
        if r.since.is_none() || (opened && r.over(self.watermark)) {
            r.since.get_or_insert_with(Instant::now);
            self.cv.notify_all();
        }
        Ok(r.appended)
    }

    /// The journal's copies of the blocks of `buf` from sector `s0`
    /// that it has, over what `buf` and `tags` hold; per block, whether it
    /// came from the journal.
    fn overlay(&self, r: &Ring, s0: u64, buf: &mut [u8], tags: &mut [u8]) -> Vec<bool> {
        let g = &self.g;
        let (bb, ts, per) = (g.block_bytes(), g.tag_size as usize, self.per());
        let mut from = vec![false; buf.len() / bb];
        if r.newest.is_empty() {
            return from;
        }
        let blocks = buf.chunks_mut(bb).zip(tags.chunks_mut(ts.max(1)));
        for (k, (d, t)) in blocks.enumerate() {
            let Some(&at) = r.newest.get(&(s0 + ((k as u64) << g.log2_spb))) else {
                continue;
            };
            let (i, n) = (u64::from(at) / per, u64::from(at) % per);
            let sec = read(&self.sections[i as usize]);
            journal::read_block(g, &sec, n, d, &mut t[..ts]);
            from[k] = true;
        }
        from
    }

    /// Makes every entry appended before `upto` durable in the journal;
    /// `close_open` also takes the section being filled (a FLUSH), else
    /// only full ones go (the watermark).
    fn commit(&self, upto: u64, close_open: bool) -> DevResult<()> {
        let mut secs = lock(&self.commit_lock);
        let n = self.g.journal_sections;
        let target = {
            let mut r = lock(&self.ring);
            r.check()?;
            if r.committed >= upto {
                return Ok(());
            }
            let mut target = r.appended;
            match r.open {
                Some(o) if close_open && r.used[o as usize] > 0 => {
                    let at = (o, r.seqs[o as usize]);
                    let mut sec = write(&self.sections[o as usize]);
                    journal::close_section(&self.g, self.ids(), &mut sec, at, r.used[o as usize]);
                    r.set(o, Sec::Closed);
                    r.open = None;
                }
                Some(o) => target -= r.used[o as usize],
                None => {}
            }
            secs.clear();
            let mut i = r.commit_from;
            while r.state[i as usize] == Sec::Closed {
                r.set(i, Sec::Committing);
                secs.push(i);
                i = (i + 1) % n;
            }
            r.commit_from = i;
            if target == r.appended {
                r.since = None;
            }
            target
        };
        let res = self.write_sections(&secs).and_then(|()| self.meta.flush());
        let mut r = lock(&self.ring);
        if let Err(e) = res {
            tracing::error!("integrity {}: journal commit failed: {e}", self.name);
            r.failed = Some(e.to_string());
            self.cv.notify_all();
            return Err(e);
        }
        for &i in secs.iter() {
            r.set(i, Sec::Committed);
        }
        r.committed = r.committed.max(target);
        r.wrote |= !secs.is_empty();
        self.cv.notify_all();
        Ok(())
    }

    /// Sections, consecutive in ring order, written to the journal from
    /// memory: one write per contiguous run; sealed ones one by one
    /// through a copy.
    fn write_sections(&self, secs: &[u64]) -> DevResult<()> {
        let g = &self.g;
        if let Some(seal) = &self.seal {
            let mut buf = vec![0u8; (g.section_sectors * 512) as usize];
            for &i in secs {
                buf.copy_from_slice(&read(&self.sections[i as usize]));
                seal.seal(g, i, &mut buf);
                let at = g.journal_sector(i, 0) * 512;
                self.meta.write(at, WriteBuf::Owned(&mut buf), false)?;
            }
            return Ok(());
        }
        let mut k = 0;
        while k < secs.len() {
            let first = secs[k];
            let run = secs[k..]
                .iter()
                .enumerate()
                .take_while(|(m, &s)| s == first + *m as u64)
                .count();
            let held: Vec<_> = secs[k..k + run]
                .iter()
                .map(|&i| read(&self.sections[i as usize]))
                .collect();
            let iov: Vec<IoSlice<'_>> = held.iter().map(|b| IoSlice::new(b)).collect();
            let at = g.journal_sector(first, 0) * 512;
            self.meta.write_vectored(at, &iov, false)?;
            k += run;
        }
        Ok(())
    }

    /// The writer thread: commits at the watermark and after
    /// `commit_time`, places committed sections past the watermark (or
    /// when a write waits for a section, or at close), until stopped with
    /// nothing left.
    fn run(self: Arc<Self>) {
        let mut ps = PlaceScratch::default();
        let mut r = lock(&self.ring);
        loop {
            if r.failed.is_some() {
                return;
            }
            let pressed = r.over(self.watermark) || r.waiting > 0 || r.stop;
            let timed =
                matches!((r.since, self.commit_time), (Some(t), Some(c)) if t.elapsed() >= c);
            if timed || (r.stop && r.appended > r.committed) || (pressed && r.closed > 0) {
                let (upto, close_open) = (r.appended, timed || r.stop);
                drop(r);
                // An error is kept in the ring and fails later requests.
                let _ = self.commit(upto, close_open);
                r = lock(&self.ring);
                continue;
            }
            if pressed && r.state[r.place_from as usize] == Sec::Committed {
                r = self.place_batch(r, &mut ps);
                continue;
            }
            if r.stop && r.full == 0 && !r.uncommitted_open() {
                return;
            }
            let wait = match (r.since, self.commit_time) {
                (Some(t), Some(c)) => c.saturating_sub(t.elapsed()),
                _ => Duration::from_secs(1),
            };
            r = self
                .cv
                .wait_timeout(r, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Places the committed sections from the oldest on, makes them
    /// durable and frees them.
    fn place_batch<'a>(
        &'a self,
        mut r: MutexGuard<'a, Ring>,
        ps: &mut PlaceScratch,
    ) -> MutexGuard<'a, Ring> {
        let n = r.n();
        ps.taken.clear();
        let mut i = r.place_from;
        while r.state[i as usize] == Sec::Committed && (ps.taken.len() as u64) < n {
            r.set(i, Sec::Placing);
            ps.taken.push((i, r.used[i as usize]));
            i = (i + 1) % n;
        }
        drop(r);
        self.newest_of_batch(ps);
        let res = {
            let _p = lock(&self.place_lock);
            let held: Vec<_> = ps
                .taken
                .iter()
                .map(|&(i, _)| read(&self.sections[i as usize]))
                .collect();
            self.place(&ps.list, &held, &mut ps.tags)
                .and_then(|()| io::flush_both(&*self.dev, &*self.meta, &self.g))
        };
        let mut r = lock(&self.ring);
        if let Err(e) = res {
            tracing::error!(
                "integrity {}: writing journal entries to their places failed: {e}",
                self.name
            );
            r.failed = Some(e.to_string());
            self.cv.notify_all();
            return r;
        }
        let per = self.per();
        for &(s, _) in &ps.taken {
            r.set(s, Sec::Free);
        }
        r.place_from = i;
        r.freed += 1;
        for &(sector, pos) in &ps.list {
            let (p, e) = (u64::from(pos) / per, u64::from(pos) % per);
            let at = (ps.taken[p as usize].0 * per + e) as u32;
            if r.newest.get(&sector) == Some(&at) {
                r.newest.remove(&sector);
            }
        }
        self.cv.notify_all();
        r
    }

    /// Puts back the data's last bytes in the sections of the batch, and
    /// lists the newest entry of each sector in it, sorted by sector.
    fn newest_of_batch(&self, ps: &mut PlaceScratch) {
        let g = &self.g;
        ps.list.clear();
        for (p, &(i, used)) in ps.taken.iter().enumerate() {
            let mut sec = write(&self.sections[i as usize]);
            for e in 0..used {
                journal::restore_block(g, &mut sec, e);
                let pos = (p as u64 * self.per() + e) as u32;
                ps.list.push((journal::sector_of(g, &sec, e), pos));
            }
        }
        // Newest first within a sector, then keep the first.
        ps.list
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        ps.list.dedup_by_key(|e| e.0);
    }

    /// Writes the entries of `list` (the newest of each sector, sorted by
    /// sector; positions in `held`, the batch's sections) to their
    /// places straight from the sections: runs of neighbouring blocks as
    /// one write, and each tag block once.
    fn place(
        &self,
        list: &[(u64, u32)],
        held: &[RwLockReadGuard<'_, Box<[u8]>>],
        tags: &mut Vec<u8>,
    ) -> DevResult<()> {
        let g = &self.g;
        let per = self.per();
        let spb = g.sectors_per_block();
        let at = |pos: u32| (u64::from(pos) / per, u64::from(pos) % per);
        let mut iov: Vec<IoSlice<'_>> = Vec::new();
        let mut k = 0;
        while k < list.len() {
            let first = list[k].0;
            let area = g.area(first);
            let run = list[k..]
                .iter()
                .enumerate()
                .take_while(|(m, e)| e.0 == first + *m as u64 * spb && g.area(e.0) == area)
                .count();
            iov.clear();
            // Blocks next to each other in a section too go as one slice.
            let mut span: Option<(u64, std::ops::Range<usize>)> = None;
            for &(_, pos) in &list[k..k + run] {
                let (p, e) = at(pos);
                let r = journal::data_range(g, e);
                span = match span {
                    Some((q, s)) if q == p && s.end == r.start => Some((q, s.start..r.end)),
                    Some((q, s)) => {
                        iov.push(IoSlice::new(&held[q as usize][s]));
                        Some((p, r))
                    }
                    None => Some((p, r)),
                };
            }
            if let Some((q, s)) = span {
                iov.push(IoSlice::new(&held[q as usize][s]));
            }
            self.dev
                .write_vectored(g.data_sector(first) * 512, &iov, false)?;
            k += run;
        }
        self.place_tags(list, held, tags)
    }

    /// The tags of `list` (sorted by sector): each tag block they touch
    /// read once and written once, neighbouring blocks together.
    fn place_tags(
        &self,
        list: &[(u64, u32)],
        held: &[RwLockReadGuard<'_, Box<[u8]>>],
        buf: &mut Vec<u8>,
    ) -> DevResult<()> {
        let g = &self.g;
        let ts = g.tag_size;
        let per = self.per();
        let lbs = u64::from(self.meta.limits().logical_block_size.max(512));
        let unit = TAG_BLOCK.max(lbs);
        let mut k = 0;
        while k < list.len() {
            let lo = g.tag_byte(list[k].0) / unit * unit;
            let mut hi = (g.tag_byte(list[k].0) + ts).div_ceil(unit) * unit;
            let mut m = k + 1;
            while m < list.len() {
                let b = g.tag_byte(list[m].0);
                // The tags of one area are contiguous; the next entry's
                // tag block joins this run if it is this or the next one.
                if b < lo || b > hi + unit {
                    break;
                }
                hi = hi.max((b + ts).div_ceil(unit) * unit);
                m += 1;
            }
            buf.clear();
            buf.resize((hi - lo) as usize, 0);
            self.meta.read(lo, buf)?;
            for &(sector, pos) in &list[k..m] {
                let at = (g.tag_byte(sector) - lo) as usize;
                let (p, e) = (u64::from(pos) / per, u64::from(pos) % per);
                buf[at..at + ts as usize].copy_from_slice(journal::tag_of(g, &held[p as usize], e));
            }
            self.meta.write(lo, WriteBuf::Owned(buf), false)?;
            k = m;
        }
        Ok(())
    }
}
