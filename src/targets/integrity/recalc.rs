//! Tags recomputed from the data on the device: the regions a dirty
//! bitmap names after a crash ([`super::bitmap`]), and `recalculate`, as
//! the kernel's: the superblock says `RECALCULATING` and how far the tags
//! are known good (`recalc_sector`); a background thread recomputes them
//! from there a chunk at a time, each chunk's tags durable before the
//! superblock moves past it, so a restart goes on where it stopped. Reads
//! beyond the position are not checked (their tags are not yet right).
//! The kernel leaves the flag set once it reaches the end, with
//! `recalc_sector` at the provided sectors; so does udm.
//!
//! The job runs from `resume` to `postsuspend`, never beside another
//! instance's: a tag block is rewritten whole, so two jobs over one device
//! (a reloaded table and the live one) undo each other's tags.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use super::superblock::flags;
use super::{io, Integrity};
use crate::core::DevResult;
use crate::targets::TargetError;

/// Sectors read and re-tagged at a time (also the background step).
const CHUNK_SECTORS: u64 = 2048;

/// A running recalculation: its stop flag and its thread.
pub(super) struct Job {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Integrity {
    /// Recomputes the tags of logical sectors `[s, end)` (whole blocks)
    /// from the data in place, area by area.
    pub(super) fn recompute_tags(&self, mut s: u64, end: u64) -> DevResult<()> {
        let g = &self.g;
        let ts = g.tag_size as usize;
        let mut data = Vec::new();
        let mut tags = Vec::new();
        while s < end {
            let n = g.left_in_area(s).min(end - s).min(CHUNK_SECTORS);
            data.resize((n * 512) as usize, 0);
            tags.resize((n >> g.log2_spb) as usize * ts, 0);
            self.dev.read(g.data_sector(s) * 512, &mut data)?;
            self.compute_tags(s, &data, &mut tags);
            io::write_bytes(&*self.meta, g.tag_byte(s), &tags)?;
            s += n;
        }
        Ok(())
    }

    /// Where reads stop being checked: `recalc_sector` while
    /// recalculating, else past the end.
    pub(super) fn checked_below(&self) -> u64 {
        self.recalc_at.load(Ordering::Acquire)
    }

    /// The kernel's `dm_integrity_disable_recalculate`: recomputing keyed
    /// tags would let whoever can write the data forge them, so it needs
    /// `legacy_recalculate` (with `fix_hmac`, a journal MAC keeps it safe).
    pub(super) fn recalc_refused(&self) -> bool {
        if self.p.opts.legacy_recalculate {
            return false;
        }
        let keyed = self
            .p
            .opts
            .internal_hash
            .as_ref()
            .is_some_and(|h| h.key.is_some());
        let mac_keyed = self
            .p
            .opts
            .journal_mac
            .as_ref()
            .is_some_and(|h| h.key.is_some());
        if self.sb.has(flags::FIXED_HMAC) {
            keyed && !mac_keyed
        } else {
            keyed || mac_keyed
        }
    }

    /// Whether the superblock will ask for a recalculation once the
    /// line's options are applied; refused for keyed tags unless allowed.
    pub(super) fn check_recalc(&self) -> Result<(), TargetError> {
        let o = &self.p.opts;
        let pending = self.sb.has(flags::RECALCULATING)
            && self.sb.recalc_sector < self.g.provided_data_sectors;
        if (pending || o.recalculate || o.reset_recalculate) && self.recalc_refused() {
            return Err(TargetError::line(
                "recalculating keyed (HMAC) tags is disabled for security reasons: add \
                 legacy_recalculate if you really need it",
            ));
        }
        Ok(())
    }

