//! Reconnecting: when the connection breaks (the server restarts, the
//! network drops, the server answers `ESHUTDOWN`), every request in flight
//! and every new one waits while the store reconnects (backoff from 50 ms
//! to 1 s) and is then sent again on the new connection; the export must
//! come back with the same size. Resending is safe because the engine
//! never has two overlapping requests in flight where either is a write.

use std::io::{self, IoSlice};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::core::{DevError, DevResult};

use super::conn::{CallError, ClientConn, Cmd};
use super::slots::lock;
use super::spec::NbdSpec;

/// How long requests keep waiting for a broken connection to come back.
pub const RETRY_WINDOW: Duration = Duration::from_secs(30);
/// How long one request may go without a reply, across resends, before
/// it fails with EIO (and its connection is ended and reopened): a server
/// that accepts requests and never answers must not hang its callers, nor
/// `udm serve`'s final flush at shutdown.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one request may see break before it fails.
pub const MAX_ATTEMPTS: u32 = 8;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

enum Link {
    Up(Arc<ClientConn>),
    /// Someone is connecting; wait for them.
    Connecting,
    /// Broken since `since`; the next attempt is due at `next`.
    Down {
        since: Instant,
        next: Instant,
        backoff: Duration,
        why: String,
    },
}

/// The store's link to its export, across connections.
pub struct Reconnector {
    spec: NbdSpec,
    size: u64,
    pub retry_window: Duration,
    pub request_timeout: Duration,
    link: Mutex<Link>,
    link_cv: Condvar,
}

impl Reconnector {
    pub fn new(spec: NbdSpec, conn: Arc<ClientConn>) -> Reconnector {
        Reconnector {
            spec,
            size: conn.info.size,
            retry_window: RETRY_WINDOW,
            request_timeout: REQUEST_TIMEOUT,
            link: Mutex::new(Link::Up(conn)),
            link_cv: Condvar::new(),
        }
    }

    pub fn eio(&self, why: &str) -> DevError {
        DevError::Io(io::Error::other(format!("NBD export {}: {why}", self.spec)))
    }

    fn unreachable(&self, since: Instant, why: &str) -> DevError {
        self.eio(&format!(
            "unreachable for {} s: {why}",
            since.elapsed().as_secs()
        ))
    }

    /// The live connection, reconnecting if it broke. Fails when the link
    /// has been down for longer than the retry window and one more attempt
    /// fails.
    fn conn(&self) -> DevResult<Arc<ClientConn>> {
        let mut l = lock(&self.link);
        // Whether this caller waited for someone else's attempt: once the
        // window has passed, that attempt's failure is this caller's too.
        let mut waited = false;
        loop {
            match &mut *l {
                Link::Up(c) => match c.is_dead() {
                    None => return Ok(c.clone()),
                    Some(why) => l = self.went_down(l, why),
                },
                Link::Connecting => {
                    waited = true;
                    l = self.link_cv.wait(l).unwrap_or_else(|p| p.into_inner());
                }
                Link::Down {
                    since, next, why, ..
                } => {
                    let now = Instant::now();
                    let over = now.duration_since(*since) >= self.retry_window;
                    if over && waited {
                        return Err(self.unreachable(*since, why));
                    }
                    // Within the window, attempts follow the backoff; past
                    // it, every request that finds no attempt under way
                    // makes one, so a server that is back is used at once.
                    if !over && now < *next {
                        let wait = *next - now;
                        l = self
                            .link_cv
                            .wait_timeout(l, wait)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        continue;
                    }
                    l = self.attempt(l)?;
                }
            }
        }
    }

    /// Up → Down: the old connection is closed (its reader joined) outside
    /// the lock.
    fn went_down<'a>(&'a self, mut l: MutexGuard<'a, Link>, why: String) -> MutexGuard<'a, Link> {
        tracing::warn!(
            "NBD export {}: connection lost ({why}); reconnecting",
            self.spec
        );
        let now = Instant::now();
        let old = std::mem::replace(
            &mut *l,
            Link::Down {
                since: now,
                next: now,
                backoff: FIRST_BACKOFF,
                why,
            },
        );
        drop(l);
        if let Link::Up(c) = old {
            c.close();
        }
        lock(&self.link)
    }

    /// One reconnection attempt from `Down`, made outside the lock while
    /// the link says `Connecting`; fails once the window is over.
    fn attempt<'a>(&'a self, mut l: MutexGuard<'a, Link>) -> DevResult<MutexGuard<'a, Link>> {
        let Link::Down { since, backoff, .. } = *l else {
            return Ok(l);
        };
        *l = Link::Connecting;
        drop(l);
        let r = ClientConn::open(&self.spec).and_then(|c| {
            if c.info.size == self.size {
                return Ok(c);
            }
            c.close();
            Err(format!(
                "export came back with size {} instead of {}; not using it",
                c.info.size, self.size
            ))
        });
        let mut l = lock(&self.link);
        let gave_up = match r {
            Ok(c) => {
                tracing::info!("NBD export {}: reconnected", self.spec);
                *l = Link::Up(c);
                None
            }
            Err(why) => {
                let out = (since.elapsed() >= self.retry_window).then(|| why.clone());
                *l = Link::Down {
                    since,
                    next: Instant::now() + backoff,
                    backoff: (backoff * 2).min(MAX_BACKOFF),
                    why,
                };
                out
            }
        };
        self.link_cv.notify_all();
        match gave_up {
            Some(why) => Err(self.unreachable(since, &why)),
            None => Ok(l),
        }
    }

    /// Run one command, resending it on a new connection if the old one
    /// broke.
    pub fn run(
        &self,
        ty: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[IoSlice<'_>],
        mut read: Option<&mut [u8]>,
    ) -> DevResult<()> {
        let mut attempts = 0;
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let conn = self.conn()?;
            let cmd = Cmd {
                ty,
                flags,
                offset,
                len,
                payload,
                read: read.as_deref_mut(),
                deadline,
            };
            match conn.call(cmd) {
                Ok(0) => return Ok(()),
                Ok(errno) => {
                    return Err(DevError::Io(io::Error::from_raw_os_error(errno as i32)));
                }
                Err(CallError::TimedOut) => {
                    tracing::warn!(
                        "NBD export {}: no reply within {} ms; failing the request and reconnecting",
                        self.spec,
                        self.request_timeout.as_millis()
                    );
                    return Err(self.eio(&format!(
                        "no reply within {} ms",
                        self.request_timeout.as_millis()
                    )));
                }
                Err(CallError::Lost(why)) => {
                    if Instant::now() >= deadline {
                        return Err(self.eio(&format!(
                            "no reply within {} ms: {why}",
                            self.request_timeout.as_millis()
                        )));
                    }
                    attempts += 1;
                    if attempts >= MAX_ATTEMPTS {
                        return Err(self.eio(&format!(
                            "request failed on {attempts} connections in a row: {why}"
                        )));
                    }
                }
            }
        }
    }

    /// Closes the live connection, if any (the store is going away).
    pub fn close(&self) {
        if let Link::Up(c) = &*lock(&self.link) {
            c.close();
        }
    }
}
