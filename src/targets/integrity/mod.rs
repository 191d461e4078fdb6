//! `integrity <dev> <offset> <tag_size> <mode> [<#opt_params>
//! <opt_params>]`: dm-integrity, a device that keeps a tag (a checksum or
//! keyed MAC of the sector, or bytes the layer above hands it) beside
//! every sector, in the kernel's on-disk format, so a device moves
//! between udm and the kernel unchanged.
//!
//! Reads check every sector against its tag: a sector whose tag does not
//! match fails its request with EIO and is counted in the status (the
//! rest of the device keeps working). Writes go, in `J` mode, first to
//! the in-memory journal and are acknowledged; a FLUSH makes the journal
//! durable and a writer thread copies it to the places later
//! ([`writeback`]), so a crash at any point leaves each sector and its
//! tag in step: the journal is replayed when the table is resumed (never
//! while it is only loaded: see [`Phase`]), and written back and emptied
//! when it is suspended. `D`
//! writes straight to the places (a crash can leave a sector that fails
//! its check); `B` does too, after marking the regions it writes in a
//! durable bitmap ([`bitmap`]) whose dirty regions get their tags
//! recomputed at the next resume after a crash; `R` is read-only and checks
//! nothing (recovery). [`discard`] serves `allow_discards` and
//! [`recalc`] `recalculate`, in every writing mode.
//!
//! With `meta_device:<dev>` the superblock, journal, bitmap and tags live
//! on that device and the data device holds only the data, at the same
//! offsets as the mapping's (see [`layout`]); every path below reads and
//! writes tags and journal through `meta` and data through `dev`, which
//! are one device otherwise.
//!
//! Without an internal hash the tags are the caller's: the layer above
//! (authenticated dm-crypt) stores its per-sector authentication tag and
//! IV through [`BlockDevice::write_tagged`] and reads them back with
//! [`BlockDevice::read_tagged`].

pub mod bitmap;
pub mod discard;
pub mod format;
mod io;
pub mod journal;
pub mod layout;
pub mod params;
mod recalc;
pub mod seal;
pub mod superblock;
pub mod tags;
pub mod writeback;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, Weak};

use super::{Target, TargetArgs, TargetError, TargetOptions};
use crate::core::device::{unopened, write_zeroes_by_writing, TagLayout};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use layout::{log2_buffer_of, Geometry};
use params::{IntegrityParams, Mode};
use superblock::{flags, Superblock, SB_SECTORS};
use tags::Alg;

/// Where an instance is in dm's lifecycle. Construction only reads:
/// replay, bitmap recovery, the superblock's resize and `J` mode's writer
/// all touch the disk, and a table loaded beside the live one (or built
/// twice) must not do so while the live instance still writes there
/// (the kernel does them in `dm_integrity_resume`, after the old table's
/// postsuspend).
enum Phase {
    /// Built, never started: the first `resume` (or, for a target used
    /// outside a managed device, the first request) starts it.
    Loaded,
    /// Started: the journal or bitmap is live.
    Running,
    /// Quiesced by `postsuspend`: everything written is in place and
    /// durable, the journal empty, the bitmap clean.
    Suspended,
    /// Starting failed (a replay I/O error, a journal that fails its
    /// check): every request fails with this reason.
    Failed(String),
}

/// What `resume` starts and `postsuspend` stops.
struct Run {
    phase: Phase,
    /// `J` mode's journal and its writer thread, while running.
    journal: Option<writeback::Writeback>,
}

/// The `integrity` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "integrity",
    // The kernel's last version before inline mode (1.12, `I`), which udm
    // has not: scripts pick their tests by it.
    version: [1, 11, 0],
    new,
    args: params::ARGS,
    more_args: None,
};

/// What changes while the device is open, outside the journal: the
/// superblock and bitmap mode's bitmap. Its lock also serialises `D` and
/// `B` writes (the read-modify-write of tag sectors shared by
/// neighbouring blocks), discards and recalculation steps; `J` writes
/// never take it (the journal has its own locks, see [`writeback`]).
struct State {
    /// The superblock as it is on disk now (flags, bitmap and
    /// recalculation fields change while the device is open).
    sb: Superblock,
    /// Bitmap mode's dirty bitmap.
    bitmap: Option<bitmap::Bitmap>,
    /// The regions a dirty bitmap left for the background recalculation
    /// (sorted, disjoint; see [`bitmap`]): it recomputes only these, and
    /// after a restart everything from its position.
    recover: Option<Vec<(u64, u64)>>,
}

