//! `thin-pool <metadata dev> <data dev> <data block size> <low water mark>
//! [<#features> <feature>...]`: the pool that thin devices take blocks
//! from. Its own device reads and writes the data device unchanged, as the
//! kernel's does; its work is the metadata, its messages and its status.
//!
//! The pool state ([`PoolCore`]) outlives a table: a reload naming the same
//! metadata device binds to the running pool, as the kernel looks pools up
//! by their metadata device, so thin devices keep working across it and a
//! bigger data device takes effect at once.
//!
//! Locking, so that a read of a mapped block waits for nobody but a short
//! metadata change: the metadata sits behind a read-write lock that reads
//! take for their lookup only; changes take it for the change only, never
//! across data I/O, and hold the *commit gate* shared meanwhile; a commit
//! takes the gate alone (so no provisioning write is half done and nothing
//! changes between its halves), flushes the data device, gathers the
//! transaction under the metadata lock and writes it without that lock.
//! Two writes that provision or unshare the same virtual block meet in a
//! per-block cell (the kernel's bio prison), so the second sees the first's
//! mapping instead of provisioning the block again. I/O to a mapped block
//! pins the data block with its lookup ([`PoolCore::pin`]) until it ends,
//! so the allocator (under the metadata lock, taken alone) skips it and a
//! discard's passdown waits for it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::{Duration, Instant};

use super::metadata::Metadata;
use crate::core::device::unopened;
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::mem::{default_total_budget, per_device_budget, Budget};
use crate::targets::{
    parse_number, EventHook, Target, TargetArgs, TargetError, TargetMemory, TargetType,
};

/// The `thin-pool` target type, for [`crate::targets::TYPES`].
pub static TYPE: TargetType = TargetType {
    name: "thin-pool",
    version: [1, 23, 0],
    new,
    args: &[
        "metadata dev",
        "data dev",
        "data block size",
        "low water mark",
        "#features",
    ],
    more_args: Some(|_| "feature".to_string()),
};

/// Table features, as the kernel names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub skip_block_zeroing: bool,
    pub ignore_discard: bool,
    pub no_discard_passdown: bool,
    pub read_only: bool,
    pub error_if_no_space: bool,
}

impl Features {
    fn parse(args: &[String], at: usize) -> Result<Features, TargetError> {
        let mut f = Features::default();
        if args.get(at).is_none() {
            return Ok(f);
        }
        let n = parse_number(args, at, "a count of features")? as usize;
        if args.len() != at + 1 + n {
            return Err(TargetError::at(
                at,
                format!("{n} features announced, {} given", args.len() - at - 1),
            ));
        }
        for (i, w) in args[at + 1..].iter().enumerate() {
            match w.as_str() {
                "skip_block_zeroing" => f.skip_block_zeroing = true,
                "ignore_discard" => f.ignore_discard = true,
                "no_discard_passdown" => f.no_discard_passdown = true,
                "read_only" => f.read_only = true,
                "error_if_no_space" => f.error_if_no_space = true,
                _ => {
                    return Err(TargetError::at(
                        at + 1 + i,
                        format!(
                            "unknown feature '{w}' (skip_block_zeroing, ignore_discard, \
                             no_discard_passdown, read_only, error_if_no_space)"
                        ),
                    ))
                }
            }
        }
        Ok(f)
    }

    fn words(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let pairs = [
            (self.skip_block_zeroing, "skip_block_zeroing"),
            (self.ignore_discard, "ignore_discard"),
            (self.no_discard_passdown, "no_discard_passdown"),
            (self.read_only, "read_only"),
            (self.error_if_no_space, "error_if_no_space"),
        ];
        for (on, w) in pairs {
            if on {
                v.push(w);
            }
        }
        v
    }
}

