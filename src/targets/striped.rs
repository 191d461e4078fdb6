//! `striped <#stripes> <chunk_size> (<dev> <offset>)...`: chunks of
//! `chunk_size` sectors go round-robin over the legs, with dm-stripe's
//! placement (chunk c lands on leg c mod N, row c div N), so a udm striped
//! table and the kernel's lay the same bytes in the same places.
//!
//! The target declares its chunk as its I/O boundary
//! ([`Limits::io_boundary`], as dm-stripe sets `max_io_len`), so the dm
//! core (`dm::Routes`) hands it pieces that never cross a chunk — each a
//! sub-slice of the caller's buffer: no copy, no allocation (no-clone
//! remap). What is left here is dm-stripe's arithmetic: one piece, one leg.
//!
//! Direct access ([`BlockDevice::direct_access`]) is not offered, even over
//! in-memory legs: a chunk of 512-byte sectors need not be a whole number
//! of a transform's units (crypt sectors up to 4 KiB), and no caller needs
//! it today (crypt over striped takes its copying path, which is correct).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::{parse_sectors, resolve_area, Area, EventHook, Target, TargetArgs, TargetError};
use crate::core::{extents_of, BlockDevice, DevError, DevResult, Extent, Limits, WriteBuf};

pub struct Striped {
    legs: Vec<Area>,
    chunk: u64, // bytes
    len: u64,
    /// Failed requests per leg, as dm-stripe's `error_count`: `status`
    /// shows a leg with any as `D` (dead).
    errors: Vec<AtomicU32>,
    events: Option<EventHook>,
}

/// dm-stripe raises an event for each of a leg's first failures only, so
/// a dying disk does not flood `dmsetup wait` (DM_IO_ERROR_THRESHOLD).
const EVENT_ERRORS: u32 = 15;

/// The `striped` target type, for the table of [`super::TYPES`].
pub static TYPE: super::TargetType = super::TargetType {
    name: "striped",
    version: [1, 7, 0],
    new,
    args: &["#stripes", "chunk_size"],
    more_args: Some(stripe_arg),
};

/// Striped's arguments after `#stripes chunk_size` come in device/offset
/// pairs, one per leg.
fn stripe_arg(idx: usize) -> String {
    let leg = (idx - 2) / 2;
    let what = if (idx - 2) % 2 == 0 {
        "device"
    } else {
        "offset"
    };
    format!("stripe {leg} {what}")
}

/// Constructor with dm-stripe's rules: stripes > 0, chunk > 0 (any size;
/// current kernels drop the power-of-two rule), length divisible by the
/// stripe count and the per-leg width divisible by the chunk.
pub fn new(mut a: TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError> {
    if a.args.len() < 2 {
        return Err(TargetError::line(
            "expected '<#stripes> <chunk_size> <device> <offset> ...'",
        ));
    }
    let n = parse_count(a.args, 0)?;
    if n == 0 {
        return Err(TargetError::at(0, "stripe count must be at least 1"));
    }
    let chunk_sectors = parse_sectors(a.args, 1)?;
    if chunk_sectors == 0 || chunk_sectors > u32::MAX as u64 {
        return Err(TargetError::at(
            1,
            format!("chunk size must be between 1 and {} sectors", u32::MAX),
        ));
    }
    let want = 2 + 2 * n as usize;
    if a.args.len() != want {
        return Err(TargetError::at(
            0,
            format!(
                "{n} stripes need {want} arguments ('<#stripes> <chunk_size>' and a '<device> <offset>' pair per stripe), got {} ({} device(s))",
                a.args.len(),
                (a.args.len() - 2) / 2
            ),
        ));
    }
    let len_sectors = a.len / 512;
    if len_sectors % n != 0 {
        return Err(TargetError::line(format!(
            "segment length {len_sectors} is not divisible by the number of stripes {n}"
        )));
    }
    let width = len_sectors / n;
    if width % chunk_sectors != 0 {
        return Err(TargetError::line(format!(
            "per-stripe width {width} sectors is not divisible by the chunk size {chunk_sectors}"
        )));
    }
    let mut legs = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        legs.push(resolve_area(&mut a, 2 + 2 * i, width * 512)?);
    }
    Ok(Arc::new(Striped {
        errors: legs.iter().map(|_| AtomicU32::new(0)).collect(),
        legs,
        chunk: chunk_sectors * 512,
        len: a.len,
        events: a.options.events.clone(),
    }))
}

fn parse_count(args: &[String], idx: usize) -> Result<u64, TargetError> {
    let n = super::parse_number(args, idx, "a stripe count")?;
    if n > u64::from(u32::MAX) {
        return Err(TargetError::at(
            idx,
            format!("'{}' is too large", args[idx]),
        ));
    }
    Ok(n)
}

impl Striped {
    /// Map a target-relative byte offset to (leg, byte offset on the leg,
    /// bytes left in this chunk).
    #[inline]
    fn map(&self, offset: u64) -> (usize, u64, u64) {
        let n = self.legs.len() as u64;
        let chunk_idx = offset / self.chunk;
        let in_chunk = offset % self.chunk;
        let leg = (chunk_idx % n) as usize;
        let row = chunk_idx / n;
        (
            leg,
            self.legs[leg].offset + row * self.chunk + in_chunk,
            self.chunk - in_chunk,
        )
    }

