//! The named devices of a running server, as dm keeps them (`dm-ioctl.c`):
//! each has a live table and maybe an inactive one, an event counter and
//! a minor number, and may be suspended. Tables are compiled (see
//! `compile`) against the live tables of the devices they name, and
//! re-compiled — the device and every device stacked on it — when one of
//! those changes, so a stack always runs on current, flat routes.
//!
//! This layer knows nothing of clients: holding requests while a table is
//! swapped is the caller's job (the control server holds each affected
//! device's engine queue between [`Devices::prepare_resume`] and
//! [`Devices::commit`]).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use zeroize::Zeroizing;

use super::build::BuildOptions;
use super::compile::{self, Compiled, Dep, Files, Lookup};
use crate::dm::live::LiveDevice;
use crate::dm::route::Routes;
use crate::mem::SecretText;
use crate::store::OpenFlags;
use crate::targets::{EventHook, Target, TargetOptions};

/// dm's limit on device names (DM_NAME_LEN less the NUL).
pub const MAX_NAME: usize = 127;

/// A device's event counter (`dmsetup wait`, `info`'s "Event number").
#[derive(Default)]
pub struct Events {
    nr: Mutex<u32>,
    cv: Condvar,
}

impl Events {
    pub fn raise(&self) {
        let mut n = self.nr.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.wrapping_add(1);
        self.cv.notify_all();
    }

    pub fn current(&self) -> u32 {
        *self.nr.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait at most `limit` for the counter to pass `after`; the counter.
    pub fn wait_past(&self, after: u32, limit: Duration) -> u32 {
        let n = self.nr.lock().unwrap_or_else(|p| p.into_inner());
        let (n, _) = self
            .cv
            .wait_timeout_while(n, limit, |n| *n <= after)
            .unwrap_or_else(|p| p.into_inner());
        *n
    }
}

/// A table as loaded: its text (for re-compiling when a device under it
/// changes) and its compiled form. The text may hold a crypt key in hex,
/// so it lives on locked, non-dumpable pages, and it is dropped (wiped)
/// when a `key wipe` message wipes the live target's key: a suspended
/// volume's key must not survive in the table text (`luksSuspend`).
/// `None` = wiped; a re-compile then needs the key set again.
pub struct Table {
    text: Option<SecretText>,
    /// Targets whose key is wiped; the text is re-rendered (with the keys
    /// set since) only when none is left, never with a zero key.
    wiped: Vec<Arc<dyn Target>>,
    pub compiled: Compiled,
}

impl Table {
    /// The table as `dmsetup table` prints it.
    pub fn text(&self, show_keys: bool) -> Zeroizing<String> {
        Zeroizing::new(self.compiled.mapped.table_text(show_keys))
    }
}

struct Dev {
    name: String,
    uuid: String,
    minor: u32,
    read_only: bool,
    device: Arc<LiveDevice>,
    live: Option<Table>,
    inactive: Option<Table>,
    suspended: bool,
    deferred_remove: bool,
    events: Arc<Events>,
}

/// A device as `info` and `ls` show it.
#[derive(Clone)]
pub struct DevInfo {
    pub name: String,
    pub uuid: String,
    pub minor: u32,
    pub read_only: bool,
    pub suspended: bool,
    pub live_table: bool,
    pub inactive_table: bool,
    pub deferred_remove: bool,
    pub event_nr: u32,
    /// Segments of the live table.
    pub targets: usize,
    /// Target types of the live table, in table order.
    pub target_types: Vec<String>,
    pub size: u64,
    /// What the live table names.
    pub deps: Vec<Dep>,
    pub device: Arc<LiveDevice>,
}

impl DevInfo {
    /// Why the device has failed, if it has (`core::fault`).
    pub fn failed(&self) -> Option<String> {
        self.device.fault().reason().map(str::to_string)
    }

