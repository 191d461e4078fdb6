//! The results the control server returns, as JSON (docs/CONTROL.md and
//! docs/control-status.schema.json describe them). Shared by the server
//! and `udm dmsetup`, which prints them as dmsetup does or, with
//! `--json`, as they are.

use serde::{Deserialize, Serialize};

use crate::dm::stats::Snapshot;
pub use crate::store::file_io::IoReport;
pub use crate::targets::TargetMemory;

/// udm devices have no block device node; their "major" is 0, which no
/// kernel block device uses, so a script cannot mistake one for a real
/// device-mapper device. Minors are allocated as dm does (lowest free).
pub const MAJOR: u32 = 0;

/// What a table names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DepInfo {
    /// `device` (another udm device) or `path` (a file or block device).
    pub kind: String,
    /// The device name, or the path as the table wrote it.
    pub name: String,
    /// For udm devices.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub minor: Option<u32>,
}

/// One device, for `info`, `ls` and `deps`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub uuid: String,
    pub major: u32,
    pub minor: u32,
    pub read_only: bool,
    pub suspended: bool,
    pub live_table: bool,
    pub inactive_table: bool,
    pub deferred_remove: bool,
    /// NBD clients attached (dm's open count).
    pub open_count: u32,
    pub event_nr: u32,
    pub target_count: u32,
    pub target_types: Vec<String>,
    pub size_sectors: u64,
    pub deps: Vec<DepInfo>,
    /// Who may use the device over NBD: a client must pass every rule,
    /// each a comma-separated list of entries any of which admits (as
    /// `udm serve --allow`). Empty: every client that reaches the server.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Where the device is a file (`serve --mapper-dir`), while it is
    /// exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The NBD URI that reaches the device, while it is exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_uri: Option<String>,
    /// Why the device has failed (`core::fault`: a panic or damage in its
    /// own code); while set, its requests get EIO and its segments'
    /// status lines read `Fail`, as dm-thin's do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Which device this one is built on has failed, and why: its
    /// requests get EIO (a dm device over a failed one gets its errors)
    /// though this device itself has not failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_failed: Option<String>,
}

/// One segment's status line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetStatus {
    pub start: u64,
    pub length: u64,
    pub target_type: String,
    /// What the kernel's target prints for `dmsetup status`.
    pub status: String,
    /// udm's own: the memory a target keeps under its budget (the thin
    /// pool's metadata cache); absent for targets that keep none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<TargetMemory>,
}

/// One device's `status`: dm's lines and udm's counters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    pub suspended: bool,
    pub size_sectors: u64,
    pub open_count: u32,
    pub event_nr: u32,
    pub targets: Vec<TargetStatus>,
    pub stats: Snapshot,
    /// Requests the engine keeps in flight for the device (its stack's
    /// largest `queue_depth`: workers of its own, or ring submissions);
    /// 0: its requests run inline on the connection's reader.
    #[serde(default)]
    pub queue_depth: u32,
    /// The files and block devices of the live table, each with the I/O
    /// path it uses (`uring`, `pwrite`, `mmap`).
    #[serde(default)]
    pub files: Vec<IoReport>,
    /// Why the device has failed (`core::fault`: a panic or damage in its
    /// own code); while set, its requests get EIO and its segments'
    /// status lines read `Fail`, as dm-thin's do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Which device this one is built on has failed, and why: its
    /// requests get EIO (a dm device over a failed one gets its errors)
    /// though this device itself has not failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_failed: Option<String>,
}

/// One device of a `table` reply; its lines are in the payload, in the
/// order of the devices.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableDevice {
    pub name: String,
    /// Lines of this device in the payload (0: no table in that slot).
    pub lines: usize,
}

/// A target type, for `targets`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetVersion {
    pub name: String,
    pub version: [u32; 3],
}
