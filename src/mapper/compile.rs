//! Compiling a table of a runtime device into the routes its requests take.
//!
//! A table may name other udm devices (`@NAME` or `/dev/mapper/NAME`). In
//! the kernel each layer of such a stack is a device of its own and a bio
//! passes through every one (map, clone, submit, per layer). Here a stack
//! is compiled, at load and again whenever a device below changes, into
//! one flat list of ranges of the top device, each going straight to what
//! actually stores or transforms its bytes:
//!
//! - a name resolves to the *compiled routes* of that device's live table,
//!   never to the device itself, so nothing stacks on a swappable pointer;
//! - a target's area that lies in one route of the device below is
//!   redirected to that route's device ([`DeviceResolver::redirect`]): a
//!   striped leg or a crypt device naming a linear device talks to the
//!   file under it;
//! - a linear segment disappears: its range takes the routes of what it
//!   names, shifted ([`Routes::slice`]).
//!
//! So linear over striped over linear compiles to the striped target over
//! the files — per request, exactly what one striped table costs. What
//! cannot be folded (crypt over a striped range: the cipher must see the
//! striped device's bytes) stays one call deeper, through the lower
//! device's own target objects, which are shared: a leg failing under a
//! stack is counted in the lower device's status, where dm shows it too.
//!
//! Folding skips the lower devices' own doors, so the routes keep the
//! failure state of each device they were compiled over, transitively
//! ([`Routes::lower`]): a request over a failed device fails however
//! flat its stack.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use zeroize::Zeroizing;

use super::mapped::MappedDevice;
use crate::core::table;
use crate::core::{BlockDevice, Fault};
use crate::dm::route::{Lower, Route, Routes};
use crate::store::{Location, OpenFlags};
use crate::targets::{DeviceResolver, TargetOptions};

/// What a table refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dep {
    /// Another udm device, by name.
    Device(String),
    /// A file or block device, as the table wrote it.
    Path(String),
}

/// A compiled table.
pub struct Compiled {
    /// The table's targets (for `table`, `status`, `message`).
    pub mapped: Arc<MappedDevice>,
    /// Where requests go.
    pub routes: Arc<Routes>,
    /// Devices and paths the table names, in first-use order, once each.
    pub deps: Vec<Dep>,
}

/// The udm device name a table argument refers to, if it names one.
pub fn device_name(spec: &str) -> Option<&str> {
    spec.strip_prefix('@')
        .or_else(|| spec.strip_prefix("/dev/mapper/"))
        .filter(|n| !n.is_empty())
}

/// Backing files opened by a server, shared while any table uses them
/// (one descriptor per file, however many tables and segments name it).
#[derive(Default)]
pub struct Files {
    open: HashMap<PathBuf, Weak<dyn BlockDevice>>,
}

impl Files {
    /// Open a file, block device or remote image (`store::Location`), or
    /// hand out the one already open — unless the file's size changed
    /// since (`truncate -s +N data`, then a reload): then a new store of
    /// the new size, which later tables share. Tables using the old one
    /// keep it and its size, so what a live table sees never changes
    /// under it; the new size reaches a device with its next table.
    pub fn open(&mut self, spec: &str, flags: OpenFlags) -> Result<Arc<dyn BlockDevice>, String> {
        let loc = Location::parse(spec)?;
        let key = loc.share_key(spec)?;
        if let Some(d) = self.open.get(&key).and_then(Weak::upgrade) {
            if !resized(&key, &*d) {
                return Ok(d);
            }
        }
        let loc = match loc {
            Location::File(_) => Location::File(key.clone()),
            remote => remote,
        };
        let d = loc.open(flags)?;
        self.open.retain(|_, w| w.strong_count() > 0);
        self.open.insert(key, Arc::downgrade(&d));
        Ok(d)
    }
}

/// Whether the regular file at `path` is no longer the size of the store
/// opened on it. Block devices and remote images keep the size they had
/// when opened.
fn resized(path: &Path, store: &dyn BlockDevice) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() != store.size())
}

/// How the compiler finds the devices a table names.
pub trait Lookup {
    /// The live routes of udm device `name`, or why it cannot be used.
    fn routes_of(&mut self, name: &str) -> Result<Arc<Routes>, String>;

    /// The failure state of udm device `name`, which a table over it
    /// checks on every request; `None` where devices cannot fail (a table
    /// checked offline).
    fn fault_of(&mut self, _name: &str) -> Option<Arc<Fault>> {
        None
    }
}

struct Resolver<'a> {
    lookup: &'a mut dyn Lookup,
    files: &'a mut Files,
    flags: OpenFlags,
    /// The routes handed out for device names, to recognise them again.
    views: Vec<Arc<Routes>>,
    deps: Vec<Dep>,
    /// The devices reached, transitively, once each.
    lower: Vec<Lower>,
    /// Fold stacks (off only for the benchmark's ablation).
    flatten: bool,
}

