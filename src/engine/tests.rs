use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use std::sync::{Arc, Mutex};

use crate::core::{AsyncIo, BlockDevice, DevError, DevResult, Extent, Limits, WriteBuf};
use crate::store::mem::MemStore;

/// Sends (cookie, ok, data) of every finished request down a channel.
struct Collect(Mutex<mpsc::Sender<Done>>);

impl Sink for Collect {
    fn complete(&self, req: &mut Request, result: DevResult<()>) {
        let data = if req.op == Op::Read {
            req.data().to_vec()
        } else {
            Vec::new()
        };
        let _ = self.0.lock().unwrap().send((req.tag, result.is_ok(), data));
    }
}

type Done = (u64, bool, Vec<u8>);

fn sink() -> (Arc<dyn Sink>, mpsc::Receiver<Done>) {
    let (tx, rx) = mpsc::channel();
    (Arc::new(Collect(Mutex::new(tx))), rx)
}

/// Admit `bytes` for client `c` and submit `r` on queue 0, as a
/// connection reader does.
fn send(e: &Engine, c: ClientId, bytes: u64, r: Request) {
    e.submit(e.admit(c, bytes), e.queue(0), r);
}

fn req(
    e: &Engine,
    op: Op,
    cookie: u64,
    offset: u64,
    data: &[u8],
    len: u64,
    sink: &Arc<dyn Sink>,
) -> Request {
    let (mut buf, head) = if matches!(op, Op::Read | Op::Write) {
        e.buffer(e.queue(0), offset, len)
    } else {
        (Buf::empty(), 0)
    };
    if op == Op::Write {
        buf[head..head + data.len()].copy_from_slice(data);
    }
    Request {
        op,
        tag: cookie,
        offset,
        len,
        fua: false,
        buf,
        head,
        extents: Vec::new(),
        sink: sink.clone(),
    }
}

/// A MemStore whose first write to offset 0 stalls until released, to prove
/// that later overlapping requests wait and non-overlapping ones do not.
struct Gate {
    inner: MemStore,
    open: AtomicBool,
}

impl BlockDevice for Gate {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        self.inner.limits()
    }
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
        if o == 0 {
            while !self.open.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.inner.write(o, d, f)
    }
    fn flush(&self) -> DevResult<()> {
        self.inner.flush()
    }
    fn discard(&self, o: u64, l: u64) -> DevResult<()> {
        self.inner.discard(o, l)
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool) -> DevResult<()> {
        self.inner.write_zeroes(o, l, f)
    }
}

#[test]
fn overlapping_requests_wait_and_others_pass() {
    let gate = Arc::new(Gate {
        inner: MemStore::new(1 << 20),
        open: AtomicBool::new(false),
    });
    let e = Engine::new(vec![gate.clone() as Arc<dyn BlockDevice>], 2).unwrap();
    let c = e.add_client();
    let (s, rx) = sink();
    send(&e, c, 512, req(&e, Op::Write, 1, 0, &[7u8; 512], 512, &s));
    send(&e, c, 0, req(&e, Op::Read, 2, 0, &[], 512, &s));
    send(&e, c, 0, req(&e, Op::Flush, 3, 0, &[], 0, &s));
    send(&e, c, 0, req(&e, Op::Read, 4, 4096, &[], 512, &s));
    // The far read finishes while the write is stalled; nothing else does.
    let (cookie, ok, _) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((cookie, ok), (4, true));
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    gate.open.store(true, Ordering::SeqCst);
    let mut got: Vec<_> = (0..3)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(got[0].0, 1, "the write finishes first");
    got.sort_by_key(|x| x.0);
    assert!(
        got[1].2 == vec![7u8; 512],
        "the read sees the earlier write"
    );
    e.remove_client(c);
}

