//! Per-device I/O statistics: what `dmsetup status` cannot tell and dm's
//! `dmsetup stats` regions do, always on: requests, sectors and errors per
//! operation, requests in flight, and latency histograms (p50/p99/p999).
//!
//! Why this shape: every request of a device passes here twice (start and
//! end), on whichever core runs it. One shared set of atomics would bounce
//! its cache lines between cores on every request, so counters live in
//! cache-line-padded shards picked by the CPU the thread runs on (glibc
//! answers `sched_getcpu` from the rseq area: a load, no system call) and
//! are only summed when someone asks. Latencies go into HdrHistograms (the
//! `hdrhistogram` crate: fixed memory, 2 significant digits, merging is
//! exact), one per shard and operation behind a mutex that only threads
//! of the same CPU share; the two clock reads per request are skipped
//! when histograms are off and the device has no regions.
//!
//! dm-stats regions (`dmstats create`) sit beside the counters: a few
//! sector ranges cut into areas, each area with its own atomics. They are
//! rare, so a request checks one flag, and only with regions binary
//! searches the list (swapped whole, never locked by a request).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use hdrhistogram::Histogram;

/// The operations counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatOp {
    Read = 0,
    /// Writes and write-zeroes.
    Write = 1,
    Flush = 2,
    Discard = 3,
}

pub const OPS: [(StatOp, &str); 4] = [
    (StatOp::Read, "read"),
    (StatOp::Write, "write"),
    (StatOp::Flush, "flush"),
    (StatOp::Discard, "discard"),
];

/// Most shards a device keeps (CPUs beyond share).
const MAX_SHARDS: usize = 16;
/// Histogram range: 1 ns to 60 s (slower requests count as 60 s).
const HIST_MAX_NS: u64 = 60_000_000_000;

type Hist = Histogram<u64>;

fn new_hist() -> Hist {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 2).expect("valid histogram bounds")
}

#[repr(align(128))]
#[derive(Default)]
struct Shard {
    ios: [AtomicU64; 4],
    sectors: [AtomicU64; 4],
    errors: [AtomicU64; 4],
    started: AtomicU64,
    finished: AtomicU64,
    /// Allocated on first use: a device on a big machine pays only for
    /// the CPUs that ran its requests.
    hist: Mutex<Option<Box<[Hist; 4]>>>,
}

/// One device's statistics.
pub struct Stats {
    shards: Box<[Shard]>,
    mask: usize,
    histograms: AtomicBool,
    since: Mutex<Instant>,
    /// dm-stats regions (`dmstats create`), sorted by start. Empty for
    /// almost every device, so requests look at `regions_on` only.
    regions: ArcSwap<Vec<Arc<Region>>>,
    regions_on: AtomicBool,
    /// Serialises region changes (create picks the lowest free id).
    region_edit: Mutex<()>,
}

/// Most regions one device keeps, and most areas one region has: a
/// request looks at every region that starts before its end.
pub const MAX_REGIONS: usize = 64;
pub const MAX_AREAS: u64 = 4096;

/// One dm-stats region: a byte range of the device cut into areas of
/// `area` bytes (the last may be shorter), with counters per area.
struct Region {
    id: u64,
    start: u64,
    len: u64,
    area: u64,
    program_id: String,
    created: Instant,
    areas: Box<[Area]>,
}

/// An area's counters: what dmstats' report needs (requests, sectors and
/// time spent per direction).
#[derive(Default)]
struct Area {
    c: [AtomicU64; 6],
}

/// An area's counters as read back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AreaCounters {
    pub reads: u64,
    pub read_sectors: u64,
    pub read_ns: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub write_ns: u64,
}

/// A region as `dmstats list` and `report` show it (512-byte sectors).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RegionInfo {
    pub id: u64,
    pub start: u64,
    pub len: u64,
    pub area_len: u64,
    pub program_id: String,
    /// Seconds since the region was created.
    pub interval_s: f64,
    pub areas: Vec<AreaCounters>,
}

/// A request being timed: returned by [`Stats::start`], given back to
/// [`Stats::done`].
pub struct Timing {
    shard: usize,
    t0: Option<Instant>,
}

/// Latency summary of one operation, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

/// Counters of one operation.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct OpCounters {
    pub ios: u64,
    pub sectors: u64,
    pub errors: u64,
    /// Present when histograms are on.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub latency: Option<Latency>,
}

