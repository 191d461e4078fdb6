//! Backing stores: the bottom of every stack. They implement the device
//! trait directly over a file, a block device, memory, a remote NBD export
//! (`nbd.rs`) or an RBD image (`rbd/`, with the `rbd` feature).
//! [`open`] turns any device path into one ([`location`] says which).

pub mod file;
mod filemap;
pub mod location;
pub mod mem;
pub mod nbd;
#[cfg(feature = "rbd")]
pub mod rbd;
pub mod rbd_spec;

pub use file::{FileStore, OpenFlags};
pub use location::{open, open_path, Location};
pub use mem::MemStore;
pub use nbd::NbdStore;
