//! What an `rbd:` path names, parsed by `location.rs` and opened by
//! `rbd/` (a file of its own so that the two do not use each other, and so
//! that a build without the `rbd` feature still parses and explains such
//! paths).

use std::path::PathBuf;

/// An RBD image as named in a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// Open this snapshot (read-only) instead of the image head.
    pub snap: Option<String>,
    /// Ceph configuration file (`conf=`); `None` = `/etc/ceph/ceph.conf`
    /// if it exists (never librados' own search, which reads the working
    /// directory's `ceph.conf`).
    pub conf: Option<PathBuf>,
    /// Client id without the `client.` prefix (`id=`); `None` = `admin`.
    pub id: Option<String>,
    /// Other allowed `key=value`s (`keyring=`, `mon_host=`, timeouts:
    /// `location::RBD_PATH_OPTIONS`), set on the cluster handle with
    /// `rados_conf_set`, as qemu does.
    pub options: Vec<(String, String)>,
    /// `udm_queue_depth=N`: requests the engine keeps in flight for the
    /// image (default 64; 0 = run requests like a local file's, for
    /// comparison).
    pub queue_depth: Option<u32>,
}
