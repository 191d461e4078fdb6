//! The mount point's life: a mount left by a server that was killed
//! (its FUSE connection is gone: every access fails with ENOTCONN) is
//! detached before a new one goes there; a live mapper directory of
//! another server is refused; and the mount is detached lazily at the end,
//! so files still open (a loop device) do not keep it in the namespace.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The file system type of the mapper directory (`fuse.` + subtype).
pub const FS_TYPE: &str = "fuse.udm";

/// The mount's source name.
pub const FS_SOURCE: &str = "udm";

/// Detach the mount at `dir` (MNT_DETACH: open files keep working until
/// closed, the name is free at once).
pub fn detach(dir: &Path) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Undo the escapes /proc/self/mountinfo writes in paths (`\040` for a
/// space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(d) = oct {
            out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Whether the topmost mount at `dir` in a mountinfo text is a mapper
/// directory: a FUSE mount whose source is `udm` (mounted directly it is
/// type `fuse`, through fusermount3 `fuse.udm`).
fn mapper_at(mountinfo: &str, dir: &Path) -> bool {
    let want = dir.as_os_str().as_bytes();
    mountinfo
        .lines()
        .rev()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let point = pre.split(' ').nth(4)?;
            let mut f = post.split(' ');
            let (fstype, source) = (f.next()?, f.next()?);
            (unescape(point) == want)
                .then(|| (fstype == "fuse" || fstype == FS_TYPE) && source == FS_SOURCE)
        })
        .unwrap_or(false)
}

/// Make `dir` ready for a new mapper mount: create it if missing, detach a
/// dead mount left there, refuse a live mapper directory of another server.
pub fn prepare(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    check_place(dir)?;
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(format!(
            "--mapper-dir {shown}: not a directory; give a directory to mount the device files on"
        ))
        }
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            // Left by a server that died without unmounting (SIGKILL).
            detach(dir).map_err(|e| {
                format!(
                    "--mapper-dir {shown}: a dead mount from an earlier server is in the way \
                     and could not be detached ({e}); run `umount -l {shown}` as root"
                )
            })?;
            tracing::info!("--mapper-dir {shown}: detached the dead mount of an earlier server");
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("--mapper-dir {shown}: cannot create it: {e}"))?;
        }
        Err(e) => return Err(format!("--mapper-dir {shown}: {e}")),
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if mapper_at(&info, &canonical) {
        return Err(format!(
            "--mapper-dir {shown}: another udm server's device files are mounted there; \
             stop that server or choose another directory"
        ));
    }
    Ok(())
}

/// The mapper directory's place is checked as the control socket's is:
/// its parent must be root's or ours and closed to other writers (or
/// sticky, as /tmp, where nobody can move our directory), and the
/// directory itself, a symlink to it included, root's or ours. Otherwise
/// another user could point the mount, and with it root's device files,
/// wherever they like.
fn check_place(dir: &Path) -> Result<(), String> {
    use crate::core::dirs::{parent_of, unsafe_dir};
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| {
        Err(format!(
            "--mapper-dir {}: refusing it: {why}; give a directory only you or root may \
             change, in such a directory (as /run/udm/mapper)",
            dir.display()
        ))
    };
    if let Some(why) = unsafe_dir(parent_of(dir), true) {
        return refuse(why);
    }
    // SAFETY: geteuid has no preconditions and touches no memory.
    let me = unsafe { libc::geteuid() };
    if let Ok(l) = std::fs::symlink_metadata(dir) {
        if l.uid() != 0 && l.uid() != me {
            return refuse(format!("{} belongs to uid {}", dir.display(), l.uid()));
        }
    }
    match std::fs::metadata(dir) {
        Ok(m) if m.uid() != 0 && m.uid() != me => refuse(format!(
            "{} leads to a directory of uid {}",
            dir.display(),
            m.uid()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/root rw
35 22 0:40 / /run/udm/map\\040x rw,nosuid - tmpfs tmpfs rw
36 35 0:41 / /run/udm/map\\040x rw,nosuid,nodev - fuse.udm udm rw,user_id=0
37 22 0:42 / /dev/mapper rw,nosuid,nodev - fuse udm rw,user_id=0
38 22 0:43 / /mnt/other rw - fuse sshfs rw,user_id=0
39 22 0:44 / /mnt/below rw - fuse udm rw,user_id=0
40 39 0:45 / /mnt/below rw - tmpfs tmpfs rw
";

    #[test]
    fn mountinfo_tells_a_mapper_directory_by_its_topmost_mount() {
        assert!(mapper_at(INFO, Path::new("/run/udm/map x")));
        assert!(mapper_at(INFO, Path::new("/dev/mapper")));
        assert!(!mapper_at(INFO, Path::new("/mnt/other")), "another FUSE fs");
        assert!(
            !mapper_at(INFO, Path::new("/mnt/below")),
            "covered by tmpfs"
        );
        assert!(!mapper_at(INFO, Path::new("/")));
        assert!(!mapper_at(INFO, Path::new("/run")));
    }

    #[test]
    fn a_missing_directory_is_created_and_a_file_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        prepare(&d).unwrap();
        assert!(d.is_dir());
        let f = t.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let e = prepare(&f).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn a_mapper_directory_in_a_directory_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&open.join("mapper")).unwrap_err();
        assert!(e.contains("others may write to"), "{e}");
        assert!(!open.join("mapper").exists(), "created before the check");
    }
}