/// What [`Stats::snapshot`] returns; the `status --json` counters.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub read: OpCounters,
    pub write: OpCounters,
    pub flush: OpCounters,
    pub discard: OpCounters,
    pub in_flight: u64,
    pub histograms: bool,
    /// Seconds since the counters were created or cleared.
    pub interval_s: f64,
}

impl Snapshot {
    pub fn op(&self, op: StatOp) -> &OpCounters {
        match op {
            StatOp::Read => &self.read,
            StatOp::Write => &self.write,
            StatOp::Flush => &self.flush,
            StatOp::Discard => &self.discard,
        }
    }

    fn op_mut(&mut self, op: StatOp) -> &mut OpCounters {
        match op {
            StatOp::Read => &mut self.read,
            StatOp::Write => &mut self.write,
            StatOp::Flush => &mut self.flush,
            StatOp::Discard => &mut self.discard,
        }
    }
}

impl Stats {
    pub fn new(histograms: bool) -> Stats {
        let n = crate::mem::percpu::cpu_count()
            .next_power_of_two()
            .min(MAX_SHARDS);
        Stats {
            shards: (0..n).map(|_| Shard::default()).collect(),
            mask: n - 1,
            histograms: AtomicBool::new(histograms),
            since: Mutex::new(Instant::now()),
            regions: ArcSwap::from_pointee(Vec::new()),
            regions_on: AtomicBool::new(false),
            region_edit: Mutex::new(()),
        }
    }

    #[inline]
    fn shard(&self) -> usize {
        // SAFETY: sched_getcpu takes no arguments and has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        (cpu.max(0) as usize) & self.mask
    }

    /// A request starts (counted in flight until [`Stats::done`]).
    #[inline]
    pub fn start(&self) -> Timing {
        let shard = self.shard();
        self.shards[shard].started.fetch_add(1, Relaxed);
        let timed = self.histograms.load(Relaxed) || self.regions_on.load(Relaxed);
        let t0 = timed.then(Instant::now);
        Timing { shard, t0 }
    }

    /// A request of `bytes` ends, failed or not. Counted on the shard it
    /// started on, so in-flight (started − finished) stays exact even if
    /// the thread moved to another CPU meanwhile.
    #[inline]
    pub fn done(&self, t: Timing, op: StatOp, bytes: u64, ok: bool) {
        let s = &self.shards[t.shard];
        let i = op as usize;
        s.ios[i].fetch_add(1, Relaxed);
        s.sectors[i].fetch_add(bytes >> 9, Relaxed);
        if !ok {
            s.errors[i].fetch_add(1, Relaxed);
        }
        s.finished.fetch_add(1, Relaxed);
        if let Some(t0) = t.t0.filter(|_| self.histograms.load(Relaxed)) {
            let ns = (t0.elapsed().as_nanos() as u64).clamp(1, HIST_MAX_NS);
            let mut h = s.hist.lock().unwrap_or_else(|p| p.into_inner());
            let hs = h.get_or_insert_with(|| Box::new(std::array::from_fn(|_| new_hist())));
            hs[i].saturating_record(ns);
        }
    }

    /// [`Stats::done`] for a request at `offset`, also counted in the
    /// regions it overlaps (reads and writes only, as dm-stats).
    #[inline]
    pub fn done_at(&self, t: Timing, op: StatOp, offset: u64, bytes: u64, ok: bool) {
        if self.regions_on.load(Relaxed) && bytes > 0 {
            if let (StatOp::Read | StatOp::Write, Some(t0)) = (op, t.t0) {
                let ns = t0.elapsed().as_nanos() as u64;
                self.count_in_regions(op == StatOp::Write, offset, bytes, ns);
            }
        }
        self.done(t, op, bytes, ok);
    }

    /// Each region overlapping the request counts it once, in the area
    /// holding the overlap's first byte, with the overlap's sectors.
    fn count_in_regions(&self, write: bool, offset: u64, bytes: u64, ns: u64) {
        let rs = self.regions.load();
        let end = offset.saturating_add(bytes);
        let before_end = rs.partition_point(|r| r.start < end);
        for r in &rs[..before_end] {
            let r_end = r.start + r.len;
            if r_end <= offset {
                continue;
            }
            let from = offset.max(r.start);
            let sectors = (end.min(r_end) - from) >> 9;
            let a = &r.areas[((from - r.start) / r.area) as usize];
            let base = if write { 3 } else { 0 };
            a.c[base].fetch_add(1, Relaxed);
            a.c[base + 1].fetch_add(sectors, Relaxed);
            a.c[base + 2].fetch_add(ns, Relaxed);
        }
    }

