//! `log-writes <dev> <log dev>`: dm-log-writes. Every request passes to
//! `<dev>` unchanged, and every write, FUA write, flush and discard is also
//! recorded on `<log dev>`, in dm-log-writes' on-disk format byte for
//! byte, so the log can be replayed to any point (`udm replay-log`, or the
//! kernel tree's `replay-log`) and the filesystem checked there — the way
//! crash consistency is tested: a power cut keeps what was flushed, so
//! every flush point must be a consistent filesystem.
//!
//! Order, as in the kernel: a plain write (or discard) is logged only at
//! the next flush, after the flush completed, in the order the writes
//! completed (what a cache would have made durable); a FUA write is logged
//! as soon as it completes; a `mark` message is logged at once. The log's
//! superblock (`nr_entries`) is rewritten after every FUA write and mark,
//! and when the device goes away (after a final mark
//! `dm-log-writes-end`, which also logs the writes no flush covered).
//!
//! Format (little-endian): sector 0 holds `log_write_super { magic
//! 0x6a736677736872, version 1, nr_entries, sectorsize }`; from byte
//! `sectorsize` on, each entry is one `sectorsize` block holding
//! `log_write_entry { sector, nr_sectors, flags, data_len }` (sector and
//! nr_sectors in `sectorsize` units of `<dev>`; a mark's text right after
//! the 32 bytes), followed by the written data unless it is a discard.
//! `sectorsize` is `<dev>`'s logical block size. The distribution ships
//! no `replay-log` (xfstests is not packaged), so the format is
//! cross-checked by an independent reader written from the kernel's
//! structs (`tests/faults/replay_log.py`), which must replay a log to the
//! same bytes as [`super::log_replay`].
//!
//! Status: `<#logged entries> <highest allocated sector>` (512-byte sectors
//! of the log device), plus `logging_disabled` once logging stopped (log
//! device full, a log write failed, or more than [`MAX_UNFLUSHED`] bytes of
//! writes waited for a flush); `<dev>` keeps working either way. As in the
//! kernel, the target is meant as the only segment of its table (sector
//! numbers in the log are the segment's).

use std::sync::{Arc, Mutex, MutexGuard};

use super::{Area, Target, TargetArgs, TargetError};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

pub const LOG_FLUSH_FLAG: u64 = 1 << 0;
pub const LOG_FUA_FLAG: u64 = 1 << 1;
pub const LOG_DISCARD_FLAG: u64 = 1 << 2;
pub const LOG_MARK_FLAG: u64 = 1 << 3;
pub const LOG_METADATA_FLAG: u64 = 1 << 4;

pub const WRITE_LOG_VERSION: u64 = 1;
pub const WRITE_LOG_MAGIC: u64 = 0x006a_7366_7773_6872;
/// Bytes of `log_write_entry` (and the start of a mark's text).
pub const ENTRY_LEN: usize = 32;
/// Bytes of `log_write_super` that carry information.
pub const SUPER_LEN: usize = 28;
/// The mark the kernel logs when the target goes away.
pub const END_MARK: &str = "dm-log-writes-end";

/// Writes waiting for a flush are copies held in memory (the kernel holds
/// pages too); past this many bytes logging stops rather than grow.
pub const MAX_UNFLUSHED: u64 = 512 << 20;

/// `log_write_super` as bytes of one `sectorsize` block.
pub fn encode_super(nr_entries: u64, sectorsize: u32) -> Vec<u8> {
    let mut b = vec![0u8; sectorsize as usize];
    b[0..8].copy_from_slice(&WRITE_LOG_MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&WRITE_LOG_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&nr_entries.to_le_bytes());
    b[24..28].copy_from_slice(&sectorsize.to_le_bytes());
    b
}

/// `log_write_entry` as its 32 bytes.
pub fn encode_entry(sector: u64, nr_sectors: u64, flags: u64, data_len: u64) -> [u8; ENTRY_LEN] {
    let mut b = [0u8; ENTRY_LEN];
    b[0..8].copy_from_slice(&sector.to_le_bytes());
    b[8..16].copy_from_slice(&nr_sectors.to_le_bytes());
    b[16..24].copy_from_slice(&flags.to_le_bytes());
    b[24..32].copy_from_slice(&data_len.to_le_bytes());
    b
}

/// One entry on its way to the log: its header fields and a buffer laid
/// out as it will be on the log device (header block, then data), so
/// logging it is one write.
struct Pending {
    flags: u64,
    sector: u64,
    nr_sectors: u64,
    /// Mark text length (only marks carry data in the header block).
    data_len: u64,
    buf: Vec<u8>,
}

struct State {
    enabled: bool,
    /// Next free 512-byte sector of the log device.
    next_sector: u64,
    end_sector: u64,
    logged_entries: u64,
    unflushed: Vec<Pending>,
    unflushed_bytes: u64,
}

