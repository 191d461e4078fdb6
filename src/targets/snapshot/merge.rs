//! `snapshot-merge`'s I/O and its background merge: the target takes the
//! origin's place, reads and writes see the snapshot's data (a chunk not
//! yet merged is read from, and written to, the COW device), and a thread
//! moves the exceptions back into the origin one chunk at a time, from the
//! last one committed back to the first, as the kernel's merge does. Each
//! step copies the chunk, flushes the origin, then clears the exception
//! and writes its area (flush + FUA): a crash at any point leaves either
//! the exception (merged again on restart, same bytes) or the merged chunk.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::registry;
use super::snap::Snap;
use crate::core::{DevResult, WriteBuf};

/// Test knob: milliseconds to wait between merge steps, so that a test can
/// kill the server in the middle of a merge. Unset in normal use.
const DELAY_ENV: &str = "UDM_SNAPSHOT_MERGE_DELAY_MS";

/// Start the merge thread on `snap` unless one runs; `Snap::merge_paused`
/// holds it while the device is suspended (the kernel stops merging on
/// suspend).
pub fn start(snap: &Arc<Snap>, options: &crate::targets::TargetOptions) -> Result<(), String> {
    if snap.merging.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let delay = std::env::var(DELAY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let weak = Arc::downgrade(snap);
    options
        .spawn_job("udm-snap-merge".into(), move || run(weak, delay))
        .map(|_| ())
        .map_err(|e| format!("cannot start the snapshot merge thread: {e}"))
}

fn run(weak: Weak<Snap>, delay: Option<Duration>) {
    loop {
        let Some(s) = weak.upgrade() else { return };
        if s.merge_paused.load(Ordering::Acquire) {
            drop(s);
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match step(&s) {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!("snapshot on {}: merge finished", s.cow_key);
                s.finished_merge();
                return;
            }
            Err(e) => {
                tracing::error!("snapshot on {}: merge failed: {e}", s.cow_key);
                s.merge_failed.store(true, Ordering::Release);
                s.finished_merge();
                return;
            }
        }
        drop(s);
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    }
}

/// Merge the last exception; false when none is left.
fn step(s: &Snap) -> DevResult<bool> {
    if !s.is_valid() {
        return Err(s.invalid_error());
    }
    let Some((old, new)) = s.store().last_exception()? else {
        return Ok(false);
    };
    let _g = s.exclusive(old);
    super::snap::copy_range(
        &*s.cow,
        new * s.chunk,
        &*s.origin,
        old * s.chunk,
        s.chunk_len(old),
    )?;
    s.origin.flush()?;
    s.store().commit_merge()?;
    Ok(true)
}

/// A write to the merging origin: a chunk still in the COW device is
/// written there (the merge moves it later); any other goes to the origin,
/// after the origin's other snapshots got their copies.
pub fn write(s: &Snap, offset: u64, data: &[u8], fua: bool) -> DevResult<()> {
    if !s.is_valid() {
        return Err(s.invalid_error());
    }
    let others: Vec<Arc<Snap>> = registry::snapshots_of(&s.origin_key)
        .into_iter()
        .filter(|o| !std::ptr::eq(o.as_ref(), s))
        .collect();
    s.each_piece(offset, data.len() as u64, |c, within, at, n| {
        let piece = WriteBuf::Borrowed(&data[at as usize..(at + n) as usize]);
        let _g = s.exclusive(c);
        let mapped = s.store().lookup(c);
        if let Some(new) = mapped {
            return s.cow.write(new * s.chunk + within, piece, fua);
        }
        for o in &others {
            let _ = o.each_piece(c * s.chunk + within, n, |oc, _, _, _| {
                let _g = o.exclusive(oc);
                o.copy_out_locked(oc);
                Ok(())
            });
        }
        s.origin.write(c * s.chunk + within, piece, fua)
    })
}
