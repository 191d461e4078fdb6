//! The mapping core: the device trait every layer implements, errors,
//! dmsetup table parsing and the mapped device that routes requests to the
//! segments of a table (dm core's job in the kernel).

pub mod device;
pub mod error;
pub mod mapped;
pub mod registry;
pub mod table;

pub use device::{BlockDevice, Limits, WriteBuf};
pub use error::{DevError, DevResult};
