//! dm-snapshot's three targets (docs/SNAPSHOT.md):
//!
//! - `snapshot <origin> <COW device> <P|N|PO> <chunksize>`: the origin as
//!   it was when the snapshot was taken. Unchanged chunks are read from the
//!   origin; a chunk the origin or the snapshot changed lives on the COW
//!   device, recorded by the exception store ([`store`]: `P` persistent in
//!   the kernel's format, `N` transient, `PO` persistent where a full COW
//!   fails the snapshot's writes instead of invalidating it);
//! - `snapshot-origin <origin>`: the origin as its users write it; a write
//!   first copies the chunks it changes into every snapshot ([`origin`]);
//! - `snapshot-merge <origin> <COW device> <P|PO> <chunksize>`: in the
//!   origin's place, merges the snapshot back into it ([`merge`]).
//!
//! Which snapshots an origin has is kept per server ([`registry`]), by the
//! name the tables give the origin; the state of one snapshot ([`snap`]) is
//! shared by every table naming its COW device, so reloading a table, or
//! loading `snapshot-merge` over a snapshot's COW device, takes the state
//! over instead of reading the device again.

mod merge;
mod origin;
mod registry;
mod snap;
pub mod store;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{parse_number, Target, TargetArgs, TargetError};
use crate::core::device::{unopened, write_zeroes_by_writing};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use snap::{Snap, SnapSpec};
use store::Kind;

/// The kernel's default chunk (16 KiB), for a chunk size of 0.
const DEFAULT_CHUNK_SECTORS: u64 = 32;

/// The largest chunk (bytes) whose copy a request may do on the thread
/// that received it (an event loop runs requests up to 64 KiB inline).
const INLINE_COPY_MAX: u64 = 64 << 10;

/// Requests a device that copies chunks may have running on workers of
/// its own ([`Limits::queue_depth`]): long copies hold these, and only
/// these.
const COPY_QUEUE_DEPTH: u32 = 4;

pub static TYPE: super::TargetType = super::TargetType {
    name: "snapshot",
    version: [1, 16, 0],
    new: new_snapshot,
    args: ARGS,
    more_args: None,
};

pub static ORIGIN_TYPE: super::TargetType = super::TargetType {
    name: "snapshot-origin",
    version: [1, 9, 0],
    new: new_origin,
    args: &["origin"],
    more_args: None,
};

pub static MERGE_TYPE: super::TargetType = super::TargetType {
    name: "snapshot-merge",
    version: [1, 5, 0],
    new: new_merge,
    args: ARGS,
    more_args: None,
};

const ARGS: &[&str] = &["origin", "COW device", "store type", "chunk size"];

/// A `snapshot` or `snapshot-merge` segment.
pub struct Snapshot {
    snap: Arc<Snap>,
    origin_name: String,
    cow_name: String,
    store_arg: &'static str,
    len: u64,
    merge: bool,
    /// For the merge thread `resume` starts.
    options: super::TargetOptions,
}

/// The store type word: `P`, `N` or `PO`, in either case, as the kernel.
fn store_type(args: &[String]) -> Result<(Kind, bool, &'static str), TargetError> {
    match args[2].to_ascii_uppercase().as_str() {
        "P" => Ok((Kind::Persistent, false, "P")),
        "PO" => Ok((Kind::Persistent, true, "PO")),
        "N" => Ok((Kind::Transient, false, "N")),
        s => Err(TargetError::at(
            2,
            format!("Persistent flag is not P, PO or N: got '{s}'"),
        )),
    }
}

/// The chunk size in sectors: a power of two, a multiple of both devices'
/// logical blocks (dm-exception-store's `set_chunk_size`).
fn chunk_sectors(args: &[String], devs: [&dyn BlockDevice; 2]) -> Result<u64, TargetError> {
    let mut c = parse_number(args, 3, "a chunk size in 512-byte sectors")?;
    if c == 0 {
        c = DEFAULT_CHUNK_SECTORS;
    }
    if !c.is_power_of_two() {
        return Err(TargetError::at(
            3,
            format!("Chunk size {c} is not a power of 2"),
        ));
    }
    if c > (i32::MAX as u64) >> 9 {
        return Err(TargetError::at(3, format!("Chunk size {c} is too high")));
    }
    for d in devs {
        let lbs = u64::from(d.limits().logical_block_size.max(512)) / 512;
        if c % lbs != 0 {
            return Err(TargetError::at(
                3,
                format!("Chunk size {c} is not a multiple of device blocksize ({lbs} sectors)"),
            ));
        }
    }
    Ok(c)
}

fn resolve(a: &mut TargetArgs<'_>, idx: usize) -> Result<Arc<dyn BlockDevice>, TargetError> {
    let name = a
        .args
        .get(idx)
        .ok_or_else(|| TargetError::at(idx, "missing device"))?;
    a.resolver
        .resolve(name)
        .map_err(|e| TargetError::at(idx, e))
}

