//! The request engine: a bounded pool of worker threads shared by every
//! connection, with per-export ordering and per-client fairness.
//!
//! Why this shape:
//! - **One pool for all clients** bounds the threads (default: one per
//!   core) and lets any idle core take any ready request.
//! - **Fairness**: ready requests wait in per-client queues served round
//!   robin, so a client with a deep queue of 32 MiB writes delays another
//!   client's 4 KiB read by at most one request per busy worker.
//! - **Backpressure**: a client may have at most [`MAX_CLIENT_REQUESTS`]
//!   requests and [`MAX_CLIENT_BYTES`] of payload admitted; its connection
//!   reader blocks in [`Engine::admit`] before reading more from the
//!   socket, so a fast writer is throttled by TCP flow control.
//! - **Ordering** (ordered parallel execution): see [`order`]. Overlapping requests run in
//!   arrival order, flushes wait for earlier writes, and the same range
//!   tracking makes the server's read-modify-write of partial blocks atomic.
//! - **Devices that wait on a network** (RBD, a remote NBD export) say so
//!   in [`crate::core::Limits::queue_depth`]. Their calls stay synchronous
//!   (one trait for every device, so crypt and striped stack on them
//!   unchanged); the engine instead adds that many workers when such a
//!   queue is added, lets at most that many of its requests run at once
//!   (so a stalled cluster holds only its own workers, never the ones
//!   local devices need), and never runs its requests on a connection's
//!   reader (a reader waiting a round trip would stop reading the client's
//!   next requests). A waiting worker is a sleeping thread; the store's
//!   completion callback wakes it.
//! - **No allocation per request in steady state**: request descriptors
//!   live in a slab of slots that is reused (free list), queues are
//!   `VecDeque`s/`Vec`s that keep their capacity, and payload buffers come
//!   from [`buf::get_buf`] (the seam for the recycling buffer pool).
//!   The slab is the seam for the fixed-size block pool of `mem`.

pub mod buf;
mod exec;
pub mod order;

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use crate::core::{BlockDevice, DevResult};
use crate::mem::{default_total_budget, per_device_budget, Budget, BufPool};

pub use buf::Buf;
use exec::Geometry;
use order::{Kind, Span};

/// Reads and writes up to this size whose turn has come when they arrive
/// run on the submitting thread (the connection's reader) instead of a
/// worker: for a 4 KiB request the hand-off (queue, wake a worker, switch)
/// costs more than the I/O itself. Larger requests, and any request that
/// must wait for an earlier one, go to the shared workers.
pub const INLINE_MAX: u64 = 64 << 10;

thread_local! {
    /// Partial-block scratch for requests run inline by a reader thread.
    static INLINE_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most requests a device's [`crate::core::Limits::queue_depth`] may ask to
/// have running at once, and most workers all such devices together add to
/// the pool: a sleeping worker is cheap, but not free (a stack each).
pub const MAX_QUEUE_DEPTH: u32 = 128;
const MAX_RESERVED_WORKERS: usize = 256;

/// Most requests one client may have admitted at once.
pub const MAX_CLIENT_REQUESTS: u32 = 128;
/// Most payload bytes one client may have admitted at once (a single
/// request of any legal size is always admitted when the client is idle).
pub const MAX_CLIENT_BYTES: u64 = 64 << 20;

/// The operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
}

impl Op {
    fn kind(self) -> Kind {
        match self {
            Op::Read => Kind::Read,
            Op::Write | Op::Trim | Op::WriteZeroes => Kind::Write,
            Op::Flush => Kind::Flush,
        }
    }

    /// Whether a failure should be reported as a write failure (ENOSPC
    /// instead of EINVAL for out of range, per the protocol).
    pub fn is_write(self) -> bool {
        matches!(self, Op::Write | Op::WriteZeroes)
    }
}

