//! Admission and the memory budget: per-client caps, the fair share of
//! an export's budget, the waiters served first come first served, and
//! the charge a payload buffer carries until it is dropped. See the
//! module doc of [`crate::engine`] for the sharing rule.

use std::collections::VecDeque;

use super::buf::{self, Buf};
use super::request::{ClientId, ClientLimits, Ticket, Waker};
use super::state::{lock, ClientQ, Engine, Queue, Shared, State};

impl Engine {
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
        lock(&self.shared.state).queues[q.id as usize].mem.limit
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
        let qs = &mut st.queues[qi].mem;
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
}

/// A request of `client` finished (or was cancelled): count it out and
/// wake whoever waits for that.
pub(super) fn release(st: &mut State, shared: &Shared, client: u32, work: u64) {
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
pub(super) fn uncharge_locked(st: &mut State, client: u32, qi: u32, bytes: u64) {
    if let Some(qs) = st.queues.get_mut(qi as usize).map(|q| &mut q.mem) {
        qs.used = qs.used.saturating_sub(bytes);
    }
    if let Some(c) = st.clients.get_mut(client as usize).and_then(|c| c.as_mut()) {
        let was = c.active();
        c.mem = c.mem.saturating_sub(bytes);
        if was && !c.active() {
            if let Some(qs) = st.queues.get_mut(qi as usize).map(|q| &mut q.mem) {
                qs.active = qs.active.saturating_sub(1);
            }
        }
        if c.blocked {
            c.blocked = false;
            c.wake();
        }
    }
    if let Some(qs) = st.queues.get(qi as usize).map(|q| &q.mem) {
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
pub(super) fn forget_waiter(st: &mut State, client: u32) {
    let Some(Some(c)) = st.clients.get_mut(client as usize) else {
        return;
    };
    if !c.waiting {
        return;
    }
    c.waiting = false;
    let now_active = c.active();
    if let Some(qi) = c.queue {
        let qs = &mut st.queues[qi as usize].mem;
        qs.waiters.retain(|w| w.0 != client);
        if !now_active {
            qs.active = qs.active.saturating_sub(1);
        }
    } else {
        for qs in st.queues.iter_mut().map(|q| &mut q.mem) {
            let before = qs.waiters.len();
            qs.waiters.retain(|w| w.0 != client);
            if qs.waiters.len() != before && !now_active {
                qs.active = qs.active.saturating_sub(1);
            }
        }
    }
}

/// Free a closed client's slot once nothing of it is in flight.
pub(super) fn maybe_free_client(st: &mut State, client: u32) {
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
