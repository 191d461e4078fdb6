//! Constructor, table output and I/O tests of the crypt target.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::io::Cipher;
use super::{construct, new};
use crate::core::device::{submit_and_wait, Transform};
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::crypto::SectorCrypt;
use crate::store::MemStore;
use crate::targets::{DeviceResolver, TargetOptions};
use crate::targets::{Target, TargetArgs, TargetError};

struct One(Arc<dyn BlockDevice>);
impl DeviceResolver for One {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if spec == "mem" {
            Ok(self.0.clone())
        } else {
            Err(format!("no device '{spec}'"))
        }
    }
}

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn build(line: &str, len: u64, threads: usize) -> Result<Arc<dyn Target>, TargetError> {
    let store: Arc<dyn BlockDevice> = Arc::new(MemStore::new(8 << 20));
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    new(TargetArgs {
        args: &args,
        len,
        resolver: &mut One(store),
        options: &TargetOptions {
            crypt_threads: threads,
            ..Default::default()
        },
    })
}

#[test]
fn table_output_is_canonical_and_hides_the_key() {
    let t = build(
        &format!(
            "aes-xts-plain64 {KEY} 16 mem 8 6 iv_large_sectors SECTOR_SIZE:4096 no_write_workqueue allow_discards same_cpu_crypt high_priority"
        ),
        1 << 20,
        1,
    )
    .unwrap();
    let shown = t.table_params(true);
    let hidden = t.table_params(false);
    // Sized exactly before the key went in: it never grew, so no freed
    // buffer held the key (F6).
    assert_eq!(
        shown.capacity(),
        shown.len(),
        "the key line was reallocated"
    );
    assert_eq!(
        shown,
        format!("aes-xts-plain64 {KEY} 16 mem 8 6 allow_discards same_cpu_crypt high_priority no_write_workqueue sector_size:4096 iv_large_sectors")
    );
    assert_eq!(hidden, shown.replace(KEY, &"0".repeat(128)));
    let plain = build(
        &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:512"),
        1 << 20,
        1,
    )
    .unwrap();
    assert_eq!(
        plain.table_params(false),
        format!("aes-xts-plain64 {} 0 mem 0", "0".repeat(128))
    );
    let null = build("cipher_null-ecb - 0 mem 0", 1 << 20, 1).unwrap();
    assert_eq!(null.table_params(true), "cipher_null-ecb - 0 mem 0");
}

#[test]
fn constructor_errors_name_the_argument() {
    for (line, arg, word) in [
        ("aes-xts-plain64 zz 0 mem 0", Some(1), "hexadecimal"),
        ("aes-xts-plain64 :64:logon:foo 0 mem 0", Some(1), "keyring"),
        (
            &format!("aes-xts-plain64 {KEY} x mem 0") as &str,
            Some(2),
            "decimal",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 1 mem 0 1 sector_size:4096"),
            Some(2),
            "multiple",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 1 1 sector_size:4096"),
            Some(4),
            "multiple",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:1000"),
            Some(6),
            "sector_size",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 0 1 bogus"),
            Some(6),
            "bogus",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 0 2 allow_discards"),
            Some(5),
            "announced",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 0 10"),
            Some(5),
            "0 to 9",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 0 1 integrity:28:aead"),
            Some(0),
            "not an AEAD",
        ),
        (
            &format!("capi:gcm(aes)-random {KEY} 0 mem 0"),
            Some(0),
            "integrity:<bytes>:aead",
        ),
        (
            &format!("capi:gcm(aes)-random {KEY} 0 mem 0 1 integrity:0:aead"),
            Some(6),
            "1 to 480",
        ),
        (
            &format!("capi:gcm(aes)-random {KEY} 0 mem 0 1 integrity:28:hmac"),
            Some(6),
            "unknown integrity profile",
        ),
        (
            &format!("aes-cbc-random {KEY} 0 mem 0 1 integrity:16:none"),
            Some(6),
            "not supported",
        ),
        (
            &format!("aes-cbc-random {KEY} 0 mem 0"),
            Some(0),
            "dm-integrity",
        ),
        (&format!("aes-cbc-lmk {KEY} 0 mem 0"), Some(1), "512-bit"),
        (
            &format!("aes-xts-plain64 {KEY} 0 nodev 0"),
            Some(3),
            "nodev",
        ),
        (
            &format!("aes-xts-plain64 {KEY} 0 mem 99999999"),
            Some(4),
            "does not fit",
        ),
        ("aes-xts-plain64 - 0 mem 0", Some(1), "key"),
        (&format!("aes-xts-plain64 {KEY} 0 mem"), None, "at least 5"),
    ] {
        let e = build(line, 1 << 20, 1)
            .err()
            .unwrap_or_else(|| panic!("accepted: {line}"));
        assert_eq!(e.arg, arg, "{line}: {}", e.msg);
        assert!(e.msg.contains(word), "{line}: {}", e.msg);
        assert!(!e.msg.contains("0102030405"), "key leaked: {}", e.msg);
    }
    let e = build(
        &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:4096"),
        512 * 9,
        1,
    )
    .err()
    .unwrap();
    assert!(e.msg.contains("not a multiple of sector_size"), "{}", e.msg);
}

