//! What a front end hands the engine and gets back: a [`Request`] with its
//! opaque completion tag, the [`Sink`] that receives it finished, the
//! [`Ticket`] of its admission, and the limits that bound a client.
//! Nothing here knows a wire format.

use std::sync::Arc;

use crate::core::{DevResult, Extent, Lent};

use super::buf::Buf;
use super::order::Kind;

/// Reads and writes up to this size whose turn has come when they arrive
/// run on the submitting thread (the connection's reader) instead of a
/// worker: for a 4 KiB request the hand-off (queue, wake a worker, switch)
/// costs more than the I/O itself. Larger requests, and any request that
/// must wait for an earlier one, go to the shared workers.
pub const INLINE_MAX: u64 = 64 << 10;

/// Reads from this size up are offered to the device's
/// [`crate::core::BlockDevice::lend`] first, on whatever thread has them (a
/// lent read is answered from the page cache, no waiting on a disk): one
/// copy into the socket instead of a read into a buffer and a send of it.
/// One page: measured against 64 KiB (docs/BENCHMARKS.md), 4 KiB random
/// reads gained too (the residency check costs less than the copy and,
/// on a disk file, the ring's system call it replaces).
pub const LEND_MIN: u64 = 4096;

/// Largest read the submitting thread (a connection's event loop, which
/// may serve other clients too) answers from lent bytes itself; larger
/// ones are lent by a worker. The copy of what the socket cannot take at
/// once happens on the thread that lends, and a 32 MiB copy would hold
/// the loop's other clients for milliseconds.
pub const LEND_LOOP_MAX: u64 = 1 << 20;

/// Most requests a device's [`crate::core::Limits::queue_depth`] may ask to
/// have running at once, and most workers all such devices together add to
/// the pool: a sleeping worker is cheap, but not free (a stack each).
pub const MAX_QUEUE_DEPTH: u32 = 128;

pub(super) const MAX_RESERVED_WORKERS: usize = 256;

/// Most requests one client may have admitted at once (default).
pub const MAX_CLIENT_REQUESTS: u32 = 128;

/// Most bytes one client may have in flight at once (default): payload
/// buffers, replies not sent yet, and the work of zeroing requests. A
/// single request of any legal size is always admitted when the client is
/// idle.
pub const MAX_CLIENT_BYTES: u64 = 64 << 20;

/// Deficit round robin: credit a client gets per turn when its next
/// request costs more than it has.
pub(super) const QUANTUM: u64 = 2 << 20;

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
/// post a notification) when a client refused by [`super::Engine::try_admit`] may
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
    pub(super) fn kind(self) -> Kind {
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

    /// Whether reads may be answered from lent bytes
    /// ([`Sink::complete_lent`]) now. Default `false`.
    fn takes_lent(&self) -> bool {
        false
    }

    /// Complete a read whose bytes the device lent where they lie
    /// ([`crate::core::BlockDevice::lend`]), laid out as `req.buf` would
    /// be (the client's bytes at `req.head`), valid only during this call.
    /// A sink sends what it can straight from them and must copy whatever
    /// it keeps for later (into `req.buf`, which it may take): once this
    /// returns, a write to the range may run. The default copies all.
    fn complete_lent(&self, req: &mut Request, data: &dyn Lent) {
        let r = data.copy_to(0, &mut req.buf);
        self.complete(req, r)
    }
}

/// A client's admission, returned by [`super::Engine::admit`] or
/// [`super::Engine::try_admit`]; pass it to [`super::Engine::submit`] or
/// [`super::Engine::cancel`].
#[must_use]
pub struct Ticket {
    pub(super) client: u32,
    pub(super) queue: u32,
    /// Payload memory charged and not yet attached to a buffer.
    pub(super) mem: u64,
    /// Work charged until the request finishes.
    pub(super) work: u64,
    /// Memory of a write whose payload the client still owes (see
    /// [`super::Engine::try_admit_payload`]); 0 once it arrived.
    pub(super) awaiting: u64,
}

/// A registered client (one NBD connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId(pub(super) u32);
