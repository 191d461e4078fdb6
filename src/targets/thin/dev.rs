//! `thin <pool dev> <dev id> [<external origin dev>]`: a device that takes
//! data blocks from its pool on first write. Unmapped blocks read as zeros
//! (or from the external origin); a write to a block shared with a
//! snapshot copies it first; discards unmap whole blocks, and the data
//! blocks that frees are discarded on the data device (passdown).
//!
//! A write that finds the pool out of data space waits for space (the
//! kernel's queue_if_no_space), which may take as long as
//! `UDM_THIN_NO_SPACE_TIMEOUT`. It must not wait on a thread that other
//! devices' clients need, so the device takes submissions
//! ([`BlockDevice::submit`]: reads and writes run right on the submitting
//! thread, a connection's reader, as small requests ran inline before) and
//! declines a write that would wait; the engine then runs it on a worker
//! of this device's own ([`Limits::queue_depth`]), where waiting holds up
//! no other device.

use std::sync::Arc;
use std::time::Instant;

use super::metadata::Metadata;
use super::pool::{core_of, PoolCore};
use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::targets::{parse_number, Target, TargetArgs, TargetError, TargetType};

/// The `thin` target type, for [`crate::targets::TYPES`].
pub static TYPE: TargetType = TargetType {
    name: "thin",
    version: [1, 23, 0],
    new,
    args: &["pool dev", "dev id", "external origin dev"],
    more_args: None,
};

/// Requests a thin device may have running on workers of its own (see the
/// module doc): writes waiting for space hold these, and only these.
const QUEUE_DEPTH: u32 = 8;

/// The largest pool block a write submitted on a connection's thread may
/// copy or zero there (an event loop runs requests up to 64 KiB inline).
const INLINE_BLOCK_MAX: u64 = 64 << 10;

/// Whether a write may wait for data space, or must give up ([`Thin::submit`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Yes,
    No,
}

pub struct Thin {
    core: Arc<PoolCore>,
    pool_name: String,
    id: u64,
    origin: Option<(String, Arc<dyn BlockDevice>)>,
    len: u64,
}

pub fn new(a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    if !(2..=3).contains(&a.args.len()) {
        return Err(TargetError::line(
            "expected '<pool dev> <dev id> [<external origin dev>]'",
        ));
    }
    let id = parse_number(a.args, 1, "a thin device id")?;
    if id >= 1 << 24 {
        return Err(TargetError::at(
            1,
            format!("thin device id {id} is too large (ids are below 2^24)"),
        ));
    }
    let pool = a
        .resolver
        .resolve(&a.args[0])
        .map_err(|e| TargetError::at(0, e))?;
    let origin = match a.args.get(2) {
        Some(n) => Some((
            n.clone(),
            a.resolver.resolve(n).map_err(|e| TargetError::at(2, e))?,
        )),
        None => None,
    };
    if crate::core::device::unopened(pool.as_ref()) {
        return Ok(super::standin::target(TYPE.name, a.args, a.len));
    }
    // The pool's own target: under `serve --no-flatten` too, so not
    // through `redirect`.
    let core = core_of(&pool)
        .or_else(|| core_of(&a.resolver.whole_target(&pool)?))
        .ok_or_else(|| {
            TargetError::at(
                0,
                format!(
                    "{} is not a thin-pool device: name a device of this server whose table is \
                     one thin-pool line, as @NAME",
                    a.args[0]
                ),
            )
        })?;
    if !core.md_read().devs.contains_key(&id) {
        return Err(TargetError::at(
            1,
            format!("thin device {id} does not exist in the pool: send 'create_thin {id}' to the pool first"),
        ));
    }
    core.set_open(id, true);
    Ok(Arc::new(Thin {
        core,
        pool_name: a.args[0].clone(),
        id,
        origin,
        len: a.len,
    }))
}

impl Drop for Thin {
    fn drop(&mut self) {
        self.core.set_open(self.id, false);
    }
}

