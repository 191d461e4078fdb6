//! Targets, one file each as in Linux's drivers/md: a target maps the byte
//! range of one table segment onto the devices below it.
//!
//! Each target module exports a [`TargetType`] (its name, version and
//! constructor, like the kernel's `struct target_type`), and [`TYPES`]
//! lists them: adding a target means adding a file here and one line to
//! that list. Nothing below this layer knows any target by name.

use std::sync::Arc;

use crate::core::BlockDevice;

pub mod crypt;
pub mod delay;
pub mod dust;
pub mod error;
pub mod flakey;
pub mod integrity;
pub mod linear;
pub mod log_replay;
pub mod log_writes;
pub mod snapshot;
pub mod striped;
pub mod thin;
pub mod verity;
pub mod zero;

/// A table segment's target. Offsets passed to its [`BlockDevice`] methods
/// are relative to the segment start; `size()` is the segment length.
pub trait Target: BlockDevice {
    /// Target type as written in tables (`linear`, `crypt`, ...): each
    /// target returns its [`TargetType`]'s `name`, so the name is written
    /// once, where `TYPES` finds it.
    fn type_name(&self) -> &'static str;

    /// Parameters as `dmsetup table` prints them (devices by the name they
    /// were given). Keys are replaced by zeros of the same length unless
    /// `show_keys`, as dmsetup does without `--showkeys`.
    fn table_params(&self, show_keys: bool) -> String;

    /// The target's part of `dmsetup status` (what the kernel's
    /// `status_type == STATUSTYPE_INFO` prints); empty for targets with
    /// nothing to report, as linear, zero and error.
    fn status(&self) -> String {
        String::new()
    }

    /// A `dmsetup message` for this target (the words after the sector).
    /// Returns the text to print, if any; targets that take no messages
    /// refuse every one, as the kernel does with EINVAL.
    fn message(&self, argv: &[String]) -> Result<Option<String>, String> {
        Err(format!(
            "target {} accepts no messages (got '{}')",
            self.type_name(),
            argv.join(" ")
        ))
    }

    /// The memory this target keeps under a budget of its own, for
    /// `status --json`: a target whose working set outgrew its budget
    /// slows down without failing, and this is where that shows. `None`
    /// for targets that keep nothing between requests.
    fn memory(&self) -> Option<TargetMemory> {
        None
    }

    /// dm's `postsuspend`: the device's requests are held and the ones in
    /// flight have finished. dm-crypt takes key messages only from here
    /// until [`Target::resume`].
    fn postsuspend(&self) {}

    /// dm's `preresume`: the last word before this table serves requests
    /// again; an error keeps the device suspended (dm-crypt refuses while
    /// its key is wiped, as the kernel does with EAGAIN).
    fn preresume(&self) -> Result<(), String> {
        Ok(())
    }

    /// dm's `resume`: requests flow again.
    fn resume(&self) {}

    /// `Some((device, byte offset))` when this target is a plain offset
    /// shift onto one device (linear). The mapper compiles such segments
    /// away: a request goes straight to the device below (a stack of
    /// linear layers costs one call, see `mapper::compile`).
    fn as_linear(&self) -> Option<(&Arc<dyn BlockDevice>, u64)> {
        None
    }
}

/// A target's memory against its budget ([`Target::memory`]), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetMemory {
    /// Clean cached data (the thin pool's metadata nodes), dropped first
    /// when the budget is short.
    pub cached_bytes: u64,
    /// Data that must stay until it is written (the thin pool's nodes of
    /// the running transaction).
    pub pinned_bytes: u64,
    /// The budget both are charged to.
    pub budget_bytes: u64,
}

/// How a target tells its device that something happened that `dmsetup
/// wait` should see (dm's `dm_table_event`): e.g. a striped leg failing.
/// The mapper gives each table it builds the hook of its own device.
#[derive(Clone)]
pub struct EventHook(pub Arc<dyn Fn() + Send + Sync>);

impl EventHook {
    pub fn raise(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for EventHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventHook")
    }
}

/// A target type as tables name it: what `dmsetup targets` lists and what
/// a table line's third word is looked up in.
pub struct TargetType {
    pub name: &'static str,
    /// `dmsetup targets` prints it as `v1.4.0`.
    pub version: [u32; 3],
    pub new: Constructor,
    /// Names of the fixed arguments, for errors that name the field
    /// (`argument 2 (chunk_size)`); see [`TargetType::arg_name`].
    pub args: &'static [&'static str],
    /// Names arguments past `args` (e.g. striped's legs); `None` numbers them.
    pub more_args: Option<fn(usize) -> String>,
}

