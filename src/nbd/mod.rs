//! The NBD server: fixed-newstyle handshake, transmission with simple and
//! structured replies, several named exports over Unix or TCP sockets.
//!
//! Layout: [`proto`] (wire constants, header codecs), [`handshake`]
//! (option haggling), [`conn`] (one connection's transmission phase),
//! [`server`] (listen/accept/shutdown), [`sock`] (the socket type). Request
//! execution, ordering and fairness live in [`crate::engine`].

pub mod conn;
pub mod handshake;
pub mod proto;
pub mod server;
pub mod sock;

pub use server::{
    serve, serve_with, serve_with_shutdown, Export, Listen, ServeOptions, ServerConfig,
    DEFAULT_PORT,
};