/// One request as the engine runs it.
pub struct Request {
    pub op: Op,
    /// Opaque to the engine (the NBD cookie).
    pub cookie: u64,
    /// Opaque to the engine (the NBD command flags), for the sink.
    pub flags: u16,
    pub offset: u64,
    pub len: u64,
    pub fua: bool,
    /// Write: the payload laid out over the block-widened range, the
    /// client's bytes at `head`. Read: filled by the engine the same way.
    pub buf: Buf,
    /// Where the client's bytes start in `buf`.
    pub head: usize,
    /// Who receives the result.
    pub sink: Arc<dyn Sink>,
}

impl Request {
    /// The client's bytes (read data after a successful read).
    pub fn data(&self) -> &[u8] {
        let end = self
            .head
            .saturating_add(self.len as usize)
            .min(self.buf.len());
        self.buf.get(self.head..end).unwrap_or(&[])
    }
}

/// Receives finished requests (an NBD connection sends the reply).
pub trait Sink: Send + Sync {
    fn complete(&self, req: &Request, result: DevResult<()>);
}

/// A client's admission, returned by [`Engine::admit`]; pass it to
/// [`Engine::submit`] or [`Engine::cancel`].
#[must_use]
pub struct Ticket {
    client: u32,
    bytes: u64,
}

/// A registered client (one NBD connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId(u32);

/// One device as the engine schedules it: its ordering list, geometry and
/// buffer pool. Handed out by [`Engine::add_queue`] and held by whoever
/// submits to it (an NBD export); a queued request holds it too, so a queue
/// outlives its last request. Dropping the last handle retires it.
pub struct Queue {
    id: u32,
    device: Arc<dyn BlockDevice>,
    geometry: Geometry,
    pool: Arc<BufPool>,
    shared: Weak<Shared>,
}

impl Queue {
    /// The device requests on this queue run against.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// Logical block size (what requests are widened to).
    pub fn block_size(&self) -> u64 {
        self.geometry.block
    }

    /// The buffer pool (and so the memory budget) of this queue.
    pub fn pool(&self) -> &Arc<BufPool> {
        &self.pool
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Never dropped under the state lock: workers take a request's
        // queue out of its slot and drop it after unlocking.
        if let Some(shared) = self.shared.upgrade() {
            let mut st = lock(&shared.state);
            let i = self.id as usize;
            st.queues[i] = None;
            st.inflight[i].clear();
            st.reserved -= st.caps[i] as usize;
            st.caps[i] = 0;
            st.free_queues.push(self.id);
        }
    }
}

struct Slot {
    req: Option<Request>,
    /// The queue, for requests a worker runs (inline ones need none).
    queue: Option<Arc<Queue>>,
    export: u32,
    client: u32,
    bytes: u64,
    span: Span,
    /// Earlier conflicting requests not finished yet.
    deps: u32,
    waiting: bool,
}

#[derive(Default)]
struct ClientQ {
    ready: VecDeque<u32>,
    in_ring: bool,
    requests: u32,
    bytes: u64,
    /// Someone waits in admit/drain for this client's counters to drop.
    watched: bool,
}

struct State {
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Per queue: unfinished requests in arrival order.
    inflight: Vec<Vec<u32>>,
    /// Live queues by id (for [`Engine::flush_all`]), and free ids.
    queues: Vec<Option<Weak<Queue>>>,
    /// Per queue: most requests running on workers at once (0 = no cap;
    /// how many run now is `holds[q].running`).
    caps: Vec<u32>,
    /// Workers reserved by capped queues (sum of their caps); the pool
    /// grows to `base + reserved` and never shrinks.
    reserved: usize,
    free_queues: Vec<u32>,
    /// Per queue: whether it is held (suspended), its requests running
    /// right now, and the ready requests parked while it is held.
    holds: Vec<Hold>,
    clients: Vec<Option<ClientQ>>,
    free_clients: Vec<u32>,
    ring: VecDeque<u32>,
    stop: bool,
}