#[test]
fn partial_block_writes_are_atomic() {
    let m: Arc<dyn BlockDevice> = Arc::new(MemStore::new(64 << 10));
    let e = Arc::new(Engine::new(vec![m.clone()], 2).unwrap());
    let (s, rx) = sink();
    // 4 clients each write their own byte positions of the same block many
    // times; lost updates would leave some position without its value.
    let mut threads = Vec::new();
    for t in 0..4u8 {
        let e = e.clone();
        let s = s.clone();
        threads.push(std::thread::spawn(move || {
            let c = e.add_client();
            for round in 0..200u64 {
                for k in 0..4u64 {
                    let off = 1000 + u64::from(t) * 4 + k;
                    send(&e, c, 1, req(&e, Op::Write, round, off, &[t + 1], 1, &s));
                }
            }
            e.remove_client(c);
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    drop(s);
    assert!(rx.iter().all(|r| r.1));
    let mut back = vec![0u8; 32];
    m.read(992, &mut back).unwrap();
    for t in 0..4usize {
        assert_eq!(&back[8 + t * 4..12 + t * 4], &[t as u8 + 1; 4]);
    }
}

#[test]
fn write_zeroes_and_reads_with_partial_blocks() {
    let m: Arc<dyn BlockDevice> = Arc::new(MemStore::new(8192));
    m.write(0, WriteBuf::Borrowed(&[0xAA; 8192]), false)
        .unwrap();
    let e = Engine::new(vec![m.clone()], 1).unwrap();
    let c = e.add_client();
    let (s, rx) = sink();
    for (off, len) in [(10u64, 5u64), (500, 1100), (2048, 512), (4000, 100)] {
        send(&e, c, 0, req(&e, Op::WriteZeroes, off, off, &[], len, &s));
    }
    send(&e, c, 0, req(&e, Op::Read, 99, 3, &[], 8000, &s));
    e.remove_client(c);
    let mut all: Vec<_> = rx.try_iter().collect();
    all.sort_by_key(|r| r.0);
    assert!(all.iter().all(|r| r.1));
    let mut expect = vec![0xAAu8; 8192];
    for (off, len) in [(10usize, 5usize), (500, 1100), (2048, 512), (4000, 100)] {
        expect[off..off + len].fill(0);
    }
    let read = all.iter().find(|r| r.0 == 99).unwrap();
    assert!(
        read.2 == expect[3..8003],
        "zeroed ranges and untouched bytes"
    );
}

#[test]
fn device_errors_reach_the_sink() {
    let m: Arc<dyn BlockDevice> = Arc::new(MemStore::new(4096));
    let e = Engine::new(vec![m], 1).unwrap();
    let c = e.add_client();
    let (s, rx) = sink();
    send(&e, c, 0, req(&e, Op::Read, 5, 4096, &[], 512, &s));
    let (cookie, ok, _) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((cookie, ok), (5, false));
    e.remove_client(c);
    let _ = DevError::ReadOnly;
}

/// A device whose reads wait for the gate to open and then take 5 ms, so
/// a queue builds up before any request completes, however slowly the
/// test thread submits (a loaded machine).
struct SlowRead(MemStore, Arc<std::sync::atomic::AtomicBool>);

impl BlockDevice for SlowRead {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn limits(&self) -> Limits {
        self.0.limits()
    }
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        while !self.1.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
        self.0.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
        self.0.write(o, d, f)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn discard(&self, _: u64, _: u64) -> DevResult<()> {
        Ok(())
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool) -> DevResult<()> {
        self.0.write_zeroes(o, l, f)
    }
}

#[test]
fn a_busy_client_does_not_starve_another() {
    let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dev: Arc<dyn BlockDevice> = Arc::new(SlowRead(MemStore::new(1 << 20), gate.clone()));
    let e = Engine::new(vec![dev], 1).unwrap();
    let (s, rx) = sink();
    let busy = e.add_client();
    let other = e.add_client();
    for i in 0..30 {
        send(&e, busy, 4096, req(&e, Op::Read, i, 0, &[], 4096, &s));
    }
    send(&e, other, 4096, req(&e, Op::Read, 1000, 0, &[], 4096, &s));
    gate.store(true, std::sync::atomic::Ordering::Release);
    let order: Vec<u64> = (0..31)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap().0)
        .collect();
    let pos = order.iter().position(|&c| c == 1000).unwrap();
    assert!(
        pos <= 2,
        "the other client's read finished {pos}th of 31 (order {:?})",
        &order[..6]
    );
    e.remove_client(busy);
    e.remove_client(other);
}

#[test]
fn device_with_a_short_last_block() {
    // 1000 bytes with 512-byte blocks: the last block is 488 bytes long.
    let m: Arc<dyn BlockDevice> = Arc::new(MemStore::new(1000));
    m.write(0, WriteBuf::Borrowed(&[0xAA; 1000]), false)
        .unwrap();
    let e = Engine::new(vec![m.clone()], 1).unwrap();
    let c = e.add_client();
    let (s, rx) = sink();
    send(&e, c, 50, req(&e, Op::Write, 1, 900, &[1u8; 50], 50, &s));
    send(&e, c, 0, req(&e, Op::WriteZeroes, 2, 990, &[], 10, &s));
    send(&e, c, 0, req(&e, Op::WriteZeroes, 3, 500, &[], 20, &s));
    send(&e, c, 100, req(&e, Op::Read, 4, 900, &[], 100, &s));
    e.remove_client(c);
    let all: Vec<_> = rx.try_iter().collect();
    assert!(
        all.iter().all(|r| r.1),
        "a request failed at the device end"
    );
    let mut expect = vec![0xAAu8; 1000];
    expect[900..950].fill(1);
    expect[990..1000].fill(0);
    expect[500..520].fill(0);
    let read = all.iter().find(|r| r.0 == 4).unwrap();
    assert!(read.2 == expect[900..1000]);
    let mut back = vec![0u8; 1000];
    m.read(0, &mut back).unwrap();
    assert!(back == expect);
}

/// A device that waits like a network store: each read sleeps, and the
/// most reads seen running at once is recorded.
struct Remote {
    inner: MemStore,
    depth: u32,
    started: std::sync::atomic::AtomicU32,
    running: std::sync::atomic::AtomicU32,
    peak: std::sync::atomic::AtomicU32,
    threads: Mutex<Vec<std::thread::ThreadId>>,
}

impl BlockDevice for Remote {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        Limits {
            queue_depth: self.depth,
            ..self.inner.limits()
        }
    }
    /// The first `depth` reads (one for a local device) wait for each
    /// other, so the peak shows how many the engine runs at once whatever
    /// the machine's load; later reads pass straight through.
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        let target = self.depth.max(1);
        let first = self.started.fetch_add(1, Ordering::SeqCst) < target;
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        let t = std::time::Instant::now();
        while first
            && self.running.load(Ordering::SeqCst) < target
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
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
}

/// A device with a queue depth gets that many requests running at once on
/// an engine of 2 workers, none on the submitting thread, and never more
/// than its depth.
#[test]
fn queue_depth_devices_get_their_own_workers_and_a_cap() {
    for (depth, sent, want_peak) in [(0u32, 12u64, 1u32), (8, 12, 8)] {
        let dev = Arc::new(Remote {
            inner: MemStore::new(1 << 20),
            depth,
            started: 0.into(),
            running: 0.into(),
            peak: 0.into(),
            threads: Mutex::new(Vec::new()),
        });
        let e = Engine::new(vec![dev.clone() as Arc<dyn BlockDevice>], 2).unwrap();
        let c = e.add_client();
        let (s, rx) = sink();
        let me = std::thread::current().id();
        for i in 0..sent {
            // submit_or_run: a local device would run these small reads
            // right here; a remote one must not.
            e.submit_or_run(
                e.admit(c, 0),
                e.queue(0),
                req(&e, Op::Read, i, i * 4096, &[], 4096, &s),
            );
        }
        for _ in 0..sent {
            let (_, ok, _) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(ok);
        }
        let peak = dev.peak.load(Ordering::SeqCst);
        let inline = dev
            .threads
            .lock()
            .unwrap()
            .iter()
            .filter(|&&t| t == me)
            .count();
        if depth == 0 {
            // Inline on this thread: one at a time.
            assert_eq!(
                (peak, inline),
                (want_peak, sent as usize),
                "local device: reads run inline"
            );
        } else {
            assert_eq!(peak, want_peak, "remote device: depth {depth} in flight");
            assert_eq!(inline, 0, "remote device: nothing runs on the submitter");
        }
        e.remove_client(c);
    }
}

/// dm's suspend at the queue: a held queue starts nothing, its running
/// request finishes (drain returns only then), waiting requests run after
/// release in arrival order, and another queue is not held up meanwhile.
#[test]
fn held_queue_parks_requests_and_drains_running_ones() {
    let gate = Arc::new(Gate {
        inner: MemStore::new(1 << 20),
        open: AtomicBool::new(false),
    });
    let other = Arc::new(MemStore::new(1 << 20));
    let e = Arc::new(
        Engine::new(
            vec![
                gate.clone() as Arc<dyn BlockDevice>,
                other.clone() as Arc<dyn BlockDevice>,
            ],
            2,
        )
        .unwrap(),
    );
    let c = e.add_client();
    let (s, rx) = sink();
    // A write that stalls in the device is running when the hold comes.
    send(&e, c, 512, req(&e, Op::Write, 1, 0, &[7u8; 512], 512, &s));
    std::thread::sleep(Duration::from_millis(50));
    e.hold(e.queue(0));
    assert!(e.is_held(e.queue(0)));
    let drained = Arc::new(AtomicBool::new(false));
    let (e2, d2) = (e.clone(), drained.clone());
    let drainer = std::thread::spawn(move || {
        e2.drain(e2.queue(0));
        d2.store(true, Ordering::SeqCst);
    });
    // New requests on the held queue, inline-eligible or not, wait.
    e.submit_or_run(
        e.admit(c, 0),
        e.queue(0),
        req(&e, Op::Read, 2, 8192, &[], 512, &s),
    );
    send(
        &e,
        c,
        512,
        req(&e, Op::Write, 3, 16384, &[9u8; 512], 512, &s),
    );
    // The other queue runs meanwhile.
    let mut b = req(&e, Op::Read, 4, 0, &[], 512, &s);
    let (buf, head) = e.buffer(e.queue(1), 0, 512);
    b.buf = buf;
    b.head = head;
    e.submit(e.admit(c, 0), e.queue(1), b);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap().0, 4);
    assert!(!drained.load(Ordering::SeqCst), "drain waits for the write");
    gate.open.store(true, Ordering::SeqCst);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap().0, 1);
    drainer.join().unwrap();
    assert!(drained.load(Ordering::SeqCst));
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "nothing starts while held"
    );
    e.release(e.queue(0));
    let mut got: Vec<u64> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap().0)
        .collect();
    got.sort();
    assert_eq!(got, [2, 3]);
    e.remove_client(c);
}
/// A device that says it may hold requests and holds every one until
/// released, counting the threads that wait in it.
struct Holder {
    inner: MemStore,
    open: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Holder {
    fn wait(&self) {
        let mut g = self.open.lock().unwrap();
        while !*g {
            g = self.cv.wait(g).unwrap();
        }
    }
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl BlockDevice for Holder {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        Limits {
            queue_depth: 32,
            ..self.inner.limits()
        }
    }
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        self.wait();
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
        self.wait();
        self.inner.write(o, d, f)
    }
    fn flush(&self) -> DevResult<()> {
        self.wait();
        Ok(())
    }
    fn discard(&self, o: u64, l: u64) -> DevResult<()> {
        self.inner.discard(o, l)
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool) -> DevResult<()> {
        self.inner.write_zeroes(o, l, f)
    }
}

