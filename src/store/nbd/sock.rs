//! The client's socket, TCP or Unix, behind one type so that the
//! handshake, the sender and the reply reader need not care which.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connected client socket (named apart from the server's `nbd::Sock`).
pub enum ClientSock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl ClientSock {
    pub fn try_clone(&self) -> io::Result<ClientSock> {
        Ok(match self {
            ClientSock::Tcp(s) => ClientSock::Tcp(s.try_clone()?),
            ClientSock::Unix(s) => ClientSock::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self) {
        let _ = match self {
            ClientSock::Tcp(s) => s.shutdown(Shutdown::Both),
            ClientSock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            ClientSock::Tcp(s) => s.set_read_timeout(t),
            ClientSock::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for ClientSock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientSock::Tcp(s) => s.read(b),
            ClientSock::Unix(s) => s.read(b),
        }
    }
}

impl Write for ClientSock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            ClientSock::Tcp(s) => s.write(b),
            ClientSock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            ClientSock::Tcp(s) => s.write_vectored(b),
            ClientSock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes a request header and its payload in as few system calls as the
/// socket allows, without copying the payload next to the header.
pub fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
