//! The three snapshot targets over in-memory devices: what a snapshot
//! reads while its origin changes, writes to it, overflow in both modes,
//! persistence across a rebuild, the merge, and the constructor's errors.
//! Device names carry the test's name: the origin registry is per process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::{DeviceResolver, EventHook, Target, TargetArgs, TargetError, TargetOptions};

struct Mem(HashMap<String, Arc<MemStore>>);

impl DeviceResolver for Mem {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        self.0
            .get(spec)
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .ok_or_else(|| format!("no device {spec}"))
    }
}

/// `@T-o` (origin, 1 MiB of a pattern) and `@T-c` (COW, `cow` bytes).
fn devices(t: &str, cow: u64) -> Mem {
    let o = Arc::new(MemStore::new(1 << 20));
    let pat: Vec<u8> = (0..1 << 20).map(|i: u32| (i / 4096) as u8).collect();
    o.write(0, WriteBuf::Borrowed(&pat), false).unwrap();
    let mut m = HashMap::new();
    m.insert(format!("@{t}-o"), o);
    m.insert(format!("@{t}-c"), Arc::new(MemStore::new(cow)));
    Mem(m)
}

fn build_with(
    ty: &str,
    args: &str,
    mem: &mut Mem,
    options: &TargetOptions,
) -> Result<Arc<dyn Target>, TargetError> {
    let ty = crate::targets::lookup(ty).expect("target type");
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    (ty.new)(TargetArgs {
        args: &args,
        len: 1 << 20,
        resolver: mem,
        options,
    })
}

fn build(ty: &str, args: &str, mem: &mut Mem) -> Arc<dyn Target> {
    build_with(ty, args, mem, &TargetOptions::default()).unwrap()
}

fn read(d: &dyn BlockDevice, off: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    d.read(off, &mut b).unwrap();
    b
}

fn write(d: &dyn BlockDevice, off: u64, byte: u8, n: usize) {
    d.write(off, WriteBuf::Borrowed(&vec![byte; n]), false)
        .unwrap();
}

#[test]
fn a_snapshot_keeps_the_old_data_while_the_origin_changes() {
    for store in ["P", "N"] {
        let t = format!("keep{store}");
        let mut m = devices(&t, 1 << 20);
        let snap = build("snapshot", &format!("@{t}-o @{t}-c {store} 8"), &mut m);
        let origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
        let before = read(snap.as_ref(), 0, 1 << 20);
        // Unaligned, across a chunk boundary.
        write(origin.as_ref(), 4096 - 512, 0xee, 8192);
        write(origin.as_ref(), 4096 - 512, 0xdd, 1024);
        assert_eq!(read(snap.as_ref(), 0, 1 << 20), before, "{store}");
        assert_eq!(read(origin.as_ref(), 4096, 512), vec![0xdd; 512]);
        // Chunks 0, 1, 2 copied.
        let want = if store == "P" {
            "40/2048 16"
        } else {
            "24/2048 0"
        };
        assert_eq!(snap.status(), want);
        assert_eq!(snap.table_params(false), format!("@{t}-o @{t}-c {store} 8"));
        assert_eq!(origin.table_params(false), format!("@{t}-o"));
    }
}

#[test]
fn writes_to_the_snapshot_stay_there() {
    let t = "swrite";
    let mut m = devices(t, 1 << 20);
    let snap = build("snapshot", &format!("@{t}-o @{t}-c P 8"), &mut m);
    let origin_before = read(m.0[&format!("@{t}-o")].as_ref(), 0, 1 << 20);
    write(snap.as_ref(), 8192 + 512, 0x11, 512);
    write(snap.as_ref(), 16384, 0x22, 4096);
    let mut want = origin_before.clone();
    want[8192 + 512..8192 + 1024].fill(0x11);
    want[16384..16384 + 4096].fill(0x22);
    assert_eq!(read(snap.as_ref(), 0, 1 << 20), want);
    assert_eq!(
        read(m.0[&format!("@{t}-o")].as_ref(), 0, 1 << 20),
        origin_before
    );
}

#[test]
fn a_persistent_snapshot_reads_the_same_after_a_rebuild() {
    let t = "reopen";
    let mut m = devices(t, 1 << 20);
    let snap = build("snapshot", &format!("@{t}-o @{t}-c P 16"), &mut m);
    let origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
    for i in 0..40u64 {
        write(
            origin.as_ref(),
            i * 20000 % (1 << 20) / 512 * 512,
            i as u8,
            512,
        );
    }
    write(snap.as_ref(), 100 * 512, 0x77, 512);
    let view = read(snap.as_ref(), 0, 1 << 20);
    let status = snap.status();
    drop((snap, origin));
    let snap = build("snapshot", &format!("@{t}-o @{t}-c P 16"), &mut m);
    assert_eq!(read(snap.as_ref(), 0, 1 << 20), view);
    assert_eq!(snap.status(), status);
}

