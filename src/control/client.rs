//! A client of the control socket: what `udm dmsetup` (and any other tool
//! that manages a running server, e.g. `udm cryptsetup open`) uses.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zeroize::Zeroizing;

use super::proto::{self, Code, ReadError, Reply, Request};

/// A connection to a server's control socket.
pub struct Client {
    s: UnixStream,
    path: PathBuf,
}

/// A failed request: the server's error kind (if it answered) and text.
#[derive(Debug)]
pub struct ClientError {
    pub code: Option<Code>,
    pub msg: String,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl Client {
    /// Connect to the socket at `path`, and make sure it is served by
    /// root or by our own user before anything is sent: requests carry
    /// volume keys (`cryptsetup open`, `luksResume`), and a socket path
    /// another user could bind first (a server unlinks its socket on exit)
    /// must not receive them.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        check_parent(path)?;
        let s = UnixStream::connect(path).map_err(|e| ClientError {
            code: None,
            msg: format!(
                "cannot reach the udm control socket {}: {e} (is `udm serve` running? \
                 give its socket with --control PATH or $UDM_CONTROL)",
                path.display()
            ),
        })?;
        check_server(&s, path)?;
        let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
        Ok(Client {
            s,
            path: path.to_path_buf(),
        })
    }

    /// Send `req` (with `payload`, e.g. a table) and wait for the reply.
    /// Returns the result and the reply's payload.
    pub fn call(
        &mut self,
        mut req: Request,
        payload: &[u8],
    ) -> Result<(serde_json::Value, Zeroizing<Vec<u8>>), ClientError> {
        req.v = proto::VERSION;
        let json = serde_json::to_vec(&req).map_err(|e| ClientError {
            code: None,
            msg: format!("cannot encode the request: {e}"),
        })?;
        let io_err = |e: io::Error, path: &Path| ClientError {
            code: None,
            msg: format!("control socket {}: {e}", path.display()),
        };
        // A server that refuses the peer answers before reading, then
        // closes: the write may fail while its reply waits to be read.
        let sent = proto::write_message(&mut self.s, &json, payload);
        let msg = proto::read_reply(&mut self.s);
        if let (Err(e), Err(_)) = (&sent, &msg) {
            return Err(io_err(io::Error::new(e.kind(), e.to_string()), &self.path));
        }
        let msg = msg.map_err(|e| match e {
            ReadError::Closed => ClientError {
                code: None,
                msg: format!(
                    "the server closed the control socket {} without answering",
                    self.path.display()
                ),
            },
            ReadError::Io(e) => io_err(e, &self.path),
            ReadError::Bad(why) => ClientError {
                code: None,
                msg: format!("bad reply from {}: {why}", self.path.display()),
            },
        })?;
        let reply: Reply = serde_json::from_slice(&msg.json).map_err(|e| ClientError {
            code: None,
            msg: format!("malformed reply: {e}"),
        })?;
        if !reply.ok {
            return Err(ClientError {
                code: reply.code,
                msg: reply
                    .error
                    .unwrap_or_else(|| "the server refused the request".into()),
            });
        }
        Ok((reply.result, msg.payload))
    }
}

fn refused(msg: String) -> ClientError {
    ClientError {
        code: Some(Code::Eperm),
        msg,
    }
}

fn my_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The server at the other end must run as root or as us (SO_PEERCRED
/// gives the uid that created the listening socket; no peer can forge it).
fn check_server(s: &UnixStream, path: &Path) -> Result<(), ClientError> {
    let me = my_uid();
    let uid = super::server::peer_uid(s).map_err(|e| {
        refused(format!(
            "cannot tell who serves the control socket {} ({e}): refusing to send it anything",
            path.display()
        ))
    })?;
    if uid == 0 || uid == me {
        return Ok(());
    }
    Err(refused(format!(
        "the control socket {} is served by uid {uid}, neither root nor you (uid {me}): \
         refusing to send it anything (it could be another user's listener waiting for keys); \
         point --control or $UDM_CONTROL at your udm serve's socket",
        path.display()
    )))
}

/// A directory anyone may write to (without the sticky bit) lets anyone
/// swap the socket; one owned by a third user is theirs to swap. Both are
/// refused before connecting, so nothing depends on winning a race.
fn check_parent(path: &Path) -> Result<(), ClientError> {
    use std::os::unix::fs::MetadataExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(m) = std::fs::metadata(dir) else {
        // Connecting reports a missing directory better.
        return Ok(());
    };
    let me = my_uid();
    if m.uid() != 0 && m.uid() != me {
        return Err(refused(format!(
            "the control socket {} is in {}, owned by uid {}, neither root nor you (uid {me}): \
             its owner could replace the socket; use a socket in a directory of yours or root's",
            path.display(),
            dir.display(),
            m.uid()
        )));
    }
    let writable_by_others = m.mode() & 0o022 != 0;
    let sticky = m.mode() & 0o1000 != 0;
    if writable_by_others && !sticky {
        return Err(refused(format!(
            "the control socket {} is in {}, which others may write to (mode {:o}): anyone \
             could replace the socket; use a directory only you or root may write to",
            path.display(),
            dir.display(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}
