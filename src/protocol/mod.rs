//! Wire formats spoken on both sides of udm: the NBD protocol's constants
//! and header codecs, used by the server (`nbd/`) and by the NBD client
//! backing store (`store/nbd/`), and the one big-endian field codec
//! (`be.rs`) that they and the LUKS header readers share. Kept at the
//! bottom, beside `core`, so that a store below the server need not reach
//! up to it for them.

pub mod be;
pub mod nbd;
