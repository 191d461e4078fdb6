//! The crypt target's write bounce pages (seed 000 integration): a borrowed
//! write, encrypted into mempool pages taken in one bulk call or one at a
//! time and written with `write_vectored`, must put on the device exactly
//! the bytes the in-place (owned) path puts there, for every sector size,
//! split and unsplit, and must leave the caller's buffer untouched.

use std::sync::Arc;

use udm::core::{BlockDevice, WriteBuf};
use udm::mem::mempool::set_bulk_bounce_default;
use udm::store::MemStore;
use udm::targets::{crypt, DeviceResolver, Target, TargetArgs, TargetOptions};

struct One(Arc<dyn BlockDevice>);
impl DeviceResolver for One {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if spec == "dev" {
            Ok(self.0.clone())
        } else {
            Err(format!("no device '{spec}'"))
        }
    }
}

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
const SIZE: u64 = 8 << 20;

fn target(opts: &str, threads: usize) -> (Arc<dyn Target>, Arc<MemStore>) {
    // Not direct access: over a direct store a borrowed write needs no
    // bounce pages at all, and this test is about them.
    let store = Arc::new(MemStore::without_direct_access(SIZE + (1 << 20)));
    let line = format!("aes-xts-plain64 {KEY} 24 dev 2048 {opts}");
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    let t = crypt::new(TargetArgs {
        args: &args,
        len: SIZE,
        resolver: &mut One(store.clone()),
        options: &TargetOptions {
            crypt_threads: threads,
            ..Default::default()
        },
    })
    .expect("crypt table");
    (t, store)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn raw(store: &MemStore) -> Vec<u8> {
    let mut v = vec![0u8; (SIZE + (1 << 20)) as usize];
    store.read(0, &mut v).unwrap();
    v
}

#[test]
fn borrowed_writes_through_bounce_pages_match_in_place_encryption() {
    // (options, write offset, length): sector sizes 512 and 4096, lengths
    // below one page, not a multiple of a page, over the split threshold
    // and over the 1 MiB bounce piece (several pieces).
    let cases = [
        ("", 512u64, 1536usize),
        ("", 4096, 64 << 10),
        ("", 3 * 512, (1 << 20) + 1536),
        ("", 0, (3 << 20) + 4096),
        (
            "2 sector_size:4096 iv_large_sectors",
            8192,
            (2 << 20) + 8192,
        ),
        ("1 sector_size:4096", 4096, 4096),
        ("1 no_write_workqueue", 512, (1 << 20) + 512),
    ];
    for (opts, off, len) in cases {
        let data = pattern(len, off as u8);
        let mut results = Vec::new();
        for mode in ["owned", "bulk", "each"] {
            set_bulk_bounce_default(mode != "each");
            let (t, store) = target(opts, 2);
            let mut copy = data.clone();
            match mode {
                "owned" => t.write(off, WriteBuf::Owned(&mut copy), false).unwrap(),
                _ => {
                    t.write(off, WriteBuf::Borrowed(&copy), true).unwrap();
                    assert!(copy == data, "{mode}: borrowed buffer was modified");
                }
            }
            let mut back = vec![0u8; len];
            t.read(off, &mut back).unwrap();
            assert!(
                back == data,
                "{mode} {opts:?} {off}+{len}: read back differs"
            );
            results.push((mode, raw(&store)));
        }
        set_bulk_bounce_default(true);
        let (_, want) = &results[0];
        assert!(want.iter().any(|&b| b != 0));
        for (mode, got) in &results[1..] {
            assert!(
                got == want,
                "{mode} {opts:?} {off}+{len}: device bytes differ from in-place encryption"
            );
        }
    }
}

/// Several threads doing borrowed 1 MiB writes at once share the page pool
/// (reserve 256 pages): all complete and all data is right.
#[test]
fn concurrent_borrowed_writes_complete() {
    let (t, _store) = target("", 2);
    let hs: Vec<_> = (0..4u8)
        .map(|k| {
            let t = t.clone();
            std::thread::spawn(move || {
                let data = pattern(1 << 20, k);
                for r in 0..8u64 {
                    let off = u64::from(k) * (2 << 20) + (r % 2) * (1 << 20);
                    t.write(off, WriteBuf::Borrowed(&data), false).unwrap();
                }
                data
            })
        })
        .collect();
    for (k, h) in hs.into_iter().enumerate() {
        let data = h.join().unwrap();
        let mut back = vec![0u8; 1 << 20];
        t.read(k as u64 * (2 << 20), &mut back).unwrap();
        assert!(back == data, "writer {k}'s data differs");
    }
}
