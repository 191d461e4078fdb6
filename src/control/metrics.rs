//! `udm serve --metrics HOST:PORT`: every device's counters as Prometheus
//! text (`GET /metrics`; any path answers the same).
//!
//! One thread runs an event loop (mio) over every connection, so no
//! client can hold the endpoint for another: a connection that sends
//! nothing, one that never reads its answer, or a flood of either, costs a
//! slot each, and each slot has a deadline ([`DEADLINE`]) from accept to
//! the last byte of the answer. At [`MAX_CONNECTIONS`] the oldest
//! connection still sending its request makes room for the new one, so
//! idle sockets cannot lock a scraper out. Requests may carry up to
//! [`MAX_REQUEST`] bytes of headers; past that they get a 431.
//!
//! The counters name every device, also those whose NBD rules hide them
//! from most clients, so only addresses of `--metrics-allow` (default:
//! loopback) may scrape; others get 403 before anything is read.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::service::Service;
use crate::dm::stats::OPS;
use crate::nbd::export::{rule_admits_address, Allow};

/// Render the metrics of every device.
pub fn render(service: &Service) -> String {
    let mut out = String::new();
    let mut families: Vec<(&str, &str, &str, Vec<String>)> = vec![
        (
            "udm_requests_total",
            "counter",
            "Requests completed, by operation.",
            vec![],
        ),
        (
            "udm_sectors_total",
            "counter",
            "512-byte sectors transferred, by operation.",
            vec![],
        ),
        (
            "udm_errors_total",
            "counter",
            "Requests that failed, by operation.",
            vec![],
        ),
        (
            "udm_latency_seconds",
            "summary",
            "Request latency at the device, by operation.",
            vec![],
        ),
        (
            "udm_in_flight",
            "gauge",
            "Requests inside the device now.",
            vec![],
        ),
        ("udm_size_bytes", "gauge", "Size of the live table.", vec![]),
        ("udm_open_count", "gauge", "NBD clients attached.", vec![]),
    ];
    for d in service.devices().list() {
        let snap = d.device.stats().snapshot();
        let name = d.name.replace('\\', "\\\\").replace('"', "\\\"");
        for (op, opname) in OPS {
            let c = snap.op(op);
            let l = format!("{{device=\"{name}\",op=\"{opname}\"}}");
            families[0]
                .3
                .push(format!("udm_requests_total{l} {}", c.ios));
            families[1]
                .3
                .push(format!("udm_sectors_total{l} {}", c.sectors));
            families[2]
                .3
                .push(format!("udm_errors_total{l} {}", c.errors));
            if let Some(lat) = c.latency {
                for (q, v) in [
                    ("0.5", lat.p50_ns),
                    ("0.99", lat.p99_ns),
                    ("0.999", lat.p999_ns),
                ] {
                    families[3].3.push(format!(
                        "udm_latency_seconds{{device=\"{name}\",op=\"{opname}\",quantile=\"{q}\"}} {}",
                        v as f64 / 1e9
                    ));
                }
                families[3]
                    .3
                    .push(format!("udm_latency_seconds_count{l} {}", lat.count));
                families[3].3.push(format!(
                    "udm_latency_seconds_sum{l} {}",
                    lat.mean_ns as f64 * lat.count as f64 / 1e9
                ));
            }
        }
        let l = format!("{{device=\"{name}\"}}");
        families[4]
            .3
            .push(format!("udm_in_flight{l} {}", snap.in_flight));
        families[5].3.push(format!("udm_size_bytes{l} {}", d.size));
        let open = service
            .exports()
            .list()
            .iter()
            .find(|e| e.export.name == d.name)
            .map_or(0, |e| e.connections());
        families[6].3.push(format!("udm_open_count{l} {open}"));
    }
    for (name, kind, help, lines) in families {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// From accept to the last byte of the answer.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Bytes of request line and headers read at most.
pub const MAX_REQUEST: usize = 16 << 10;

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);

/// The metrics listener; stops on drop.
pub struct Metrics {
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl Metrics {
    /// Serve on `addr`; a scrape from an address `allow` does not admit
    /// gets 403 (the counters name every device, protected ones too).
    pub fn start(addr: &str, service: Arc<Service>, allow: Vec<Allow>) -> io::Result<Metrics> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("bad --metrics address {addr:?}: {e}")))?
            .collect();
        let std_l = std::net::TcpListener::bind(&addrs[..])
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        std_l.set_nonblocking(true)?;
        tracing::info!("metrics on http://{}/metrics", std_l.local_addr()?);
        let mut l = TcpListener::from_std(std_l);
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut l, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let mut lp = Loop {
            poll,
            listener: l,
            conns: HashMap::new(),
            next: 2,
            service,
            allow,
        };
        let thread = std::thread::Builder::new()
            .name("udm-metrics".into())
            .spawn(move || lp.run())?;
        Ok(Metrics {
            waker,
            thread: Some(thread),
        })
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP connection: reading its request, then writing its answer.
struct Conn {
    s: TcpStream,
    accepted: Instant,
    req: Vec<u8>,
    /// The answer, once the request is complete.
    out: Option<Vec<u8>>,
    sent: usize,
}

struct Loop {
    poll: Poll,
    listener: TcpListener,
    conns: HashMap<usize, Conn>,
    next: usize,
    service: Arc<Service>,
    /// `--metrics-allow`: who may scrape.
    allow: Vec<Allow>,
}

/// What to do with a connection after an event.
enum Next {
    Keep,
    Close,
}

impl Loop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            if let Err(e) = self
                .poll
                .poll(&mut events, Some(Duration::from_millis(250)))
            {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("metrics endpoint stopped: {e}");
                return;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKE => return,
                    LISTENER => self.accept(),
                    Token(t) => {
                        if let Some(c) = self.conns.get_mut(&t) {
                            if let Next::Close = step(c, &self.service) {
                                self.close(t);
                            }
                        }
                    }
                }
            }
            self.expire();
        }
    }

    fn accept(&mut self) {
        loop {
            let (mut s, from) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of descriptors and the like: the next event retries.
                    tracing::debug!("metrics: accept failed: {e}");
                    return;
                }
            };
            if self.conns.len() >= MAX_CONNECTIONS && !self.shed_oldest_reader() {
                continue; // every slot is writing an answer: drop this one
            }
            let t = self.next;
            self.next += 1;
            let interest = Interest::READABLE | Interest::WRITABLE;
            if self
                .poll
                .registry()
                .register(&mut s, Token(t), interest)
                .is_ok()
            {
                // Refused before reading a byte: the answer is the same
                // whatever the request says.
                let out = (!rule_admits_address(&self.allow, from.ip()))
                    .then(|| response("403 Forbidden", "forbidden\n", true));
                let c = Conn {
                    s,
                    accepted: Instant::now(),
                    req: Vec::new(),
                    out,
                    sent: 0,
                };
                self.conns.insert(t, c);
            }
        }
    }

    /// Close the oldest connection still sending its request.
    fn shed_oldest_reader(&mut self) -> bool {
        let oldest = self
            .conns
            .iter()
            .filter(|(_, c)| c.out.is_none())
            .min_by_key(|(_, c)| c.accepted)
            .map(|(t, _)| *t);
        oldest.map(|t| self.close(t)).is_some()
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| now.duration_since(c.accepted) > DEADLINE)
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            self.close(t);
        }
    }

    fn close(&mut self, t: usize) {
        if let Some(mut c) = self.conns.remove(&t) {
            let _ = self.poll.registry().deregister(&mut c.s);
        }
    }
}

