//! Reading and replaying a dm-log-writes log (what the kernel tree's
//! `replay-log` does): walk the entries from the superblock on, write each
//! write's data to a device, discard discards, flush flushes, and stop at
//! an entry count or a mark — so a filesystem can be checked as a power
//! cut at that point would have left it.
//!
//! The reader trusts nothing in the log: a bad magic, version, sector
//! size, an entry that would run past the log device or past the target
//! device gives an error naming the entry, never a panic.

use std::sync::Arc;

use super::log_writes::{
    ENTRY_LEN, LOG_DISCARD_FLAG, LOG_FLUSH_FLAG, LOG_FUA_FLAG, LOG_MARK_FLAG, LOG_METADATA_FLAG,
    WRITE_LOG_MAGIC, WRITE_LOG_VERSION,
};
use crate::core::{BlockDevice, WriteBuf};

/// One log entry as read back.
#[derive(Debug, Clone)]
pub struct Entry {
    /// 0-based position in the log.
    pub index: u64,
    /// First block written, in `sectorsize` units of the logged device.
    pub sector: u64,
    pub nr_sectors: u64,
    pub flags: u64,
    /// A mark's text.
    pub mark: Option<String>,
    /// Where the entry's data starts on the log device (bytes).
    pub data_at: u64,
}

impl Entry {
    pub fn is_flush(&self) -> bool {
        self.flags & LOG_FLUSH_FLAG != 0
    }
    pub fn is_fua(&self) -> bool {
        self.flags & LOG_FUA_FLAG != 0
    }
    pub fn is_discard(&self) -> bool {
        self.flags & LOG_DISCARD_FLAG != 0
    }
    pub fn is_mark(&self) -> bool {
        self.flags & LOG_MARK_FLAG != 0
    }

    /// A one-line description, as `replay-log -v` prints entries.
    pub fn describe(&self) -> String {
        let mut kinds = Vec::new();
        if self.is_flush() {
            kinds.push("FLUSH");
        }
        if self.is_fua() {
            kinds.push("FUA");
        }
        if self.is_discard() {
            kinds.push("DISCARD");
        }
        if self.is_mark() {
            kinds.push("MARK");
        }
        if self.flags & LOG_METADATA_FLAG != 0 {
            kinds.push("METADATA");
        }
        if kinds.is_empty() {
            kinds.push("WRITE");
        }
        let mut s = format!(
            "entry {}: {} sector {} len {}",
            self.index,
            kinds.join("|"),
            self.sector,
            self.nr_sectors
        );
        if let Some(m) = &self.mark {
            s.push_str(&format!(" mark '{m}'"));
        }
        s
    }
}

/// A log being read from its start.
pub struct LogReader {
    log: Arc<dyn BlockDevice>,
    pub sectorsize: u32,
    pub nr_entries: u64,
    next: u64,
    /// Byte offset of the next entry on the log device.
    pos: u64,
}

impl LogReader {
    /// Read and check the superblock.
    pub fn open(log: Arc<dyn BlockDevice>) -> Result<LogReader, String> {
        if log.size() < 512 {
            return Err("the log device is smaller than one sector".into());
        }
        let mut b = [0u8; 512];
        log.read(0, &mut b)
            .map_err(|e| format!("cannot read the log superblock: {e}"))?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let magic = u64_at(0);
        if magic != WRITE_LOG_MAGIC {
            return Err(format!(
                "not a dm-log-writes log: magic {magic:#x}, expected {WRITE_LOG_MAGIC:#x}"
            ));
        }
        let version = u64_at(8);
        if version != WRITE_LOG_VERSION {
            return Err(format!(
                "unsupported dm-log-writes version {version} (udm reads version {WRITE_LOG_VERSION})"
            ));
        }
        let nr_entries = u64_at(16);
        let sectorsize = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes"));
        if !(512..=65536).contains(&sectorsize) || !sectorsize.is_power_of_two() {
            return Err(format!(
                "bad sector size {sectorsize} in the log superblock (a power of two, 512 to 65536)"
            ));
        }
        Ok(LogReader {
            log,
            sectorsize,
            nr_entries,
            next: 0,
            pos: u64::from(sectorsize),
        })
    }