    /// Which device under this one has failed, and why: this one's
    /// requests get EIO though its own code did not fail.
    pub fn lower_failed(&self) -> Option<String> {
        let routes = self.device.routes();
        let l = routes.failed_lower()?;
        Some(format!(
            "device '{}' under it has failed ({})",
            l.name,
            l.fault.reason().unwrap_or("unknown reason")
        ))
    }
}

/// One segment of a table, for `table` and `status`.
pub struct SegmentInfo {
    pub start: u64,
    pub len: u64,
    pub target: String,
    /// `table` parameters (keys masked unless asked).
    pub params: Zeroizing<String>,
    /// `status` parameters.
    pub status: String,
    /// What the target holds under its budget, if it keeps anything.
    pub memory: Option<crate::targets::TargetMemory>,
}

fn targets_of(t: &Table) -> Vec<Arc<dyn Target>> {
    t.compiled
        .mapped
        .segments()
        .iter()
        .map(|s| s.target.clone())
        .collect()
}

/// A resume prepared by [`Devices::prepare_resume`]: the new tables of the
/// device and of every device stacked on it, compiled and checked.
pub struct Plan {
    /// Lower devices first.
    swaps: Vec<(String, Table)>,
    /// The device resumed (its inactive table, if any, becomes live).
    pub name: String,
}

impl Plan {
    /// Names of the devices whose tables change (the device first, then
    /// the ones stacked on it); empty for a plain resume.
    pub fn affected(&self) -> Vec<String> {
        self.swaps.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The targets of every new table the plan swaps in.
    pub fn new_targets(&self) -> Vec<Arc<dyn Target>> {
        self.swaps.iter().flat_map(|(_, t)| targets_of(t)).collect()
    }

    /// The new size of device `name`, if the plan changes its table.
    pub fn new_size(&self, name: &str) -> Option<u64> {
        self.swaps
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.compiled.mapped.size_of())
    }

    /// The new logical block size of device `name`, if the plan changes it.
    pub fn new_block_size(&self, name: &str) -> Option<u32> {
        self.swaps
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.compiled.routes.limits_of().logical_block_size)
    }
}

/// Size and limits without importing the trait at every call site.
trait Measure {
    fn size_of(&self) -> u64;
    fn limits_of(&self) -> crate::core::Limits;
}

impl<T: crate::core::BlockDevice + ?Sized> Measure for T {
    fn size_of(&self) -> u64 {
        self.size()
    }
    fn limits_of(&self) -> crate::core::Limits {
        self.limits()
    }
}

struct Inner {
    devs: Vec<Dev>,
    files: Files,
}

/// The device named `name`, or the error every verb gives for a missing one.
fn find<'a>(devs: &'a [Dev], name: &str) -> Result<&'a Dev, String> {
    devs.iter()
        .find(|d| d.name == name)
        .ok_or_else(|| no_device(name))
}

fn find_mut<'a>(devs: &'a mut [Dev], name: &str) -> Result<&'a mut Dev, String> {
    devs.iter_mut()
        .find(|d| d.name == name)
        .ok_or_else(|| no_device(name))
}

/// The devices whose tables name `name` directly: the live ones, and with
/// `inactive` the loaded but not yet resumed ones too.
fn named_by(devs: &[Dev], name: &str, inactive: bool) -> Vec<String> {
    devs.iter()
        .filter(|d| {
            d.live
                .iter()
                .chain(d.inactive.iter().filter(|_| inactive))
                .any(|t| {
                    t.compiled
                        .deps
                        .iter()
                        .any(|x| matches!(x, Dep::Device(y) if y == name))
                })
        })
        .map(|d| d.name.clone())
        .collect()
}

/// Every device of a server.
pub struct Devices {
    inner: Mutex<Inner>,
    opts: BuildOptions,
    flatten: bool,
    histograms: bool,
}

/// Looks names up in the live tables, with some devices replaced by their
/// planned tables, and refuses a device that would depend on itself.
struct LiveLookup<'a> {
    devs: &'a [Dev],
    planned: &'a [(String, Table)],
    me: &'a str,
}

impl Lookup for LiveLookup<'_> {
    fn routes_of(&mut self, name: &str) -> Result<Arc<Routes>, String> {
        if name == self.me {
            return Err(format!("device '{name}' cannot be built on itself"));
        }
        if let Some((_, t)) = self.planned.iter().find(|(n, _)| n == name) {
            return Ok(t.compiled.routes.clone());
        }
        let d = self
            .devs
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| format!("no device named '{name}': create it first"))?;
        if let Some(why) = d.device.fault().reason() {
            return Err(format!(
                "device '{name}' has failed ({why}): nothing can be built on it; remove it and \
                 create it again"
            ));
        }
        if lowers(self.devs, name).iter().any(|l| l == self.me) {
            return Err(format!(
                "device '{name}' is built on '{}': a table of '{}' naming it would form a circle",
                self.me, self.me
            ));
        }
        match &d.live {
            Some(t) => Ok(t.compiled.routes.clone()),
            None => Err(format!(
                "device '{name}' has no live table yet: load and resume one first"
            )),
        }
    }

    fn fault_of(&mut self, name: &str) -> Option<Arc<crate::core::Fault>> {
        let d = self.devs.iter().find(|d| d.name == name)?;
        Some(d.device.fault().clone())
    }
}

