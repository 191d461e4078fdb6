//! One connection: the socket shared by the event loop and the workers
//! ([`Conn`]: replies and their queue), and the state machine that the
//! connection's event loop drives ([`Session`]: handshake framing, then
//! request parsing).
//!
//! Files, each using only those before it: `options` (limits, deadlines,
//! the server context), `reply` (the reply queue and NBD reply encoding),
//! `input` (buffered input), `validate` (request checks),
//! `transmit` (the request loop, step by step), `session` (handshake,
//! then transmission).
//!
//! Why this shape (the server at scale):
//! - **No thread per connection.** A session is a state machine driven by
//!   whichever event loop owns it, only when its socket has something
//!   (`nbd/reactor.rs`); a silent connection costs a few hundred bytes and
//!   no thread. Its input buffer is taken from the loop's free list while
//!   bytes are buffered and given back when they are consumed, so
//!   thousands of idle connections hold no buffers.
//! - **Nobody waits for a client.** Sockets are non-blocking. A reply that
//!   does not fit into the socket is queued on the connection (holding its
//!   payload buffer, which stays charged to the client), and the event
//!   loop sends the rest when the socket drains. While a client's queued
//!   replies exceed its byte cap, its requests are not read
//!   (back-pressure); a client whose replies make no progress for the
//!   reply deadline is dropped. So a client that never reads stalls only
//!   itself, and a worker never blocks in a send.
//! - **Admission never blocks either.** A request is parsed, checked
//!   against the export (every check that needs no device access happens
//!   here, so a bad request never costs a worker) and admitted by
//!   [`crate::engine::Engine::try_admit`]; when refused, the session stops reading until
//!   the engine wakes it.
//! - **Small requests stay inline.** A read or write of at most 64 KiB
//!   whose turn has come runs on the event loop that parsed it
//!   ([`crate::engine::Engine::submit_or_run`]): for 4 KiB the hand-off to a worker costs
//!   more than the I/O. Its reply usually goes out in the same `writev`
//!   as before.
//! - **Payloads are read straight into their buffer** once the batched
//!   header bytes are used up (one copy, the kernel's), except under TLS,
//!   where rustls decrypts into its own buffer first.

mod input;
mod options;
mod reply;
mod session;
mod transmit;
mod validate;

pub use input::Input;
pub use options::{Cx, NetOptions, DEFAULT_BUSY_POLL};
pub use reply::Conn;
pub use session::{Drive, Session};
