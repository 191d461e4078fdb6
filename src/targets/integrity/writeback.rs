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

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::io;
use super::journal::{self, Block};
use super::layout::Geometry;
use super::seal::Seal;
use crate::core::{BlockDevice, DevError, DevResult, WriteBuf};

/// The kernel's `DEFAULT_JOURNAL_WATERMARK` (percent).
pub const DEFAULT_WATERMARK: u32 = 50;
/// The kernel's `DEFAULT_COMMIT_TIME` (milliseconds).
pub const DEFAULT_COMMIT_TIME_MS: u32 = 10_000;
/// Bytes of tags read and written as one unit when placing entries.
const TAG_BLOCK: u64 = 4096;

/// Reads data and tags of a request's blocks from their places.
pub type RawRead<'a> = &'a dyn Fn(&mut [u8], &mut [u8]) -> DevResult<()>;

/// One block in the journal.
pub struct Entry {
    pub sector: u64,
    pub data: Box<[u8]>,
    pub tag: Box<[u8]>,
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

struct Ring {
    state: Vec<Sec>,
    entries: Vec<Vec<Arc<Entry>>>,
    seqs: Vec<u8>,
    /// The next section to open and the sequence number of its lap.
    next: u64,
    seq: u8,
    open: Option<u64>,
    /// The oldest section not committed / not free, in ring order.
    commit_from: u64,
    place_from: u64,
    /// The newest entry of each sector still in the journal.
    newest: HashMap<u64, Arc<Entry>>,
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

    /// The section the next entry goes to, opening the next one when the
    /// open one is full; `None` while that one is not free yet.
    fn slot(&mut self, per: usize) -> Option<usize> {
        if let Some(o) = self.open {
            if self.entries[o as usize].len() < per {
                return Some(o as usize);
            }
            self.state[o as usize] = Sec::Closed;
            self.open = None;
        }
        let i = self.next as usize;
        if self.state[i] != Sec::Free {
            return None;
        }
        self.state[i] = Sec::Open;
        self.seqs[i] = self.seq;
        self.entries[i].clear();
        self.open = Some(i as u64);
        self.next = (self.next + 1) % self.n();
        if self.next == 0 {
            self.seq = journal::next_seq(self.seq);
        }
        Some(i)
    }

    /// Sections holding entries that are closed or beyond.
    fn full(&self) -> u64 {
        self.state
            .iter()
            .filter(|s| !matches!(s, Sec::Free | Sec::Open))
            .count() as u64
    }

