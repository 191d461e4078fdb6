//! The kernel's persistent-data library (drivers/md/persistent-data) as
//! dm-thin uses it: checksummed 4 KiB metadata blocks, copy-on-write
//! btrees, and space maps of reference counts, committed as transactions.
//! Files from the bottom: `block` (the block and node formats, node
//! buffers from a fixed-size block pool), `cache` (clean nodes under the
//! memory budget), `tm` (the transaction manager and in-memory counts),
//! `btree`, `space_map`.

pub mod block;
pub mod btree;
pub mod cache;
pub mod space_map;
pub mod tm;
