//! The request engine: a bounded pool of worker threads shared by every
//! connection, with per-export ordering and per-client fairness.
//!
//! Why this shape:
//! - **One pool for all clients** bounds the threads (default: one per
//!   core) and lets any idle core take any ready request.
//! - **Fairness**: ready requests wait in per-client queues served by
//!   deficit round robin over bytes: one request per turn, and a request
//!   larger than the client's accumulated credit waits for more turns. A
//!   client with a deep queue of 32 MiB writes delays another client's
//!   4 KiB read by at most one request per busy worker, and two clients
//!   that both have work get the same bytes per second whatever their
//!   request sizes.
//! - **Admission and a fairly shared budget** ([`Engine::try_admit`]): a
//!   client may have at most [`ClientLimits`] requests and bytes in
//!   flight, and an export's payload memory (its buffer pool's budget) is
//!   shared by the clients that use it: while nobody waits, one client may
//!   use all of it; once another client waits, nobody grows beyond an
//!   equal share and waiters are served first come, first served, so a
//!   greedy client cannot starve the others and a large request cannot be
//!   overtaken forever. Admission never blocks: a refused client is woken
//!   (its [`Waker`]) when memory comes back, and meanwhile its connection
//!   stops reading from the socket, so TCP flow control throttles it.
//!   Memory is counted in the pool's class sizes and charged until the
//!   buffer is dropped (after its reply has really been sent), so the
//!   pool never makes an admitted request wait.
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
//! - **Submitted requests** skip even that: when the device takes
//!   asynchronous submissions ([`BlockDevice::can_submit`], an RBD image
//!   under linear layers or crypt (requests up to 1 MiB)), a read or whole-block
//!   write whose turn has come is started on the connection's reader and
//!   finished in the device's completion callback (reply, then the same
//!   bookkeeping a worker does), so no worker wakes twice per request.
//!   Such requests are registered exactly as running ones (ordering,
//!   drain, the queue's cap) but skip the fair scheduler: there is no
//!   shared worker time to divide, and admission still caps each client.
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

use crate::core::{AsyncIo, BlockDevice, DevResult, Extent};
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

/// Most requests one client may have admitted at once (default).
pub const MAX_CLIENT_REQUESTS: u32 = 128;
/// Most bytes one client may have in flight at once (default): payload
/// buffers, replies not sent yet, and the work of zeroing requests. A
/// single request of any legal size is always admitted when the client is
/// idle.
pub const MAX_CLIENT_BYTES: u64 = 64 << 20;

/// Deficit round robin: credit a client gets per turn when its next
/// request costs more than it has.
const QUANTUM: u64 = 2 << 20;

/// Per-client caps on what is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    pub max_requests: u32,
    pub max_bytes: u64,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_requests: MAX_CLIENT_REQUESTS,
            max_bytes: MAX_CLIENT_BYTES,
        }
    }
}

/// Called (from any thread, possibly under the engine's lock: it must only
/// post a notification) when a client refused by [`Engine::try_admit`] may
/// be admitted now.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// The operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    /// The allocation extents of the range, returned as data in
    /// [`Request::extents`]: at most `max` of them (at least one), adjacent
    /// ones of the same kind merged, covering the range from its start
    /// (a front end asks again from where the list ends). Each front end
    /// encodes them its own way (NBD BLOCK_STATUS, SEEK_DATA/SEEK_HOLE).
    Extents {
        max: u32,
    },
}

