//! The control protocol's wire format (documented in docs/CONTROL.md).
//!
//! A message is a 12-byte header — the magic `UDMC`, the length of a JSON
//! part and the length of a raw payload, both u32 big-endian — then the
//! JSON, then the payload. Tables travel in the payload, never in the
//! JSON: a crypt table carries its key, and a JSON library copies strings
//! with escapes through scratch buffers nobody wipes; the payload is read
//! into one buffer that is wiped when dropped.
//!
//! Lengths are checked before anything is allocated, so a peer announcing
//! 1 GiB gets an error reply, not an allocation.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// The protocol version this build speaks (the `v` of every message).
pub const VERSION: u32 = 1;
/// First bytes of every message.
pub const MAGIC: [u8; 4] = *b"UDMC";
/// Largest JSON part accepted.
pub const MAX_JSON: u32 = 1 << 20;
/// Largest JSON part a client accepts in a reply: a server it trusts may
/// list many devices, or one with a long table.
pub const MAX_REPLY_JSON: u32 = 16 << 20;
/// Largest payload accepted (a table of ~100 000 lines).
pub const MAX_PAYLOAD: u32 = 16 << 20;
pub const HEADER_LEN: usize = 12;

/// A request. Fields an operation does not use are ignored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Request {
    pub v: u32,
    pub op: String,
    /// Device names the operation applies to (empty: all, where allowed).
    pub names: Vec<String>,
    /// `rename`'s new name.
    pub new_name: Option<String>,
    pub uuid: Option<String>,
    pub readonly: bool,
    pub force: bool,
    pub deferred: bool,
    pub noflush: bool,
    pub showkeys: bool,
    /// Report the inactive table instead of the live one.
    pub inactive: bool,
    /// `message`: the sector and the words.
    pub sector: u64,
    pub message: Vec<String>,
    /// `wait`: return once the event counter exceeds this.
    pub event_nr: u32,
    /// `create` with a table in the payload; `load`: the payload is the
    /// table.
    pub has_table: bool,
    /// `create`: a rule (`ENTRY[,ENTRY...]`, as `udm serve --allow`)
    /// NBD clients must pass in addition to the rule of the name: it can
    /// only narrow who may use the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<String>,
}

/// Error kinds a reply may carry, named after the errno dm's ioctls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Code {
    /// No such device.
    Enxio,
    /// The name is taken.
    Eexist,
    /// In use (clients attached, another device stacked on it).
    Ebusy,
    /// Bad request, bad table.
    Einval,
    /// The peer may not use this socket.
    Eperm,
    /// Malformed message, unsupported version, too large.
    Eproto,
    /// The server is busy with too many control connections.
    Eagain,
    /// The operation does not exist.
    Enosys,
    /// The device's own code failed while serving the verb (a panic): the
    /// device is marked failed, the server goes on.
    Eio,
}

/// A reply: `ok` with a result, or an error with its kind and text.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Reply {
    pub v: u32,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<Code>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub result: serde_json::Value,
}

impl Reply {
    pub fn ok(result: serde_json::Value) -> Reply {
        Reply {
            v: VERSION,
            ok: true,
            code: None,
            error: None,
            result,
        }
    }

    pub fn err(code: Code, msg: impl Into<String>) -> Reply {
        Reply {
            v: VERSION,
            ok: false,
            code: Some(code),
            error: Some(msg.into()),
            result: serde_json::Value::Null,
        }
    }
}

/// An error of an operation: its kind and the text for the user.
#[derive(Debug, Clone)]
pub struct OpError {
    pub code: Code,
    pub msg: String,
}

impl OpError {
    pub fn new(code: Code, msg: impl Into<String>) -> OpError {
        OpError {
            code,
            msg: msg.into(),
        }
    }
}

/// Why a message could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection between messages.
    Closed,
    /// A socket error, or a timeout.
    Io(io::Error),
    /// The bytes are not a message of this protocol; the text says why.
    Bad(String),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// A message as read: the JSON part and the payload.
pub struct Message {
    pub json: Vec<u8>,
    pub payload: Zeroizing<Vec<u8>>,
}

/// Check a header; the JSON and payload lengths.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(u32, u32), String> {
    parse_header_with(h, MAX_JSON)
}

/// [`parse_header`] with a JSON limit of `max_json`.
fn parse_header_with(h: &[u8; HEADER_LEN], max_json: u32) -> Result<(u32, u32), String> {
    if h[0..4] != MAGIC {
        return Err(format!(
            "not a udm control message (first bytes {:02x?}, expected \"UDMC\"); \
             talk to this socket with `udm dmsetup`",
            &h[0..4]
        ));
    }
    let json = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let payload = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    if json > max_json {
        return Err(format!(
            "message JSON of {json} bytes is over the {max_json}-byte limit"
        ));
    }
    if payload > MAX_PAYLOAD {
        return Err(format!(
            "request payload of {payload} bytes is over the {MAX_PAYLOAD}-byte limit \
             (a table of that size is not supported)"
        ));
    }
    Ok((json, payload))
}

/// Read one message. `first` is called after the first byte arrived (the
/// server then tightens its timeout: a started message must complete).
pub fn read_message(r: &mut impl Read, first: impl FnMut()) -> Result<Message, ReadError> {
    read_limited(r, first, MAX_JSON)
}

/// Read a server's reply (JSON up to [`MAX_REPLY_JSON`]).
pub fn read_reply(r: &mut impl Read) -> Result<Message, ReadError> {
    read_limited(r, || {}, MAX_REPLY_JSON)
}

fn read_limited(
    r: &mut impl Read,
    mut first: impl FnMut(),
    max_json: u32,
) -> Result<Message, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Bad("connection closed inside a header".into())),
            Ok(n) => {
                if got == 0 {
                    first();
                }
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let (jl, pl) = parse_header_with(&h, max_json).map_err(ReadError::Bad)?;
    let mut json = vec![0u8; jl as usize];
    r.read_exact(&mut json)?;
    let mut payload = Zeroizing::new(vec![0u8; pl as usize]);
    r.read_exact(&mut payload)?;
    Ok(Message { json, payload })
}

/// Write one message.
pub fn write_message(w: &mut impl Write, json: &[u8], payload: &[u8]) -> io::Result<()> {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4..8].copy_from_slice(&(json.len() as u32).to_be_bytes());
    h[8..12].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    // One write for the header and JSON: replies are small.
    let mut first = Vec::with_capacity(HEADER_LEN + json.len());
    first.extend_from_slice(&h);
    first.extend_from_slice(json);
    w.write_all(&first)?;
    if !payload.is_empty() {
        w.write_all(payload)?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_headers_are_named() {
        let mut buf = Vec::new();
        write_message(&mut buf, b"{\"v\":1}", b"0 8 zero\n").unwrap();
        let m = read_message(&mut &buf[..], || {}).unwrap();
        assert_eq!(m.json, b"{\"v\":1}");
        assert_eq!(&m.payload[..], b"0 8 zero\n");
        let mut huge = *b"UDMC\0\0\0\0\0\0\0\0";
        huge[8..12].copy_from_slice(&(1u32 << 30).to_be_bytes());
        assert!(parse_header(&huge).unwrap_err().contains("over the"));
        assert!(parse_header(b"GET / HTTP/1")
            .unwrap_err()
            .contains("not a udm control message"));
        assert!(matches!(
            read_message(&mut &b""[..], || {}),
            Err(ReadError::Closed)
        ));
        assert!(matches!(
            read_message(&mut &b"UDM"[..], || {}),
            Err(ReadError::Bad(_))
        ));
    }
}