impl Resolver<'_> {
    fn view_of(&self, dev: &Arc<dyn BlockDevice>) -> Option<&Arc<Routes>> {
        let p = Arc::as_ptr(dev) as *const u8;
        self.views.iter().find(|v| Arc::as_ptr(v) as *const u8 == p)
    }

    fn note(&mut self, d: Dep) {
        if !self.deps.contains(&d) {
            self.deps.push(d);
        }
    }

    fn reach(&mut self, l: Lower) {
        if !self.lower.iter().any(|x| Arc::ptr_eq(&x.fault, &l.fault)) {
            self.lower.push(l);
        }
    }
}

impl DeviceResolver for Resolver<'_> {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if let Some(name) = device_name(spec) {
            let r = self.lookup.routes_of(name)?;
            if let Some(fault) = self.lookup.fault_of(name) {
                self.reach(Lower {
                    name: name.into(),
                    fault,
                });
            }
            for l in r.lower() {
                self.reach(l.clone());
            }
            self.note(Dep::Device(name.to_string()));
            if !self.views.iter().any(|v| Arc::ptr_eq(v, &r)) {
                self.views.push(r.clone());
            }
            return Ok(r);
        }
        let d = self.files.open(spec, self.flags)?;
        self.note(Dep::Path(spec.to_string()));
        Ok(d)
    }

    fn redirect(
        &mut self,
        _spec: &str,
        dev: &Arc<dyn BlockDevice>,
        offset: u64,
        len: u64,
    ) -> Option<(Arc<dyn BlockDevice>, u64)> {
        if !self.flatten {
            return None;
        }
        let view = self.view_of(dev)?;
        let mut s = view.slice(offset, len, 0);
        if s.len() != 1 {
            return None;
        }
        let r = s.pop()?;
        // A device with an I/O boundary (a striped target) is only called
        // through the dm core, which cuts requests at it: the target above
        // keeps the routes.
        if r.dev.limits().io_boundary != 0 {
            return None;
        }
        Some((r.dev, r.shift))
    }

    fn whole_target(&mut self, dev: &Arc<dyn BlockDevice>) -> Option<Arc<dyn BlockDevice>> {
        let view = self.view_of(dev)?;
        let mut s = view.slice(0, view.size(), 0);
        match (s.pop(), s.is_empty()) {
            (Some(r), true) if r.shift == 0 => Some(r.dev),
            _ => None,
        }
    }
}

/// Compile `text` (a dmsetup table). `source` names it in errors.
pub fn compile(
    text: &str,
    lookup: &mut dyn Lookup,
    files: &mut Files,
    flags: OpenFlags,
    options: &TargetOptions,
    flatten: bool,
) -> Result<Compiled, String> {
    let lines = table::parse(text).map_err(|e| e.to_string())?;
    if lines.is_empty() {
        return Err("the table is empty: give at least one line \
                    '<start> <length> <target> <args...>'"
            .into());
    }
    let mut res = Resolver {
        lookup,
        files,
        flags,
        views: Vec::new(),
        deps: Vec::new(),
        lower: Vec::new(),
        flatten,
    };
    let built = super::build(&lines, &mut res, options);
    // Parsed arguments hold the key of a crypt line: wipe them.
    for mut l in lines {
        for a in l.args.iter_mut() {
            zeroize::Zeroize::zeroize(a);
        }
    }
    let mapped = Arc::new(built.map_err(|e| e.to_string())?);
    let mut routes = Vec::with_capacity(mapped.segments().len());
    for s in mapped.segments() {
        let linear = s.target.as_linear().filter(|_| flatten);
        let view = linear.and_then(|(dev, _)| res.view_of(dev).cloned());
        match (linear, view) {
            // A linear segment over a udm device's routes: take them.
            (Some((_, off)), Some(view)) => routes.extend(view.slice(off, s.len, s.start)),
            // A linear segment over anything else: one route to it.
            (Some((dev, off)), None) => routes.push(Route {
                start: s.start,
                len: s.len,
                dev: dev.clone(),
                shift: off,
            }),
            _ => routes.push(Route {
                start: s.start,
                len: s.len,
                dev: s.target.clone(),
                shift: 0,
            }),
        }
    }
    let routes = Arc::new(Routes::new(merge(routes), mapped.limits()).over(res.lower));
    Ok(Compiled {
        mapped,
        routes,
        deps: res.deps,
    })
}

/// Join neighbouring routes that continue each other on the same device
/// (a table cut into pieces that a stack puts back together).
fn merge(routes: Vec<Route>) -> Vec<Route> {
    let mut out: Vec<Route> = Vec::with_capacity(routes.len());
    for r in routes {
        if let Some(last) = out.last_mut() {
            if Arc::ptr_eq(&last.dev, &r.dev) && last.shift + last.len == r.shift {
                last.len += r.len;
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// A table text for a file served as it is (`udm serve --file`): one
/// linear line over the whole file.
pub fn file_table(path: &Path, size: u64) -> Zeroizing<String> {
    Zeroizing::new(format!(
        "0 {} linear {} 0\n",
        size / 512,
        table::escape_arg(&path.display().to_string())
    ))
}
