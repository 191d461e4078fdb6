//! Admission and the memory budget: per-client caps, the fair share of
//! an export's budget, the waiters served first come first served, and
//! the charge a payload buffer carries until it is dropped. See the
//! module doc of [`crate::engine`] for the sharing rule.

use std::collections::VecDeque;

use super::buf::{self, Buf};
use super::request::{ClientId, ClientLimits, Ticket, Waker};
use super::state::{lock, ClientQ, Engine, QState, Queue, Shared, State};

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
            awaiting: 0,
        }
    }

    /// Admit a request of `client` on `q` that needs `mem` bytes of
    /// payload memory (see [`Engine::mem_cost`]) and causes `work` bytes of
    /// other work, or refuse it without waiting: `None` means "not now";
    /// the client's waker is called when trying again may succeed (a
    /// request of its own finished, or memory of the queue came back).
    /// See the module doc for the sharing rule.
    pub fn try_admit(&self, client: ClientId, q: &Queue, mem: u64, work: u64) -> Option<Ticket> {
        self.admit_on(client, q, mem, work, false)
    }

    /// [`Engine::try_admit`] for a write whose payload the client has not
    /// sent yet: its memory waits on the client, so writes awaiting their
    /// payload may together hold at most half of the export's budget (one
    /// always may), and each client at most its fair share once others
    /// wait. The wait ends with [`Engine::payload_received`], or at the
    /// latest when the request is submitted or cancelled.
    pub fn try_admit_payload(
        &self,
        client: ClientId,
        q: &Queue,
        mem: u64,
        work: u64,
    ) -> Option<Ticket> {
        self.admit_on(client, q, mem, work, true)
    }

    /// The payload of a ticket from [`Engine::try_admit_payload`] has
    /// arrived: its memory no longer waits on the client.
    pub fn payload_received(&self, t: &mut Ticket) {
        if t.awaiting > 0 {
            let mut st = lock(&self.shared.state);
            payload_done(&mut st, t.queue, std::mem::take(&mut t.awaiting));
        }
    }

    /// A fair share of `q`'s memory budget: the budget divided among the
    /// clients that use it or wait for it (a front end caps what a client
    /// that does not read its replies may have queued by it).
    pub fn fair_share(&self, q: &Queue) -> u64 {
        let st = lock(&self.shared.state);
        let qs = &st.queues[q.id as usize].mem;
        qs.limit / u64::from(qs.active.max(1))
    }

    fn admit_on(
        &self,
        client: ClientId,
        q: &Queue,
        mem: u64,
        work: u64,
        awaits: bool,
    ) -> Option<Ticket> {
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
        let was = c.active();
        if !memory_ok(qs, c, client.0, mem, awaits) {
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
        if qs.is_large(mem) {
            qs.large += mem;
        }
        let awaiting = if awaits { mem } else { 0 };
        qs.awaiting += awaiting;
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
            awaiting,
        })
    }

    /// Give back an admission that was not submitted (e.g. the payload
    /// could not be read).
    pub fn cancel(&self, t: Ticket) {
        let mut st = lock(&self.shared.state);
        if t.awaiting > 0 {
            payload_done(&mut st, t.queue, t.awaiting);
        }
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
        if qs.is_large(bytes) {
            qs.large = qs.large.saturating_sub(bytes);
        }
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
    wake_waiters(st, qi);
    maybe_free_client(st, client);
}

/// Wake the waiters of queue `qi` that fit into its free memory now,
/// first come first served.
fn wake_waiters(st: &State, qi: u32) {
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
}

/// `bytes` of queue `qi` no longer wait on a client's payload.
pub(super) fn payload_done(st: &mut State, qi: u32, bytes: u64) {
    if let Some(qs) = st.queues.get_mut(qi as usize).map(|q| &mut q.mem) {
        qs.awaiting = qs.awaiting.saturating_sub(bytes);
    }
    wake_waiters(st, qi);
}

/// The sharing rule (see the module doc of [`crate::engine`]): may
/// `client` (`c`) take `mem` more bytes of the queue's budget now?
/// `awaits`: the memory will wait on the client's payload.
fn memory_ok(qs: &QState, c: &ClientQ, client: u32, mem: u64, awaits: bool) -> bool {
    if mem == 0 {
        return true;
    }
    let fits = qs.used + mem <= qs.limit;
    let share = qs.limit / u64::from(qs.active.max(1));
    let large = qs.is_large(mem);
    // Large requests leave the reserve to small ones (one always may go,
    // so a lone client makes progress whatever its request size).
    if large && qs.large > 0 && qs.large + mem > qs.limit - qs.reserve() {
        return false;
    }
    if awaits && qs.awaiting > 0 && qs.awaiting + mem > qs.limit / 2 {
        return false;
    }
    match qs.waiters.front() {
        None => fits,
        Some(&(h, _)) if h == client => fits,
        Some(&(_, head)) => {
            // Others wait: nobody grows beyond an equal share, and the
            // head of the line keeps its place, except for a small
            // request that fits into the reserve.
            let small_fits = !large && qs.used - qs.large + mem <= qs.reserve();
            fits && (c.mem == 0 || c.mem + mem <= share)
                && (qs.used + mem + head <= qs.limit || small_fits)
        }
    }
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