#[test]
fn a_full_cow_invalidates_the_snapshot_and_the_origin_goes_on() {
    let t = "full";
    // Header, one area, two data chunks of 4 KiB.
    let mut m = devices(t, 4 * 4096);
    let events = Arc::new(AtomicUsize::new(0));
    let e2 = events.clone();
    let opts = TargetOptions {
        events: Some(EventHook(Arc::new(move || {
            e2.fetch_add(1, Ordering::SeqCst);
        }))),
        ..TargetOptions::default()
    };
    let args = format!("@{t}-o @{t}-c P 8");
    let snap = build_with("snapshot", &args, &mut m, &opts).unwrap();
    let origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
    write(origin.as_ref(), 0, 1, 4096);
    write(origin.as_ref(), 4096, 2, 4096);
    assert_eq!(snap.status(), "32/32 16");
    assert_eq!(events.load(Ordering::SeqCst), 0);
    write(origin.as_ref(), 8192, 3, 4096);
    assert_eq!(snap.status(), "Invalid");
    assert_eq!(events.load(Ordering::SeqCst), 1);
    let mut b = [0u8; 512];
    let e = snap.read(0, &mut b).unwrap_err().to_string();
    assert!(e.contains("invalid") && e.contains("remove it"), "{e}");
    assert_eq!(read(origin.as_ref(), 8192, 4096), vec![3; 4096]);
    // The header says so, and a rebuild stays invalid.
    let mut h = [0u8; 8];
    m.0[&format!("@{t}-c")].read(0, &mut h).unwrap();
    assert_eq!(&h[4..8], &[0, 0, 0, 0]);
    drop((snap, origin));
    let snap = build("snapshot", &args, &mut m);
    assert_eq!(snap.status(), "Invalid");
}

#[test]
fn with_po_a_full_cow_fails_snapshot_writes_and_shows_overflow() {
    let t = "po";
    let mut m = devices(t, 3 * 4096);
    let snap = build("snapshot", &format!("@{t}-o @{t}-c PO 8"), &mut m);
    write(snap.as_ref(), 0, 9, 512);
    let e = snap
        .write(8192, WriteBuf::Borrowed(&[1; 512]), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("overflowed"), "{e}");
    assert_eq!(snap.status(), "Overflow");
    assert_eq!(read(snap.as_ref(), 0, 512), vec![9; 512], "still readable");
    assert_eq!(snap.table_params(false), format!("@{t}-o @{t}-c PO 8"));
}

#[test]
fn merge_puts_the_snapshots_view_into_the_origin_and_empties_the_cow() {
    let t = "merge";
    let mut m = devices(t, 1 << 20);
    let args = format!("@{t}-o @{t}-c P 8");
    let snap = build("snapshot", &args, &mut m);
    let origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
    for i in 0..30u64 {
        write(origin.as_ref(), i * 12288, 0xa0, 1024);
        write(snap.as_ref(), i * 8192 + 512, i as u8, 512);
    }
    let view = read(snap.as_ref(), 0, 1 << 20);
    drop((snap, origin));
    let merged = build("snapshot-merge", &args, &mut m);
    merged.resume();
    // Reads during the merge already see the snapshot.
    assert_eq!(read(merged.as_ref(), 0, 1 << 20), view);
    let t0 = Instant::now();
    loop {
        let st = merged.status();
        let (a, rest) = st.split_once('/').unwrap();
        if a == rest.split(' ').nth(1).unwrap() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "merge stuck: {st}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(read(m.0[&format!("@{t}-o")].as_ref(), 0, 1 << 20), view);
    let mut area = vec![0u8; 16];
    m.0[&format!("@{t}-c")].read(4096, &mut area).unwrap();
    assert_eq!(area, vec![0; 16], "no exception left");
    assert_eq!(merged.table_params(false), args);
}

#[test]
fn constructor_errors_name_the_argument() {
    let t = "errs";
    let mut m = devices(t, 1 << 20);
    let e = |ty: &str, a: &str, m: &mut Mem| {
        build_with(ty, a, m, &TargetOptions::default())
            .err()
            .unwrap()
    };
    let x = e("snapshot", &format!("@{t}-o @{t}-c Q 8"), &mut m);
    assert_eq!(x.arg, Some(2));
    let x = e("snapshot", &format!("@{t}-o @{t}-c P 12"), &mut m);
    assert!(x.msg.contains("power of 2"), "{}", x.msg);
    let x = e("snapshot", &format!("@{t}-o @{t}-o P 8"), &mut m);
    assert!(x.msg.contains("same as the origin"), "{}", x.msg);
    let x = e("snapshot-merge", &format!("@{t}-o @{t}-c N 8"), &mut m);
    assert!(x.msg.contains("persistent"), "{}", x.msg);
    let x = e("snapshot", &format!("@{t}-o @{t}-c P"), &mut m);
    assert!(x.msg.contains("expected 4 arguments"), "{}", x.msg);
    let junk = m.0[&format!("@{t}-c")].clone();
    junk.write(0, WriteBuf::Borrowed(b"junk"), false).unwrap();
    let x = e("snapshot", &format!("@{t}-o @{t}-c P 8"), &mut m);
    assert!(x.msg.contains("zero its first chunk"), "{}", x.msg);
}

#[test]
fn concurrent_origin_writes_never_show_through_the_snapshot() {
    let t = "race";
    let mut m = devices(t, 4 << 20);
    let snap = build("snapshot", &format!("@{t}-o @{t}-c P 8"), &mut m);
    let origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
    let before = Arc::new(read(snap.as_ref(), 0, 1 << 20));
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let origin = origin.clone();
            s.spawn(move || {
                // Each writer its own 512-byte slots of the same chunks.
                for i in 0..200u64 {
                    let off = (i * 7 % 256) * 4096 + w * 512;
                    write(origin.as_ref(), off, 0xf0 | w as u8, 512);
                }
            });
        }
        for _ in 0..2 {
            let (snap, before) = (snap.clone(), before.clone());
            s.spawn(move || {
                for _ in 0..20 {
                    assert!(read(snap.as_ref(), 0, 1 << 20) == *before);
                }
            });
        }
    });
    assert!(read(snap.as_ref(), 0, 1 << 20) == *before);
    // Every writer's last bytes are in the origin: none was lost to a copy.
    for w in 0..4u64 {
        let off = (199 * 7 % 256) * 4096 + w * 512;
        assert_eq!(read(origin.as_ref(), off, 512), vec![0xf0 | w as u8; 512]);
    }
}

