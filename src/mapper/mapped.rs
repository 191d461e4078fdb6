//! A mapped device: a table's segments, each with its target, as dm's
//! `struct dm_table`. It keeps the targets for what `table`, `status` and
//! `message` need, and routes I/O over them with [`Routes`] (one segment,
//! one route; see `route` for how a request is cut at the boundaries).

use std::sync::Arc;

use crate::core::device::Transform;
use crate::core::{AsyncIo, BlockDevice, DevResult, Extent, Lent, Limits, WriteBuf};
use crate::dm::route::{Route, Routes};
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
    routes: Routes,
}

impl MappedDevice {
    /// Segments must be contiguous from 0 (the table parser guarantees it).
    pub fn new(segments: Vec<Segment>) -> MappedDevice {
        let mut limits: Option<Limits> = None;
        for s in &segments {
            let l = s.target.limits();
            limits = Some(match limits {
                None => l,
                Some(acc) => acc.stack(l),
            });
        }
        let routes = segments
            .iter()
            .map(|s| Route {
                start: s.start,
                len: s.len,
                dev: s.target.clone(),
                shift: 0,
            })
            .collect();
        MappedDevice {
            routes: Routes::new(routes, limits.unwrap_or_default()),
            segments,
        }
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The segment holding byte `offset`, if any.
    pub fn segment_at(&self, offset: u64) -> Option<&Segment> {
        self.segments
            .iter()
            .find(|s| s.start <= offset && offset < s.start + s.len)
    }

    /// The routes of this table (one per segment).
    pub fn routes(&self) -> &Routes {
        &self.routes
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
}

impl BlockDevice for MappedDevice {
    fn size(&self) -> u64 {
        self.routes.size()
    }

    fn limits(&self) -> Limits {
        self.routes.limits()
    }

    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.routes.read(offset, buf)
    }

    #[inline]
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.routes.write(offset, data, fua)
    }

    fn direct_access(&self) -> bool {
        self.routes.direct_access()
    }

    fn resident(&self, offset: u64, len: usize) -> bool {
        self.routes.resident(offset, len)
    }

    fn resident_for_write(&self, offset: u64, len: usize) -> bool {
        self.routes.resident_for_write(offset, len)
    }

    fn lend(&self, offset: u64, len: usize, f: &mut dyn FnMut(&dyn Lent)) -> bool {
        self.routes.lend(offset, len, f)
    }

    fn lends(&self) -> bool {
        self.routes.lends()
    }

    fn can_submit(&self) -> bool {
        self.routes.can_submit()
    }

    fn takes_prepare(&self) -> bool {
        self.routes.takes_prepare()
    }

    unsafe fn submit(&self, io: AsyncIo) {
        // SAFETY: the caller's guarantee on the buffer is passed on.
        unsafe { self.routes.submit(io) }
    }

    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.routes.read_transformed(offset, buf, t)
    }

    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.routes.write_transformed(offset, src, fua, t)
    }

    fn flush(&self) -> DevResult<()> {
        self.routes.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.routes.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.routes.write_zeroes(offset, len, fua)
    }

    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        self.routes.extents(offset, len, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::table;
    use crate::core::DevError;
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

    /// A striped segment gets pieces cut at its chunks by the dm core, also
    /// for a request that starts in the linear segment before it; the bytes
    /// land where dm-stripe puts them.
    #[test]
    fn striped_segments_get_pieces_cut_at_chunks() {
        let mem = Arc::new(MemStore::new(1 << 20));
        // 8 sectors linear, then 2 legs of 8-sector chunks at m sectors
        // 1024 and 1536.
        let t = "0 8 linear m 0\n8 64 striped 2 8 m 1024 m 1536\n";
        let dev = build(
            &table::parse(t).unwrap(),
            &mut One(mem.clone()),
            &TargetOptions::default(),
        )
        .unwrap();
        let data: Vec<u8> = (0..72 * 512).map(|i| (i / 512) as u8 ^ 0x5a).collect();
        // From inside the linear segment across three chunks.
        dev.write(2048, WriteBuf::Borrowed(&data[2048..16384]), false)
            .unwrap();
        let at = |sector: u64| {
            let mut b = [0u8; 512];
            mem.read(sector * 512, &mut b).unwrap();
            b[0]
        };
        let want = |s: u64| data[s as usize * 512];
        // Device sectors 8..16 are chunk 0 (leg 0), 16..24 chunk 1 (leg 1),
        // 24..32 chunk 2 (leg 0, row 1).
        assert_eq!(at(4), want(4));
        assert_eq!(at(1024), want(8));
        assert_eq!(at(1536 + 3), want(16 + 3));
        assert_eq!(at(1024 + 8 + 7), want(24 + 7));
        let mut back = vec![0u8; 16384 - 2048];
        dev.read(2048, &mut back).unwrap();
        assert!(back[..] == data[2048..16384]);
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