#[test]
fn io_round_trip_alignment_discard_and_zeroes() {
    for threads in [1usize, 3] {
        let t = build(
            &format!("aes-xts-plain64 {KEY} 0 mem 0 1 sector_size:4096"),
            4 << 20,
            threads,
        )
        .unwrap();
        assert_eq!(t.limits().logical_block_size, 4096);
        assert!(!t.limits().discard);
        let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
        t.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
        let mut owned = data.clone();
        t.write(2 << 20, WriteBuf::Owned(&mut owned), true).unwrap();
        for at in [4096u64, 2 << 20] {
            let mut back = vec![0u8; data.len()];
            t.read(at, &mut back).unwrap();
            assert!(back == data, "threads {threads} at {at}");
        }
        assert!(matches!(
            t.read(512, &mut [0u8; 4096]),
            Err(DevError::Misaligned { .. })
        ));
        assert!(matches!(t.discard(0, 4096), Err(DevError::NotSupported(_))));
        t.write_zeroes(4096, 8192, false).unwrap();
        let mut z = vec![1u8; 8192];
        t.read(4096, &mut z).unwrap();
        assert!(z.iter().all(|&b| b == 0));
        t.flush().unwrap();
    }
}

/// Forwards to a store and counts the plain data calls, to show which
/// path the target took.
struct Spy(MemStore, std::sync::atomic::AtomicUsize);
impl BlockDevice for Spy {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn limits(&self) -> Limits {
        self.0.limits()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.write(offset, data, fua)
    }
    fn write_vectored(
        &self,
        offset: u64,
        bufs: &[std::io::IoSlice<'_>],
        fua: bool,
    ) -> DevResult<()> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.write_vectored(offset, bufs, fua)
    }
    fn direct_access(&self) -> bool {
        self.0.direct_access()
    }
    fn read_transformed(&self, offset: u64, buf: &mut [u8], t: &dyn Transform) -> DevResult<()> {
        self.0.read_transformed(offset, buf, t)
    }
    fn write_transformed(
        &self,
        offset: u64,
        src: &[u8],
        fua: bool,
        t: &dyn Transform,
    ) -> DevResult<()> {
        self.0.write_transformed(offset, src, fua, t)
    }
    fn flush(&self) -> DevResult<()> {
        self.0.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.0.write_zeroes(offset, len, fua)
    }
}

