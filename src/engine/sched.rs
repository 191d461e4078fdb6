//! Scheduling ready requests: deficit round robin over clients, the
//! per-queue worker cap, and the bookkeeping when a request finishes
//! (wake what waited for it in the ordering list).

use std::sync::Arc;

use super::admit::{release, uncharge_locked};
use super::order;
use super::request::{Request, QUANTUM};
use super::state::{Queue, Shared, State};

/// Make request `id` ready, or park it if its queue is held; true if it
/// became ready (a worker should be woken).
pub(super) fn ready_or_park(st: &mut State, id: u32) -> bool {
    let q = st.slots[id as usize].export as usize;
    if st.queues[q].hold.held {
        st.queues[q].hold.parked.push(id);
        false
    } else {
        make_ready(st, id);
        true
    }
}

pub(super) fn make_ready(st: &mut State, id: u32) {
    let client = st.slots[id as usize].client;
    if let Some(c) = st.clients[client as usize].as_mut() {
        c.ready.push_back(id);
        if !c.in_ring {
            c.in_ring = true;
            st.ring.push_back(client);
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
pub(super) fn pop_ready(st: &mut State) -> Option<(u32, Request, Arc<Queue>)> {
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
        let cap = st.queues[q].cap;
        if cap > 0 && st.queues[q].hold.running >= cap {
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
        if st.queues[export].hold.held {
            // Made ready before its queue was held: it waits for release.
            st.queues[export].hold.parked.push(id);
            continue;
        }
        let slot = &mut st.slots[id as usize];
        if let (Some(req), Some(q)) = (slot.req.take(), slot.queue.take()) {
            st.queues[export].hold.running += 1;
            return Some((id, req, q));
        }
    }
    None
}

/// Bookkeeping once request `id` has finished: release it, wake what
/// waited for it, free its slot. `mem`: the charge of its buffer, when the
/// buffer was freed (not kept by the sink).
pub(super) fn finish(st: &mut State, shared: &Shared, id: u32, mem: Option<(u32, u32, u64)>) {
    let (export, client, work, span) = {
        let s = &st.slots[id as usize];
        (s.export as usize, s.client, s.work, s.span)
    };
    let cap = st.queues[export].cap;
    if cap > 0 && st.queues[export].hold.running == cap {
        // A worker may have passed over this queue at its cap.
        shared.work.notify_one();
    }
    let list = &mut st.queues[export].inflight;
    if let Some(pos) = list.iter().position(|&x| x == id) {
        list.remove(pos);
        let mut i = pos;
        while i < st.queues[export].inflight.len() {
            let later = st.queues[export].inflight[i];
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
    let h = &mut st.queues[export].hold;
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
