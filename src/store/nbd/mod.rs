//! A remote NBD export as a backing store: udm as an NBD *client*, so a
//! table can stack on nbdkit, qemu-nbd, another udm or a remote machine.
//!
//! One file per job, each using only those listed before it:
//! - `spec.rs`: what an export is called (address and name);
//! - `sock.rs`: the TCP or Unix socket;
//! - `handshake.rs`: connecting and negotiating (fixed newstyle,
//!   structured replies, `GO` with block sizes);
//! - `slots.rs`: many requests in flight: every call takes a slot (its
//!   index and a sequence number form the NBD cookie) and sleeps on it;
//! - `reader.rs`: one reader thread per connection matches replies to
//!   slots and reads read data straight into the waiting buffer;
//! - `conn.rs`: one connection (sender, slot table, reader thread);
//! - `reconnect.rs`: a broken connection is reopened (backoff from 50 ms
//!   to 1 s) and requests in flight are **sent again** on it. A request
//!   that has not got through within [`RETRY_WINDOW`] of the break, or
//!   whose connection broke [`MAX_ATTEMPTS`] times, fails with EIO naming
//!   the export; later requests try again, so a server that comes back
//!   later is used without a restart of udm.
//!
//! Calls are synchronous like every [`BlockDevice`]; the engine gives this
//! store [`QUEUE_DEPTH`] workers of its own (see `Limits::queue_depth`), so
//! that many requests are on the wire at once. The wire format's constants
//! and header codecs are `protocol::nbd`'s, shared with the server.
//!
//! What a resend cannot repair: a server that *lost* writes it had
//! acknowledged but not yet flushed (a crash of a server with a volatile
//! cache). nbdkit and qemu-nbd over a file keep such writes in the kernel's
//! page cache, which outlives their process. A timed-out write's outcome
//! is unknown (the server may still apply it): the caller gets EIO, as
//! from a disk that stopped answering.

mod conn;
mod handshake;
mod reader;
mod reconnect;
mod slots;
mod sock;
mod spec;

use std::io::IoSlice;
use std::time::Duration;

use crate::core::device::write_zeroes_by_writing;
use crate::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use crate::protocol::nbd::{
    CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES, TF_READ_ONLY,
    TF_SEND_FLUSH, TF_SEND_FUA, TF_SEND_TRIM, TF_SEND_WRITE_ZEROES,
};

use conn::ClientConn;
use handshake::ExportInfo;
use reconnect::Reconnector;

pub use reconnect::{MAX_ATTEMPTS, REQUEST_TIMEOUT, RETRY_WINDOW};
pub use spec::{NbdAddr, NbdSpec};

/// Requests this store asks the engine to keep in flight.
pub const QUEUE_DEPTH: u32 = 64;

/// A remote NBD export used as a block device.
pub struct NbdStore {
    info: ExportInfo,
    structured: bool,
    read_only: bool,
    remote: Reconnector,
}

impl NbdStore {
    /// Connect to the export; `read_only` also when the server says so.
    pub fn connect(spec: NbdSpec, read_only: bool) -> Result<NbdStore, String> {
        let conn = ClientConn::open(&spec).map_err(|e| format!("NBD export {spec}: {e}"))?;
        if conn.info.flags & TF_READ_ONLY != 0 && !read_only {
            tracing::info!("NBD export {spec} is read-only on the server; serving it read-only");
        }
        Ok(NbdStore {
            info: conn.info,
            structured: conn.structured,
            read_only: read_only || conn.info.flags & TF_READ_ONLY != 0,
            remote: Reconnector::new(spec, conn),
        })
    }

    /// How long requests wait for a broken connection to come back
    /// (default [`RETRY_WINDOW`]).
    pub fn with_retry_window(mut self, d: Duration) -> NbdStore {
        self.remote.retry_window = d;
        self
    }

    /// How long a request may wait for its reply, resends included
    /// (default [`REQUEST_TIMEOUT`]).
    pub fn with_request_timeout(mut self, d: Duration) -> NbdStore {
        self.remote.request_timeout = d;
        self
    }

    /// Whether the server agreed to structured replies.
    pub fn structured_replies(&self) -> bool {
        self.structured
    }

    fn write_cmd(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let native_fua = fua && self.info.flags & TF_SEND_FUA != 0;
        let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
        self.remote
            .run(CMD_WRITE, flags, offset, len as u32, bufs, None)?;
        if fua && !native_fua {
            self.flush()?;
        }
        Ok(())
    }
}

impl Drop for NbdStore {
    fn drop(&mut self) {
        self.remote.close();
    }
}

impl BlockDevice for NbdStore {
    fn size(&self) -> u64 {
        self.info.size
    }

    fn limits(&self) -> Limits {
        let block = self.info.min_block.max(512);
        let max = self.info.max_payload.max(block) / block * block;
        Limits {
            logical_block_size: block,
            optimal_io_size: block.max(4096),
            max_io_size: max,
            discard: self.info.flags & TF_SEND_TRIM != 0,
            write_zeroes: self.info.flags & TF_SEND_WRITE_ZEROES != 0,
            read_only: self.read_only,
            queue_depth: QUEUE_DEPTH,
            io_boundary: 0,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let max = self.limits().max_io_size as usize;
        let mut pos = 0;
        while pos < buf.len() {
            let n = (buf.len() - pos).min(max);
            let at = offset + pos as u64;
            self.remote
                .run(CMD_READ, 0, at, n as u32, &[], Some(&mut buf[pos..pos + n]))?;
            pos += n;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        let b = data.as_slice();
        let max = self.limits().max_io_size as usize;
        let mut pos = 0;
        while pos < b.len() {
            let n = (b.len() - pos).min(max);
            self.write_cmd(offset + pos as u64, &[IoSlice::new(&b[pos..pos + n])], fua)?;
            pos += n;
        }
        Ok(())
    }

    fn write_vectored(&self, offset: u64, bufs: &[IoSlice<'_>], fua: bool) -> DevResult<()> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if len <= self.limits().max_io_size as usize {
            return self.write_cmd(offset, bufs, fua);
        }
        let mut pos = offset;
        for (i, b) in bufs.iter().enumerate() {
            self.write(pos, WriteBuf::Borrowed(b), fua && i + 1 == bufs.len())?;
            pos += b.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only || self.info.flags & TF_SEND_FLUSH == 0 {
            return Ok(());
        }
        self.remote.run(CMD_FLUSH, 0, 0, 0, &[], None)
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        if self.info.flags & TF_SEND_TRIM == 0 {
            return Ok(());
        }
        let step = (u32::MAX as u64 / 2) & !(u64::from(self.limits().logical_block_size) - 1);
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(step);
            self.remote
                .run(CMD_TRIM, 0, offset + pos, n as u32, &[], None)?;
            pos += n;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        if self.info.flags & TF_SEND_WRITE_ZEROES == 0 {
            return write_zeroes_by_writing(self, offset, len, fua);
        }
        let native_fua = fua && self.info.flags & TF_SEND_FUA != 0;
        let flags = if native_fua { CMD_FLAG_FUA } else { 0 };
        let step = (u32::MAX as u64 / 2) & !(u64::from(self.limits().logical_block_size) - 1);
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(step);
            self.remote
                .run(CMD_WRITE_ZEROES, flags, offset + pos, n as u32, &[], None)?;
            pos += n;
        }
        if fua && !native_fua {
            self.flush()?;
        }
        Ok(())
    }
}