/// `(virtual block, offset in it, length)` pieces of a byte range.
fn pieces(bs: u64, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    let mut at = offset;
    let end = offset + len;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let vb = at / bs;
        let within = at % bs;
        let n = (bs - within).min(end - at);
        at += n;
        Some((vb, within, n))
    })
}

/// Make the block of `bs` bytes at `at` read as zeros except for the
/// `len` bytes at `within` that the caller writes next. Where the device
/// zeroes without writing (a hole punched in a file) the whole block is
/// zeroed in one call, data's part included: cheaper than two calls, and
/// the data is written after it returns. Elsewhere only the parts around
/// the data are zeroed, so no byte is written twice.
fn zero_around(dd: &dyn BlockDevice, at: u64, bs: u64, within: u64, len: u64) -> DevResult<()> {
    if dd.limits().write_zeroes {
        return dd.write_zeroes(at, bs, false);
    }
    if within > 0 {
        dd.write_zeroes(at, within, false)?;
    }
    let end = within + len;
    if end < bs {
        dd.write_zeroes(at + end, bs - end, false)?;
    }
    Ok(())
}

impl Thin {
    fn bs(&self) -> u64 {
        self.core.block_bytes
    }

    /// Fill `buf` with what an unmapped block holds at `at` (bytes into the device).
    fn read_unmapped(&self, at: u64, buf: &mut [u8]) -> DevResult<()> {
        buf.fill(0);
        if let Some((_, o)) = &self.origin {
            let size = o.size();
            if at < size {
                let n = ((size - at) as usize).min(buf.len());
                o.read(at, &mut buf[..n])?;
            }
        }
        Ok(())
    }

    /// Write one piece of one block. A mapped block of this device alone
    /// is written in place after a lookup under the shared lock; anything
    /// else is provisioned or unshared in the block's cell. A full pool is
    /// waited for with no lock and no cell held, or, with [`Wait::No`],
    /// not at all: false, nothing written.
    fn write_piece(&self, vb: u64, within: u64, data: &[u8], wait: Wait) -> DevResult<bool> {
        let start = Instant::now();
        loop {
            // The pin is taken under the lock, with the lookup, and the
            // lock goes before the data is written.
            let own = {
                let md = self.core.md_read();
                self.own_block(&md, vb)?.map(|db| (db, self.core.pin(db)))
            };
            if let Some((db, _pin)) = own {
                let at = db * self.bs() + within;
                self.core
                    .data()
                    .write(at, WriteBuf::Borrowed(data), false)?;
                return Ok(true);
            }
            let seen = self.core.space_seen();
            if self.provision(vb, within, data)? {
                return Ok(true);
            }
            if wait == Wait::No {
                return Ok(false);
            }
            self.core.wait_for_space(start, seen)?;
        }
    }

    /// The data block `vb` maps to, if it is mapped and not shared.
    fn own_block(&self, md: &Metadata, vb: u64) -> DevResult<Option<u64>> {
        Ok(
            match md.lookup(self.id, vb).map_err(|e| self.core.fail(e))? {
                Some((db, time)) if !md.shared(self.id, db, time) => Some(db),
                _ => None,
            },
        )
    }