/// The suspend gate of one queue (dm's suspend: no new request starts,
/// the running ones finish, the rest wait in arrival order).
#[derive(Default)]
struct Hold {
    held: bool,
    running: u32,
    parked: Vec<u32>,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

/// The worker pool and request scheduler. Cheap to share (`Arc`).
pub struct Engine {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Workers for devices that complete in the caller's time.
    base: usize,
    /// The queues made by [`Engine::new`]/[`Engine::with_pools`], by index.
    initial: Vec<Arc<Queue>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    /// An engine with `threads` workers (0 = number of cores) and no
    /// queues yet: add devices with [`Engine::add_queue`].
    pub fn start(threads: usize) -> std::io::Result<Engine> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: Vec::with_capacity(256),
                free_slots: Vec::with_capacity(256),
                inflight: Vec::new(),
                queues: Vec::new(),
                caps: Vec::new(),
                reserved: 0,
                free_queues: Vec::new(),
                holds: Vec::new(),
                clients: Vec::new(),
                free_clients: Vec::new(),
                ring: VecDeque::with_capacity(64),
                stop: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let e = Engine {
            shared,
            workers: Mutex::new(Vec::with_capacity(threads)),
            base: threads,
            initial: Vec::new(),
        };
        e.grow_workers(threads)?;
        Ok(e)
    }