/// A running pool: the metadata and the data device, shared by the pool's
/// tables and its thin devices.
pub struct PoolCore {
    meta_name: String,
    md: RwLock<Metadata>,
    /// Held shared by whatever changes the metadata, alone by a commit.
    gate: RwLock<()>,
    /// Virtual blocks `(dev id, block)` being provisioned or unshared.
    cells: Mutex<Cells>,
    cell_free: Condvar,
    /// Bumped when a reload grows the data device (or changes what a
    /// full pool does), so writes waiting for space try again.
    space_gen: Mutex<u64>,
    data: RwLock<Arc<dyn BlockDevice>>,
    pub block_bytes: u64,
    features: RwLock<Features>,
    low_water: AtomicU64,
    low_water_raised: AtomicBool,
    /// Signalled with `space_gen`.
    space: Condvar,
    /// How long a write waits for space before failing, in ms; 0 waits
    /// until space comes.
    no_space_ms: AtomicU64,
    events: Mutex<Option<EventHook>>,
    stop: AtomicBool,
    /// Reads and in-place writes in flight per data block, hashed into
    /// [`PIN_SLOTS`] counters ([`PoolCore::pin`]): a block whose counter
    /// is not zero is not handed out again nor passed down, so I/O that
    /// looked a block up can never reach it after a discard and a commit
    /// gave it to another device.
    pins: Box<[AtomicU32]>,
    /// Thin devices with a table (live or loaded), by id, so that `delete`
    /// refuses them as the kernel does (its `open_count`).
    open_devs: Mutex<HashMap<u64, usize>>,
    /// Why the pool stopped changing its metadata, once it has: damage
    /// found at run time, or `needs_check` set when it was activated. As
    /// the kernel's read-only mode: reads of what still looks up go on,
    /// writes, discards, messages and commits fail (EIO).
    failed: Mutex<Option<String>>,
    /// The pool device's failure state (`core::fault`), from the table
    /// that built it: a panic in the pool's own work (a commit, the timed
    /// commit) fails the pool device as well as its metadata.
    fault: Mutex<Option<Arc<crate::core::Fault>>>,
    /// `needs_check` is on the disk (written by [`PoolCore::commit`] once
    /// the pool failed, or found there).
    check_flag_written: AtomicBool,
}

/// The held cells and how many writes wait for one, so that letting a
/// cell go wakes nobody (no futex call) when nobody waits, the usual case.
#[derive(Default)]
struct Cells {
    held: HashSet<(u64, u64)>,
    waiting: usize,
}

/// Counters of [`PoolCore::pins`]; a collision only makes the allocator
/// skip a free block for the moment.
const PIN_SLOTS: usize = 4096;

/// A data block held against reuse while I/O to it runs (see
/// [`PoolCore::pin`]); dropping it lets the block go.
pub struct Pin<'a>(&'a AtomicU32);

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// The variable that replaces the kernel's `no_space_timeout` module
/// parameter (udm has no module parameters).
pub const NO_SPACE_TIMEOUT_VAR: &str = "UDM_THIN_NO_SPACE_TIMEOUT";

/// How long a queueing pool holds a write that finds no free data block,
/// in ms: the kernel's 60 s, or `UDM_THIN_NO_SPACE_TIMEOUT` seconds (0:
/// until space comes).
fn no_space_timeout_ms() -> Result<u64, String> {
    parse_no_space_timeout(std::env::var(NO_SPACE_TIMEOUT_VAR).ok().as_deref())
}

fn parse_no_space_timeout(v: Option<&str>) -> Result<u64, String> {
    let Some(v) = v else {
        return Ok(60_000);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Ok((s * 1000.0).round() as u64),
        _ => Err(format!(
            "{NO_SPACE_TIMEOUT_VAR}='{v}': expected seconds between 0 and 86400 \
             (0 queues writes until the data device grows)"
        )),
    }
}

fn pools() -> MutexGuard<'static, Vec<Weak<PoolCore>>> {
    static P: Mutex<Vec<Weak<PoolCore>>> = Mutex::new(Vec::new());
    P.lock().unwrap_or_else(|e| e.into_inner())
}

fn targets() -> MutexGuard<'static, Vec<Weak<Pool>>> {
    static T: Mutex<Vec<Weak<Pool>>> = Mutex::new(Vec::new());
    T.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pool whose table target is `dev` (what a thin line's pool device
/// resolved to), if it is one.
pub fn core_of(dev: &Arc<dyn BlockDevice>) -> Option<Arc<PoolCore>> {
    let p = Arc::as_ptr(dev) as *const u8;
    let mut t = targets();
    t.retain(|w| w.strong_count() > 0);
    t.iter()
        .find(|w| w.as_ptr() as *const u8 == p)
        .and_then(|w| w.upgrade())
        .map(|pool| pool.core.clone())
}

fn enospc() -> DevError {
    DevError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC))
}