    /// Add a region of `len` bytes at `start` cut into areas of `area`
    /// bytes (0: one area); returns its id, the lowest free one as dm's.
    /// The caller checks the range against the device's size.
    pub fn create_region(
        &self,
        start: u64,
        len: u64,
        area: u64,
        program_id: &str,
    ) -> Result<u64, String> {
        if len == 0 || start % 512 != 0 || len % 512 != 0 || area % 512 != 0 {
            return Err(
                "a region needs a non-empty length, and it, its start and its \
                        area size must be whole 512-byte sectors"
                    .into(),
            );
        }
        let area = if area == 0 { len } else { area };
        let count = len.div_ceil(area);
        if count > MAX_AREAS {
            return Err(format!(
                "{count} areas in one region; udm keeps at most {MAX_AREAS}: give a larger \
                 --areasize or fewer --areas"
            ));
        }
        let _g = self.region_edit.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.regions.load_full();
        if old.len() >= MAX_REGIONS {
            return Err(format!(
                "the device has {MAX_REGIONS} regions, as many as udm keeps: delete one first"
            ));
        }
        let id = (0..).find(|i| old.iter().all(|r| r.id != *i)).unwrap_or(0);
        let mut next: Vec<Arc<Region>> = old.iter().cloned().collect();
        next.push(Arc::new(Region {
            id,
            start,
            len,
            area,
            program_id: program_id.to_string(),
            created: Instant::now(),
            areas: (0..count).map(|_| Area::default()).collect(),
        }));
        next.sort_by_key(|r| (r.start, r.id));
        self.regions.store(Arc::new(next));
        self.regions_on.store(true, Relaxed);
        Ok(id)
    }

    /// Delete region `id` (`None`: all); false if there was no such one.
    pub fn delete_region(&self, id: Option<u64>) -> bool {
        let _g = self.region_edit.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.regions.load_full();
        let next: Vec<Arc<Region>> = old
            .iter()
            .filter(|r| id.is_some_and(|i| r.id != i))
            .cloned()
            .collect();
        let found = next.len() != old.len();
        self.regions_on.store(!next.is_empty(), Relaxed);
        self.regions.store(Arc::new(next));
        found
    }

    /// The regions and their counters, by id.
    pub fn regions(&self) -> Vec<RegionInfo> {
        let mut out: Vec<RegionInfo> = self
            .regions
            .load()
            .iter()
            .map(|r| RegionInfo {
                id: r.id,
                start: r.start >> 9,
                len: r.len >> 9,
                area_len: r.area >> 9,
                program_id: r.program_id.clone(),
                interval_s: r.created.elapsed().as_secs_f64(),
                areas: r
                    .areas
                    .iter()
                    .map(|a| {
                        let v = |i: usize| a.c[i].load(Relaxed);
                        AreaCounters {
                            reads: v(0),
                            read_sectors: v(1),
                            read_ns: v(2),
                            writes: v(3),
                            write_sectors: v(4),
                            write_ns: v(5),
                        }
                    })
                    .collect(),
            })
            .collect();
        out.sort_by_key(|r| r.id);
        out
    }

    /// A request counted by [`Stats::start`] did not run after all (an
    /// asynchronous submission the device declined; the synchronous retry
    /// counts it again): it leaves the in-flight count, nothing else.
    #[inline]
    pub fn cancel(&self, t: Timing) {
        self.shards[t.shard].finished.fetch_add(1, Relaxed);
    }

    /// Turn latency histograms on or off (counters are always kept).
    pub fn set_histograms(&self, on: bool) {
        self.histograms.store(on, Relaxed);
    }

    pub fn histograms(&self) -> bool {
        self.histograms.load(Relaxed)
    }

