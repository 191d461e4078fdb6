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

    /// cryptsetup's exit codes: 1 usage, 2 bad passphrase, 4 bad device/header.
    pub fn exit_code(&self) -> i32 {
        match self {
            LuksError::WrongPassphrase => 2,
            LuksError::Usage(_) => 1,
            LuksError::Io { .. } => 4,
            _ => 4,
        }
    }
}

impl fmt::Display for LuksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LuksError::Io { what, source } => write!(f, "{what}: {source}"),
            LuksError::NotLuks(dev) => {
                write!(f, "{dev} is not a LUKS device (no LUKS magic found)")
            }
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