impl PoolCore {
    /// Damage found in the metadata (a lookup, a change, a commit): the
    /// pool stops changing it, as the kernel's does, and the request gets
    /// EIO. The first failure is logged, kept for the status and raises an
    /// event; `needs_check` reaches the superblock at the next commit
    /// attempt (the timer's, within a second), taken with no lock the
    /// caller may hold.
    pub fn fail(&self, e: String) -> DevError {
        let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            tracing::error!(
                "thin pool {}: metadata damaged, pool now read-only with needs_check: {e}",
                self.meta_name
            );
            *f = Some(e.clone());
            drop(f);
            if let Some(h) = self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                h.raise();
            }
        }
        DevError::Target(format!("thin pool {}: {e}", self.meta_name))
    }

    /// Why the pool has failed, if it has.
    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// EIO for a change to a failed pool.
    pub fn check_writable(&self) -> DevResult<()> {
        match self.failure() {
            None => Ok(()),
            Some(why) => Err(DevError::Target(format!(
                "thin pool {} is read-only until its metadata is checked ({why}): run \
                 thin_check, then thin_check --clear-needs-check-flag",
                self.meta_name
            ))),
        }
    }

    /// The metadata, to change it (messages, discards, reloads): with the
    /// commit gate, so it never lands between a commit's two halves.
    pub fn md(&self) -> MdWrite<'_> {
        let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
        MdWrite {
            md: self.md_locked(),
            _gate: gate,
        }
    }

    /// The metadata, to look something up; many readers at once.
    pub fn md_read(&self) -> RwLockReadGuard<'_, Metadata> {
        self.md.read().unwrap_or_else(|e| e.into_inner())
    }

    fn md_locked(&self) -> RwLockWriteGuard<'_, Metadata> {
        self.md.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The commit gate, shared, for a provisioning write: it allocates
    /// under [`Provision::md`], writes the data with no metadata lock, and
    /// maps the block under it again, all before a commit can start.
    pub fn provision(&self) -> Provision<'_> {
        Provision {
            core: self,
            _gate: self.gate.read().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The cell of virtual block `vb` of device `dev`, waited for.
    pub fn cell(&self, dev: u64, vb: u64) -> Cell<'_> {
        let mut c = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        while c.held.contains(&(dev, vb)) {
            c.waiting += 1;
            c = self.cell_free.wait(c).unwrap_or_else(|e| e.into_inner());
            c.waiting -= 1;
        }
        c.held.insert((dev, vb));
        Cell {
            core: self,
            key: (dev, vb),
        }
    }

    pub fn data(&self) -> Arc<dyn BlockDevice> {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn features(&self) -> Features {
        *self.features.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold data block `db` against reuse and passdown while I/O to it
    /// runs. Take it under the metadata lock, with the lookup that found
    /// `db`, so that no discard and commit can come between them.
    pub fn pin(&self, db: u64) -> Pin<'_> {
        let c = &self.pins[db as usize % PIN_SLOTS];
        c.fetch_add(1, Ordering::AcqRel);
        Pin(c)
    }

    fn pinned(&self, db: u64) -> bool {
        self.pins[db as usize % PIN_SLOTS].load(Ordering::Acquire) != 0
    }

    /// Whether discards that free data blocks pass down to the data
    /// device, as the kernel decides: not with `ignore_discard` or
    /// `no_discard_passdown`, nor when the data device takes no discards.
    pub fn passdown(&self) -> bool {
        let f = self.features();
        !f.ignore_discard && !f.no_discard_passdown && self.data().limits().discard
    }

    /// Discard on the data device the blocks a discard has just freed
    /// (their count is 0), in runs, once no I/O that looked them up is
    /// left. The caller holds the metadata lock and the commit gate
    /// ([`PoolCore::md`]): freed blocks are handed out only after a
    /// commit, so no write can take them meanwhile.
    pub fn pass_down(&self, freed: &mut [u64]) -> DevResult<()> {
        if freed.is_empty() || !self.passdown() {
            return Ok(());
        }
        freed.sort_unstable();
        let data = self.data();
        let bs = self.block_bytes;
        let mut i = 0;
        while i < freed.len() {
            let mut j = i + 1;
            while j < freed.len() && freed[j] == freed[j - 1] + 1 {
                j += 1;
            }
            for &db in &freed[i..j] {
                while self.pinned(db) {
                    std::thread::yield_now();
                }
            }
            data.discard(freed[i] * bs, (j - i) as u64 * bs)?;
            i = j;
        }
        Ok(())
    }

    /// A thin table of device `id` was built (`open`) or dropped.
    pub fn set_open(&self, id: u64, open: bool) {
        let mut m = self.open_devs.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(id).or_insert(0);
        if open {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&id);
            }
        }
    }

    fn is_open(&self, id: u64) -> bool {
        self.open_devs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&id)
    }

    /// A free data block that no I/O in flight still reads or writes
    /// ([`PoolCore::pin`]); blocks skipped for that go back to the free.
    /// When only such blocks are free, wait for their I/O (it needs no
    /// metadata lock to end).
    fn alloc_unpinned(&self, md: &mut Metadata) -> Option<u64> {
        loop {
            let mut skipped = Vec::new();
            let found = loop {
                match md.alloc_data() {
                    Some(b) if self.pinned(b) => skipped.push(b),
                    other => break other,
                }
            };
            let retry = found.is_none() && !skipped.is_empty();
            for b in skipped {
                md.tm.dsm.dec(b);
            }
            if !retry {
                return found;
            }
            std::thread::yield_now();
        }
    }

    /// A new data block for a write, or `None` when the pool is full and
    /// queues (the caller lets go of every lock and calls
    /// [`PoolCore::wait_for_space`]); `error_if_no_space` fails at once.
    pub fn alloc_data(&self, md: &mut Metadata) -> DevResult<Option<u64>> {
        let Some(b) = self.alloc_unpinned(md) else {
            if self.features().error_if_no_space {
                return Err(enospc());
            }
            return Ok(None);
        };
        let free = md.tm.dsm.free_now();
        if free <= self.low_water.load(Ordering::Relaxed)
            && !self.low_water_raised.swap(true, Ordering::Relaxed)
        {
            if let Some(h) = self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                h.raise();
            }
        }
        Ok(Some(b))
    }

    /// Which growth of the data device a write has seen: taken before it
    /// looks for a block, given to [`PoolCore::wait_for_space`].
    pub fn space_seen(&self) -> u64 {
        *self.space_gen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait (holding no lock) until a reload grows the data device after
    /// `seen`, or for a second when the timeout is 0; ENOSPC once the
    /// no-space timeout, counted from `start`, has passed, as the kernel
    /// fails queued writes.
    pub fn wait_for_space(&self, start: Instant, seen: u64) -> DevResult<()> {
        let ms = self.no_space_ms.load(Ordering::Relaxed);
        let left = if ms == 0 {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(ms)
                .checked_sub(start.elapsed())
                .ok_or_else(enospc)?
        };
        let g = self.space_gen.lock().unwrap_or_else(|e| e.into_inner());
        if *g == seen {
            let (_g, _timed_out) = self
                .space
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    fn space_grew(&self) {
        *self.space_gen.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.space.notify_all();
    }

    /// The transaction's pinned nodes fill half the memory budget: commit
    /// soon rather than let them grow without bound.
    pub fn wants_commit(&self) -> bool {
        self.md_read().tm.pinned_over_budget()
    }

    /// Make everything written so far durable: data first, then the
    /// metadata transaction that maps it. Lookups go on while the
    /// transaction is written.
    pub fn commit(&self) -> DevResult<()> {
        let run = std::panic::AssertUnwindSafe(|| self.commit_now());
        std::panic::catch_unwind(run)
            .unwrap_or_else(|p| Err(self.panicked("a metadata commit", &*p)))
    }

    fn commit_now(&self) -> DevResult<()> {
        let _alone = self.gate.write().unwrap_or_else(|e| e.into_inner());
        if self.failure().is_some() {
            self.write_check_flag();
            return self.check_writable();
        }
        self.data().flush()?;
        if !self.md_read().dirty() {
            return Ok(());
        }
        crate::core::fault::inject("thin.commit");
        let (pending, dev) = {
            let mut md = self.md_locked();
            let p = md.prepare_commit().map_err(|e| self.fail(e))?;
            (p, md.device())
        };
        pending.write(&*dev).map_err(|e| self.fail(e))?;
        self.md_locked().finish_commit();
        Ok(())
    }

    /// A panic in the pool's own work: its metadata is no longer trusted
    /// (read-only with `needs_check`, as for damage) and the pool device
    /// fails; other pools and devices go on.
    fn panicked(&self, what: &str, p: &(dyn std::any::Any + Send)) -> DevError {
        let why = format!("{what} panicked: {}", crate::core::fault::panic_message(p));
        if let Some(f) = self
            .fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            f.fail(why.clone());
        }
        self.fail(why)
    }

    /// `needs_check` onto the disk, once, for a failed pool; under the
    /// commit gate, so no commit's superblock comes after it.
    fn write_check_flag(&self) {
        if self.check_flag_written.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self.md_locked().persist_needs_check() {
            tracing::error!("thin pool {}: {e}", self.meta_name);
        }
    }

    fn message(&self, argv: &[String]) -> Result<Option<String>, String> {
        let num = |i: usize| -> Result<u64, String> {
            let s = argv
                .get(i)
                .ok_or_else(|| format!("{}: missing argument {i}", argv[0]))?;
            crate::core::units::parse_decimal(s)
                .map_err(|_| format!("{}: expected a decimal number, got '{s}'", argv[0]))
        };
        let want = |n: usize| -> Result<(), String> {
            if argv.len() != n + 1 {
                return Err(format!(
                    "{} takes {n} arguments, got {}",
                    argv[0],
                    argv.len() - 1
                ));
            }
            Ok(())
        };
        let Some(verb) = argv.first() else {
            return Err("thin-pool: empty message".into());
        };
        if self.features().read_only {
            return Err(format!("thin-pool is read-only: '{verb}' refused"));
        }
        self.check_writable()
            .map_err(|e| format!("'{verb}' refused: {e}"))?;
        {
            let mut md = self.md();
            match verb.as_str() {
                "create_thin" => {
                    want(1)?;
                    md.create_thin(num(1)?)?;
                }
                "create_snap" => {
                    want(2)?;
                    md.create_snap(num(1)?, num(2)?)?;
                }
                "delete" => {
                    want(1)?;
                    let id = num(1)?;
                    if self.is_open(id) {
                        return Err(format!(
                            "delete: thin device {id} is in use by a thin table (the kernel says \
                             EBUSY): remove the device whose table is 'thin ... {id}' first"
                        ));
                    }
                    md.delete(id)?;
                }
                "set_transaction_id" => {
                    want(2)?;
                    md.set_trans_id(num(1)?, num(2)?)?;
                }
                "reserve_metadata_snap" => {
                    want(0)?;
                    drop(md);
                    // The data the snapshot maps must be on disk before it.
                    self.data().flush().map_err(|e| e.to_string())?;
                    self.md().reserve_snap()?;
                }
                "release_metadata_snap" => {
                    want(0)?;
                    md.release_snap()?;
                }
                _ => {
                    return Err(format!(
                        "thin-pool: unknown message '{verb}' (create_thin, create_snap, delete, \
                         set_transaction_id, reserve_metadata_snap, release_metadata_snap)"
                    ))
                }
            }
        }
        // The kernel commits after each message, so a crash keeps it.
        self.commit().map_err(|e| e.to_string())?;
        Ok(None)
    }
}

/// [`PoolCore::md`]: the metadata, written, with the commit gate shared.
pub struct MdWrite<'a> {
    md: RwLockWriteGuard<'a, Metadata>,
    _gate: RwLockReadGuard<'a, ()>,
}

