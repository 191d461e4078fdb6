//! The authenticated path (`integrity:<bytes>:aead`): every sector's tag,
//! and its IV when random, travel beside the data through the lower
//! device's tagged calls ([`BlockDevice::read_tagged`] /
//! [`BlockDevice::write_tagged`]), as dm-crypt passes them in the bio's
//! integrity payload to the dm-integrity device below.
//!
//! A sector whose tag does not match fails its whole request with EIO (the
//! kernel ends the bio with an error and logs "INTEGRITY AEAD ERROR"); no
//! byte of it reaches the caller. Requests are split across the crypto
//! threads as on the plain path; each part carries its own tags.

use super::split::part;
use super::{Area, Crypt};
use crate::core::device::TagLayout;
use crate::core::{DevError, DevResult, WriteBuf};
use crate::crypto::SectorAead;
use crate::targets::TargetError;

/// At construction: a device that says it keeps tags must keep them per
/// crypt sector and wide enough for the tuple (dm-crypt's "Integrity
/// profile tag size mismatch"). A device that keeps none is refused at I/O
/// time instead, so `udm table check` over placeholder devices still
/// checks the rest of the line.
pub(super) fn check_layout(area: &Area, a: &SectorAead) -> Result<(), TargetError> {
    match area.dev.tag_layout() {
        Some(l) => stride(&area.name, l, a)
            .map(drop)
            .map_err(|e| TargetError::at(3, e.to_string())),
        None => Ok(()),
    }
}

/// The tag bytes per sector on the device below, checked against the cipher.
fn stride(name: &str, l: TagLayout, a: &SectorAead) -> DevResult<usize> {
    if l.sector_size != a.sector_size() || (l.tag_size as usize) < a.tuple_size() {
        return Err(DevError::Target(format!(
            "crypt over {name}: the integrity device keeps {} tag bytes per {}-byte sector; \
             this table needs {} per {} (integrity:<bytes> and sector_size must match the \
             integrity device's tag size and block size)",
            l.tag_size,
            l.sector_size,
            a.tuple_size(),
            a.sector_size()
        )));
    }
    Ok(l.tag_size as usize)
}

impl Crypt {
    fn tag_stride(&self, a: &SectorAead) -> DevResult<usize> {
        let l = self.area.dev.tag_layout().ok_or_else(|| {
            DevError::Target(format!(
                "crypt over {}: integrity:{}:aead needs an integrity device below (the \
                 kernel's NAME_dif); this device keeps no tags",
                self.area.name,
                a.tuple_size()
            ))
        })?;
        stride(&self.area.name, l, a)
    }

    /// The error of a sector whose tag does not match, by its target sector.
    #[cold]
    fn auth_failed(&self, sector: u64) -> DevError {
        tracing::warn!(device = %self.area.name, sector, "crypt: INTEGRITY AEAD ERROR");
        DevError::Io(std::io::Error::other(format!(
            "crypt over {}: INTEGRITY AEAD ERROR at sector {sector}: the data or its tag was \
             changed on the device",
            self.area.name
        )))
    }

    pub(super) fn read_aead(&self, a: &SectorAead, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let stride = self.tag_stride(a)?;
        let ss = self.opts.sector_size as usize;
        let (per, n) = self.plan(buf.len(), !self.opts.no_read_workqueue);
        let io = self.io_pool.alloc(super::split::CryptIo::new(buf, per));
        self.run_parts(n, &|i| {
            let Some(p) = io.take(i) else {
                return Ok(());
            };
            let at = offset + (i * per) as u64;
            let mut tags = vec![0u8; p.len() / ss * stride];
            self.area
                .dev
                .read_tagged(self.area.offset + at, p, &mut tags)?;
            a.open(p, &tags, stride, self.cc_sector(at), at / 512)
                .map_err(|f| self.auth_failed(at / 512 + (f.0 * ss / 512) as u64))
        })
    }

    pub(super) fn write_aead(
        &self,
        a: &SectorAead,
        offset: u64,
        data: WriteBuf<'_>,
        fua: bool,
    ) -> DevResult<()> {
        let stride = self.tag_stride(a)?;
        let ss = self.opts.sector_size as usize;
        let (per, n) = self.plan(data.len(), !self.opts.no_write_workqueue);
        let seal = |p: &mut [u8], at: u64| -> DevResult<()> {
            let mut tags = vec![0u8; p.len() / ss * stride];
            a.seal(p, &mut tags, stride, self.cc_sector(at), at / 512)
                .map_err(|e| DevError::Target(format!("crypt over {}: {e}", self.area.name)))?;
            self.area
                .dev
                .write_tagged(self.area.offset + at, p, &tags, fua)
        };
        match data {
            WriteBuf::Owned(buf) => {
                let io = self.io_pool.alloc(super::split::CryptIo::new(buf, per));
                self.run_parts(n, &|i| match io.take(i) {
                    Some(p) => seal(p, offset + (i * per) as u64),
                    None => Ok(()),
                })
            }
            // A borrowed buffer is never modified: each part is sealed in
            // a copy.
            WriteBuf::Borrowed(src) => self.run_parts(n, &|i| {
                let r = part(i, per, src.len());
                if r.is_empty() {
                    return Ok(());
                }
                let at = offset + r.start as u64;
                seal(&mut src[r].to_vec(), at)
            }),
        }
    }
}
