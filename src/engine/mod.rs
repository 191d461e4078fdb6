//! The request engine: a bounded pool of worker threads shared by every
//! connection, with per-export ordering and per-client fairness.
//!
//! Front-end neutral: a [`Request`] carries an opaque completion tag and
//! block-layer flags (FUA) only, and [`Op::Extents`] returns extents as
//! data; each front end (NBD, and the FUSE files of `fuse/`) encodes its own replies in
//! its [`Sink`].
//!
//! Files by job, each using only those listed before it: `order` (the
//! ordering rules), `buf` (payload buffers and their charge), `request`
//! (what a front end passes and gets back), `exec` (running one request
//! on a device), `state` (the shared state, one `QueueState` per device),
//! `admit` (admission and the budget), `sched` (deficit round robin and
//! finishing), `gate` (suspend), `submit` (inline, submitted or queued),
//! `worker` (the pool).
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
//! - **Memory a client holds hostage is bounded.** A large buffer's
//!   release may depend on the client alone (a write whose payload it
//!   does not send, a reply it does not read), so large requests together
//!   may use only three quarters of an export's budget: the rest is kept
//!   for small ones, and a 4 KiB read of a well-behaved client gets in
//!   whatever the others hold. Writes awaiting their payload
//!   ([`Engine::try_admit_payload`]) may hold at most half of the budget
//!   (one always may), and the front end drops a payload that makes no
//!   progress (`--payload-timeout`) and caps a client's unread replies at
//!   its [`Engine::fair_share`].
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
//!   asynchronous submissions ([`crate::core::BlockDevice::can_submit`], an RBD image
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

mod admit;
pub mod buf;
mod exec;
mod gate;
pub mod order;
mod request;
mod sched;
mod state;
mod submit;
mod worker;

pub use buf::Buf;
pub use request::{
    ClientId, ClientLimits, Op, Request, Sink, Ticket, Waker, INLINE_MAX, MAX_CLIENT_BYTES,
    MAX_CLIENT_REQUESTS, MAX_QUEUE_DEPTH,
};
pub use state::{Engine, Queue};

#[cfg(test)]
mod tests;