    /// The line's `recalculate`/`reset_recalculate` applied to the
    /// superblock as the kernel applies them at open (a position past the
    /// end is pulled back to it), and the read check limit set.
    pub(super) fn apply_recalc_options(&self) -> DevResult<()> {
        let mut st = self.lock();
        let mut sb = st.sb.clone();
        let o = &self.p.opts;
        let end = self.g.provided_data_sectors;
        if o.reset_recalculate || (o.recalculate && !sb.has(flags::RECALCULATING)) {
            sb.flags |= flags::RECALCULATING;
            sb.recalc_sector = 0;
        }
        if sb.has(flags::RECALCULATING) && sb.recalc_sector > end {
            sb.recalc_sector = end;
        }
        if sb != st.sb {
            self.write_live_superblock(&mut sb)?;
        }
        let limit = if sb.has(flags::RECALCULATING) && sb.recalc_sector < end {
            sb.recalc_sector
        } else {
            u64::MAX
        };
        self.recalc_at.store(limit, Ordering::Release);
        st.sb = sb;
        Ok(())
    }

    /// One background step: the next chunk's tags, durable, then the
    /// superblock's position. `false` once the end is reached.
    fn recalc_step(&self) -> DevResult<bool> {
        // Lock order: the lifecycle before the state. A step never starts
        // the instance: the job runs only between resume and postsuspend.
        let run = self.run_read();
        if !matches!(run.phase, super::Phase::Running) {
            return Ok(false);
        }
        let mut st = self.lock();
        let end = self.g.provided_data_sectors;
        let pos = st.sb.recalc_sector;
        if !st.sb.has(flags::RECALCULATING) || pos >= end {
            return Ok(false);
        }
        let mut next = (pos + CHUNK_SECTORS).min(end);
        // A dirty bitmap's recovery recomputes its regions only: a clean
        // stretch is passed over in one step.
        let skip = match &st.recover {
            Some(set) => match set.iter().find(|&&(_, e)| e > pos) {
                Some(&(s, _)) if s > pos => {
                    next = s.min(end);
                    true
                }
                Some(&(_, e)) => {
                    next = next.min(e);
                    false
                }
                None => {
                    next = end;
                    true
                }
            },
            None => false,
        };
        if !skip {
            // In J mode the writer thread does not place entries meanwhile:
            // its read-modify-write of a tag block would undo these tags.
            self.around_journal(&run, false, || self.recompute_tags(pos, next))?;
            self.meta.flush()?;
        }
        let mut sb = st.sb.clone();
        sb.recalc_sector = next;
        self.write_live_superblock(&mut sb)?;
        st.sb = sb;
        if next >= end {
            st.recover = None;
        }
        self.recalc_at
            .store(if next >= end { u64::MAX } else { next }, Ordering::Release);
        Ok(next < end)
    }

    /// Starts the background recalculation when the superblock asks for
    /// one and none runs; it stops at the end, on an error, at
    /// [`Integrity::stop_recalc`], or when the target goes.
    pub(super) fn start_recalc(this: &Arc<Integrity>) {
        if this.checked_below() == u64::MAX {
            return;
        }
        let mut job = this.recalc_job.lock().unwrap_or_else(|e| e.into_inner());
        if job.as_ref().is_some_and(|j| !j.thread.is_finished()) {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let weak: Weak<Integrity> = Arc::downgrade(this);
        let name = format!("integrity-recalc {}", this.p.dev);
        let halt = stop.clone();
        let spawned = this.options.spawn_job(name, move || loop {
            if halt.load(Ordering::Acquire) {
                return;
            }
            let Some(t) = weak.upgrade() else { return };
            match t.recalc_step() {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::error!(
                        "integrity {}: recalculation stopped at an I/O error ({e}); it goes on \
                         at the next open",
                        t.p.dev
                    );
                    return;
                }
            }
        });
        match spawned {
            Ok(thread) => *job = Some(Job { stop, thread }),
            Err(e) => tracing::error!(
                "integrity {}: cannot start the recalculation ({e}); it goes on at the next open",
                this.p.dev
            ),
        }
    }

    /// Stops the recalculation and waits for its step in progress: after
    /// this no tag is written by it (dm's `postsuspend`). It goes on from
    /// the superblock's position at the next `resume`.
    pub(super) fn stop_recalc(&self) {
        let job = self
            .recalc_job
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(j) = job {
            j.stop.store(true, Ordering::Release);
            if j.thread.thread().id() != std::thread::current().id() {
                let _ = j.thread.join();
            }
        }
    }