/// Requests held by a device that waits on purpose (a `delay` target says
/// so through `queue_depth`) occupy workers of its own, never the shared
/// ones nor a reader: with 2 shared workers and 16 held requests
/// (inline-sized ones too), another device's requests, submitted inline or
/// not, still finish.
#[test]
fn held_requests_stall_nothing_else() {
    let held = Arc::new(Holder {
        inner: MemStore::new(1 << 20),
        open: Mutex::new(false),
        cv: std::sync::Condvar::new(),
    });
    let fast: Arc<dyn BlockDevice> = Arc::new(MemStore::new(1 << 20));
    let e = Engine::new(vec![held.clone() as Arc<dyn BlockDevice>, fast], 2).unwrap();
    let (s, rx) = sink();
    let c1 = e.add_client();
    for i in 0..16u64 {
        let t = e.admit(c1, 4096);
        // submit_or_run: a held device's request must not run on this
        // (the reader's) thread, or this loop would stop here.
        let r = req(&e, Op::Read, i, i * 4096, &[], 4096, &s);
        e.submit_or_run(t, e.queue(0), r);
    }
    let c2 = e.add_client();
    for i in 0..8u64 {
        let t = e.admit(c2, 4096);
        let (mut buf, head) = e.buffer(e.queue(1), i * 4096, 4096);
        buf[head..head + 4096].fill(i as u8);
        let r = Request {
            op: Op::Write,
            tag: 100 + i,
            offset: i * 4096,
            len: 4096,
            fua: false,
            buf,
            head,
            extents: Vec::new(),
            sink: s.clone(),
        };
        if i % 2 == 0 {
            e.submit_or_run(t, e.queue(1), r);
        } else {
            e.submit(t, e.queue(1), r);
        }
    }
    // The fast device's 8 writes all finish while all 16 reads are held.
    for _ in 0..8 {
        let (cookie, ok, _) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(cookie >= 100 && ok, "request {cookie} finished first");
    }
    held.release();
    for _ in 0..16 {
        let (cookie, ok, _) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(cookie < 100 && ok);
    }
    e.remove_client(c1);
    e.remove_client(c2);
    e.shutdown();
}

