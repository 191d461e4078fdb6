//! One type for a client connection over a Unix or TCP socket, so the
//! handshake and the transmission code do not care which it is. Reads and
//! writes go through `&Sock`, so the event loop and worker threads share
//! one descriptor without cloning it. The server's sockets are
//! non-blocking: `try_*` calls return `WouldBlock` instead of waiting,
//! because no thread of the server may ever wait for one client.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[derive(Debug)]
pub enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// What a Unix socket's send buffer is set to (the kernel doubles it for
/// its bookkeeping): the default (about 200 KiB) takes a fifth of a 1 MiB
/// read reply, and the rest had to be copied and queued, so a read lent
/// from the page cache (one copy) cost nearly two again; with room for the
/// whole reply, 1 MiB reads on ext4 ran much faster in the same run
/// (docs/BENCHMARKS.md). Memory: a client that stops reading parks at most
/// this much more in the kernel, next to the 64 MiB of replies per client
/// that udm's own caps allow.
pub const UNIX_SEND_BUFFER: libc::c_int = 1 << 20;

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

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_nonblocking(on),
            Sock::Tcp(s) => s.set_nonblocking(on),
        }
    }

    /// The peer's IP address (TCP only).
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Sock::Unix(_) => None,
            Sock::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
        }
    }

    /// Who is at the other end, for the exports' access rules: the IP
    /// address of a TCP client, the user id (SO_PEERCRED) of a Unix one.
    pub fn peer_info(&self) -> Peer {
        match self {
            Sock::Unix(s) => Peer {
                kind: PeerKind::Unix,
                ip: None,
                uid: peer_uid(s).ok(),
            },
            Sock::Tcp(_) => Peer {
                kind: PeerKind::Tcp,
                ip: self.peer_ip(),
                uid: None,
            },
        }
    }

    /// One `read`; `WouldBlock` on a non-blocking socket with no data,
    /// `Ok(0)` at end of stream. Retries on EINTR.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match (&*self).read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    /// One `writev`; `WouldBlock` when the socket buffer is full. Retries
    /// on EINTR.
    pub fn try_writev(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        loop {
            let r = match self {
                Sock::Unix(s) => (&*s).write_vectored(bufs),
                Sock::Tcp(s) => (&*s).write_vectored(bufs),
            };
            match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    /// Give a Unix socket room for a whole 1 MiB read reply
    /// ([`UNIX_SEND_BUFFER`]); TCP keeps the kernel's autotuning, which
    /// setting a size would turn off.
    pub fn widen_send_buffer(&self) {
        let Sock::Unix(s) = self else { return };
        let v: libc::c_int = UNIX_SEND_BUFFER;
        let set = |opt| {
            // SAFETY: `v` is a c_int that lives across the call, and its
            // size is what is passed.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &v as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        // Past `net.core.wmem_max` only with CAP_NET_ADMIN; without it the
        // plain option is capped there, which is the kernel's default.
        if set(libc::SO_SNDBUFFORCE) != 0 {
            set(libc::SO_SNDBUF);
        }
    }

    /// `writev` of raw iovecs: for bytes lent by a device (a mapped file's
    /// pages), which the kernel copies and no Rust reference may point at
    /// (see [`crate::core::Lent`]).
    pub fn try_writev_raw(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        loop {
            // SAFETY: `iov` is a valid array of `iov.len()` iovecs; the
            // caller keeps what they point at mapped for the call, and the
            // kernel only reads it (a fault there fails the call).
            let n = unsafe { libc::writev(self.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
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

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Sock::Unix(s) => s.as_raw_fd(),
            Sock::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Write for &Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&*s).write(buf),
            Sock::Tcp(s) => (&*s).write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.try_writev(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// The user id of the process at the other end of a Unix socket, as the
/// kernel recorded it at connect time (`SO_PEERCRED`). Used by the NBD
/// server's `uid:` rules and by the control socket's server and client.
pub fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `cred`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Which kind of listener a client came through. It is carried apart
/// from the address so that a TCP client whose address could not be read
/// is never taken for a Unix one (which `unix` rules admit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeerKind {
    /// The default, so a peer built without a kind passes no `unix` or
    /// `uid:` rule.
    #[default]
    Tcp,
    Unix,
}

/// Who asks for an export, for its access rules.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub kind: PeerKind,
    /// The client's IP address (TCP; `None` if it could not be read,
    /// which then matches no network rule).
    pub ip: Option<std::net::IpAddr>,
    /// The client's user id (Unix socket, from SO_PEERCRED).
    pub uid: Option<u32>,
}

/// Who a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Ip(std::net::IpAddr),
    Uid(u32),
    /// A peer whose address or credentials could not be read: all such
    /// share one tally.
    Unknown,
}

impl Source {
    /// The tally of `peer`; IPv6 addresses count by their /64 (one host
    /// usually holds a whole /64), IPv4-mapped ones as IPv4.
    pub fn of(peer: &Peer) -> Source {
        match (peer.kind, peer.ip, peer.uid) {
            (PeerKind::Unix, _, Some(uid)) => Source::Uid(uid),
            (PeerKind::Tcp, Some(std::net::IpAddr::V6(v6)), _) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::Ip(std::net::IpAddr::V4(v4)),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    Source::Ip(std::net::IpAddr::V6(bits.into()))
                }
            },
            (PeerKind::Tcp, Some(ip), _) => Source::Ip(ip),
            _ => Source::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_buffer(s: &UnixStream) -> libc::c_int {
        let mut v: libc::c_int = 0;
        let mut n = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `n` are valid for the kernel to write; `n` is
        // the size of `v`.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                &mut v as *mut libc::c_int as *mut libc::c_void,
                &mut n,
            )
        };
        assert_eq!(rc, 0);
        v
    }

    /// A Unix connection gets room for a whole 1 MiB read reply (past
    /// `wmem_max` as root, as the test suite runs); never less than the
    /// kernel's default.
    #[test]
    fn unix_sockets_get_room_for_a_whole_large_reply() {
        let (a, _b) = UnixStream::pair().unwrap();
        let before = send_buffer(&a);
        let s = Sock::Unix(a);
        s.widen_send_buffer();
        let Sock::Unix(a) = &s else { unreachable!() };
        let after = send_buffer(a);
        assert!(after >= before, "{before} -> {after}");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert!(after >= 2 * UNIX_SEND_BUFFER, "{after}");
        }
    }
}