    /// Give `vb` a new data block holding `data` at `within` (the rest
    /// zeros, the external origin's or the shared block's bytes), in the
    /// block's cell, with the metadata locked only to allocate and to map.
    /// False when the pool is full (and queues): nothing was written.
    fn provision(&self, vb: u64, within: u64, data: &[u8]) -> DevResult<bool> {
        let bs = self.bs();
        let _cell = self.core.cell(self.id, vb);
        let p = self.core.provision();
        let mut md = p.md();
        let cur = md.lookup(self.id, vb).map_err(|e| self.core.fail(e))?;
        // Another write may have provisioned it while we waited for the cell.
        if let Some((db, time)) = cur {
            if !md.shared(self.id, db, time) {
                let _pin = self.core.pin(db);
                drop(md);
                drop(p);
                let at = db * bs + within;
                self.core
                    .data()
                    .write(at, WriteBuf::Borrowed(data), false)?;
                return Ok(true);
            }
        }
        let Some(nb) = self.core.alloc_data(&mut md)? else {
            return Ok(false);
        };
        // The shared block is copied with no lock held: pinned, so a
        // discard that frees it meanwhile passes it down only after.
        // Pinned after allocating, which may wait for pins.
        let cur_pin = cur.map(|(db, _)| self.core.pin(db));
        drop(md);
        // A reload may have swapped in a bigger data device since the last write.
        let dd = self.core.data();
        let r = self.fill_new(&*dd, vb, cur, nb, within, data);
        // Before the lock: a passdown waits for the pin under it.
        drop(cur_pin);
        let mut md = p.md();
        if let Err(e) = r {
            md.tm.dsm.dec(nb);
            return Err(e);
        }
        md.insert(self.id, vb, nb).map_err(|e| self.core.fail(e))?;
        Ok(true)
    }

    /// Write new block `nb` of `vb`: `data` at `within`, and around it what
    /// the block must read as. Its mapping is inserted only after this
    /// returns and committed only after the data device's flush, so
    /// neither a reader nor a crash can see the block before its zeros.
    fn fill_new(
        &self,
        dd: &dyn BlockDevice,
        vb: u64,
        cur: Option<(u64, u32)>,
        nb: u64,
        within: u64,
        data: &[u8],
    ) -> DevResult<()> {
        let bs = self.bs();
        let at = nb * bs;
        if within == 0 && data.len() as u64 == bs {
            return dd.write(at, WriteBuf::Borrowed(data), false);
        }
        if cur.is_none() && self.origin.is_none() {
            if !self.core.features().skip_block_zeroing {
                zero_around(dd, at, bs, within, data.len() as u64)?;
            }
            return dd.write(at + within, WriteBuf::Borrowed(data), false);
        }
        // The rest is what `vb` held: its shared block or the origin's
        // bytes, copied whole with `data` laid over them.
        let mut blk = vec![0u8; bs as usize];
        match cur {
            Some((db, _)) => dd.read(db * bs, &mut blk)?,
            None => self.read_unmapped(vb * bs, &mut blk)?,
        }
        blk[within as usize..within as usize + data.len()].copy_from_slice(data);
        dd.write(at, WriteBuf::Borrowed(&blk), false)
    }

    /// Unmap `vb`; the data block it mapped, if that is now free.
    fn unmap(&self, md: &mut Metadata, vb: u64) -> DevResult<Option<u64>> {
        let Some((db, _)) = md.lookup(self.id, vb).map_err(|e| self.core.fail(e))? else {
            return Ok(None);
        };
        md.remove(self.id, vb).map_err(|e| self.core.fail(e))?;
        Ok((md.tm.dsm.get(db) == 0).then_some(db))
    }

    /// Write `src` at `offset`; false when a piece needed data space that
    /// the pool lacks and `wait` is [`Wait::No`] (the pieces before it are
    /// written: written again, the same bytes land in the same place).
    fn write_from(&self, offset: u64, src: &[u8], fua: bool, wait: Wait) -> DevResult<bool> {
        if self.core.features().read_only {
            return Err(DevError::ReadOnly);
        }
        self.core.check_writable()?;
        let mut done = 0usize;
        for (vb, within, n) in pieces(self.bs(), offset, src.len() as u64) {
            if !self.write_piece(vb, within, &src[done..done + n as usize], wait)? {
                return Ok(false);
            }
            done += n as usize;
        }
        if fua || self.core.wants_commit() {
            self.core.commit()?;
        }
        Ok(true)
    }
}

impl BlockDevice for Thin {
    fn size(&self) -> u64 {
        self.len
    }

    fn limits(&self) -> Limits {
        let mut l = Limits::default().stack(self.core.data().limits());
        l.discard = !self.core.features().ignore_discard;
        l.read_only |= self.core.features().read_only;
        l.queue_depth = l.queue_depth.max(QUEUE_DEPTH);
        l
    }

