//! One error type for everything LUKS. Messages name the header field and the
//! offending value so a user can tell a damaged header from a wrong passphrase;
//! they never contain key material or passphrases.

use std::fmt;

/// A LUKS failure.
#[derive(Debug)]
pub enum LuksError {
    /// Reading or writing `what` failed.
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The device carries no LUKS header at all.
    NotLuks(String),
    /// The verb needs LUKS2 and the device is LUKS1 (or not LUKS).
    NotLuks2(String),
    /// A header field holds a value udm refuses (`field` is a dotted path).
    Field {
        field: String,
        value: String,
        why: String,
    },
    /// A valid header uses a feature udm does not implement.
    Unsupported(String),
    /// The header carries a requirement flag udm does not support.
    Requirement(String),
    /// No keyslot opened with the given passphrase.
    WrongPassphrase,
    /// A usage error in a management command (bad slot number, no free slot, ...).
    Usage(String),
    /// The cipher layer rejected a cipher spec or key.
    Crypto(String),
    /// A passphrase asked twice was typed differently.
    Mismatch,
    /// Failure already reported (or reported only by the exit code, as
    /// cryptsetup's isLuks): nothing to print, this exit code.
    Silent(i32),
    /// Standard input (or a pipe) ended before any passphrase byte.
    NoInput(String),
    /// The user answered no to a question, or lacks permission.
    Denied(String),
    /// `--key-slot N` names a slot that is empty or of another kind.
    NoUsableKeyslot,
    /// No token unlocked (`--token-only`); cryptsetup prints `msg` only
    /// in verbose mode.
    Token { msg: String, code: i32 },
    /// The device (or file) is missing or cannot be opened.
    Device(String),
    /// The device is in use or the name already exists.
    Busy(String),
    /// A keyslot's KDF demands more than udm will spend before trying a
    /// passphrase (`memory` tells whether it is a memory cost).
    Cost { what: String, memory: bool },
    /// The header asks for a cipher that does not hide the data (`what`
    /// names the segment or keyslot area); refused unless the user passes
    /// `--allow-weak-cipher`.
    WeakCipher { what: String, cipher: String },
}

impl LuksError {
    /// Build a [`LuksError::Field`].
    pub fn field(
        field: impl Into<String>,
        value: impl fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        let mut value = value.to_string();
        if value.len() > 80 {
            let mut cut = 77;
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            value.truncate(cut);
            value.push_str("...");
        }
        LuksError::Field {
            field: field.into(),
            value,
            why: why.into(),
        }
    }

    /// Build a [`LuksError::Io`].
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LuksError::Io {
            what: what.into(),
            source,
        }
    }

    /// cryptsetup's exit codes (its `translate_errno`): 1 wrong or missing
    /// parameters and invalid headers, 2 no permission or bad passphrase,
    /// 3 out of memory, 4 wrong device or file, 5 busy or already exists.
    pub fn exit_code(&self) -> i32 {
        match self {
            LuksError::WrongPassphrase | LuksError::Mismatch | LuksError::Denied(_) => 2,
            LuksError::Device(_) => 4,
            LuksError::Silent(c) | LuksError::Token { code: c, .. } => *c,
            LuksError::Busy(_) => 5,
            LuksError::Cost { memory: true, .. } => 3,
            LuksError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENOTBLK)
                | Some(libc::EACCES) => 4,
                Some(libc::EPERM) => 2,
                Some(libc::ENOMEM) => 3,
                Some(libc::EBUSY) | Some(libc::EEXIST) => 5,
                _ => 1,
            },
            _ => 1,
        }
    }
}

impl fmt::Display for LuksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LuksError::Io { what, source } => write!(f, "{what}: {source}"),
            LuksError::NotLuks(dev) => write!(f, "Device {dev} is not a valid LUKS device."),
            LuksError::NotLuks2(dev) => write!(f, "Device {dev} is not a valid LUKS2 device."),
            LuksError::Field { field, value, why } => {
                write!(f, "invalid LUKS header: {field} = {value}: {why}")
            }
            LuksError::Unsupported(what) => write!(f, "unsupported LUKS feature: {what}"),
            LuksError::Requirement(name) => write!(
                f,
                "LUKS2 header requires \"{name}\", which udm does not support; finish or \
                 recover it with cryptsetup first"
            ),
            LuksError::WrongPassphrase => write!(f, "No key available with this passphrase."),
            LuksError::Usage(m) => write!(f, "{m}"),
            LuksError::Crypto(m) => write!(f, "cipher error: {m}"),
            LuksError::Mismatch => write!(f, "Passphrases do not match."),
            LuksError::Silent(_) => Ok(()),
            LuksError::NoInput(what) => write!(f, "Nothing to read on {what}."),
            LuksError::Denied(m) => write!(f, "{m}"),
            LuksError::NoUsableKeyslot => write!(f, "No usable keyslot is available."),
            LuksError::Token { msg, .. } => f.write_str(msg),
            LuksError::Device(d) => write!(f, "Device {d} does not exist or access denied."),
            LuksError::Busy(m) => write!(f, "{m}"),
            LuksError::Cost { what, .. } => write!(
                f,
                "{what}; refusing to try a passphrase (a damaged or hostile header can \
                 demand this). Pass --no-kdf-limit to try it anyway."
            ),
            LuksError::WeakCipher { what, cipher } => write!(
                f,
                "{what} uses cipher {}, which stores data readable to whoever holds \
                 the storage; refusing it (an edited header can ask for this while the \
                 keyslots still open). Pass --allow-weak-cipher if the volume really is \
                 meant to be so.",
                cipher.escape_debug()
            ),
        }
    }
}

impl std::error::Error for LuksError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LuksError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
