//! The authenticated crypt path over a small in-memory tagged device: data
//! and tags go down together, a changed byte (data or tag) fails only the
//! requests that read its sector, and the line prints as the kernel's.

use std::sync::{Arc, Mutex};

use super::new;
use crate::core::device::TagLayout;
use crate::core::{BlockDevice, DevResult, Limits, WriteBuf};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, Target, TargetArgs, TargetOptions};

/// Data in a [`MemStore`], `tag` bytes per 512-byte sector beside it.
struct TaggedMem {
    data: MemStore,
    tags: Mutex<Vec<u8>>,
    tag: usize,
}

impl TaggedMem {
    fn new(size: u64, tag: usize) -> TaggedMem {
        TaggedMem {
            data: MemStore::new(size),
            tags: Mutex::new(vec![0; (size / 512) as usize * tag]),
            tag,
        }
    }
    fn flip_data(&self, at: u64) {
        let mut b = [0u8; 512];
        let s = at / 512 * 512;
        self.data.read(s, &mut b).expect("read");
        b[(at - s) as usize] ^= 1;
        self.data
            .write(s, WriteBuf::Borrowed(&b), false)
            .expect("write");
    }
}

impl BlockDevice for TaggedMem {
    fn size(&self) -> u64 {
        self.data.size()
    }
    fn limits(&self) -> Limits {
        self.data.limits()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.data.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.data.write(offset, data, fua)
    }
    fn tag_layout(&self) -> Option<TagLayout> {
        Some(TagLayout {
            sector_size: 512,
            tag_size: self.tag as u32,
        })
    }
    fn read_tagged(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> DevResult<()> {
        self.data.read(offset, buf)?;
        let at = (offset / 512) as usize * self.tag;
        tags.copy_from_slice(&self.tags.lock().unwrap()[at..at + tags.len()]);
        Ok(())
    }
    fn write_tagged(&self, offset: u64, data: &[u8], tags: &[u8], fua: bool) -> DevResult<()> {
        self.data.write(offset, WriteBuf::Borrowed(data), fua)?;
        let at = (offset / 512) as usize * self.tag;
        self.tags.lock().unwrap()[at..at + tags.len()].copy_from_slice(tags);
        Ok(())
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.data.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.data.write_zeroes(offset, len, fua)
    }
}

struct One(Arc<dyn BlockDevice>);
impl DeviceResolver for One {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        (spec == "dif")
            .then(|| self.0.clone())
            .ok_or_else(|| format!("no device '{spec}'"))
    }
}

fn build(line: &str, dev: Arc<dyn BlockDevice>, threads: usize) -> Arc<dyn Target> {
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    new(TargetArgs {
        args: &args,
        len: dev.size(),
        resolver: &mut One(dev),
        options: &TargetOptions {
            crypt_threads: threads,
            ..Default::default()
        },
    })
    .unwrap_or_else(|e| panic!("{line}: {}", e.msg))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// Write, read back, flip one data byte and one tag byte: each fails only
/// its own sector's reads, with EIO.
fn round_trip_and_tamper(cipher: &str, key_bytes: usize, tuple: usize, threads: usize) {
    let dev = Arc::new(TaggedMem::new(1 << 20, tuple));
    let key = "5a".repeat(key_bytes);
    let t = build(
        &format!("{cipher} {key} 0 dif 0 1 integrity:{tuple}:aead"),
        dev.clone(),
        threads,
    );
    let data = pattern(256 << 10);
    t.write(4096, WriteBuf::Borrowed(&data), false)
        .expect("write");
    let mut owned = pattern(8192);
    t.write(512 << 10, WriteBuf::Owned(&mut owned), false)
        .expect("owned write");
    let mut back = vec![0u8; data.len()];
    t.read(4096, &mut back).expect("read");
    assert_eq!(back, data, "{cipher}");
    let mut raw = vec![0u8; 512];
    dev.data.read(4096, &mut raw).expect("raw");
    assert_ne!(raw, data[..512], "{cipher}: stored encrypted");
    // A data byte of sector 20 (target offset 10240).
    dev.flip_data(10240 + 7);
    let mut s = [0u8; 512];
    let e = t.read(10240, &mut s).expect_err("tampered sector");
    assert_eq!(e.nbd_errno(false), 5, "{cipher}: EIO, got {e}");
    assert!(e.to_string().contains("sector 20"), "{e}");
    t.read(10240 - 512, &mut s).expect("the sector before");
    t.read(10240 + 512, &mut s).expect("the sector after");
    assert!(t.read(4096, &mut back).is_err(), "a read across it fails");
    // A tag byte of sector 30.
    dev.tags.lock().unwrap()[30 * tuple + 3] ^= 0x40;
    assert_eq!(
        t.read(30 * 512, &mut s).expect_err("tag").nbd_errno(false),
        5
    );
    // Rewriting a sector makes it good again.
    t.write(10240, WriteBuf::Borrowed(&data[..512]), false)
        .expect("rewrite");
    t.read(10240, &mut s).expect("rewritten");
    assert_eq!(&s[..], &data[..512]);
}

#[test]
fn gcm_random_round_trips_and_fails_tampered_sectors_only() {
    round_trip_and_tamper("capi:gcm(aes)-random", 32, 28, 1);
    round_trip_and_tamper("aes-gcm-random", 16, 28, 3);
}

#[test]
fn chacha20_poly1305_round_trips_and_fails_tampered_sectors_only() {
    round_trip_and_tamper("capi:rfc7539(chacha20,poly1305)-random", 32, 28, 3);
}

#[test]
fn xts_hmac_round_trips_and_fails_tampered_sectors_only() {
    round_trip_and_tamper("capi:authenc(hmac(sha256),xts(aes))-random", 96, 48, 3);
    round_trip_and_tamper("capi:authenc(hmac(sha512),xts(aes))-plain64", 128, 64, 1);
}

#[test]
fn table_prints_integrity_in_the_kernels_place() {
    let dev = Arc::new(TaggedMem::new(1 << 20, 28));
    let key = "5a".repeat(32);
    let t = build(
        &format!(
            "capi:gcm(aes)-random {key} 0 dif 0 3 iv_large_sectors allow_discards integrity:28:AEAD"
        ),
        dev,
        1,
    );
    assert_eq!(
        t.table_params(false),
        format!(
            "capi:gcm(aes)-random {} 0 dif 0 3 allow_discards integrity:28:aead iv_large_sectors",
            "0".repeat(64)
        )
    );
}

#[test]
fn a_device_without_tags_or_with_too_few_is_refused() {
    let key = "5a".repeat(32);
    let line = format!("capi:gcm(aes)-random {key} 0 dif 0 1 integrity:28:aead");
    let plain: Arc<dyn BlockDevice> = Arc::new(MemStore::new(1 << 20));
    let t = build(&line, plain, 1);
    let mut s = [0u8; 512];
    let e = t.read(0, &mut s).expect_err("no tags below");
    assert!(e.to_string().contains("integrity device"), "{e}");
    let narrow: Arc<dyn BlockDevice> = Arc::new(TaggedMem::new(1 << 20, 16));
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    let e = new(TargetArgs {
        args: &args,
        len: 1 << 20,
        resolver: &mut One(narrow),
        options: &TargetOptions::default(),
    })
    .err()
    .expect("tag area too small");
    assert!(e.msg.contains("16 tag bytes"), "{}", e.msg);
}