pub struct Integrity {
    p: IntegrityParams,
    /// The data device.
    dev: Arc<dyn BlockDevice>,
    /// The device of the superblock, journal, bitmap and tags: `dev`
    /// itself unless the line has `meta_device`.
    meta: Arc<dyn BlockDevice>,
    sb: Superblock,
    g: Geometry,
    alg: Option<Alg>,
    len: u64,
    /// The superblock and bitmap as they are now; see [`State`].
    state: Mutex<State>,
    /// The lifecycle and `J` mode's journal. Lock order: `run`, then
    /// `state`.
    run: RwLock<Run>,
    /// `journal_crypt` and `journal_mac`.
    seal: Option<Arc<seal::Seal>>,
    mismatches: AtomicU64,
    options: TargetOptions,
    /// Reads of blocks from here on are not checked (see [`recalc`]).
    recalc_at: AtomicU64,
    /// The running recalculation, from `resume` to `postsuspend`.
    recalc_job: Mutex<Option<recalc::Job>>,
    /// This target, for the job it starts at `resume`.
    me: Weak<Integrity>,
    /// The server's pinned memory the journal and keystream hold.
    _pinned: crate::mem::Pinned,
}

fn alg_of(p: &IntegrityParams) -> Result<Option<Alg>, TargetError> {
    p.opts
        .internal_hash
        .as_ref()
        .map(|h| Alg::new(&h.name, h.key.clone()))
        .transpose()
        .map_err(TargetError::line)
}

/// What the line asks for that cannot work, refused by name.
fn refuse_unsupported(p: &IntegrityParams, alg: &Option<Alg>) -> Result<(), TargetError> {
    match p.opts.meta_device.as_deref() {
        Some("") => {
            return Err(TargetError::line(
                "meta_device: the metadata device is missing (meta_device:<dev>)",
            ))
        }
        Some(m) if m == p.dev => {
            return Err(TargetError::line(format!(
                "meta_device:{m} names the data device itself: give a device of its own, or \
                 leave meta_device out to interleave tags with the data"
            )))
        }
        _ => {}
    }
    if alg.is_none() && (p.mode == Mode::Bitmap || p.opts.allow_discards || p.opts.recalculate) {
        return Err(TargetError::line(
            "bitmap mode, allow_discards and recalculate need an internal_hash",
        ));
    }
    Ok(())
}

/// The format the kernel gives a zeroed device this line maps.
fn spec_of(p: &IntegrityParams, tag_size: u32, has_hash: bool) -> format::Spec {
    format::Spec {
        start: p.offset,
        tag_size,
        sector_size: p.opts.block_size.unwrap_or(512),
        journal_sectors: p.opts.journal_sectors,
        interleave_sectors: p.opts.interleave_sectors,
        journal_mac: p.opts.journal_mac.is_some(),
        fix_padding: p.opts.fix_padding,
        fix_hmac: p.opts.fix_hmac,
        has_hash,
        bitmap_mode: p.mode == Mode::Bitmap,
        sectors_per_bit: p.opts.sectors_per_bit,
        buffer_sectors: p.opts.buffer_sectors,
    }
}

/// The superblock a format writes for this line on a (metadata) device of
/// `meta_sectors`, and for a separate metadata device, a data device of
/// `data_sectors`.
fn format_superblock(
    p: &IntegrityParams,
    spec: &format::Spec,
    meta_sectors: u64,
    data_sectors: u64,
    salt: [u8; superblock::SALT_SIZE],
) -> Result<(Superblock, Geometry), String> {
    match &p.opts.meta_device {
        None => format::superblock(spec, meta_sectors, salt),
        Some(_) => format::superblock_separate(spec, meta_sectors, data_sectors, salt),
    }
}

/// The geometry `sb` describes for this line's devices.
fn geometry_of(
    p: &IntegrityParams,
    sb: &Superblock,
    meta_sectors: u64,
    data_sectors: u64,
) -> Result<Geometry, TargetError> {
    let log2_buffer = log2_buffer_of(p.opts.buffer_sectors);
    match &p.opts.meta_device {
        None => Geometry::of(sb, p.offset, meta_sectors),
        Some(m) => Geometry::of_separate(sb, p.offset, meta_sectors, data_sectors, log2_buffer)
            .map_err(|e| format!("{e} (metadata device {m}, data device {})", p.dev)),
    }
    .map_err(TargetError::line)
}

/// The device holding the superblock: the metadata device if there is
/// one, for errors.
fn sb_dev(p: &IntegrityParams) -> &str {
    p.opts.meta_device.as_deref().unwrap_or(&p.dev)
}

/// An error about the superblock's device: the line's device argument,
/// or the `meta_device` option.
fn sb_err(p: &IntegrityParams, msg: String) -> TargetError {
    match p.opts.meta_device {
        None => TargetError::at(0, msg),
        Some(_) => TargetError::line(msg),
    }
}

