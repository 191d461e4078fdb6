//! Errors of the I/O path. Each carries enough to tell a user what failed,
//! and maps onto the errno an NBD client receives.

use std::fmt;

/// An I/O-path error. Cheap to construct; never carries key material.
#[derive(Debug)]
pub enum DevError {
    /// The backing store failed (errno preserved).
    Io(std::io::Error),
    /// Request outside the device.
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// Request not aligned to the device's logical block size.
    Misaligned { offset: u64, len: u64, align: u32 },
    /// Write, trim or zero on a read-only device.
    ReadOnly,
    /// The operation is not supported by this device.
    NotSupported(&'static str),
    /// The `error` target, or a target that failed for its own reason.
    Target(String),
}

pub type DevResult<T> = Result<T, DevError>;

impl DevError {
    /// The NBD error value for this error (protocol document, "Error values").
    pub fn nbd_errno(&self, is_write: bool) -> u32 {
        const EPERM: u32 = 1;
        const EIO: u32 = 5;
        const EINVAL: u32 = 22;
        const ENOSPC: u32 = 28;
        const ENOTSUP: u32 = 95;
        match self {
            DevError::Io(e) => match e.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => ENOSPC,
                Some(libc::EROFS) | Some(libc::EPERM) | Some(libc::EACCES) => EPERM,
                _ => EIO,
            },
            DevError::OutOfRange { .. } => {
                if is_write {
                    ENOSPC
                } else {
                    EINVAL
                }
            }
            DevError::Misaligned { .. } => EINVAL,
            DevError::ReadOnly => EPERM,
            DevError::NotSupported(_) => ENOTSUP,
            DevError::Target(_) => EIO,
        }
    }
}

impl fmt::Display for DevError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DevError::Io(e) => write!(f, "I/O error: {e}"),
            DevError::OutOfRange { offset, len, size } => write!(
                f,
                "request [{offset}, +{len}) is beyond the device size {size}"
            ),
            DevError::Misaligned { offset, len, align } => write!(
                f,
                "request [{offset}, +{len}) is not aligned to the {align}-byte block size"
            ),
            DevError::ReadOnly => write!(f, "device is read-only"),
            DevError::NotSupported(what) => write!(f, "{what} is not supported by this device"),
            DevError::Target(msg) => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for DevError {}

impl From<std::io::Error> for DevError {
    fn from(e: std::io::Error) -> Self {
        DevError::Io(e)
    }
}
