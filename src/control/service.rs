//! What each control request does: the named devices of `mapper` on one
//! side, their NBD exports and engine queues on the other. This is where
//! dm's suspend and resume happen:
//!
//! - **suspend** holds the engine queue of the device and of every device
//!   stacked on it (in the kernel their I/O would queue at the suspended
//!   device; here stacks are compiled flat, so it is held at their own
//!   queues), waits for the requests running on them to finish, then
//!   flushes the device (unless `--noflush`). Requests arriving meanwhile
//!   wait in arrival order; other devices are untouched.
//! - **resume** compiles the inactive table and, over it, every device
//!   stacked on it; checks them (sizes clients rely on, block sizes the
//!   queues were built for); holds and drains all of them; swaps their
//!   routes in one step; then lets the held requests go — they run on the
//!   new tables, the ones that were running finished on the old.
//!
//! Mutating requests are serialised (one at a time, as dm's ioctls on a
//! device are); reading ones only take the device registry's lock briefly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use zeroize::Zeroizing;

use super::model::*;
use super::proto::{Code, OpError, Request};
use crate::core::BlockDevice;
use crate::mapper::compile::Dep;
use crate::mapper::{DevInfo, Devices};
use crate::nbd::export::{describe_rule, parse_allow_list};
use crate::nbd::{Allow, Export, ExportSet, Exported};

type OpResult = Result<(Value, Zeroizing<Vec<u8>>), OpError>;

fn ok(v: Value) -> OpResult {
    Ok((v, Zeroizing::new(Vec::new())))
}

fn err(code: Code, msg: impl Into<String>) -> OpError {
    OpError::new(code, msg)
}

/// Map a registry error to a reply code by what it says.
fn classify(msg: String) -> OpError {
    let code = if msg.contains("does not exist") {
        Code::Enxio
    } else if msg.contains("already exists") {
        Code::Eexist
    } else if msg.contains("in use") || msg.contains("named in the table") {
        Code::Ebusy
    } else {
        Code::Einval
    };
    OpError::new(code, msg)
}

/// The devices and exports of one server, and how requests change them.
pub struct Service {
    devices: Arc<Devices>,
    exports: Arc<ExportSet>,
    /// Export every device read-only (`udm serve --read-only`).
    read_only: bool,
    op: Mutex<()>,
    stopping: AtomicBool,
    /// `create --allow` rules by device name: they narrow the name's
    /// rule for as long as the device exists (also across the export a
    /// later resume adds).
    narrow: Mutex<std::collections::HashMap<String, Vec<Allow>>>,
    /// Where clients reach the devices, for `info` and `status`.
    locations: std::sync::RwLock<Locations>,
    /// Most lines a table sent over the control socket may have.
    max_table_lines: std::sync::atomic::AtomicUsize,
    /// The devices' block nodes (`serve --mapper-block`), if any.
    nodes: std::sync::RwLock<Option<Arc<dyn DeviceNodes>>>,
}

/// Block nodes that follow the exports (`serve --mapper-block`: a loop
/// device per device file). The verbs keep them in step, so that a node
/// is there when a create or resume replies and gone when a remove does,
/// as udev's /dev/mapper links are for dm devices.
pub trait DeviceNodes: Send + Sync {
    /// `name` is exported: make its node, or bring the node's size up to
    /// the device's.
    fn present(&self, name: &str) -> Result<(), String>;
    /// `name` is about to go: its node goes first. A node held open is an
    /// error saying so, unless `force` (it then goes at its last close).
    fn release(&self, name: &str, force: bool) -> Result<(), String>;
    /// Let the node go at its last close (a deferred remove).
    fn release_when_closed(&self, name: &str) -> Result<(), String>;
    /// Undo [`DeviceNodes::release_when_closed`] (the deferred remove was
    /// cancelled).
    fn keep(&self, name: &str);
    fn renamed(&self, old: &str, new: &str);
    /// How many of the export's openers are its node (not clients).
    fn holds(&self, name: &str) -> usize;
}

/// Default of `udm serve --max-table-lines`: far more than any real
/// device needs (LVM volumes have a handful of segments), few enough that
/// one device's `status` fits a reply and listings stay small.
pub const DEFAULT_MAX_TABLE_LINES: usize = 16384;

/// Lines of a table text that are segments (not blank, not comments).
fn table_lines(text: &str) -> usize {
    text.lines()
        .filter(|l| {
            let t = l.trim_start();
            !t.is_empty() && !t.starts_with('#')
        })
        .count()
}

/// Where a server's devices can be reached, shown by `info` and
/// `cryptsetup status`.
#[derive(Debug, Clone, Default)]
pub struct Locations {
    /// `--mapper-dir`: each exported device is the file DIR/NAME.
    pub mapper_dir: Option<std::path::PathBuf>,
    /// The NBD listener: a Unix socket path, or TCP `HOST[:PORT]`.
    pub nbd: Option<crate::nbd::Listen>,
}