/// Reads the superblock from `meta` (the data device unless the line has
/// `meta_device`), formatting a zeroed device as the kernel does;
/// whether it formatted.
fn load_superblock(
    meta: &dyn BlockDevice,
    data_sectors: u64,
    p: &IntegrityParams,
    tag_size: u32,
    has_hash: bool,
) -> Result<(Superblock, bool), TargetError> {
    let name = sb_dev(p);
    let mut area = vec![0u8; 512];
    io::read_bytes(meta, p.offset * 512, &mut area)
        .map_err(|e| sb_err(p, format!("cannot read the superblock of {name}: {e}")))?;
    if let Some(sb) = Superblock::parse(&area).map_err(|e| sb_err(p, format!("{name}: {e}")))? {
        return Ok((sb, false));
    }
    if p.mode == Mode::Recovery {
        return Err(sb_err(
            p,
            format!("{name} is not formatted (no superblock)"),
        ));
    }
    let mut salt = [0u8; superblock::SALT_SIZE];
    getrandom::fill(&mut salt).map_err(|e| TargetError::line(format!("no random salt: {e}")))?;
    let spec = spec_of(p, tag_size, has_hash);
    let (sb, g) = format_superblock(p, &spec, meta.size() / 512, data_sectors, salt)
        .map_err(|e| sb_err(p, format!("{name}: {e}")))?;
    format::format(meta, &sb, &g, None, None)
        .map_err(|e| sb_err(p, format!("cannot format {name}: {e}")))?;
    Ok((sb, true))
}

/// With `journal_crypt`/`journal_mac`: a device just formatted gets its
/// journal sealed and its superblock MAC; an existing one must carry a
/// superblock MAC the key reproduces (`FIXED_HMAC`), so a wrong key is
/// refused before anything is replayed.
fn prepare_seal(
    dev: &dyn BlockDevice,
    p: &IntegrityParams,
    sb: &Superblock,
    g: &Geometry,
    s: &seal::Seal,
    fresh: bool,
) -> Result<(), TargetError> {
    let fail = |e: DevError| TargetError::at(0, format!("{}: {e}", p.dev));
    if fresh {
        s.write_empty(dev, g, 0).map_err(fail)?;
        format::write_superblock(
            dev,
            sb,
            p.offset,
            Some(&|b: &[u8]| s.sb_mac(b).unwrap_or_default()),
        )
        .map_err(fail)?;
        return dev.flush().map_err(fail);
    }
    let mut area = vec![0u8; 512];
    io::read_bytes(dev, p.offset * 512, &mut area).map_err(fail)?;
    if !s.sb_mac_ok(&area) {
        return Err(TargetError::line(format!(
            "journal_mac: the superblock MAC of {} does not match: wrong journal_mac key or \
             algorithm",
            p.dev
        )));
    }
    Ok(())
}

/// For a line over unopened devices: the superblock the kernel would
/// write on a device big enough for `len` provided sectors (twice that,
/// plus room for the journal; with a separate metadata device, a data
/// device of `len` and a metadata device with room for its tags), and
/// the sizes in sectors of the (metadata) device and the data device.
fn stand_in_superblock(
    p: &IntegrityParams,
    tag_size: u32,
    has_hash: bool,
    len: u64,
) -> Result<(Superblock, u64, u64), TargetError> {
    let (meta_sectors, data_sectors) = if p.opts.meta_device.is_some() {
        let data = len.div_ceil(8).saturating_mul(8).max(8);
        let tags = data.saturating_mul(u64::from(tag_size)).div_ceil(512);
        (p.offset.saturating_add(tags).saturating_add(1 << 20), data)
    } else {
        let n = p.offset.saturating_add(len.saturating_mul(2));
        (n.saturating_add(1 << 20), 0)
    };
    let meta_sectors = meta_sectors.min(u64::MAX / 1024);
    let spec = spec_of(p, tag_size, has_hash);
    let (sb, _) = format_superblock(p, &spec, meta_sectors, data_sectors, [0; 16])
        .map_err(|e| sb_err(p, format!("{}: {e}", sb_dev(p))))?;
    Ok((sb, meta_sectors, data_sectors))
}

fn check_superblock(
    sb: &Superblock,
    p: &IntegrityParams,
    tag_size: u32,
) -> Result<(), TargetError> {
    if u32::from(sb.tag_size) != tag_size {
        return Err(TargetError::at(
            2,
            format!(
                "tag size {tag_size} does not match the superblock's {}",
                sb.tag_size
            ),
        ));
    }
    let bs = p.opts.block_size.unwrap_or(512);
    if sb.sector_size() != bs {
        return Err(TargetError::line(format!(
            "block_size {bs} does not match the superblock's sector size {}: add block_size:{}",
            sb.sector_size(),
            sb.sector_size()
        )));
    }
    if sb.has(flags::HAVE_JOURNAL_MAC) != p.opts.journal_mac.is_some() {
        return Err(TargetError::line(
            "journal_mac does not match the superblock (journal mac mismatch)",
        ));
    }
    Ok(())
}

/// The tag size: the line's, else the internal hash's digest size.
fn tag_size_of(p: &IntegrityParams, alg: &Option<Alg>) -> Result<u32, TargetError> {
    let tag_size = match (p.tag_size, alg) {
        (Some(t), _) => t,
        (None, Some(h)) => h.digest_size() as u32,
        (None, None) => {
            return Err(TargetError::at(
                2,
                "unknown tag size: give a size or an internal_hash",
            ))
        }
    };
    if tag_size as usize > layout::MAX_TAG_SIZE {
        return Err(TargetError::at(
            2,
            format!(
                "tag size {tag_size} is larger than {}",
                layout::MAX_TAG_SIZE
            ),
        ));
    }
    Ok(tag_size)
}

