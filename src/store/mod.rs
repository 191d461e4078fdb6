//! Backing stores: the bottom of every stack. They implement the device
//! trait directly over a file, a block device or memory.

pub mod file;
mod filemap;
pub mod mem;

pub use file::FileStore;
pub use mem::MemStore;
