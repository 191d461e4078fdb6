//! Wire constants and fixed-size messages of the NBD protocol (the
//! official `doc/proto.md`). Kept free of I/O so that every encoder and
//! decoder can be unit-tested on byte arrays, and so that header values are
//! only ever turned into numbers here, in one place, with no panics.

use super::be;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// `NBDMAGIC`, first 8 bytes of the greeting.
/// Oldstyle negotiation (refused by clients of this crate).
pub const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;

/// A structured read chunk that stands for zeros.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;

/// Set in every structured error chunk type.
pub const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;

pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: greeting second word and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_TLS_REQD: u32 = 0x8000_0005;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_SHUTDOWN: u32 = 0x8000_0007;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = 0x8000_0008;
/// Set in every option reply type that is an error.
pub const REP_ERR_BIT: u32 = 1 << 31;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// `base:allocation` extent flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Error values (protocol numbering, not the host's errno).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The one metadata context we offer: allocation (holes, zeros).
pub const META_BASE_ALLOCATION: &str = "base:allocation";

/// Largest payload we serve in one request (advertised maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Oversize write payloads up to this length are read and thrown away so
/// the connection survives; anything longer is treated as an attack and the
/// connection is dropped (the payload length field is only 32 bits, so
/// this bounds the time spent, not memory, which is never allocated).
pub const MAX_DISCARDED_PAYLOAD: u32 = 128 << 20;
/// Option payloads larger than this are a denial-of-service attempt: no
/// legal option needs more than a few export names.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Longest string the protocol allows (export names, descriptions).
pub const MAX_STRING: usize = 4096;

/// Size of a compact request header on the wire.
pub const REQUEST_LEN: usize = 28;

/// A decoded request header. Decoding never fails: the magic is returned
/// for the caller to judge, all other fields are plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub magic: u32,
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl RequestHeader {
    pub fn decode(b: &[u8; REQUEST_LEN]) -> RequestHeader {
        RequestHeader {
            magic: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            flags: u16::from_be_bytes([b[4], b[5]]),
            cmd: u16::from_be_bytes([b[6], b[7]]),
            cookie: u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
            offset: u64::from_be_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
            len: u32::from_be_bytes([b[24], b[25], b[26], b[27]]),
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&self.magic.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.cmd.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// Simple reply header: magic, error, cookie (16 bytes).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// Structured reply chunk header (20 bytes).
pub fn chunk_header(flags: u16, ty: u16, cookie: u64, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&ty.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// Option reply header (20 bytes).
pub fn option_reply_header(opt: u32, ty: u32, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&opt.to_be_bytes());
    b[12..16].copy_from_slice(&ty.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// Option payloads are read with the shared big-endian cursor.
pub use super::be::Cursor;

/// Option request header (16 bytes), the client's side of
/// [`option_reply_header`].
pub fn option_header(opt: u32, len: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[8..12].copy_from_slice(&opt.to_be_bytes());
    b[12..16].copy_from_slice(&len.to_be_bytes());
    b
}

/// A decoded option reply header; the magic is left to the caller. (The
/// decoders read fixed-size arrays, so the codec's `None` cannot occur.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReply {
    pub magic: u64,
    pub opt: u32,
    pub ty: u32,
    pub len: u32,
}

impl OptionReply {
    pub fn decode(b: &[u8; 20]) -> OptionReply {
        OptionReply {
            magic: be::u64_at(b, 0).unwrap_or(0),
            opt: be::u32_at(b, 8).unwrap_or(0),
            ty: be::u32_at(b, 12).unwrap_or(0),
            len: be::u32_at(b, 16).unwrap_or(0),
        }
    }
}

/// A decoded simple reply header (16 bytes, magic included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn decode(b: &[u8; 16]) -> SimpleReply {
        SimpleReply {
            error: be::u32_at(b, 4).unwrap_or(0),
            cookie: be::u64_at(b, 8).unwrap_or(0),
        }
    }
}

/// A decoded structured reply chunk header (20 bytes, magic included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub ty: u16,
    pub cookie: u64,
    pub len: u32,
}

impl ChunkHeader {
    pub fn decode(b: &[u8; 20]) -> ChunkHeader {
        ChunkHeader {
            flags: be::u16_at(b, 4).unwrap_or(0),
            ty: be::u16_at(b, 6).unwrap_or(0),
            cookie: be::u64_at(b, 8).unwrap_or(0),
            len: be::u32_at(b, 16).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trip() {
        let h = RequestHeader {
            magic: REQUEST_MAGIC,
            flags: CMD_FLAG_FUA,
            cmd: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            len: 4096,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(RequestHeader::decode(&b), h);
    }

    #[test]
    fn reply_headers_have_the_spec_layout() {
        let s = simple_reply(EINVAL, 7);
        assert_eq!(&s[0..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(u32::from_be_bytes([s[4], s[5], s[6], s[7]]), 22);
        let c = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 9, 108);
        assert_eq!(&c[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(&c[4..8], &[0, 1, 0, 1]);
        let o = option_reply_header(OPT_GO, REP_ACK, 0);
        assert_eq!(&o[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
    }

    #[test]
    fn reply_decoders_read_what_the_encoders_wrote() {
        let s = SimpleReply::decode(&simple_reply(EIO, 0x1234_5678_9abc));
        assert_eq!((s.error, s.cookie), (EIO, 0x1234_5678_9abc));
        let c = ChunkHeader::decode(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 9, 108));
        assert_eq!(
            (c.flags, c.ty, c.cookie, c.len),
            (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 9, 108)
        );
        let o = OptionReply::decode(&option_reply_header(OPT_GO, REP_ERR_UNKNOWN, 7));
        assert_eq!(
            (o.magic, o.opt, o.ty, o.len),
            (OPT_REPLY_MAGIC, OPT_GO, REP_ERR_UNKNOWN, 7)
        );
        let h = option_header(OPT_GO, 12);
        assert_eq!(&h[0..8], b"IHAVEOPT");
        assert_eq!(&h[8..16], &[0, 0, 0, 7, 0, 0, 0, 12]);
    }
}
