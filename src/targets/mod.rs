//! Targets, one file each as in Linux's drivers/md: a target maps the byte
//! range of one table segment onto the devices below it.

use std::sync::Arc;

use crate::core::BlockDevice;

pub mod crypt;
pub mod error;
pub mod linear;
pub mod striped;
pub mod zero;

/// A table segment's target. Offsets passed to its [`BlockDevice`] methods
/// are relative to the segment start; `size()` is the segment length.
pub trait Target: BlockDevice {
    /// Target type as written in tables (`linear`, `crypt`, ...).
    fn type_name(&self) -> &'static str;

    /// Parameters as `dmsetup table` prints them (devices by the name they
    /// were given). Keys are replaced by zeros of the same length unless
    /// `show_keys`, as dmsetup does without `--showkeys`.
    fn table_params(&self, show_keys: bool) -> String;
}

/// Resolves a device argument of a table line (a path, or `@NAME` for
/// another device of the same server) to an open device.
pub trait DeviceResolver {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String>;
}

/// What a target constructor gets: its arguments (after the type name), the
/// segment length in bytes, and a resolver for device arguments.
pub struct TargetArgs<'a> {
    pub args: &'a [String],
    pub len: u64,
    pub resolver: &'a mut dyn DeviceResolver,
    /// Knobs from the command line that targets may honour
    /// (e.g. `--crypt-threads`).
    pub options: &'a TargetOptions,
}

/// Server-wide settings that reach target constructors.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// Threads a crypt target may use to split one request (0 = all cores).
    pub crypt_threads: usize,
}

/// A constructor error: which argument (0-based index into `args`, or
/// `None` for the line as a whole) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetError {
    pub arg: Option<usize>,
    pub msg: String,
}

impl TargetError {
    pub fn at(arg: usize, msg: impl Into<String>) -> Self {
        TargetError {
            arg: Some(arg),
            msg: msg.into(),
        }
    }
    pub fn line(msg: impl Into<String>) -> Self {
        TargetError {
            arg: None,
            msg: msg.into(),
        }
    }
}

/// Signature every target constructor has.
pub type Constructor = fn(TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError>;
