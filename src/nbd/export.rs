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

pub use super::sock::{Peer, PeerKind};

/// Who may use an export (an allow-list entry). An export with no entries
/// is open to every client that reaches the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allow {
    /// TCP clients from this network (address, prefix length).
    Net(std::net::IpAddr, u8),
    /// Clients on the server's Unix socket.
    Unix,
    /// Clients on the server's Unix socket running as this user (the
    /// kernel's SO_PEERCRED, which the client cannot forge).
    Uid(u32),
    /// Clients that upgraded to TLS and presented a certificate the server
    /// verified (`--tls-verify-peer`). An anonymous TLS session never
    /// passes: encryption alone says nothing about who is asking.
    Tls,
}

impl std::str::FromStr for Allow {
    type Err = String;
    /// `unix`, `uid:N`, `tls`, an address (`192.0.2.7`, `::1`) or a
    /// network (`10.0.0.0/8`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "unix" => return Ok(Allow::Unix),
            "tls" => return Ok(Allow::Tls),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("uid:") {
            return n
                .parse::<u32>()
                .map(Allow::Uid)
                .map_err(|_| format!("'{s}': uid: takes a numeric user id, e.g. uid:1000"));
        }
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let ip: std::net::IpAddr = a.parse().map_err(|_| {
            format!("'{s}' is not an allow-list entry (unix, uid:N, tls, an IP address or ADDRESS/PREFIX)")
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

impl std::fmt::Display for Allow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Allow::Net(ip, p) => write!(f, "{ip}/{p}"),
            Allow::Unix => f.write_str("unix"),
            Allow::Uid(u) => write!(f, "uid:{u}"),
            Allow::Tls => f.write_str("tls"),
        }
    }
}

/// Parse `ENTRY[,ENTRY...]` (the value of `--allow NAME=` and
/// `--allow-default`).
pub fn parse_allow_list(s: &str) -> Result<Vec<Allow>, String> {
    s.split(',').map(|x| x.trim().parse::<Allow>()).collect()
}

/// `--metrics-allow LIST`: addresses and networks only (HTTP scrapers
/// arrive over TCP, with no Unix credentials and no TLS).
pub fn parse_address_list(s: &str) -> Result<Vec<Allow>, String> {
    let list = parse_allow_list(s)?;
    if let Some(a) = list.iter().find(|a| !matches!(a, Allow::Net(..))) {
        return Err(format!(
            "'{a}': this list takes IP addresses or ADDRESS/PREFIX networks only, \
             e.g. 127.0.0.1,10.0.0.0/8"
        ));
    }
    Ok(list)
}

/// Whether a TCP client at `ip` passes `rule` (any entry admits; an
/// IPv4 client on an IPv6 socket counts as its IPv4 address).
pub fn rule_admits_address(rule: &[Allow], ip: std::net::IpAddr) -> bool {
    let peer = Peer {
        kind: PeerKind::Tcp,
        ip: Some(ip.to_canonical()),
        uid: None,
    };
    rule.iter().any(|a| a.admits(&peer, false))
}