    /// The leg and its offset for `[offset, offset+len)`, which lies in
    /// one chunk; `f(leg, leg_offset)` runs there, and a failure is
    /// counted against the leg (dm-stripe's rule: not for "not
    /// supported").
    #[inline]
    fn on_leg<T>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&Area, u64) -> DevResult<T>,
    ) -> DevResult<T> {
        let (leg, leg_off, left) = self.map(offset);
        if len > left {
            return Err(crosses_chunk(offset, len, self.chunk));
        }
        f(&self.legs[leg], leg_off).inspect_err(|e| self.leg_failed(leg, e))
    }

    #[cold]
    fn leg_failed(&self, leg: usize, e: &DevError) {
        if matches!(e, DevError::NotSupported(_) | DevError::OutOfRange { .. }) {
            return;
        }
        let before = self.errors[leg].fetch_add(1, Ordering::Relaxed);
        if before < EVENT_ERRORS {
            if let Some(h) = &self.events {
                h.raise();
            }
        }
    }
}

/// A request across a chunk reached the target without the dm core's cut.
#[cold]
fn crosses_chunk(offset: u64, len: u64, chunk: u64) -> DevError {
    DevError::Target(format!(
        "striped: the request [{offset}, +{len}) crosses a {chunk}-byte chunk boundary; \
         send requests through the dm core (dm::Routes), which cuts them at the chunks"
    ))
}

impl BlockDevice for Striped {
    fn size(&self) -> u64 {
        self.len
    }

    fn limits(&self) -> Limits {
        let mut l = self.legs[0].dev.limits();
        for leg in &self.legs[1..] {
            l = l.stack(leg.dev.limits());
        }
        l.optimal_io_size = l
            .optimal_io_size
            .max(self.chunk.min(u32::MAX as u64) as u32);
        l.io_boundary = self.chunk;
        l
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.on_leg(offset, buf.len() as u64, |leg, off| leg.dev.read(off, buf))
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.on_leg(offset, data.len() as u64, |leg, off| {
            leg.dev.write(off, data, fua)
        })
    }

