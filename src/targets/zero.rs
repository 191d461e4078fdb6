//! `zero`: reads return zeros, writes and discards are dropped — a sparse
//! device of any size for tests and for padding tables.

use std::sync::Arc;

use super::{expect_args, Target, TargetArgs, TargetError};
use crate::core::{BlockDevice, DevResult, Extent, Limits, WriteBuf};

pub struct Zero {
    len: u64,
}

/// The `zero` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "zero",
    version: [1, 2, 0],
    new,
    args: &[],
    more_args: None,
};

pub fn new(a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    expect_args(a.args, 0, "zero takes no arguments")?;
    Ok(Arc::new(Zero { len: a.len }))
}

impl BlockDevice for Zero {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        Limits::default()
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> DevResult<()> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: WriteBuf<'_>, _fua: bool) -> DevResult<()> {
        Ok(())
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> DevResult<()> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> DevResult<()> {
        Ok(())
    }
    /// Nothing is stored and everything reads as zeros.
    fn extents(
        &self,
        _offset: u64,
        len: u64,
        out: &mut dyn FnMut(Extent) -> bool,
    ) -> DevResult<()> {
        out(Extent {
            len,
            hole: true,
            zero: true,
        });
        Ok(())
    }
}

impl Target for Zero {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        String::new()
    }
}