    /// Start workers until there are `n`.
    fn grow_workers(&self, n: usize) -> std::io::Result<()> {
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        while workers.len() < n {
            let s = self.shared.clone();
            let i = workers.len();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("udm-worker-{i}"))
                    .spawn(move || worker(s))?,
            );
        }
        Ok(())
    }

    /// An engine serving `devices` (queue `i`, see [`Engine::queue`], is
    /// `devices[i]`) with `threads` workers (0 = number of cores); each
    /// device gets a buffer pool with the default memory budget (2 % of RAM
    /// shared out).
    pub fn new(devices: Vec<Arc<dyn BlockDevice>>, threads: usize) -> std::io::Result<Engine> {
        let share = per_device_budget(default_total_budget(), devices.len(), false);
        let pools = devices
            .iter()
            .map(|_| BufPool::new(Budget::new(share)))
            .collect();
        Engine::with_pools(devices, pools, threads)
    }

    /// Like [`Engine::new`] with one buffer pool per device given.
    pub fn with_pools(
        devices: Vec<Arc<dyn BlockDevice>>,
        pools: Vec<Arc<BufPool>>,
        threads: usize,
    ) -> std::io::Result<Engine> {
        assert_eq!(devices.len(), pools.len(), "one buffer pool per device");
        let mut e = Engine::start(threads)?;
        e.initial = devices
            .into_iter()
            .zip(pools)
            .map(|(d, p)| e.add_queue(d, p))
            .collect();
        Ok(e)
    }

    /// The `i`-th queue made by [`Engine::new`] or [`Engine::with_pools`].
    pub fn queue(&self, i: usize) -> &Arc<Queue> {
        &self.initial[i]
    }

    /// Schedule requests for one more device, with its own buffer pool.
    pub fn add_queue(&self, device: Arc<dyn BlockDevice>, pool: Arc<BufPool>) -> Arc<Queue> {
        let geometry = Geometry::of(device.as_ref());
        let cap = geometry.depth.min(MAX_QUEUE_DEPTH);
        let mut st = lock(&self.shared.state);
        let id = match st.free_queues.pop() {
            Some(id) => id,
            None => {
                st.inflight.push(Vec::with_capacity(256));
                st.queues.push(None);
                st.caps.push(0);
                st.holds.push(Hold::default());
                st.inflight.len() as u32 - 1
            }
        };
        st.holds[id as usize] = Hold::default();
        st.caps[id as usize] = cap;
        st.reserved += cap as usize;
        let want = self.base + st.reserved.min(MAX_RESERVED_WORKERS);
        let q = Arc::new(Queue {
            id,
            device,
            geometry,
            pool,
            shared: Arc::downgrade(&self.shared),
        });
        st.queues[id as usize] = Some(Arc::downgrade(&q));
        drop(st);
        if let Err(e) = self.grow_workers(want) {
            // The queue still works with the workers there are, at a
            // lower depth; say why it is slower than asked.
            tracing::warn!("cannot start more request workers ({e}); a remote device runs with fewer requests in flight");
        }
        q
    }

    /// A buffer for a data request on `[offset, offset+len)` of `q`, laid
    /// out over the block-widened range, and where the client's bytes start
    /// in it. Blocks while the device is over its memory budget.
    pub fn buffer(&self, q: &Queue, offset: u64, len: u64) -> (Buf, usize) {
        let g = &q.geometry;
        let start = g.down(offset);
        let end = g.widened_end(offset.saturating_add(len));
        let b = buf::get_buf(&q.pool, (end - start) as usize);
        (b, (offset - start) as usize)
    }

    /// Register a client (a connection) for fair scheduling.
    pub fn add_client(&self) -> ClientId {
        let mut st = lock(&self.shared.state);
        let q = ClientQ {
            ready: VecDeque::with_capacity(MAX_CLIENT_REQUESTS as usize),
            ..ClientQ::default()
        };
        if let Some(i) = st.free_clients.pop() {
            st.clients[i as usize] = Some(q);
            ClientId(i)
        } else {
            st.clients.push(Some(q));
            ClientId(st.clients.len() as u32 - 1)
        }
    }

    /// Wait until `client` may put one more request of `bytes` payload in
    /// flight, and count it. This is the backpressure point.
    pub fn admit(&self, client: ClientId, bytes: u64) -> Ticket {
        let mut st = lock(&self.shared.state);
        while let Some(c) = st.clients[client.0 as usize].as_mut() {
            if c.requests == 0
                || (c.requests < MAX_CLIENT_REQUESTS && c.bytes + bytes <= MAX_CLIENT_BYTES)
            {
                c.requests += 1;
                c.bytes += bytes;
                break;
            }
            c.watched = true;
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        Ticket {
            client: client.0,
            bytes,
        }
    }

    /// Give back an admission that was not submitted (e.g. the payload
    /// could not be read).
    pub fn cancel(&self, t: Ticket) {
        let mut st = lock(&self.shared.state);
        release(&mut st, &self.shared, t.client, t.bytes);
    }

    /// Queue an admitted request on `q`. It runs once every earlier
    /// conflicting request of that queue has finished, on a worker.
    pub fn submit(&self, t: Ticket, q: &Arc<Queue>, req: Request) {
        self.submit_with(t, q, req, false)
    }

    /// Like [`Engine::submit`], but a small read or write whose turn has
    /// already come runs right here on the calling thread (a connection's
    /// reader), which saves the hand-off to a worker ([`INLINE_MAX`]). Each
    /// connection has its own reader, so this delays only its own client.
    pub fn submit_or_run(&self, t: Ticket, q: &Arc<Queue>, req: Request) {
        self.submit_with(t, q, req, true)
    }

    fn submit_with(&self, t: Ticket, q: &Arc<Queue>, req: Request, may_inline: bool) {
        let g = &q.geometry;
        let export = q.id as usize;
        let kind = req.op.kind();
        let span = if kind == Kind::Flush {
            Span {
                kind,
                start: 0,
                end: 0,
            }
        } else {
            Span::widened(kind, req.offset, req.len, g.block)
        };
        let inline = may_inline
            && g.depth == 0
            && req.len <= INLINE_MAX
            && matches!(req.op, Op::Read | Op::Write);
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let mut deps = 0;
        for &e in &st.inflight[export] {
            if order::conflicts(&st.slots[e as usize].span, &span) {
                deps += 1;
            }
        }
        let held = st.holds[export].held;
        let (queued, now) = if inline && deps == 0 && !held {
            (None, Some(req))
        } else {
            (Some(req), None)
        };
        let slot = Slot {
            queue: queued.as_ref().map(|_| q.clone()),
            req: queued,
            export: export as u32,
            client: t.client,
            bytes: t.bytes,
            span,
            deps,
            waiting: deps > 0,
        };
        let id = if let Some(id) = st.free_slots.pop() {
            st.slots[id as usize] = slot;
            id
        } else {
            st.slots.push(slot);
            st.slots.len() as u32 - 1
        };
        st.inflight[export].push(id);
        if now.is_some() {
            st.holds[export].running += 1;
        }
        if let Some(mut req) = now {
            // Its turn has come and it is small: run it on this thread. The
            // slot stays registered, so later conflicting requests of any
            // client wait for it exactly as for a worker-run request.
            drop(guard);
            let res = INLINE_SCRATCH
                .with(|s| exec::execute(q.device.as_ref(), g, &mut req, &mut s.borrow_mut()));
            req.sink.complete(&req, res);
            drop(req);
            let mut st = lock(&self.shared.state);
            finish(&mut st, &self.shared, id);
            return;
        }
        if deps == 0 && ready_or_park(st, id) {
            self.shared.work.notify_one();
        }
    }

    /// Suspend `q` (dm's suspend): from now on no request of `q` starts;
    /// requests already running go on (wait for them with
    /// [`Engine::drain`]); the others wait, in arrival order, until
    /// [`Engine::release`]. Clients of other queues are not affected.
    /// Idempotent.
    pub fn hold(&self, q: &Queue) {
        lock(&self.shared.state).holds[q.id as usize].held = true;
    }

    /// Wait until no request of `q` is running. With `q` held, this is
    /// the moment its device may change under the queue.
    pub fn drain(&self, q: &Queue) {
        let mut st = lock(&self.shared.state);
        while st.holds[q.id as usize].running > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Undo [`Engine::hold`]: the requests that waited start, in the
    /// order they arrived.
    pub fn release(&self, q: &Queue) {
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let h = &mut st.holds[q.id as usize];
        h.held = false;
        let parked = std::mem::take(&mut h.parked);
        let woke = !parked.is_empty();
        for id in parked {
            make_ready(st, id);
        }
        if woke {
            self.shared.work.notify_all();
        }
    }

    /// Release every held queue (server shutdown: requests parked behind
    /// a suspended device must finish before the last flush).
    pub fn release_all(&self) {
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let mut parked = Vec::new();
        for h in st.holds.iter_mut() {
            h.held = false;
            parked.append(&mut h.parked);
        }
        for id in parked {
            make_ready(st, id);
        }
        self.shared.work.notify_all();
    }

    /// Whether `q` is held.
    pub fn is_held(&self, q: &Queue) -> bool {
        lock(&self.shared.state).holds[q.id as usize].held
    }

    /// Wait until every request of `client` has finished (its replies are
    /// sent), then forget the client.
    pub fn remove_client(&self, client: ClientId) {
        let mut st = lock(&self.shared.state);
        loop {
            match st.clients[client.0 as usize].as_mut() {
                Some(c) if c.requests > 0 => c.watched = true,
                _ => break,
            }
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.clients[client.0 as usize] = None;
        st.free_clients.push(client.0);
    }

    /// Flush every device; returns the first error.
    pub fn flush_all(&self) -> DevResult<()> {
        let live: Vec<Arc<Queue>> = lock(&self.shared.state)
            .queues
            .iter()
            .filter_map(|q| q.as_ref()?.upgrade())
            .collect();
        let mut res = Ok(());
        for q in &live {
            if let Err(e) = q.device.flush() {
                if res.is_ok() {
                    res = Err(e);
                }
            }
        }
        res
    }

    /// Finish all queued work and stop the workers.
    pub fn shutdown(&self) {
        lock(&self.shared.state).stop = true;
        self.shared.work.notify_all();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Make request `id` ready, or park it if its queue is held; true if it
/// became ready (a worker should be woken).
fn ready_or_park(st: &mut State, id: u32) -> bool {
    let q = st.slots[id as usize].export as usize;
    if st.holds[q].held {
        st.holds[q].parked.push(id);
        false
    } else {
        make_ready(st, id);
        true
    }
}

fn make_ready(st: &mut State, id: u32) {
    let client = st.slots[id as usize].client;
    if let Some(c) = st.clients[client as usize].as_mut() {
        c.ready.push_back(id);
        if !c.in_ring {
            c.in_ring = true;
            st.ring.push_back(client);
        }
    }
}

fn release(st: &mut State, shared: &Shared, client: u32, bytes: u64) {
    if let Some(c) = st.clients[client as usize].as_mut() {
        c.requests -= 1;
        c.bytes -= bytes;
        if c.watched {
            c.watched = false;
            shared.done.notify_all();
        }
    }
}

/// Take the next ready request, round robin over clients. A client whose
/// next request is for a queue already running its cap of requests is
/// passed over (it stays in the ring).
fn pop_ready(st: &mut State) -> Option<(u32, Request, Arc<Queue>)> {
    let mut passes = st.ring.len();
    while let Some(client) = st.ring.pop_front() {
        let Some(c) = st.clients[client as usize].as_mut() else {
            continue;
        };
        let Some(&id) = c.ready.front() else {
            c.in_ring = false;
            continue;
        };
        let q = st.slots[id as usize].export as usize;
        let cap = st.caps[q];
        if cap > 0 && st.holds[q].running >= cap {
            st.ring.push_back(client);
            if passes == 0 {
                return None;
            }
            passes -= 1;
            continue;
        }
        let Some(c) = st.clients[client as usize].as_mut() else {
            continue;
        };
        c.ready.pop_front();
        if c.ready.is_empty() {
            c.in_ring = false;
        } else {
            st.ring.push_back(client);
        }
        let export = st.slots[id as usize].export as usize;
        if st.holds[export].held {
            // Made ready before its queue was held: it waits for release.
            st.holds[export].parked.push(id);
            continue;
        }
        let slot = &mut st.slots[id as usize];
        if let (Some(req), Some(q)) = (slot.req.take(), slot.queue.take()) {
            st.holds[export].running += 1;
            return Some((id, req, q));
        }
    }
    None
}

/// Bookkeeping once request `id` has finished: release it, wake what
/// waited for it, free its slot.
fn finish(st: &mut State, shared: &Shared, id: u32) {
    let (export, client, bytes, span) = {
        let s = &st.slots[id as usize];
        (s.export as usize, s.client, s.bytes, s.span)
    };
    let cap = st.caps[export];
    if cap > 0 && st.holds[export].running == cap {
        // A worker may have passed over this queue at its cap.
        shared.work.notify_one();
    }
    let list = &mut st.inflight[export];
    if let Some(pos) = list.iter().position(|&x| x == id) {
        list.remove(pos);
        let mut i = pos;
        while i < st.inflight[export].len() {
            let later = st.inflight[export][i];
            let s = &mut st.slots[later as usize];
            if s.waiting && order::conflicts(&span, &s.span) {
                s.deps -= 1;
                if s.deps == 0 {
                    s.waiting = false;
                    if ready_or_park(st, later) {
                        shared.work.notify_one();
                    }
                }
            }
            i += 1;
        }
    }
    let h = &mut st.holds[export];
    h.running = h.running.saturating_sub(1);
    if h.held && h.running == 0 {
        shared.done.notify_all();
    }
    release(st, shared, client, bytes);
    st.free_slots.push(id);
}

fn worker(shared: Arc<Shared>) {
    let mut scratch = Vec::new();
    // The queue of the request just finished. A queue is retired when its
    // last handle goes, which takes the state lock, so it is dropped only
    // once the lock is released anyway (no extra lock round per request).
    let mut last: Option<Arc<Queue>> = None;
    let mut st = lock(&shared.state);
    loop {
        let Some((id, mut req, q)) = pop_ready(&mut st) else {
            if st.stop {
                drop(st);
                drop(last);
                return;
            }
            if last.is_some() {
                drop(st);
                drop(last.take());
                st = lock(&shared.state);
                continue;
            }
            st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        drop(st);
        drop(last.take());
        let res = exec::execute(q.device.as_ref(), &q.geometry, &mut req, &mut scratch);
        req.sink.complete(&req, res);
        drop(req);
        last = Some(q);
        st = lock(&shared.state);
        finish(&mut st, &shared, id);
    }
}

#[cfg(test)]
mod tests;