    fn flush(&self) -> DevResult<()> {
        for (i, leg) in self.legs.iter().enumerate() {
            if let Err(e) = leg.dev.flush() {
                self.leg_failed(i, &e);
                return Err(e);
            }
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.on_leg(offset, len, |leg, off| leg.dev.discard(off, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.on_leg(offset, len, |leg, off| leg.dev.write_zeroes(off, len, fua))
    }

    /// The piece's leg answers (the dm core cut the range at chunks).
    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        self.on_leg(offset, len, |leg, off| {
            extents_of(leg.dev.as_ref(), off, len, out).map(drop)
        })
    }
}

impl Target for Striped {
    fn type_name(&self) -> &'static str {
        TYPE.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        let mut s = format!("{} {}", self.legs.len(), self.chunk / 512);
        for leg in &self.legs {
            s.push_str(&format!(" {} {}", leg.table_name(), leg.table_offset()));
        }
        s
    }

    /// dm-stripe's status: `<#stripes> <dev>... 1 <A|D per leg>`, devices
    /// by the name the table gave them (the kernel prints `maj:min`).
    fn status(&self) -> String {
        let mut s = format!("{}", self.legs.len());
        for leg in &self.legs {
            s.push(' ');
            s.push_str(&leg.table_name());
        }
        s.push_str(" 1 ");
        for e in &self.errors {
            s.push(if e.load(Ordering::Relaxed) > 0 {
                'D'
            } else {
                'A'
            });
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use crate::targets::{DeviceResolver, TargetOptions};

    struct Legs(Vec<Arc<MemStore>>);
    impl DeviceResolver for Legs {
        fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
            let i: usize = spec.parse().map_err(|_| "bad leg".to_string())?;
            Ok(self.0[i].clone())
        }
    }

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn placement_matches_dm_stripe() {
        // 3 legs, chunk 8 sectors (4 KiB), leg offsets 0, 16, 32 sectors.
        let mut legs = Legs((0..3).map(|_| Arc::new(MemStore::new(1 << 20))).collect());
        let a = args(&["3", "8", "0", "0", "1", "16", "2", "32"]);
        let len = 3 * 64 * 512; // 64 sectors per leg
        let t = new(TargetArgs {
            args: &a,
            len,
            resolver: &mut legs,
            options: &TargetOptions::default(),
        })
        .map_err(|e| e.msg)
        .unwrap();
        assert_eq!(t.limits().io_boundary, 4096, "the chunk, for the dm core");
        // Called directly, a request across a chunk is refused (nothing
        // reaches a leg): the dm core cuts at the chunks (see
        // `mapper::mapped`'s tests for a striped table through it).
        let e = t.read(2048, &mut [0u8; 4096]).unwrap_err();
        assert!(e.to_string().contains("chunk boundary"), "{e}");
        assert_eq!(t.status(), "3 0 1 2 1 AAA", "no leg blamed");
        // Fill the device with a pattern, each 512-byte sector holding its
        // index, one piece per chunk as the dm core cuts (the first piece
        // short, so pieces start inside chunks).
        let data: Vec<u8> = (0..len / 512).flat_map(|s| vec![s as u8; 512]).collect();
        let mut at = 0u64;
        while at < len {
            let n = if at == 0 { 1536 } else { 4096 - at % 4096 };
            t.write(
                at,
                WriteBuf::Borrowed(&data[at as usize..(at + n) as usize]),
                false,
            )
            .unwrap();
            at += n;
        }
        for sector in 0..len / 512 {
            let chunk = sector / 8;
            let leg = (chunk % 3) as usize;
            let row = chunk / 3;
            let leg_sector = [0u64, 16, 32][leg] + row * 8 + sector % 8;
            let mut b = [0u8; 512];
            legs.0[leg].read(leg_sector * 512, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == sector as u8), "sector {sector}");
        }
        let mut back = vec![0u8; len as usize];
        for (i, c) in back.chunks_mut(4096).enumerate() {
            t.read(i as u64 * 4096, c).unwrap();
        }
        assert_eq!(back, data);
        assert_eq!(t.table_params(false), "3 8 0 0 1 16 2 32");
        assert_eq!(t.status(), "3 0 1 2 1 AAA");
    }

    /// A failing leg turns `D` in the status line and raises an event,
    /// as dm-stripe's error counting does; the other legs stay `A`.
    #[test]
    fn a_failing_leg_is_reported_dead() {
        use crate::targets::EventHook;
        use std::sync::atomic::AtomicUsize;
        struct Failing;
        impl BlockDevice for Failing {
            fn size(&self) -> u64 {
                1 << 20
            }
            fn limits(&self) -> Limits {
                Limits::default()
            }
            fn read(&self, _: u64, _: &mut [u8]) -> DevResult<()> {
                Err(DevError::Target("leg is gone".into()))
            }
            fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
                Err(DevError::Target("leg is gone".into()))
            }
            fn flush(&self) -> DevResult<()> {
                Ok(())
            }
            fn discard(&self, _: u64, _: u64) -> DevResult<()> {
                Ok(())
            }
            fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
                Ok(())
            }
        }
        struct Two(Arc<MemStore>);
        impl DeviceResolver for Two {
            fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
                Ok(if spec == "bad" {
                    Arc::new(Failing)
                } else {
                    self.0.clone()
                })
            }
        }
        let events = Arc::new(AtomicUsize::new(0));
        let ev = events.clone();
        let opts = TargetOptions {
            events: Some(EventHook(Arc::new(move || {
                ev.fetch_add(1, Ordering::SeqCst);
            }))),
            ..Default::default()
        };
        let a = args(&["2", "8", "good", "0", "bad", "0"]);
        let t = new(TargetArgs {
            args: &a,
            len: 2 * 64 * 512,
            resolver: &mut Two(Arc::new(MemStore::new(1 << 20))),
            options: &opts,
        })
        .map_err(|e| e.msg)
        .unwrap();
        assert_eq!(t.status(), "2 good bad 1 AA");
        t.read(0, &mut [0u8; 4096]).unwrap();
        for _ in 0..20 {
            assert!(t.read(4096, &mut [0u8; 4096]).is_err());
        }
        assert_eq!(t.status(), "2 good bad 1 AD");
        assert_eq!(events.load(Ordering::SeqCst), 15, "events stop at 15");
    }

    #[test]
    fn constraints() {
        let mut legs = Legs((0..2).map(|_| Arc::new(MemStore::new(1 << 20))).collect());
        let opts = TargetOptions::default();
        let mut try_new = |v: &[&str], len: u64| {
            let a = args(v);
            new(TargetArgs {
                args: &a,
                len,
                resolver: &mut legs,
                options: &opts,
            })
            .err()
            .map(|e| e.msg)
        };
        assert!(try_new(&["0", "8"], 4096).unwrap().contains("at least 1"));
        assert!(try_new(&["2", "0", "0", "0", "1", "0"], 8192)
            .unwrap()
            .contains("chunk"));
        assert!(try_new(&["2", "8", "0", "0"], 8192)
            .unwrap()
            .contains("need 6"));
        assert!(try_new(&["2", "8", "0", "0", "1", "0"], 3 * 512)
            .unwrap()
            .contains("divisible"));
        assert!(try_new(&["2", "8", "0", "0", "1", "0"], 2 * 12 * 512)
            .unwrap()
            .contains("chunk size"));
        // Non-power-of-two chunks are fine in current kernels.
        assert!(try_new(&["2", "3", "0", "0", "1", "0"], 2 * 12 * 512).is_none());
        assert!(try_new(&["2", "8", "0", "0", "1", "4096"], 2 * 8 * 512)
            .unwrap()
            .contains("does not fit"));
    }
}
