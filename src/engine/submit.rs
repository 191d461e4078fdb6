//! Submitting an admitted request: register it in its queue's ordering
//! list, then run it inline (small, its turn has come), start it on a
//! device that takes asynchronous submissions, or hand it to the workers.

use std::sync::Arc;

use crate::core::{AsyncIo, DevResult};

use super::admit::{payload_done, uncharge_locked};
use super::exec;
use super::order::{self, Kind, Span};
use super::request::{Op, Request, Ticket, INLINE_MAX, LEND_LOOP_MAX};
use super::sched::{finish, ready_or_park};
use super::state::{lock, Engine, Queue, Shared, Slot, State};

impl Engine {
    /// Queue an admitted request on `q`. It runs once every earlier
    /// conflicting request of that queue has finished, on a worker.
    pub fn submit(&self, t: Ticket, q: &Arc<Queue>, req: Request) {
        self.submit_with(t, q, req, false)
    }

    /// Like [`Engine::submit`], but a small read or write whose turn has
    /// already come runs right here on the calling thread (the event loop
    /// or FUSE thread that read it), which saves the hand-off to a worker
    /// ([`INLINE_MAX`]). That thread serves other clients too, so only
    /// work bounded by the request's size may run here: a device whose
    /// request can cost more (a verity repair, a chunk copy) declares a
    /// queue depth or declines the submission, and runs on workers.
    pub fn submit_or_run(&self, t: Ticket, q: &Arc<Queue>, req: Request) {
        self.submit_with(t, q, req, true)
    }

    fn submit_with(&self, t: Ticket, q: &Arc<Queue>, req: Request, may_inline: bool) {
        let g = &q.geometry;
        let export = q.id as usize;
        let kind = req.op.kind();
        let span = span_of(&req, g.block);
        let inline = may_inline
            && g.depth == 0
            && req.len <= INLINE_MAX
            && matches!(req.op, Op::Read | Op::Write);
        let submit = submittable(q, &req);
        let lend =
            may_inline && req.len <= LEND_LOOP_MAX && exec::lendable(q.device.as_ref(), &req);
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        // A payload, if one was awaited, is in (under the same lock, so a
        // write costs no extra lock round).
        if t.awaiting > 0 {
            payload_done(st, t.queue, t.awaiting);
        }
        if t.mem > 0 {
            // Memory charged at admission but no buffer made: it comes
            // back now (a buffer's own charge comes back when it is
            // dropped).
            uncharge_locked(st, t.client, t.queue, t.mem);
        }
        let mut deps = 0;
        for &e in &st.queues[export].inflight {
            if order::conflicts(&st.slots[e as usize].span, &span) {
                deps += 1;
            }
        }
        let held = st.queues[export].hold.held;
        let cap = st.queues[export].cap;
        let free = deps == 0 && !held;
        let (queued, now, started) = if inline && free {
            (None, Some(req), None)
        } else if submit && free && (cap == 0 || st.queues[export].hold.running < cap) {
            (None, None, Some(req))
        } else if lend && free {
            // A large read answered here if the device lends it, else
            // handed to the workers after all.
            (None, Some(req), None)
        } else {
            (Some(req), None, None)
        };
        let cost = if matches!(kind, Kind::Read | Kind::Write) {
            (t.work + t.mem).max(4096)
        } else {
            4096
        };
        let id = put_slot(
            st,
            Slot {
                queue: queued.as_ref().map(|_| q.clone()),
                req: queued,
                export: export as u32,
                client: t.client,
                work: t.work,
                cost,
                span,
                deps,
                waiting: deps > 0,
            },
        );
        st.queues[export].inflight.push(id);
        if now.is_some() || started.is_some() {
            st.queues[export].hold.running += 1;
        }
        if let Some(req) = started {
            drop(guard);
            self.start_submitted(q, id, req, lend);
        } else if let Some(req) = now {
            drop(guard);
            self.run_inline(q, id, req, inline);
        } else if deps == 0 && ready_or_park(st, id) {
            self.shared.work.notify_one();
        }
    }

