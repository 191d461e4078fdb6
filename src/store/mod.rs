//! Backing stores: the bottom of every stack. They implement the device
//! trait directly over a file or a block device (`file.rs`, through one
//! io_uring per store, `uring.rs`, or the syscalls: `file_io.rs` picks),
//! memory, a remote NBD export
//! (`nbd.rs`) or an RBD image (`rbd/`, with the `rbd` feature).
//! [`open`] turns any device path into one ([`location`] says which).

pub mod file;
pub mod file_io;
mod filemap;
pub mod location;
pub mod mem;
pub mod nbd;
#[cfg(feature = "rbd")]
pub mod rbd;
pub mod rbd_spec;
mod uring;
mod writers;

pub use file::{FileStore, OpenFlags, FILE_QUEUE_DEPTH};
pub use file_io::FileIo;
pub use location::{open, open_path, Location};
pub use mem::MemStore;
pub use nbd::NbdStore;