    fn uncommitted_open(&self) -> bool {
        self.open
            .is_some_and(|o| !self.entries[o as usize].is_empty())
    }
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
    cv: Condvar,
    /// Held by the one commit in progress.
    commit_lock: Mutex<()>,
    /// Held while entries are written to their places.
    place_lock: Mutex<()>,
    /// Placement batches started; a read that saw none start while it
    /// read the places saw no half-placed entry.
    batches: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
                entries: vec![Vec::new(); n],
                seqs: vec![0; n],
                next: next % g.journal_sections,
                seq,
                open: None,
                commit_from: next % g.journal_sections,
                place_from: next % g.journal_sections,
                newest: HashMap::new(),
                appended: 0,
                committed: 0,
                since: None,
                waiting: 0,
                stop: false,
                wrote: cfg.replayed,
                failed: None,
            }),
            g,
            cv: Condvar::new(),
            commit_lock: Mutex::new(()),
            place_lock: Mutex::new(()),
            batches: AtomicU64::new(0),
        });
        let w = sh.clone();
        let thread = std::thread::Builder::new()
            .name("udm-integrity".into())
            .spawn(move || w.run())
            .map_err(DevError::Io)?;
        Ok(Writeback {
            sh,
            thread: Some(thread),
        })
    }

    /// Copies whole blocks from logical sector `s0` into the journal;
    /// with `fua`, commits them before returning.
    pub fn write(&self, s0: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        let sh = &*self.sh;
        let g = &sh.g;
        let (bb, ts) = (g.block_bytes(), g.tag_size as usize);
        let per = g.section_entries as usize;
        let new: Vec<Arc<Entry>> = data
            .chunks(bb)
            .zip(tags.chunks(ts))
            .enumerate()
            .map(|(k, (d, t))| {
                Arc::new(Entry {
                    sector: s0 + ((k as u64) << g.log2_spb),
                    data: d.into(),
                    tag: t.into(),
                })
            })
            .collect();
        let mut r = lock(&sh.ring);
        for e in new {
            let i = loop {
                r.check()?;
                if let Some(i) = r.slot(per) {
                    break i;
                }
                r.waiting += 1;
                sh.cv.notify_all();
                r = sh.cv.wait(r).unwrap_or_else(|e| e.into_inner());
                r.waiting -= 1;
            };
            r.newest.insert(e.sector, e.clone());
            r.entries[i].push(e);
            r.appended += 1;
            if r.since.is_none() {
                r.since = Some(Instant::now());
                sh.cv.notify_all();
            }
        }
        let upto = r.appended;
        if r.full() * 100 >= r.n() * u64::from(sh.watermark) && r.full() > 0 {
            sh.cv.notify_all();
        }
        drop(r);
        if fua {
            sh.commit(upto, true)?;
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
        let (bb, ts) = (g.block_bytes(), g.tag_size as usize);
        let blocks = buf.len() / bb;
        let mut attempt = 0;
        loop {
            // After two reads that raced with placement, wait one out.
            let _p = (attempt >= 2).then(|| lock(&sh.place_lock));
            let (b0, hits) = {
                let r = lock(&sh.ring);
                let b0 = sh.batches.load(Ordering::Acquire);
                let hits: Vec<(usize, Arc<Entry>)> = if r.newest.is_empty() {
                    Vec::new()
                } else {
                    (0..blocks)
                        .filter_map(|k| {
                            let s = s0 + ((k as u64) << g.log2_spb);
                            r.newest.get(&s).map(|e| (k, e.clone()))
                        })
                        .collect()
                };
                (b0, hits)
            };
            if hits.len() < blocks {
                raw(buf, tags)?;
                if attempt < 2 && sh.batches.load(Ordering::Acquire) != b0 {
                    attempt += 1;
                    continue;
                }
            }
            let mut from_journal = vec![false; blocks];
            for (k, e) in hits {
                buf[k * bb..(k + 1) * bb].copy_from_slice(&e.data);
                tags[k * ts..(k + 1) * ts].copy_from_slice(&e.tag);
                from_journal[k] = true;
            }
            return Ok(from_journal);
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

    /// Makes every entry appended before `upto` durable in the journal;
    /// `close_open` also takes the section being filled (a FLUSH), else
    /// only full ones go (the watermark).
    fn commit(&self, upto: u64, close_open: bool) -> DevResult<()> {
        let _c = lock(&self.commit_lock);
        let n = self.g.journal_sections;
        let (secs, target) = {
            let mut r = lock(&self.ring);
            r.check()?;
            if r.committed >= upto {
                return Ok(());
            }
            let mut target = r.appended;
            match r.open {
                Some(o) if close_open && !r.entries[o as usize].is_empty() => {
                    r.state[o as usize] = Sec::Closed;
                    r.open = None;
                }
                Some(o) => target -= r.entries[o as usize].len() as u64,
                None => {}
            }
            let mut secs = Vec::new();
            let mut i = r.commit_from;
            while r.state[i as usize] == Sec::Closed {
                r.state[i as usize] = Sec::Committing;
                secs.push((i, r.seqs[i as usize], r.entries[i as usize].clone()));
                i = (i + 1) % n;
            }
            r.commit_from = i;
            if target == r.appended {
                r.since = None;
            }
            (secs, target)
        };
        let res = self.write_sections(&secs).and_then(|()| self.meta.flush());
        let mut r = lock(&self.ring);
        if let Err(e) = res {
            tracing::error!("integrity {}: journal commit failed: {e}", self.name);
            r.failed = Some(e.to_string());
            self.cv.notify_all();
            return Err(e);
        }
        for (i, _, _) in &secs {
            r.state[*i as usize] = Sec::Committed;
        }
        r.committed = r.committed.max(target);
        r.wrote |= !secs.is_empty();
        self.cv.notify_all();
        Ok(())
    }

    /// Sections (number, sequence number, entries), consecutive in ring
    /// order, written to the journal: one write per contiguous run.
    fn write_sections(&self, secs: &[(u64, u8, Vec<Arc<Entry>>)]) -> DevResult<()> {
        let g = &self.g;
        let ss = (g.section_sectors * 512) as usize;
        let mut k = 0;
        while k < secs.len() {
            let first = secs[k].0;
            let run = secs[k..]
                .iter()
                .enumerate()
                .take_while(|(m, s)| s.0 == first + *m as u64)
                .count();
            let mut buf = vec![0u8; run * ss];
            for (chunk, (i, seq, entries)) in buf.chunks_mut(ss).zip(&secs[k..k + run]) {
                let blocks: Vec<Block<'_>> = entries
                    .iter()
                    .map(|e| Block {
                        sector: e.sector,
                        data: &e.data,
                        tag: &e.tag,
                    })
                    .collect();
                journal::fill_section_in(g, self.ids(), chunk, *i, *seq, &blocks);
                if let Some(seal) = &self.seal {
                    seal.seal(g, *i, chunk);
                }
            }
            let at = g.journal_sector(first, 0) * 512;
            self.meta.write(at, WriteBuf::Owned(&mut buf), false)?;
            k += run;
        }
        Ok(())
    }

    /// The writer thread: commits at the watermark and after
    /// `commit_time`, places committed sections past the watermark (or
    /// when a write waits for a section, or at close), until stopped with
    /// nothing left.
    fn run(self: Arc<Self>) {
        let mut r = lock(&self.ring);
        loop {
            if r.failed.is_some() {
                return;
            }
            let pressed = r.full() * 100 >= r.n() * u64::from(self.watermark) && r.full() > 0
                || r.waiting > 0
                || r.stop;
            let timed =
                matches!((r.since, self.commit_time), (Some(t), Some(c)) if t.elapsed() >= c);
            let closed = r.state.contains(&Sec::Closed);
            if timed || (r.stop && r.appended > r.committed) || (pressed && closed) {
                let (upto, close_open) = (r.appended, timed || r.stop);
                drop(r);
                // An error is kept in the ring and fails later requests.
                let _ = self.commit(upto, close_open);
                r = lock(&self.ring);
                continue;
            }
            if pressed && r.state[r.place_from as usize] == Sec::Committed {
                r = self.place_batch(r);
                continue;
            }
            if r.stop && r.full() == 0 && !r.uncommitted_open() {
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
    fn place_batch<'a>(&'a self, mut r: MutexGuard<'a, Ring>) -> MutexGuard<'a, Ring> {
        let n = r.n();
        let mut taken = Vec::new();
        let mut entries = Vec::new();
        let mut i = r.place_from;
        while r.state[i as usize] == Sec::Committed && (taken.len() as u64) < n {
            r.state[i as usize] = Sec::Placing;
            entries.extend(r.entries[i as usize].iter().cloned());
            taken.push(i);
            i = (i + 1) % n;
        }
        self.batches.fetch_add(1, Ordering::AcqRel);
        drop(r);
        let res = {
            let _p = lock(&self.place_lock);
            self.place(&entries)
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
        for &s in &taken {
            r.state[s as usize] = Sec::Free;
            r.entries[s as usize].clear();
        }
        r.place_from = i;
        for e in &entries {
            if r.newest.get(&e.sector).is_some_and(|x| Arc::ptr_eq(x, e)) {
                r.newest.remove(&e.sector);
            }
        }
        self.cv.notify_all();
        r
    }

    /// Writes the newest of `entries` for each sector to its place: runs
    /// of neighbouring blocks as one write, and each tag block once.
    fn place(&self, entries: &[Arc<Entry>]) -> DevResult<()> {
        let g = &self.g;
        let mut newest: BTreeMap<u64, &Entry> = BTreeMap::new();
        for e in entries {
            newest.insert(e.sector, e);
        }
        let list: Vec<&Entry> = newest.into_values().collect();
        let spb = g.sectors_per_block();
        let mut k = 0;
        while k < list.len() {
            let area = g.area(list[k].sector);
            let run = list[k..]
                .iter()
                .enumerate()
                .take_while(|(m, e)| {
                    e.sector == list[k].sector + *m as u64 * spb && g.area(e.sector) == area
                })
                .count();
            let mut buf: Vec<u8> = Vec::with_capacity(run * g.block_bytes());
            for e in &list[k..k + run] {
                buf.extend_from_slice(&e.data);
            }
            let at = g.data_sector(list[k].sector) * 512;
            self.dev.write(at, WriteBuf::Owned(&mut buf), false)?;
            k += run;
        }
        self.place_tags(&list)
    }

    /// The tags of `list` (sorted by sector): each tag block they touch
    /// read once and written once, neighbouring blocks together.
    fn place_tags(&self, list: &[&Entry]) -> DevResult<()> {
        let g = &self.g;
        let ts = g.tag_size;
        let lbs = u64::from(self.meta.limits().logical_block_size.max(512));
        let unit = TAG_BLOCK.max(lbs);
        let mut k = 0;
        while k < list.len() {
            let lo = g.tag_byte(list[k].sector) / unit * unit;
            let mut hi = (g.tag_byte(list[k].sector) + ts).div_ceil(unit) * unit;
            let mut m = k + 1;
            while m < list.len() {
                let b = g.tag_byte(list[m].sector);
                // The tags of one area are contiguous; the next entry's
                // tag block joins this run if it is this or the next one.
                if b < lo || b > hi + unit {
                    break;
                }
                hi = hi.max((b + ts).div_ceil(unit) * unit);
                m += 1;
            }
            let mut buf = vec![0u8; (hi - lo) as usize];
            self.meta.read(lo, &mut buf)?;
            for e in &list[k..m] {
                let at = (g.tag_byte(e.sector) - lo) as usize;
                buf[at..at + ts as usize].copy_from_slice(&e.tag);
            }
            self.meta.write(lo, WriteBuf::Owned(&mut buf), false)?;
            k = m;
        }
        Ok(())
    }
}