/// The udm devices `name`'s live table names, transitively.
fn lowers(devs: &[Dev], name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut todo = vec![name.to_string()];
    while let Some(n) = todo.pop() {
        let Some(d) = devs.iter().find(|d| d.name == n) else {
            continue;
        };
        for dep in d.live.iter().flat_map(|t| t.compiled.deps.iter()) {
            if let Dep::Device(x) = dep {
                if !out.contains(x) {
                    out.push(x.clone());
                    todo.push(x.clone());
                }
            }
        }
    }
    out
}

/// The devices whose live tables name `name`, transitively, lower first.
fn uppers(devs: &[Dev], name: &str) -> Vec<String> {
    let direct = |n: &str| named_by(devs, n, false);
    // Depth-first post-order from `name`, reversed: every device comes
    // after everything it is stacked on.
    fn visit(
        n: &str,
        direct: &dyn Fn(&str) -> Vec<String>,
        seen: &mut Vec<String>,
        out: &mut Vec<String>,
    ) {
        for up in direct(n) {
            if !seen.contains(&up) {
                seen.push(up.clone());
                visit(&up, direct, seen, out);
                out.push(up);
            }
        }
    }
    let mut out = Vec::new();
    visit(name, &direct, &mut Vec::new(), &mut out);
    out.reverse();
    out
}

