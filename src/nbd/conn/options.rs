//! What a session needs from its server: the per-connection limits and
//! deadlines ([`NetOptions`]) and the shared context ([`Cx`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{ClientLimits, Engine};

use super::super::export::ExportSet;
use super::super::tls::TlsMode;

/// Default of [`NetOptions::busy_poll`] (`--poll-us`).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// Default of [`NetOptions::payload_timeout`] (`--payload-timeout`).
pub const DEFAULT_PAYLOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`NetOptions::unused_timeout`].
pub const DEFAULT_UNUSED_TIMEOUT: Duration = Duration::from_secs(60);

/// Per-connection limits and deadlines of a server.
#[derive(Debug, Clone)]
pub struct NetOptions {
    /// A client that has not finished the handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// A client in transmission with nothing in flight and no request for
    /// this long is dropped (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// While more than half of `--max-connections` are open, a client
    /// that finished the handshake and has sent no request for this long
    /// is dropped, whatever `idle_timeout` says: such a connection only
    /// holds a slot. Not otherwise: the kernel's driver with several
    /// connections, or nbdfuse before its file is read, may leave one
    /// unused for a long time, and lose the device if it is dropped.
    pub unused_timeout: Duration,
    /// Most open connections of one client address (IPv6: its /64) or
    /// Unix uid other than root's and the server's (`None`: a quarter of
    /// `--max-connections`). Enforced at accept (`nbd/admission.rs`).
    pub max_connections_per_client: Option<usize>,
    /// A client whose queued replies make no progress for this long (it
    /// stopped reading) is dropped.
    pub reply_timeout: Duration,
    /// A client whose write payload makes no progress for this long is
    /// dropped (the payload's buffer is charged to the export's budget).
    pub payload_timeout: Duration,
    /// Caps on one client's requests and bytes in flight (queued replies
    /// included).
    pub client: ClientLimits,
    pub tls: TlsMode,
    /// How long an event loop keeps polling without sleeping after its last
    /// event (zero: sleep at once). See `reactor`'s module doc.
    pub busy_poll: Duration,
}

impl Default for NetOptions {
    fn default() -> Self {
        NetOptions {
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
            unused_timeout: DEFAULT_UNUSED_TIMEOUT,
            max_connections_per_client: None,
            reply_timeout: Duration::from_secs(30),
            payload_timeout: DEFAULT_PAYLOAD_TIMEOUT,
            client: ClientLimits::default(),
            tls: TlsMode::Off,
            busy_poll: DEFAULT_BUSY_POLL,
        }
    }
}

/// Everything a session needs from its server.
pub struct Cx {
    pub exports: Arc<ExportSet>,
    pub engine: Arc<Engine>,
    pub opts: NetOptions,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub shutting_down: AtomicBool,
    /// Open connections and the cap (`None`: not counted, never crowded).
    pub conns: Option<(Arc<AtomicUsize>, usize)>,
}

impl Cx {
    /// More than half of the connection cap is in use.
    pub fn crowded(&self) -> bool {
        self.conns
            .as_ref()
            .is_some_and(|(live, max)| live.load(Ordering::Relaxed).saturating_mul(2) > *max)
    }
}
