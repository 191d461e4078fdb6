//! The connection cap: who gets a slot, and who makes room for whom.
//!
//! One client must not be able to take every slot (`--max-connections`)
//! with connections that negotiate and then sit. So:
//! - each client (a TCP address, an IPv6 /64, which one host usually
//!   holds whole; a Unix peer's uid) has at most `--max-connections-per-client`
//!   connections (default a quarter of the cap);
//! - at the cap, the oldest connection still in its handshake goes first;
//!   failing that, the oldest connection idle for at least
//!   [`SHED_IDLE`] of the client holding the most connections;
//! - only when neither exists is the newcomer refused.
//!
//! Root and the server's own uid on the Unix socket are trusted (see
//! docs/SECURITY.md): their connections are neither capped per client nor
//! shed for others, so an administrator's tools keep what they opened.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::sock::{Sock, Source};

/// How long a connection must have been idle before it can be shed for a
/// newcomer: a client between two requests is not idle.
pub const SHED_IDLE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Tally {
    count: Arc<AtomicUsize>,
    /// In accept order; closed ones are dropped lazily.
    conns: VecDeque<Weak<Conn>>,
}

impl Tally {
    fn prune(&mut self) {
        self.conns
            .retain(|w| w.upgrade().is_some_and(|c| !c.is_closed()));
    }

    /// The oldest connection idle for at least [`SHED_IDLE`].
    fn oldest_idle(&self) -> Option<Arc<Conn>> {
        let min = SHED_IDLE.as_millis() as u64;
        self.conns.iter().filter_map(Weak::upgrade).find(|c| {
            !c.is_closed()
                && !c.in_handshake.load(Ordering::Acquire)
                && c.idle_ms.load(Ordering::Relaxed) >= min
        })
    }
}

/// The accept thread's bookkeeping of the cap.
pub struct Admission {
    pub live: Arc<AtomicUsize>,
    max_conns: usize,
    per_client: usize,
    /// Connections in accept order, for shedding the oldest handshake.
    handshaking: VecDeque<Weak<Conn>>,
    tallies: HashMap<Source, Tally>,
    trusted: [u32; 2],
    admitted: u64,
    last_refusal_log: Option<Instant>,
}

/// Why a newcomer was refused, for the (rate-limited) log.
enum Refusal {
    Full,
    PerClient(Source),
}

