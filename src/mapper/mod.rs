//! Assembly: turns parsed tables into mapped devices and keeps the named
//! devices of a server (dm's `dm-table.c` and `dm-ioctl.c` jobs).
//!
//! This layer sits above the targets and stores: it is the only place that
//! looks a target type up by name ([`crate::targets::lookup`]) and opens a
//! path as a backing store, so the layers below stay unaware of both.

pub mod build;
pub mod check;
pub mod mapped;
pub mod registry;

pub use build::build;
pub use check::{check, CheckDevices};
pub use mapped::{MappedDevice, Segment};
pub use registry::{BuildOptions, DeviceSpec, Entry, Registry};