/// The data device and the metadata device (the data device again
/// without `meta_device`).
type Devices = (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>);

fn resolve_devices(a: &mut TargetArgs<'_>, p: &IntegrityParams) -> Result<Devices, TargetError> {
    let dev = a
        .resolver
        .resolve(&p.dev)
        .map_err(|e| TargetError::at(0, e))?;
    let Some(m) = &p.opts.meta_device else {
        return Ok((dev.clone(), dev));
    };
    let meta = a
        .resolver
        .resolve(m)
        .map_err(|e| TargetError::line(format!("meta_device:{m}: {e}")))?;
    // One opened device under two names (an unopened placeholder stands
    // for every device of `udm table check`).
    if std::ptr::addr_eq(Arc::as_ptr(&dev), Arc::as_ptr(&meta)) && !unopened(&*dev) {
        return Err(TargetError::line(format!(
            "meta_device:{m} is the data device {} itself: give a device of its own, or leave \
             meta_device out to interleave tags with the data",
            p.dev
        )));
    }
    Ok((dev, meta))
}

/// The superblock (read, or written by a first format) and the
/// geometry it gives the devices; whether it was formatted now. A
/// device `udm table check` did not open (unlimited, refuses I/O) is
/// checked against the superblock a format of a device just large
/// enough would write, and nothing is read.
fn open_layout(
    p: &IntegrityParams,
    devs: &Devices,
    tag_size: u32,
    has_hash: bool,
    len: u64,
) -> Result<(Superblock, Geometry, bool), TargetError> {
    let (dev, meta) = devs;
    let (sb, meta_sectors, data_sectors, fresh) = if unopened(&**dev) || unopened(&**meta) {
        let (sb, m, d) = stand_in_superblock(p, tag_size, has_hash, len / 512)?;
        (sb, m, d, false)
    } else {
        let d = dev.size() / 512;
        let (sb, fresh) = load_superblock(&**meta, d, p, tag_size, has_hash)?;
        (sb, meta.size() / 512, d, fresh)
    };
    check_superblock(&sb, p, tag_size)?;
    let g = geometry_of(p, &sb, meta_sectors, data_sectors)?;
    layout::journal_fits_memory(&g, None).map_err(|e| sb_err(p, format!("{}: {e}", sb_dev(p))))?;
    if len > g.provided_data_sectors * 512 {
        return Err(TargetError::line(format!(
            "not enough provided sectors for the mapping: {} has {}, the segment {}",
            p.dev,
            g.provided_data_sectors,
            len / 512
        )));
    }
    Ok((sb, g, fresh))
}

pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    let p = IntegrityParams::parse(a.args)?;
    let alg = alg_of(&p)?;
    refuse_unsupported(&p, &alg)?;
    let tag_size = tag_size_of(&p, &alg)?;
    let devs = resolve_devices(&mut a, &p)?;
    let checking = unopened(&*devs.0) || unopened(&*devs.1);
    let (sb, g, fresh) = open_layout(&p, &devs, tag_size, alg.is_some(), a.len)?;
    let pinned = seal::pin_journal(a.options, &p, &g).map_err(TargetError::line)?;
    let seal = seal::Seal::new(
        p.opts.journal_crypt.as_ref(),
        p.opts.journal_mac.as_ref(),
        &sb,
        &g,
    )
    .map_err(TargetError::line)?
    .map(Arc::new);
    if let (Some(s), false) = (&seal, checking) {
        prepare_seal(&*devs.1, &p, &sb, &g, s, fresh)?;
    }
    let (dev, meta) = devs;
    let mut t = Integrity {
        state: Mutex::new(State {
            sb: sb.clone(),
            bitmap: None,
            recover: None,
        }),
        seal,
        run: RwLock::new(Run {
            phase: Phase::Loaded,
            journal: None,
        }),
        p,
        dev,
        meta,
        sb,
        g,
        alg,
        len: a.len,
        mismatches: AtomicU64::new(0),
        options: a.options.clone(),
        recalc_at: AtomicU64::new(u64::MAX),
        recalc_job: Mutex::new(None),
        me: Weak::new(),
        _pinned: pinned,
    };
    if t.live() {
        t.check_recalc()?;
        // Only read here: what the journal holds is replayed at resume
        // (see [`Phase`]); a wrong key or a damaged journal still refuses
        // the load.
        t.check_journal()
            .map_err(|e| TargetError::line(format!("journal replay on {}: {e}", t.p.dev)))?;
    }
    Ok(Arc::new_cyclic(|me| {
        t.me = me.clone();
        t
    }))
}

impl Integrity {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything written to either device durable.
    fn flush_both(&self) -> DevResult<()> {
        io::flush_both(&*self.dev, &*self.meta, &self.g)
    }