    fn can_submit(&self) -> bool {
        true
    }

    /// Run `io` here, on the submitting thread, unless it could wait long:
    /// a data device that may block declines everything (its requests go
    /// to this device's workers, as before), and a write that finds the
    /// pool full is declined before it waits for space.
    unsafe fn submit(&self, io: AsyncIo) {
        // A write with a step left to the writer (`prepare`) is declined
        // too: this device may still decline it after running the step.
        if self.core.data().limits().queue_depth > 0 || io.prepare.is_some() {
            return io.decline();
        }
        // A write may copy a shared block or zero the rest of a new one:
        // with large blocks (up to 1 GiB) that takes seconds, which must
        // not be spent on the connection's event loop, which other
        // exports' clients share.
        if io.write && self.bs() > INLINE_BLOCK_MAX {
            return io.decline();
        }
        let r = if io.write {
            // SAFETY: the caller's guarantee: `buf[..len]` is readable and
            // nobody else's until `done`, which runs after this borrow ends.
            let src = unsafe { std::slice::from_raw_parts(io.buf, io.len) };
            match self.write_from(io.offset, src, io.fua, Wait::No) {
                Ok(false) => return io.decline(),
                r => r.map(drop),
            }
        } else {
            // SAFETY: as above, and writable.
            let buf = unsafe { std::slice::from_raw_parts_mut(io.buf, io.len) };
            self.read(io.offset, buf)
        };
        (io.done)(Some(r))
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        crate::core::fault::inject("thin.io");
        self.core.hard_failure()?;
        let bs = self.bs();
        let dd = self.core.data();
        let mut done = 0usize;
        for (vb, within, n) in pieces(bs, offset, buf.len() as u64) {
            let part = &mut buf[done..done + n as usize];
            let m = {
                let md = self.core.md_read();
                let m = md.lookup(self.id, vb).map_err(|e| self.core.fail(e))?;
                m.map(|(db, _)| (db, self.core.pin(db)))
            };
            match m {
                Some((db, _pin)) => dd.read(db * bs + within, part)?,
                None => self.read_unmapped(vb * bs + within, part)?,
            }
            done += n as usize;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.write_from(offset, data.as_slice(), fua, Wait::Yes)
            .map(drop)
    }

    fn flush(&self) -> DevResult<()> {
        self.core.commit()
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.core.features().ignore_discard {
            return Ok(());
        }
        self.core.check_writable()?;
        let bs = self.bs();
        let mut md = self.core.md();
        let mut freed = Vec::new();
        for (vb, within, n) in pieces(bs, offset, len) {
            if within == 0 && n == bs {
                freed.extend(self.unmap(&mut md, vb)?);
            }
        }
        self.core.pass_down(&mut freed)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.core.check_writable()?;
        let bs = self.bs();
        let zeros = vec![0u8; bs as usize];
        for (vb, within, n) in pieces(bs, offset, len) {
            if self.origin.is_none() {
                if within == 0 && n == bs {
                    let mut md = self.core.md();
                    let mut freed: Vec<u64> = self.unmap(&mut md, vb)?.into_iter().collect();
                    self.core.pass_down(&mut freed)?;
                    continue;
                }
                // An unmapped block already reads as zeros: nothing to
                // provision (mkfs zeroes ranges it then writes).
                let m = self
                    .core
                    .md_read()
                    .lookup(self.id, vb)
                    .map_err(|e| self.core.fail(e))?;
                if m.is_none() {
                    continue;
                }
            }
            self.write_piece(vb, within, &zeros[..n as usize], Wait::Yes)?;
        }
        if fua {
            self.core.commit()?;
        }
        Ok(())
    }
}

impl Target for Thin {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }

    fn table_params(&self, _show_keys: bool) -> String {
        let esc = crate::core::table::escape_arg;
        let mut s = format!("{} {}", esc(&self.pool_name), self.id);
        if let Some((n, _)) = &self.origin {
            s.push(' ');
            s.push_str(&esc(n));
        }
        s
    }

