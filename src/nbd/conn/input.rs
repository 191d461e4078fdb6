//! A session's input: bytes read from the socket (or decrypted) and not
//! consumed yet, in a buffer borrowed from the event loop only while it
//! holds bytes, and whether more can come.

use std::cell::RefCell;
use std::io;

use super::reply::Conn;

/// Input bytes read but not consumed, in a buffer borrowed from the event
/// loop's free list only while it holds bytes.
#[derive(Default)]
pub(super) struct InBuf {
    buf: Option<Box<[u8]>>,
    start: usize,
    pub(super) end: usize,
}

const INBUF: usize = 16 << 10;

thread_local! {
    /// Input buffers not in use, per event loop thread.
    static FREE_INBUFS: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

impl InBuf {
    pub(super) fn avail(&self) -> usize {
        self.end - self.start
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[self.start..self.end],
            None => &[],
        }
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.release();
        }
    }

    /// Give the buffer back once it holds nothing.
    pub(super) fn release(&mut self) {
        self.start = 0;
        self.end = 0;
        if let Some(b) = self.buf.take() {
            FREE_INBUFS.with(|f| {
                let mut f = f.borrow_mut();
                if f.len() < 256 {
                    f.push(b);
                }
            });
        }
    }

    /// Room to read into, compacting first.
    pub(super) fn space(&mut self) -> &mut [u8] {
        let b = self.buf.get_or_insert_with(|| {
            FREE_INBUFS
                .with(|f| f.borrow_mut().pop())
                .unwrap_or_else(|| vec![0u8; INBUF].into_boxed_slice())
        });
        if self.start > 0 {
            b.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut b[self.end..]
    }
}

/// The input side of a session.
#[derive(Default)]
pub struct Input {
    pub(super) inb: InBuf,
    /// Plain socket: the last read returned less than asked, so the socket
    /// is empty until the next readable edge (saves a read that would
    /// return `WouldBlock`).
    pub drained: bool,
    /// No more input will be read (end of stream, DISC, shutdown).
    pub eof: bool,
}

impl Input {
    /// Read more input into the buffer: `Ok(false)` when none is there now.
    pub(super) fn fill(&mut self, conn: &Conn) -> io::Result<bool> {
        if self.drained {
            return Ok(false);
        }
        let tls = conn.is_tls();
        let inb = &mut self.inb;
        let space = inb.space();
        let want = space.len();
        match conn.read_input(space) {
            Ok(0) => {
                self.eof = true;
                if inb.avail() == 0 {
                    inb.release();
                }
                Ok(false)
            }
            Ok(n) => {
                inb.end += n;
                if n < want && !tls {
                    self.drained = true;
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !tls {
                    self.drained = true;
                }
                if inb.avail() == 0 {
                    inb.release();
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Make `n` bytes available in the input buffer (`n` ≤ its size).
    pub(super) fn need(&mut self, conn: &Conn, n: usize) -> io::Result<bool> {
        while self.inb.avail() < n {
            if self.eof || !self.fill(conn)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