    fn salt(&self) -> Option<&[u8]> {
        self.sb.has(flags::FIXED_HMAC).then_some(&self.sb.salt[..])
    }

    /// Whether this instance writes the disk at all (`R` mode and the
    /// unopened devices of `udm table check` never do).
    fn live(&self) -> bool {
        self.p.mode != Mode::Recovery && !unopened(&*self.dev) && !unopened(&*self.meta)
    }

    fn run_read(&self) -> RwLockReadGuard<'_, Run> {
        self.run.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The construction's check of the journal, reading only: the
    /// sections replay would take must carry their MACs (`journal_mac`).
    /// A dirty bitmap's journal area holds the bitmap: nothing to check.
    fn check_journal(&self) -> DevResult<()> {
        if self.sb.has(flags::DIRTY_BITMAP) {
            return Ok(());
        }
        let ids = self.seal.as_ref().map_or(&journal::KERNEL_IDS, |s| s.ids());
        let plan = journal::plan_by_section(&self.g, ids, self.p.mode == Mode::Journal, |i| {
            self.read_section(i)
        })?;
        self.check_macs(&plan)
    }

    /// The kernel's `dm_integrity_resume`, the disk's side: the
    /// superblock takes the device's size, a dirty bitmap's regions get
    /// their tags recomputed, the journal is replayed, the line's
    /// recalculation options are applied, and `J` mode's writer starts.
    fn start_disk(&self) -> DevResult<Option<writeback::Writeback>> {
        if !self.live() {
            return Ok(None);
        }
        let (next, seq, replayed) = self.recover()?;
        self.apply_recalc_options()?;
        if self.p.mode != Mode::Journal {
            return Ok(None);
        }
        self.start_journal(next, seq, replayed).map(Some)
    }

    /// Starts the instance unless it runs; the reason it cannot, once
    /// for all: the device's [`crate::core::Fault`] fails it (this table
    /// alone outside a managed device).
    fn ensure_running(&self) -> DevResult<()> {
        let mut r = self.run.write().unwrap_or_else(|e| e.into_inner());
        match &r.phase {
            Phase::Running => return Ok(()),
            Phase::Failed(why) => return Err(DevError::Target(why.clone())),
            Phase::Loaded | Phase::Suspended => {}
        }
        match self.start_disk() {
            Ok(j) => {
                r.journal = j;
                r.phase = Phase::Running;
                Ok(())
            }
            Err(e) => {
                let why = format!(
                    "integrity {}: cannot start the device (journal replay, bitmap recovery or                      superblock update): {e}; check the device, then remove and create it again",
                    self.p.dev
                );
                r.phase = Phase::Failed(why.clone());
                match &self.options.fault {
                    Some(f) => f.fail(why.clone()),
                    None => tracing::error!("{why}"),
                }
                Err(DevError::Target(why))
            }
        }
    }