impl Op {
    fn kind(self) -> Kind {
        match self {
            Op::Read | Op::Extents { .. } => Kind::Read,
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

/// One request as the engine runs it. Front-end neutral: whatever a
/// front end needs to answer it (an NBD cookie, a FUSE unique id) goes in
/// `tag`, and each front end encodes its own replies in its [`Sink`].
pub struct Request {
    pub op: Op,
    /// Opaque to the engine: the front end's completion tag, handed back
    /// to its sink with the result.
    pub tag: u64,
    pub offset: u64,
    pub len: u64,
    /// Force unit access: the data is durable when the request completes
    /// (a block-layer notion: NBD's FUA flag, FUSE's O_SYNC/O_DSYNC write).
    pub fua: bool,
    /// Write: the payload laid out over the block-widened range, the
    /// client's bytes at `head`. Read: filled by the engine the same way.
    pub buf: Buf,
    /// Where the client's bytes start in `buf`.
    pub head: usize,
    /// [`Op::Extents`]: the result. A front end may pass a list with
    /// capacity to reuse; the engine clears it first.
    pub extents: Vec<Extent>,
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

/// Receives finished requests (an NBD connection sends the reply). The
/// sink may take `req.buf` (a reply that must wait for the socket): the
/// buffer's charge then stays with the client until the buffer is dropped.
pub trait Sink: Send + Sync {
    fn complete(&self, req: &mut Request, result: DevResult<()>);
}

/// A client's admission, returned by [`Engine::admit`] or
/// [`Engine::try_admit`]; pass it to [`Engine::submit`] or
/// [`Engine::cancel`].
#[must_use]
pub struct Ticket {
    client: u32,
    queue: u32,
    /// Payload memory charged and not yet attached to a buffer.
    mem: u64,
    /// Work charged until the request finishes.
    work: u64,
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
            st.qstate[i] = QState::default();
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
    /// Work charged to the client until the request finishes.
    work: u64,
    /// What the request costs in the fair scheduler (bytes moved).
    cost: u64,
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
    /// Work of admitted requests (zeroing, legacy admissions).
    work: u64,
    /// Payload memory charged to this client (buffers alive).
    mem: u64,
    limits: ClientLimits,
    waker: Option<Waker>,
    /// The queue this client's memory is charged to.
    queue: Option<u32>,
    /// In its queue's waiter list.
    waiting: bool,
    /// Refused by its own caps; woken when a request of its finishes.
    blocked: bool,
    /// Gone: the slot is freed when nothing is in flight any more.
    closing: bool,
    /// Deficit round robin credit.
    deficit: u64,
    /// Wake the client when its last request finishes.
    idle_wake: bool,
    /// Someone waits in admit/drain for this client's counters to drop.
    watched: bool,
}

impl ClientQ {
    fn active(&self) -> bool {
        self.mem > 0 || self.waiting
    }

    fn wake(&self) {
        if let Some(w) = &self.waker {
            w();
        }
    }
}

/// Memory accounting of one queue (export): its budget shared fairly.
#[derive(Default)]
struct QState {
    limit: u64,
    used: u64,
    /// Clients with memory charged or waiting for it.
    active: u32,
    /// Clients refused for memory, first come first served: (client, bytes).
    waiters: VecDeque<(u32, u64)>,
}

struct State {
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Per queue: unfinished requests in arrival order.
    inflight: Vec<Vec<u32>>,
    /// Live queues by id (for [`Engine::flush_all`]), and free ids.
    queues: Vec<Option<Weak<Queue>>>,
    qstate: Vec<QState>,
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
                qstate: Vec::new(),
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
                st.qstate.push(QState::default());
                st.inflight.len() as u32 - 1
            }
        };
        st.qstate[id as usize] = QState {
            limit: pool.budget().limit().unwrap_or(u64::MAX),
            ..QState::default()
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
    /// in it. Blocks while the device is over its memory budget (callers
    /// that admitted with [`Engine::try_admit`] use
    /// [`Engine::charged_buffer`], which never waits).
    pub fn buffer(&self, q: &Queue, offset: u64, len: u64) -> (Buf, usize) {
        let g = &q.geometry;
        let start = g.down(offset);
        let end = g.widened_end(offset.saturating_add(len));
        let b = buf::get_buf(&q.pool, (end - start) as usize);
        (b, (offset - start) as usize)
    }

    /// The payload memory a data request on `[offset, offset+len)` of `q`
    /// takes from the export's budget: its block-widened buffer, rounded to
    /// the pool's size class (what the pool really hands out).
    pub fn mem_cost(&self, q: &Queue, offset: u64, len: u64) -> u64 {
        let g = &q.geometry;
        let n = (g.widened_end(offset.saturating_add(len)) - g.down(offset)) as usize;
        crate::mem::bufpool::class_of(n)
            .map_or(n as u64, |c| crate::mem::bufpool::class_size(c) as u64)
    }

    /// The payload memory budget of `q` (requests costing more can never
    /// be admitted and must be refused).
    pub fn mem_limit(&self, q: &Queue) -> u64 {
        lock(&self.shared.state).qstate[q.id as usize].limit
    }

    /// [`Engine::buffer`] for a request admitted by [`Engine::try_admit`]:
    /// the ticket's memory charge moves to the buffer and comes back when
    /// the buffer is dropped. Never waits: admission reserved the memory.
    pub fn charged_buffer(&self, t: &mut Ticket, q: &Queue, offset: u64, len: u64) -> (Buf, usize) {
        let (mut b, head) = self.buffer(q, offset, len);
        if t.mem > 0 {
            b.set_charge(buf::Charge {
                to: self.shared.clone(),
                client: t.client,
                queue: t.queue,
                bytes: t.mem,
            });
            t.mem = 0;
        }
        (b, head)
    }

    /// Register a client (a connection) for fair scheduling, with the
    /// default caps and no waker (for [`Engine::admit`], which blocks).
    pub fn add_client(&self) -> ClientId {
        self.add_client_with(ClientLimits::default(), None)
    }

    /// Register a client with its caps and the waker
    /// [`Engine::try_admit`] calls when a refused admission may succeed.
    pub fn add_client_with(&self, limits: ClientLimits, waker: Option<Waker>) -> ClientId {
        let mut st = lock(&self.shared.state);
        let q = ClientQ {
            ready: VecDeque::new(),
            limits,
            waker,
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
    /// flight, and count it (per-client caps only; the memory is taken by
    /// [`Engine::buffer`], which may wait for the budget itself).
    pub fn admit(&self, client: ClientId, bytes: u64) -> Ticket {
        let mut st = lock(&self.shared.state);
        while let Some(c) = st.clients[client.0 as usize].as_mut() {
            if c.requests == 0
                || (c.requests < c.limits.max_requests
                    && c.work + c.mem + bytes <= c.limits.max_bytes)
            {
                c.requests += 1;
                c.work += bytes;
                break;
            }
            c.watched = true;
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        Ticket {
            client: client.0,
            queue: u32::MAX,
            mem: 0,
            work: bytes,
        }
    }

    /// Admit a request of `client` on `q` that needs `mem` bytes of
    /// payload memory (see [`Engine::mem_cost`]) and causes `work` bytes of
    /// other work, or refuse it without waiting: `None` means "not now";
    /// the client's waker is called when trying again may succeed (a
    /// request of its own finished, or memory of the queue came back).
    /// See the module doc for the sharing rule.
    pub fn try_admit(&self, client: ClientId, q: &Queue, mem: u64, work: u64) -> Option<Ticket> {
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let qi = q.id as usize;
        let c = st.clients.get_mut(client.0 as usize)?.as_mut()?;
        if c.requests > 0
            && (c.requests >= c.limits.max_requests
                || c.work + c.mem + mem + work > c.limits.max_bytes)
        {
            c.blocked = true;
            return None;
        }
        let qs = &mut st.qstate[qi];
        let fits = qs.used + mem <= qs.limit;
        let ok = mem == 0
            || match qs.waiters.front() {
                None => fits,
                Some(&(h, _)) if h == client.0 => fits,
                Some(&(_, head)) => {
                    let share = qs.limit / u64::from(qs.active.max(1));
                    fits && (c.mem == 0 || c.mem + mem <= share) && qs.used + mem + head <= qs.limit
                }
            };
        let was = c.active();
        if !ok {
            if c.waiting {
                if let Some(w) = qs.waiters.iter_mut().find(|w| w.0 == client.0) {
                    w.1 = mem;
                }
            } else {
                c.waiting = true;
                qs.waiters.push_back((client.0, mem));
            }
            if !was {
                qs.active += 1;
            }
            return None;
        }
        if c.waiting {
            c.waiting = false;
            qs.waiters.retain(|w| w.0 != client.0);
        }
        c.mem += mem;
        qs.used += mem;
        c.requests += 1;
        c.work += work;
        c.queue = Some(q.id);
        match (was, c.active()) {
            (false, true) => qs.active += 1,
            (true, false) => qs.active -= 1,
            _ => {}
        }
        Some(Ticket {
            client: client.0,
            queue: q.id,
            mem,
            work,
        })
    }

    /// Give back an admission that was not submitted (e.g. the payload
    /// could not be read).
    pub fn cancel(&self, t: Ticket) {
        let mut st = lock(&self.shared.state);
        if t.mem > 0 {
            uncharge_locked(&mut st, t.client, t.queue, t.mem);
        }
        release(&mut st, &self.shared, t.client, t.work);
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
        // A device that waits on a network and takes submissions gets a
        // read, or a write of whole blocks (no read-modify-write), started
        // here and completed from its callback: no worker wakes for it.
        let submit = g.depth > 0
            && req.len > 0
            && req.buf.len() <= g.max_io
            && match req.op {
                Op::Read => true,
                Op::Write => req.head == 0 && req.len as usize == req.buf.len(),
                _ => false,
            }
            && q.device.can_submit();
        if t.mem > 0 {
            // Memory charged at admission but no buffer made: it comes back
            // when the request finishes.
            let mut st = lock(&self.shared.state);
            uncharge_locked(&mut st, t.client, t.queue, t.mem);
        }
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let mut deps = 0;
        for &e in &st.inflight[export] {
            if order::conflicts(&st.slots[e as usize].span, &span) {
                deps += 1;
            }
        }
        let held = st.holds[export].held;
        let cap = st.caps[export];
        let (queued, now, started) = if inline && deps == 0 && !held {
            (None, Some(req), None)
        } else if submit && deps == 0 && !held && (cap == 0 || st.holds[export].running < cap) {
            (None, None, Some(req))
        } else {
            (Some(req), None, None)
        };
        let cost = if matches!(kind, Kind::Read | Kind::Write) {
            (t.work + t.mem).max(4096)
        } else {
            4096
        };
        let slot = Slot {
            queue: queued.as_ref().map(|_| q.clone()),
            req: queued,
            export: export as u32,
            client: t.client,
            work: t.work,
            cost,
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
        if now.is_some() || started.is_some() {
            st.holds[export].running += 1;
        }
        if let Some(mut req) = started {
            // Registered like a running request (later conflicting ones
            // wait for it, a hold's drain counts it); `finish` runs in the
            // completion.
            drop(guard);
            let (buf, len) = (req.buf.as_mut_ptr(), req.buf.len());
            let io = AsyncIo {
                write: req.op == Op::Write,
                fua: req.fua,
                offset: req.offset - req.head as u64,
                buf,
                len,
                done: Box::new({
                    let (shared, q) = (self.shared.clone(), q.clone());
                    move |r| complete_submitted(shared, q, id, req, r)
                }),
            };
            // SAFETY: the buffer is the request's own (pool memory that
            // does not move with the request); the completion owns the
            // request, so nothing else touches the buffer and it lives
            // until `done`; the completion holds the queue and so the
            // device.
            unsafe { q.device.submit(io) };
            return;
        }
        if let Some(mut req) = now {
            // Its turn has come and it is small: run it on this thread. The
            // slot stays registered, so later conflicting requests of any
            // client wait for it exactly as for a worker-run request.
            drop(guard);
            let res = INLINE_SCRATCH
                .with(|s| exec::execute(q.device.as_ref(), g, &mut req, &mut s.borrow_mut()));
            let sink = req.sink.clone();
            sink.complete(&mut req, res);
            let mem = req.buf.free_and_take_charge();
            drop(req);
            let mut st = lock(&self.shared.state);
            finish(&mut st, &self.shared, id, mem);
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
                Some(c) if c.requests > 0 || c.mem > 0 => c.watched = true,
                _ => break,
            }
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        forget_waiter(&mut st, client.0);
        st.clients[client.0 as usize] = None;
        st.free_clients.push(client.0);
    }

    /// Forget `client` without waiting: its requests still run (their
    /// results go to its sink, which may drop them) and the client's slot
    /// is freed once nothing of it is in flight.
    pub fn close_client(&self, client: ClientId) {
        let mut st = lock(&self.shared.state);
        forget_waiter(&mut st, client.0);
        if let Some(c) = st.clients[client.0 as usize].as_mut() {
            c.closing = true;
            c.waker = None;
        }
        maybe_free_client(&mut st, client.0);
    }

    /// Whether `client` has no request in flight; if it has, its waker is
    /// called when the last one finishes.
    pub fn wake_when_idle(&self, client: ClientId) -> bool {
        let mut st = lock(&self.shared.state);
        match st.clients[client.0 as usize].as_mut() {
            Some(c) if c.requests > 0 => {
                c.idle_wake = true;
                false
            }
            _ => true,
        }
    }

    /// Requests of `client` admitted and not finished.
    pub fn client_requests(&self, client: ClientId) -> u32 {
        lock(&self.shared.state).clients[client.0 as usize]
            .as_ref()
            .map_or(0, |c| c.requests)
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

/// A request of `client` finished (or was cancelled): count it out and
/// wake whoever waits for that.
fn release(st: &mut State, shared: &Shared, client: u32, work: u64) {
    if let Some(c) = st.clients[client as usize].as_mut() {
        c.requests -= 1;
        c.work -= work;
        if c.blocked || (c.idle_wake && c.requests == 0) {
            c.blocked = false;
            c.idle_wake &= c.requests != 0;
            c.wake();
        }
        if c.watched {
            c.watched = false;
            shared.done.notify_all();
        }
    }
    maybe_free_client(st, client);
}

/// Give back `bytes` of payload memory of `client` on queue `qi`, and wake
/// the waiters of the queue that fit now (first come, first served).
fn uncharge_locked(st: &mut State, client: u32, qi: u32, bytes: u64) {
    if let Some(qs) = st.qstate.get_mut(qi as usize) {
        qs.used = qs.used.saturating_sub(bytes);
    }
    if let Some(c) = st.clients.get_mut(client as usize).and_then(|c| c.as_mut()) {
        let was = c.active();
        c.mem = c.mem.saturating_sub(bytes);
        if was && !c.active() {
            if let Some(qs) = st.qstate.get_mut(qi as usize) {
                qs.active = qs.active.saturating_sub(1);
            }
        }
        if c.blocked {
            c.blocked = false;
            c.wake();
        }
    }
    if let Some(qs) = st.qstate.get(qi as usize) {
        let mut free = qs.limit.saturating_sub(qs.used);
        for &(w, need) in &qs.waiters {
            if need > free {
                break;
            }
            free -= need;
            if let Some(Some(c)) = st.clients.get(w as usize) {
                c.wake();
            }
        }
    }
    maybe_free_client(st, client);
}

/// Take `client` out of its queue's waiter list.
fn forget_waiter(st: &mut State, client: u32) {
    let Some(Some(c)) = st.clients.get_mut(client as usize) else {
        return;
    };
    if !c.waiting {
        return;
    }
    c.waiting = false;
    let now_active = c.active();
    if let Some(qi) = c.queue {
        let qs = &mut st.qstate[qi as usize];
        qs.waiters.retain(|w| w.0 != client);
        if !now_active {
            qs.active = qs.active.saturating_sub(1);
        }
    } else {
        for qs in st.qstate.iter_mut() {
            let before = qs.waiters.len();
            qs.waiters.retain(|w| w.0 != client);
            if qs.waiters.len() != before && !now_active {
                qs.active = qs.active.saturating_sub(1);
            }
        }
    }
}

/// Free a closed client's slot once nothing of it is in flight.
fn maybe_free_client(st: &mut State, client: u32) {
    let done = matches!(
        st.clients.get(client as usize),
        Some(Some(c)) if c.closing && c.requests == 0 && c.mem == 0
    );
    if done {
        st.clients[client as usize] = None;
        st.free_clients.push(client);
    }
}

impl buf::Uncharge for Shared {
    fn uncharge(&self, client: u32, queue: u32, bytes: u64) {
        let mut st = lock(&self.state);
        uncharge_locked(&mut st, client, queue, bytes);
        if let Some(Some(c)) = st.clients.get_mut(client as usize) {
            if c.watched {
                c.watched = false;
                self.done.notify_all();
            }
        }
    }
}

/// Take the next ready request: deficit round robin over clients, one
/// request per turn; a client whose next request costs more than its
/// credit gets [`QUANTUM`] more, and goes to the back of the ring if that
/// is still not enough.
///
/// A client whose next request is for a queue already running its cap of
/// requests is passed over (it stays in the ring); a ring of only such
/// clients ends the search.
fn pop_ready(st: &mut State) -> Option<(u32, Request, Arc<Queue>)> {
    let mut passes = st.ring.len();
    while let Some(&client) = st.ring.front() {
        let Some(c) = st.clients[client as usize].as_mut() else {
            st.ring.pop_front();
            continue;
        };
        let Some(&id) = c.ready.front() else {
            c.in_ring = false;
            c.deficit = 0;
            st.ring.pop_front();
            continue;
        };
        let q = st.slots[id as usize].export as usize;
        let cap = st.caps[q];
        if cap > 0 && st.holds[q].running >= cap {
            st.ring.pop_front();
            st.ring.push_back(client);
            if passes == 0 {
                return None;
            }
            passes -= 1;
            continue;
        }
        let cost = st.slots[id as usize].cost;
        st.ring.pop_front();
        if c.deficit < cost {
            // Its turn brings a quantum of credit; a request that fits is
            // served in this same turn (else a client that just became
            // active would lose a round to one already in the ring).
            c.deficit += QUANTUM;
            if c.deficit < cost {
                st.ring.push_back(client);
                continue;
            }
        }
        c.deficit -= cost;
        c.ready.pop_front();
        if c.ready.is_empty() {
            c.in_ring = false;
            c.deficit = 0;
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
/// waited for it, free its slot. `mem`: the charge of its buffer, when the
/// buffer was freed (not kept by the sink).
fn finish(st: &mut State, shared: &Shared, id: u32, mem: Option<(u32, u32, u64)>) {
    let (export, client, work, span) = {
        let s = &st.slots[id as usize];
        (s.export as usize, s.client, s.work, s.span)
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
    if let Some((c, q, bytes)) = mem {
        uncharge_locked(st, c, q, bytes);
    }
    release(st, shared, client, work);
    st.free_slots.push(id);
}

/// The completion of a request started by [`BlockDevice::submit`], on the
/// device's callback thread: reply and finish as a worker would. A request
/// the device declined goes to the workers instead.
fn complete_submitted(
    shared: Arc<Shared>,
    q: Arc<Queue>,
    id: u32,
    mut req: Request,
    result: Option<DevResult<()>>,
) {
    let Some(res) = result else {
        let mut guard = lock(&shared.state);
        let st = &mut *guard;
        let export = q.id as usize;
        let h = &mut st.holds[export];
        h.running = h.running.saturating_sub(1);
        if h.held && h.running == 0 {
            shared.done.notify_all();
        }
        let slot = &mut st.slots[id as usize];
        slot.req = Some(req);
        slot.queue = Some(q);
        if ready_or_park(st, id) {
            shared.work.notify_one();
        }
        return;
    };
    let sink = req.sink.clone();
    sink.complete(&mut req, res);
    let mem = req.buf.free_and_take_charge();
    drop(req);
    let mut st = lock(&shared.state);
    finish(&mut st, &shared, id, mem);
    drop(st);
    // The queue (and so the device) must not be let go of for the last
    // time here, inside the device's own callback; the connection is held
    // until the request is finished, as on a worker.
    crate::core::device::drop_outside_callback(q);
    drop(sink);
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
        let sink = req.sink.clone();
        sink.complete(&mut req, res);
        let mem = req.buf.free_and_take_charge();
        drop(req);
        last = Some(q);
        st = lock(&shared.state);
        finish(&mut st, &shared, id, mem);
    }
}

#[cfg(test)]
mod tests;