/// The direct path (cipher straight into / out of the store) must put
/// on the store exactly the bytes the copying path puts there, and read
/// them back, for every cipher family, sector size, iv_offset, thread
/// count, buffer ownership, and requests across the store's regions.
#[test]
fn direct_access_stores_the_same_bytes_as_the_copying_path() {
    const STORE: u64 = 3 << 20;
    const LEN: u64 = (3 << 20) - 8192;
    let keys = |n: usize| -> String { (0..n).map(|i| format!("{:02x}", i * 37 % 256)).collect() };
    for (spec, klen) in [
        ("aes-xts-plain64", 64),
        ("aes-xts-plain64", 32),
        ("aes-cbc-essiv:sha256", 32),
        ("serpent-xts-plain64", 64),
        ("twofish-cbc-plain64be", 32),
        ("aes:4-cbc-plain", 64),
    ] {
        for ss in [512u32, 4096] {
            for iv_offset in [0u64, 24] {
                for threads in [1usize, 2] {
                    let line = format!(
                        "{spec} {} {iv_offset} mem 16 1 sector_size:{ss}",
                        keys(klen)
                    );
                    let direct = Arc::new(Spy(MemStore::new(STORE), Default::default()));
                    let copying = Arc::new(MemStore::without_direct_access(STORE));
                    let mk = |d: Arc<dyn BlockDevice>| {
                        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
                        new(TargetArgs {
                            args: &args,
                            len: LEN,
                            resolver: &mut One(d),
                            options: &TargetOptions {
                                crypt_threads: threads,
                                ..Default::default()
                            },
                        })
                        .unwrap()
                    };
                    let (td, tc) = (mk(direct.clone()), mk(copying.clone()));
                    let what = format!("{spec} ss {ss} iv_offset {iv_offset} threads {threads}");
                    let data: Vec<u8> = (0..LEN as usize)
                        .map(|i| (i * 7 + i / 4099) as u8)
                        .collect();
                    // (offset, length, owned): whole device, pieces over
                    // region boundaries, a small one.
                    for (off, len, owned) in [
                        (0usize, LEN as usize, true),
                        (60 << 10, 200 << 10, false),
                        ((1 << 20) - 4096, (1 << 20) + 8192, false),
                        (8192, 4096, true),
                        ((2 << 20) + 4096, 300 << 10, true),
                    ] {
                        for t in [&td, &tc] {
                            let src = data[off..off + len].to_vec();
                            let mut own = src.clone();
                            if owned {
                                t.write(off as u64, WriteBuf::Owned(&mut own), false)
                                    .unwrap();
                            } else {
                                t.write(off as u64, WriteBuf::Borrowed(&own), false)
                                    .unwrap();
                                assert!(own == src, "{what}: borrowed buffer modified");
                            }
                            let mut back = vec![0u8; len];
                            t.read(off as u64, &mut back).unwrap();
                            assert!(back == src, "{what}: read back at {off}+{len}");
                        }
                        let (mut a, mut b) = (vec![0u8; STORE as usize], vec![0u8; STORE as usize]);
                        direct.0.read(0, &mut a).unwrap();
                        copying.read(0, &mut b).unwrap();
                        assert!(a == b, "{what}: stores differ after {off}+{len}");
                    }
                    assert_eq!(
                        direct.1.load(Ordering::Relaxed),
                        0,
                        "{what}: the direct store saw plain reads or writes"
                    );
                }
            }
        }
    }
}

#[test]
fn cipher_transform_refuses_partial_sectors() {
    let key = hex::decode(KEY).unwrap();
    let sc = SectorCrypt::new("aes-xts-plain64", &key, 4096, false).unwrap();
    let t = Cipher {
        sc: &sc,
        first: 0,
        encrypt: true,
    };
    let src = vec![0u8; 8192];
    let mut dst = vec![0u8; 8192];
    assert!(t.apply(512, &src[..4096], &mut dst[..4096]).is_err());
    assert!(t.apply(0, &src[..1024], &mut dst[..1024]).is_err());
    assert!(t.apply(0, &src, &mut dst[..4096]).is_err());
    assert!(t.apply_in_place(4096, &mut dst[..100]).is_err());
    // A piece at 4096 is the sector with cc_sector 8.
    t.apply(4096, &src[..4096], &mut dst[..4096]).unwrap();
    let mut want = vec![0u8; 4096];
    sc.encrypt(&mut want, 8);
    assert_eq!(dst[..4096], want[..]);
}

