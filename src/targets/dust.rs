//! `dust <dev> <offset> <blksz>`: dm-dust, a linear mapping with a list
//! of bad blocks that, once enabled, fail reads — a disk with bad sectors
//! at known places, switched on at a known time. A write to a bad block
//! takes it off the list (the drive remapped the sector), unless the block
//! was added with a write-failure count, in which case that many writes
//! fail first.
//!
//! Blocks are numbered as the kernel numbers them: in `blksz` units of the
//! *underlying* device (offset included). Messages, as `dmsetup message
//! NAME 0 ...`: `addbadblock <blk> [<wr_fail_cnt>]`, `removebadblock
//! <blk>`, `queryblock <blk>`, `listbadblocks`, `countbadblocks`,
//! `clearbadblocks`, `enable`, `disable`, `quiet`; the ones that report
//! something return the kernel's text. Status: `<dev> bypass|
//! fail_read_on_bad_block verbose|quiet`.

use crate::core::units::{parse_decimal, DecimalError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{resolve_area, Area, Target, TargetArgs, TargetError};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};

/// Largest block, in sectors (the kernel's `DUST_MAX_BLKSZ_SECTORS`).
const MAX_BLKSZ_SECTORS: u64 = 2_097_152;

pub struct Dust {
    area: Area,
    len: u64,
    blksz: u64,
    /// `fail_read_on_bb`: read separately on every request, so I/O with
    /// emulation off takes no lock.
    enabled: AtomicBool,
    state: Mutex<State>,
}

struct State {
    /// Bad block -> writes that still fail on it.
    bad: BTreeMap<u64, u8>,
    quiet: bool,
}

/// The `dust` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "dust",
    version: [1, 0, 0],
    new,
    args: &["device", "offset", "blksz"],
    more_args: None,
};

pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    if a.args.len() != 3 {
        return Err(TargetError::line(format!(
            "Invalid argument count: expected '<device> <offset> <blksz>', got {} arguments",
            a.args.len()
        )));
    }
    let s = &a.args[2];
    let blksz = parse_decimal(s)
        .ok()
        .filter(|&b| b != 0 && b <= u64::from(u32::MAX))
        .ok_or_else(|| {
            TargetError::at(
                2,
                format!("Invalid block size parameter: expected bytes, got '{s}'"),
            )
        })?;
    if blksz < 512 {
        return Err(TargetError::at(2, "Block size must be at least 512"));
    }
    if !blksz.is_power_of_two() {
        return Err(TargetError::at(
            2,
            format!("Block size must be a power of 2, got {blksz}"),
        ));
    }
    if blksz / 512 > (a.len / 512).min(MAX_BLKSZ_SECTORS) {
        return Err(TargetError::at(
            2,
            format!("Block size is too large: {blksz} bytes, more than the segment or 1 GiB"),
        ));
    }
    let len = a.len;
    let area = resolve_area(&mut a, 0, len)?;
    Ok(Arc::new(Dust {
        area,
        len,
        blksz,
        enabled: AtomicBool::new(false),
        state: Mutex::new(State {
            bad: BTreeMap::new(),
            quiet: false,
        }),
    }))
}

fn parse_num<T: TryFrom<u64>>(s: &str, what: &str) -> Result<T, String> {
    match parse_decimal(s) {
        Ok(v) => T::try_from(v).map_err(|_| format!("invalid {what} '{s}': too large")),
        Err(DecimalError::TooLarge) => Err(format!("invalid {what} '{s}': too large")),
        Err(_) => Err(format!("invalid {what} '{s}': expected a decimal number")),
    }
}

impl Dust {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks of the underlying device a request on `[offset, +len)` of
    /// the segment touches.
    fn blocks(&self, offset: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        let start = self.area.offset + offset;
        let end = start + len.max(1) - 1;
        (start / self.blksz)..=(end / self.blksz)
    }