    /// The target is going: the job, which holds no reference between
    /// steps, ends at its next one.
    pub(super) fn end_recalc(&mut self) {
        let job = self
            .recalc_job
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(j) = job {
            j.stop.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::core::{BlockDevice, WriteBuf};
    use crate::store::MemStore;
    use crate::targets::integrity::superblock::{flags, Superblock};
    use crate::targets::integrity::tests::{geometry, load, open, DEV};
    use crate::targets::{DeviceResolver, TargetArgs, TargetOptions};

    fn sb(m: &MemStore) -> Superblock {
        let mut b = vec![0u8; 512];
        m.read(0, &mut b).unwrap();
        Superblock::parse(&b).unwrap().unwrap()
    }

    /// Data straight onto the data area, its tags left wrong.
    fn raw_data(m: &MemStore, s: u64, byte: u8) {
        let at = geometry(m).data_sector(s) * 512;
        m.write(at, WriteBuf::Borrowed(&[byte; 4096]), false)
            .unwrap();
    }

    fn wait_done(m: &MemStore) -> Superblock {
        let t0 = Instant::now();
        loop {
            let s = sb(m);
            if s.recalc_sector >= geometry(m).provided_data_sectors {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "{s:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn recalculate_runs_to_the_end_and_reads_then_check() {
        let m = Arc::new(MemStore::new(DEV));
        let d = "d 0 4 D 2 fix_padding internal_hash:crc32c";
        drop(open(&m, d, 1 << 20).unwrap());
        raw_data(&m, 8, 0x5c);
        let t = open(&m, d, 1 << 20).unwrap();
        let mut b = [0u8; 4096];
        assert!(t.read(8 * 512, &mut b).is_err(), "tags not yet computed");
        drop(t);
        let r = "d 0 4 D 3 recalculate fix_padding internal_hash:crc32c";
        let t = open(&m, r, 1 << 20).unwrap();
        let s = wait_done(&m);
        assert!(s.has(flags::RECALCULATING) && s.version >= 2, "{s:?}");
        t.read(8 * 512, &mut b).unwrap();
        assert_eq!(b, [0x5c; 4096]);
        let p = geometry(&m).provided_data_sectors;
        assert_eq!(t.status(), format!("0 {p} {p}"));
        // Checked again: a flipped byte fails.
        drop(t);
        raw_data(&m, 16, 0x11);
        let t = open(&m, d, 1 << 20).unwrap();
        assert!(t.read(16 * 512, &mut b).is_err());
    }

    /// A store whose writes take five milliseconds and whose tag reads
    /// from the test's own thread return twenty later: the background job
    /// moves on between a read and its check.
    struct SlowReads {
        inner: Arc<MemStore>,
        reader: std::thread::ThreadId,
    }

    impl BlockDevice for SlowReads {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn limits(&self) -> crate::core::Limits {
            self.inner.limits()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> crate::core::DevResult<()> {
            let r = self.inner.read(offset, buf);
            if std::thread::current().id() == self.reader && buf.len() < 4096 {
                std::thread::sleep(Duration::from_millis(20));
            }
            r
        }
        fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> crate::core::DevResult<()> {
            std::thread::sleep(Duration::from_millis(5));
            self.inner.write(offset, data, fua)
        }
        fn flush(&self) -> crate::core::DevResult<()> {
            self.inner.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> crate::core::DevResult<()> {
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> crate::core::DevResult<()> {
            self.inner.write_zeroes(offset, len, fua)
        }
    }

    struct Slow(Arc<SlowReads>);

    impl DeviceResolver for Slow {
        fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
            Ok(self.0.clone())
        }
    }

    /// Every data block of a formatted device rewritten behind its tags'
    /// back; the length of the device.
    fn stale_everywhere(m: &MemStore) -> u64 {
        let len = geometry(m).provided_data_sectors / 8 * 4096;
        for s in (0..len / 512).step_by(8) {
            raw_data(m, s, 0x5a);
        }
        len
    }

    const PLAIN: &str = "d 0 4 D 2 fix_padding internal_hash:crc32c";
    const RECALC: &str = "d 0 4 D 3 recalculate fix_padding internal_hash:crc32c";

    /// A read racing the background job: tags read before the job moved
    /// past them are not checked as if they were recomputed (a resize's
    /// `dd` over a grown device failed this way, under load).
    #[test]
    fn a_read_racing_the_recalculation_never_checks_stale_tags() {
        let m = Arc::new(MemStore::new(DEV));
        drop(open(&m, PLAIN, 1 << 20).unwrap());
        let len = stale_everywhere(&m);
        let slow = Arc::new(SlowReads {
            inner: m.clone(),
            reader: std::thread::current().id(),
        });
        let args: Vec<String> = RECALC.split_whitespace().map(Into::into).collect();
        let t = crate::targets::integrity::new(TargetArgs {
            args: &args,
            len,
            resolver: &mut Slow(slow),
            options: &TargetOptions::default(),
        })
        .map_err(|e| e.msg)
        .unwrap();
        t.resume();
        let mut b = vec![0u8; 64 << 10];
        let mut reads = 0;
        loop {
            // Past the chunk the job may be on: tags not yet recomputed.
            let at = (sb(&m).recalc_sector + super::CHUNK_SECTORS) * 512;
            if at + b.len() as u64 > len {
                break;
            }
            if let Err(e) = t.read(at, &mut b) {
                panic!("read at {at} (read {reads}): {e}");
            }
            reads += 1;
        }
        assert!(reads > 0, "the job ended before any read");
    }

    /// A loaded table beside the live one recomputes nothing until it is
    /// resumed, and a suspended one stops: two jobs rewriting the same tag
    /// blocks undo each other's tags (a resize under load failed so).
    #[test]
    fn only_a_resumed_table_recalculates_and_postsuspend_stops_it() {
        let m = Arc::new(MemStore::new(DEV));
        drop(open(&m, PLAIN, 1 << 20).unwrap());
        let len = stale_everywhere(&m);
        let loaded = load(&m, RECALC, len).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            sb(&m).recalc_sector,
            0,
            "a loaded table does not recalculate"
        );
        loaded.resume();
        loaded.postsuspend();
        let at = sb(&m).recalc_sector;
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(sb(&m).recalc_sector, at, "nothing after postsuspend");
        loaded.resume();
        let s = wait_done(&m);
        assert!(s.recalc_sector >= len / 512, "{s:?}");
        let mut b = [0u8; 4096];
        loaded.read(len - 4096, &mut b).unwrap();
        assert_eq!(b, [0x5a; 4096]);
    }

    #[test]
    fn recalculation_goes_on_from_the_superblocks_position() {
        let m = Arc::new(MemStore::new(DEV));
        let d = "d 0 4 D 2 fix_padding internal_hash:crc32c";
        drop(open(&m, d, 4 << 20).unwrap());
        raw_data(&m, 0, 0x21);
        raw_data(&m, 4096, 0x22);
        // As a crash would leave it: recalculating, sector 0 not yet done
        // but the superblock already past it.
        let mut s = sb(&m);
        s.flags |= flags::RECALCULATING;
        s.recalc_sector = 2048;
        s.set_version(false);
        m.write(0, WriteBuf::Borrowed(&s.encode()), false).unwrap();
        let t = open(&m, d, 4 << 20).unwrap();
        wait_done(&m);
        let mut b = [0u8; 4096];
        t.read(4096 * 512, &mut b).unwrap();
        assert_eq!(b, [0x22; 4096]);
        assert!(
            t.read(0, &mut b).is_err(),
            "before the position: not redone"
        );
        drop(t);
        let reset = "d 0 4 D 3 reset_recalculate fix_padding internal_hash:crc32c";
        let t = open(&m, reset, 4 << 20).unwrap();
        wait_done(&m);
        t.read(0, &mut b).unwrap();
        assert_eq!(b, [0x21; 4096]);
    }

    #[test]
    fn keyed_tags_need_legacy_recalculate() {
        let m = Arc::new(MemStore::new(DEV));
        let l = "d 0 32 D 2 recalculate internal_hash:hmac(sha256):0102";
        let e = open(&m, l, 1 << 20).err().unwrap();
        assert!(e.contains("legacy_recalculate"), "{e}");
        let ok = "d 0 32 D 3 recalculate legacy_recalculate internal_hash:hmac(sha256):0102";
        assert!(open(&m, ok, 1 << 20).is_ok());
    }
}
