//! The device-mapper core: the path every request of a mapped device
//! takes (Linux's `dm.c`, beside `dm-table.c` and `dm-ioctl.c`, which are
//! [`crate::mapper`]'s jobs here).
//!
//! It sits on the engine's floor and uses only `core` and `mem`, so a
//! request goes down from the engine through [`LiveDevice`] and
//! [`Routes`] to the targets without climbing back to the code that
//! builds tables. Nothing here knows a target type, a table's text or a
//! path: `mapper` hands it finished routes to devices.
//!
//! Files: [`route`] (a request over a device's ranges, cut at their
//! boundaries and at the limits a device declares), [`live`] (the device
//! clients see, whose routes can be swapped), [`stats`] (per-device
//! counters and latency histograms).

pub mod live;
pub mod route;
pub mod stats;

pub use live::LiveDevice;
pub use route::{Route, Routes};
pub use stats::{Snapshot, StatOp, Stats};

/// Test helper for the files here: one request submitted to `dev`, waited
/// for; `None` when the device declined it.
#[cfg(test)]
fn submit_and_wait(
    dev: &dyn crate::core::BlockDevice,
    write: bool,
    offset: u64,
    buf: &mut [u8],
) -> Option<crate::core::DevResult<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let io = crate::core::AsyncIo {
        write,
        fua: false,
        offset,
        buf: buf.as_mut_ptr(),
        len: buf.len(),
        prepare: None,
        done: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    };
    // SAFETY: `buf` outlives the call, and the completion has run when
    // `recv` returns (the test devices complete before returning).
    unsafe { dev.submit(io) };
    rx.recv().unwrap()
}