    /// The running instance, for a request: a target used without a
    /// `resume` (in-process users, the fuzzers) starts at its first
    /// request, as a resumed one would.
    fn running(&self) -> DevResult<RwLockReadGuard<'_, Run>> {
        loop {
            {
                let r = self.run_read();
                match &r.phase {
                    Phase::Running => return Ok(r),
                    Phase::Failed(why) => return Err(DevError::Target(why.clone())),
                    Phase::Loaded | Phase::Suspended => {}
                }
            }
            self.ensure_running()?;
        }
    }

    /// dm's postsuspend, the disk's side: `J` mode's journal committed,
    /// placed, made durable and rewritten empty, its writer stopped;
    /// bitmap mode's bitmap cleared with everything durable; `D` flushed.
    /// The next table (or this one's next `resume`) starts from a clean
    /// disk with nothing to replay or recompute.
    fn quiesce(&self, r: &mut Run) {
        if !matches!(r.phase, Phase::Running) {
            return;
        }
        r.phase = Phase::Suspended;
        if let Some(j) = r.journal.take() {
            if let Err(e) = j.close() {
                tracing::warn!("integrity {}: cannot empty the journal at suspend ({e}); it is replayed at the next resume", self.p.dev);
            }
            return;
        }
        if let Err(e) = self.close_bitmap() {
            tracing::warn!("integrity {}: cannot mark the bitmap clean at suspend ({e}); its regions are recomputed at the next resume", self.p.dev);
        }
        if let Err(e) = self.flush_both() {
            tracing::warn!("integrity {}: flush at suspend failed: {e}", self.p.dev);
        }
    }

    /// The kernel's `replay_journal`: committed sections go to their
    /// places, oldest first; then the journal goes on where it was, or is
    /// rewritten empty when it was torn. Returns the section the next
    /// commit goes to, its sequence number, and whether anything was
    /// replayed (then the journal is emptied at close, so a later open
    /// does not write the same entries again over newer changes).
    fn replay(&self) -> DevResult<(u64, u8, bool)> {
        let g = &self.g;
        let ids = self.seal.as_ref().map_or(&journal::KERNEL_IDS, |s| s.ids());
        let plan = journal::plan_by_section(g, ids, self.p.mode == Mode::Journal, |i| {
            self.read_section(i)
        })?;
        self.check_macs(&plan)?;
        let mut replayed = 0;
        for &i in &plan.replay {
            let sec = self.read_section(i)?;
            for e in journal::entries(g, &sec) {
                if e.sector >= g.provided_data_sectors || e.sector % g.sectors_per_block() != 0 {
                    tracing::warn!(
                        "integrity {}: journal entry for invalid sector {} skipped",
                        self.p.dev,
                        e.sector
                    );
                    continue;
                }
                if let Some(a) = &self.alg {
                    let mut want = vec![0u8; g.tag_size as usize];
                    a.tag(self.salt(), e.sector, &e.data, &mut want);
                    if want != e.tag {
                        tracing::error!(
                            "integrity {}: tag mismatch when replaying the journal at sector {}",
                            self.p.dev,
                            e.sector
                        );
                        continue;
                    }
                }
                self.place(e.sector, &e.data, &e.tag)?;
                replayed += 1;
            }
        }
        if replayed > 0 {
            tracing::info!(
                "integrity {}: replayed {replayed} journal entries",
                self.p.dev
            );
        }
        self.flush_both()?;
        if let Some(seq) = plan.clear_with {
            self.write_empty_journal(seq)?;
            self.meta.flush()?;
        }
        Ok((plan.next_section, plan.seq, replayed > 0))
    }

    /// Journal section `i` as written, unsealed: replay holds one section
    /// at a time, never the whole journal.
    fn read_section(&self, i: u64) -> DevResult<Vec<u8>> {
        let g = &self.g;
        let mut sec = vec![0u8; (g.section_sectors * 512) as usize];
        self.meta.read(g.journal_sector(i, 0) * 512, &mut sec)?;
        if let Some(s) = &self.seal {
            s.unseal(i, &mut sec);
        }
        Ok(sec)
    }

    /// The journal rewritten empty, every section with sequence number
    /// `seq`, sealed with `journal_crypt`/`journal_mac`.
    fn write_empty_journal(&self, seq: u8) -> DevResult<()> {
        match &self.seal {
            Some(s) => s.write_empty(&*self.meta, &self.g, seq),
            None => format::write_empty_journal(&*self.meta, &self.g, seq, None),
        }
    }

    /// `journal_mac`: the sections to replay must carry their MACs (the
    /// kernel's check), and so must every section of a clean journal, so
    /// a wrong key is refused even with nothing to replay.
    fn check_macs(&self, plan: &journal::Plan) -> DevResult<()> {
        let Some(s) = &self.seal else {
            return Ok(());
        };
        let g = &self.g;
        let clean = plan.replay.is_empty() && plan.clear_with.is_none();
        let check: Box<dyn Iterator<Item = u64>> = if clean {
            Box::new(0..g.journal_sections)
        } else {
            Box::new(plan.replay.iter().copied())
        };
        for i in check {
            let sec = self.read_section(i)?;
            if !s.mac_ok(g, i, &sec) {
                return Err(DevError::Target(format!(
                    "journal_mac: the MAC of journal section {i} does not match: wrong \
                     journal_mac key or algorithm, wrong journal_crypt key, or a damaged journal"
                )));
            }
        }
        Ok(())
    }

    fn start_journal(&self, next: u64, seq: u8, replayed: bool) -> DevResult<writeback::Writeback> {
        let o = &self.p.opts;
        let cfg = writeback::Config {
            name: self.p.dev.clone(),
            watermark: o.journal_watermark.unwrap_or(writeback::DEFAULT_WATERMARK),
            commit_time_ms: o.commit_time.unwrap_or(writeback::DEFAULT_COMMIT_TIME_MS),
            seal: self.seal.clone(),
            replayed,
            fault: self.options.fault.clone(),
        };
        let devs = (self.dev.clone(), self.meta.clone());
        writeback::Writeback::start(devs, self.g.clone(), next, seq, cfg)
    }

    /// Data and tags of whole blocks from logical sector `s` to their
    /// places, area by area.
    fn place(&self, mut s: u64, data: &[u8], tags: &[u8]) -> DevResult<()> {
        let g = &self.g;
        let (mut d, mut t) = (data, tags);
        while !d.is_empty() {
            let n = g.left_in_area(s).min(d.len() as u64 / 512);
            let blocks = n >> g.log2_spb;
            let (dh, dt) = d.split_at((n * 512) as usize);
            let (th, tt) = t.split_at((blocks * g.tag_size) as usize);
            self.dev
                .write(g.data_sector(s) * 512, WriteBuf::Borrowed(dh), false)?;
            io::write_bytes(&*self.meta, g.tag_byte(s), th)?;
            s += n;
            d = dt;
            t = tt;
        }
        Ok(())
    }

    /// Tags of `data` (whole blocks from logical sector `s`).
    fn compute_tags(&self, s: u64, data: &[u8], out: &mut [u8]) {
        let Some(a) = &self.alg else {
            out.fill(0);
            return;
        };
        let bb = self.g.block_bytes();
        let ts = self.g.tag_size as usize;
        for (k, (blk, t)) in data.chunks(bb).zip(out.chunks_mut(ts)).enumerate() {
            a.tag(self.salt(), s + ((k as u64) << self.g.log2_spb), blk, t);
        }
    }

    fn check_range(&self, offset: u64, len: usize) -> DevResult<()> {
        let bb = self.g.block_bytes() as u64;
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(DevError::OutOfRange {
                offset,
                len: len as u64,
                size: self.len,
            });
        }
        if offset % bb != 0 || len as u64 % bb != 0 {
            return Err(DevError::Misaligned {
                offset,
                len: len as u64,
                align: bb as u32,
            });
        }
        Ok(())
    }

    /// Reads data and tags of `buf` (whole blocks at `offset`).
    fn read_raw(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> DevResult<()> {
        let g = &self.g;
        let mut s = offset / 512;
        let (mut d, mut t) = (buf, tags);
        while !d.is_empty() {
            let n = g.left_in_area(s).min(d.len() as u64 / 512);
            let blocks = n >> g.log2_spb;
            let (dh, dt) = std::mem::take(&mut d).split_at_mut((n * 512) as usize);
            let (th, tt) = std::mem::take(&mut t).split_at_mut((blocks * g.tag_size) as usize);
            self.dev.read(g.data_sector(s) * 512, dh)?;
            io::read_bytes(&*self.meta, g.tag_byte(s), th)?;
            s += n;
            d = dt;
            t = tt;
        }
        Ok(())
    }

    /// Writes through the journal (`J`) or straight (`D`, `B`).
    fn write_blocks(&self, offset: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        let run = self.running()?;
        if let Some(j) = &run.journal {
            return j.write(offset / 512, data, writeback::Tags::Given(tags), fua);
        }
        let mut st = self.lock();
        self.write_direct(&mut st, offset / 512, data, tags)
    }

    /// `f`, which writes tags or data beside the journal, run while the
    /// journal places nothing (with `drain`, after it placed everything
    /// acknowledged so far; see [`writeback::Writeback::exclusive`]);
    /// straight away in the other modes.
    fn around_journal<R>(
        &self,
        run: &Run,
        drain: bool,
        f: impl FnOnce() -> DevResult<R>,
    ) -> DevResult<R> {
        match &run.journal {
            Some(j) => j.exclusive(drain, f),
            None => f(),
        }
    }

    /// Data and tags of whole blocks at `offset`, the journal's newer
    /// copies in place of the device's; per block, whether it came from
    /// the journal (its tag is ours: nothing to check).
    fn read_current(
        &self,
        run: &Run,
        offset: u64,
        buf: &mut [u8],
        tags: &mut [u8],
    ) -> DevResult<Vec<bool>> {
        match &run.journal {
            Some(j) => j.read(offset / 512, buf, tags, &|b, t| self.read_raw(offset, b, t)),
            None => {
                self.read_raw(offset, buf, tags)?;
                Ok(vec![false; buf.len() / self.g.block_bytes()])
            }
        }
    }

    fn mismatch(&self, sector: u64) -> DevError {
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            "integrity {}: checksum failed at sector {sector:#x}",
            self.p.dev
        );
        self.options.raise_event();
        DevError::Target(format!(
            "integrity: checksum failed at sector {sector} of {} (data and tag do not match)",
            self.p.dev
        ))
    }
}

