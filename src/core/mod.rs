//! The bottom layer: the device trait every layer implements, its errors,
//! the dmsetup table *syntax*, and the number and size parsers (`units`). Nothing here knows a target, a store or
//! a protocol, so everything else may depend on it.

pub mod device;
pub mod dirs;
pub mod error;
pub mod fault;
pub mod knobs;
pub mod sole;
pub mod table;
pub mod units;

pub use device::{extents_of, AsyncIo, BlockDevice, Extent, Lent, Limits, Prepare, WriteBuf};
pub use error::{DevError, DevResult};
pub use fault::Fault;
