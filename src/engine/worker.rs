//! The worker pool: starting the engine and its queues, the workers'
//! loop, flushing every device and shutting down.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use crate::core::{BlockDevice, DevResult};
use crate::mem::{default_total_budget, per_device_budget, Budget, BufPool};

use super::exec::{self, Geometry};
use super::request::{MAX_QUEUE_DEPTH, MAX_RESERVED_WORKERS};
use super::sched::{finish, pop_ready};
use super::state::{lock, Engine, Hold, QState, Queue, QueueState, Shared, State};

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
                queues: Vec::new(),
                reserved: 0,
                free_queues: Vec::new(),
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
                st.queues.push(QueueState {
                    inflight: Vec::with_capacity(256),
                    ..QueueState::default()
                });
                st.queues.len() as u32 - 1
            }
        };
        st.queues[id as usize].mem = QState {
            limit: pool.budget().limit().unwrap_or(u64::MAX),
            ..QState::default()
        };
        st.queues[id as usize].hold = Hold::default();
        st.queues[id as usize].cap = cap;
        st.reserved += cap as usize;
        let want = self.base + st.reserved.min(MAX_RESERVED_WORKERS);
        let q = Arc::new(Queue {
            id,
            device,
            geometry,
            pool,
            shared: Arc::downgrade(&self.shared),
        });
        st.queues[id as usize].handle = Some(Arc::downgrade(&q));
        drop(st);
        if let Err(e) = self.grow_workers(want) {
            // The queue still works with the workers there are, at a
            // lower depth; say why it is slower than asked.
            tracing::warn!("cannot start more request workers ({e}); a remote device runs with fewer requests in flight");
        }
        q
    }

    /// Flush every device; returns the first error.
    pub fn flush_all(&self) -> DevResult<()> {
        let live: Vec<Arc<Queue>> = lock(&self.shared.state)
            .queues
            .iter()
            .filter_map(|q| q.handle.as_ref()?.upgrade())
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

pub(super) fn worker(shared: Arc<Shared>) {
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
        if !exec::lend(q.device.as_ref(), &q.geometry, &mut req) {
            let res = exec::execute(q.device.as_ref(), &q.geometry, &mut req, &mut scratch);
            let sink = req.sink.clone();
            sink.complete(&mut req, res);
        }
        let mem = req.buf.free_and_take_charge();
        drop(req);
        last = Some(q);
        st = lock(&shared.state);
        finish(&mut st, &shared, id, mem);
    }
}