impl BlockDevice for Integrity {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        let bb = self.g.block_bytes() as u32;
        let own = Limits {
            logical_block_size: bb,
            optimal_io_size: bb.max(4096),
            read_only: self.p.mode == Mode::Recovery,
            discard: self.p.opts.allow_discards,
            write_zeroes: false,
            ..Limits::default()
        };
        let mut l = own.stack(self.dev.limits());
        l.read_only |= self.meta.limits().read_only;
        l
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check_range(offset, buf.len())?;
        let g = &self.g;
        let ts = g.tag_size as usize;
        let bb = g.block_bytes();
        let mut tags = vec![0u8; buf.len() / bb * ts];
        // Taken before the tags are read: the recalculation moves it only
        // after the tags below it are written, so every tag checked here
        // was read after it was recomputed.
        let run = self.running()?;
        let checked_below = self.checked_below();
        let journaled = self.read_current(&run, offset, buf, &mut tags)?;
        drop(run);
        let Some(a) = self.alg.as_ref().filter(|_| self.p.mode != Mode::Recovery) else {
            return Ok(());
        };
        let mut want = vec![0u8; ts];
        for (k, (blk, t)) in buf.chunks(bb).zip(tags.chunks(ts)).enumerate() {
            if journaled[k] {
                continue;
            }
            let s = offset / 512 + ((k as u64) << g.log2_spb);
            if s >= checked_below {
                break;
            }
            a.tag(self.salt(), s, blk, &mut want);
            if !discard::tag_ok(&want, t, self.p.opts.allow_discards) {
                return Err(self.mismatch(s));
            }
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        if self.p.mode == Mode::Recovery {
            return Err(DevError::ReadOnly);
        }
        let data = data.as_slice();
        self.check_range(offset, data.len())?;
        let run = self.running()?;
        if let Some(j) = &run.journal {
            // The journal hashes each block as it copies it in: no buffer
            // of tags per write.
            let tags = match &self.alg {
                Some(alg) => writeback::Tags::Hash {
                    alg,
                    salt: self.salt(),
                },
                None => writeback::Tags::Zero,
            };
            return j.write(offset / 512, data, tags, fua);
        }
        drop(run);
        let mut tags = vec![0u8; data.len() / self.g.block_bytes() * self.g.tag_size as usize];
        self.compute_tags(offset / 512, data, &mut tags);
        self.write_blocks(offset, data, &tags, fua)
    }
    fn tag_layout(&self) -> Option<TagLayout> {
        self.alg.is_none().then(|| TagLayout {
            sector_size: self.g.block_bytes() as u32,
            tag_size: self.g.tag_size as u32,
        })
    }
    fn read_tagged(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> DevResult<()> {
        let l = self.tag_layout().ok_or(DevError::NotSupported(
            "tagged read: this integrity device computes its own tags (internal_hash)",
        ))?;
        self.check_range(offset, buf.len())?;
        if l.tags_for(buf.len()) != Some(tags.len()) {
            return Err(DevError::Target(format!(
                "integrity: {} tag bytes given for {} data bytes (want {} per {}-byte sector)",
                tags.len(),
                buf.len(),
                l.tag_size,
                l.sector_size
            )));
        }
        let run = self.running()?;
        self.read_current(&run, offset, buf, tags).map(|_| ())
    }
    fn write_tagged(&self, offset: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        let l = self.tag_layout().ok_or(DevError::NotSupported(
            "tagged write: this integrity device computes its own tags (internal_hash)",
        ))?;
        if self.p.mode == Mode::Recovery {
            return Err(DevError::ReadOnly);
        }
        self.check_range(offset, data.len())?;
        if l.tags_for(data.len()) != Some(tags.len()) {
            return Err(DevError::Target(format!(
                "integrity: {} tag bytes given for {} data bytes (want {} per {}-byte sector)",
                tags.len(),
                data.len(),
                l.tag_size,
                l.sector_size
            )));
        }
        self.write_blocks(offset, data, tags, fua)
    }
    fn flush(&self) -> DevResult<()> {
        if self.p.mode == Mode::Recovery {
            return Ok(());
        }
        // A suspended instance made everything durable at postsuspend
        // (the flush of `dmsetup suspend` comes after it).
        if matches!(self.run_read().phase, Phase::Suspended) {
            return Ok(());
        }
        let run = self.running()?;
        if let Some(j) = &run.journal {
            return j.flush();
        }
        let mut st = self.lock();
        self.flush_both()?;
        self.bitmap_tick(&mut st)
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.discard_blocks(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        write_zeroes_by_writing(self, offset, len, fua)
    }
}

impl Drop for Integrity {
    fn drop(&mut self) {
        self.end_recalc();
        // A table that never ran (loaded, then replaced or cleared)
        // leaves the disk as it found it.
        let mut r = std::mem::replace(
            self.run.get_mut().unwrap_or_else(|e| e.into_inner()),
            Run {
                phase: Phase::Loaded,
                journal: None,
            },
        );
        self.quiesce(&mut r);
    }
}

impl Target for Integrity {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, show_keys: bool) -> String {
        self.p.table_args(show_keys)
    }
    /// The kernel's: mismatches, provided data sectors, and the
    /// recalculation position or `-`.
    fn status(&self) -> String {
        let sb = self.lock().sb.clone();
        let recalc = if sb.has(flags::RECALCULATING) {
            sb.recalc_sector.to_string()
        } else {
            "-".into()
        };
        format!(
            "{} {} {recalc}",
            self.mismatches.load(Ordering::Relaxed),
            self.g.provided_data_sectors
        )
    }
    fn postsuspend(&self) {
        self.stop_recalc();
        let mut r = self.run.write().unwrap_or_else(|e| e.into_inner());
        self.quiesce(&mut r);
    }
    /// Replay, bitmap recovery and the resize happen here, after the old
    /// table's postsuspend, then the background jobs start; a failure
    /// fails this device (see [`Integrity::ensure_running`]).
    fn resume(&self) {
        if self.ensure_running().is_err() {
            return;
        }
        if let Some(me) = self.me.upgrade() {
            Integrity::start_recalc(&me);
        }
    }
}

/// The superblock area's size in bytes.
pub const SB_BYTES: u64 = SB_SECTORS * 512;

#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod meta_tests;
#[cfg(test)]
mod tests;
