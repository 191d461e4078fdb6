//! `linear <dev> <offset>`: the segment maps onto a contiguous area of one
//! device. The request is passed down as it is, with its offset shifted:
//! no copy, no allocation (no-clone remap). Direct access (a crypt target above
//! encrypting straight into an in-memory store below) is forwarded the same
//! way: the offset shift changes nothing about which bytes form a piece.

use std::sync::Arc;

use super::{expect_args, resolve_area, Area, Target, TargetArgs, TargetError};
use crate::core::device::Transform;
use crate::core::{extents_of, AsyncIo, BlockDevice, DevResult, Extent, Lent, Limits, WriteBuf};

pub struct Linear {
    area: Area,
    len: u64,
}

/// The `linear` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "linear",
    version: [1, 5, 0],
    new,
    args: &["device", "offset"],
    more_args: None,
};

/// Constructor, as dm-linear's: exactly `<dev> <offset>`.
/// The device a linear line's arguments (`DEVICE OFFSET`) name, read
/// without building the target.
pub fn device_of(args: &[String]) -> Option<&str> {
    args.first().map(String::as_str)
}

pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    expect_args(a.args, 2, "<device> <offset>")?;
    let len = a.len;
    let area = resolve_area(&mut a, 0, len)?;
    Ok(Arc::new(Linear { area, len }))
}

impl BlockDevice for Linear {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        self.area.dev.limits()
    }
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.area.dev.read(self.area.offset + offset, buf)
    }
    #[inline]
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.area.dev.write(self.area.offset + offset, data, fua)
    }
    fn write_vectored(
        &self,
        offset: u64,
        bufs: &[std::io::IoSlice<'_>],
        fua: bool,
    ) -> DevResult<()> {
        self.area
            .dev
            .write_vectored(self.area.offset + offset, bufs, fua)
    }
    fn direct_access(&self) -> bool {
        self.area.dev.direct_access()
    }
    fn resident(&self, offset: u64, len: usize) -> bool {
        self.area.dev.resident(self.area.offset + offset, len)
    }
    fn resident_for_write(&self, offset: u64, len: usize) -> bool {
        self.area
            .dev
            .resident_for_write(self.area.offset + offset, len)
    }
    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        self.area.dev.lend(self.area.offset + offset, len, f)
    }
    fn lends(&self) -> bool {
        self.area.dev.lends()
    }
    fn can_submit(&self) -> bool {
        self.area.dev.can_submit()
    }
    fn takes_prepare(&self) -> bool {
        self.area.dev.takes_prepare()
    }
    unsafe fn submit(&self, io: AsyncIo) {
        let at = self.area.offset + io.offset;
        // SAFETY: the caller's guarantee on the buffer is passed on as is.
        unsafe { self.area.dev.submit(io.at(at)) }
    }
    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.area
            .dev
            .read_transformed(self.area.offset + offset, buf, t)
    }
    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.area
            .dev
            .write_transformed(self.area.offset + offset, src, fua, t)
    }
    fn tag_layout(&self) -> Option<crate::core::device::TagLayout> {
        self.area.dev.tag_layout()
    }
    fn read_tagged(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> DevResult<()> {
        self.area
            .dev
            .read_tagged(self.area.offset + offset, buf, tags)
    }
    fn write_tagged(&self, offset: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        self.area
            .dev
            .write_tagged(self.area.offset + offset, data, tags, fua)
    }
    fn flush(&self) -> DevResult<()> {
        self.area.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.area.dev.discard(self.area.offset + offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.area
            .dev
            .write_zeroes(self.area.offset + offset, len, fua)
    }
    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        extents_of(self.area.dev.as_ref(), self.area.offset + offset, len, out).map(|_| ())
    }
}

impl Target for Linear {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        format!("{} {}", self.area.table_name(), self.area.table_offset())
    }
    fn as_linear(&self) -> Option<(&Arc<dyn BlockDevice>, u64)> {
        Some((&self.area.dev, self.area.offset))
    }
}
