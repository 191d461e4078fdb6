//! The `tcrypt`, `bitlk` and `fvault2` drivers: the foreign volume
//! headers of `luks::foreign`, parsed and unlocked as far as a fuzz run can
//! afford; and the tools that turn cryptsetup's upstream test images into
//! their seeds.
//!
//! The BitLocker and FileVault2 inputs describe a sparse disk: `flags`,
//! three spare bytes, the disk's size in 512-byte sectors (u32 LE), then
//! chunks of `offset` (u32 LE, sectors; `u32::MAX` for the chunk that is
//! not on the disk: the startup key, or plaintext metadata blocks), `len`
//! (u16 LE) and `len` bytes. Everything else on the disk reads as zeros,
//! so a seed holds only the sectors the reader looked at.
//!
//! No driver runs a KDF a header names at its own cost: TCRYPT's header is
//! given decrypted (its KDFs' iterations are fixed and large), BitLocker's
//! passphrase and recovery protectors (2^20 SHA-256 rounds each) are
//! dropped before the unlock, and FileVault2's passphrase is tried only
//! when the header asks for at most [`MAX_FUZZ_ITERATIONS`].

use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::luks::disk::Disk;
use crate::luks::foreign::bitlk::{self, Protection};
use crate::luks::foreign::tcrypt::{self, Params};
use crate::luks::foreign::{activate, bitlk_partial, fvault2};

/// FileVault2's PBKDF2 runs only below this many iterations.
pub const MAX_FUZZ_ITERATIONS: u32 = 1000;
/// Most chunks one input may place.
const MAX_CHUNKS: usize = 1024;
/// The chunk that is not on the disk.
const OFF_DISK: u32 = u32::MAX;

/// A read-only disk of any size that holds a few chunks and zeros.
pub struct SparseDev {
    size: u64,
    chunks: Vec<(u64, Vec<u8>)>,
}