    /// The kernel's `<nr mapped sectors> <highest mapped sector>`.
    fn status(&self) -> String {
        if self.core.hard_failure().is_err() {
            return "Fail".into();
        }
        let spb = self.bs() / 512;
        let md = self.core.md_read();
        let Some(d) = md.devs.get(&self.id).copied() else {
            return "Fail".into();
        };
        match md.highest(self.id) {
            // Saturating: both numbers come from the metadata.
            Ok(Some(h)) => format!(
                "{} {}",
                d.mapped.saturating_mul(spb),
                h.saturating_add(1).saturating_mul(spb) - 1
            ),
            Ok(None) => format!("{} -", d.mapped.saturating_mul(spb)),
            // The kernel's word for a thin device whose pool has failed.
            Err(e) => {
                drop(md);
                self.core.fail(e);
                "Fail".into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    /// A data device that counts what reaches it and says whether its
    /// write-zeroes is cheap.
    struct Counting {
        inner: MemStore,
        cheap_zeroes: bool,
        written: AtomicU64,
        zeroes: Mutex<Vec<(u64, u64)>>,
    }

    impl BlockDevice for Counting {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn limits(&self) -> Limits {
            Limits {
                write_zeroes: self.cheap_zeroes,
                ..self.inner.limits()
            }
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
            self.written.fetch_add(data.len() as u64, Ordering::SeqCst);
            self.inner.write(offset, data, fua)
        }
        fn flush(&self) -> DevResult<()> {
            self.inner.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
            self.zeroes.lock().unwrap().push((offset, len));
            self.inner.write_zeroes(offset, len, fua)
        }
    }

    const BS: u64 = 65536;

    /// A thin device 0 of a new pool over `data`, whose blocks all hold
    /// stale bytes (0xee), as after an earlier device's use.
    fn thin(name: &str, data: Arc<Counting>, skip_zeroing: bool) -> Thin {
        thin_bs(name, data, skip_zeroing, BS)
    }

    fn thin_bs(name: &str, data: Arc<Counting>, skip_zeroing: bool, bs: u64) -> Thin {
        let stale = vec![0xee; data.size() as usize];
        data.inner
            .write(0, WriteBuf::Borrowed(&stale), false)
            .unwrap();
        let meta: Arc<dyn BlockDevice> = Arc::new(MemStore::new(1 << 20));
        let f = super::super::pool::Features {
            skip_block_zeroing: skip_zeroing,
            ..Default::default()
        };
        let blocks = data.size() / bs;
        let core = super::super::pool::bind(name, meta, data, bs, blocks, f).unwrap();
        core.md().create_thin(0).unwrap();
        core.set_open(0, true);
        Thin {
            core,
            pool_name: name.into(),
            id: 0,
            origin: None,
            len: 64 * bs,
        }
    }

    fn counting(cheap_zeroes: bool) -> Arc<Counting> {
        Arc::new(Counting {
            inner: MemStore::new(8 * BS),
            cheap_zeroes,
            written: AtomicU64::new(0),
            zeroes: Mutex::new(Vec::new()),
        })
    }

    /// A 4 KiB write into a new block: the block reads zeros around it
    /// although the data device held other bytes there, and only the 4 KiB
    /// are written as data: the rest is zeroed by write-zeroes, whole
    /// where that is cheap, around the data elsewhere.
    #[test]
    fn a_partial_write_to_a_new_block_zeroes_the_rest_without_writing_it() {
        for cheap in [true, false] {
            let data = counting(cheap);
            let t = thin(&format!("zero-rest-{cheap}"), data.clone(), false);
            let at = 3 * BS + 8192;
            t.write(at, WriteBuf::Borrowed(&[7u8; 4096]), false)
                .unwrap();
            let mut blk = vec![1u8; BS as usize];
            t.read(3 * BS, &mut blk).unwrap();
            assert!(blk[..8192].iter().all(|&b| b == 0), "cheap {cheap}");
            assert!(blk[8192..12288].iter().all(|&b| b == 7), "cheap {cheap}");
            assert!(blk[12288..].iter().all(|&b| b == 0), "cheap {cheap}");
            assert_eq!(data.written.load(Ordering::SeqCst), 4096, "cheap {cheap}");
            let z = data.zeroes.lock().unwrap().clone();
            let nb = t.core.md_read().lookup(0, 3).unwrap().unwrap().0;
            let want = if cheap {
                vec![(nb * BS, BS)]
            } else {
                vec![(nb * BS, 8192), (nb * BS + 12288, BS - 12288)]
            };
            assert_eq!(z, want, "cheap {cheap}");
            // A whole-block write zeroes nothing.
            t.write(5 * BS, WriteBuf::Borrowed(&[9u8; BS as usize]), false)
                .unwrap();
            assert_eq!(data.zeroes.lock().unwrap().len(), want.len());
        }
    }

    /// Submit `len` bytes at `offset` (a write of `fill`, or a read); what
    /// `done` got (`None`: declined), and the buffer.
    fn submitted(t: &Thin, write: bool, offset: u64, fill: u8) -> (Option<bool>, Vec<u8>) {
        let mut buf = vec![fill; 4096];
        let r = crate::core::device::submit_and_wait(t, write, offset, &mut buf, None);
        (r.map(|r| r.is_ok()), buf)
    }

    /// Through `submit`, a write that finds the pool full is declined at
    /// once (the engine then runs it on a worker of the device's own, where
    /// it may wait) and changes nothing; a write with space and a read
    /// complete right there.
    #[test]
    fn a_submitted_write_to_a_full_pool_is_declined_not_waited_for() {
        let data = counting(true);
        let t = thin("submit-full", data.clone(), false);
        assert!(t.can_submit() && t.limits().queue_depth > 0);
        assert_eq!(submitted(&t, true, 2 * BS, 5).0, Some(true));
        for vb in (0..8).filter(|&vb| vb != 2) {
            t.write(vb * BS, WriteBuf::Borrowed(&[1u8; 4096]), false)
                .unwrap();
        }
        let t0 = Instant::now();
        assert_eq!(submitted(&t, true, 9 * BS, 3).0, None, "declined");
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
        assert!(t.core.md_read().lookup(0, 9).unwrap().is_none());
        // Mapped blocks still take writes and reads that way.
        assert_eq!(submitted(&t, true, 2 * BS + 4096, 6).0, Some(true));
        let (r, back) = submitted(&t, false, 2 * BS, 0);
        assert_eq!(r, Some(true));
        assert!(back.iter().all(|&b| b == 5));
    }

    /// A write to a pool of large blocks may copy or zero a whole block (up
    /// to 1 GiB: a 4 KiB write that broke sharing held an event loop for
    /// 4.6 s): it is declined, so it runs on a worker of the device's own;
    /// reads still complete on the submitting thread.
    #[test]
    fn a_submitted_write_to_large_blocks_is_declined() {
        let t = thin_bs("submit-big", counting(true), false, 2 * BS);
        assert_eq!(submitted(&t, true, 2 * BS, 5).0, None, "declined");
        assert!(t.core.md_read().lookup(0, 1).unwrap().is_none());
        assert_eq!(submitted(&t, false, 0, 0).0, Some(true));
        let small = thin("submit-small", counting(true), false);
        assert_eq!(submitted(&small, true, 2 * BS, 5).0, Some(true));
    }

    /// `skip_block_zeroing`: only the data is written, as the kernel does
    /// (the rest of the block keeps whatever the data device held).
    #[test]
    fn skip_block_zeroing_writes_only_the_data() {
        let data = counting(true);
        let t = thin("zero-skip", data.clone(), true);
        t.write(2 * BS, WriteBuf::Borrowed(&[7u8; 4096]), false)
            .unwrap();
        assert_eq!(data.written.load(Ordering::SeqCst), 4096);
        assert!(data.zeroes.lock().unwrap().is_empty());
        let mut b = vec![0u8; 4096];
        t.read(2 * BS, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }
}