impl std::ops::Deref for MdWrite<'_> {
    type Target = Metadata;
    fn deref(&self) -> &Metadata {
        &self.md
    }
}

impl std::ops::DerefMut for MdWrite<'_> {
    fn deref_mut(&mut self) -> &mut Metadata {
        &mut self.md
    }
}

/// [`PoolCore::provision`]: the commit gate, shared, across one write.
pub struct Provision<'a> {
    core: &'a PoolCore,
    _gate: RwLockReadGuard<'a, ()>,
}

impl Provision<'_> {
    /// The metadata, written; let go of it before any data I/O.
    pub fn md(&self) -> RwLockWriteGuard<'_, Metadata> {
        self.core.md_locked()
    }
}

/// [`PoolCore::cell`]: one virtual block held; freed on drop.
pub struct Cell<'a> {
    core: &'a PoolCore,
    key: (u64, u64),
}

impl Drop for Cell<'_> {
    fn drop(&mut self) {
        let mut c = self.core.cells.lock().unwrap_or_else(|e| e.into_inner());
        c.held.remove(&self.key);
        let wake = c.waiting > 0;
        drop(c);
        if wake {
            self.core.cell_free.notify_all();
        }
    }
}

/// Commit once a second while anything changed, as the kernel's worker
/// does, so that unflushed writes are not held in memory for long.
fn start_timer(core: &Arc<PoolCore>) {
    let w = Arc::downgrade(core);
    let job = move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(c) = w.upgrade() else { return };
        if c.stop.load(Ordering::Relaxed) {
            return;
        }
        // The pool outlives its tables, so this job reports a panic to
        // the pool itself, whichever table is live now.
        let tick = std::panic::AssertUnwindSafe(|| c.timed_commit());
        if let Err(p) = std::panic::catch_unwind(tick) {
            c.panicked("the timed commit (a background job)", &*p);
            return;
        }
    };
    if let Err(e) = crate::core::fault::spawn_job("thin-commit".into(), None, job) {
        tracing::warn!("thin pool: cannot start the timed commit ({e}); flushes still commit");
    }
}

