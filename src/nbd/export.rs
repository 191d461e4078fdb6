//! What a server exports: named devices, each with its engine queue.
//!
//! The set is shared by the accept loop, every handshake and whoever
//! manages devices at runtime (the control socket adds and removes
//! exports while clients are connected), so it lives apart from the
//! server, the handshake and the connection, which all depend on it and
//! not on each other.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::core::BlockDevice;
use crate::engine::{Engine, Queue};
use crate::mem::{default_total_budget, per_device_budget, Budget, BufPool};

/// One export as configured: a named device.
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
    pub read_only: bool,
}

impl Export {
    /// Read-only by configuration or because the device is.
    pub fn is_read_only(&self) -> bool {
        self.read_only || self.device.limits().read_only
    }
}

/// An export being served: its configuration, its engine queue, and how
/// many clients are in transmission on it.
pub struct Exported {
    pub export: Export,
    pub queue: Arc<Queue>,
    connections: AtomicUsize,
}

impl Exported {
    /// Clients currently in transmission on this export.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Count a client in transmission until the guard is dropped.
    pub fn connect(self: &Arc<Self>) -> ConnectionGuard {
        self.connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self.clone())
    }
}

/// Keeps an export's connection count while a client is attached.
pub struct ConnectionGuard(Arc<Exported>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How each export's buffer memory is budgeted.
#[derive(Debug, Clone, Copy)]
pub struct BudgetPolicy {
    /// Total for all exports (`--memory-budget`), or `None` for the
    /// default (2 % of RAM).
    pub total: Option<u64>,
    /// Exports the total is shared among.
    pub exports: usize,
}

/// The exports of one server, changeable while it runs.
pub struct ExportSet {
    engine: Arc<Engine>,
    list: RwLock<Vec<Arc<Exported>>>,
    share: u64,
}

impl ExportSet {
    /// An empty set whose exports run on `engine`.
    pub fn new(engine: Arc<Engine>, budget: BudgetPolicy) -> ExportSet {
        let share = match budget.total {
            Some(t) => per_device_budget(t, budget.exports, true),
            None => per_device_budget(default_total_budget(), budget.exports, false),
        };
        ExportSet {
            engine,
            list: RwLock::new(Vec::new()),
            share,
        }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Start exporting `ex`. The first export added is also the default
    /// export `""`. Names are unique.
    pub fn add(&self, ex: Export) -> Result<Arc<Exported>, String> {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|e| e.export.name == ex.name) {
            return Err(format!("an export named '{}' exists already", ex.name));
        }
        let pool = BufPool::new(Budget::new(self.share));
        let queue = self.engine.add_queue(ex.device.clone(), pool);
        let e = Arc::new(Exported {
            export: ex,
            queue,
            connections: AtomicUsize::new(0),
        });
        list.push(e.clone());
        Ok(e)
    }

    /// Stop offering export `name` to new clients. Clients already attached
    /// keep it until they disconnect; the caller decides whether that is
    /// acceptable (see [`Exported::connections`]).
    pub fn remove(&self, name: &str) -> Option<Arc<Exported>> {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let i = list.iter().position(|e| e.export.name == name)?;
        Some(list.remove(i))
    }

    /// The export a client asks for by name; the empty name is the first.
    pub fn find(&self, name: &[u8]) -> Option<Arc<Exported>> {
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        if name.is_empty() {
            return list.first().cloned();
        }
        list.iter()
            .find(|e| e.export.name.as_bytes() == name)
            .cloned()
    }

    /// Every export, in the order they were added.
    pub fn list(&self) -> Vec<Arc<Exported>> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn is_empty(&self) -> bool {
        self.list
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}
