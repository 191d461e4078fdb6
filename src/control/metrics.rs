//! `udm serve --metrics HOST:PORT`: every device's counters as Prometheus
//! text (`GET /metrics`; any path answers the same). One thread, one
//! request at a time, each with a short deadline: a scraper is one client
//! every few seconds, and a stuck one must not pile up threads.

use std::io::{self, Read, Write};
use std::net::{TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::service::Service;
use crate::dm::stats::OPS;

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

/// The metrics listener; stops on drop.
pub struct Metrics {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Metrics {
    pub fn start(addr: &str, service: Arc<Service>) -> io::Result<Metrics> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("bad --metrics address {addr:?}: {e}")))?
            .collect();
        let l = TcpListener::bind(&addrs[..])
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        l.set_nonblocking(true)?;
        tracing::info!("metrics on http://{}/metrics", l.local_addr()?);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("udm-metrics".into())
            .spawn(move || {
                while !s2.load(Ordering::SeqCst) {
                    match l.accept() {
                        Ok((mut c, _)) => {
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                            let _ = c.set_write_timeout(Some(Duration::from_secs(2)));
                            let mut req = [0u8; 1024];
                            let _ = c.read(&mut req);
                            let body = render(&service);
                            let _ = write!(
                                c,
                                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            })?;
        Ok(Metrics {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
