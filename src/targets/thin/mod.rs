//! dm-thin: `thin-pool` and `thin`, on the kernel's own metadata format
//! (docs/THIN.md), so a pool moves between udm, the kernel and
//! thin-provisioning-tools unchanged. Files from the bottom: `pdata/`
//! (persistent-data: blocks, btrees, space maps), `metadata` (superblock,
//! device details, mapping trees), `pool` (the pool target and the pool
//! state thin devices share), `dev` (the thin target); `standin` is what
//! both lines build into when `udm table check` opens no devices.

pub mod dev;
pub mod metadata;
pub mod pdata;
pub mod pool;
pub mod standin;
