//! Hostile and broken clients (issue 2, point 6): each case runs a
//! python-libnbd / raw-socket script (tests/nbd/bad_input.py) that asserts
//! the protocol's error and that the server still serves a fresh client.
//! The 4096-byte-block export also checks that the server never hands the
//! device a misaligned request.

mod common;

use std::sync::Arc;

use common::nbd::*;
use common::*;
use udm::core::{BlockDevice, DevError, DevResult, Limits, WriteBuf};
use udm::store::mem::MemStore;

/// A memory device with 4096-byte logical blocks that refuses any
/// misaligned call, as a 4K-sector crypt target would.
struct Strict4k(MemStore);

impl Strict4k {
    fn check(&self, offset: u64, len: u64) -> DevResult<()> {
        if offset % 4096 != 0 || len % 4096 != 0 {
            return Err(DevError::Misaligned {
                offset,
                len,
                align: 4096,
            });
        }
        Ok(())
    }
}

impl BlockDevice for Strict4k {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn limits(&self) -> Limits {
        Limits {
            logical_block_size: 4096,
            ..self.0.limits()
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: WriteBuf<'_>, fua: bool) -> DevResult<()> {
        self.check(offset, data.len() as u64)?;
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> DevResult<()> {
        self.0.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<()> {
        self.check(offset, len)?;
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.check(offset, len)?;
        self.0.write_zeroes(offset, len, fua)
    }
}

fn server() -> Server {
    let ro = Arc::new(MemStore::new(1 << 20));
    ro.write(0, WriteBuf::Borrowed(&[0x5A; 4096]), false)
        .unwrap();
    Server::start(
        vec![
            export("rw", Arc::new(MemStore::new(48 << 20)), false),
            export("ro", ro, true),
            export("b4k", Arc::new(Strict4k(MemStore::new(8 << 20))), false),
        ],
        2,
    )
}

fn case(name: &str) {
    need("nbdsh");
    let srv = server();
    let script = std::env::var("NBD_SCRIPT").unwrap_or("bad_input.py".into());
    let out = python(
        &format!("nbd/{script}"),
        &[srv.socket.to_str().unwrap(), name],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{name}: ok")),
        "script did not finish"
    );
    srv.stop().expect("server did not shut down cleanly");
}

#[test]
fn out_of_range() {
    case("out_of_range");
}

#[test]
fn oversize_requests() {
    case("oversize");
}

#[test]
fn unknown_command_and_flags() {
    case("unknown_command_and_flags");
}

#[test]
fn unknown_options_and_client_flags() {
    case("unknown_option");
}

#[test]
fn write_to_read_only_export() {
    case("read_only");
}

#[test]
fn misaligned_concurrent_writes_are_atomic() {
    case("misaligned_atomic");
}

#[test]
fn garbage_bytes() {
    case("garbage");
}

#[test]
fn client_vanishing_mid_request() {
    case("vanish");
}

#[test]
fn block_status_reports_the_devices_extents() {
    case("block_status");
}

#[test]
fn kernel_style_simple_replies_and_unaligned_io() {
    case("simple_replies");
}