/// A submission held by [`Submits`] until the test completes it.
struct Held(AsyncIo);
// SAFETY: the buffer pointer is only used by the thread that completes
// the request, while the engine's completion still owns the buffer.
unsafe impl Send for Held {}

/// A memory device that waits "on a network" (a queue depth) and takes
/// submissions: reads and writes below `decline_from` are kept until the
/// test completes them (from another thread, as librbd's callback), the
/// rest are declined. Records which thread made each synchronous call.
struct Submits {
    inner: MemStore,
    decline_from: u64,
    held: Mutex<Vec<Held>>,
    sync_calls: Mutex<Vec<(u64, std::thread::ThreadId)>>,
}

impl Submits {
    /// Complete every held submission, on a thread of its own.
    fn complete_all(self: &Arc<Self>) -> usize {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        let n = held.len();
        let me = self.clone();
        std::thread::spawn(move || {
            for Held(io) in held {
                // SAFETY: the engine's contract: the buffer is valid and
                // ours until `done`.
                let b = unsafe { std::slice::from_raw_parts_mut(io.buf, io.len) };
                let r = if io.write {
                    me.inner.write(io.offset, WriteBuf::Borrowed(b), io.fua)
                } else {
                    me.inner.read(io.offset, b)
                };
                (io.done)(Some(r));
            }
        })
        .join()
        .unwrap();
        n
    }
}

