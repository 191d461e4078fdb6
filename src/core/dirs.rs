//! Whether a directory is safe for the files a root server puts there
//! (its control socket, its pidfile, its mapper directory): another user
//! who owns the directory, or may write to it, could plant a symlink or
//! swap what udm created, and a root process would then follow it. One
//! check for all of them, so none is laxer than the others.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Why `dir` is unsafe, if it is: it must belong to root or to the
/// effective user, and nobody else may write to it. With `sticky_ok` a
/// directory others may write to passes when it has the sticky bit (as
/// /tmp): there nobody may remove or rename what another user made, which
/// is enough for a file created with `O_EXCL|O_NOFOLLOW`, not for a
/// socket whose path a client trusts. A missing directory passes (the
/// caller creates it, or the next step names it).
pub fn unsafe_dir(dir: &Path, sticky_ok: bool) -> Option<String> {
    let m = std::fs::metadata(dir).ok()?;
    // SAFETY: geteuid has no preconditions and touches no memory.
    let me = unsafe { libc::geteuid() };
    if m.uid() != 0 && m.uid() != me {
        return Some(format!(
            "{} belongs to uid {}, who could replace what is in it",
            dir.display(),
            m.uid()
        ));
    }
    let others_write = m.mode() & 0o022 != 0;
    let sticky = m.mode() & 0o1000 != 0;
    if others_write && !(sticky_ok && sticky) {
        return Some(format!(
            "others may write to {} (mode {:o}) and so plant or replace what is in it",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// The directory a path is in (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn others_writing_is_refused_unless_sticky_is_allowed() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("d");
        std::fs::create_dir(&d).unwrap();
        assert_eq!(unsafe_dir(&d, false), None);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = unsafe_dir(&d, true).expect("world-writable, not sticky");
        assert!(e.contains("mode 777"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(unsafe_dir(&d, true), None);
        assert!(
            unsafe_dir(&d, false).is_some(),
            "sticky passed where it may not"
        );
        assert_eq!(parent_of(Path::new("x")), Path::new("."));
        assert_eq!(parent_of(Path::new("/a/x")), Path::new("/a"));
    }
}
