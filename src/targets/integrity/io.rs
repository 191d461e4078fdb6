//! Byte-granular reads and writes on the device below: tags sit at any
//! byte, the device takes whole logical blocks. Writes of part of a block
//! read the block first; callers hold the target's write lock, so no two
//! such read-modify-writes of one block overlap. And the flush of both
//! devices of a layout with a separate metadata device.

use super::layout::Geometry;
use crate::core::{BlockDevice, DevResult, WriteBuf};

/// Makes everything written to `data` and `meta` durable: data first,
/// then the metadata device, or the one device when they are the same
/// (`g` says which).
pub fn flush_both(data: &dyn BlockDevice, meta: &dyn BlockDevice, g: &Geometry) -> DevResult<()> {
    if g.is_separate() {
        data.flush()?;
    }
    meta.flush()
}

fn span(dev: &dyn BlockDevice, pos: u64, len: usize) -> (u64, usize) {
    let lbs = u64::from(dev.limits().logical_block_size.max(512));
    let a = pos / lbs * lbs;
    let end = (pos + len as u64).div_ceil(lbs) * lbs;
    (a, (end - a) as usize)
}

/// `out.len()` bytes at byte `pos`.
pub fn read_bytes(dev: &dyn BlockDevice, pos: u64, out: &mut [u8]) -> DevResult<()> {
    if out.is_empty() {
        return Ok(());
    }
    let (a, n) = span(dev, pos, out.len());
    if a == pos && n == out.len() {
        return dev.read(pos, out);
    }
    let mut buf = vec![0u8; n];
    dev.read(a, &mut buf)?;
    let at = (pos - a) as usize;
    out.copy_from_slice(&buf[at..at + out.len()]);
    Ok(())
}

/// `data` at byte `pos`, the rest of the blocks it touches kept.
pub fn write_bytes(dev: &dyn BlockDevice, pos: u64, data: &[u8]) -> DevResult<()> {
    if data.is_empty() {
        return Ok(());
    }
    let (a, n) = span(dev, pos, data.len());
    if a == pos && n == data.len() {
        return dev.write(pos, WriteBuf::Borrowed(data), false);
    }
    let mut buf = vec![0u8; n];
    dev.read(a, &mut buf)?;
    let at = (pos - a) as usize;
    buf[at..at + data.len()].copy_from_slice(data);
    dev.write(a, WriteBuf::Owned(&mut buf), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn unaligned_bytes_keep_their_neighbours() {
        let m = MemStore::new(4096);
        write_bytes(&m, 0, &[0xaa; 4096]).unwrap();
        write_bytes(&m, 510, &[1, 2, 3, 4]).unwrap();
        let mut b = [0u8; 6];
        read_bytes(&m, 509, &mut b).unwrap();
        assert_eq!(b, [0xaa, 1, 2, 3, 4, 0xaa]);
    }
}
