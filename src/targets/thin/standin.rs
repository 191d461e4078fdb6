//! What a `thin-pool` or `thin` line builds into when `udm table check`
//! did not open its devices: the line's own rules have been applied (the
//! block size, features, ids), but there is no metadata to open and no
//! pool to bind to, so the check gets this stand-in, which refuses I/O.

use std::sync::Arc;

use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::targets::Target;

/// Whether `dev` is a device a table check did not open (unlimited, no
/// I/O), as the integrity target also tells.
pub fn unopened(dev: &Arc<dyn BlockDevice>) -> bool {
    dev.size() == u64::MAX
}

pub struct StandIn {
    name: &'static str,
    params: String,
    len: u64,
}

impl StandIn {
    pub fn target(name: &'static str, args: &[String], len: u64) -> Arc<dyn Target> {
        let params: Vec<String> = args
            .iter()
            .map(|a| crate::core::table::escape_arg(a).into_owned())
            .collect();
        Arc::new(StandIn {
            name,
            params: params.join(" "),
            len,
        })
    }

    fn refuse<T>() -> DevResult<T> {
        Err(DevError::NotSupported(
            "I/O on a thin target that a table check built without its devices",
        ))
    }
}

impl BlockDevice for StandIn {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        Limits::default()
    }
    fn read(&self, _: u64, _: &mut [u8]) -> DevResult<()> {
        Self::refuse()
    }
    fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
        Self::refuse()
    }
    fn flush(&self) -> DevResult<()> {
        Self::refuse()
    }
    fn discard(&self, _: u64, _: u64) -> DevResult<()> {
        Self::refuse()
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
        Self::refuse()
    }
}

impl Target for StandIn {
    fn type_name(&self) -> &'static str {
        self.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        self.params.clone()
    }
}