impl TargetType {
    /// How errors name argument `idx` (0-based) of this target.
    pub fn arg_name(&self, idx: usize) -> String {
        match self.args.get(idx) {
            Some(n) => format!("argument {} ({n})", idx + 1),
            None => match self.more_args {
                Some(f) => format!("argument {} ({})", idx + 1, f(idx)),
                None => format!("argument {}", idx + 1),
            },
        }
    }
}

/// Every target type udm has, in `dmsetup targets` order.
pub static TYPES: &[&TargetType] = &[
    &striped::TYPE,
    &linear::TYPE,
    &crypt::TYPE,
    &zero::TYPE,
    &error::TYPE,
    &flakey::TYPE,
    &delay::TYPE,
    &dust::TYPE,
    &log_writes::TYPE,
    &verity::TYPE,
    &snapshot::TYPE,
    &snapshot::ORIGIN_TYPE,
    &snapshot::MERGE_TYPE,
    &integrity::TYPE,
    &thin::pool::TYPE,
    &thin::dev::TYPE,
];

/// The target type a table names, if udm has it.
pub fn lookup(name: &str) -> Option<&'static TargetType> {
    TYPES.iter().copied().find(|t| t.name == name)
}

/// The names of every target type, for "unknown target" errors.
pub fn type_names() -> String {
    let names: Vec<&str> = TYPES.iter().map(|t| t.name).collect();
    names.join(", ")
}

/// Resolves a device argument of a table line (a path, or `@NAME` for
/// another device of the same server) to an open device.
pub trait DeviceResolver {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String>;

    /// A shorter path to the same bytes: `[offset, offset+len)` of `dev`
    /// (which [`DeviceResolver::resolve`] returned for `spec`) may lie on
    /// one device further down (e.g. `dev` is a linear device over a
    /// file); then `Some((that device, offset on it))`, and the target
    /// uses it instead, saving a layer per request. The table still shows
    /// `spec` and `offset`. Default: no shorter path.
    fn redirect(
        &mut self,
        _spec: &str,
        _dev: &Arc<dyn BlockDevice>,
        _offset: u64,
        _len: u64,
    ) -> Option<(Arc<dyn BlockDevice>, u64)> {
        None
    }

    /// The target objects of the device `dev` names (which
    /// [`DeviceResolver::resolve`] returned), when its table is one line
    /// over the whole device, whether or not stacks are folded: a target
    /// that works with another device's target itself (`thin` with its
    /// `thin-pool`) finds it here, not through [`DeviceResolver::redirect`],
    /// which `serve --no-flatten` turns off. Default: none.
    fn whole_target(&mut self, _dev: &Arc<dyn BlockDevice>) -> Option<Arc<dyn BlockDevice>> {
        None
    }
}

/// What a target constructor gets: its arguments (after the type name), the
/// segment length in bytes, and a resolver for device arguments.
pub struct TargetArgs<'a> {
    pub args: &'a [String],
    pub len: u64,
    pub resolver: &'a mut dyn DeviceResolver,
    /// Knobs from the command line that targets may honour
    /// (e.g. `--crypt-threads`).
    pub options: &'a TargetOptions,
}

/// Server-wide settings that reach target constructors.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// Threads a crypt target may use to split one request (0 = all cores).
    pub crypt_threads: usize,
    /// Where targets report events (`dmsetup wait`); none outside a
    /// managed device.
    pub events: Option<EventHook>,
    /// The failure state of the device the target is built for: its
    /// background jobs fail that device when they panic
    /// ([`TargetOptions::spawn_job`]); none outside a managed device.
    pub fault: Option<Arc<crate::core::Fault>>,
    /// The server's ledger of pinned metadata memory (`--pinned-memory`);
    /// none: the process-wide one ([`crate::mem::PinnedLedger::global`]).
    pub pinned: Option<Arc<crate::mem::PinnedLedger>>,
    /// The name of the device the target is built for, for errors.
    pub device: Option<String>,
}

impl TargetOptions {
    /// Start one of the target's background jobs (merge, writeback,
    /// timed commit, recalculation) so that a panic in it fails this
    /// device alone (`core::fault`).
    pub fn spawn_job<F>(&self, name: String, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
    where
        F: FnOnce() + Send + 'static,
    {
        crate::core::fault::spawn_job(name, self.fault.clone(), f)
    }

    /// Reserve `bytes` of pinned metadata memory for `what` before it is
    /// allocated (see `mem::pinned`); `fix` names the smaller setting that
    /// would fit. The reservation lives as long as the memory it covers.
    pub fn pin(&self, what: &str, bytes: u64, fix: &str) -> Result<crate::mem::Pinned, String> {
        let ledger = self
            .pinned
            .clone()
            .unwrap_or_else(crate::mem::PinnedLedger::global);
        ledger.reserve(self.device.as_deref(), what, bytes, fix)
    }

    /// Report an event to the device, if anyone listens.
    pub fn raise_event(&self) {
        if let Some(h) = &self.events {
            h.raise();
        }
    }
}

/// A constructor error: which argument (0-based index into `args`, or
/// `None` for the line as a whole) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetError {
    pub arg: Option<usize>,
    pub msg: String,
}