    /// Start request `id` on a device that takes submissions. It is
    /// registered like a running request (later conflicting ones wait for
    /// it, a hold's drain counts it); `finish` runs in the completion.
    ///
    /// A read the device lends (`lend`) is answered from there at once.
    fn start_submitted(&self, q: &Arc<Queue>, id: u32, mut req: Request, lend: bool) {
        if lend && exec::lend(q.device.as_ref(), &q.geometry, &mut req) {
            return self.finished_here(id, req);
        }
        let (buf, len) = (req.buf.as_mut_ptr(), req.buf.len());
        let io = AsyncIo {
            write: req.op == Op::Write,
            fua: req.fua,
            offset: req.offset - req.head as u64,
            buf,
            len,
            prepare: None,
            done: Box::new({
                let (shared, q) = (self.shared.clone(), q.clone());
                move |r| complete_submitted(shared, q, id, req, r)
            }),
        };
        // SAFETY: the buffer is the request's own (pool memory that does
        // not move with the request); the completion owns the request, so
        // nothing else touches the buffer and it lives until `done`; the
        // completion holds the queue and so the device.
        unsafe { q.device.submit(io) };
    }

    /// Run request `id` on this thread: its turn has come and it is small
    /// (`small`), or it is a large read the device may lend. The slot stays
    /// registered, so later conflicting requests of any client wait for it
    /// exactly as for a worker-run request. A large read the device does
    /// not lend goes to the workers.
    fn run_inline(&self, q: &Arc<Queue>, id: u32, mut req: Request, small: bool) {
        let g = &q.geometry;
        if !exec::lend(q.device.as_ref(), g, &mut req) {
            if !small {
                return to_workers(&self.shared, q, id, req);
            }
            let res = INLINE_SCRATCH
                .with(|s| exec::execute(q.device.as_ref(), g, &mut req, &mut s.borrow_mut()));
            let sink = req.sink.clone();
            sink.complete(&mut req, res);
        }
        self.finished_here(id, req)
    }

    /// Request `id` was answered on this thread: its slot goes.
    fn finished_here(&self, id: u32, mut req: Request) {
        let mem = req.buf.free_and_take_charge();
        drop(req);
        let mut st = lock(&self.shared.state);
        finish(&mut st, &self.shared, id, mem);
    }
}

/// The range a request locks for ordering (a flush locks none).
fn span_of(req: &Request, block: u64) -> Span {
    let kind = req.op.kind();
    if kind == Kind::Flush {
        Span {
            kind,
            start: 0,
            end: 0,
        }
    } else {
        Span::widened(kind, req.offset, req.len, block)
    }
}

/// A device that waits on a network and takes submissions gets a read,
/// or a write of whole blocks (no read-modify-write), started on the
/// submitting thread and completed from its callback: no worker wakes.
fn submittable(q: &Queue, req: &Request) -> bool {
    let g = &q.geometry;
    g.depth > 0
        && req.len > 0
        && req.buf.len() <= g.max_io
        && match req.op {
            Op::Read => true,
            Op::Write => req.head == 0 && req.len as usize == req.buf.len(),
            _ => false,
        }
        && q.device.can_submit()
}

/// Put `slot` into a free slot of the slab (or a new one): its id.
fn put_slot(st: &mut State, slot: Slot) -> u32 {
    if let Some(id) = st.free_slots.pop() {
        st.slots[id as usize] = slot;
        id
    } else {
        st.slots.push(slot);
        st.slots.len() as u32 - 1
    }
}

thread_local! {
    /// Partial-block scratch for requests run inline by a reader thread.
    static INLINE_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Hand request `id`, counted as running on this thread, to the workers
/// (a declined submission, a large read the device did not lend).
fn to_workers(shared: &Shared, q: &Arc<Queue>, id: u32, req: Request) {
    let mut guard = lock(&shared.state);
    let st = &mut *guard;
    let export = q.id as usize;
    let h = &mut st.queues[export].hold;
    h.running = h.running.saturating_sub(1);
    if h.held && h.running == 0 {
        shared.done.notify_all();
    }
    let slot = &mut st.slots[id as usize];
    slot.req = Some(req);
    slot.queue = Some(q.clone());
    if ready_or_park(st, id) {
        shared.work.notify_one();
    }
}

/// The completion of a request started by [`crate::core::BlockDevice::submit`], on the
/// device's callback thread: reply and finish as a worker would. A request
/// the device declined goes to the workers instead.
pub(super) fn complete_submitted(
    shared: Arc<Shared>,
    q: Arc<Queue>,
    id: u32,
    mut req: Request,
    result: Option<DevResult<()>>,
) {
    let Some(res) = result else {
        return to_workers(&shared, &q, id, req);
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
