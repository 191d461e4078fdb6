//! The kernel's persistent-data library (drivers/md/persistent-data) as
//! dm-thin uses it: checksummed 4 KiB metadata blocks, copy-on-write
//! btrees, and space maps of reference counts, committed as transactions.
//! Files from the bottom: `block` (the block and node formats), `tm` (the
//! transaction manager and in-memory counts), `btree`, `space_map`.

pub mod block;
pub mod btree;
pub mod space_map;
pub mod tm;
