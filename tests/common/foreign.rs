//! What the tests of other systems' volumes (TrueCrypt, BitLocker,
//! FileVault2) share: the upstream images unpacked into a scratch folder,
//! `udm cryptsetup` with a passphrase on a pipe, and a device read back
//! over NBD for the filesystem UUID and sha256 the upstream scripts check.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::{run, run_text, scratch, show, udm, upstream_cryptsetup_tests, UdmServe};

/// `archive` of cryptsetup's test folder unpacked into a scratch folder
/// (sparse files stay sparse); the folder it holds is `inner`.
pub fn unpack_upstream(archive: &str, inner: &str) -> (tempfile::TempDir, PathBuf) {
    super::need("tar");
    let dir = scratch(inner);
    run(Command::new("tar")
        .arg("xJSf")
        .arg(upstream_cryptsetup_tests().join(archive))
        .arg("--no-same-owner")
        .arg("-C")
        .arg(dir.path()));
    let inner = dir.path().join(inner);
    (dir, inner)
}

/// `udm cryptsetup ARGS` in `dir` (with the server's control socket when
/// given) and `input` plus a newline on standard input, as the upstream
/// scripts `echo` a passphrase.
pub fn cs_piped<S: AsRef<OsStr>>(
    dir: &Path,
    ctl: Option<&Path>,
    args: &[S],
    input: &str,
) -> Output {
    let mut cmd = udm();
    cmd.arg("cryptsetup").args(args).current_dir(dir);
    if let Some(c) = ctl {
        cmd.env("UDM_CONTROL", c);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut i = child.stdin.take().unwrap();
        let _ = i.write_all(format!("{input}\n").as_bytes());
    }
    child.wait_with_output().unwrap()
}

/// Copy export `name` out of `srv` over NBD into `dir`, then close it on
/// the server (closed also when the copy failed).
pub fn copy_and_close(
    dir: &Path,
    ctl: &Path,
    srv: &UdmServe,
    name: &str,
) -> Result<PathBuf, String> {
    let copy = dir.join(format!("{name}.copy"));
    let c = Command::new("nbdcopy")
        .arg(srv.uri(name))
        .arg(&copy)
        .output()
        .unwrap();
    let closed = cs_piped(dir, Some(ctl), &["close", name], "");
    if !c.status.success() || !closed.status.success() {
        let _ = std::fs::remove_file(&copy);
        return Err(format!("nbdcopy: {}\nclose: {}", show(&c), show(&closed)));
    }
    Ok(copy)
}

/// The filesystem UUID blkid finds in `file` at byte `offset` (empty
/// when it finds none).
pub fn fs_uuid(file: &Path, offset: u64) -> String {
    let o = Command::new("blkid")
        .args(["-p", "-O", &offset.to_string(), "-o", "value", "-s", "UUID"])
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The sha256 of `file`, as sha256sum prints it.
pub fn sha256_of(file: &Path) -> String {
    let sum = run_text(Command::new("sha256sum").arg(file));
    sum.split_whitespace().next().unwrap_or("").to_string()
}
