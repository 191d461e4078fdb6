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
//! when histograms are off.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

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
        let t0 = self.histograms.load(Relaxed).then(Instant::now);
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
        if let Some(t0) = t.t0 {
            let ns = (t0.elapsed().as_nanos() as u64).clamp(1, HIST_MAX_NS);
            let mut h = s.hist.lock().unwrap_or_else(|p| p.into_inner());
            let hs = h.get_or_insert_with(|| Box::new(std::array::from_fn(|_| new_hist())));
            hs[i].saturating_record(ns);
        }
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
}
