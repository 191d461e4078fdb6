//! `error [<dev> <offset>]`: every read, write and discard fails with an
//! I/O error, as dm's io-err target does — used to fence off a range or to
//! test how layers above handle a failing disk. Flush succeeds, because
//! the kernel never sends flushes to this target either.

use std::sync::Arc;

use super::{resolve_area, Target, TargetArgs, TargetError};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

pub struct ErrorTarget {
    len: u64,
}

/// The `error` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "error",
    version: [1, 7, 0],
    new,
    args: &["device", "offset"],
    more_args: None,
};

pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    match a.args.len() {
        0 => {}
        2 => {
            // The device only matters for limits in the kernel; check it exists.
            let len = a.len;
            resolve_area(&mut a, 0, len)?;
        }
        n => {
            return Err(TargetError::line(format!(
                "expected no arguments or '<device> <offset>', got {n} arguments"
            )))
        }
    }
    Ok(Arc::new(ErrorTarget { len: a.len }))
}

impl ErrorTarget {
    fn fail(&self, offset: u64, len: u64) -> DevError {
        DevError::Target(format!(
            "error target: bytes [{offset}, +{len}) of this segment always fail"
        ))
    }
}

impl BlockDevice for ErrorTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        Limits::default()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        Err(self.fail(offset, buf.len() as u64))
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, _fua: bool) -> DevResult<()> {
        Err(self.fail(offset, data.len() as u64))
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        Err(self.fail(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> DevResult<()> {
        Err(self.fail(offset, len))
    }
}

impl Target for ErrorTarget {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        String::new()
    }
}
