//! The NBD server: fixed-newstyle handshake, transmission with simple and
//! structured replies, several named exports over Unix or TCP sockets.
//!
//! Layout, each file depending only on those listed before it: [`proto`]
//! (wire constants, header codecs), [`sock`] (the socket type), [`tls`]
//! (rustls configuration), [`export`] (the named devices a server offers,
//! changeable at runtime, with their allow-lists), [`handshake`] (option
//! haggling, a state machine), [`conn`] (one connection: replies and their
//! queue, the session state machine), [`handshaker`] (the thread that runs TLS handshakes off
//! the loops), [`spin`] (when a loop busy-polls), [`reactor`] (the event loops that
//! drive sessions), [`admission`] (the connection cap, per client), [`server`] (listen/accept/cap/shutdown). Request
//! execution, ordering and fairness live in [`crate::engine`].
//!
//! Copies per byte (why the buffers are laid out as they are):
//! - write: socket → pooled buffer (the kernel's `read`), then the store's
//!   `pwrite` (buffer → page cache): 2, none in udm. The buffer is handed to
//!   the device as `WriteBuf::Owned`, so crypt encrypts it in place. Bytes
//!   that arrived in the same segment as their request header (small
//!   pipelined writes; at most 16 KiB per batch) pass through the
//!   connection's header buffer: one more memcpy, traded for one `read`
//!   syscall per batch of headers instead of one per request.
//! - read: the store's `pread` into a pooled buffer, then one `writev` of
//!   reply header + data to the socket: 2, none in udm.
//! - partial-block writes: only the padding bytes of the head/tail blocks
//!   are copied (device → scratch → buffer); the client's bytes are not.

pub mod admission;
pub mod conn;
pub mod export;
pub mod handshake;
pub mod handshaker;
/// The wire format, shared with the NBD client store (see [`crate::protocol`]).
pub use crate::protocol::nbd as proto;
pub mod reactor;
pub mod server;
pub mod sock;
pub mod spin;
pub mod tls;

pub use conn::NetOptions;
pub use export::{Allow, Export, ExportSet, Exported};
pub use proto::DEFAULT_PORT;
pub use server::{
    serve, serve_with, serve_with_shutdown, Bound, Listen, ServeOptions, ServerConfig, ServerEvent,
};
pub use tls::{TlsMode, TlsOptions};