impl BlockDevice for SparseDev {
    fn size(&self) -> u64 {
        self.size
    }
    fn limits(&self) -> Limits {
        Limits {
            read_only: true,
            ..Limits::default()
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or(DevError::OutOfRange {
                offset,
                len: buf.len() as u64,
                size: self.size,
            })?;
        buf.fill(0);
        for (at, data) in &self.chunks {
            let c_end = at + data.len() as u64;
            if c_end <= offset || *at >= end {
                continue;
            }
            let from = offset.max(*at);
            let to = end.min(c_end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
        }
        Ok(())
    }
    fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn write_vectored(&self, _: u64, _: &[IoSlice<'_>], _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _: u64, _: u64) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
}

/// The four head bytes (`flags` first), the sparse disk, and the bytes of
/// the off-disk chunk.
pub type SparseInput = ([u8; 4], Arc<SparseDev>, Option<Vec<u8>>);

/// Reads an input as a [`SparseInput`]; None if it is shorter than the head.
pub fn sparse_input(input: &[u8]) -> Option<SparseInput> {
    let (head, mut rest) = input.split_at_checked(8)?;
    let size = u64::from(u32::from_le_bytes(head[4..8].try_into().ok()?)) * 512;
    let mut chunks = Vec::new();
    let mut extra = None;
    while let Some((h, r)) = rest.split_at_checked(6) {
        let off = u32::from_le_bytes(h[..4].try_into().ok()?);
        let len = usize::from(u16::from_le_bytes([h[4], h[5]])).min(r.len());
        let (data, r) = r.split_at(len);
        rest = r;
        if off == OFF_DISK {
            extra = Some(data.to_vec());
            continue;
        }
        let at = u64::from(off) * 512;
        // Chunks past the end are cut, so reads see what the disk holds.
        let keep = size.saturating_sub(at).min(data.len() as u64) as usize;
        if keep > 0 && chunks.len() < MAX_CHUNKS {
            chunks.push((at, data[..keep].to_vec()));
        }
    }
    let head4 = [head[0], head[1], head[2], head[3]];
    Some((head4, Arc::new(SparseDev { size, chunks }), extra))
}

/// The input [`sparse_input`] reads back: `flags`, the disk's size in
/// sectors, the chunks (sector-aligned offsets), the off-disk chunk.
pub fn sparse_seed(
    flags: u8,
    sectors: u32,
    chunks: &[(u64, Vec<u8>)],
    extra: Option<&[u8]>,
) -> Vec<u8> {
    sparse_seed_head([flags, 0, 0, 0], sectors, chunks, extra)
}

/// [`sparse_seed`] with all four head bytes.
pub fn sparse_seed_head(
    head: [u8; 4],
    sectors: u32,
    chunks: &[(u64, Vec<u8>)],
    extra: Option<&[u8]>,
) -> Vec<u8> {
    let mut v = head.to_vec();
    v.extend_from_slice(&sectors.to_le_bytes());
    let mut put = |off: u32, data: &[u8]| {
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&(data.len() as u16).to_le_bytes());
        v.extend_from_slice(data);
    };
    for (at, data) in chunks {
        assert!(at % 512 == 0 && data.len() <= 0xffff, "chunk at {at}");
        put((at / 512) as u32, data);
    }
    if let Some(e) = extra {
        put(OFF_DISK, e);
    }
    v
}

/// The `bitlk` target: parse, dump, the table's segments (a partly
/// encrypted volume's map included), then the unlock through a clear key
/// or the startup key given off the disk.
pub fn bitlk(input: &[u8]) -> bool {
    let Some((head, dev, bek)) = sparse_input(input) else {
        return false;
    };
    bitlk_on(dev, head[0], bek.as_deref())
}

/// [`bitlk`] over any device; true if the metadata parsed.
pub fn bitlk_on(dev: Arc<dyn BlockDevice>, flags: u8, bek: Option<&[u8]>) -> bool {
    let sectors = dev.size() / 512;
    let disk = Disk::from_device(dev, "fuzz");
    let Ok(mut m) = bitlk::read(&disk) else {
        return false;
    };
    assert!(!m.dump_text("fuzz").is_empty());
    let _ = m.activation_refusal();
    let _ = m.segments(sectors);
    let _ = activate::bitlk_refusal(&m);
    let segs = activate::bitlk_segments(&m, &disk, sectors, flags & 0x01 == 0);
    let _ = bitlk_partial::layout(&m, &disk, sectors);
    // What would cost 2^20 SHA-256 rounds per input.
    m.vmks
        .retain(|v| !matches!(v.protection, Protection::Passphrase | Protection::Recovery));
    for secret in [None, bek] {
        let Ok(key) = m.volume_key(secret) else {
            continue;
        };
        let _ = activate::bitlk_check_cipher(&m, &key);
        if let Ok((s, _)) = &segs {
            let _ = activate::bitlk_layer(&m, &key, "fuzz", "/dev/fuzz", s, &[]);
        }
    }
    true
}

/// The `fvault2` target: parse over the sparse disk, dump, and the
/// passphrase `fuzz` under a capped PBKDF2; then the off-disk chunk as
/// plaintext metadata blocks.
pub fn fvault2(input: &[u8]) -> bool {
    let Some((_, dev, plain)) = sparse_input(input) else {
        return false;
    };
    let parsed = fvault2_on(dev);
    let blocks = plain.map(|b| fvault2::fuzz::parse_plain_blocks(&b));
    parsed || matches!(blocks, Some(Ok(true)))
}

/// [`fvault2`]'s disk part over any device; true if the metadata parsed.
pub fn fvault2_on(dev: Arc<dyn BlockDevice>) -> bool {
    let sectors = dev.size() / 512;
    let disk = Disk::from_device(dev, "fuzz");
    let Ok(m) = fvault2::read(&disk) else {
        return false;
    };
    let _ = m.dump_text("fuzz");
    if m.pbkdf2_iters <= MAX_FUZZ_ITERATIONS {
        if let Ok(key) = m.volume_key(b"fuzz") {
            let _ =
                activate::fvault2_layer(&m, &key[..], "fuzz", "/dev/fuzz", sectors, &[], "fuzz");
        }
    }
    true
}

/// The `tcrypt` target: `kdf`, `chain`, `flags` (the command line's
/// options), `size` (the header device's size in 64 KiB units), then a
/// decrypted header, parsed as that KDF and chain would have found it;
/// a parsed header is dumped and its table worked out. With flag 0x80 and
/// 192 more bytes, those are a header key that every chain tries on the
/// header's bytes as if encrypted.
pub fn tcrypt(input: &[u8]) -> bool {
    let [kdf, chain, flags, size, rest @ ..] = input else {
        return false;
    };
    let Some((plain, rest)) = rest.split_first_chunk::<{ tcrypt::fuzz::HEADER_LEN }>() else {
        return false;
    };
    let p = Params {
        veracrypt: flags & 0x01 != 0,
        hidden: flags & 0x02 != 0,
        system: flags & 0x04 != 0,
        backup: flags & 0x08 != 0,
        legacy: flags & 0x10 != 0,
        map_legacy: flags & 0x20 != 0,
        pim: u32::from(flags & 0x40 != 0) * 1234,
        ..Params::default()
    };
    if flags & 0x80 != 0 {
        if let Some(key) = rest.first_chunk::<{ tcrypt::fuzz::KEY_LEN }>() {
            let _ = tcrypt::fuzz::try_every_chain(key, plain, &p);
        }
    }
    let Ok(h) = tcrypt::fuzz::parse_plain(plain, usize::from(*kdf), usize::from(*chain)) else {
        return false;
    };
    let meta_size = (u64::from(*size) + 1) << 16;
    let _ = (h.cipher(), h.mode(), h.legacy_mode());
    assert_eq!(h.volume_key().len(), h.key_size());
    let _ = h.data_offset(&p, meta_size);
    let _ = h.iv_offset(&p, meta_size);
    let _ = h.size_sectors(&p);
    assert!(!h.dump_text("fuzz").is_empty());
    let _ = activate::tcrypt_refusal(&h, &p);
    if activate::tcrypt_check_ciphers(&h).is_ok() {
        let g = activate::TcryptGeometry {
            dev: "/dev/fuzz".into(),
            offset: h.data_offset(&p, meta_size),
            iv: h.iv_offset(&p, meta_size),
            size: h.size_sectors(&p),
        };
        let layers = activate::tcrypt_layers(&h, "fuzz", "/dev/fuzz", &g, &[]);
        assert!(!layers.is_empty(), "a header with no layer");
    }
    true
}

/// A seed for [`tcrypt`] from a decrypted header.
pub fn tcrypt_seed(kdf: usize, chain: usize, flags: u8, size: u8, plain: &[u8]) -> Vec<u8> {
    let mut v = vec![kdf as u8, chain as u8, flags, size];
    v.extend_from_slice(plain);
    v
}

/// An image file as a read-only device (for making seeds).
pub struct FileDev(pub std::fs::File, pub u64);

impl BlockDevice for FileDev {
    fn size(&self) -> u64 {
        self.1
    }
    fn limits(&self) -> Limits {
        Limits::default()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.0.read_exact_at(buf, offset).map_err(DevError::Io)
    }
    fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _: u64, _: u64) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
}

/// A device that remembers the byte ranges read from it (for making
/// seeds: the chunks a reader needs from a large image).
pub struct Recorder {
    pub inner: Arc<dyn BlockDevice>,
    pub reads: Mutex<Vec<(u64, u64)>>,
}

impl Recorder {
    /// The sectors read, merged, as chunks of at most 32 KiB with their
    /// trailing zero sectors left out.
    pub fn chunks(&self) -> Vec<(u64, Vec<u8>)> {
        let mut r: Vec<(u64, u64)> = self
            .reads
            .lock()
            .expect("reads")
            .iter()
            .map(|&(o, l)| (o / 512 * 512, (o + l).div_ceil(512) * 512))
            .collect();
        r.sort();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in r {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let mut out = Vec::new();
        for (s, e) in merged {
            let mut at = s;
            while at < e {
                let n = (e - at).min(32 << 10);
                let mut b = vec![0u8; n as usize];
                self.inner.read(at, &mut b).expect("read the image");
                let used = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                b.truncate(used.div_ceil(512) * 512);
                if !b.is_empty() {
                    out.push((at, b));
                }
                at += n;
            }
        }
        out
    }
}

impl BlockDevice for Recorder {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.reads
            .lock()
            .expect("reads")
            .push((offset, buf.len() as u64));
        self.inner.read(offset, buf)
    }
    fn write(&self, _: u64, _: WriteBuf<'_>, _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _: u64, _: u64) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }
}
