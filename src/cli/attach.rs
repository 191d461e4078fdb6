//! `udm attach NAME` / `udm detach NAME|/dev/loopN`: a block device for
//! a device of a running server, made by the host's loop driver over the
//! device's file in the server's mapper directory (`serve --mapper-dir`),
//! through util-linux's `losetup`. The server is asked where the file is,
//! so the same command works whatever directory the server mounted.
//!
//! `--nbd` (the kernel's NBD client over a socket pair, as `qemu-nbd -c`)
//! is not built: this host has no nbd module to test it on. It says so,
//! and when the module is there it prints the `nbd-client` line that does
//! the same over the server's socket.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::control::proto::Request;
use crate::control::Client;

/// Arguments of `udm attach`.
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// The device (as `udm dmsetup ls` names it).
    pub name: String,
    /// Open the file with O_DIRECT in the loop driver (losetup
    /// --direct-io=on): no second page cache below the one of the block
    /// device, which halves the memory a large copy takes.
    #[arg(long)]
    pub direct_io: bool,
    /// The read-only loop device, also for a writable device.
    #[arg(long, short = 'r')]
    pub read_only: bool,
    /// Through the kernel's NBD client instead of a loop device.
    #[arg(long)]
    pub nbd: bool,
    /// The server's control socket (default: $UDM_CONTROL, /run/udm/control
    /// as root, else $XDG_RUNTIME_DIR/udm/control).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

/// Arguments of `udm detach`.
#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    /// A device name (every loop device on its file goes) or /dev/loopN.
    pub target: String,
    /// The server's control socket (as for `attach`).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

/// The device's file and NBD URI, as the server reports them.
struct Reached {
    file: Option<String>,
    uri: Option<String>,
    read_only: bool,
}

fn ask(control: Option<&Path>, name: &str) -> Result<Reached, String> {
    let path = control
        .map(Path::to_path_buf)
        .or_else(crate::control::default_path)
        .ok_or("no control socket: give --control PATH or set $UDM_CONTROL")?;
    let mut c = Client::connect(&path).map_err(|e| e.msg)?;
    let req = Request {
        op: "info".into(),
        names: vec![name.to_string()],
        ..Request::default()
    };
    let (v, _) = c.call(req, &[]).map_err(|e| e.msg)?;
    let d = &v["devices"][0];
    if d.is_null() {
        return Err(format!("no device named '{name}' on the server"));
    }
    let text = |k: &str| d[k].as_str().map(str::to_string);
    Ok(Reached {
        file: text("file"),
        uri: text("nbd_uri"),
        read_only: d["read_only"].as_bool().unwrap_or(false),
    })
}

fn losetup(args: &[&str]) -> Result<String, String> {
    let o = Command::new("losetup")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run losetup ({e}): install util-linux, which has it"))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(format!("losetup {}: {}", args.join(" "), err.trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Why `--nbd` cannot attach here, with what would.
fn nbd_refusal(name: &str, uri: Option<&str>) -> String {
    if !Path::new("/dev/nbd0").exists() {
        return format!(
            "--nbd: this kernel has no nbd module (no /dev/nbd0; `modprobe nbd` where it \
             is built); `udm attach {name}` makes a loop device instead"
        );
    }
    let how = uri.map_or(String::new(), |u| {
        format!("; nbd-client reaches it: `nbd-client -N {name} ...` with {u}")
    });
    format!("--nbd: udm does not connect /dev/nbdN itself yet{how}")
}

fn attach(a: &AttachArgs) -> Result<(), String> {
    let r = ask(a.control.as_deref(), &a.name)?;
    if a.nbd {
        return Err(nbd_refusal(&a.name, r.uri.as_deref()));
    }
    let file = r.file.ok_or_else(|| {
        format!(
            "device '{}' has no file: start the server with --mapper-dir DIR \
             (loop devices sit on the device's file there)",
            a.name
        )
    })?;
    if !Path::new("/dev/loop-control").exists() {
        return Err("this kernel has no loop driver (no /dev/loop-control)".into());
    }
    let mut args = vec!["--find", "--show"];
    if a.direct_io {
        args.push("--direct-io=on");
    }
    if a.read_only || r.read_only {
        args.push("--read-only");
    }
    args.push(&file);
    print!("{}", losetup(&args)?);
    Ok(())
}

/// The loop devices whose backing file is `file`.
fn loops_on(file: &str) -> Result<Vec<String>, String> {
    let out = losetup(&["--noheadings", "--output", "NAME", "--associated", file])?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

fn detach(a: &DetachArgs) -> Result<(), String> {
    if a.target.starts_with("/dev/") {
        losetup(&["--detach", &a.target])?;
        return Ok(());
    }
    let r = ask(a.control.as_deref(), &a.target)?;
    let file = r
        .file
        .ok_or_else(|| format!("device '{}' has no file, so no loop device", a.target))?;
    let loops = loops_on(&file)?;
    if loops.is_empty() {
        return Err(format!("no loop device is attached to '{}'", a.target));
    }
    for l in loops {
        losetup(&["--detach", &l])?;
    }
    Ok(())
}

pub fn run_attach(a: AttachArgs) -> i32 {
    exit(attach(&a), "attach")
}

pub fn run_detach(a: DetachArgs) -> i32 {
    exit(detach(&a), "detach")
}

fn exit(r: Result<(), String>, command: &str) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            crate::cli::report_error(command, &e);
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbd_without_the_module_says_so() {
        if Path::new("/dev/nbd0").exists() {
            let m = nbd_refusal("v", Some("nbd+unix:///v?socket=/s"));
            assert!(m.contains("nbd+unix:///v"), "{m}");
        } else {
            let m = nbd_refusal("v", None);
            assert!(m.contains("no nbd module"), "{m}");
            assert!(m.contains("udm attach v"), "{m}");
        }
    }
}
