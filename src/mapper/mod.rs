//! Building and managing devices: turns tables into the routes of mapped
//! devices and keeps the named devices of a server (dm's `dm-table.c` and
//! `dm-ioctl.c` jobs; the request path itself is [`crate::dm`]'s).
//!
//! This layer sits above the targets, the stores and the dm core: it is
//! the only place that looks a target type up by name
//! ([`crate::targets::lookup`]) and opens a path as a backing store, so the
//! layers below stay unaware of both.
//!
//! One way from a table to a device: [`build`] (table lines into a
//! [`mapped`] table of targets) → [`compile`] (that table and the stack
//! under it into flat [`crate::dm::Routes`]) → [`devices`] (the named
//! devices of a server, each a [`crate::dm::LiveDevice`]: create, load,
//! resume, remove). Devices given at start take it too. [`check`] runs the
//! same constructors over placeholder devices before anything is built.

pub mod build;
pub mod check;
pub mod compile;
pub mod devices;
pub mod mapped;

pub use build::{build, BuildOptions, DeviceSpec};
pub use check::{check, CheckDevices};
pub use devices::{DevInfo, Devices, Plan, SegmentInfo};
pub use mapped::{MappedDevice, Segment};
