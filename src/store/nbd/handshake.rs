//! Connecting and negotiating: fixed newstyle, `NBD_OPT_STRUCTURED_REPLY`
//! (so reads may come back as data and hole chunks, and errors carry
//! messages), then `NBD_OPT_GO` asking for block sizes, falling back to
//! `NBD_OPT_EXPORT_NAME` for servers without GO. Old-style servers and TLS
//! are refused with a message.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::protocol::be;
use crate::protocol::nbd::{
    option_header, OptionReply, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT, INFO_BLOCK_SIZE,
    INFO_EXPORT, MAX_PAYLOAD, NBD_MAGIC, OLDSTYLE_MAGIC, OPT_EXPORT_NAME, OPT_GO, OPT_REPLY_MAGIC,
    OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR_BIT, REP_ERR_BLOCK_SIZE_REQD, REP_ERR_INVALID,
    REP_ERR_POLICY, REP_ERR_SHUTDOWN, REP_ERR_TLS_REQD, REP_ERR_UNKNOWN, REP_ERR_UNSUP, REP_INFO,
};

use super::sock::ClientSock;
use super::spec::{NbdAddr, NbdSpec};

/// Deadline for connecting and for each handshake read.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline for the whole negotiation: a server that trickles bytes or
/// replies (each within the per-read timeout) must not hold a control
/// thread or `udm serve`'s start-up forever.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(30);
/// Replies to one `GO` before we give up: the spec defines four INFO
/// types, and a server has no reason to repeat them many times.
const MAX_GO_REPLIES: usize = 32;
/// Total bytes of those replies' payloads.
const MAX_GO_BYTES: usize = 256 << 10;
/// Longest option reply accepted: no option udm sends has a legitimate
/// reply that long, and a hostile server must not make us allocate more.
const MAX_OPTION_REPLY: u32 = 64 << 10;

/// What the handshake told us about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub max_payload: u32,
}

/// A negotiated connection, ready for requests.
pub struct Negotiated {
    pub sock: ClientSock,
    pub structured: bool,
    pub info: ExportInfo,
}

/// The socket during the handshake: every read and write gets only what
/// is left of the overall deadline, so the negotiation as a whole is
/// bounded however slowly the server trickles its bytes.
struct Timed<'a> {
    sock: &'a mut ClientSock,
    deadline: Instant,
}

impl Timed<'_> {
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "negotiation not finished within {} s",
                    HANDSHAKE_DEADLINE.as_secs()
                ),
            ));
        }
        self.sock.set_read_timeout(Some(left.min(CONNECT_TIMEOUT)))
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.sock.read(b)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.sock.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_option(w: &mut impl Write, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut h = Vec::with_capacity(16 + data.len());
    h.extend_from_slice(&option_header(opt, data.len() as u32));
    h.extend_from_slice(data);
    w.write_all(&h)
}

/// One option reply: (type, data).
fn read_option_reply(r: &mut impl Read, opt: u32) -> Result<(u32, Vec<u8>), String> {
    let mut h = [0u8; 20];
    r.read_exact(&mut h).map_err(|e| e.to_string())?;
    let rep = OptionReply::decode(&h);
    if rep.magic != OPT_REPLY_MAGIC {
        return Err("bad option reply magic (not an NBD server?)".into());
    }
    if rep.opt != opt {
        return Err(format!("reply to option {} instead of {opt}", rep.opt));
    }
    if rep.len > MAX_OPTION_REPLY {
        return Err(format!("option reply of {} bytes", rep.len));
    }
    let mut data = vec![0u8; rep.len as usize];
    r.read_exact(&mut data).map_err(|e| e.to_string())?;
    Ok((rep.ty, data))
}

fn option_error(ty: u32, data: &[u8]) -> String {
    let msg = String::from_utf8_lossy(data);
    let what = match ty {
        REP_ERR_UNSUP => "unsupported",
        REP_ERR_POLICY => "refused by policy",
        REP_ERR_INVALID => "invalid",
        REP_ERR_TLS_REQD => "TLS required",
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_SHUTDOWN => "server shutting down",
        REP_ERR_BLOCK_SIZE_REQD => "block size constraints not supported",
        _ => "error",
    };
    if msg.is_empty() {
        format!("server: {what}")
    } else {
        format!("server: {what}: {msg}")
    }
}