impl PoolCore {
    fn timed_commit(&self) {
        let dirty = self.md_read().dirty();
        let unflagged =
            self.failure().is_some() && !self.check_flag_written.load(Ordering::Acquire);
        if dirty || unflagged {
            crate::core::fault::inject("thin.timed_commit");
            if let Err(e) = self.commit() {
                tracing::warn!("thin pool {}: timed commit failed: {e}", self.meta_name);
            }
        }
    }
}

/// A `thin-pool` table line.
pub struct Pool {
    pub core: Arc<PoolCore>,
    meta_name: String,
    data_name: String,
    block_sectors: u64,
    low_water: u64,
    features: Features,
    len: u64,
}

fn block_size(args: &[String]) -> Result<u64, TargetError> {
    let s = parse_number(args, 2, "the data block size in 512-byte sectors")?;
    if !(128..=2_097_152).contains(&s) || s % 128 != 0 {
        return Err(TargetError::at(
            2,
            format!(
                "data block size {s} sectors: it must be a multiple of 128 sectors (64 KiB) \
                 between 128 and 2097152"
            ),
        ));
    }
    Ok(s)
}

pub fn new(a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    if a.args.len() < 4 {
        return Err(TargetError::line(
            "expected '<metadata dev> <data dev> <data block size> <low water mark> \
             [<#features> <feature>...]'",
        ));
    }
    let block_sectors = block_size(a.args)?;
    let low_water = parse_number(a.args, 3, "the low water mark in data blocks")?;
    let features = Features::parse(a.args, 4)?;
    let meta = a
        .resolver
        .resolve(&a.args[0])
        .map_err(|e| TargetError::at(0, e))?;
    let data = a
        .resolver
        .resolve(&a.args[1])
        .map_err(|e| TargetError::at(1, e))?;
    if unopened(meta.as_ref()) || unopened(data.as_ref()) {
        return Ok(super::standin::target(TYPE.name, a.args, a.len));
    }
    let block_bytes = block_sectors * 512;
    let data_blocks = data.size() / block_bytes;
    if data_blocks == 0 {
        return Err(TargetError::at(
            1,
            "the data device is smaller than one data block",
        ));
    }
    let no_space_ms = no_space_timeout_ms().map_err(TargetError::line)?;
    let core = bind(&a.args[0], meta, data, block_bytes, data_blocks, features)?;
    core.no_space_ms.store(no_space_ms, Ordering::Relaxed);
    core.low_water.store(low_water, Ordering::Relaxed);
    if let Some(h) = &a.options.events {
        *core.events.lock().unwrap_or_else(|e| e.into_inner()) = Some(h.clone());
    }
    if let Some(f) = &a.options.fault {
        *core.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(f.clone());
    }
    let pool = Arc::new(Pool {
        core,
        meta_name: a.args[0].clone(),
        data_name: a.args[1].clone(),
        block_sectors,
        low_water,
        features,
        len: a.len,
    });
    targets().push(Arc::downgrade(&pool));
    Ok(pool)
}