impl BlockDevice for Submits {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn limits(&self) -> Limits {
        Limits {
            queue_depth: 8,
            ..self.inner.limits()
        }
    }
    fn can_submit(&self) -> bool {
        true
    }
    unsafe fn submit(&self, io: AsyncIo) {
        if io.offset >= self.decline_from {
            return io.decline();
        }
        self.held.lock().unwrap().push(Held(io));
    }
    fn read(&self, o: u64, b: &mut [u8]) -> DevResult<()> {
        self.sync_calls
            .lock()
            .unwrap()
            .push((o, std::thread::current().id()));
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: WriteBuf<'_>, f: bool) -> DevResult<()> {
        self.sync_calls
            .lock()
            .unwrap()
            .push((o, std::thread::current().id()));
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
}

/// Over a device that takes submissions, a whole-block read or write is
/// started on the submitting thread and finished from the device's
/// completion (no worker runs it); a later overlapping request still
/// waits for it; a partial-block write (read-modify-write) and a request
/// the device declines run the synchronous way on a worker; a hold's
/// drain waits for a submitted request; the data round-trips.
#[test]
fn submitted_requests_complete_from_the_device_callback_in_order() {
    let dev = Arc::new(Submits {
        inner: MemStore::new(1 << 20),
        decline_from: 512 << 10,
        held: Mutex::new(Vec::new()),
        sync_calls: Mutex::new(Vec::new()),
    });
    let e = Engine::new(vec![dev.clone() as Arc<dyn BlockDevice>], 2).unwrap();
    let c = e.add_client();
    let (s, rx) = sink();
    let me = std::thread::current().id();
    let a = vec![0xa5u8; 8192];
    send(&e, c, 8192, req(&e, Op::Write, 1, 0, &a, 8192, &s));
    // An overlapping read waits for the write; a disjoint one is started.
    send(&e, c, 4096, req(&e, Op::Read, 2, 4096, &[], 4096, &s));
    send(&e, c, 4096, req(&e, Op::Read, 3, 64 << 10, &[], 4096, &s));
    assert_eq!(
        dev.held.lock().unwrap().len(),
        2,
        "write and disjoint read started"
    );
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "none done yet"
    );
    e.hold(e.queue(0));
    let drained = std::thread::scope(|sc| {
        let d = sc.spawn(|| {
            e.drain(e.queue(0));
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!d.is_finished(), "drain waits for submitted requests");
        assert_eq!(dev.complete_all(), 2);
        d.join().is_ok()
    });
    assert!(drained);
    let mut done: Vec<Done> = (0..2).map(|_| rx.recv().unwrap()).collect();
    done.sort();
    assert_eq!((done[0].0, done[0].1), (1, true));
    assert_eq!((done[1].0, done[1].1), (3, true));
    assert_eq!(done[1].2, vec![0u8; 4096]);
    e.release(e.queue(0));
    // The read that waited for the write ran on a worker and sees it.
    let (cookie, ok, data) = rx.recv().unwrap();
    assert_eq!((cookie, ok), (2, true));
    assert!(data == a[..4096]);
    // A partial-block write is a read-modify-write: synchronous, on a
    // worker.
    send(
        &e,
        c,
        100,
        req(&e, Op::Write, 4, 1000, &[7u8; 100], 100, &s),
    );
    assert_eq!(rx.recv().unwrap().0, 4);
    // A request the device declines runs on a worker.
    send(
        &e,
        c,
        4096,
        req(&e, Op::Write, 5, 600 << 10, &a[..4096], 4096, &s),
    );
    assert_eq!(rx.recv().unwrap().0, 5);
    assert!(dev.held.lock().unwrap().is_empty());
    let calls = dev.sync_calls.lock().unwrap().clone();
    assert!(
        calls.iter().all(|&(_, t)| t != me),
        "synchronous calls on workers"
    );
    let offsets: Vec<u64> = calls.iter().map(|&(o, _)| o).collect();
    assert!(
        offsets.contains(&4096) && offsets.contains(&(600 << 10)),
        "{offsets:?}"
    );
    assert!(!offsets.contains(&0), "the whole-block write was submitted");
    let mut back = vec![0u8; 8192];
    dev.inner.read(0, &mut back).unwrap();
    let mut want = a.clone();
    want[1000..1100].fill(7);
    assert!(back == want);
    e.remove_client(c);
}

/// A memory device that reports 4 KiB extents: data, data, hole, hole,
/// data, ... (two of each kind in a row, so merging has work to do).
struct Striped(MemStore);

impl BlockDevice for Striped {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn limits(&self) -> Limits {
        self.0.limits()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.0.write(offset, data, fua)
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
    fn extents(&self, offset: u64, len: u64, out: &mut dyn FnMut(Extent) -> bool) -> DevResult<()> {
        let mut at = offset;
        while at < offset + len {
            let hole = (at / 8192) % 2 == 1;
            if !out(Extent {
                len: 4096,
                hole,
                zero: hole,
            }) {
                break;
            }
            at += 4096;
        }
        Ok(())
    }
}

/// Sends the extents of every finished request down a channel.
struct ExtentSink(Mutex<mpsc::Sender<(u64, Vec<Extent>)>>);

impl Sink for ExtentSink {
    fn complete(&self, req: &mut Request, result: DevResult<()>) {
        assert!(result.is_ok());
        let _ = self.0.lock().unwrap().send((req.tag, req.extents.clone()));
    }
}

#[test]
fn extents_come_back_as_data_merged_and_bounded() {
    let dev: Arc<dyn BlockDevice> = Arc::new(Striped(MemStore::new(1 << 20)));
    let e = Engine::new(vec![dev], 1).unwrap();
    let (tx, rx) = mpsc::channel();
    let s: Arc<dyn Sink> = Arc::new(ExtentSink(Mutex::new(tx)));
    let c = e.add_client();
    let ask = |tag: u64, len: u64, max: u32| {
        let mut r = req(&e, Op::Extents { max }, tag, 0, &[], len, &s);
        r.extents = Vec::with_capacity(4);
        send(&e, c, 0, r);
        rx.recv_timeout(Duration::from_secs(5)).unwrap()
    };
    let (tag, ext) = ask(7, 6 * 4096, 100);
    assert_eq!(tag, 7);
    let kinds: Vec<(u64, bool)> = ext.iter().map(|x| (x.len, x.hole)).collect();
    assert_eq!(kinds, [(8192, false), (8192, true), (8192, false)]);
    let (_, ext) = ask(8, 6 * 4096, 2);
    assert_eq!(ext.len(), 2, "bounded by max: {ext:?}");
    let (_, ext) = ask(9, 6 * 4096, 0);
    assert_eq!(ext.len(), 1, "at least one extent");
}

/// An engine over one 64 MiB memory device whose buffer pool has a
/// budget of `budget` bytes.
fn budgeted(budget: u64) -> Engine {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemStore::new(64 << 20));
    let pool = crate::mem::BufPool::new(crate::mem::Budget::new(budget));
    Engine::with_pools(vec![dev], vec![pool], 1).unwrap()
}

#[test]
fn large_requests_leave_the_reserve_to_small_ones() {
    let e = budgeted(64 << 20);
    let q = e.queue(0).clone();
    let mut held = Vec::new();
    // Clients that each take one 8 MiB buffer and keep it (a reply never
    // read): together they stop at three quarters of the budget.
    let mut refused = 0;
    for _ in 0..8 {
        let c = e.add_client();
        match e.try_admit(c, &q, 8 << 20, 0) {
            Some(t) => held.push(t),
            None => refused += 1,
        }
    }
    assert_eq!(held.len(), 6, "48 of 64 MiB for large requests");
    assert_eq!(refused, 2);
    // A small request of a new client still gets in, although large ones
    // wait in line before it.
    let c = e.add_client();
    let t = e
        .try_admit(c, &q, 4096, 0)
        .expect("a 4 KiB request is admitted");
    e.cancel(t);
    for t in held {
        e.cancel(t);
    }
}

#[test]
fn writes_awaiting_their_payload_hold_at_most_half_the_budget() {
    let e = budgeted(64 << 20);
    let q = e.queue(0).clone();
    let mut waiting = Vec::new();
    let mut got = Vec::new();
    for _ in 0..6 {
        let c = e.add_client();
        match e.try_admit_payload(c, &q, 8 << 20, 0) {
            Some(t) => got.push(t),
            None => waiting.push(c),
        }
    }
    assert_eq!(got.len(), 4, "32 of 64 MiB may wait on payloads");
    // Once a payload is in, its memory no longer counts: another write
    // may start receiving.
    e.payload_received(&mut got[0]);
    let t = e.try_admit_payload(waiting[0], &q, 8 << 20, 0);
    assert!(t.is_some(), "admitted after a payload arrived");
    got.extend(t);
    // One awaited payload always may go, whatever its size.
    let lone = budgeted(64 << 20);
    let c = lone.add_client();
    let t = lone.try_admit_payload(c, lone.queue(0), 40 << 20, 0);
    assert!(t.is_some(), "a lone large write is admitted");
    lone.cancel(t.unwrap());
    for t in got {
        e.cancel(t);
    }
}

/// Records each read's bytes and whether they came lent
/// ([`Sink::complete_lent`]) and on which thread.
struct LentSink(Mutex<mpsc::Sender<LentDone>>);

/// (cookie, lent, bytes, the thread that answered).
type LentDone = (u64, bool, Vec<u8>, std::thread::ThreadId);

impl Sink for LentSink {
    fn complete(&self, req: &mut Request, result: DevResult<()>) {
        assert!(result.is_ok());
        let v = req.data().to_vec();
        let me = std::thread::current().id();
        let _ = self.0.lock().unwrap().send((req.tag, false, v, me));
    }
    fn takes_lent(&self) -> bool {
        true
    }
    fn complete_lent(&self, req: &mut Request, data: &dyn crate::core::Lent) {
        let mut v = vec![0; req.len as usize];
        data.copy_to(req.head, &mut v).unwrap();
        let me = std::thread::current().id();
        let _ = self.0.lock().unwrap().send((req.tag, true, v, me));
    }
}

/// Reads of a page or more from a device that lends them are answered
/// from the lent bytes, on the submitting thread and on a worker alike;
/// smaller reads, and any read of a device that does not lend, are read
/// into the buffer; a large read such a device gets is run by a worker,
/// never by the submitting thread (it may wait for a disk).
#[test]
fn reads_are_answered_from_lent_bytes_where_the_device_lends() {
    let mem = Arc::new(MemStore::new(4 << 20));
    let pattern: Vec<u8> = (0..4 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    mem.write(0, WriteBuf::Borrowed(&pattern), false).unwrap();
    let gate = Arc::new(Gate {
        inner: MemStore::new(1 << 20),
        open: AtomicBool::new(true),
    });
    gate.inner
        .write(0, WriteBuf::Borrowed(&pattern[..1 << 20]), false)
        .unwrap();
    let devs: Vec<Arc<dyn BlockDevice>> = vec![mem, gate];
    let e = Engine::new(devs, 2).unwrap();
    let c = e.add_client();
    let (tx, rx) = mpsc::channel();
    let s: Arc<dyn Sink> = Arc::new(LentSink(Mutex::new(tx)));
    let me = std::thread::current().id();
    let read = |q: usize, tag: u64, off: u64, len: u64, inline: bool| {
        let (buf, head) = e.buffer(e.queue(q), off, len);
        let r = Request {
            op: Op::Read,
            tag,
            offset: off,
            len,
            fua: false,
            buf,
            head,
            extents: Vec::new(),
            sink: s.clone(),
        };
        let t = e.admit(c, len);
        if inline {
            e.submit_or_run(t, e.queue(q), r);
        } else {
            e.submit(t, e.queue(q), r);
        }
        let (got, lent, data, on) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got, tag);
        let want = &pattern[off as usize..(off + len) as usize];
        assert!(data == want, "read {tag}: wrong bytes");
        (lent, on == me)
    };
    // Lent: inline on the submitting thread, and on a worker.
    assert_eq!(read(0, 1, 4096 * 3 + 100, 256 << 10, true), (true, true));
    assert_eq!(read(0, 2, 8192, 4096, false), (true, false));
    // Up to 1 MiB on the submitting thread; past what a shared event
    // loop copies itself, lent by a worker.
    assert_eq!(read(0, 6, 0, 1 << 20, true), (true, true));
    assert_eq!(read(0, 7, 4096, 2 << 20, true), (true, false));
    // Below a page: read into the buffer, inline.
    assert_eq!(read(0, 3, 77, 512, true), (false, true));
    // A device that does not lend: small reads inline, large ones on a
    // worker.
    assert_eq!(read(1, 4, 4096, 4096, true), (false, true));
    assert_eq!(read(1, 5, 0, 512 << 10, true), (false, false));
}