    /// The next entry, or `None` after `nr_entries`.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, String> {
        if self.next >= self.nr_entries {
            return Ok(None);
        }
        let ss = u64::from(self.sectorsize);
        let index = self.next;
        if self.pos + ss > self.log.size() {
            return Err(format!(
                "entry {index} would start at byte {} past the end of the log device ({} bytes): \
                 the superblock counts more entries than the log holds",
                self.pos,
                self.log.size()
            ));
        }
        let mut head = vec![0u8; self.sectorsize as usize];
        self.log
            .read(self.pos, &mut head)
            .map_err(|e| format!("cannot read entry {index}: {e}"))?;
        let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let (sector, nr_sectors, flags, data_len) = (u64_at(0), u64_at(8), u64_at(16), u64_at(24));
        let mut mark = None;
        if flags & LOG_MARK_FLAG != 0 {
            let max = self.sectorsize as usize - ENTRY_LEN;
            if data_len > max as u64 {
                return Err(format!(
                    "entry {index}: mark of {data_len} bytes does not fit in a {ss}-byte entry"
                ));
            }
            let text = &head[ENTRY_LEN..ENTRY_LEN + data_len as usize];
            mark = Some(String::from_utf8_lossy(text).into_owned());
        } else if data_len != 0 {
            return Err(format!(
                "entry {index} carries {data_len} bytes of inline metadata, which udm does not \
                 replay (only logs of data writes, flushes, discards and marks)"
            ));
        }
        let data_at = self.pos + ss;
        let data_bytes = if flags & LOG_DISCARD_FLAG != 0 {
            0
        } else {
            nr_sectors.checked_mul(ss).ok_or_else(|| {
                format!("entry {index}: {nr_sectors} sectors is not a possible length")
            })?
        };
        let end = data_at
            .checked_add(data_bytes)
            .filter(|&e| e <= self.log.size());
        let Some(end) = end else {
            return Err(format!(
                "entry {index}: its {nr_sectors} sectors of data run past the end of the log device"
            ));
        };
        self.pos = end;
        self.next += 1;
        Ok(Some(Entry {
            index,
            sector,
            nr_sectors,
            flags,
            mark,
            data_at,
        }))
    }

    /// Apply `e` to `dev`: write its data, discard, or flush.
    pub fn apply(&self, e: &Entry, dev: &dyn BlockDevice) -> Result<(), String> {
        let ss = u64::from(self.sectorsize);
        let at = e.sector.checked_mul(ss);
        let len = e.nr_sectors.checked_mul(ss);
        let range_ok = matches!((at, len), (Some(a), Some(l)) if a.checked_add(l).is_some_and(|end| end <= dev.size()));
        if e.nr_sectors > 0 && !range_ok {
            return Err(format!(
                "{}: beyond the end of the replay device ({} bytes); replay onto a device at \
                 least as large as the logged one",
                e.describe(),
                dev.size()
            ));
        }
        let (at, len) = (at.unwrap_or(0), len.unwrap_or(0));
        if e.is_discard() {
            if len > 0 {
                dev.discard(at, len)
                    .map_err(|err| format!("{}: discard failed: {err}", e.describe()))?;
            }
        } else if len > 0 {
            const CHUNK: u64 = 4 << 20;
            let mut buf = vec![0u8; len.min(CHUNK) as usize];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(CHUNK) as usize;
                let b = &mut buf[..n];
                self.log
                    .read(e.data_at + done, b)
                    .map_err(|err| format!("{}: cannot read its data: {err}", e.describe()))?;
                dev.write(at + done, WriteBuf::Owned(b), false)
                    .map_err(|err| format!("{}: write failed: {err}", e.describe()))?;
                done += n as u64;
            }
        }
        if e.is_flush() || e.is_fua() {
            dev.flush()
                .map_err(|err| format!("{}: flush failed: {err}", e.describe()))?;
        }
        Ok(())
    }
}

