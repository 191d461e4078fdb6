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
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let s = UnixStream::connect(path).map_err(|e| ClientError {
            code: None,
            msg: format!(
                "cannot reach the udm control socket {}: {e} (is `udm serve` running? \
                 give its socket with --control PATH or $UDM_CONTROL)",
                path.display()
            ),
        })?;
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
        let msg = proto::read_message(&mut self.s, || {});
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
