//! The snapshots of each origin, inside one server (the kernel's `_origins`
//! hash, keyed by device there, by name here): a `snapshot-origin` write
//! finds in it every snapshot it must copy into, and a table naming a COW
//! device already in use takes over that snapshot's state instead of
//! reading the device a second time (the kernel's snapshot handover).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::snap::Snap;

#[derive(Default)]
struct Registry {
    by_cow: HashMap<String, Weak<Snap>>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The name a device argument is known by in the registry: `@NAME` for a
/// device of the server (`/dev/mapper/NAME` is the same one), the
/// canonical path for a file, else the argument itself.
pub fn key(spec: &str) -> String {
    if let Some(n) = spec.strip_prefix("/dev/mapper/").filter(|n| !n.is_empty()) {
        return format!("@{n}");
    }
    if spec.starts_with('@') || spec.contains("://") || spec.starts_with("rbd:") {
        return spec.to_string();
    }
    std::fs::canonicalize(spec)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| spec.to_string())
}

/// The live snapshot on COW device `cow_key`, if a table holds one.
pub fn by_cow(cow_key: &str) -> Option<Arc<Snap>> {
    registry().by_cow.get(cow_key).and_then(Weak::upgrade)
}

pub fn register(s: &Arc<Snap>) {
    let mut r = registry();
    r.by_cow.retain(|_, w| w.strong_count() > 0);
    r.by_cow.insert(s.cow_key.clone(), Arc::downgrade(s));
}

/// Every live snapshot of origin `origin_key`.
pub fn snapshots_of(origin_key: &str) -> Vec<Arc<Snap>> {
    registry()
        .by_cow
        .values()
        .filter_map(Weak::upgrade)
        .filter(|s| s.origin_key == origin_key)
        .collect()
}