    /// The write rule, for each block of a write-direction request: a bad
    /// block with writes left to fail fails (and counts one down); any
    /// other bad block leaves the list. Returns the blocks that fail.
    fn write_check(&self, offset: u64, len: u64) -> Vec<u64> {
        let mut failed = Vec::new();
        if !self.enabled.load(Ordering::Relaxed) {
            return failed;
        }
        let mut st = self.lock();
        if st.bad.is_empty() {
            return failed;
        }
        let range = self.blocks(offset, len);
        let hits: Vec<u64> = st.bad.range(range).map(|(&b, _)| b).collect();
        for b in hits {
            let cnt = st.bad.get_mut(&b).expect("block just found");
            if *cnt > 0 {
                *cnt -= 1;
                failed.push(b);
            } else {
                st.bad.remove(&b);
                if !st.quiet {
                    tracing::info!("dust: block {b} removed from badblocklist by write");
                }
            }
        }
        failed
    }

    fn bad_block_error(&self, what: &str, blocks: &[u64]) -> DevError {
        DevError::Target(format!(
            "dust: {what} of bad block(s) {blocks:?} of {} failed (the bad block list is \
             enabled; send 'disable' or 'removebadblock' to stop it)",
            self.area.name
        ))
    }

    /// Every block this device could name: the kernel checks block numbers
    /// against the underlying device's size.
    fn max_block(&self) -> u64 {
        self.area.dev.size() / self.blksz
    }

    fn block_arg(&self, s: &str) -> Result<u64, String> {
        let b: u64 = parse_num(s, "block number")?;
        if b > self.max_block() {
            return Err(format!(
                "selected block value out of range: {b} (the device has {} blocks of {} bytes)",
                self.max_block(),
                self.blksz
            ));
        }
        Ok(b)
    }

    /// Write `data` at segment `offset` except the blocks in `skip`.
    fn write_around(
        &self,
        offset: u64,
        data: WriteBuf<'_>,
        fua: bool,
        skip: &[u64],
    ) -> DevResult<()> {
        let mut rest = Some(data);
        let mut pos = offset;
        let end = offset + rest.as_ref().map_or(0, |d| d.len() as u64);
        while pos < end {
            let abs = self.area.offset + pos;
            let block = abs / self.blksz;
            let n = ((block + 1) * self.blksz - abs).min(end - pos);
            let (head, tail) = rest.take().expect("data left").split_at(n as usize);
            rest = Some(tail);
            if !skip.contains(&block) {
                self.area.dev.write(abs, head, fua)?;
            }
            pos += n;
        }
        Ok(())
    }
}