#[test]
fn a_suspended_merge_waits_and_goes_on_at_resume() {
    let t = "pause";
    let mut m = devices(t, 1 << 20);
    let args = format!("@{t}-o @{t}-c P 8");
    let snap = build("snapshot", &args, &mut m);
    for i in 0..50u64 {
        write(snap.as_ref(), i * 4096, 0x5a, 512);
    }
    // As if the merging device were suspended from the start: the merge
    // holds; a reloaded table takes it over and its resume lets it go.
    let shared = super::registry::by_cow(&format!("@{t}-c")).unwrap();
    shared.merge_paused.store(true, Ordering::SeqCst);
    let merged = build("snapshot-merge", &args, &mut m);
    drop((snap, shared));
    let held = merged.status();
    assert_eq!(held, "416/2048 16", "50 exceptions left");
    let again = build("snapshot-merge", &args, &mut m);
    drop(merged);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(again.status(), held, "no progress while suspended");
    again.resume();
    let t0 = Instant::now();
    while again.status() != "16/2048 16" {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", again.status());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `dmsetup reload` of the origin's device with `snapshot-merge` while
/// the snapshot and its origin are live: nothing merges before the
/// table's resume (before, the merge ran from the load, moving chunks
/// into the live origin and failing the live snapshot's writes).
#[test]
fn a_loaded_snapshot_merge_waits_for_its_resume() {
    let t = "loadmerge";
    let mut m = devices(t, 1 << 20);
    let args = format!("@{t}-o @{t}-c P 8");
    let snap = build("snapshot", &args, &mut m);
    let origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
    for i in 0..30u64 {
        write(origin.as_ref(), i * 12288, 0xa0, 1024);
        write(snap.as_ref(), i * 8192 + 512, i as u8, 512);
    }
    let merged = build("snapshot-merge", &args, &mut m);
    let loaded = merged.status();
    // The live tables go on: the snapshot takes writes, an origin write
    // still copies its chunk out first.
    write(snap.as_ref(), 600 * 512, 0x77, 512);
    write(origin.as_ref(), 250 * 4096, 0x66, 512);
    let before = merged.status();
    assert_ne!(before, loaded, "the origin write copied nothing out");
    let view = read(snap.as_ref(), 0, 1 << 20);
    let live = read(origin.as_ref(), 0, 1 << 20);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(merged.status(), before, "merged before its resume");
    assert!(
        read(origin.as_ref(), 0, 1 << 20) == live,
        "the live origin changed"
    );
    assert!(
        read(snap.as_ref(), 0, 1 << 20) == view,
        "the live snapshot changed"
    );
    // The swap: the old tables suspended, the merge table resumed.
    snap.postsuspend();
    origin.postsuspend();
    drop((snap, origin));
    merged.resume();
    let t0 = Instant::now();
    loop {
        let st = merged.status();
        let (a, rest) = st.split_once('/').unwrap();
        if a == rest.split(' ').nth(1).unwrap() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "merge stuck: {st}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(read(m.0[&format!("@{t}-o")].as_ref(), 0, 1 << 20) == view);
}

/// Exceptions a persistent snapshot's status line counts: the first free
/// chunk less the header, the areas before the current one and the
/// current one (512-byte chunks, so sectors are chunks).
fn exceptions_of(status: &str) -> u64 {
    let (a, rest) = status.split_once('/').expect(status);
    let meta: u64 = rest.split(' ').nth(1).unwrap().parse().unwrap();
    let alloc: u64 = a.parse().unwrap();
    alloc - 1 - (meta - 1)
}

/// The reopen matrix of issue 44: writes through the snapshot and its
/// origin against an in-memory model of what each acknowledged, with
/// 512-byte chunks (32 exceptions an area), and the snapshot closed and
/// reopened whenever its exception count sits at an area's boundary
/// (exactly full, one past, one short) and at random moments between:
/// after each reopen both devices read back exactly the model, and the
/// status is the one before. `UDM_SNAPSHOT_MODEL_ROUNDS` runs more seeds.
#[test]
fn reopening_at_every_area_boundary_keeps_every_block_of_the_model() {
    let rounds: u64 = std::env::var("UDM_SNAPSHOT_MODEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        for store in ["P", "PO"] {
            model_round(&format!("model{store}{round}"), store, round);
        }
    }
}

fn model_round(t: &str, store: &str, seed: u64) {
    let mut m = devices(t, 2 << 20);
    let args = format!("@{t}-o @{t}-c {store} 1");
    let mut origin_model = read(m.0[&format!("@{t}-o")].as_ref(), 0, 1 << 20);
    let mut snap_model = origin_model.clone();
    let mut snap = build("snapshot", &args, &mut m);
    let mut origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut reopens, mut last) = (0u32, u64::MAX);
    for op in 0..1500u64 {
        // Mostly one chunk, sometimes two (unaligned), rarely several.
        let len = match next() % 8 {
            0 => 512 + next() % 2048,
            1 => 1 + next() % 512,
            _ => 512,
        } as usize;
        let off = if len == 512 {
            next() % 2048 * 512
        } else {
            next() % ((1 << 20) - len as u64)
        } as usize;
        let byte = (op % 251) as u8 + 1;
        if next() % 2 == 0 {
            write(origin.as_ref(), off as u64, byte, len);
            origin_model[off..off + len].fill(byte);
        } else {
            write(snap.as_ref(), off as u64, byte, len);
            snap_model[off..off + len].fill(byte);
        }
        let status = snap.status();
        let n = exceptions_of(&status);
        let at_edge = matches!(n % 32, 0 | 1 | 31) && n != last;
        if at_edge || next() % 97 == 0 {
            last = n;
            reopens += 1;
            drop((snap, origin));
            snap = build("snapshot", &args, &mut m);
            origin = build("snapshot-origin", &format!("@{t}-o"), &mut m);
            assert_eq!(
                snap.status(),
                status,
                "{t}: reopen after op {op} ({n} exceptions)"
            );
            assert!(
                read(snap.as_ref(), 0, 1 << 20) == snap_model,
                "{t}: the snapshot differs from the model after a reopen at {n} exceptions"
            );
            assert!(
                read(origin.as_ref(), 0, 1 << 20) == origin_model,
                "{t}: the origin differs from the model after a reopen at {n} exceptions"
            );
        }
    }
    let n = exceptions_of(&snap.status());
    assert!(
        n > 3 * 32 && reopens > 20,
        "{t}: {n} exceptions, {reopens} reopens"
    );
}

/// A request that copies a large chunk (the COW header may set up to
/// 1 GiB) takes seconds: it must run on workers of the device's own, not
/// on an event loop other exports share (a 4 KiB origin write held one
/// loop for 5–16 s per chunk). Small chunks keep running inline on a
/// snapshot; the origin cannot know the chunks of snapshots added later.
#[test]
fn devices_that_copy_large_chunks_run_on_workers_of_their_own() {
    let depth = |ty: &str, t: &str, rest: &str| {
        let mut m = devices(t, 8 << 20);
        let args = match ty {
            "snapshot-origin" => format!("@{t}-o"),
            _ => format!("@{t}-o @{t}-c {rest}"),
        };
        build(ty, &args, &mut m).limits().queue_depth
    };
    assert_eq!(
        depth("snapshot", "chunk4k", "N 8"),
        0,
        "small chunks: inline"
    );
    assert!(
        depth("snapshot", "chunk128k", "N 256") > 0,
        "large chunks: workers"
    );
    assert!(
        depth("snapshot-origin", "origin", "") > 0,
        "an origin's writes copy"
    );
    assert!(
        depth("snapshot-merge", "merge128k", "P 256") > 0,
        "a merge copies chunks too"
    );
}
