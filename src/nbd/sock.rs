//! One type for a client connection over a Unix or TCP socket, so the
//! handshake and the transmission code do not care which it is. Reads and
//! writes go through `&Sock`, so a reader thread and worker threads share
//! one descriptor without cloning it.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[derive(Debug)]
pub enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    pub fn shutdown(&self, how: Shutdown) {
        // The peer may already be gone; shutting a dead socket is harmless.
        let _ = match self {
            Sock::Unix(s) => s.shutdown(how),
            Sock::Tcp(s) => s.shutdown(how),
        };
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tcp(s) => s.set_write_timeout(t),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub fn peer(&self) -> String {
        match self {
            Sock::Unix(_) => "unix".to_string(),
            Sock::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp".to_string(), |a| a.to_string()),
        }
    }

    /// Read exactly `buf.len()` bytes. `Ok(false)` on a clean end of stream
    /// before the first byte (the client went away between messages).
    pub fn read_full(&self, buf: &mut [u8]) -> io::Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            let n = match (&*self).read(&mut buf[got..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                if got == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed the connection in the middle of a message",
                ));
            }
            got += n;
        }
        Ok(true)
    }

    /// Read exactly `buf.len()` bytes; end of stream is an error.
    pub fn read_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() || self.read_full(buf)? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client closed the connection",
            ))
        }
    }

    /// Read and throw away `n` bytes (an oversize or refused payload).
    pub fn skip(&self, mut n: u64) -> io::Result<()> {
        let mut sink = [0u8; 16 << 10];
        while n > 0 {
            let k = (n as usize).min(sink.len());
            self.read_exact(&mut sink[..k])?;
            n -= k as u64;
        }
        Ok(())
    }

    /// Write every byte of `bufs` (one `writev` in the common case).
    pub fn write_all_vectored(&self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let r = match self {
                Sock::Unix(s) => (&*s).write_vectored(bufs),
                Sock::Tcp(s) => (&*s).write_vectored(bufs),
            };
            match r {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "client stopped accepting data",
                    ))
                }
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        self.write_all_vectored(&mut [IoSlice::new(buf)])
    }
}

impl Read for &Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&*s).read(buf),
            Sock::Tcp(s) => (&*s).read(buf),
        }
    }
}

/// Buffered reading of a connection's request stream. Request headers are
/// 28 bytes and a pipelining client sends dozens at once: reading them
/// through a small buffer takes one syscall per batch instead of one per
/// header. Payloads larger than half the buffer are read straight into
/// their destination (only bytes that already arrived with a header pass
/// through the buffer), so large writes keep their single copy.
pub struct Reader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Reader {
    pub const CAPACITY: usize = 16 << 10;

    pub fn new() -> Reader {
        Reader {
            buf: vec![0u8; Self::CAPACITY].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Fill `out` completely. `Ok(false)`: clean end of stream before the
    /// first byte.
    pub fn read_full(&mut self, sock: &Sock, out: &mut [u8]) -> io::Result<bool> {
        let mut got = self.take(out);
        if got == out.len() {
            return Ok(true);
        }
        if out.len() - got >= Self::CAPACITY / 2 {
            // Large remainder: straight into the destination.
            let rest = &mut out[got..];
            if !sock.read_full(rest)? {
                return if got == 0 {
                    Ok(false)
                } else {
                    Err(Self::eof_mid_message())
                };
            }
            return Ok(true);
        }
        while got < out.len() {
            let n = loop {
                match (&*sock).read(&mut self.buf[..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            if n == 0 {
                return if got == 0 {
                    Ok(false)
                } else {
                    Err(Self::eof_mid_message())
                };
            }
            self.start = 0;
            self.end = n;
            got += self.take(&mut out[got..]);
        }
        Ok(true)
    }

    /// Fill `out` completely; end of stream is an error.
    pub fn read_exact(&mut self, sock: &Sock, out: &mut [u8]) -> io::Result<()> {
        if out.is_empty() || self.read_full(sock, out)? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client closed the connection",
            ))
        }
    }

    /// Read and throw away `n` bytes.
    pub fn skip(&mut self, sock: &Sock, mut n: u64) -> io::Result<()> {
        let buffered = ((self.end - self.start) as u64).min(n);
        self.start += buffered as usize;
        n -= buffered;
        sock.skip(n)
    }

    /// Move buffered bytes into `out`; returns how many.
    fn take(&mut self, out: &mut [u8]) -> usize {
        let n = (self.end - self.start).min(out.len());
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        n
    }

    fn eof_mid_message() -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "client closed the connection in the middle of a message",
        )
    }
}

impl Default for Reader {
    fn default() -> Self {
        Reader::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffered_reader_splits_and_joins_messages() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Sock::Unix(a), Sock::Unix(b));
        let big: Vec<u8> = (0..40000u32).map(|i| i as u8).collect();
        let mut msg = Vec::new();
        msg.extend_from_slice(&[1u8; 28]);
        msg.extend_from_slice(&[2u8; 100]);
        msg.extend_from_slice(&[3u8; 28]);
        msg.extend_from_slice(&big);
        msg.extend_from_slice(&[4u8; 10]);
        let writer = std::thread::spawn(move || {
            for piece in msg.chunks(777) {
                a.write_all(piece).unwrap();
            }
        });
        let mut r = Reader::new();
        let mut h = [0u8; 28];
        assert!(r.read_full(&b, &mut h).unwrap());
        assert_eq!(h, [1u8; 28]);
        r.skip(&b, 100).unwrap();
        r.read_exact(&b, &mut h).unwrap();
        assert_eq!(h, [3u8; 28]);
        let mut got = vec![0u8; big.len()];
        r.read_exact(&b, &mut got).unwrap();
        assert!(got == big);
        let mut t = [0u8; 10];
        r.read_exact(&b, &mut t).unwrap();
        assert_eq!(t, [4u8; 10]);
        writer.join().unwrap();
        // Clean end of stream between messages.
        assert!(!r.read_full(&b, &mut h).unwrap());
    }
}
