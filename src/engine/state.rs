//! The engine's shared state, under one lock: the request slab, one
//! [`QueueState`] per device (ordering list, memory budget, worker cap,
//! suspend gate), the clients and the scheduler's ring.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use crate::core::BlockDevice;
use crate::mem::BufPool;

use super::exec::Geometry;
use super::order::Span;
use super::request::{ClientLimits, Request, Waker};

/// One device as the engine schedules it: its ordering list, geometry and
/// buffer pool. Handed out by [`Engine::add_queue`] and held by whoever
/// submits to it (an NBD export); a queued request holds it too, so a queue
/// outlives its last request. Dropping the last handle retires it.
pub struct Queue {
    pub(super) id: u32,
    pub(super) device: Arc<dyn BlockDevice>,
    pub(super) geometry: Geometry,
    pub(super) pool: Arc<BufPool>,
    pub(super) shared: Weak<Shared>,
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
            let q = &mut st.queues[self.id as usize];
            q.handle = None;
            q.mem = QState::default();
            q.inflight.clear();
            let cap = std::mem::take(&mut q.cap);
            st.reserved -= cap as usize;
            st.free_queues.push(self.id);
        }
    }
}

pub(super) struct Slot {
    pub(super) req: Option<Request>,
    /// The queue, for requests a worker runs (inline ones need none).
    pub(super) queue: Option<Arc<Queue>>,
    pub(super) export: u32,
    pub(super) client: u32,
    /// Work charged to the client until the request finishes.
    pub(super) work: u64,
    /// What the request costs in the fair scheduler (bytes moved).
    pub(super) cost: u64,
    pub(super) span: Span,
    /// Earlier conflicting requests not finished yet.
    pub(super) deps: u32,
    pub(super) waiting: bool,
}

#[derive(Default)]
pub(super) struct ClientQ {
    pub(super) ready: VecDeque<u32>,
    pub(super) in_ring: bool,
    pub(super) requests: u32,
    /// Work of admitted requests (zeroing, legacy admissions).
    pub(super) work: u64,
    /// Payload memory charged to this client (buffers alive).
    pub(super) mem: u64,
    pub(super) limits: ClientLimits,
    pub(super) waker: Option<Waker>,
    /// The queue this client's memory is charged to.
    pub(super) queue: Option<u32>,
    /// In its queue's waiter list.
    pub(super) waiting: bool,
    /// Refused by its own caps; woken when a request of its finishes.
    pub(super) blocked: bool,
    /// Gone: the slot is freed when nothing is in flight any more.
    pub(super) closing: bool,
    /// Deficit round robin credit.
    pub(super) deficit: u64,
    /// Wake the client when its last request finishes.
    pub(super) idle_wake: bool,
    /// Someone waits in admit/drain for this client's counters to drop.
    pub(super) watched: bool,
}

impl ClientQ {
    pub(super) fn active(&self) -> bool {
        self.mem > 0 || self.waiting
    }

    pub(super) fn wake(&self) {
        if let Some(w) = &self.waker {
            w();
        }
    }
}

/// Memory accounting of one queue (export): its budget shared fairly.
#[derive(Default)]
pub(super) struct QState {
    pub(super) limit: u64,
    pub(super) used: u64,
    /// Clients with memory charged or waiting for it.
    pub(super) active: u32,
    /// Clients refused for memory, first come first served: (client, bytes).
    pub(super) waiters: VecDeque<(u32, u64)>,
    /// Of `used`: charges of large requests ([`QState::is_large`]).
    pub(super) large: u64,
    /// Of `used`: charges of writes whose payload the client still owes.
    pub(super) awaiting: u64,
}

impl QState {
    /// Kept for small requests: large ones together may not use it, so
    /// clients that hold large buffers hostage (a stalled payload, replies
    /// never read) cannot lock the others out.
    pub(super) fn reserve(&self) -> u64 {
        self.limit / 4
    }

    /// Whether a charge of `bytes` counts as large (may not use the
    /// reserve).
    pub(super) fn is_large(&self, bytes: u64) -> bool {
        bytes > self.reserve() / 16
    }
}

/// What the engine keeps per queue (one device).
#[derive(Default)]
pub(super) struct QueueState {
    /// Unfinished requests in arrival order.
    pub(super) inflight: Vec<u32>,
    /// The live queue (for [`Engine::flush_all`]); `None` once retired.
    pub(super) handle: Option<Weak<Queue>>,
    /// Its memory budget and who shares it.
    pub(super) mem: QState,
    /// Most requests running on workers at once (0 = no cap; how many
    /// run now is `hold.running`).
    pub(super) cap: u32,
    /// The suspend gate, and the requests running right now.
    pub(super) hold: Hold,
}

pub(super) struct State {
    pub(super) slots: Vec<Slot>,
    pub(super) free_slots: Vec<u32>,
    /// Per queue, by id; ids of retired queues are reused.
    pub(super) queues: Vec<QueueState>,
    /// Workers reserved by capped queues (sum of their caps); the pool
    /// grows to `base + reserved` and never shrinks.
    pub(super) reserved: usize,
    pub(super) free_queues: Vec<u32>,
    pub(super) clients: Vec<Option<ClientQ>>,
    pub(super) free_clients: Vec<u32>,
    pub(super) ring: VecDeque<u32>,
    pub(super) stop: bool,
}

/// The suspend gate of one queue (dm's suspend: no new request starts,
/// the running ones finish, the rest wait in arrival order).
#[derive(Default)]
pub(super) struct Hold {
    pub(super) held: bool,
    pub(super) running: u32,
    pub(super) parked: Vec<u32>,
}

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) work: Condvar,
    pub(super) done: Condvar,
}

/// The worker pool and request scheduler. Cheap to share (`Arc`).
pub struct Engine {
    pub(super) shared: Arc<Shared>,
    pub(super) workers: Mutex<Vec<JoinHandle<()>>>,
    /// Workers for devices that complete in the caller's time.
    pub(super) base: usize,
    /// The queues made by [`Engine::new`]/[`Engine::with_pools`], by index.
    pub(super) initial: Vec<Arc<Queue>>,
}

pub(super) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
