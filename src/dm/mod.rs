//! The device-mapper core: the path every request of a mapped device
//! takes (Linux's `dm.c`, beside `dm-table.c` and `dm-ioctl.c`, which are
//! [`crate::mapper`]'s jobs here).
//!
//! It sits on the engine's floor and uses only `core` and `mem`, so a
//! request goes down from the engine through [`LiveDevice`] and
//! [`Routes`] to the targets without climbing back to the code that
//! builds tables. Nothing here knows a target type, a table's text or a
//! path: `mapper` hands it finished routes to devices.
//!
//! Files: [`route`] (a request over a device's ranges, cut at their
//! boundaries and at the limits a device declares), [`live`] (the device
//! clients see, whose routes can be swapped), [`stats`] (per-device
//! counters and latency histograms).

pub mod live;
pub mod route;
pub mod stats;

pub use live::LiveDevice;
pub use route::{Lower, Route, Routes};
pub use stats::{Snapshot, StatOp, Stats};
