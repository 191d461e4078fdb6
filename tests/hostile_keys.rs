//! Issue 32.9: `table --showkeys` must leave no copy of a key in memory
//! given back to the allocator. This binary's allocator looks into every
//! block freed (and every block a reallocation leaves) while armed, and
//! records whether it held the key: a reply built in a growing buffer
//! frees the smaller buffers it outgrew, key bytes and all, unwiped.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use zeroize::Zeroizing;

/// The first bytes of the key (hex) the allocator looks for.
const MARK: &[u8] = b"f00dfacecafe5eed";
static ARMED: AtomicBool = AtomicBool::new(false);
static LEAKS: AtomicUsize = AtomicUsize::new(0);

struct Watching;

fn look(p: *const u8, n: usize) {
    if !ARMED.load(Ordering::Relaxed) || n < MARK.len() {
        return;
    }
    // SAFETY: `p` points at a live block of `n` bytes the caller is about
    // to free; reading it allocates nothing.
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    if s.windows(MARK.len()).any(|w| w == MARK) {
        LEAKS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call goes to the system allocator with the caller's
// layout; a reallocation is an allocation, a copy and a free, so the old
// block can be looked at before it is given back.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        look(p, l.size());
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: a layout of the same alignment and the new size, valid
        // because realloc's caller guarantees it.
        let new = unsafe { System.alloc(Layout::from_size_align_unchecked(n, l.align())) };
        if !new.is_null() {
            // SAFETY: both blocks are live and at least min(old, new) long.
            unsafe { std::ptr::copy_nonoverlapping(p, new, l.size().min(n)) };
            look(p, l.size());
            // SAFETY: `p` was allocated with `l` and is freed once.
            unsafe { System.dealloc(p, l) };
        }
        new
    }
}

#[global_allocator]
static A: Watching = Watching;

#[test]
fn showkeys_reply_leaves_no_key_copy_behind() {
    use udm::control::proto::Request;
    use udm::control::Service;
    use udm::mapper::{BuildOptions, Devices};
    use udm::nbd::export::BudgetPolicy;
    use udm::nbd::ExportSet;

    let devices = Arc::new(Devices::new(BuildOptions::default(), true, false));
    let engine = Arc::new(udm::engine::Engine::start(1).unwrap());
    let exports = Arc::new(ExportSet::new(
        engine,
        BudgetPolicy {
            total: Some(16 << 20),
            exports: 1,
        },
    ));
    let service = Service::new(devices, exports, false);
    service
        .activate("z", Zeroizing::new("0 4096 zero".into()), false)
        .unwrap();
    // Many segments, so a buffer that grows would grow many times.
    let key = "f00dfacecafe5eed".repeat(4);
    let mut table = String::new();
    for i in 0..64 {
        table.push_str(&format!(
            "{} 64 crypt aes-xts-plain64 {key} 0 @z {}\n",
            i * 64,
            i * 64
        ));
    }
    service.activate("c", Zeroizing::new(table), false).unwrap();
    let _serial = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let req = Request {
        op: "table".into(),
        names: vec!["c".into()],
        showkeys: true,
        ..Request::default()
    };
    ARMED.store(true, Ordering::SeqCst);
    let r = service.handle(&req, Zeroizing::new(Vec::new()), &|| true);
    let (_, payload) = r.map_err(|e| e.msg).unwrap();
    let shown = payload.windows(MARK.len()).filter(|w| *w == MARK).count();
    drop(payload);
    ARMED.store(false, Ordering::SeqCst);
    assert_eq!(shown, 4 * 64, "the reply should carry each segment's key");
    assert_eq!(
        LEAKS.load(Ordering::SeqCst),
        0,
        "blocks holding the key were freed unwiped while the reply was built"
    );
}

/// F6: a table line holding a key, parsed and dropped (also when the line
/// is refused half-way), gives back no block that still holds the key:
/// words are built in a scratch buffer that never grows and is wiped,
/// moved rather than copied, and wiped when the line is dropped.
#[test]
fn parsed_table_words_leave_no_key_copy_behind() {
    let key = "f00dfacecafe5eed".repeat(4);
    let good = format!("0 64 crypt aes-xts-plain64 {key} 0 /dev/x 0\n");
    let bad = format!("0 x64 crypt aes-xts-plain64 {key} 0 /dev/x 0\n");
    let escaped = format!("0 64 crypt aes-xts-plain64 {key}\\ \\ {key} 0 /dev/x 0\n");
    let _serial = ONE.lock().unwrap_or_else(|p| p.into_inner());
    LEAKS.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    let lines = udm::core::table::parse(&good).unwrap();
    let n = lines[0].args[1].len();
    drop(lines);
    let refused = udm::core::table::parse(&bad).is_err();
    drop(udm::core::table::parse(&escaped));
    ARMED.store(false, Ordering::SeqCst);
    assert_eq!(n, 64);
    assert!(refused);
    assert_eq!(
        LEAKS.load(Ordering::SeqCst),
        0,
        "blocks holding the key were freed unwiped by the table parser"
    );
}

static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
