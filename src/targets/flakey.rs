//! `flakey <dev> <offset> <up interval> <down interval> [<#features>
//! [<feature arguments>]]`: a linear mapping that misbehaves for `down`
//! seconds after every `up` seconds, counted from table load, as dm-flakey
//! does — the way filesystem test suites simulate a disk that fails, or a
//! power cut (`drop_writes`: writes are acknowledged and never stored).
//!
//! While down, with the features given:
//! - none: every read, write, flush and discard fails (the kernel then
//!   sets `error_reads` and `error_writes`, and prints them back);
//! - `error_reads`: reads fail; `drop_writes`: writes, flushes and
//!   discards succeed without reaching the device; `error_writes`: they
//!   fail;
//! - `corrupt_bio_byte <Nth> <r|w> <value> <flags>`: byte `Nth` (from 1) of
//!   each matching read (after reading) or write (before writing, on a
//!   copy for a borrowed buffer) is replaced by `value`; `flags` selects
//!   requests by their kernel op flags (all of them set). A udm request
//!   carries the op (write = 1) and `REQ_FUA` (1 << 17) for FUA writes, so
//!   `flags` 0 matches everything and 131072 only FUA writes;
//! - `random_read_corrupt <p>` / `random_write_corrupt <p>`: a random byte
//!   of a read or write is replaced by a random value with probability
//!   `p` / 1 000 000 000.
//!
//! Status is empty, as in the kernel; there are no messages. Errors are
//! `DevError::Target` (EIO over NBD).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::{resolve_area, Area, Target, TargetArgs, TargetError};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

/// Probabilities are out of this (the kernel's `PROBABILITY_BASE`).
pub const PROBABILITY_BASE: u32 = 1_000_000_000;
/// The kernel's write op and FUA flag bits, which `corrupt_bio_byte`'s
/// `<flags>` is matched against.
pub const REQ_OP_WRITE: u32 = 1;
pub const REQ_FUA: u32 = 1 << 17;

/// `corrupt_bio_byte` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    /// 1-based byte of the request to replace.
    pub byte: u32,
    pub write: bool,
    pub value: u8,
    pub flags: u32,
}

/// The features of a flakey table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    pub error_reads: bool,
    pub drop_writes: bool,
    pub error_writes: bool,
    pub corrupt: Option<Corrupt>,
    pub random_read_corrupt: u32,
    pub random_write_corrupt: u32,
}

pub struct Flakey {
    area: Area,
    len: u64,
    up: u32,
    down: u32,
    features: Features,
    start: Instant,
    /// An override of the up/down cycle for in-process callers: 0 follows
    /// the intervals, 1 forces up, 2 forces down. Not reachable from a
    /// table; dm users reload the table with other intervals instead.
    force: AtomicU8,
    rng: AtomicU64,
}

/// The `flakey` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "flakey",
    version: [1, 5, 0],
    new,
    args: &[
        "device",
        "offset",
        "up interval",
        "down interval",
        "#features",
    ],
    more_args: None,
};

pub fn new(a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    Ok(build(a)?)
}

/// The constructor, returning the concrete type (for callers that drive
/// [`Flakey::force_state`]).
pub fn build(mut a: TargetArgs<'_>) -> Result<Arc<Flakey>, TargetError> {
    if a.args.len() < 4 {
        return Err(TargetError::line(format!(
            "Invalid argument count: expected '<device> <offset> <up interval> <down interval> \
             [<#features> <feature>...]', got {} arguments",
            a.args.len()
        )));
    }
    let up = parse_u32(a.args, 2, "Invalid up interval (seconds, 0 to 4294967295)")?;
    let down = parse_u32(
        a.args,
        3,
        "Invalid down interval (seconds, 0 to 4294967295)",
    )?;
    if u64::from(up) + u64::from(down) == 0 {
        return Err(TargetError::line(
            "Total (up + down) interval is zero: give at least one second",
        ));
    }
    if up.checked_add(down).is_none() {
        return Err(TargetError::line(
            "Interval overflow: up + down must fit in 32 bits",
        ));
    }
    let features = parse_features(a.args)?;
    let len = a.len;
    let area = resolve_area(&mut a, 0, len)?;
    Ok(Arc::new(Flakey {
        area,
        len,
        up,
        down,
        features,
        start: Instant::now(),
        force: AtomicU8::new(0),
        rng: AtomicU64::new(seed()),
    }))
}