/// A memory device that says it waits on a network (a queue depth) and
/// records which threads called it, and for writes whether the buffer
/// came owned and where it lay.
/// An `aes-xts-plain64` crypt target over `dev` (`len` bytes) with
/// `threads` crypto threads.
fn xts_over(dev: Arc<dyn BlockDevice>, len: u64, threads: usize) -> super::Crypt {
    let args: Vec<String> = format!("aes-xts-plain64 {KEY} 0 mem 0")
        .split_whitespace()
        .map(String::from)
        .collect();
    construct(TargetArgs {
        args: &args,
        len,
        resolver: &mut One(dev),
        options: &TargetOptions {
            crypt_threads: threads,
            ..Default::default()
        },
    })
    .unwrap()
}

struct Remote {
    inner: MemStore,
    /// Takes submissions (and declines them all), saying it runs a
    /// write's deferred step when `Some(true)`; `None`: no submissions.
    declines: Option<bool>,
    threads: std::sync::Mutex<Vec<std::thread::ThreadId>>,
    writes: std::sync::Mutex<Vec<(bool, usize)>>,
}

impl BlockDevice for Remote {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        Limits {
            queue_depth: 64,
            ..self.inner.limits()
        }
    }
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        self.writes.lock().unwrap().push((
            matches!(d, WriteBuf::Owned(_)),
            d.as_slice().as_ptr() as usize,
        ));
        self.inner.write(o, d, f)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, o: u64, l: u64) -> DevResult<()> {
        self.inner.discard(o, l)
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool) -> DevResult<()> {
        self.inner.write_zeroes(o, l, f)
    }
    fn can_submit(&self) -> bool {
        self.declines.is_some()
    }
    fn takes_prepare(&self) -> bool {
        self.declines == Some(true)
    }
    unsafe fn submit(&self, io: crate::core::AsyncIo) {
        io.decline()
    }
}

impl Remote {
    fn new(size: u64, declines: Option<bool>) -> Remote {
        Remote {
            inner: MemStore::new(size),
            declines,
            threads: std::sync::Mutex::new(Vec::new()),
            writes: std::sync::Mutex::new(Vec::new()),
        }
    }
}

/// Over a device with a queue depth (a disk file, RBD, a remote NBD
/// export) only a large request's cipher work is split over the crypto
/// threads: its I/O stays on the calling thread, one call per request
/// (no crypto thread waits on the device), an owned write goes down in
/// its own buffer, and the bytes stored are those of one thread's
/// encryption (a one-thread target reads them back).
#[test]
fn over_a_device_that_waits_only_the_cipher_is_split() {
    let dev = Arc::new(Remote::new(8 << 20, None));
    let t = xts_over(dev.clone(), 8 << 20, 4);
    assert_eq!(
        t.limits().queue_depth,
        64,
        "the depth stacks up through crypt"
    );
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut buf = data.clone();
    t.write(0, WriteBuf::Owned(&mut buf), false).unwrap();
    // An owned write is encrypted in place and passed down as it is: no
    // bounce buffer, no copy.
    assert_eq!(
        *dev.writes.lock().unwrap(),
        vec![(true, buf.as_ptr() as usize)],
        "the caller's buffer, owned, encrypted in place"
    );
    assert!(buf != data, "encrypted in place");
    let mut back = vec![0u8; 4 << 20];
    t.read(0, &mut back).unwrap();
    assert!(back == data);
    let me = std::thread::current().id();
    let calls = dev.threads.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "one lower call per 4 MiB request");
    assert!(
        calls.iter().all(|&c| c == me),
        "lower I/O on the caller's thread"
    );
    let pool = t.pool.get().and_then(|p| p.as_ref());
    assert_eq!(pool.map(|p| p.parallelism()), Some(4), "the cipher split");
    let one = xts_over(dev.clone(), 8 << 20, 1);
    back.fill(0);
    one.read(0, &mut back).unwrap();
    assert!(back == data, "split encryption stores one thread's bytes");
}

