//! The control socket of a running server: dmsetup's verbs over a Unix
//! socket (docs/CONTROL.md). It sits above the device registry
//! ([`crate::mapper`]) and the NBD exports ([`crate::nbd`]) and ties them
//! together: a device created here becomes an export under its name, a
//! resume swaps a table under connected clients without them noticing.
//!
//! Files: [`proto`] (the wire format) → [`model`] (the results) →
//! [`service`] (what each request does) → [`server`] (the socket, peers,
//! limits), [`client`] (the other end), [`metrics`] (Prometheus text);
//! `regions` (dm-stats regions: `dmstats create/delete/list/report`) sits
//! beside `model`, used by `service`.

pub mod client;
pub mod metrics;
pub mod model;
pub mod proto;
mod regions;
pub mod server;
pub mod service;

pub use client::{Client, ClientError};
pub use server::{default_path, ControlServer};
pub use service::{DeviceNodes, Locations, Service};