/// When a replay stops or pauses.
#[derive(Debug, Clone, Default)]
pub struct ReplayPlan {
    /// Skip (do not apply) entries before this mark.
    pub start_mark: Option<String>,
    /// Skip entries before this index.
    pub start_entry: u64,
    /// Stop after this many entries (counted from the log's start).
    pub limit: Option<u64>,
    /// Stop after the entry with this mark.
    pub end_mark: Option<String>,
    /// Call the checkpoint after every flush (`flush`), FUA write (`fua`)
    /// or every N entries.
    pub check: Option<Check>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Flush,
    Fua,
    Every(u64),
}

impl std::str::FromStr for Check {
    type Err = String;
    fn from_str(s: &str) -> Result<Check, String> {
        match s {
            "flush" => Ok(Check::Flush),
            "fua" => Ok(Check::Fua),
            n => n
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .map(Check::Every)
                .ok_or_else(|| {
                    format!("--check takes flush, fua or a number of entries, got '{s}'")
                }),
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Entries applied to the device.
    pub applied: u64,
    /// Checkpoints reached.
    pub checks: u64,
    /// The entry the replay stopped after, if any was read.
    pub last: Option<u64>,
    /// Whether `end_mark` was found.
    pub found_end_mark: bool,
}

/// Replay `log` onto `dev` following `plan`. `checkpoint(entry)` runs
/// after each check point and after the last entry applied; an error from
/// it stops the replay and is returned.
pub fn replay(
    log: Arc<dyn BlockDevice>,
    dev: &dyn BlockDevice,
    plan: &ReplayPlan,
    checkpoint: &mut dyn FnMut(&Entry) -> Result<(), String>,
) -> Result<ReplayReport, String> {
    let mut r = LogReader::open(log)?;
    let mut rep = ReplayReport::default();
    let mut started = plan.start_mark.is_none();
    let mut last_applied: Option<Entry> = None;
    let mut last_checked = None;
    while let Some(e) = r.next_entry()? {
        if plan.limit.is_some_and(|l| e.index >= l) {
            break;
        }
        rep.last = Some(e.index);
        if !started {
            started = e.mark.as_deref() == plan.start_mark.as_deref();
            if !started {
                continue;
            }
        }
        if e.index < plan.start_entry {
            continue;
        }
        r.apply(&e, dev)?;
        rep.applied += 1;
        let is_end = plan.end_mark.is_some() && e.mark.as_deref() == plan.end_mark.as_deref();
        let check = match plan.check {
            Some(Check::Flush) => e.is_flush(),
            Some(Check::Fua) => e.is_fua(),
            Some(Check::Every(n)) => rep.applied % n == 0,
            None => false,
        };
        if check {
            rep.checks += 1;
            last_checked = Some(e.index);
            checkpoint(&e)?;
        }
        last_applied = Some(e);
        if is_end {
            rep.found_end_mark = true;
            break;
        }
    }
    if let Some(m) = &plan.start_mark {
        if !started {
            return Err(format!("start mark '{m}' is not in the log"));
        }
    }
    if let Some(m) = &plan.end_mark {
        if !rep.found_end_mark {
            return Err(format!(
                "end mark '{m}' is not in the log (it has {} entries)",
                r.nr_entries
            ));
        }
    }
    if let Some(e) = last_applied {
        if last_checked != Some(e.index) && plan.check.is_some() {
            rep.checks += 1;
            checkpoint(&e)?;
        }
    }
    Ok(rep)
}

/// The index of the first entry whose mark is `mark`.
pub fn find_mark(log: Arc<dyn BlockDevice>, mark: &str) -> Result<Option<u64>, String> {
    let mut r = LogReader::open(log)?;
    while let Some(e) = r.next_entry()? {
        if e.mark.as_deref() == Some(mark) {
            return Ok(Some(e.index));
        }
    }
    Ok(None)
}
