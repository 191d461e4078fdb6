//! The suspend gate (dm's suspend): a held queue starts no new request,
//! the running ones finish, the rest wait in arrival order.

use super::sched::make_ready;
use super::state::{lock, Engine, Queue};

impl Engine {
    /// Suspend `q` (dm's suspend): from now on no request of `q` starts;
    /// requests already running go on (wait for them with
    /// [`Engine::drain`]); the others wait, in arrival order, until
    /// [`Engine::release`]. Clients of other queues are not affected.
    /// Idempotent.
    pub fn hold(&self, q: &Queue) {
        lock(&self.shared.state).queues[q.id as usize].hold.held = true;
    }

    /// Wait until no request of `q` is running. With `q` held, this is
    /// the moment its device may change under the queue.
    pub fn drain(&self, q: &Queue) {
        let mut st = lock(&self.shared.state);
        while st.queues[q.id as usize].hold.running > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Undo [`Engine::hold`]: the requests that waited start, in the
    /// order they arrived.
    pub fn release(&self, q: &Queue) {
        let mut guard = lock(&self.shared.state);
        let st = &mut *guard;
        let h = &mut st.queues[q.id as usize].hold;
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
        for h in st.queues.iter_mut().map(|q| &mut q.hold) {
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
        lock(&self.shared.state).queues[q.id as usize].hold.held
    }
}