fn build(a: &mut TargetArgs<'_>, merge: bool) -> Result<Snapshot, TargetError> {
    let usage = "<origin> <COW device> <P|N|PO> <chunksize>";
    super::expect_args(a.args, 4, usage)?;
    let (kind, overflow_ok, store_arg) = store_type(a.args)?;
    if merge && kind == Kind::Transient {
        return Err(TargetError::at(
            2,
            "snapshot-merge needs a persistent exception store (P or PO); a transient \
             snapshot cannot be merged",
        ));
    }
    let origin = resolve(a, 0)?;
    let cow = resolve(a, 1)?;
    let chunk = chunk_sectors(a.args, [origin.as_ref(), cow.as_ref()])?;
    let (origin_key, cow_key) = (registry::key(&a.args[0]), registry::key(&a.args[1]));
    if origin_key == cow_key {
        return Err(TargetError::at(
            1,
            "COW device cannot be the same as the origin device",
        ));
    }
    if a.len > origin.size() {
        return Err(TargetError::line(format!(
            "the snapshot has {} sectors, more than its origin {} ({}): give the origin's size",
            a.len / 512,
            a.args[0],
            origin.size() / 512
        )));
    }
    let placeholder = unopened(cow.as_ref());
    let snap = match registry::by_cow(&cow_key) {
        Some(s) if s.origin_key == origin_key => s,
        Some(_) => {
            return Err(TargetError::at(
                1,
                format!(
                    "COW device {} is in use by a snapshot of another origin",
                    a.args[1]
                ),
            ))
        }
        None => {
            let spec = SnapSpec {
                origin,
                cow,
                origin_key,
                cow_key,
                kind: if placeholder { Kind::Transient } else { kind },
                chunk_sectors: chunk,
                len: a.len,
                overflow_ok,
                pinned: a
                    .options
                    .pin("a snapshot", 0, "")
                    .map_err(TargetError::line)?,
            };
            let s = Arc::new(Snap::open(spec).map_err(|e| TargetError::at(1, e))?);
            if !placeholder {
                registry::register(&s);
            }
            s
        }
    };
    snap.add_event_hook(a.options.events.clone());
    Ok(Snapshot {
        snap,
        origin_name: a.args[0].clone(),
        cow_name: a.args[1].clone(),
        store_arg,
        len: a.len,
        merge,
        options: a.options.clone(),
    })
}

pub fn new_snapshot(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    Ok(Arc::new(build(&mut a, false)?))
}

/// The merge starts at the table's `resume`, as the kernel's
/// `snapshot_merge_resume` starts it: a `snapshot-merge` table loaded while
/// the snapshot and its origin are live must not move chunks into the
/// origin under them, nor stop the live snapshot's copy-outs.
pub fn new_merge(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    Ok(Arc::new(build(&mut a, true)?))
}

pub fn new_origin(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    super::expect_args(a.args, 1, "<origin>")?;
    let dev = resolve(&mut a, 0)?;
    if a.len > dev.size() {
        return Err(TargetError::line(format!(
            "the segment has {} sectors, more than its origin {} ({})",
            a.len / 512,
            a.args[0],
            dev.size() / 512
        )));
    }
    Ok(Arc::new(origin::Origin {
        dev,
        name: a.args[0].clone(),
        key: registry::key(&a.args[0]),
        len: a.len,
    }))
}

impl BlockDevice for Snapshot {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        let mut l = Limits {
            discard: false,
            write_zeroes: false,
            ..self.snap.origin.limits().stack(self.snap.cow.limits())
        };
        if self.snap.chunk > INLINE_COPY_MAX {
            // A write copies its whole chunk first, and a merge step holds
            // a chunk while it copies it: with chunks of up to 1 GiB (the
            // COW header sets them) one 4 KiB request may take seconds,
            // which must not be spent on an event loop other exports'
            // clients share.
            l.queue_depth = l.queue_depth.max(COPY_QUEUE_DEPTH);
        }
        l
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.snap.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        if self.merge {
            merge::write(&self.snap, offset, data.as_slice(), fua)
        } else {
            self.snap.write(offset, data.as_slice(), fua)
        }
    }
    fn flush(&self) -> DevResult<()> {
        self.snap.cow.flush()?;
        if self.merge {
            self.snap.origin.flush()?;
        }
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> DevResult<()> {
        Err(DevError::NotSupported("discard on a snapshot"))
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        write_zeroes_by_writing(self, offset, len, fua)
    }
}

impl Target for Snapshot {
    fn type_name(&self) -> &'static str {
        if self.merge {
            MERGE_TYPE.name
        } else {
            TYPE.name
        }
    }
    fn table_params(&self, _show_keys: bool) -> String {
        format!(
            "{} {} {} {}",
            crate::core::table::escape_arg(&self.origin_name),
            crate::core::table::escape_arg(&self.cow_name),
            self.store_arg,
            self.snap.chunk / 512
        )
    }
    fn status(&self) -> String {
        self.snap.status()
    }
    fn postsuspend(&self) {
        if self.merge {
            self.snap.merge_paused.store(true, Ordering::Release);
        }
    }
    fn resume(&self) {
        if !self.merge {
            return;
        }
        self.snap.merge_paused.store(false, Ordering::Release);
        if unopened(self.snap.cow.as_ref()) {
            return;
        }
        if let Err(e) = merge::start(&self.snap, &self.options) {
            tracing::error!("snapshot on {}: {e}", self.snap.cow_key);
            self.snap.merge_failed.store(true, Ordering::Release);
        }
    }
}

impl Target for origin::Origin {
    fn type_name(&self) -> &'static str {
        ORIGIN_TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        crate::core::table::escape_arg(&self.name).into_owned()
    }
}

#[cfg(test)]
mod tests;