/// Over a local device the helper threads are started by the first
/// request large enough to be split, not before, and serve it.
#[test]
fn helper_threads_start_with_the_first_split_request() {
    let store: Arc<dyn BlockDevice> = Arc::new(MemStore::new(8 << 20));
    let t = xts_over(store, 8 << 20, 4);
    assert!(t.pool.get().is_none(), "nothing started at construction");
    let small = vec![7u8; 4096];
    t.write(0, WriteBuf::Borrowed(&small), false).unwrap();
    assert!(t.pool.get().is_none(), "a 4 KiB write is never split");
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    t.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
    let pool = t.pool.get().and_then(|p| p.as_ref());
    assert_eq!(pool.map(|p| p.parallelism()), Some(4), "started for 4 MiB");
    let mut back = vec![0u8; 4 << 20];
    t.read(4096, &mut back).unwrap();
    assert!(back == data);
}

/// dm-crypt's `key wipe` / `key set`: refused unless suspended; a wiped
/// key prints as zeros, fails I/O and refuses resume; a key of another
/// length is refused; the right key makes the old data readable again.
#[test]
fn key_wipe_and_set_only_while_suspended() {
    let t = build(&format!("aes-xts-plain64 {KEY} 0 mem 0"), 1 << 20, 1).unwrap();
    let w = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
    let data = vec![0x5au8; 8192];
    t.write(4096, WriteBuf::Borrowed(&data), false).unwrap();
    let e = t.message(&w("key wipe")).unwrap_err();
    assert!(e.contains("suspended"), "{e}");
    assert!(t.message(&w("key")).is_err());
    t.postsuspend();
    assert!(t.message(&w("key frobnicate")).is_err());
    t.message(&w("key wipe")).unwrap();
    assert_eq!(
        t.table_params(true),
        format!("aes-xts-plain64 {} 0 mem 0", "0".repeat(128))
    );
    let mut buf = vec![0u8; 8192];
    assert!(t.read(4096, &mut buf).is_err(), "I/O with a wiped key");
    assert!(t.preresume().unwrap_err().contains("not set"));
    let short = &KEY[..64];
    let e = t.message(&w(&format!("key set {short}"))).unwrap_err();
    assert!(e.contains("may not change") && !e.contains(short), "{e}");
    assert!(t.message(&w("key set zz")).is_err());
    t.message(&w(&format!("KEY SET {KEY}"))).unwrap();
    t.preresume().unwrap();
    t.resume();
    assert!(t.message(&w(&format!("key set {KEY}"))).is_err());
    t.read(4096, &mut buf).unwrap();
    assert_eq!(buf, data);
    assert_eq!(
        t.table_params(true),
        format!("aes-xts-plain64 {KEY} 0 mem 0")
    );
}