/// A rule (all its entries) as the user wrote it: `unix,10.0.0.0/8`.
pub fn describe_rule(rule: &[Allow]) -> String {
    rule.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Allow {
    fn admits(&self, peer: &Peer, tls_verified: bool) -> bool {
        match (self, peer.kind, peer.ip) {
            (Allow::Unix, PeerKind::Unix, _) => true,
            (Allow::Uid(u), PeerKind::Unix, _) => peer.uid == Some(*u),
            (Allow::Tls, _, _) => tls_verified,
            (Allow::Net(net, prefix), PeerKind::Tcp, Some(ip)) => {
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
    /// Who may use the export: a client must pass every rule (each a
    /// list of entries, any of which admits). Several rules come from
    /// narrowing (`dmsetup create --allow`) and renames, which may only
    /// ever add rules, so nothing widens what a name's rule allowed.
    rules: RwLock<Vec<Vec<Allow>>>,
    /// Failed requests of this export, rate-limited in the log.
    pub failures: Arc<FailureLog>,
}

/// Logs failed requests of one export at most `per` times per `every`,
/// then once more with the count of those it left out, so a client that
/// loops over a failing range cannot flood the log (one line each was
/// thousands per second).
pub struct FailureLog {
    export: String,
    per: u32,
    every: std::time::Duration,
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    since: Option<std::time::Instant>,
    logged: u32,
    dropped: u64,
}

impl FailureLog {
    /// Failures logged per interval by default.
    pub const PER: u32 = 10;
    /// The interval.
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    pub fn new(export: &str, per: u32, every: std::time::Duration) -> FailureLog {
        FailureLog {
            export: export.to_string(),
            per,
            every,
            state: Mutex::new(LogState::default()),
        }
    }

    /// Whether a failure seen at `now` is logged, and how many were left
    /// out in the interval that just ended (non-zero once per interval).
    pub fn admit(&self, now: std::time::Instant) -> (bool, u64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut left_out = 0;
        if st.since.is_none_or(|t| now.duration_since(t) >= self.every) {
            left_out = std::mem::take(&mut st.dropped);
            st.since = Some(now);
            st.logged = 0;
        }
        if st.logged < self.per {
            st.logged += 1;
            (true, left_out)
        } else {
            st.dropped += 1;
            (false, left_out)
        }
    }

    /// Log one failed request (its detail stays in the server's log; the
    /// client gets a fixed message).
    pub fn failed(&self, what: std::fmt::Arguments<'_>) {
        let (log, left_out) = self.admit(std::time::Instant::now());
        if left_out > 0 {
            tracing::warn!(
                "export {}: {left_out} more failed requests not logged in the last {} s",
                self.export,
                self.every.as_secs()
            );
        }
        if log {
            tracing::warn!("export {}: {what}", self.export);
        }
    }
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
}

impl Exported {
    /// Whether `peer` may see and use this export; `tls_verified` says
    /// whether it presented a client certificate the server verified.
    pub fn allows(&self, peer: &Peer, tls_verified: bool) -> bool {
        let rules = self.rules.read().unwrap_or_else(|p| p.into_inner());
        rules
            .iter()
            .all(|r| r.iter().any(|a| a.admits(peer, tls_verified)))
    }

    /// Whether any rule applies (none: every client that reaches the
    /// server, which for the mapper directory is the server's user only).
    pub fn has_rules(&self) -> bool {
        !self
            .rules
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The rules a client must pass (none: everyone may use it).
    pub fn rules(&self) -> Vec<Vec<Allow>> {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Add a rule a client must pass from now on (it narrows, never
    /// widens; an empty rule is no rule). Clients already attached keep
    /// their connection.
    pub fn narrow(&self, rule: Vec<Allow>) {
        if !rule.is_empty() {
            self.rules
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .push(rule);
        }
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

/// Access rules that belong to names, not to devices: they apply to
/// whatever device is exported under the name, also one created, renamed
/// or re-created while the server runs.
#[derive(Debug, Clone, Default)]
pub struct AccessPolicy {
    /// `--allow NAME=LIST`: replaces the default for that name.
    pub names: Vec<(String, Vec<Allow>)>,
    /// `ro:NAME=...`: names always exported read-only.
    pub read_only: Vec<String>,
    /// `--allow-default LIST`: the rule of every other name (empty:
    /// every client that reaches the server).
    pub default: Vec<Allow>,
}

impl AccessPolicy {
    /// The rule of `name` (empty: none).
    pub fn rule(&self, name: &str) -> &[Allow] {
        self.names
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or(&self.default[..], |(_, r)| &r[..])
    }

    pub fn is_read_only(&self, name: &str) -> bool {
        self.read_only.iter().any(|n| n == name)
    }

    /// An export set under this policy on a one-worker engine with a
    /// 16 MiB budget: the one fixture of the access-rule tests, here and
    /// in the mapper directory's (`fuse/files.rs`), so both front ends'
    /// rules are checked against the same set-up.
    #[cfg(test)]
    pub(crate) fn test_set(self) -> ExportSet {
        let s = ExportSet::new(
            Arc::new(Engine::start(1).expect("a one-worker engine starts")),
            BudgetPolicy {
                total: Some(16 << 20),
                exports: 1,
            },
        );
        s.set_policy(self);
        s
    }
}

/// The exports of one server, changeable while it runs.
pub struct ExportSet {
    engine: Arc<Engine>,
    list: RwLock<Vec<Arc<Exported>>>,
    share: u64,
    policy: RwLock<AccessPolicy>,
    /// The name the empty export name `""` stands for: bound once (the
    /// first name added, or [`ExportSet::set_default_name`]) so that a
    /// client without an export name never drifts to another volume
    /// when that device is removed or re-created.
    default_name: RwLock<Option<String>>,
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
            policy: RwLock::new(AccessPolicy::default()),
            default_name: RwLock::new(None),
        }
    }

    /// Replace the access policy. Exports already offered get the new
    /// rule of their name added (so a policy set after them still binds
    /// them; it never widens what they had).
    pub fn set_policy(&self, p: AccessPolicy) {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        for e in list.iter() {
            e.narrow(p.rule(&e.export.name).to_vec());
        }
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = p;
    }

    pub fn policy(&self) -> AccessPolicy {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Bind the default export `""` to `name` from now on.
    pub fn set_default_name(&self, name: &str) {
        *self.default_name.write().unwrap_or_else(|p| p.into_inner()) = Some(name.to_string());
    }

    /// The name `""` stands for, if one is bound.
    pub fn default_name(&self) -> Option<String> {
        self.default_name
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Start exporting `ex` under the rules of its name. Unless bound
    /// otherwise, the name of the first export added is also the default
    /// export `""`. Names are unique.
    pub fn add(&self, ex: Export) -> Result<Arc<Exported>, String> {
        self.add_narrowed(ex, Vec::new())
    }

    /// [`ExportSet::add`], with one more rule a client must pass
    /// (`dmsetup create --allow`): it narrows the name's rule, never
    /// widens it.
    pub fn add_narrowed(&self, ex: Export, narrow: Vec<Allow>) -> Result<Arc<Exported>, String> {
        self.add_ruled(ex, vec![narrow])
    }

    /// [`ExportSet::add`], with more rules a client must pass: those of
    /// `create --allow` and those a stacked device inherits from the
    /// devices it is built on. Empty rules are no rules.
    pub fn add_ruled(
        &self,
        mut ex: Export,
        extra: Vec<Vec<Allow>>,
    ) -> Result<Arc<Exported>, String> {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|e| e.export.name == ex.name) {
            return Err(format!("an export named '{}' exists already", ex.name));
        }
        let rules = {
            let policy = self.policy.read().unwrap_or_else(|p| p.into_inner());
            ex.read_only |= policy.is_read_only(&ex.name);
            let mut rules: Vec<Vec<Allow>> = Vec::new();
            for r in std::iter::once(policy.rule(&ex.name).to_vec()).chain(extra) {
                if !r.is_empty() && !rules.contains(&r) {
                    rules.push(r);
                }
            }
            rules
        };
        {
            let mut d = self.default_name.write().unwrap_or_else(|p| p.into_inner());
            if d.is_none() {
                *d = Some(ex.name.clone());
            }
        }
        let pool = BufPool::new(Budget::new(self.share));
        let queue = self.engine.add_queue(ex.device.clone(), pool);
        let failures = Arc::new(FailureLog::new(
            &ex.name,
            FailureLog::PER,
            FailureLog::EVERY,
        ));
        let e = Arc::new(Exported {
            export: ex,
            queue,
            attached: Arc::default(),
            rules: RwLock::new(rules),
            failures,
        });
        list.push(e.clone());
        Ok(e)
    }

    /// Offer export `old` under the name `new` from now on (dmsetup
    /// rename). Clients attached under the old name stay attached: the new
    /// entry shares the queue, so requests of old and new clients are
    /// still ordered against each other, and it shares the connection
    /// count and closers. It keeps the rules it had and gains those of
    /// its new name (and is read-only if either name says so).
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
        let policy = self.policy.read().unwrap_or_else(|p| p.into_inner());
        let mut rules = cur.rules();
        if !policy.rule(new).is_empty() {
            rules.push(policy.rule(new).to_vec());
        }
        let e = Arc::new(Exported {
            export: Export {
                name: new.to_string(),
                description: cur.export.description.replace(old, new),
                device: cur.export.device.clone(),
                read_only: cur.export.read_only || policy.is_read_only(new),
            },
            queue: cur.queue.clone(),
            attached: cur.attached.clone(),
            rules: RwLock::new(rules),
            failures: cur.failures.clone(),
        });
        list[i] = e.clone();
        Ok(e)
    }

    /// Make export `name` pass `rules` too, and be read-only if `read_only`
    /// (a reload stacked it on a device with those rules). When that
    /// changes anything, the entry is replaced and its attached clients
    /// are disconnected: they were admitted under the old rules and may
    /// have negotiated write access. Returns whether it changed.
    pub fn restrict(&self, name: &str, rules: &[Vec<Allow>], read_only: bool) -> bool {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let Some(i) = list.iter().position(|e| e.export.name == name) else {
            return false;
        };
        let cur = list[i].clone();
        let mut have = cur.rules();
        let before = have.len();
        for r in rules {
            if !r.is_empty() && !have.contains(r) {
                have.push(r.clone());
            }
        }
        let ro = read_only && !cur.export.read_only;
        if have.len() == before && !ro {
            return false;
        }
        list[i] = Arc::new(Exported {
            export: Export {
                name: cur.export.name.clone(),
                description: cur.export.description.clone(),
                device: cur.export.device.clone(),
                read_only: cur.export.read_only || read_only,
            },
            queue: cur.queue.clone(),
            attached: Arc::default(),
            rules: RwLock::new(have),
            failures: cur.failures.clone(),
        });
        drop(list);
        cur.close_connections();
        true
    }

    /// Stop offering export `name` to new clients. Clients already attached
    /// keep it until they disconnect; the caller decides whether that is
    /// acceptable (see [`Exported::connections`]).
    pub fn remove(&self, name: &str) -> Option<Arc<Exported>> {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let i = list.iter().position(|e| e.export.name == name)?;
        Some(list.remove(i))
    }

    /// The export a client asks for by name; the empty name is the bound
    /// default name's export, and unknown while no device has that name.
    pub fn find(&self, name: &[u8]) -> Option<Arc<Exported>> {
        let default = if name.is_empty() {
            self.default_name()?
        } else {
            String::new()
        };
        let name = if name.is_empty() {
            default.as_bytes()
        } else {
            name
        };
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    fn set(policy: AccessPolicy) -> ExportSet {
        policy.test_set()
    }

    fn export(name: &str) -> Export {
        Export {
            name: name.into(),
            description: String::new(),
            device: Arc::new(MemStore::new(1 << 20)),
            read_only: false,
        }
    }

    fn tcp(ip: &str) -> Peer {
        Peer {
            kind: PeerKind::Tcp,
            ip: Some(ip.parse().unwrap()),
            uid: None,
        }
    }

    fn unix(uid: u32) -> Peer {
        Peer {
            kind: PeerKind::Unix,
            ip: None,
            uid: Some(uid),
        }
    }

    #[test]
    fn a_names_rule_binds_every_device_added_under_it() {
        let s = set(AccessPolicy {
            names: vec![("d".into(), parse_allow_list("127.0.0.2").unwrap())],
            read_only: vec!["d".into()],
            default: parse_allow_list("unix").unwrap(),
        });
        for _ in 0..2 {
            let e = s.add(export("d")).unwrap();
            assert!(e.export.read_only);
            assert!(!e.allows(&tcp("127.0.0.1"), false));
            assert!(e.allows(&tcp("127.0.0.2"), false));
            assert!(
                !e.allows(&unix(0), false),
                "the name's rule replaces the default"
            );
            s.remove("d");
        }
        let other = s.add(export("o")).unwrap();
        assert!(!other.export.read_only);
        assert!(other.allows(&unix(0), false));
        assert!(!other.allows(&tcp("127.0.0.1"), false));
    }

    #[test]
    fn narrowing_and_renames_never_widen() {
        let s = set(AccessPolicy {
            names: vec![("b".into(), parse_allow_list("uid:7").unwrap())],
            read_only: vec!["b".into()],
            default: Vec::new(),
        });
        let e = s
            .add_narrowed(export("a"), parse_allow_list("unix").unwrap())
            .unwrap();
        assert!(!e.allows(&tcp("127.0.0.1"), false));
        assert!(e.allows(&unix(1), false));
        let r = s.rename("a", "b").unwrap();
        assert!(r.export.read_only);
        assert!(!r.allows(&unix(1), false));
        assert!(r.allows(&unix(7), false));
        assert_eq!(describe_rule(&r.rules()[1]), "uid:7");
    }

    #[test]
    fn restricting_an_export_adds_rules_and_read_only() {
        let s = set(AccessPolicy::default());
        let e = s.add(export("v")).unwrap();
        assert!(e.allows(&tcp("127.0.0.1"), false));
        let rule = parse_allow_list("10.0.0.0/8").unwrap();
        assert!(s.restrict("v", std::slice::from_ref(&rule), true));
        assert!(
            e.is_closed(),
            "clients admitted under the old rules are cut off"
        );
        let n = s.find(b"v").unwrap();
        assert!(n.export.read_only);
        assert!(!n.allows(&tcp("127.0.0.1"), false));
        assert!(n.allows(&tcp("10.1.2.3"), false));
        assert!(!s.restrict("v", &[rule], true), "nothing new: unchanged");
    }

    #[test]
    fn the_default_export_stays_bound_to_its_name() {
        let s = set(AccessPolicy::default());
        s.add(export("a")).unwrap();
        s.add(export("b")).unwrap();
        assert_eq!(s.find(b"").unwrap().export.name, "a");
        s.remove("a");
        assert!(s.find(b"").is_none(), "\"\" drifted to another device");
        s.add(export("a")).unwrap();
        assert_eq!(s.find(b"").unwrap().export.name, "a");
        s.set_default_name("b");
        assert_eq!(s.find(b"").unwrap().export.name, "b");
    }

    #[test]
    fn address_lists_take_networks_only() {
        let l = parse_address_list("127.0.0.0/8,::1").unwrap();
        assert!(rule_admits_address(&l, "127.0.0.5".parse().unwrap()));
        assert!(rule_admits_address(&l, "::ffff:127.0.0.1".parse().unwrap()));
        assert!(!rule_admits_address(&l, "10.0.0.1".parse().unwrap()));
        let e = parse_address_list("unix").unwrap_err();
        assert!(e.contains("IP addresses"), "{e}");
    }

    #[test]
    fn a_tcp_peer_without_an_address_is_not_a_unix_one() {
        let s = set(AccessPolicy {
            default: parse_allow_list("unix,uid:0").unwrap(),
            ..AccessPolicy::default()
        });
        let e = s.add(export("d")).unwrap();
        let lost = Peer {
            kind: PeerKind::Tcp,
            ip: None,
            uid: None,
        };
        assert!(!e.allows(&lost, false), "fail-open on an unknown address");
        assert!(!e.allows(&Peer::default(), false));
        assert!(e.allows(&unix(5), false));
        let net = s.add(export("n")).unwrap();
        net.narrow(parse_allow_list("0.0.0.0/0").unwrap());
        assert!(!net.allows(&lost, false));
    }

    #[test]
    fn failure_log_keeps_the_first_of_each_interval_then_counts() {
        let l = FailureLog::new("d", 3, std::time::Duration::from_secs(10));
        let t = std::time::Instant::now();
        let first: Vec<bool> = (0..5).map(|_| l.admit(t).0).collect();
        assert_eq!(first, [true, true, true, false, false]);
        let later = t + std::time::Duration::from_secs(11);
        assert_eq!(l.admit(later), (true, 2), "the summary counts the left-out");
        assert_eq!(l.admit(later), (true, 0), "and is given once");
    }

    #[test]
    fn allow_entries_parse_and_print_back() {
        let l = parse_allow_list("unix, uid:0,tls,10.0.0.0/8,::1").unwrap();
        assert_eq!(describe_rule(&l), "unix,uid:0,tls,10.0.0.0/8,::1/128");
        let e = parse_allow_list("uid:me").unwrap_err();
        assert!(e.contains("numeric user id"), "{e}");
        // A uid rule never admits a TCP client.
        assert!(!Allow::Uid(0).admits(&tcp("127.0.0.1"), false));
    }
}