fn connect_tcp(h: &str, p: u16) -> Result<ClientSock, String> {
    let addrs = (h, p)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {h}: {e}"))?;
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(t) => {
                let _ = t.set_nodelay(true);
                return Ok(ClientSock::Tcp(t));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => format!("cannot connect: {e}"),
        None => format!("{h} has no address"),
    })
}

fn connect(addr: &NbdAddr) -> Result<ClientSock, String> {
    match addr {
        NbdAddr::Tcp(h, p) => connect_tcp(h, *p),
        NbdAddr::Unix(p) => UnixStream::connect(p)
            .map(ClientSock::Unix)
            .map_err(|e| format!("cannot connect to {}: {e}", p.display())),
    }
}

fn handshake_io(e: io::Error) -> String {
    format!("handshake: {e}")
}

/// The greeting and flags exchange; returns whether the server omits the
/// 124 zero bytes after an `EXPORT_NAME` reply.
fn greet(s: &mut Timed<'_>) -> Result<bool, String> {
    if read_u64(s).map_err(handshake_io)? != NBD_MAGIC {
        return Err("not an NBD server (bad greeting)".into());
    }
    match read_u64(s).map_err(handshake_io)? {
        IHAVEOPT => {}
        OLDSTYLE_MAGIC => {
            return Err(
                "old-style NBD servers are not supported; run the server in newstyle mode".into(),
            )
        }
        _ => return Err("bad greeting magic".into()),
    }
    let mut f = [0u8; 2];
    s.read_exact(&mut f).map_err(handshake_io)?;
    let sflags = u16::from_be_bytes(f);
    if sflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err("server does not speak fixed newstyle negotiation".into());
    }
    let no_zeroes = sflags & FLAG_NO_ZEROES != 0;
    let mut cflags = u32::from(FLAG_FIXED_NEWSTYLE);
    if no_zeroes {
        cflags |= u32::from(FLAG_NO_ZEROES);
    }
    s.write_all(&cflags.to_be_bytes()).map_err(handshake_io)?;
    Ok(no_zeroes)
}

fn structured_replies(s: &mut Timed<'_>) -> Result<bool, String> {
    send_option(s, OPT_STRUCTURED_REPLY, &[]).map_err(handshake_io)?;
    match read_option_reply(s, OPT_STRUCTURED_REPLY)? {
        (REP_ACK, _) => Ok(true),
        (t, _) if t & REP_ERR_BIT != 0 => Ok(false),
        (t, data) => Err(format!(
            "unexpected reply {t} to STRUCTURED_REPLY: {data:?}"
        )),
    }
}

/// Folds one `NBD_REP_INFO` payload into `info`; unknown kinds are skipped.
fn apply_info(info: &mut ExportInfo, data: &[u8]) -> Result<(), String> {
    match be::u16_at(data, 0) {
        Some(INFO_EXPORT) => {
            if let (Some(size), Some(flags)) = (be::u64_at(data, 2), be::u16_at(data, 10)) {
                info.size = size;
                info.flags = flags;
            }
        }
        Some(INFO_BLOCK_SIZE) => {
            if let (Some(min), Some(max)) = (be::u32_at(data, 2), be::u32_at(data, 10)) {
                info.min_block = min.max(1);
                info.max_payload = max.clamp(1, MAX_PAYLOAD);
            }
        }
        Some(_) => {}
        None => return Err("short INFO reply".into()),
    }
    Ok(())
}

/// The old way for a server without GO: no error reply is possible, the
/// server just closes.
fn export_name(
    s: &mut Timed<'_>,
    spec: &NbdSpec,
    no_zeroes: bool,
    info: &mut ExportInfo,
) -> Result<(), String> {
    send_option(s, OPT_EXPORT_NAME, spec.export.as_bytes()).map_err(handshake_io)?;
    let mut b = [0u8; 10];
    s.read_exact(&mut b).map_err(|e| {
        format!(
            "export '{}' refused (server closed after EXPORT_NAME: {e})",
            spec.export
        )
    })?;
    info.size = be::u64_at(&b, 0).unwrap_or(u64::MAX);
    info.flags = be::u16_at(&b, 8).unwrap_or(0);
    if !no_zeroes {
        let mut z = [0u8; 124];
        s.read_exact(&mut z).map_err(handshake_io)?;
    }
    Ok(())
}