/// The running pool on this metadata device, updated to the new line, or a
/// new one.
pub(super) fn bind(
    meta_name: &str,
    meta: Arc<dyn BlockDevice>,
    data: Arc<dyn BlockDevice>,
    block_bytes: u64,
    data_blocks: u64,
    features: Features,
) -> Result<Arc<PoolCore>, TargetError> {
    let mut all = pools();
    all.retain(|w| w.strong_count() > 0);
    if let Some(core) = all
        .iter()
        .filter_map(|w| w.upgrade())
        .find(|c| c.meta_name == meta_name)
    {
        if core.block_bytes != block_bytes {
            return Err(TargetError::at(
                2,
                "the running pool has another data block size",
            ));
        }
        let mut md = core.md();
        if data_blocks < md.data_blocks() {
            // grow_data's error names the sizes; nothing has changed yet.
            md.grow_data(data_blocks)
                .map_err(|e| TargetError::at(1, e))?;
        }
        // The bigger device first, so no block handed out lies past its end.
        *core.data.write().unwrap_or_else(|e| e.into_inner()) = data;
        *core.features.write().unwrap_or_else(|e| e.into_inner()) = features;
        md.grow_data(data_blocks)
            .map_err(|e| TargetError::at(1, e))?;
        drop(md);
        core.low_water_raised.store(false, Ordering::Relaxed);
        core.space_grew();
        return Ok(core);
    }
    let md = Metadata::open(
        meta,
        data_blocks,
        (block_bytes / 512) as u32,
        metadata_budget(),
    )
    .map_err(|e| TargetError::at(0, format!("thin pool {meta_name}: {e}")))?;
    // As the kernel: a pool whose superblock says needs_check comes up
    // read-only until thin_check has cleared the flag.
    let needs_check = md.needs_check();
    let failed = (needs_check && !features.read_only).then(|| {
        tracing::warn!(
            "thin pool {meta_name}: needs_check is set in its superblock: read-only until \
             thin_check --clear-needs-check-flag"
        );
        "needs_check is set in the superblock".to_string()
    });
    let core = Arc::new(PoolCore {
        meta_name: meta_name.to_string(),
        md: RwLock::new(md),
        gate: RwLock::new(()),
        cells: Mutex::default(),
        cell_free: Condvar::new(),
        space_gen: Mutex::new(0),
        data: RwLock::new(data),
        block_bytes,
        features: RwLock::new(features),
        low_water: AtomicU64::new(0),
        low_water_raised: AtomicBool::new(false),
        space: Condvar::new(),
        no_space_ms: AtomicU64::new(60_000),
        events: Mutex::new(None),
        stop: AtomicBool::new(false),
        pins: (0..PIN_SLOTS).map(|_| AtomicU32::new(0)).collect(),
        open_devs: Mutex::new(HashMap::new()),
        failed: Mutex::new(failed),
        fault: Mutex::new(None),
        check_flag_written: AtomicBool::new(needs_check),
    });
    start_timer(&core);
    all.push(Arc::downgrade(&core));
    Ok(core)
}