fn seed() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return 0x9E37_79B9_7F4A_7C15;
    }
    u64::from_le_bytes(b) | 1
}

fn parse_u32(args: &[String], idx: usize, what: &str) -> Result<u32, TargetError> {
    let s = args
        .get(idx)
        .ok_or_else(|| TargetError::at(idx, format!("missing: {what}")))?;
    crate::core::units::parse_decimal(s)
        .ok()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| TargetError::at(idx, format!("{what}, got '{s}'")))
}

fn bounded(args: &[String], idx: usize, lo: u32, hi: u32, what: &str) -> Result<u32, TargetError> {
    let v = parse_u32(args, idx, what)?;
    if v < lo || v > hi {
        return Err(TargetError::at(idx, format!("{what}, got {v}")));
    }
    Ok(v)
}

/// Features as dm-flakey reads them: a count, then that many words
/// (a feature's parameters count as words).
fn parse_features(args: &[String]) -> Result<Features, TargetError> {
    let mut f = Features::default();
    if args.len() == 4 {
        f.error_reads = true;
        f.error_writes = true;
        return Ok(f);
    }
    let n = bounded(args, 4, 0, 11, "Invalid number of feature args (0 to 11)")? as usize;
    if args.len() - 5 != n {
        return Err(TargetError::at(
            4,
            format!(
                "#features says {n} feature words follow, but {} do",
                args.len() - 5
            ),
        ));
    }
    let mut i = 5;
    let end = 5 + n;
    while i < end {
        let name = args[i].to_ascii_lowercase();
        let at = i;
        i += 1;
        match name.as_str() {
            "error_reads" => {
                if std::mem::replace(&mut f.error_reads, true) {
                    return Err(TargetError::at(at, "Feature error_reads duplicated"));
                }
            }
            "drop_writes" => {
                if std::mem::replace(&mut f.drop_writes, true) {
                    return Err(TargetError::at(at, "Feature drop_writes duplicated"));
                }
                if f.error_writes {
                    return Err(TargetError::at(
                        at,
                        "Feature drop_writes conflicts with feature error_writes",
                    ));
                }
            }
            "error_writes" => {
                if std::mem::replace(&mut f.error_writes, true) {
                    return Err(TargetError::at(at, "Feature error_writes duplicated"));
                }
                if f.drop_writes {
                    return Err(TargetError::at(
                        at,
                        "Feature error_writes conflicts with feature drop_writes",
                    ));
                }
            }
            "corrupt_bio_byte" => {
                if f.corrupt.is_some() {
                    return Err(TargetError::at(at, "Feature corrupt_bio_byte duplicated"));
                }
                f.corrupt = Some(parse_corrupt(args, at, i, end)?);
                i += 4;
            }
            "random_read_corrupt" | "random_write_corrupt" => {
                let read = name == "random_read_corrupt";
                let cur = if read {
                    f.random_read_corrupt
                } else {
                    f.random_write_corrupt
                };
                if cur != 0 {
                    return Err(TargetError::at(at, format!("Feature {name} duplicated")));
                }
                let p = parse_probability(args, at, i, end, &name)?;
                if read {
                    f.random_read_corrupt = p;
                } else {
                    f.random_write_corrupt = p;
                }
                i += 1;
            }
            _ => {
                return Err(TargetError::at(
                    at,
                    format!(
                        "Unrecognised flakey feature requested: '{}' (error_reads, drop_writes, \
                         error_writes, corrupt_bio_byte, random_read_corrupt, random_write_corrupt)",
                        args[at]
                    ),
                ))
            }
        }
    }
    check_compatible(&f)?;
    if f == Features::default() {
        f.error_reads = true;
        f.error_writes = true;
    }
    Ok(f)
}