pub struct LogWrites {
    dev: Area,
    log: Area,
    len: u64,
    sectorsize: u32,
    state: Mutex<State>,
}

/// The `log-writes` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "log-writes",
    version: [1, 1, 0],
    new,
    args: &["device", "log device"],
    more_args: None,
};

pub fn new(a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    if a.args.len() != 2 {
        return Err(TargetError::line(format!(
            "Invalid argument count: expected '<device> <log device>', got {} arguments",
            a.args.len()
        )));
    }
    let dev_name = a.args[0].clone();
    let log_name = a.args[1].clone();
    let dev = a
        .resolver
        .resolve(&dev_name)
        .map_err(|e| TargetError::at(0, format!("Device lookup failed: {e}")))?;
    if dev.size() < a.len {
        return Err(TargetError::at(
            0,
            format!(
                "{dev_name} has {} sectors, fewer than the segment's {}",
                dev.size() / 512,
                a.len / 512
            ),
        ));
    }
    let log = a
        .resolver
        .resolve(&log_name)
        .map_err(|e| TargetError::at(1, format!("Log device lookup failed: {e}")))?;
    let sectorsize = dev.limits().logical_block_size.max(512);
    if log.size() < 2 * u64::from(sectorsize) {
        return Err(TargetError::at(
            1,
            format!("log device {log_name} is too small for a superblock and one entry"),
        ));
    }
    let end_sector = log.size() / 512;
    Ok(Arc::new(LogWrites {
        dev: Area {
            dev,
            name: dev_name,
            offset: 0,
            given: 0,
        },
        log: Area {
            dev: log,
            name: log_name,
            offset: 0,
            given: 0,
        },
        len: a.len,
        sectorsize,
        state: Mutex::new(State {
            enabled: true,
            next_sector: u64::from(sectorsize) / 512,
            end_sector,
            logged_entries: 0,
            unflushed: Vec::new(),
            unflushed_bytes: 0,
        }),
    }))
}

impl LogWrites {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enabled(&self) -> bool {
        self.lock().enabled
    }

    /// An entry for `[offset, +len)` with `flags`, carrying `data` (a
    /// write's bytes, copied now: the caller may reuse its buffer).
    fn pending(&self, flags: u64, offset: u64, len: u64, data: Option<&[u8]>) -> Pending {
        let ss = u64::from(self.sectorsize);
        let head = self.sectorsize as usize;
        let mut buf = vec![0u8; head + data.map_or(0, |d| d.len())];
        if let Some(d) = data {
            buf[head..].copy_from_slice(d);
        }
        Pending {
            flags,
            sector: offset / ss,
            nr_sectors: len / ss,
            data_len: 0,
            buf,
        }
    }

    fn disable(&self, st: &mut State, why: &str) {
        if st.enabled {
            tracing::error!(
                "log-writes on {} (log {}): {why}; logging stops, the device keeps working",
                self.dev.name,
                self.log.name
            );
        }
        st.enabled = false;
        st.unflushed.clear();
        st.unflushed_bytes = 0;
    }

    /// Write one entry at the log's next free place (and the superblock
    /// after a FUA write or a mark), as the kernel's logging thread does.
    fn log_one(&self, st: &mut State, mut p: Pending) {
        if !st.enabled {
            return;
        }
        let ss = u64::from(self.sectorsize);
        let sector = st.next_sector;
        let mut blocks = 1;
        if p.flags & LOG_DISCARD_FLAG == 0 {
            blocks += p.nr_sectors;
        }
        st.next_sector += blocks * (ss / 512);
        if st.next_sector >= st.end_sector {
            self.disable(st, "Ran out of space on the logdev");
            return;
        }
        st.logged_entries += 1;
        p.buf[..ENTRY_LEN].copy_from_slice(&encode_entry(
            p.sector,
            p.nr_sectors,
            p.flags,
            p.data_len,
        ));
        if let Err(e) = self
            .log
            .dev
            .write(sector * 512, WriteBuf::Owned(&mut p.buf), false)
        {
            self.disable(st, &format!("Error writing log block: {e}"));
            return;
        }
        if p.flags & (LOG_FUA_FLAG | LOG_MARK_FLAG) != 0 {
            self.log_super(st);
        }
    }

    fn log_super(&self, st: &mut State) {
        let mut b = encode_super(st.logged_entries, self.sectorsize);
        if let Err(e) = self.log.dev.write(0, WriteBuf::Owned(&mut b), false) {
            self.disable(st, &format!("Couldn't write super: {e}"));
        }
    }

    /// A completed write (or discard): logged now if FUA, else at the next
    /// flush.
    fn completed(&self, p: Pending) {
        let mut st = self.lock();
        if !st.enabled {
            return;
        }
        if p.flags & LOG_FUA_FLAG != 0 {
            self.log_one(&mut st, p);
            return;
        }
        st.unflushed_bytes += p.buf.len() as u64;
        st.unflushed.push(p);
        if st.unflushed_bytes > MAX_UNFLUSHED {
            self.disable(
                &mut st,
                &format!("more than {MAX_UNFLUSHED} bytes of writes are waiting for a flush"),
            );
        }
    }