fn check_name(name: &str) -> Result<(), String> {
    if let Some(c) = name
        .chars()
        .find(|&c| crate::core::table::invisible_char(c))
    {
        return Err(format!(
            "invalid device name '{}': it holds U+{:04X}, a Unicode format or invisible \
             character that makes one name look like another; use visible characters only",
            name.escape_debug(),
            c as u32
        ));
    }
    if name.is_empty()
        || name.len() > MAX_NAME
        || name.contains(|c: char| c.is_whitespace() || c == '/' || c.is_control())
        || name.starts_with('@')
        || name == "."
        || name == ".."
    {
        return Err(format!(
            "invalid device name '{}': use 1 to {MAX_NAME} characters without spaces, '/' \
             or a leading '@'",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// A device's failure (`core::fault`) is an event (`dmsetup wait` wakes,
/// as for dm-thin's switch to `Fail`) and a log line that names it.
fn report_failures(device: &LiveDevice, name: &str, events: &Arc<Events>) {
    let (name, ev) = (name.to_string(), events.clone());
    device.fault().on_fail(Box::new(move |why| {
        tracing::error!(
            "device '{name}' has failed: {why}; its requests get EIO, other devices go on \
             (remove it, fix the cause and create it again)"
        );
        ev.raise();
    }));
}

fn no_device(name: &str) -> String {
    format!("device '{name}' does not exist")
}

impl Devices {
    /// `flatten`: compile stacks flat (always, but for ablations);
    /// `histograms`: latency histograms on by default.
    pub fn new(opts: BuildOptions, flatten: bool, histograms: bool) -> Devices {
        Devices {
            inner: Mutex::new(Inner {
                devs: Vec::new(),
                files: Files::default(),
            }),
            opts,
            flatten,
            histograms,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flags(&self, read_only: bool) -> OpenFlags {
        OpenFlags {
            read_only: self.opts.read_only || read_only,
            direct: self.opts.direct,
            no_map: self.opts.no_mmap,
        }
    }

    fn compile_for(
        &self,
        inner: &mut Inner,
        planned: &[(String, Table)],
        name: &str,
        text: SecretText,
    ) -> Result<Table, String> {
        let Inner { devs, files } = inner;
        let d = find(devs, name)?;
        let ev = d.events.clone();
        let options = TargetOptions {
            events: Some(EventHook(Arc::new(move || ev.raise()))),
            fault: Some(d.device.fault().clone()),
            device: Some(name.to_string()),
            ..self.opts.target.clone()
        };
        let flags = self.flags(d.read_only);
        let mut lookup = LiveLookup {
            devs,
            planned,
            me: name,
        };
        let compiled = compile::compile(
            text.as_str(),
            &mut lookup,
            files,
            flags,
            &options,
            self.flatten,
        )?;
        Ok(Table {
            text: Some(text),
            wiped: Vec::new(),
            compiled,
        })
    }

    /// A new device without a table (`dmsetup create --notable`).
    pub fn create(
        &self,
        name: &str,
        uuid: &str,
        read_only: bool,
    ) -> Result<Arc<LiveDevice>, String> {
        check_name(name)?;
        let mut inner = self.lock();
        if inner.devs.iter().any(|d| d.name == name) {
            return Err(format!("device '{name}' already exists"));
        }
        if !uuid.is_empty() && inner.devs.iter().any(|d| d.uuid == uuid) {
            return Err(format!("a device with uuid '{uuid}' already exists"));
        }
        let mut minor = 0;
        while inner.devs.iter().any(|d| d.minor == minor) {
            minor += 1;
        }
        let device = Arc::new(LiveDevice::new(
            read_only || self.opts.read_only,
            self.histograms,
        ));
        let events: Arc<Events> = Arc::default();
        report_failures(&device, name, &events);
        inner.devs.push(Dev {
            name: name.to_string(),
            uuid: uuid.to_string(),
            minor,
            read_only: read_only || self.opts.read_only,
            device: device.clone(),
            live: None,
            inactive: None,
            suspended: false,
            deferred_remove: false,
            events,
        });
        Ok(device)
    }

    /// Load `text` into the inactive slot of `name` (`dmsetup load`): the
    /// table is built and checked now; it becomes live at resume.
    pub fn load(&self, name: &str, text: Zeroizing<String>) -> Result<(), String> {
        let mut inner = self.lock();
        let t = self.compile_for(&mut inner, &[], name, SecretText::new(&text))?;
        drop(text);
        let d = find_mut(&mut inner.devs, name)?;
        d.inactive = Some(t);
        Ok(())
    }

    /// Drop the inactive table (`dmsetup clear`).
    pub fn clear(&self, name: &str) -> Result<(), String> {
        let mut inner = self.lock();
        let d = find_mut(&mut inner.devs, name)?;
        d.inactive = None;
        Ok(())
    }

    /// Build what resuming `name` makes live: its inactive table (if any)
    /// and, re-compiled over it, every device stacked on it. Nothing
    /// changes until [`Devices::commit`]; an error names the device whose
    /// table would not fit any more.
    pub fn prepare_resume(&self, name: &str) -> Result<Plan, String> {
        let mut inner = self.lock();
        let d = find(&inner.devs, name)?;
        let Some(inactive) = &d.inactive else {
            return Ok(Plan {
                swaps: Vec::new(),
                name: name.to_string(),
            });
        };
        let Some(text) = inactive.text.clone() else {
            return Err(format!("the inactive table of '{name}' has no text left"));
        };
        let mut planned = Vec::new();
        let t = self.compile_for(&mut inner, &planned, name, text)?;
        planned.push((name.to_string(), t));
        for up in uppers(&inner.devs, name) {
            let Some(live) = inner
                .devs
                .iter()
                .find(|d| d.name == up)
                .and_then(|d| d.live.as_ref())
            else {
                continue;
            };
            let Some(text) = live.text.clone() else {
                return Err(format!(
                    "device '{up}' stacked on '{name}' has had its key wiped (key wipe or \
                     luksSuspend); set its key again (luksResume, or message \"key set\") \
                     before reloading '{name}'"
                ));
            };
            let t = self
                .compile_for(&mut inner, &planned, &up, text)
                .map_err(|e| {
                    format!(
                        "the new table of '{name}' does not suit device '{up}' stacked on it: \
                         {e}; reload '{up}' first (or remove it)"
                    )
                })?;
            planned.push((up, t));
        }
        Ok(Plan {
            swaps: planned,
            name: name.to_string(),
        })
    }

    /// Make a prepared plan live: swap every affected device's routes,
    /// raise their events, and mark `plan.name` resumed. The caller holds
    /// every affected device's requests while this runs.
    pub fn commit(&self, plan: Plan) {
        let mut inner = self.lock();
        for (name, t) in plan.swaps {
            if let Some(d) = inner.devs.iter_mut().find(|d| d.name == name) {
                d.device.swap(t.compiled.routes.clone());
                // A table replacing another is an event (`dmsetup wait`
                // returns); a new device's first table is not, so its
                // counter starts at 0 as dm's does.
                if d.live.replace(t).is_some() {
                    d.events.raise();
                }
                if name == plan.name {
                    d.inactive = None;
                }
            }
        }
        if let Some(d) = inner.devs.iter_mut().find(|d| d.name == plan.name) {
            d.suspended = false;
        }
    }

    /// Mark `name` suspended (the caller has held its requests).
    pub fn set_suspended(&self, name: &str, on: bool) -> Result<(), String> {
        let mut inner = self.lock();
        let d = find_mut(&mut inner.devs, name)?;
        d.suspended = on;
        Ok(())
    }

    /// Mark `name` for removal when its last client leaves.
    pub fn set_deferred_remove(&self, name: &str) -> Result<(), String> {
        let mut inner = self.lock();
        let d = find_mut(&mut inner.devs, name)?;
        d.deferred_remove = true;
        Ok(())
    }

    /// `dmsetup message NAME 0 @cancel_deferred_remove`: the device stays.
    pub fn cancel_deferred_remove(&self, name: &str) -> Result<(), String> {
        let mut inner = self.lock();
        let d = find_mut(&mut inner.devs, name)?;
        d.deferred_remove = false;
        Ok(())
    }

    /// Devices stacked on `name` (whose live tables name it, directly or
    /// not), lower first.
    pub fn uppers(&self, name: &str) -> Vec<String> {
        uppers(&self.lock().devs, name)
    }

    /// Devices `name` is built on, directly or not.
    pub fn lowers(&self, name: &str) -> Vec<String> {
        lowers(&self.lock().devs, name)
    }

    /// Make every request of `name` fail from now on (what `remove
    /// --force` leaves to clients still attached, as dm's error table).
    pub fn fail(&self, name: &str) -> Result<(), String> {
        let inner = self.lock();
        let d = find(&inner.devs, name)?;
        let r = d.device.routes();
        d.device
            .swap(Arc::new(Routes::failing(r.size_of(), r.limits_of())));
        Ok(())
    }

    /// Forget `name`. Refused while another device is built on it.
    pub fn remove(&self, name: &str) -> Result<Arc<LiveDevice>, String> {
        let mut inner = self.lock();
        let i = inner
            .devs
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| no_device(name))?;
        let users = named_by(&inner.devs, name, true);
        if !users.is_empty() {
            return Err(format!(
                "device '{name}' is in use by {}: remove {} first",
                users.join(", "),
                if users.len() == 1 { "it" } else { "them" }
            ));
        }
        let d = inner.devs.remove(i);
        // Wake waiters so they see the device is gone.
        d.events.raise();
        Ok(d.device)
    }

    /// Rename a device. Refused while another device names it in a table
    /// (udm tables name devices, not numbers, so they would go stale).
    pub fn rename(&self, old: &str, new: &str) -> Result<(), String> {
        check_name(new)?;
        let mut inner = self.lock();
        if inner.devs.iter().any(|d| d.name == new) {
            return Err(format!("device '{new}' already exists"));
        }
        let users = named_by(&inner.devs, old, true);
        if !users.is_empty() {
            return Err(format!(
                "device '{old}' is named in the table of {}: udm tables name devices, so \
                 renaming it would break them; remove those first",
                users.join(", ")
            ));
        }
        let d = find_mut(&mut inner.devs, old)?;
        d.name = new.to_string();
        report_failures(&d.device, new, &d.events);
        d.events.raise();
        Ok(())
    }

    fn info_of(d: &Dev) -> DevInfo {
        DevInfo {
            name: d.name.clone(),
            uuid: d.uuid.clone(),
            minor: d.minor,
            read_only: d.read_only,
            suspended: d.suspended,
            live_table: d.live.is_some(),
            inactive_table: d.inactive.is_some(),
            deferred_remove: d.deferred_remove,
            event_nr: d.events.current(),
            targets: d
                .live
                .as_ref()
                .map_or(0, |t| t.compiled.mapped.segments().len()),
            target_types: d.live.as_ref().map_or_else(Vec::new, |t| {
                t.compiled
                    .mapped
                    .segments()
                    .iter()
                    .map(|s| s.target.type_name().to_string())
                    .collect()
            }),
            size: d.device.size_of(),
            deps: d
                .live
                .as_ref()
                .map_or_else(Vec::new, |t| t.compiled.deps.clone()),
            device: d.device.clone(),
        }
    }

    /// One device.
    pub fn info(&self, name: &str) -> Result<DevInfo, String> {
        let inner = self.lock();
        inner
            .devs
            .iter()
            .find(|d| d.name == name)
            .map(Self::info_of)
            .ok_or_else(|| no_device(name))
    }

    /// Every device, sorted by name (as `dmsetup ls` lists them).
    pub fn list(&self) -> Vec<DevInfo> {
        let inner = self.lock();
        let mut v: Vec<DevInfo> = inner.devs.iter().map(Self::info_of).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The event counter of `name`.
    pub fn events(&self, name: &str) -> Result<Arc<Events>, String> {
        let inner = self.lock();
        inner
            .devs
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.events.clone())
            .ok_or_else(|| no_device(name))
    }

    /// The segments of the live (or inactive) table of `name`; `None` when
    /// that slot is empty.
    pub fn segments(
        &self,
        name: &str,
        inactive: bool,
        show_keys: bool,
    ) -> Result<Option<Vec<SegmentInfo>>, String> {
        // Targets are asked outside the lock: a target that is slow or
        // stuck answering must not hold up `ls` and every other verb.
        let (fault, segs) = {
            let inner = self.lock();
            let d = find(&inner.devs, name)?;
            let t = if inactive { &d.inactive } else { &d.live };
            let Some(t) = t.as_ref() else {
                return Ok(None);
            };
            let segs: Vec<(u64, u64, Arc<dyn Target>)> = t
                .compiled
                .mapped
                .segments()
                .iter()
                .map(|s| (s.start, s.len, s.target.clone()))
                .collect();
            (d.device.fault().clone(), segs)
        };
        Ok(Some(
            segs.into_iter()
                .map(|(start, len, target)| {
                    // A panic in a target's report fails its device; a
                    // failed device reads `Fail`, as dm-thin's does.
                    let live_failed = || fault.is_failed() && !inactive;
                    let status = if live_failed() {
                        None
                    } else {
                        fault.contain("a status query", || Ok(target.status())).ok()
                    }
                    .filter(|_| !live_failed())
                    .unwrap_or_else(|| "Fail".to_string());
                    let params = fault
                        .contain("a table query", || Ok(target.table_params(show_keys)))
                        .unwrap_or_default();
                    SegmentInfo {
                        start: start / 512,
                        len: len / 512,
                        target: target.type_name().to_string(),
                        params: Zeroizing::new(params),
                        memory: if fault.is_failed() {
                            None
                        } else {
                            target.memory()
                        },
                        status,
                    }
                })
                .collect(),
        ))
    }

    /// The targets of `name`'s live table (none without one), for dm's
    /// suspend and resume hooks.
    pub fn live_targets(&self, name: &str) -> Result<Vec<Arc<dyn Target>>, String> {
        let inner = self.lock();
        let d = inner
            .devs
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| no_device(name))?;
        Ok(d.live.as_ref().map(targets_of).unwrap_or_default())
    }

    /// The targets that serve `plan.name` once `plan` is committed: its
    /// new table's, or the live one's for a plain resume.
    pub fn plan_targets(&self, plan: &Plan) -> Result<Vec<Arc<dyn Target>>, String> {
        match plan.swaps.iter().find(|(n, _)| *n == plan.name) {
            Some((_, t)) => Ok(targets_of(t)),
            None => self.live_targets(&plan.name),
        }
    }

    /// Send a message to the target at `sector` of `name`'s live table.
    pub fn message(
        &self,
        name: &str,
        sector: u64,
        argv: &[String],
    ) -> Result<Option<String>, String> {
        let target = {
            let inner = self.lock();
            let d = find(&inner.devs, name)?;
            if let Some(why) = d.device.fault().reason() {
                return Err(format!(
                    "device '{name}' has failed ({why}): it takes no messages; remove it and \
                     create it again"
                ));
            }
            let t = d
                .live
                .as_ref()
                .ok_or_else(|| format!("device '{name}' has no live table"))?;
            t.compiled
                .mapped
                .segment_at(sector.saturating_mul(512))
                .map(|s| s.target.clone())
                .ok_or_else(|| format!("sector {sector} is beyond the end of '{name}'"))?
        };
        crate::core::fault::inject_at("message", target.type_name());
        let reply = target.message(argv)?;
        self.follow_key_message(name, &target, argv);
        Ok(reply)
    }

    /// After a crypt key message succeeded on `target` of `name`'s live
    /// table: `key wipe` drops the table text (its hex key would outlive
    /// the wiped key otherwise); once `key set` has given every wiped
    /// target its key back, the text is re-rendered with the keys, so the
    /// table can be re-compiled again.
    fn follow_key_message(&self, name: &str, target: &Arc<dyn Target>, argv: &[String]) {
        let is = |i: usize, w: &str| argv.get(i).is_some_and(|a| a.eq_ignore_ascii_case(w));
        if !is(0, "key") {
            return;
        }
        let mut inner = self.lock();
        let Ok(d) = find_mut(&mut inner.devs, name) else {
            return;
        };
        let Some(t) = d.live.as_mut() else { return };
        // The table may have been swapped while the message ran unlocked.
        if !targets_of(t).iter().any(|x| Arc::ptr_eq(x, target)) {
            return;
        }
        if is(1, "wipe") {
            t.text = None;
            if !t.wiped.iter().any(|x| Arc::ptr_eq(x, target)) {
                t.wiped.push(target.clone());
            }
        } else if is(1, "set") {
            t.wiped.retain(|x| !Arc::ptr_eq(x, target));
            if t.text.is_none() && t.wiped.is_empty() {
                t.text = Some(SecretText::new(&t.text(true)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{BlockDevice, WriteBuf};

    fn z(s: &str) -> Zeroizing<String> {
        Zeroizing::new(s.to_string())
    }

    fn up(d: &Devices, name: &str, table: &str) {
        if d.info(name).is_err() {
            d.create(name, "", false).unwrap();
        }
        d.load(name, z(table)).unwrap();
        let plan = d.prepare_resume(name).unwrap();
        d.commit(plan);
    }

    /// Linear over striped over linear compiles to the striped target
    /// straight over the files; reloading the bottom re-compiles the stack.
    #[test]
    fn stacks_compile_flat_and_follow_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let f = |n: &str| {
            let p = dir.path().join(n);
            std::fs::File::create(&p).unwrap().set_len(4 << 20).unwrap();
            p.display().to_string()
        };
        let (a, b) = (f("a"), f("b"));
        let d = Devices::new(BuildOptions::default(), true, false);
        up(&d, "l1", &format!("0 4096 linear {a} 2048\n"));
        up(&d, "l2", &format!("0 4096 linear {b} 0\n"));
        up(&d, "s", "0 8192 striped 2 8 @l1 0 /dev/mapper/l2 0\n");
        up(&d, "top", "0 8192 linear @s 0\n");
        let top = d.info("top").unwrap().device;
        let routes = top.routes();
        assert_eq!(routes.routes().len(), 1);
        let s_routes = d.info("s").unwrap().device.routes();
        assert!(
            Arc::ptr_eq(&routes.routes()[0].dev, &s_routes.routes()[0].dev),
            "top's one route is s's striped target itself"
        );
        // Data lands where dm would put it: chunk 1 on leg 2 (file b at 0).
        let data = vec![0x5au8; 4096];
        top.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
        top.flush().unwrap();
        assert_eq!(std::fs::read(&b).unwrap()[..4096], data[..]);
        assert_eq!(
            d.segments("s", false, false).unwrap().unwrap()[0].status,
            "2 @l1 /dev/mapper/l2 1 AA"
        );
        assert_eq!(d.uppers("l2"), vec!["s".to_string(), "top".to_string()]);
        // Reload l2 to another place of b: s and top follow.
        d.load("l2", z(&format!("0 4096 linear {b} 4096\n")))
            .unwrap();
        let plan = d.prepare_resume("l2").unwrap();
        assert_eq!(plan.affected(), ["l2", "s", "top"]);
        d.commit(plan);
        let mut back = vec![0u8; 4096];
        top.read(4096, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 0), "reads the new place");
        assert_eq!(d.info("top").unwrap().event_nr, 1, "one table change");
        // Removing a device in use, renaming it, and circles are refused.
        assert!(d.remove("s").err().unwrap().contains("in use by top"));
        assert!(d
            .rename("s", "s2")
            .unwrap_err()
            .contains("named in the table"));
        d.load("l1", z("0 8 linear @top 0\n")).unwrap_err();
        // Shrinking l1 below what s needs is refused, naming s.
        d.load("l1", z(&format!("0 8 linear {a} 0\n"))).unwrap();
        let e = d.prepare_resume("l1").err().unwrap();
        assert!(e.contains("'s'"), "{e}");
    }

    /// A device's failure reaches every device compiled over it, however
    /// deep and however flat: their requests fail naming it, they are not
    /// failed themselves, and a device beside it goes on.
    #[test]
    fn a_failed_device_fails_the_requests_of_the_stack_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = |n: &str| {
            let p = dir.path().join(n);
            std::fs::File::create(&p).unwrap().set_len(4 << 20).unwrap();
            p.display().to_string()
        };
        let (a, b) = (f("a"), f("b"));
        for flatten in [true, false] {
            let d = Devices::new(BuildOptions::default(), flatten, false);
            up(&d, "l1", &format!("0 4096 linear {a} 0\n"));
            up(&d, "l2", &format!("0 4096 linear {b} 0\n"));
            up(&d, "s", "0 8192 striped 2 8 @l1 0 @l2 0\n");
            up(&d, "top", "0 8192 linear @s 0\n");
            up(&d, "beside", "0 4096 linear @l2 0\n");
            let top = d.info("top").unwrap().device;
            let names: Vec<_> = top
                .routes()
                .lower()
                .iter()
                .map(|l| l.name.to_string())
                .collect();
            assert_eq!(names, ["s", "l1", "l2"], "flatten {flatten}");
            let mut buf = vec![0u8; 8192];
            top.read(0, &mut buf).unwrap();
            d.info("l1").unwrap().device.fault().fail("a test");
            let e = top.read(0, &mut buf).unwrap_err();
            assert!(e.to_string().contains("device 'l1' under this one"), "{e}");
            assert_eq!(e.nbd_errno(false), 5);
            let w = top.write(0, WriteBuf::Borrowed(&buf), false);
            assert!(w.is_err(), "flatten {flatten}");
            assert!(top.flush().is_err() && top.discard(0, 4096).is_err());
            assert!(top.write_zeroes(0, 4096, false).is_err());
            assert!(!top.fault().is_failed(), "top's own code did not fail");
            let why = d.info("top").unwrap().lower_failed().unwrap();
            assert!(why.contains("'l1'") && why.contains("a test"), "{why}");
            assert!(d.info("beside").unwrap().lower_failed().is_none());
            let beside = d.info("beside").unwrap().device;
            beside.read(0, &mut buf[..4096]).unwrap();
        }
    }

    /// What the registry of start-time devices refused, the one path
    /// refuses too: an area past the end of the device below (naming the
    /// line), and a name no device has.
    #[test]
    fn stacked_areas_must_fit_and_names_must_exist() {
        let d = Devices::new(BuildOptions::default(), true, false);
        up(&d, "base", "0 16 zero\n");
        d.create("top", "", false).unwrap();
        let e = d.load("top", z("0 16 linear @base 8\n")).unwrap_err();
        assert!(e.contains("does not fit") && e.contains("line 1"), "{e}");
        d.load("top", z("0 8 linear @base 8\n")).unwrap();
        d.commit(d.prepare_resume("top").unwrap());
        assert_eq!(d.info("top").unwrap().device.size(), 4096);
        let e = d.load("top", z("0 8 linear @zz 0\n")).unwrap_err();
        assert!(e.contains("zz"), "{e}");
    }

    /// Crypt over a striped device: the crypt target is never handed the
    /// striped target itself (which takes only pieces inside a chunk), so
    /// a request across chunks is cut by the dm core under crypt.
    #[test]
    fn crypt_over_striped_is_cut_at_the_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let f = |n: &str| {
            let p = dir.path().join(n);
            std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
            p.display().to_string()
        };
        let (a, b) = (f("a"), f("b"));
        let d = Devices::new(BuildOptions::default(), true, false);
        up(&d, "s", &format!("0 256 striped 2 8 {a} 0 {b} 0\n"));
        let key = "01".repeat(64);
        up(
            &d,
            "c",
            &format!("0 256 crypt aes-xts-plain64 {key} 0 @s 0\n"),
        );
        let c = d.info("c").unwrap().device;
        let data: Vec<u8> = (0..16384u32).map(|i| (i % 251) as u8).collect();
        c.write(2048, WriteBuf::Borrowed(&data), false).unwrap();
        let mut back = vec![0u8; data.len()];
        c.read(2048, &mut back).unwrap();
        assert!(back == data);
        // The ciphertext is on both legs.
        let on = |p: &str| std::fs::read(p).unwrap()[..8192].iter().any(|&x| x != 0);
        assert!(on(&a) && on(&b));
    }

    /// The hex key must not outlive `key wipe` (luksSuspend) in the table
    /// text kept for re-compiling; `key set` brings the text back.
    #[test]
    fn key_wipe_drops_the_table_text_and_key_set_restores_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        let d = Devices::new(BuildOptions::default(), true, false);
        up(&d, "s", &format!("0 256 linear {} 0\n", p.display()));
        let key = "c0ffee42".repeat(16);
        up(
            &d,
            "c",
            &format!("0 256 crypt aes-xts-plain64 {key} 0 @s 0\n"),
        );
        let held = |d: &Devices| {
            let inner = d.lock();
            let c = inner.devs.iter().find(|x| x.name == "c").unwrap();
            c.live
                .as_ref()
                .unwrap()
                .text
                .as_ref()
                .map(|t| t.as_str().to_string())
        };
        assert!(held(&d).unwrap().contains(&key));
        for t in d.live_targets("c").unwrap() {
            t.postsuspend();
        }
        d.set_suspended("c", true).unwrap();
        let words = |w: &[&str]| w.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        d.message("c", 0, &words(&["key", "wipe"])).unwrap();
        assert_eq!(held(&d), None, "the text with the key is gone");
        // A reload under it cannot re-compile 'c' without its key.
        d.load("s", z(&format!("0 256 linear {} 0\n", p.display())))
            .unwrap();
        let e = d.prepare_resume("s").err().unwrap();
        assert!(e.contains("key wiped") && !e.contains(&key), "{e}");
        d.message("c", 0, &words(&["key", "set", &key])).unwrap();
        assert!(held(&d).unwrap().contains(&key), "re-rendered with the key");
        assert!(d.prepare_resume("s").is_ok());
    }
}