    /// Zero the counters and histograms (`@stats_clear`); requests in
    /// flight stay counted as such.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            for i in 0..4 {
                s.ios[i].store(0, Relaxed);
                s.sectors[i].store(0, Relaxed);
                s.errors[i].store(0, Relaxed);
            }
            if let Some(hs) = s.hist.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                for h in hs.iter_mut() {
                    h.reset();
                }
            }
        }
        *self.since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Sum the shards.
    pub fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot {
            histograms: self.histograms(),
            interval_s: self
                .since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed()
                .as_secs_f64(),
            ..Snapshot::default()
        };
        let mut merged: Option<[Hist; 4]> = None;
        let (mut started, mut finished) = (0u64, 0u64);
        for s in self.shards.iter() {
            started += s.started.load(Relaxed);
            finished += s.finished.load(Relaxed);
            for (op, _) in OPS {
                let i = op as usize;
                let c = snap.op_mut(op);
                c.ios += s.ios[i].load(Relaxed);
                c.sectors += s.sectors[i].load(Relaxed);
                c.errors += s.errors[i].load(Relaxed);
            }
            if let Some(hs) = s.hist.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                let m = merged.get_or_insert_with(|| std::array::from_fn(|_| new_hist()));
                for (dst, src) in m.iter_mut().zip(hs.iter()) {
                    // Same bounds on both sides: adding cannot fail.
                    let _ = dst.add(src);
                }
            }
        }
        snap.in_flight = started.saturating_sub(finished);
        if snap.histograms {
            for (op, _) in OPS {
                let lat = match &merged {
                    Some(m) if !m[op as usize].is_empty() => {
                        let h = &m[op as usize];
                        Latency {
                            count: h.len(),
                            mean_ns: h.mean() as u64,
                            p50_ns: h.value_at_quantile(0.50),
                            p99_ns: h.value_at_quantile(0.99),
                            p999_ns: h.value_at_quantile(0.999),
                            max_ns: h.max(),
                        }
                    }
                    _ => Latency::default(),
                };
                snap.op_mut(op).latency = Some(lat);
            }
        }
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_latencies_and_clears() {
        let s = Stats::new(true);
        let t = s.start();
        assert_eq!(s.snapshot().in_flight, 1);
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.done(t, StatOp::Read, 4096, true);
        let t = s.start();
        s.done(t, StatOp::Write, 1 << 20, false);
        let snap = s.snapshot();
        assert_eq!(snap.in_flight, 0);
        assert_eq!((snap.read.ios, snap.read.sectors), (1, 8));
        assert_eq!((snap.write.ios, snap.write.errors), (1, 1));
        let lat = snap.read.latency.unwrap();
        assert!(lat.p50_ns >= 2_000_000, "{lat:?}");
        assert_eq!(lat.count, 1);
        s.clear();
        let snap = s.snapshot();
        assert_eq!(snap.read.ios, 0);
        assert_eq!(snap.read.latency.unwrap().count, 0);
        s.set_histograms(false);
        let t = s.start();
        s.done(t, StatOp::Flush, 0, true);
        let snap = s.snapshot();
        assert_eq!(snap.flush.ios, 1);
        assert!(snap.flush.latency.is_none());
    }

    #[test]
    fn regions_count_the_requests_that_overlap_them_per_area() {
        let s = Stats::new(false);
        // Sectors 0..16 in areas of 8, and a second region over 8..24.
        assert_eq!(s.create_region(0, 16 << 9, 8 << 9, "p").unwrap(), 0);
        assert_eq!(s.create_region(8 << 9, 16 << 9, 0, "").unwrap(), 1);
        let io = |op, off: u64, len: u64| {
            let t = s.start();
            s.done_at(t, op, off << 9, len << 9, true);
        };
        io(StatOp::Read, 0, 4); // region 0 area 0
        io(StatOp::Write, 9, 2); // region 0 area 1, region 1
        io(StatOp::Write, 30, 2); // neither
        io(StatOp::Flush, 0, 0); // not counted in regions
        let r = s.regions();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].id, r[0].start, r[0].len, r[0].area_len),
            (0, 0, 16, 8)
        );
        assert_eq!(r[0].areas.len(), 2);
        assert_eq!((r[0].areas[0].reads, r[0].areas[0].read_sectors), (1, 4));
        assert_eq!((r[0].areas[1].writes, r[0].areas[1].write_sectors), (1, 2));
        assert_eq!(r[1].areas.len(), 1);
        assert_eq!((r[1].areas[0].writes, r[1].areas[0].reads), (1, 0));
        // Ids are reused lowest first; deleting all turns counting off.
        assert!(s.delete_region(Some(0)));
        assert!(!s.delete_region(Some(0)));
        assert_eq!(s.create_region(0, 8 << 9, 0, "").unwrap(), 0);
        assert!(s.delete_region(None));
        assert!(s.regions().is_empty());
        assert!(!s.regions_on.load(Relaxed));
        assert!(s.create_region(0, 0, 0, "").is_err());
        assert!(s.create_region(0, 1 << 30, 512, "").is_err());
    }
}