impl TargetError {
    pub fn at(arg: usize, msg: impl Into<String>) -> Self {
        TargetError {
            arg: Some(arg),
            msg: msg.into(),
        }
    }
    pub fn line(msg: impl Into<String>) -> Self {
        TargetError {
            arg: None,
            msg: msg.into(),
        }
    }
}

/// Signature every target constructor has.
pub type Constructor = fn(TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError>;

/// The constructor of a target type by name (`linear`, `striped`, ...).
pub fn table_constructor(name: &str) -> Option<Constructor> {
    lookup(name).map(|t| t.new)
}

/// Parse argument `idx` as a decimal count of 512-byte sectors that fits a
/// byte offset (at most `i64::MAX` bytes, as the kernel's `sector_t` in
/// bytes does).
pub fn parse_sectors(args: &[String], idx: usize) -> Result<u64, TargetError> {
    let v = parse_number(args, idx, "a decimal number of 512-byte sectors")?;
    if v > (i64::MAX as u64) >> 9 {
        return Err(TargetError::at(
            idx,
            format!("'{}' is too large", args[idx]),
        ));
    }
    Ok(v)
}

/// Parse argument `idx` as an unsigned decimal (digits only, the one
/// parser of [`crate::core::units`]); `expected` says what it should be.
pub fn parse_number(args: &[String], idx: usize, expected: &str) -> Result<u64, TargetError> {
    let s = args
        .get(idx)
        .ok_or_else(|| TargetError::at(idx, "missing"))?;
    crate::core::units::parse_decimal(s).map_err(|e| match e {
        crate::core::units::DecimalError::TooLarge => {
            TargetError::at(idx, format!("'{s}' is too large"))
        }
        _ => TargetError::at(idx, format!("expected {expected}, got '{s}'")),
    })
}

/// A device area a target maps onto: the device, the name it was given in
/// the table (printed back by `table`), and the byte offset of the area.
///
/// `dev`/`offset` are where I/O goes; they may be a shorter path to the
/// same bytes than the table names (see [`DeviceResolver::redirect`]), so
/// `table` prints `name` and `given` instead.
pub struct Area {
    pub dev: Arc<dyn BlockDevice>,
    pub name: String,
    pub offset: u64,
    /// The offset as the table gave it, in bytes.
    pub given: u64,
}

impl Area {
    /// The device name as a table prints it (escaped so that it reads back
    /// as one word: see [`crate::core::table::escape_arg`]).
    pub fn table_name(&self) -> std::borrow::Cow<'_, str> {
        crate::core::table::escape_arg(&self.name)
    }

    /// The offset as the table gave it, in 512-byte sectors.
    pub fn table_offset(&self) -> u64 {
        self.given / 512
    }
}

/// Resolve `<dev> <offset>` at `dev_idx`, `dev_idx + 1` and check that an
/// area of `len` bytes starting there lies inside the device.
pub fn resolve_area(a: &mut TargetArgs<'_>, dev_idx: usize, len: u64) -> Result<Area, TargetError> {
    let name = a
        .args
        .get(dev_idx)
        .ok_or_else(|| TargetError::at(dev_idx, "missing device"))?
        .clone();
    let sectors = parse_sectors(a.args, dev_idx + 1)?;
    let dev = a
        .resolver
        .resolve(&name)
        .map_err(|e| TargetError::at(dev_idx, e))?;
    let offset = sectors * 512;
    let size = dev.size();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(TargetError::at(
            dev_idx + 1,
            format!(
                "area [{sectors}, +{}) sectors does not fit in {name}, which has {} sectors",
                len / 512,
                size / 512
            ),
        ));
    }
    let (dev, at) = match a.resolver.redirect(&name, &dev, offset, len) {
        Some((d, o)) => (d, o),
        None => (dev, offset),
    };
    Ok(Area {
        dev,
        name,
        offset: at,
        given: offset,
    })
}

/// Check the argument count of a target with a fixed number of arguments.
pub fn expect_args(args: &[String], n: usize, usage: &str) -> Result<(), TargetError> {
    if args.len() != n {
        return Err(TargetError::line(format!(
            "expected {n} arguments ({usage}), got {}",
            args.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod fault_tests;
