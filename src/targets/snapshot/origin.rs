//! `snapshot-origin <origin>`: the origin as its users see it. Reads pass
//! through; a write first copies every chunk it changes into each snapshot
//! of the origin that has no copy of it yet (dm-snap's `do_origin`), so the
//! snapshots keep the data as it was.

use std::sync::Arc;

use super::registry;
use crate::core::{BlockDevice, DevResult, Limits, WriteBuf};

pub struct Origin {
    pub dev: Arc<dyn BlockDevice>,
    /// The device as the table named it.
    pub name: String,
    pub key: String,
    pub len: u64,
}

impl Origin {
    /// Copy out the chunks of `[offset, +len)` into every snapshot that
    /// needs them; returns once each copy is committed.
    fn before_write(&self, offset: u64, len: u64) {
        for s in registry::snapshots_of(&self.key) {
            // Copy-out reports its failures by invalidating the snapshot:
            // the origin write goes on whatever happens to a snapshot.
            let _ = s.each_piece(offset, len, |c, _, _, _| {
                let _g = s.exclusive(c);
                s.copy_out_locked(c);
                Ok(())
            });
        }
    }
}

impl BlockDevice for Origin {
    fn size(&self) -> u64 {
        self.len
    }
    /// A write copies the chunks it changes into every snapshot first,
    /// chunks of a size the snapshots' COW headers set (up to 1 GiB), and
    /// snapshots may be added after the engine took these limits: so
    /// requests always run on workers of this device's own, never on an
    /// event loop other exports' clients share.
    fn limits(&self) -> Limits {
        let mut l = self.dev.limits();
        l.queue_depth = l.queue_depth.max(super::COPY_QUEUE_DEPTH);
        l
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.dev.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.before_write(offset, data.len() as u64);
        self.dev.write(offset, data, fua)
    }
    fn flush(&self) -> DevResult<()> {
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.before_write(offset, len);
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.before_write(offset, len);
        self.dev.write_zeroes(offset, len, fua)
    }
}
