//! A mapped device: a table's segments, each with its target. It routes a
//! request to the segment(s) it covers and cuts it exactly at segment
//! boundaries, as dm core does with its clones — but without cloning: each
//! piece is a sub-slice of the caller's buffer (no-clone remap), so routing costs a
//! binary search and no allocation.
//!
//! Direct access (see [`crate::core::device::Transform`]) is forwarded when
//! every segment offers it and the request lies inside one segment (the
//! common case, and the only one where forwarding is free); a request that
//! crosses a segment boundary takes the generic path, because a boundary
//! need not fall on a whole unit of the transform.

use std::sync::Arc;

use crate::core::device::{read_transformed_by_reading, write_transformed_by_writing, Transform};
use crate::core::{extents_of, BlockDevice, DevError, DevResult, Extent, Limits, WriteBuf};
use crate::targets::Target;

/// One table segment, in bytes.
pub struct Segment {
    pub start: u64,
    pub len: u64,
    pub target: Arc<dyn Target>,
}

/// A device built from a table.
pub struct MappedDevice {
    segments: Vec<Segment>,
    size: u64,
    limits: Limits,
    /// Every segment offers direct access (fixed at construction).
    direct: bool,
}

impl MappedDevice {
    /// Segments must be contiguous from 0 (the table parser guarantees it).
    pub fn new(segments: Vec<Segment>) -> MappedDevice {
        let size = segments.last().map(|s| s.start + s.len).unwrap_or(0);
        let mut limits: Option<Limits> = None;
        for s in &segments {
            let l = s.target.limits();
            limits = Some(match limits {
                None => l,
                Some(acc) => acc.stack(l),
            });
        }
        let direct = !segments.is_empty() && segments.iter().all(|s| s.target.direct_access());
        MappedDevice {
            segments,
            size,
            limits: limits.unwrap_or_default(),
            direct,
        }
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The table as `dmsetup table` prints it; keys masked unless asked.
    pub fn table_text(&self, show_keys: bool) -> String {
        let mut out = String::new();
        for s in &self.segments {
            out.push_str(&format!(
                "{} {} {} {}\n",
                s.start / 512,
                s.len / 512,
                s.target.type_name(),
                s.target.table_params(show_keys)
            ));
        }
        out
    }

    fn check(&self, offset: u64, len: u64) -> DevResult<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(DevError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        Ok(())
    }

    /// Index of the segment containing byte `offset` (< size).
    #[inline]
    fn find(&self, offset: u64) -> usize {
        // First segment whose end is beyond `offset`.
        self.segments.partition_point(|s| s.start + s.len <= offset)
    }

    /// Visit the pieces of `[offset, offset+len)`, one per segment:
    /// `f(segment, offset_in_segment, piece_len)`.
    #[inline]
    fn for_each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&Segment, u64, u64) -> DevResult<()>,
    ) -> DevResult<()> {
        self.check(offset, len)?;
        let mut pos = offset;
        let end = offset + len;
        let mut i = self.find(offset);
        while pos < end {
            let s = &self.segments[i];
            let n = (s.start + s.len).min(end) - pos;
            f(s, pos - s.start, n)?;
            pos += n;
            i += 1;
        }
        Ok(())
    }
}