    /// Log a mark (the `mark` message); its text is cut to what fits in
    /// the entry block, as the kernel does.
    pub fn mark(&self, text: &str) -> Result<(), String> {
        let mut st = self.lock();
        if !st.enabled {
            return Err("logging is disabled (see the log); the mark was not recorded".into());
        }
        let max = self.sectorsize as usize - ENTRY_LEN - 1;
        let bytes = text.as_bytes();
        let bytes = &bytes[..bytes.len().min(max)];
        let mut p = self.pending(LOG_MARK_FLAG, 0, 0, None);
        p.data_len = bytes.len() as u64;
        p.buf[ENTRY_LEN..ENTRY_LEN + bytes.len()].copy_from_slice(bytes);
        self.log_one(&mut st, p);
        if st.enabled {
            Ok(())
        } else {
            Err("logging stopped while writing the mark (see the log)".into())
        }
    }

    pub fn sectorsize(&self) -> u32 {
        self.sectorsize
    }
}

impl Drop for LogWrites {
    /// As the kernel's destructor: the writes no flush covered are logged,
    /// then the end mark (which also rewrites the superblock).
    fn drop(&mut self) {
        let mut st = self.lock();
        let batch = std::mem::take(&mut st.unflushed);
        for p in batch {
            self.log_one(&mut st, p);
        }
        drop(st);
        let _ = self.mark(END_MARK);
        let _ = self.log.dev.flush();
    }
}

impl BlockDevice for LogWrites {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        Limits {
            write_zeroes: false,
            ..self.dev.dev.limits()
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.dev.dev.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        if data.is_empty() || !self.enabled() {
            return self.dev.dev.write(offset, data, fua);
        }
        let flags = if fua { LOG_FUA_FLAG } else { 0 };
        let p = self.pending(flags, offset, data.len() as u64, Some(data.as_slice()));
        self.dev.dev.write(offset, data, fua)?;
        self.completed(p);
        Ok(())
    }
    fn flush(&self) -> DevResult<()> {
        let batch = {
            let mut st = self.lock();
            st.unflushed_bytes = 0;
            std::mem::take(&mut st.unflushed)
        };
        if let Err(e) = self.dev.dev.flush() {
            // Not durable: the writes stay waiting for the next flush.
            let mut st = self.lock();
            if st.enabled {
                let mut back = batch;
                back.append(&mut st.unflushed);
                st.unflushed_bytes = back.iter().map(|p| p.buf.len() as u64).sum();
                st.unflushed = back;
            }
            return Err(e);
        }
        let mut st = self.lock();
        for p in batch {
            self.log_one(&mut st, p);
        }
        let f = self.pending(LOG_FLUSH_FLAG, 0, 0, None);
        self.log_one(&mut st, f);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.dev.dev.discard(offset, len)?;
        if self.enabled() {
            self.completed(self.pending(LOG_DISCARD_FLAG, offset, len, None));
        }
        Ok(())
    }
    /// The kernel target has no write-zeroes; the block layer then writes
    /// zero pages, which are logged as an ordinary write. Same here: the
    /// device zeroes its way, the log records zeros.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        if !self.enabled() {
            return self.dev.dev.write_zeroes(offset, len, fua);
        }
        if len > MAX_UNFLUSHED {
            return Err(DevError::Target(format!(
                "log-writes: write zeroes of {len} bytes is larger than what the log holds \
                 in memory ({MAX_UNFLUSHED} bytes); zero in smaller pieces"
            )));
        }
        let zeros = vec![0u8; len as usize];
        let flags = if fua { LOG_FUA_FLAG } else { 0 };
        let p = self.pending(flags, offset, len, Some(&zeros));
        drop(zeros);
        self.dev.dev.write_zeroes(offset, len, fua)?;
        self.completed(p);
        Ok(())
    }
}

impl Target for LogWrites {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        format!("{} {}", self.dev.table_name(), self.log.table_name())
    }
    fn status(&self) -> String {
        let st = self.lock();
        let mut s = format!("{} {}", st.logged_entries, st.next_sector - 1);
        if !st.enabled {
            s.push_str(" logging_disabled");
        }
        s
    }
    fn message(&self, argv: &[String]) -> Result<Option<String>, String> {
        if argv.len() != 2 {
            return Err(format!(
                "Invalid log-writes message arguments, expect 2 arguments ('mark <text>'), got {}",
                argv.len()
            ));
        }
        if !argv[0].eq_ignore_ascii_case("mark") {
            return Err(format!(
                "Unrecognised log writes target message received: {} (the only one is 'mark <text>')",
                argv[0]
            ));
        }
        self.mark(&argv[1])?;
        Ok(None)
    }
}
