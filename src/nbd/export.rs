//! What a server exports: named devices, each with its engine queue.
//!
//! The set is shared by the accept loop, every handshake and whoever
//! manages devices at runtime (the control socket adds and removes
//! exports while clients are connected), so it lives apart from the
//! server, the handshake and the connection, which all depend on it and
//! not on each other.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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

/// Who may use an export (an allow-list entry). An export with no entries
/// is open to every client that reaches the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allow {
    /// TCP clients from this network (address, prefix length).
    Net(std::net::IpAddr, u8),
    /// Clients on the server's Unix socket.
    Unix,
    /// Clients that upgraded to TLS (with `--tls-verify-peer`, that means a
    /// certificate signed by the server's CA).
    Tls,
}

impl std::str::FromStr for Allow {
    type Err = String;
    /// `unix`, `tls`, an address (`192.0.2.7`, `::1`) or a network
    /// (`10.0.0.0/8`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "unix" => return Ok(Allow::Unix),
            "tls" => return Ok(Allow::Tls),
            _ => {}
        }
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: std::net::IpAddr = a.parse().map_err(|_| {
            format!("'{s}' is not an allow-list entry (unix, tls, an IP address or ADDRESS/PREFIX)")
        })?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("'{s}': the prefix length must be 0..={max}"))?,
            None => max,
        };
        Ok(Allow::Net(ip, prefix))
    }
}

impl Allow {
    fn admits(&self, ip: Option<std::net::IpAddr>, tls: bool) -> bool {
        match (self, ip) {
            (Allow::Unix, None) => true,
            (Allow::Tls, _) => tls,
            (Allow::Net(net, prefix), Some(ip)) => {
                let (n, a, bits) = match (net, ip) {
                    (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => {
                        (u128::from(u32::from(*n)), u128::from(u32::from(a)), 32)
                    }
                    (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => {
                        (u128::from(*n), u128::from(a), 128)
                    }
                    _ => return false,
                };
                let shift = bits - u32::from(*prefix);
                shift >= 128 || (n >> shift) == (a >> shift)
            }
            _ => false,
        }
    }
}

/// An export being served: its configuration, its engine queue, and the
/// clients in transmission on it.
pub struct Exported {
    pub export: Export,
    pub queue: Arc<Queue>,
    /// Shared by the copies a rename makes, so the count and the closers
    /// follow the device, not the name.
    attached: Arc<Attached>,
}

/// A hook that ends one client's connection (shuts its socket), given by
/// whoever runs the connection.
pub type Closer = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct Attached {
    count: AtomicUsize,
    next: AtomicU64,
    closers: Mutex<Vec<(u64, Closer)>>,
    /// Set by [`Exported::close_connections`]: clients that attach later
    /// (a handshake that found the export just before it was removed) are
    /// closed at once.
    closed: AtomicBool,
    /// Who may use the export (empty: everyone).
    allow: RwLock<Vec<Allow>>,
}

impl Exported {
    /// Whether a client from `ip` (`None`: Unix socket), over TLS or not,
    /// may see and use this export.
    pub fn allows(&self, ip: Option<std::net::IpAddr>, tls: bool) -> bool {
        let list = self
            .attached
            .allow
            .read()
            .unwrap_or_else(|p| p.into_inner());
        list.is_empty() || list.iter().any(|a| a.admits(ip, tls))
    }

    /// Replace the allow-list (empty: everyone).
    pub fn set_allow(&self, list: Vec<Allow>) {
        *self
            .attached
            .allow
            .write()
            .unwrap_or_else(|p| p.into_inner()) = list;
    }

    /// Clients currently in transmission on this export.
    pub fn connections(&self) -> usize {
        self.attached.count.load(Ordering::Relaxed)
    }

    /// Count a client in transmission until the guard is dropped.
    pub fn connect(self: &Arc<Self>) -> ConnectionGuard {
        self.attached.count.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self.attached.clone(), None)
    }

    /// [`Exported::connect`], with a hook that ends this client's
    /// connection when the export is closed (`dmsetup remove --force`).
    pub fn connect_closable(self: &Arc<Self>, close: Closer) -> ConnectionGuard {
        let a = &self.attached;
        a.count.fetch_add(1, Ordering::Relaxed);
        let id = a.next.fetch_add(1, Ordering::Relaxed);
        a.closers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, close));
        // Checked after registering: a close racing with this attach either
        // sees the closer or is seen here.
        if a.closed.load(Ordering::SeqCst) {
            self.close_connections();
        }
        ConnectionGuard(self.attached.clone(), Some(id))
    }

    /// End the connection of every attached client (and of any that
    /// attaches from now on). Their requests already running finish; the
    /// replies may not reach them. Returns how many were closed.
    pub fn close_connections(&self) -> usize {
        let a = &self.attached;
        a.closed.store(true, Ordering::SeqCst);
        let list = a.closers.lock().unwrap_or_else(|p| p.into_inner());
        for (_, close) in list.iter() {
            close();
        }
        list.len()
    }

    /// Whether [`Exported::close_connections`] was called.
    pub fn is_closed(&self) -> bool {
        self.attached.closed.load(Ordering::SeqCst)
    }
}

/// Keeps an export's connection count (and its closer) while a client is
/// attached.
pub struct ConnectionGuard(Arc<Attached>, Option<u64>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if let Some(id) = self.1 {
            self.0
                .closers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(i, _)| *i != id);
        }
        self.0.count.fetch_sub(1, Ordering::Relaxed);
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
            attached: Arc::default(),
        });
        list.push(e.clone());
        Ok(e)
    }

    /// Offer export `old` under the name `new` from now on (dmsetup
    /// rename). Clients attached under the old name stay attached: the new
    /// entry shares the queue, so requests of old and new clients are
    /// still ordered against each other, and it shares the connection
    /// count and closers.
    pub fn rename(&self, old: &str, new: &str) -> Result<Arc<Exported>, String> {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|e| e.export.name == new) {
            return Err(format!("an export named '{new}' exists already"));
        }
        let i = list
            .iter()
            .position(|e| e.export.name == old)
            .ok_or_else(|| format!("no export named '{old}'"))?;
        let cur = &list[i];
        let e = Arc::new(Exported {
            export: Export {
                name: new.to_string(),
                description: cur.export.description.replace(old, new),
                device: cur.export.device.clone(),
                read_only: cur.export.read_only,
            },
            queue: cur.queue.clone(),
            attached: cur.attached.clone(),
        });
        list[i] = e.clone();
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
