//! Targets, one file each as in Linux's drivers/md: a target maps the byte
//! range of one table segment onto the devices below it.

use std::sync::Arc;

use crate::core::BlockDevice;

pub mod crypt;
pub mod error;
pub mod linear;
pub mod striped;
pub mod zero;

/// A table segment's target. Offsets passed to its [`BlockDevice`] methods
/// are relative to the segment start; `size()` is the segment length.
pub trait Target: BlockDevice {
    /// Target type as written in tables (`linear`, `crypt`, ...).
    fn type_name(&self) -> &'static str;

    /// Parameters as `dmsetup table` prints them (devices by the name they
    /// were given). Keys are replaced by zeros of the same length unless
    /// `show_keys`, as dmsetup does without `--showkeys`.
    fn table_params(&self, show_keys: bool) -> String;
}

/// Resolves a device argument of a table line (a path, or `@NAME` for
/// another device of the same server) to an open device.
pub trait DeviceResolver {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String>;
}

/// What a target constructor gets: its arguments (after the type name), the
/// segment length in bytes, and a resolver for device arguments.
pub struct TargetArgs<'a> {
    pub args: &'a [String],
    pub len: u64,
    pub resolver: &'a mut dyn DeviceResolver,
    /// Knobs from the command line that targets may honour
    /// (e.g. `--crypt-threads`).
    pub options: &'a TargetOptions,
}

/// Server-wide settings that reach target constructors.
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    /// Threads a crypt target may use to split one request (0 = all cores).
    pub crypt_threads: usize,
}

/// A constructor error: which argument (0-based index into `args`, or
/// `None` for the line as a whole) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetError {
    pub arg: Option<usize>,
    pub msg: String,
}

impl TargetError {
    pub fn at(arg: usize, msg: impl Into<String>) -> Self {
        TargetError {
            arg: Some(arg),
            msg: msg.into(),
        }
    }
    pub fn line(msg: impl Into<String>) -> Self {
        TargetError {
            arg: None,
            msg: msg.into(),
        }
    }
}

/// Signature every target constructor has.
pub type Constructor = fn(TargetArgs<'_>) -> Result<Arc<dyn Target>, TargetError>;

/// The constructor of a target type by name (`linear`, `striped`, ...).
pub fn table_constructor(name: &str) -> Option<Constructor> {
    crate::core::table::constructor(name)
}

/// Parse argument `idx` as a decimal count of 512-byte sectors.
pub fn parse_sectors(args: &[String], idx: usize) -> Result<u64, TargetError> {
    let s = args
        .get(idx)
        .ok_or_else(|| TargetError::at(idx, "missing"))?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::at(
            idx,
            format!("expected a decimal number of 512-byte sectors, got '{s}'"),
        ));
    }
    let v: u64 = s
        .parse()
        .map_err(|_| TargetError::at(idx, format!("'{s}' is too large")))?;
    if v > (i64::MAX as u64) >> 9 {
        return Err(TargetError::at(idx, format!("'{s}' is too large")));
    }
    Ok(v)
}

/// A device area a target maps onto: the device, the name it was given in
/// the table (printed back by `table`), and the byte offset of the area.
pub struct Area {
    pub dev: Arc<dyn BlockDevice>,
    pub name: String,
    pub offset: u64,
}

impl Area {
    /// The device name as a table prints it (escaped so that it reads back
    /// as one word: see [`crate::core::table::escape_arg`]).
    pub fn table_name(&self) -> std::borrow::Cow<'_, str> {
        crate::core::table::escape_arg(&self.name)
    }
}

/// Resolve `<dev> <offset>` at `dev_idx`, `dev_idx + 1` and check that an
/// area of `len` bytes starting there lies inside the device.
pub fn resolve_area(a: &mut TargetArgs<'_>, dev_idx: usize, len: u64) -> Result<Area, TargetError> {
    let name = a
        .args
        .get(dev_idx)
        .ok_or_else(|| TargetError::at(dev_idx, "missing device"))?
        .clone();
    let sectors = parse_sectors(a.args, dev_idx + 1)?;
    let dev = a
        .resolver
        .resolve(&name)
        .map_err(|e| TargetError::at(dev_idx, e))?;
    let offset = sectors * 512;
    let size = dev.size();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(TargetError::at(
            dev_idx + 1,
            format!(
                "area [{sectors}, +{}) sectors does not fit in {name}, which has {} sectors",
                len / 512,
                size / 512
            ),
        ));
    }
    Ok(Area { dev, name, offset })
}

/// Check the argument count of a target with a fixed number of arguments.
pub fn expect_args(args: &[String], n: usize, usage: &str) -> Result<(), TargetError> {
    if args.len() != n {
        return Err(TargetError::line(format!(
            "expected {n} arguments ({usage}), got {}",
            args.len()
        )));
    }
    Ok(())
}