impl BlockDevice for Dust {
    fn size(&self) -> u64 {
        self.len
    }
    fn limits(&self) -> Limits {
        self.area.dev.limits()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        if self.enabled.load(Ordering::Relaxed) {
            let st = self.lock();
            let bad: Vec<u64> = st
                .bad
                .range(self.blocks(offset, buf.len() as u64))
                .map(|(&b, _)| b)
                .collect();
            if !bad.is_empty() {
                return Err(self.bad_block_error("read", &bad));
            }
        }
        self.area.dev.read(self.area.offset + offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        let failed = self.write_check(offset, data.len() as u64);
        if failed.is_empty() {
            return self.area.dev.write(self.area.offset + offset, data, fua);
        }
        // As the kernel, which splits I/O at block boundaries: the other
        // blocks are written, the request as a whole fails.
        self.write_around(offset, data, fua, &failed)?;
        Err(self.bad_block_error("write", &failed))
    }
    fn flush(&self) -> DevResult<()> {
        self.area.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        let failed = self.write_check(offset, len);
        if !failed.is_empty() {
            return Err(self.bad_block_error("discard", &failed));
        }
        self.area.dev.discard(self.area.offset + offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        let failed = self.write_check(offset, len);
        if !failed.is_empty() {
            return Err(self.bad_block_error("write zeroes", &failed));
        }
        self.area
            .dev
            .write_zeroes(self.area.offset + offset, len, fua)
    }
}

impl Target for Dust {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        format!(
            "{} {} {}",
            self.area.table_name(),
            self.area.table_offset(),
            self.blksz
        )
    }
    fn status(&self) -> String {
        format!(
            "{} {} {}",
            self.area.table_name(),
            if self.enabled.load(Ordering::Relaxed) {
                "fail_read_on_bad_block"
            } else {
                "bypass"
            },
            if self.lock().quiet {
                "quiet"
            } else {
                "verbose"
            }
        )
    }
    fn message(&self, argv: &[String]) -> Result<Option<String>, String> {
        let cmd = argv
            .first()
            .map(|s| s.to_ascii_lowercase())
            .unwrap_or_default();
        match (cmd.as_str(), argv.len()) {
            ("addbadblock" | "removebadblock" | "queryblock", 1) => Err(format!(
                "{cmd} requires an additional argument (a block number)"
            )),
            ("disable", 1) => {
                tracing::info!("dust: disabling read failures on bad sectors");
                self.enabled.store(false, Ordering::Relaxed);
                Ok(None)
            }
            ("enable", 1) => {
                tracing::info!("dust: enabling read failures on bad sectors");
                self.enabled.store(true, Ordering::Relaxed);
                Ok(None)
            }
            ("countbadblocks", 1) => Ok(Some(format!(
                "countbadblocks: {} badblock(s) found",
                self.lock().bad.len()
            ))),
            ("clearbadblocks", 1) => {
                let mut st = self.lock();
                let had = !st.bad.is_empty();
                st.bad.clear();
                Ok(Some(if had {
                    "dust_clear_badblocks: badblocks cleared".into()
                } else {
                    "dust_clear_badblocks: no badblocks found".into()
                }))
            }
            ("quiet", 1) => {
                let mut st = self.lock();
                st.quiet = !st.quiet;
                Ok(None)
            }
            ("listbadblocks", 1) => {
                let st = self.lock();
                if st.bad.is_empty() {
                    return Ok(Some("No blocks in badblocklist".into()));
                }
                let mut s = String::new();
                for b in st.bad.keys() {
                    s.push_str(&format!("{b}\n"));
                }
                Ok(Some(s))
            }
            ("addbadblock", 2 | 3) => {
                let b = self.block_arg(&argv[1])?;
                let cnt: u8 = match argv.get(2) {
                    None => 0,
                    Some(c) => {
                        let v: u32 = parse_num(c, "write fail count")?;
                        u8::try_from(v).map_err(|_| {
                            format!("selected write fail count out of range: {v} (0 to 255)")
                        })?
                    }
                };
                let mut st = self.lock();
                if st.bad.contains_key(&b) {
                    return Err(format!("block {b} already in badblocklist"));
                }
                st.bad.insert(b, cnt);
                if !st.quiet {
                    tracing::info!("dust: badblock added at block {b} with write fail count {cnt}");
                }
                Ok(None)
            }
            ("removebadblock", 2) => {
                let b = self.block_arg(&argv[1])?;
                let mut st = self.lock();
                if st.bad.remove(&b).is_none() {
                    return Err(format!("block {b} not found in badblocklist"));
                }
                if !st.quiet {
                    tracing::info!("dust: badblock removed at block {b}");
                }
                Ok(None)
            }
            ("queryblock", 2) => {
                let b = self.block_arg(&argv[1])?;
                let found = self.lock().bad.contains_key(&b);
                Ok(Some(format!(
                    "dust_query_block: block {b} {} in badblocklist",
                    if found { "found" } else { "not found" }
                )))
            }
            (_, 0) => Err("empty message: try enable, disable, addbadblock <blk>, ...".into()),
            (
                "addbadblock" | "removebadblock" | "queryblock" | "disable" | "enable"
                | "countbadblocks" | "clearbadblocks" | "quiet" | "listbadblocks",
                n,
            ) => Err(format!("invalid number of arguments '{n}' for {cmd}")),
            _ => Err(format!(
                "unrecognized message '{}' received (addbadblock, removebadblock, queryblock, \
                 listbadblocks, countbadblocks, clearbadblocks, enable, disable, quiet)",
                argv[0]
            )),
        }
    }
}
