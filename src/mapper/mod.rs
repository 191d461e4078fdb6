//! Assembly: turns parsed tables into mapped devices and keeps the named
//! devices of a server (dm's `dm-table.c` and `dm-ioctl.c` jobs).
//!
//! This layer sits above the targets and stores: it is the only place that
//! looks a target type up by name ([`crate::targets::lookup`]) and opens a
//! path as a backing store, so the layers below stay unaware of both.
//!
//! Files: [`route`] (the hot path: a request over a device's ranges),
//! [`mapped`] (a table's segments), [`build`] (table lines into targets),
//! [`registry`] (devices built once from the command line), [`compile`]
//! (a runtime table and the stack under it into flat routes), [`stats`]
//! (per-device counters and latency histograms), [`live`] (the device
//! clients see, whose table can be swapped), [`devices`] (the named
//! devices of a running server: create, load, resume, remove), [`check`]
//! (whole-table checks before anything is built).

pub mod build;
pub mod check;
pub mod compile;
pub mod devices;
pub mod live;
pub mod mapped;
pub mod registry;
pub mod route;
pub mod stats;

pub use build::build;
pub use check::{check, CheckDevices};
pub use devices::{DevInfo, Devices, Plan, SegmentInfo};
pub use live::LiveDevice;
pub use mapped::{MappedDevice, Segment};
pub use registry::{BuildOptions, DeviceSpec, Entry, Registry};
pub use route::{Route, Routes};