fn go(s: &mut Timed<'_>, spec: &NbdSpec, no_zeroes: bool) -> Result<ExportInfo, String> {
    let name = spec.export.as_bytes();
    let mut req = Vec::with_capacity(8 + name.len());
    req.extend_from_slice(&(name.len() as u32).to_be_bytes());
    req.extend_from_slice(name);
    req.extend_from_slice(&1u16.to_be_bytes());
    req.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &req).map_err(handshake_io)?;
    let mut info = ExportInfo {
        size: u64::MAX,
        flags: 0,
        min_block: 1,
        max_payload: MAX_PAYLOAD,
    };
    let (mut replies, mut bytes) = (0, 0);
    loop {
        let (ty, data) = read_option_reply(s, OPT_GO)?;
        replies += 1;
        bytes += data.len();
        if replies > MAX_GO_REPLIES || bytes > MAX_GO_BYTES {
            return Err(format!(
                "server sent more than {MAX_GO_REPLIES} replies or {} KiB to GO; \
                 not an NBD server udm can use",
                MAX_GO_BYTES >> 10
            ));
        }
        match ty {
            REP_ACK => return Ok(info),
            REP_INFO => apply_info(&mut info, &data)?,
            REP_ERR_UNSUP => {
                export_name(s, spec, no_zeroes, &mut info)?;
                return Ok(info);
            }
            t if t & REP_ERR_BIT != 0 => {
                return Err(format!(
                    "export '{}': {}",
                    spec.export,
                    option_error(t, &data)
                ))
            }
            t => return Err(format!("unexpected reply {t} to GO")),
        }
    }
}

/// Connect and negotiate.
pub fn handshake(spec: &NbdSpec) -> Result<Negotiated, String> {
    let mut sock = connect(&spec.addr)?;
    let mut s = Timed {
        sock: &mut sock,
        deadline: Instant::now() + HANDSHAKE_DEADLINE,
    };
    let no_zeroes = greet(&mut s)?;
    let structured = structured_replies(&mut s)?;
    let info = go(&mut s, spec, no_zeroes)?;
    if info.size == u64::MAX {
        return Err("server sent no export size".into());
    }
    if !info.min_block.is_power_of_two() || info.min_block > 64 << 10 {
        return Err(format!(
            "server's minimum block size {} is not usable",
            info.min_block
        ));
    }
    sock.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(Negotiated {
        sock,
        structured,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_replies_fill_in_what_they_carry_and_short_ones_are_errors() {
        let mut info = ExportInfo {
            size: u64::MAX,
            flags: 0,
            min_block: 1,
            max_payload: MAX_PAYLOAD,
        };
        let mut export = INFO_EXPORT.to_be_bytes().to_vec();
        export.extend_from_slice(&(1u64 << 30).to_be_bytes());
        export.extend_from_slice(&3u16.to_be_bytes());
        apply_info(&mut info, &export).unwrap();
        assert_eq!((info.size, info.flags), (1 << 30, 3));
        let mut sizes = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [0u32, 4096, 8192] {
            sizes.extend_from_slice(&v.to_be_bytes());
        }
        apply_info(&mut info, &sizes).unwrap();
        assert_eq!((info.min_block, info.max_payload), (1, 8192));
        // Truncated INFO_EXPORT: ignored, not a panic.
        apply_info(&mut info, &export[..5]).unwrap();
        assert_eq!(info.size, 1 << 30);
        assert!(apply_info(&mut info, &[0]).is_err());
    }

    #[test]
    fn option_errors_name_the_refusal() {
        assert_eq!(
            option_error(REP_ERR_UNKNOWN, b"nope"),
            "server: no such export: nope"
        );
        assert_eq!(option_error(REP_ERR_TLS_REQD, b""), "server: TLS required");
    }
}
