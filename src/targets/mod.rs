//! Targets, one file each as in Linux's drivers/md: a target maps the byte
//! range of one table segment onto the devices below it.

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

    /// Parameters as `dmsetup table` prints them. Keys are replaced by
    /// zeros of the same length unless `show_keys`.
    fn table_params(&self, show_keys: bool) -> String;
}