/// Read what the connection has, answer once the request is whole, write
/// what the socket takes.
fn step(c: &mut Conn, service: &Service) -> Next {
    if c.out.is_none() {
        let mut buf = [0u8; 4096];
        loop {
            match c.s.read(&mut buf) {
                Ok(0) => return Next::Close,
                Ok(n) => {
                    c.req.extend_from_slice(&buf[..n]);
                    if let Some(out) = answer(&c.req, service) {
                        c.out = Some(out);
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Next::Close,
            }
        }
    }
    let Some(out) = &c.out else {
        return Next::Keep;
    };
    while c.sent < out.len() {
        match c.s.write(&out[c.sent..]) {
            Ok(0) => return Next::Close,
            Ok(n) => c.sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Next::Keep,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Next::Close,
        }
    }
    let _ = c.s.shutdown(std::net::Shutdown::Write);
    Next::Close
}

/// The answer to a request read so far, or `None` while its headers are
/// not complete.
fn answer(req: &[u8], service: &Service) -> Option<Vec<u8>> {
    let end = req
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| req.windows(2).position(|w| w == b"\n\n"));
    if end.is_none() {
        return (req.len() > MAX_REQUEST).then(|| {
            response(
                "431 Request Header Fields Too Large",
                "headers too large\n",
                true,
            )
        });
    }
    let head = req.starts_with(b"HEAD ");
    if !head && !req.starts_with(b"GET ") {
        return Some(response(
            "405 Method Not Allowed",
            "only GET and HEAD\n",
            true,
        ));
    }
    Some(response("200 OK", &render(service), !head))
}

fn response(status: &str, body: &str, with_body: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
    out
}