/// `corrupt_bio_byte <Nth_byte> <r|w> <value> <flags>`, its parameters
/// from `i` (the feature's name at `at`, the features ending at `end`).
fn parse_corrupt(args: &[String], at: usize, i: usize, end: usize) -> Result<Corrupt, TargetError> {
    if end - i < 4 {
        return Err(TargetError::at(
            at,
            "Feature corrupt_bio_byte requires 4 parameters: <Nth_byte> <r|w> <value> <flags>",
        ));
    }
    let byte = bounded(args, i, 1, u32::MAX, "Invalid corrupt bio byte (1 or more)")?;
    let write = match args[i + 1].to_ascii_lowercase().as_str() {
        "w" => true,
        "r" => false,
        _ => {
            return Err(TargetError::at(
                i + 1,
                format!(
                    "Invalid corrupt bio direction (r or w), got '{}'",
                    args[i + 1]
                ),
            ))
        }
    };
    let value = bounded(
        args,
        i + 2,
        0,
        255,
        "Invalid corrupt value to write into bio byte (0-255)",
    )? as u8;
    let flags = parse_u32(args, i + 3, "Invalid corrupt bio flags mask")?;
    Ok(Corrupt {
        byte,
        write,
        value,
        flags,
    })
}

/// The probability parameter of `random_read_corrupt` or
/// `random_write_corrupt`, at `i` (the feature's name at `at`).
fn parse_probability(
    args: &[String],
    at: usize,
    i: usize,
    end: usize,
    name: &str,
) -> Result<u32, TargetError> {
    if i >= end {
        return Err(TargetError::at(
            at,
            format!("Feature {name} requires a parameter"),
        ));
    }
    bounded(
        args,
        i,
        0,
        PROBABILITY_BASE,
        "Invalid random corrupt argument (0 to 1000000000)",
    )
}

/// The combinations dm-flakey refuses: writes dropped or failed and also
/// corrupted, reads failed and also corrupted.
fn check_compatible(f: &Features) -> Result<(), TargetError> {
    let cw = f.corrupt.is_some_and(|c| c.write);
    let cr = f.corrupt.is_some_and(|c| !c.write);
    if f.drop_writes && (cw || f.random_write_corrupt != 0) {
        return Err(TargetError::line(
            "drop_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set",
        ));
    }
    if f.error_writes && (cw || f.random_write_corrupt != 0) {
        return Err(TargetError::line(
            "error_writes is incompatible with random_write_corrupt or corrupt_bio_byte with the WRITE flag set",
        ));
    }
    if f.error_reads && (cr || f.random_read_corrupt != 0) {
        return Err(TargetError::line(
            "error_reads is incompatible with random_read_corrupt or corrupt_bio_byte with the READ flag set",
        ));
    }
    Ok(())
}

impl Flakey {
    /// Whether the device is in its down interval now.
    pub fn is_down(&self) -> bool {
        match self.force.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let secs = self.start.elapsed().as_secs();
                secs % (u64::from(self.up) + u64::from(self.down)) >= u64::from(self.up)
            }
        }
    }

    /// Override the up/down cycle: `Some(true)` keeps the device down,
    /// `Some(false)` up, `None` returns to the intervals. For in-process
    /// callers (tests that toggle `drop_writes` between fsync points).
    pub fn force_state(&self, down: Option<bool>) {
        self.force.store(
            match down {
                None => 0,
                Some(false) => 1,
                Some(true) => 2,
            },
            Ordering::Relaxed,
        );
    }

    pub fn features(&self) -> Features {
        self.features
    }

    fn fail(&self, what: &str, offset: u64, len: u64) -> DevError {
        DevError::Target(format!(
            "flakey: {what} of bytes [{offset}, +{len}) failed: the device is in its down \
             interval ({} s up, {} s down)",
            self.up, self.down
        ))
    }

    fn random(&self) -> u64 {
        // splitmix64 over an atomic counter: cheap, lock-free, good enough
        // to pick bytes to damage.
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn hit(&self, p: u32) -> bool {
        p != 0 && (self.random() % u64::from(PROBABILITY_BASE)) < u64::from(p)
    }

    /// Damage `buf` as the features say for a request with op flags `opf`
    /// (`write` tells which direction's features apply).
    fn corrupt(&self, buf: &mut [u8], write: bool, opf: u32) {
        if buf.is_empty() {
            return;
        }
        if let Some(c) = self.features.corrupt {
            if c.write == write && opf & c.flags == c.flags {
                if let Some(b) = buf.get_mut(c.byte as usize - 1) {
                    *b = c.value;
                }
            }
        }
        let p = if write {
            self.features.random_write_corrupt
        } else {
            self.features.random_read_corrupt
        };
        if self.hit(p) {
            let r = self.random();
            let at = (r % buf.len() as u64) as usize;
            buf[at] = (r >> 56) as u8;
        }
    }

    fn corrupts_writes(&self, fua: bool) -> bool {
        let opf = REQ_OP_WRITE | if fua { REQ_FUA } else { 0 };
        self.features
            .corrupt
            .is_some_and(|c| c.write && opf & c.flags == c.flags)
            || self.features.random_write_corrupt != 0
    }

    /// What a write-direction request without data (flush, discard, write
    /// zeroes) does while down: `Ok(true)` pass it down, `Ok(false)`
    /// complete it here, `Err` fail it.
    fn down_write_gate(&self, what: &str, offset: u64, len: u64) -> DevResult<bool> {
        if !self.is_down() {
            return Ok(true);
        }
        if self.features.drop_writes {
            return Ok(false);
        }
        if self.features.error_writes {
            return Err(self.fail(what, offset, len));
        }
        Ok(true)
    }
}