impl Locations {
    fn file(&self, name: &str) -> Option<String> {
        let ok = !name.is_empty() && name != "." && name != ".." && !name.contains('/');
        let dir = self.mapper_dir.as_ref().filter(|_| ok)?;
        Some(dir.join(name).display().to_string())
    }

    fn nbd_uri(&self, name: &str) -> Option<String> {
        let enc = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
        match self.nbd.as_ref()? {
            crate::nbd::Listen::Unix(p) => {
                Some(format!("nbd+unix:///{enc}?socket={}", p.display()))
            }
            crate::nbd::Listen::Tcp(h) => {
                let port = h
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
                let at = if port {
                    h.clone()
                } else {
                    format!("{h}:{}", crate::nbd::DEFAULT_PORT)
                };
                Some(format!("nbd://{at}/{enc}"))
            }
            // Sockets a service manager passed: ask them where they are.
            crate::nbd::Listen::ActivatedUnix(u) => {
                let a = u.local_addr().ok()?;
                let p = a.as_pathname()?;
                Some(format!("nbd+unix:///{enc}?socket={}", p.display()))
            }
            crate::nbd::Listen::ActivatedTcp(t) => {
                Some(format!("nbd://{}/{enc}", t.local_addr().ok()?))
            }
        }
    }
}

impl Service {
    pub fn new(devices: Arc<Devices>, exports: Arc<ExportSet>, read_only: bool) -> Service {
        Service {
            devices,
            exports,
            read_only,
            op: Mutex::new(()),
            stopping: AtomicBool::new(false),
            narrow: Mutex::default(),
            locations: Default::default(),
            max_table_lines: DEFAULT_MAX_TABLE_LINES.into(),
            nodes: Default::default(),
        }
    }

    /// Keep `nodes` in step with the exports from now on (the ones that
    /// exist already are the caller's to present).
    pub fn set_nodes(&self, nodes: Arc<dyn DeviceNodes>) {
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = Some(nodes);
    }

    fn nodes(&self) -> Option<Arc<dyn DeviceNodes>> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `udm serve --max-table-lines`.
    pub fn set_max_table_lines(&self, n: usize) {
        self.max_table_lines.store(n.max(1), Ordering::Relaxed);
    }

    /// Tell `info` and `status` where clients reach the devices.
    pub fn set_locations(&self, l: Locations) {
        *self.locations.write().unwrap_or_else(|p| p.into_inner()) = l;
    }

    pub fn devices(&self) -> &Arc<Devices> {
        &self.devices
    }

    pub fn exports(&self) -> &Arc<ExportSet> {
        &self.exports
    }

