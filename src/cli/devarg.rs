//! One reading of a device argument for every personality: where the
//! kernel's tools take a device, libdm accepts its name, the path under
//! `$DM_DEV_DIR/mapper/` (`/dev/mapper/NAME`), or a block device node of
//! it; scripts use all three (dracut closes `/dev/mapper/NAME`, the
//! kernel's thin-provisioning document messages `/dev/mapper/pool`). A
//! udm device is also reachable as its file in the server's mapper
//! directory (`serve --mapper-dir`) and as a block node over that file
//! (`--mapper-block`, a loop device). [`device_name`] turns each of these
//! into the name the control socket knows.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::control::model::DeviceInfo;
use crate::control::proto::Request;
use crate::control::Client;

/// The device name `arg` gives. A plain name is returned as it is, with
/// no server call; a path is matched against the server's devices (asked
/// through `control` only then).
pub fn device_name(
    arg: &str,
    control: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<String, String> {
    if !arg.contains('/') {
        return Ok(arg.to_string());
    }
    let under_mapper = mapper_dirs()
        .iter()
        .find_map(|d| arg.strip_prefix(d.as_str()))
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .map(str::to_string);
    let devices = list(&control()?)?;
    if let Some(n) = &under_mapper {
        if devices.iter().any(|d| &d.name == n) {
            return Ok(n.clone());
        }
    }
    if let Some(n) = by_file(Path::new(arg), &devices) {
        return Ok(n);
    }
    // A name under /dev/mapper that the server does not know: the caller
    // reports it as it reports any missing device.
    under_mapper.ok_or_else(|| {
        format!(
            "'{arg}' is not a udm device: give the device's name, /dev/mapper/NAME \
             ($DM_DEV_DIR/mapper/NAME), its file in the server's --mapper-dir, or its \
             block node (see `udm dmsetup ls`)"
        )
    })
}

/// Where libdm strips a device path down to its name: `$DM_DEV_DIR/mapper/`
/// and `/dev/mapper/`.
fn mapper_dirs() -> Vec<String> {
    let mut v = Vec::new();
    if let Some(d) = std::env::var_os("DM_DEV_DIR").filter(|d| !d.is_empty()) {
        v.push(format!(
            "{}/mapper/",
            d.to_string_lossy().trim_end_matches('/')
        ));
    }
    v.push("/dev/mapper/".into());
    v
}

fn list(control: &Path) -> Result<Vec<DeviceInfo>, String> {
    let mut c = Client::connect(control).map_err(|e| e.to_string())?;
    let r = Request {
        op: "info".into(),
        ..Request::default()
    };
    let (v, _) = c.call(r, &[]).map_err(|e| e.to_string())?;
    serde_json::from_value(v["devices"].clone())
        .map_err(|e| format!("the server's device list does not parse: {e}"))
}

/// The device whose mapper file `p` is, directly, through links, or as a
/// loop device whose backing file it is.
fn by_file(p: &Path, devices: &[DeviceInfo]) -> Option<String> {
    let meta = std::fs::metadata(p).ok()?;
    let target = if meta.file_type().is_block_device() {
        loop_backing(&std::fs::canonicalize(p).ok()?)?
    } else {
        std::fs::canonicalize(p).ok()?
    };
    devices
        .iter()
        .find(|d| {
            d.file
                .as_deref()
                .and_then(|f| std::fs::canonicalize(f).ok())
                .is_some_and(|f| f == target)
        })
        .map(|d| d.name.clone())
}

/// The file a loop device (`/dev/loopN`) reads, from sysfs.
fn loop_backing(dev: &Path) -> Option<PathBuf> {
    let n = dev.file_name()?.to_str()?;
    if !n.starts_with("loop") {
        return None;
    }
    let f = std::fs::read_to_string(format!("/sys/block/{n}/loop/backing_file")).ok()?;
    std::fs::canonicalize(f.trim_end()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_name_needs_no_server() {
        let r = device_name("vol", || Err("no server asked".into()));
        assert_eq!(r.unwrap(), "vol");
    }

    #[test]
    fn a_path_asks_the_server_and_names_what_it_accepts() {
        let e = device_name("/nowhere/x", || Ok(PathBuf::from("/nonexistent/ctl")));
        assert!(e.is_err());
        let e = device_name("./vol", || Err("no control socket".into())).unwrap_err();
        assert!(e.contains("no control socket"), "{e}");
    }
}