/// The budget a pool's metadata cache and pinned nodes are charged to: one
/// device's share of the default total, as the crypt and verity targets
/// size theirs (2 % of RAM, at least 16 MiB).
fn metadata_budget() -> Arc<Budget> {
    Budget::new(per_device_budget(default_total_budget(), 1, false))
}

impl Drop for PoolCore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let data = self
            .data
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let failed = self
            .failed
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        let md = self.md.get_mut().unwrap_or_else(|e| e.into_inner());
        if failed {
            if !self.check_flag_written.load(Ordering::Acquire) {
                if let Err(e) = md.persist_needs_check() {
                    tracing::error!("thin pool {}: {e}", self.meta_name);
                }
            }
            return;
        }
        if md.dirty() && data.flush().is_ok() {
            if let Err(e) = md.commit() {
                tracing::warn!("thin pool {}: final commit failed: {e}", self.meta_name);
            }
        }
    }
}

impl BlockDevice for Pool {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        Limits::default().stack(self.core.data().limits())
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.core.data().read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.core.data().write(offset, data, fua)
    }
    fn flush(&self) -> DevResult<()> {
        self.core.commit()
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.core.data().discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.core.data().write_zeroes(offset, len, fua)
    }
}

impl Target for Pool {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }

    fn table_params(&self, _show_keys: bool) -> String {
        let esc = crate::core::table::escape_arg;
        let f = self.features.words();
        let mut s = format!(
            "{} {} {} {} {}",
            esc(&self.meta_name),
            esc(&self.data_name),
            self.block_sectors,
            self.low_water,
            f.len()
        );
        for w in f {
            s.push(' ');
            s.push_str(w);
        }
        s
    }

    fn status(&self) -> String {
        let md = self.core.md_read();
        let f = self.core.features();
        let meta_total = md.tm.msm.len();
        let data_total = md.data_blocks();
        let data_used = md.tm.dsm.allocated();
        let held = if md.held_root == 0 {
            "-".to_string()
        } else {
            md.held_root.to_string()
        };
        let failed = self.core.failure().is_some();
        let mode = if f.read_only || failed {
            "ro"
        } else if md.tm.dsm.free_now() == 0 {
            "out_of_data_space"
        } else {
            "rw"
        };
        let discard = if f.ignore_discard {
            "ignore_discard"
        } else if self.core.passdown() {
            "discard_passdown"
        } else {
            "no_discard_passdown"
        };
        let space = if f.error_if_no_space {
            "error_if_no_space"
        } else {
            "queue_if_no_space"
        };
        let check = if md.needs_check() || failed {
            "needs_check"
        } else {
            "-"
        };
        format!(
            "{} {}/{} {}/{} {held} {mode} {discard} {space} {check} {}",
            md.trans_id,
            md.tm.msm.allocated(),
            meta_total,
            data_used,
            data_total,
            meta_total.min(4096) / 4
        )
    }

    fn message(&self, argv: &[String]) -> Result<Option<String>, String> {
        self.core.message(argv)
    }

    /// The metadata cache: clean nodes, the transaction's pinned ones, and
    /// the pool's budget (the reference counts, 8 bytes per block, are
    /// outside it: see docs/THIN.md).
    fn memory(&self) -> Option<TargetMemory> {
        let (cached_bytes, pinned_bytes, budget_bytes) = self.core.md_read().tm.memory();
        Some(TargetMemory {
            cached_bytes,
            pinned_bytes,
            budget_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use std::sync::atomic::AtomicUsize;

    /// A metadata device whose writes wait while `hold` is set.
    struct Held {
        inner: MemStore,
        hold: Mutex<bool>,
        cv: Condvar,
        waiting: AtomicUsize,
    }

    impl Held {
        fn set_hold(&self, on: bool) {
            *self.hold.lock().unwrap() = on;
            self.cv.notify_all();
        }
    }

    impl BlockDevice for Held {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn limits(&self) -> Limits {
            self.inner.limits()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
            let mut h = self.hold.lock().unwrap();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while *h {
                h = self.cv.wait(h).unwrap();
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            drop(h);
            self.inner.write(offset, data, fua)
        }
        fn flush(&self) -> DevResult<()> {
            self.inner.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
            self.inner.write_zeroes(offset, len, fua)
        }
    }

    fn map(core: &PoolCore, vb: u64) {
        let p = core.provision();
        let mut md = p.md();
        let b = core.alloc_data(&mut md).unwrap().unwrap();
        md.insert(0, vb, b).unwrap();
    }

    /// While a commit's metadata writes are stuck, lookups of mapped blocks
    /// (committed ones and the stuck transaction's) still answer at once.
    #[test]
    fn lookups_go_on_while_a_commit_writes() {
        let meta = Arc::new(Held {
            inner: MemStore::new(8 << 20),
            hold: Mutex::new(false),
            cv: Condvar::new(),
            waiting: AtomicUsize::new(0),
        });
        let data: Arc<dyn BlockDevice> = Arc::new(MemStore::new(64 << 16));
        let f = Features::default();
        let core = bind("lookups-during-commit", meta.clone(), data, 1 << 16, 64, f).unwrap();
        core.md().create_thin(0).unwrap();
        map(&core, 5);
        core.commit().unwrap();
        map(&core, 6);
        meta.set_hold(true);
        let c2 = core.clone();
        let t = std::thread::spawn(move || c2.commit());
        let t0 = Instant::now();
        while meta.waiting.load(Ordering::SeqCst) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the commit never wrote"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let t1 = Instant::now();
        assert!(core.md_read().lookup(0, 5).unwrap().is_some());
        assert!(core.md_read().lookup(0, 6).unwrap().is_some());
        assert!(core.md_read().lookup(0, 7).unwrap().is_none());
        assert!(t1.elapsed() < Duration::from_secs(1));
        assert!(!t.is_finished(), "the commit is still held");
        meta.set_hold(false);
        t.join().unwrap().unwrap();
        assert!(!core.md_read().dirty());
        assert!(core.md_read().lookup(0, 6).unwrap().is_some());
    }

    /// A read that looked block `b0` up pins it: a discard and a commit
    /// free it, yet it is handed out only once the read has ended.
    #[test]
    fn a_block_being_read_is_not_reused_until_the_read_ends() {
        let meta: Arc<dyn BlockDevice> = Arc::new(MemStore::new(1 << 20));
        let data: Arc<dyn BlockDevice> = Arc::new(MemStore::new(4 * 65536));
        let core = bind("pin-test-meta", meta, data, 65536, 4, Features::default()).unwrap();
        let mut md = core.md();
        md.create_thin(0).unwrap();
        for vb in 0..4 {
            let b = core.alloc_data(&mut md).unwrap().unwrap();
            md.insert(0, vb, b).unwrap();
        }
        md.commit().unwrap();
        let b0 = md.lookup(0, 0).unwrap().unwrap().0;
        let b1 = md.lookup(0, 1).unwrap().unwrap().0;
        let read = core.pin(b0);
        assert!(md.remove(0, 0).unwrap());
        assert!(md.remove(0, 1).unwrap());
        md.commit().unwrap();
        let x = core.alloc_data(&mut md).unwrap().unwrap();
        assert_eq!(x, b1, "{b0} handed out under a read");
        assert_eq!(md.tm.dsm.get(b0), 0, "skipped, still free");
        drop(read);
        let y = core.alloc_data(&mut md).unwrap().unwrap();
        assert_eq!(y, b0, "free again once the read ended");
    }

    #[test]
    fn no_space_timeout_defaults_to_the_kernels_and_names_the_variable_when_bad() {
        assert_eq!(parse_no_space_timeout(None), Ok(60_000));
        assert_eq!(parse_no_space_timeout(Some("0")), Ok(0));
        assert_eq!(parse_no_space_timeout(Some(" 1.5 ")), Ok(1500));
        for bad in ["", "-1", "soon", "NaN", "1e9"] {
            let e = parse_no_space_timeout(Some(bad)).unwrap_err();
            assert!(
                e.contains(NO_SPACE_TIMEOUT_VAR) && e.contains("seconds"),
                "{e}"
            );
        }
    }
}