impl BlockDevice for Flakey {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        self.area.dev.limits()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let down = self.is_down();
        if down && self.features.error_reads {
            return Err(self.fail("read", offset, buf.len() as u64));
        }
        self.area.dev.read(self.area.offset + offset, buf)?;
        if down {
            self.corrupt(buf, false, 0);
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        if !self.down_write_gate("write", offset, data.len() as u64)? {
            return Ok(());
        }
        let at = self.area.offset + offset;
        if self.is_down() && self.corrupts_writes(fua) {
            let opf = REQ_OP_WRITE | if fua { REQ_FUA } else { 0 };
            return match data {
                WriteBuf::Owned(b) => {
                    self.corrupt(b, true, opf);
                    self.area.dev.write(at, WriteBuf::Owned(b), fua)
                }
                WriteBuf::Borrowed(b) => {
                    // The caller's bytes must not change: damage a copy,
                    // as the kernel clones the bio.
                    let mut copy = b.to_vec();
                    self.corrupt(&mut copy, true, opf);
                    self.area.dev.write(at, WriteBuf::Owned(&mut copy), fua)
                }
            };
        }
        self.area.dev.write(at, data, fua)
    }
    fn flush(&self) -> DevResult<()> {
        if self.down_write_gate("flush", 0, 0)? {
            self.area.dev.flush()?;
        }
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.down_write_gate("discard", offset, len)? {
            self.area.dev.discard(self.area.offset + offset, len)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        if self.down_write_gate("write zeroes", offset, len)? {
            self.area
                .dev
                .write_zeroes(self.area.offset + offset, len, fua)?;
        }
        Ok(())
    }
}

impl Target for Flakey {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    /// As dm-flakey prints it: the feature count and words always, with
    /// the implied `error_reads error_writes` of a table without features.
    fn table_params(&self, _show_keys: bool) -> String {
        let f = &self.features;
        let count = u32::from(f.error_reads)
            + u32::from(f.drop_writes)
            + u32::from(f.error_writes)
            + if f.corrupt.is_some() { 5 } else { 0 }
            + if f.random_read_corrupt > 0 { 2 } else { 0 }
            + if f.random_write_corrupt > 0 { 2 } else { 0 };
        let mut s = format!(
            "{} {} {} {} {count}",
            self.area.table_name(),
            self.area.table_offset(),
            self.up,
            self.down
        );
        if f.error_reads {
            s.push_str(" error_reads");
        }
        if f.drop_writes {
            s.push_str(" drop_writes");
        } else if f.error_writes {
            s.push_str(" error_writes");
        }
        if let Some(c) = f.corrupt {
            s.push_str(&format!(
                " corrupt_bio_byte {} {} {} {}",
                c.byte,
                if c.write { 'w' } else { 'r' },
                c.value,
                c.flags
            ));
        }
        if f.random_read_corrupt > 0 {
            s.push_str(&format!(" random_read_corrupt {}", f.random_read_corrupt));
        }
        if f.random_write_corrupt > 0 {
            s.push_str(&format!(" random_write_corrupt {}", f.random_write_corrupt));
        }
        s
    }
}