    /// The server is shutting down: `wait` requests return.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn export_of(&self, name: &str) -> Option<Arc<Exported>> {
        self.exports
            .list()
            .into_iter()
            .find(|e| e.export.name == name)
    }

    /// Clients of `name` (NBD connections, open files), not counting the
    /// hold of its block node.
    fn open_count(&self, name: &str) -> u32 {
        let held = self.nodes().map_or(0, |n| n.holds(name));
        self.export_of(name)
            .map_or(0, |e| e.connections().saturating_sub(held) as u32)
    }

    /// Who may use `name` over NBD and whether it is read-only there: its
    /// export's rules, or (no export yet) those it will get.
    fn access(&self, name: &str) -> (Vec<String>, bool) {
        if let Some(e) = self.export_of(name) {
            let rules = e.rules().iter().map(|r| describe_rule(r)).collect();
            return (rules, e.export.read_only);
        }
        let policy = self.exports.policy();
        let (inherited, ro) = self.inherited(name);
        let mut rules: Vec<String> = Vec::new();
        let own = [policy.rule(name).to_vec(), self.narrowing(name)];
        for r in own.into_iter().chain(inherited) {
            let r = describe_rule(&r);
            if !r.is_empty() && !rules.contains(&r) {
                rules.push(r);
            }
        }
        (rules, policy.is_read_only(name) || ro)
    }

    /// The rules of every device `name` is built on, and whether any of
    /// them is read-only: a stacked device reaches their bytes, so it may
    /// be no more open nor writable than they are.
    fn inherited(&self, name: &str) -> (Vec<Vec<Allow>>, bool) {
        let policy = self.exports.policy();
        let mut rules: Vec<Vec<Allow>> = Vec::new();
        let mut ro = false;
        for l in self.devices.lowers(name) {
            let theirs = match self.export_of(&l) {
                Some(e) => {
                    ro |= e.export.is_read_only();
                    e.rules()
                }
                None => {
                    ro |=
                        policy.is_read_only(&l) || self.devices.info(&l).is_ok_and(|d| d.read_only);
                    vec![policy.rule(&l).to_vec(), self.narrowing(&l)]
                }
            };
            for r in theirs {
                if !r.is_empty() && !rules.contains(&r) {
                    rules.push(r);
                }
            }
        }
        (rules, ro)
    }

    fn narrowing(&self, name: &str) -> Vec<Allow> {
        let map = self.narrow.lock().unwrap_or_else(|p| p.into_inner());
        map.get(name).cloned().unwrap_or_default()
    }

    fn device_info(&self, d: &DevInfo) -> DeviceInfo {
        let all = self.devices.list();
        let (allow, export_ro) = self.access(&d.name);
        let exported = self.export_of(&d.name).is_some();
        let at = self.locations.read().unwrap_or_else(|p| p.into_inner());
        DeviceInfo {
            failed: d.failed(),
            lower_failed: d.lower_failed(),
            allow,
            file: at.file(&d.name).filter(|_| exported),
            nbd_uri: at.nbd_uri(&d.name).filter(|_| exported),
            name: d.name.clone(),
            uuid: d.uuid.clone(),
            major: MAJOR,
            minor: d.minor,
            read_only: d.read_only || self.read_only || export_ro,
            suspended: d.suspended,
            live_table: d.live_table,
            inactive_table: d.inactive_table,
            deferred_remove: d.deferred_remove,
            open_count: self.open_count(&d.name),
            event_nr: d.event_nr,
            target_count: d.targets as u32,
            // One entry per type, not per segment: a listing of every
            // device must stay small whatever their tables.
            target_types: d.target_types.iter().fold(Vec::new(), |mut v, t| {
                if !v.contains(t) {
                    v.push(t.clone());
                }
                v
            }),
            size_sectors: d.size / 512,
            deps: d
                .deps
                .iter()
                .map(|x| match x {
                    Dep::Device(n) => DepInfo {
                        kind: "device".into(),
                        name: n.clone(),
                        minor: all.iter().find(|o| &o.name == n).map(|o| o.minor),
                    },
                    Dep::Path(p) => DepInfo {
                        kind: "path".into(),
                        name: p.clone(),
                        minor: None,
                    },
                })
                .collect(),
        }
    }

    /// The devices a read-only request is about: the named ones, or all.
    fn selected(&self, names: &[String]) -> Result<Vec<DevInfo>, OpError> {
        if names.is_empty() {
            return Ok(self.devices.list());
        }
        names
            .iter()
            .map(|n| self.devices.info(n).map_err(classify))
            .collect()
    }

    fn one_name(req: &Request) -> Result<&str, OpError> {
        match req.names.as_slice() {
            [n] => Ok(n),
            [] => Err(err(Code::Einval, format!("{}: give a device name", req.op))),
            _ => Err(err(
                Code::Einval,
                format!("{}: give one device name, not {}", req.op, req.names.len()),
            )),
        }
    }

    /// Run one request. `payload` is the table for `create`/`load`;
    /// `alive` tells a long `wait` whether its client is still there.
    ///
    /// Verbs run device code (constructors, messages, suspend hooks): a
    /// panic there fails the devices the request names (`core::fault`)
    /// and answers `EIO`, and this connection and the server go on.
    pub fn handle(
        &self,
        req: &Request,
        payload: Zeroizing<Vec<u8>>,
        alive: &dyn Fn() -> bool,
    ) -> OpResult {
        let run = std::panic::AssertUnwindSafe(|| self.handle_verb(req, payload, alive));
        std::panic::catch_unwind(run).unwrap_or_else(|p| {
            let why = format!(
                "the control verb '{}' panicked: {}",
                req.op.escape_debug(),
                crate::core::fault::panic_message(&*p)
            );
            let mut failed = Vec::new();
            for n in &req.names {
                if let Ok(d) = self.devices.info(n) {
                    d.device.fault().fail(why.clone());
                    failed.push(n.as_str());
                }
            }
            tracing::error!("control: {why}; devices marked failed: {failed:?}");
            Err(err(
                Code::Eio,
                format!(
                    "{why}. The device(s) {failed:?} are marked failed (their requests get EIO); \
                     the server and the other devices go on. Remove and re-create them."
                ),
            ))
        })
    }

    fn handle_verb(
        &self,
        req: &Request,
        payload: Zeroizing<Vec<u8>>,
        alive: &dyn Fn() -> bool,
    ) -> OpResult {
        let table = || -> Result<Zeroizing<String>, OpError> {
            let text = std::str::from_utf8(&payload)
                .map_err(|_| err(Code::Einval, "the table is not UTF-8 text"))?;
            let (n, max) = (
                table_lines(text),
                self.max_table_lines.load(Ordering::Relaxed),
            );
            if n > max {
                return Err(err(
                    Code::Einval,
                    format!(
                        "the table has {n} lines, over the limit of {max} per device \
                         (raise it with `udm serve --max-table-lines`)"
                    ),
                ));
            }
            Ok(Zeroizing::new(text.to_string()))
        };
        match req.op.as_str() {
            "version" => ok(json!({
                "version": env!("CARGO_PKG_VERSION"),
                "protocol": super::proto::VERSION,
            })),
            "targets" => ok(json!({
                "targets": crate::targets::TYPES
                    .iter()
                    .map(|t| TargetVersion { name: t.name.to_string(), version: t.version })
                    .collect::<Vec<_>>()
            })),
            "create" => {
                let t = if req.has_table { Some(table()?) } else { None };
                self.create_op(req, t)
            }
            "load" | "reload" => {
                let name = Self::one_name(req)?;
                self.load(name, table()?, req.force)
            }
            "suspend" => {
                for n in &req.names {
                    self.suspend(n, req.noflush)?;
                }
                ok(json!({}))
            }
            "resume" => {
                for n in &req.names {
                    self.resume(n, req.force)?;
                }
                ok(json!({}))
            }
            "remove" => {
                for n in &req.names {
                    self.remove(n, req.force, req.deferred)?;
                }
                ok(json!({}))
            }
            "remove_all" => self.remove_all(req.force, req.deferred),
            "rename" => self.rename(req),
            "clear" => {
                let name = Self::one_name(req)?;
                self.devices.clear(name).map_err(classify)?;
                ok(json!({}))
            }
            "info" | "ls" | "deps" => {
                let devs = self.selected(&req.names)?;
                ok(
                    json!({ "devices": devs.iter().map(|d| self.device_info(d)).collect::<Vec<_>>() }),
                )
            }
            "table" => self.table(req),
            "status" => self.status(req),
            "message" => self.message_op(req, &payload),
            "wait" => self.wait(req, alive),
            "stats_create" | "stats_delete" | "stats_list" => {
                super::regions::run(req, &self.selected(&req.names)?).and_then(ok)
            }
            "stats_clear" => {
                for d in self.selected(&req.names)? {
                    d.device.stats().clear();
                }
                ok(json!({}))
            }
            other => Err(err(
                Code::Enosys,
                format!(
                    "unknown operation '{}' (this server speaks control protocol {})",
                    other.escape_debug(),
                    super::proto::VERSION
                ),
            )),
        }
    }

    /// The device, its export and its `create --allow` rule take the new
    /// name (the export also gains the rules of the new name).
    fn rename(&self, req: &Request) -> OpResult {
        let name = Self::one_name(req)?;
        let new = req
            .new_name
            .as_deref()
            .ok_or_else(|| err(Code::Einval, "rename: give the new name"))?;
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        self.devices.rename(name, new).map_err(classify)?;
        {
            let mut map = self.narrow.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = map.remove(name) {
                map.insert(new.to_string(), r);
            }
        }
        if self.export_of(name).is_some() {
            self.exports
                .rename(name, new)
                .map_err(|e| err(Code::Eexist, e))?;
            if let Some(nodes) = self.nodes() {
                nodes.renamed(name, new);
            }
        }
        ok(json!({}))
    }

    fn status(&self, req: &Request) -> OpResult {
        let devs = self.selected(&req.names)?;
        let mut out = Vec::new();
        for d in devs {
            let segs = self
                .devices
                .segments(&d.name, false, false)
                .map_err(classify)?
                .unwrap_or_default();
            out.push(DeviceStatus {
                failed: d.failed(),
                lower_failed: d.lower_failed(),
                name: d.name.clone(),
                major: MAJOR,
                minor: d.minor,
                suspended: d.suspended,
                size_sectors: d.size / 512,
                open_count: self.open_count(&d.name),
                event_nr: d.event_nr,
                targets: segs
                    .into_iter()
                    .map(|s| TargetStatus {
                        start: s.start,
                        length: s.len,
                        target_type: s.target,
                        status: s.status,
                        memory: s.memory,
                    })
                    .collect(),
                stats: d.device.stats().snapshot(),
                queue_depth: d.device.limits().queue_depth,
                files: file_reports(&d.deps),
            });
        }
        ok(json!({ "devices": out }))
    }

    /// Block until the event counter passes `req.event_nr`, the device
    /// goes, the client leaves or the server stops.
    fn wait(&self, req: &Request, alive: &dyn Fn() -> bool) -> OpResult {
        let name = Self::one_name(req)?;
        let ev = self.devices.events(name).map_err(classify)?;
        loop {
            let n = ev.wait_past(req.event_nr, Duration::from_millis(250));
            if n > req.event_nr {
                return ok(json!({ "event_nr": n }));
            }
            if self.devices.info(name).is_err() {
                return Err(err(Code::Enxio, format!("device '{name}' was removed")));
            }
            if !alive() || self.stopping.load(Ordering::SeqCst) {
                return Err(err(Code::Eagain, "wait abandoned"));
            }
        }
    }

    fn create_op(&self, req: &Request, t: Option<Zeroizing<String>>) -> OpResult {
        let name = Self::one_name(req)?;
        let allow = match &req.allow {
            Some(l) => parse_allow_list(l)
                .map_err(|e| err(Code::Einval, format!("create --allow: {e}")))?,
            None => Vec::new(),
        };
        self.create(
            name,
            req.uuid.as_deref().unwrap_or(""),
            req.readonly,
            allow,
            t,
        )
    }

    /// A message may carry a key (`key set`): clients send it in the
    /// payload, read into a buffer wiped on drop, and split into words
    /// that are wiped too.
    fn message_op(&self, req: &Request, payload: &[u8]) -> OpResult {
        let name = Self::one_name(req)?;
        let words = if req.message.is_empty() {
            let text = std::str::from_utf8(payload)
                .map_err(|_| err(Code::Einval, "the message is not UTF-8 text"))?;
            Zeroizing::new(text.split_whitespace().map(str::to_string).collect())
        } else {
            Zeroizing::new(req.message.clone())
        };
        self.message(name, req.sector, &words)
    }

    /// The tables of the selected devices, one line per segment, in one
    /// buffer sized before anything is written into it: with `--showkeys`
    /// the lines carry keys, and a buffer that grew would leave copies of
    /// them behind in the memory it gave back.
    fn table(&self, req: &Request) -> OpResult {
        let devs = self.selected(&req.names)?;
        if req.showkeys {
            // An audit trail of every key that leaves the server.
            let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
            tracing::info!("control: table with keys (--showkeys) of {names:?}");
        }
        let mut all = Vec::with_capacity(devs.len());
        for d in devs {
            let segs = self
                .devices
                .segments(&d.name, req.inactive, req.showkeys)
                .map_err(classify)?
                .unwrap_or_default();
            all.push((d.name.clone(), segs));
        }
        // Two u64 in decimal, three spaces and a newline around each
        // segment's target type and parameters.
        let size: usize = all
            .iter()
            .flat_map(|(_, segs)| segs.iter())
            .map(|s| 2 * 20 + 4 + s.target.len() + s.params.len())
            .sum();
        let mut text = Zeroizing::new(String::with_capacity(size));
        let cap = text.capacity();
        let mut out = Vec::with_capacity(all.len());
        for (name, segs) in &all {
            for s in segs {
                use std::fmt::Write;
                let _ = write!(text, "{} {} {} ", s.start, s.len, s.target);
                text.push_str(&s.params);
                text.push('\n');
            }
            out.push(TableDevice {
                name: name.clone(),
                lines: segs.len(),
            });
        }
        debug_assert_eq!(text.capacity(), cap, "the table buffer grew");
        // The String's buffer becomes the payload: moved, not copied.
        let bytes = Zeroizing::new(std::mem::take(&mut *text).into_bytes());
        Ok((json!({ "devices": out }), bytes))
    }

    fn message(&self, name: &str, sector: u64, argv: &[String]) -> OpResult {
        let Some(first) = argv.first() else {
            return Err(err(Code::Einval, "message: no message given"));
        };
        // dm's own messages (dm-stats) start with '@'; the rest go to the
        // target at `sector`.
        if first.starts_with('@') {
            let d = self.devices.info(name).map_err(classify)?;
            let stats = d.device.stats();
            return match (first.as_str(), argv.get(1).map(String::as_str)) {
                ("@stats_clear", _) => {
                    stats.clear();
                    ok(json!({}))
                }
                ("@stats_histograms", Some("on")) => {
                    stats.set_histograms(true);
                    ok(json!({}))
                }
                ("@stats_histograms", Some("off")) => {
                    stats.set_histograms(false);
                    ok(json!({}))
                }
                ("@cancel_deferred_remove", _) => {
                    let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
                    self.devices
                        .cancel_deferred_remove(name)
                        .map_err(classify)?;
                    if let Some(nodes) = self.nodes() {
                        nodes.keep(name);
                    }
                    ok(json!({}))
                }
                ("@stats_print", _) => {
                    let s = serde_json::to_string(&stats.snapshot()).unwrap_or_default();
                    ok(json!({ "response": s }))
                }
                _ => Err(err(
                    Code::Einval,
                    format!(
                        "unknown message '{}': udm knows @stats_clear, \
                         @stats_histograms on|off, @stats_print and @cancel_deferred_remove",
                        argv.join(" ")
                    ),
                )),
            };
        }
        // Serialised with suspend and resume: a key message must not
        // slip between a resume's check and its release.
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        let r = self
            .devices
            .message(name, sector, argv)
            .map_err(|e| err(Code::Einval, e))?;
        ok(match r {
            Some(s) => json!({ "response": s }),
            None => json!({}),
        })
    }

    /// Hold (and drain) or release each device's queue so that exactly
    /// the devices that are suspended, or stacked on a suspended one, are
    /// held.
    fn apply_holds(&self) {
        let engine = self.exports.engine();
        let devs = self.devices.list();
        let suspended: Vec<&str> = devs
            .iter()
            .filter(|d| d.suspended)
            .map(|d| d.name.as_str())
            .collect();
        let mut newly = Vec::new();
        for d in &devs {
            let Some(e) = self.export_of(&d.name) else {
                continue;
            };
            let want = d.suspended
                || self
                    .devices
                    .lowers(&d.name)
                    .iter()
                    .any(|l| suspended.contains(&l.as_str()));
            let held = engine.is_held(&e.queue);
            if want && !held {
                engine.hold(&e.queue);
                newly.push(e);
            } else if !want && held {
                engine.release(&e.queue);
            }
        }
        for e in newly {
            engine.drain(&e.queue);
        }
    }

    /// Export `name` if it has a live table and no export yet; an export
    /// that has one gains the rules (and read-only) of the devices its
    /// table now reaches.
    fn ensure_export(&self, name: &str) -> Result<(), OpError> {
        let (inherited, inherited_ro) = self.inherited(name);
        if self.export_of(name).is_some() {
            self.exports.restrict(name, &inherited, inherited_ro);
            return Ok(());
        }
        let d = self.devices.info(name).map_err(classify)?;
        if !d.live_table {
            return Ok(());
        }
        // The name's rules (and `ro:`) come from the set's policy; a
        // device stacked on others is narrowed by theirs too.
        let mut rules = vec![self.narrowing(name)];
        rules.extend(inherited);
        self.exports
            .add_ruled(
                Export {
                    name: name.to_string(),
                    description: format!("udm mapped device {name}"),
                    device: d.device.clone(),
                    read_only: self.read_only || d.read_only || inherited_ro,
                },
                rules,
            )
            .map_err(|e| err(Code::Eexist, e))?;
        Ok(())
    }

    fn create(
        &self,
        name: &str,
        uuid: &str,
        read_only: bool,
        allow: Vec<Allow>,
        table: Option<Zeroizing<String>>,
    ) -> OpResult {
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        self.devices
            .create(name, uuid, read_only)
            .map_err(classify)?;
        let mut map = self.narrow.lock().unwrap_or_else(|p| p.into_inner());
        if allow.is_empty() {
            map.remove(name);
        } else {
            map.insert(name.to_string(), allow);
        }
        drop(map);
        if let Some(t) = table {
            let r = self
                .devices
                .load(name, t)
                .and_then(|()| self.devices.prepare_resume(name));
            match r {
                Ok(plan) => {
                    let targets = plan.new_targets();
                    self.devices.commit(plan);
                    // dm's resume of a new device: background jobs start.
                    for t in &targets {
                        t.resume();
                    }
                    if let Err(e) = self.ensure_export(name) {
                        self.forget(name);
                        return Err(e);
                    }
                    if let Err(e) = self.nodes().map_or(Ok(()), |n| n.present(name)) {
                        let _ = self.remove_locked(name, true, false);
                        return Err(err(Code::Einval, e));
                    }
                }
                Err(e) => {
                    self.forget(name);
                    return Err(classify(e));
                }
            }
        }
        ok(json!({}))
    }

    fn load(&self, name: &str, table: Zeroizing<String>, force: bool) -> OpResult {
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        self.devices.load(name, table).map_err(classify)?;
        // Refuse early what resume would refuse, before a script suspends.
        if let Err(e) = self.check_shrink(name, force) {
            let _ = self.devices.clear(name);
            return Err(e);
        }
        ok(json!({}))
    }

    /// A table smaller than the live one must not pull bytes from under
    /// connected clients (NBD cannot tell them the size changed).
    fn check_shrink(&self, name: &str, force: bool) -> Result<(), OpError> {
        if force {
            return Ok(());
        }
        let Some(new) = self
            .devices
            .segments(name, true, false)
            .map_err(classify)?
            .map(|s| s.last().map_or(0, |x| x.start + x.len))
        else {
            return Ok(());
        };
        let d = self.devices.info(name).map_err(classify)?;
        let clients = self.open_count(name);
        if clients > 0 && new * 512 < d.size {
            return Err(err(
                Code::Ebusy,
                format!(
                    "the new table of '{name}' has {new} sectors, fewer than the {} the \
                     {clients} connected NBD client(s) may address: disconnect them, or \
                     use --force (their requests beyond the end then fail)",
                    d.size / 512
                ),
            ));
        }
        Ok(())
    }

    fn suspend(&self, name: &str, noflush: bool) -> Result<(), OpError> {
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        self.devices.set_suspended(name, true).map_err(classify)?;
        self.apply_holds();
        // Requests are held and drained: dm's postsuspend (dm-crypt takes
        // key messages from now on).
        for t in self.devices.live_targets(name).map_err(classify)? {
            t.postsuspend();
        }
        if !noflush {
            let d = self.devices.info(name).map_err(classify)?;
            if d.live_table {
                d.device.flush().map_err(|e| {
                    err(
                        Code::Einval,
                        format!("device '{name}' is suspended, but its flush failed: {e}"),
                    )
                })?;
            }
        }
        Ok(())
    }

    fn resume(&self, name: &str, force: bool) -> Result<(), OpError> {
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        let plan = self.devices.prepare_resume(name).map_err(classify)?;
        let affected = plan.affected();
        if plan.new_size(name).is_some() {
            self.check_shrink(name, force)?;
        }
        for n in &affected {
            let (Some(e), Some(bs)) = (self.export_of(n), plan.new_block_size(n)) else {
                continue;
            };
            // Requests stay widened to the export's block size, so a
            // table with smaller logical blocks serves them as well (as
            // the kernel lets a reload lower a device's logical block
            // size: an online decryption ends with a linear table); a
            // larger one would take requests the clients cannot align.
            let have = e.queue.block_size();
            if u64::from(bs.max(1)).next_power_of_two() > have {
                return Err(err(
                    Code::Einval,
                    format!(
                        "the new table of '{n}' has {bs}-byte logical blocks, its clients \
                         {have}-byte ones: a device's block size cannot grow while it is \
                         exported; remove and create it again"
                    ),
                ));
            }
        }
        // dm's preresume: a target may refuse (dm-crypt with its key
        // wiped); the device then stays suspended, nothing swapped.
        let mut targets = self.devices.plan_targets(&plan).map_err(classify)?;
        for t in &targets {
            t.preresume()
                .map_err(|e| err(Code::Eagain, format!("cannot resume '{name}': {e}")))?;
        }
        // The tables of the devices stacked on `name` are rebuilt too.
        if !affected.is_empty() {
            targets = plan.new_targets();
        }
        // Hold every affected device, wait for their running requests,
        // swap, let the held ones go.
        let engine = self.exports.engine();
        let held: Vec<Arc<Exported>> = affected.iter().filter_map(|n| self.export_of(n)).collect();
        for e in &held {
            engine.hold(&e.queue);
        }
        for e in &held {
            engine.drain(&e.queue);
        }
        // A swap suspends the old tables first, as the kernel's resume of
        // a loaded table does: their background jobs stop before the new
        // tables' start (postsuspend is idempotent for an already
        // suspended device).
        for n in &affected {
            for t in self.devices.live_targets(n).map_err(classify)? {
                t.postsuspend();
            }
        }
        self.devices.commit(plan);
        self.devices.set_suspended(name, false).map_err(classify)?;
        for t in &targets {
            t.resume();
        }
        // The devices stacked on `name` now reach whatever its new table
        // names: each gains those devices' rules before any request runs.
        let mut exported = self.ensure_export(name);
        for n in affected.iter().filter(|n| *n != name) {
            if let Err(e) = self.ensure_export(n) {
                exported = exported.and(Err(e));
            }
        }
        // Releases what no suspended device keeps held.
        for e in &held {
            engine.release(&e.queue);
        }
        self.apply_holds();
        // Block nodes for new exports, and resized ones.
        if let Some(nodes) = self.nodes() {
            for n in &affected {
                if let Err(e) = nodes.present(n) {
                    exported = exported.and(Err(err(Code::Einval, e)));
                }
            }
        }
        exported
    }

    fn remove(&self, name: &str, force: bool, deferred: bool) -> Result<(), OpError> {
        let g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        self.remove_locked(name, force, deferred)?;
        drop(g);
        self.reap_deferred_soon();
        Ok(())
    }

    /// A remove may have closed the last opener of a device waiting for a
    /// deferred remove (a device whose table named its block node): the
    /// node and its file are let go asynchronously, within milliseconds,
    /// and that device goes before the remove replies, as it does at once
    /// in the kernel. Bounded: a device with other clients stays.
    fn reap_deferred_soon(&self) {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(500) {
            if !self.devices.list().iter().any(|d| d.deferred_remove) {
                return;
            }
            self.reap_deferred();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn remove_locked(&self, name: &str, force: bool, deferred: bool) -> Result<(), OpError> {
        self.devices.info(name).map_err(classify)?;
        let uppers = self.devices.uppers(name);
        if !uppers.is_empty() {
            // dm counts a device stacked on this one as an opener, and a
            // deferred remove waits for it as for any other.
            if deferred {
                return self.devices.set_deferred_remove(name).map_err(classify);
            }
            return Err(err(
                Code::Ebusy,
                format!(
                    "device '{name}' is in use by {}: remove {} first",
                    uppers.join(", "),
                    if uppers.len() == 1 { "it" } else { "them" }
                ),
            ));
        }
        let export = self.export_of(name);
        let clients = self.open_count(name) as usize;
        if clients > 0 && !force {
            if deferred {
                return self.devices.set_deferred_remove(name).map_err(classify);
            }
            return Err(err(
                Code::Ebusy,
                format!(
                    "device '{name}' is open: {clients} NBD client(s) attached; disconnect \
                     them, or use --force (their requests then fail) or --deferred \
                     (removed when the last one leaves)"
                ),
            ));
        }
        if let Some(nodes) = self.nodes() {
            if let Err(e) = nodes.release(name, force) {
                if deferred {
                    nodes
                        .release_when_closed(name)
                        .map_err(|e| err(Code::Ebusy, e))?;
                    return self.devices.set_deferred_remove(name).map_err(classify);
                }
                return Err(err(Code::Ebusy, e));
            }
        }
        let clients = export.as_ref().map_or(0, |e| e.connections());
        if let Some(e) = &export {
            let engine = self.exports.engine();
            if clients > 0 {
                // dm's --force: the table is replaced by one that fails
                // every request, then the clients are cut off.
                self.devices.fail(name).map_err(classify)?;
            }
            self.exports.remove(name);
            engine.release(&e.queue);
            e.close_connections();
        }
        self.devices.remove(name).map_err(classify)?;
        self.narrow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        Ok(())
    }

    /// Undo a create that failed half-way.
    fn forget(&self, name: &str) {
        let _ = self.devices.remove(name);
        self.narrow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    fn remove_all(&self, force: bool, deferred: bool) -> OpResult {
        let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
        let mut errors = Vec::new();
        // Top of each stack first: repeat while something goes.
        loop {
            let mut progress = false;
            for d in self.devices.list() {
                if !self.devices.uppers(&d.name).is_empty() || d.deferred_remove {
                    continue;
                }
                match self.remove_locked(&d.name, force, deferred) {
                    Ok(()) => progress = self.devices.info(&d.name).is_err() || progress,
                    Err(e) => errors.push(e.msg),
                }
            }
            if !progress {
                break;
            }
            errors.clear();
        }
        if errors.is_empty() {
            ok(json!({}))
        } else {
            Err(err(Code::Ebusy, errors.join("; ")))
        }
    }

    /// Remove devices marked `--deferred` whose last client has left.
    pub fn reap_deferred(&self) {
        for d in self.devices.list() {
            if d.deferred_remove
                && self.open_count(&d.name) == 0
                && self.devices.uppers(&d.name).is_empty()
            {
                let _g = self.op.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.remove_locked(&d.name, false, false) {
                    tracing::warn!("deferred removal of {}: {}", d.name, e.msg);
                }
            }
        }
    }

    /// Set up a device from the command line: create, load, resume.
    pub fn activate(
        &self,
        name: &str,
        table: Zeroizing<String>,
        read_only: bool,
    ) -> Result<(), String> {
        // A target that panics on its image is that device's error, not
        // the server's end (the server may already serve other devices).
        let run = std::panic::AssertUnwindSafe(|| {
            self.create(name, "", read_only, Vec::new(), Some(table))
        });
        match std::panic::catch_unwind(run) {
            Ok(r) => r.map(|_| ()).map_err(|e| e.msg),
            Err(p) => {
                let why = crate::core::fault::panic_message(&*p);
                if let Ok(d) = self.devices.info(name) {
                    d.device
                        .fault()
                        .fail(format!("its activation panicked: {why}"));
                }
                Err(format!(
                    "activating '{name}' failed: its code panicked ({why})"
                ))
            }
        }
    }

    /// Close a device of the server's own (a crypttab line gone on
    /// reload): refused while NBD clients have it open or another device
    /// is stacked on it, as `dmsetup remove` is.
    pub fn deactivate(&self, name: &str) -> Result<(), String> {
        self.remove(name, false, false).map_err(|e| e.msg)
    }

    /// Release every hold (server shutdown).
    pub fn release_all(&self) {
        self.exports.engine().release_all();
    }
}

/// The open file stores a table names by path, with their I/O paths.
fn file_reports(deps: &[Dep]) -> Vec<IoReport> {
    deps.iter()
        .filter_map(|d| match d {
            Dep::Path(p) => Some(crate::store::file_io::reports_for(p)),
            Dep::Device(_) => None,
        })
        .flatten()
        .collect()
}