impl Admission {
    /// `per_client` of 0: a quarter of `max_conns` (at least 1).
    pub fn new(max_conns: usize, per_client: usize, live: Arc<AtomicUsize>) -> Admission {
        let per_client = if per_client == 0 {
            (max_conns / 4).max(1)
        } else {
            per_client
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        Admission {
            live,
            max_conns,
            per_client,
            handshaking: VecDeque::new(),
            tallies: HashMap::new(),
            trusted: [0, me],
            admitted: 0,
            last_refusal_log: None,
        }
    }

    pub fn per_client(&self) -> usize {
        self.per_client
    }

    /// The connection for `sock`, or `None` if it is refused.
    pub fn admit(&mut self, sock: Sock) -> Option<Arc<Conn>> {
        self.tidy();
        let source = Source::of(&sock.peer_info());
        let trusted = matches!(source, Source::Uid(u) if self.trusted.contains(&u));
        if !trusted {
            let t = self.tallies.entry(source).or_default();
            if t.count.load(Ordering::Acquire) >= self.per_client {
                t.prune();
                self.log_refusal(Refusal::PerClient(source));
                return None;
            }
        }
        if self.live.load(Ordering::Acquire) >= self.max_conns
            && !self.shed_oldest_handshake()
            && !self.shed_idle()
        {
            self.log_refusal(Refusal::Full);
            return None;
        }
        self.live.fetch_add(1, Ordering::AcqRel);
        let conn = Arc::new(Conn::new(sock, Some(self.live.clone())));
        if !trusted {
            let t = self.tallies.entry(source).or_default();
            t.count.fetch_add(1, Ordering::AcqRel);
            conn.count_source(t.count.clone());
            t.conns.push_back(Arc::downgrade(&conn));
        }
        self.handshaking.push_back(Arc::downgrade(&conn));
        Some(conn)
    }

    /// Drop what closed connections left in the lists: the front of the
    /// handshake queue every time, everything every 1024 admissions.
    fn tidy(&mut self) {
        let still_negotiating =
            |c: &Arc<Conn>| c.in_handshake.load(Ordering::Acquire) && !c.is_closed();
        while self
            .handshaking
            .front()
            .is_some_and(|w| w.upgrade().is_none_or(|c| !still_negotiating(&c)))
        {
            self.handshaking.pop_front();
        }
        self.admitted += 1;
        if self.admitted % 1024 == 0 {
            self.handshaking
                .retain(|w| w.upgrade().is_some_and(|c| still_negotiating(&c)));
            self.tallies.retain(|_, t| {
                t.prune();
                t.count.load(Ordering::Acquire) > 0
            });
        }
    }

    /// Make room: the oldest connection still negotiating goes.
    fn shed_oldest_handshake(&mut self) -> bool {
        while let Some(w) = self.handshaking.pop_front() {
            if let Some(c) = w.upgrade() {
                if c.in_handshake.load(Ordering::Acquire) && !c.is_closed() {
                    tracing::debug!(
                        "at the connection cap: shedding the oldest unfinished handshake"
                    );
                    c.shed();
                    return true;
                }
            }
        }
        false
    }

    /// Make room: the oldest idle connection of the client holding the
    /// most (the next client's if that one has none idle).
    fn shed_idle(&mut self) -> bool {
        let mut order: Vec<(usize, Source)> = self
            .tallies
            .iter()
            .map(|(s, t)| (t.count.load(Ordering::Acquire), *s))
            .filter(|(n, _)| *n > 0)
            .collect();
        order.sort_unstable_by_key(|o| std::cmp::Reverse(o.0));
        for (n, source) in order {
            let Some(t) = self.tallies.get_mut(&source) else {
                continue;
            };
            t.prune();
            if let Some(c) = t.oldest_idle() {
                tracing::info!(
                    "at the connection cap: shedding an idle connection of {} \
                     (it holds {n})",
                    describe(&source)
                );
                c.shed();
                return true;
            }
        }
        false
    }

    fn log_refusal(&mut self, why: Refusal) {
        let now = Instant::now();
        if self
            .last_refusal_log
            .is_some_and(|t| now.duration_since(t) <= Duration::from_secs(5))
        {
            return;
        }
        self.last_refusal_log = Some(now);
        match why {
            Refusal::Full => tracing::warn!(
                "refusing a client: {} connections are open and none is idle or still \
                 negotiating (raise --max-connections)",
                self.max_conns
            ),
            Refusal::PerClient(s) => tracing::warn!(
                "refusing a client: {} already has {} connections \
                 (raise --max-connections-per-client)",
                describe(&s),
                self.per_client
            ),
        }
    }
}

fn describe(s: &Source) -> String {
    match s {
        Source::Ip(ip) => ip.to_string(),
        Source::Uid(u) => format!("uid {u}"),
        Source::Unknown => "a peer of unknown address".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::sock::{Peer, PeerKind};

    fn tcp(ip: &str) -> Peer {
        Peer {
            kind: PeerKind::Tcp,
            ip: Some(ip.parse().unwrap()),
            uid: None,
        }
    }

    #[test]
    fn ipv6_clients_count_by_their_64_and_mapped_ones_as_ipv4() {
        assert_eq!(
            Source::of(&tcp("2001:db8:1:2:aaaa::1")),
            Source::of(&tcp("2001:db8:1:2:bbbb::9"))
        );
        assert_ne!(
            Source::of(&tcp("2001:db8:1:2::1")),
            Source::of(&tcp("2001:db8:1:3::1"))
        );
        assert_eq!(
            Source::of(&tcp("::ffff:10.0.0.1")),
            Source::Ip("10.0.0.1".parse().unwrap())
        );
        let unix = Peer {
            kind: PeerKind::Unix,
            ip: None,
            uid: Some(1000),
        };
        assert_eq!(Source::of(&unix), Source::Uid(1000));
        assert_eq!(Source::of(&Peer::default()), Source::Unknown);
    }

    #[test]
    fn the_per_client_cap_defaults_to_a_quarter() {
        let live = || Arc::new(AtomicUsize::new(0));
        assert_eq!(Admission::new(100, 0, live()).per_client(), 25);
        assert_eq!(Admission::new(2, 0, live()).per_client(), 1);
        assert_eq!(Admission::new(100, 7, live()).per_client(), 7);
    }
}