impl BlockDevice for MappedDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        // Fast path: inside one segment (the common case).
        let i = self.find(offset);
        if let Some(s) = self.segments.get(i) {
            if offset + buf.len() as u64 <= s.start + s.len {
                return s.target.read(offset - s.start, buf);
            }
        }
        let mut rest = buf;
        self.for_each_piece(offset, rest.len() as u64, |s, off, n| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(n as usize);
            rest = tail;
            s.target.read(off, head)
        })
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.check(offset, data.len() as u64)?;
        let i = self.find(offset);
        if let Some(s) = self.segments.get(i) {
            if offset + data.len() as u64 <= s.start + s.len {
                return s.target.write(offset - s.start, data, fua);
            }
        }
        let mut rest = Some(data);
        self.for_each_piece(
            offset,
            rest.as_ref().map_or(0, |d| d.len()) as u64,
            |s, off, n| {
                let (head, tail) = rest
                    .take()
                    .expect("piece within request")
                    .split_at(n as usize);
                rest = Some(tail);
                s.target.write(off, head, fua)
            },
        )
    }

    fn direct_access(&self) -> bool {
        self.direct
    }

    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        if let Some(s) = self.segments.get(self.find(offset)) {
            if offset + buf.len() as u64 <= s.start + s.len {
                return s.target.read_transformed(offset - s.start, buf, t);
            }
        }
        read_transformed_by_reading(self, offset, buf, t)
    }

    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.check(offset, src.len() as u64)?;
        if let Some(s) = self.segments.get(self.find(offset)) {
            if offset + src.len() as u64 <= s.start + s.len {
                return s.target.write_transformed(offset - s.start, src, fua, t);
            }
        }
        write_transformed_by_writing(self, offset, src, fua, t)
    }

    fn flush(&self) -> DevResult<()> {
        for s in &self.segments {
            s.target.flush()?;
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.for_each_piece(offset, len, |s, off, n| s.target.discard(off, n))
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.for_each_piece(offset, len, |s, off, n| s.target.write_zeroes(off, n, fua))
    }

    /// Each segment's piece asks its target, in order.
    fn extents(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(Extent) -> bool,
    ) -> DevResult<()> {
        let mut more = true;
        self.for_each_piece(offset, len, |s, off, n| {
            if more {
                more = extents_of(s.target.as_ref(), off, n, out)?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::table;
    use crate::mapper::build;
    use crate::store::MemStore;
    use crate::targets::{DeviceResolver, TargetOptions};

    struct One(Arc<MemStore>);
    impl DeviceResolver for One {
        fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn requests_split_exactly_at_segment_boundaries() {
        let mem = Arc::new(MemStore::new(1 << 20));
        // linear (reversed halves) | zero | error
        let t = "0 8 linear m 8\n8 8 linear m 0\n16 8 zero\n24 8 error\n";
        let lines = table::parse(t).unwrap();
        let dev = build(&lines, &mut One(mem.clone()), &TargetOptions::default()).unwrap();
        assert_eq!(dev.size(), 32 * 512);
        let data: Vec<u8> = (0..16 * 512).map(|i| (i / 512) as u8 + 1).collect();
        // One write across the first boundary.
        dev.write(0, WriteBuf::Borrowed(&data), false).unwrap();
        let mut raw = vec![0u8; 16 * 512];
        mem.read(0, &mut raw).unwrap();
        assert_eq!(&raw[..4096], &data[4096..]);
        assert_eq!(&raw[4096..], &data[..4096]);
        // A read across linear -> zero.
        let mut b = vec![0xffu8; 8192];
        dev.read(4096, &mut b).unwrap();
        assert_eq!(&b[..4096], &data[4096..]);
        assert!(b[4096..].iter().all(|&x| x == 0));
        // Anything touching the error segment fails; out of range is refused.
        assert!(dev.read(23 * 512, &mut [0u8; 1024]).is_err());
        assert!(matches!(
            dev.read(32 * 512, &mut [0u8; 512]),
            Err(DevError::OutOfRange { .. })
        ));
        assert_eq!(
            dev.table_text(false),
            "0 8 linear m 8\n8 8 linear m 0\n16 8 zero \n24 8 error \n"
        );
    }

    #[test]
    fn direct_access_is_forwarded_through_linear_segments() {
        use crate::core::device::testing::{xored, Xor};
        let mem = Arc::new(MemStore::new(1 << 20));
        // Two linear segments, the halves swapped on the store.
        let t = "0 1024 linear m 1024\n1024 1024 linear m 0\n";
        let dev = build(
            &table::parse(t).unwrap(),
            &mut One(mem.clone()),
            &TargetOptions::default(),
        )
        .unwrap();
        assert!(dev.direct_access());
        assert!(dev.segments()[0].target.direct_access());
        let data: Vec<u8> = (0..96 << 10).map(|i| (i % 241) as u8).collect();
        // Inside the first segment, across a lock region of the store (its
        // regions are 256 KiB: store offset 768 KiB is a boundary):
        // forwarded, one call per store region.
        let w = (256 << 10) - (32 << 10);
        let x = Xor::new(4096);
        dev.write_transformed(w, &data[..64 << 10], false, &x)
            .unwrap();
        assert_eq!(x.calls.get(), 2, "direct pieces at the store's regions");
        let mut raw = vec![0u8; 64 << 10];
        mem.read((512 << 10) + w, &mut raw).unwrap();
        assert!(raw == xored(&data[..64 << 10]));
        // Across the segment boundary: the generic path, same bytes.
        let at = (512 << 10) - (32 << 10);
        dev.write_transformed(at, &data, false, &Xor::new(4096))
            .unwrap();
        let mut plain = vec![0u8; data.len()];
        dev.read(at, &mut plain).unwrap();
        assert!(plain == xored(&data));
        let mut back = vec![0u8; data.len()];
        dev.read_transformed(at, &mut back, &Xor::new(4096))
            .unwrap();
        assert!(back == data);
        dev.read_transformed(w, &mut back[..8192], &Xor::new(4096))
            .unwrap();
        assert!(back[..8192] == data[..8192]);
        // A table with a segment that has no direct access does not offer it.
        let z = build(
            &table::parse("0 8 linear m 0\n8 8 zero\n").unwrap(),
            &mut One(mem.clone()),
            &TargetOptions::default(),
        )
        .unwrap();
        assert!(!z.direct_access());
    }
}