/// The cipher specs of old and foreign volumes work as table lines: what
/// the target stores is exactly `SectorCrypt`'s bytes for the same spec,
/// key and sectors (iv_offset added), split over helper threads or not.
#[test]
fn legacy_and_foreign_cipher_specs_as_table_lines() {
    for (spec, klen) in [
        ("aes-lrw-benbi", 48),
        ("aes-lrw-plain64", 32),
        ("camellia-xts-plain64", 64),
        ("cast5-cbc-plain64", 16),
        ("blowfish-cbc-essiv:sha256", 32),
        ("aes-xts-essiv:wp256", 64),
        ("serpent-cbc-tcw", 64),
        ("aes-cbc-elephant", 64),
        ("aes:64-cbc-lmk", 65 * 32),
    ] {
        let key: Vec<u8> = (0..klen).map(|i| (i * 31 + 7) as u8).collect();
        let hexkey = hex::encode(&key);
        let store = Arc::new(MemStore::new(8 << 20));
        let dev: Arc<dyn BlockDevice> = store.clone();
        let args: Vec<String> = format!("{spec} {hexkey} 24 mem 16")
            .split_whitespace()
            .map(String::from)
            .collect();
        let t = new(TargetArgs {
            args: &args,
            len: 4 << 20,
            resolver: &mut One(dev),
            options: &TargetOptions {
                crypt_threads: 3,
                ..Default::default()
            },
        })
        .unwrap_or_else(|e| panic!("{spec}: {e:?}"));
        let data: Vec<u8> = (0..(512 << 10)).map(|i| (i % 253) as u8).collect();
        t.write(1 << 20, WriteBuf::Borrowed(&data), false).unwrap();
        let mut back = vec![0u8; data.len()];
        t.read(1 << 20, &mut back).unwrap();
        assert!(back == data, "{spec}: read back");
        let mut raw = vec![0u8; data.len()];
        store.read((16 << 9) + (1 << 20), &mut raw).unwrap();
        let sc = SectorCrypt::new(spec, &key, 512, false).unwrap();
        let mut want = data.clone();
        sc.encrypt(&mut want, 24 + ((1 << 20) >> 9));
        assert!(raw == want, "{spec}: stored bytes");
    }
}

/// Submitted 1 MiB requests over a file on a disk filesystem through
/// io_uring: the cipher is cut over the crypto threads (the helpers
/// start), a write is encrypted in place before its one ring entry, and
/// a submitted read completes decrypted.
#[test]
fn submitted_large_requests_split_the_cipher_over_a_ring() {
    use crate::store::{FileIo, FileStore, OpenFlags};
    let tmp = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
    tmp.as_file().set_len(8 << 20).unwrap();
    let file = FileStore::open_with(tmp.path(), OpenFlags::default(), FileIo::Uring).unwrap();
    assert_eq!(
        file.io_path(),
        "uring",
        "/var/tmp must be a disk filesystem"
    );
    let t = xts_over(Arc::new(file), 8 << 20, 4);
    assert!(t.can_submit());
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 241) as u8).collect();
    let run = |write: bool, buf: &mut Vec<u8>| {
        submit_and_wait(&t, write, 1 << 20, buf, None).map(|r| r.is_ok())
    };
    let mut buf = data.clone();
    assert_eq!(run(true, &mut buf), Some(true));
    assert!(buf != data, "encrypted in place");
    // The stored bytes are the cipher's, whichever thread ran it (on
    // ext4 the store's writer thread: the write's deferred step).
    let mut raw = vec![0u8; 1 << 20];
    tmp.as_file().read_exact_at(&mut raw, 1 << 20).unwrap();
    let key = hex::decode(KEY).unwrap();
    let sc = SectorCrypt::new("aes-xts-plain64", &key, 512, false).unwrap();
    let mut want = data.clone();
    sc.encrypt(&mut want, (1 << 20) >> 9);
    assert!(raw == want, "stored ciphertext");
    let mut back = vec![0u8; 1 << 20];
    assert_eq!(run(false, &mut back), Some(true));
    assert!(back == data, "decrypted in the completion");
    let pool = t.pool.get().and_then(|p| p.as_ref());
    assert_eq!(pool.map(|p| p.parallelism()), Some(4), "the cipher split");
}

/// A submitted write the device below declines comes back as plaintext
/// for the synchronous retry, whether it was encrypted before going down
/// (and so is decrypted again) or its encryption was left to the device
/// (and so never ran): never encrypted twice, never decrypted unencrypted.
#[test]
fn a_declined_write_comes_back_as_plaintext() {
    for takes in [false, true] {
        let dev = Arc::new(Remote::new(4 << 20, Some(takes)));
        let t = xts_over(dev, 4 << 20, 2);
        for len in [4096usize, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i % 239) as u8).collect();
            let mut buf = data.clone();
            let r = submit_and_wait(&t, true, 0, &mut buf, None);
            assert!(r.is_none(), "declined (takes {takes}, {len})");
            assert!(buf == data, "plaintext again (takes {takes}, {len})");
        }
    }
}
