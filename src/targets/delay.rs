//! `delay <dev> <offset> <ms> [<write dev> <offset> <ms> [<flush dev>
//! <offset> <ms>]]`: dm-delay. Reads go to the first device after its
//! delay; with six arguments writes (and discards, write-zeroes) go to the
//! second and flushes follow the writes; with nine, flushes have their
//! own. With three, one device and delay serve all three classes.
//!
//! Each request is held for its class's delay from the moment it reaches
//! the target, then passed down — as the kernel's timer list does. The
//! call is synchronous, so a held request occupies the thread that made
//! it. The target therefore asks, through [`Limits::queue_depth`], for
//! [`HELD_DEPTH`] workers of its own, as a remote store does for its round
//! trips: the engine adds them to the pool, never runs the device's
//! requests on a connection's reader, and lets no more than that many run
//! at once, so held requests stall neither other devices nor, up to that
//! depth, the device's own requests to an undelayed leg.
//!
//! Status (`dmsetup status`): `<reads> <writes> <flushes>` being held
//! right now, as the kernel counts them. A flush is sent to the flush
//! device and, when the writes went to another device, to that one too:
//! a flush promises that every completed write is durable.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{resolve_area, Area, Target, TargetArgs, TargetError};
use crate::core::{BlockDevice, DevResult, Limits, WriteBuf};

/// Requests a delay device may have held at once without queueing behind
/// each other: what one client may have in flight.
pub const HELD_DEPTH: u32 = 128;

/// One class of requests: where they go and how long they wait.
struct Class {
    area: Area,
    delay_ms: u32,
    /// Requests of this class being held now.
    held: AtomicU32,
}

pub struct Delay {
    /// Number of table arguments (3, 6 or 9), for printing the table back.
    argc: usize,
    read: Class,
    write: Class,
    flush: Class,
    len: u64,
}

/// The `delay` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "delay",
    version: [1, 3, 0],
    new,
    args: &[
        "device",
        "offset",
        "delay",
        "write device",
        "write offset",
        "write delay",
        "flush device",
        "flush offset",
        "flush delay",
    ],
    more_args: None,
};

pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    let argc = a.args.len();
    if argc != 3 && argc != 6 && argc != 9 {
        return Err(TargetError::line(format!(
            "Requires exactly 3, 6 or 9 arguments ('<device> <offset> <delay>' for reads, then \
             optionally the same for writes, then for flushes), got {argc}"
        )));
    }
    // As the kernel: each class is built from its own three words, and a
    // class without words of its own takes the previous class's.
    let read = class(&mut a, 0)?;
    let w = if argc >= 6 { 3 } else { 0 };
    let write = class(&mut a, w)?;
    let flush = class(&mut a, if argc == 9 { 6 } else { w })?;
    Ok(Arc::new(Delay {
        argc,
        read,
        write,
        flush,
        len: a.len,
    }))
}

fn class(a: &mut TargetArgs<'_>, at: usize) -> Result<Class, TargetError> {
    let s = &a.args[at + 2];
    let delay_ms = crate::core::units::parse_decimal(s)
        .ok()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| {
            TargetError::at(
                at + 2,
                format!("Invalid delay: expected milliseconds (0 to 4294967295), got '{s}'"),
            )
        })?;
    let len = a.len;
    let area = resolve_area(a, at, len)?;
    Ok(Class {
        area,
        delay_ms,
        held: AtomicU32::new(0),
    })
}

impl Class {
    /// Hold the calling request for this class's delay.
    fn hold(&self) {
        if self.delay_ms == 0 {
            return;
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(u64::from(self.delay_ms)));
        self.held.fetch_sub(1, Ordering::Relaxed);
    }

    fn table(&self) -> String {
        format!(
            "{} {} {}",
            self.area.table_name(),
            self.area.table_offset(),
            self.delay_ms
        )
    }
}

impl BlockDevice for Delay {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        let mut l = self
            .read
            .area
            .dev
            .limits()
            .stack(self.write.area.dev.limits())
            .stack(self.flush.area.dev.limits());
        if [&self.read, &self.write, &self.flush]
            .iter()
            .any(|c| c.delay_ms > 0)
        {
            l.queue_depth = l.queue_depth.max(HELD_DEPTH);
        }
        l
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.read.hold();
        self.read.area.dev.read(self.read.area.offset + offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.write.hold();
        self.write
            .area
            .dev
            .write(self.write.area.offset + offset, data, fua)
    }
    fn write_vectored(
        &self,
        offset: u64,
        bufs: &[std::io::IoSlice<'_>],
        fua: bool,
    ) -> DevResult<()> {
        self.write.hold();
        self.write
            .area
            .dev
            .write_vectored(self.write.area.offset + offset, bufs, fua)
    }
    fn flush(&self) -> DevResult<()> {
        self.flush.hold();
        self.flush.area.dev.flush()?;
        if !std::ptr::addr_eq(
            Arc::as_ptr(&self.flush.area.dev),
            Arc::as_ptr(&self.write.area.dev),
        ) {
            self.write.area.dev.flush()?;
        }
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.write.hold();
        self.write
            .area
            .dev
            .discard(self.write.area.offset + offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.write.hold();
        self.write
            .area
            .dev
            .write_zeroes(self.write.area.offset + offset, len, fua)
    }
}

impl Target for Delay {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        let mut s = self.read.table();
        if self.argc >= 6 {
            s.push(' ');
            s.push_str(&self.write.table());
        }
        if self.argc >= 9 {
            s.push(' ');
            s.push_str(&self.flush.table());
        }
        s
    }
    fn status(&self) -> String {
        format!(
            "{} {} {}",
            self.read.held.load(Ordering::Relaxed),
            self.write.held.load(Ordering::Relaxed),
            self.flush.held.load(Ordering::Relaxed)
        )
    }
}
