//! Where a device path points: a local file or block device, an RBD image
//! (`rbd:POOL/IMAGE[@SNAP][:conf=FILE][:id=CLIENT][:keyring=FILE][:KEY=VALUE…]`,
//! qemu's spelling, `KEY` from the allow-list [`RBD_PATH_OPTIONS`]), or an NBD export (`nbd://HOST[:PORT]/EXPORT`,
//! `nbd+unix:///EXPORT?socket=PATH`, the NBD URI standard's spelling).
//!
//! Every place that takes a path — a table line, `--file`, `--luks`, the
//! LUKS commands — goes through [`Location::parse`], so a remote image can
//! stand wherever a file can. A local file whose name happens to start with
//! `rbd:` or `nbd:` is reached as `./rbd:…`, as with qemu.
//!
//! Components are percent-decoded by the `percent-encoding` crate. The
//! split into scheme, authority, path and query stays a few lines here: a
//! general URL parser decodes `+` in queries as a space (wrong for socket
//! paths) and would pull in IDNA tables for host names NBD never needs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::core::BlockDevice;

use super::file::{FileStore, OpenFlags};
use super::nbd::{NbdAddr, NbdSpec, NbdStore};
pub use super::rbd_spec::RbdSpec;

/// A parsed device path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    File(PathBuf),
    Rbd(RbdSpec),
    Nbd(NbdSpec),
}

impl Location {
    /// Whether `spec` names a remote device (RBD or NBD) rather than a file.
    pub fn is_remote(spec: &str) -> bool {
        spec.starts_with("rbd:")
            || spec.starts_with("nbd:")
            || spec.starts_with("nbd+")
            || spec.starts_with("nbds:")
            || spec.starts_with("nbds+")
    }

    /// Parse a device path; errors say what is wrong and what form is
    /// expected.
    pub fn parse(spec: &str) -> Result<Location, String> {
        if let Some(rest) = spec.strip_prefix("rbd:") {
            // The path may carry a secret its writer should not have put
            // there: errors show it with every option value elided.
            return parse_rbd(rest).map(Location::Rbd).map_err(|e| {
                format!(
                    "bad RBD path '{}': {e}; expected rbd:POOL/IMAGE[@SNAP][:conf=FILE][:id=CLIENT][:keyring=FILE]",
                    redacted_rbd(rest)
                )
            });
        }
        if Location::is_remote(spec) {
            return parse_nbd(spec).map(Location::Nbd).map_err(|e| {
                format!("bad NBD URI '{spec}': {e}; expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH")
            });
        }
        Ok(Location::File(PathBuf::from(spec)))
    }

    /// The key under which an opened device is shared: two table lines
    /// naming one file (by any spelling) or one remote image use one store,
    /// so one descriptor, one cluster connection, one image lock.
    /// Canonical paths are absolute, so they never equal a remote spec.
    pub fn share_key(&self, spec: &str) -> Result<PathBuf, String> {
        match self {
            Location::File(p) => std::fs::canonicalize(p).map_err(|e| {
                format!(
                    "cannot open {}: {e}; give an existing file or block device",
                    p.display()
                )
            }),
            _ => Ok(PathBuf::from(spec)),
        }
    }

    /// Open the device.
    pub fn open(&self, flags: OpenFlags) -> Result<Arc<dyn BlockDevice>, String> {
        match self {
            Location::File(p) => FileStore::open(p, flags)
                .map(|s| Arc::new(s) as Arc<dyn BlockDevice>)
                .map_err(|e| e.to_string()),
            Location::Nbd(n) => NbdStore::connect(n.clone(), flags.read_only)
                .map(|s| Arc::new(s) as Arc<dyn BlockDevice>),
            Location::Rbd(r) => open_rbd(r, flags),
        }
    }
}

/// Open what `spec` names (a file, an RBD image, an NBD export).
pub fn open(spec: &str, flags: OpenFlags) -> Result<Arc<dyn BlockDevice>, String> {
    Location::parse(spec)?.open(flags)
}

/// Open a path given as a `Path` (command-line arguments): a path that is
/// not UTF-8 can only be a file.
pub fn open_path(path: &Path, flags: OpenFlags) -> Result<Arc<dyn BlockDevice>, String> {
    match path.to_str() {
        Some(s) => open(s, flags),
        None => Location::File(path.to_path_buf()).open(flags),
    }
}

#[cfg(feature = "rbd")]
fn open_rbd(r: &RbdSpec, flags: OpenFlags) -> Result<Arc<dyn BlockDevice>, String> {
    super::rbd::RbdStore::open(r, flags.read_only).map(|s| Arc::new(s) as Arc<dyn BlockDevice>)
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(r: &RbdSpec, _flags: OpenFlags) -> Result<Arc<dyn BlockDevice>, String> {
    Err(format!(
        "cannot open RBD image {}/{}: this udm was built without RBD support; rebuild with `cargo build --features rbd` (needs Debian's librbd-dev and librados-dev)",
        r.pool, r.image
    ))
}

/// Split `s` at unescaped `sep`, removing the escaping backslashes of `\:`
/// `\@` `\/` `\\` in the pieces (qemu's escaping in rbd paths).
fn split_escaped(s: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n) if n == sep => out.last_mut().unwrap().push(n),
                Some(n) => {
                    out.last_mut().unwrap().push('\\');
                    out.last_mut().unwrap().push(n);
                }
                None => out.last_mut().unwrap().push('\\'),
            }
        } else if c == sep {
            out.push(String::new());
        } else {
            out.last_mut().unwrap().push(c);
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_rbd(rest: &str) -> Result<RbdSpec, String> {
    let parts = split_escaped(rest, ':');
    let name = &parts[0];
    let (pool, image) = match split_escaped(name, '/').as_slice() {
        [p, i] => (p.clone(), i.clone()),
        _ => return Err("the image must be given as POOL/IMAGE".into()),
    };
    let (image, snap) = match split_escaped(&image, '@').as_slice() {
        [i] => (i.clone(), None),
        [i, s] => (i.clone(), Some(unescape(s))),
        _ => return Err("more than one '@' in the image name".into()),
    };
    let (pool, image) = (unescape(&pool), unescape(&image));
    if pool.is_empty() || image.is_empty() {
        return Err("pool and image names must not be empty".into());
    }
    if snap.as_deref() == Some("") {
        return Err("empty snapshot name after '@'".into());
    }
    let mut spec = RbdSpec {
        pool,
        image,
        snap,
        conf: None,
        id: None,
        options: Vec::new(),
        queue_depth: None,
    };
    for opt in &parts[1..] {
        // A word without '=' may be a pasted secret: never echoed.
        let Some((k, v)) = opt.split_once('=') else {
            return Err("an option is not KEY=VALUE".into());
        };
        let (k, v) = (unescape(k), unescape(v));
        if k.is_empty() || v.is_empty() || k.contains('\0') || v.contains('\0') {
            return Err(format!(
                "option '{}' needs a key and a value",
                k.escape_debug()
            ));
        }
        check_rbd_option(&k)?;
        match k.as_str() {
            "conf" => spec.conf = Some(PathBuf::from(v)),
            "id" => spec.id = Some(v),
            "udm_queue_depth" => {
                spec.queue_depth = Some(
                    v.parse()
                        .ok()
                        .filter(|&d| d <= 1024)
                        .ok_or_else(|| format!("udm_queue_depth={v}: give 0 to 1024"))?,
                )
            }
            _ => spec.options.push((k, v)),
        }
    }
    if [&spec.pool, &spec.image]
        .iter()
        .chain(spec.snap.as_ref().iter())
        .chain(spec.id.as_ref().iter())
        .any(|s| s.contains('\0'))
    {
        return Err("names must not contain NUL bytes".into());
    }
    Ok(spec)
}

/// librados options a path may set besides `conf`, `id` and
/// `udm_queue_depth`. A path is written by whoever can write a table (a
/// control-socket user, a crypttab, a generator that interpolates an image
/// name), so it must not reach options that make librados write files
/// (`log_file`, `admin_socket`, …), change where secrets come from beyond
/// naming a keyring, or undo udm's own settings (`rbd_cache`, zero-copy
/// writes). Everything else belongs in the Ceph config file.
pub const RBD_PATH_OPTIONS: &[&str] = &[
    "keyring",
    "mon_host",
    "client_mount_timeout",
    "rados_osd_op_timeout",
    "rados_mon_op_timeout",
    "rbd_concurrent_management_ops",
    "rbd_readahead_max_bytes",
    "rbd_readahead_trigger_requests",
    "rbd_readahead_disable_after_bytes",
];

/// Refuses a path option outside the allow-list, naming the key (never
/// its value) and where such settings belong instead.
fn check_rbd_option(k: &str) -> Result<(), String> {
    let k_shown = shown_key(k);
    if matches!(k, "conf" | "id" | "udm_queue_depth") || RBD_PATH_OPTIONS.contains(&k) {
        return Ok(());
    }
    let lower = k.to_ascii_lowercase();
    if lower == "key" || lower.contains("keyfile") || lower.contains("secret") {
        return Err(format!(
            "option '{k_shown}' would put a Ceph secret in the path, where process \
             lists, logs and tables show it; put the key in a keyring file and \
             give keyring=FILE"
        ));
    }
    if lower.ends_with("_file") || lower.contains("admin_socket") || lower.ends_with("_dir") {
        return Err(format!(
            "option '{k_shown}' would let a path make librados create or write files; \
             it is refused in paths (set it in the Ceph config file given with conf=)"
        ));
    }
    if lower == "rbd_cache" || lower == "rbd_disable_zero_copy_writes" {
        return Err(format!(
            "option '{k_shown}' is udm's own choice (the cache stays off so that FUA \
             and flush mean what they say); it cannot be set in a path"
        ));
    }
    Err(format!(
        "option '{k_shown}' cannot be set in a path; allowed: conf, id, \
         udm_queue_depth, {} (others go in the Ceph config file given with conf=)",
        RBD_PATH_OPTIONS.join(", ")
    ))
}

/// An option's key as errors show it: only if it looks like an option
/// name (a pasted `SECRET==` splits into a "key" that is the secret).
fn shown_key(k: &str) -> &str {
    let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if !k.is_empty() && k.len() <= 64 && k.chars().all(plain) {
        k
    } else {
        "…"
    }
}

/// An `rbd:` path for error messages: the image name as written, every
/// option's value (and any word that is not `KEY=VALUE`) elided.
fn redacted_rbd(rest: &str) -> String {
    let parts = split_escaped(rest, ':');
    let mut out = format!("rbd:{}", parts[0]);
    for opt in &parts[1..] {
        match opt.split_once('=') {
            Some((k, _)) => out.push_str(&format!(":{}=…", shown_key(k))),
            None => out.push_str(":…"),
        }
    }
    out
}

/// Percent-decoding of a URI component (the `percent-encoding` crate).
/// That crate passes a malformed escape through as it is; a URI with one is
/// refused here instead, since it most likely names something else than
/// its writer meant.
fn percent_decode(s: &str) -> Result<String, String> {
    let malformed = s
        .split('%')
        .skip(1)
        .any(|after| after.len() < 2 || !after.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit));
    if malformed {
        return Err(format!("bad percent escape in '{s}'"));
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| format!("'{s}' does not decode to UTF-8"))
}

fn parse_nbd(spec: &str) -> Result<NbdSpec, String> {
    let (scheme, rest) = spec
        .split_once("://")
        .ok_or("missing '://' after the scheme")?;
    let unix = match scheme {
        "nbd" => false,
        "nbd+unix" => true,
        "nbds" | "nbds+unix" => {
            return Err("TLS (nbds) is not supported by udm's NBD client; use nbd:// over a trusted network or a Unix socket".into())
        }
        other => return Err(format!("unknown scheme '{other}'")),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let export = percent_decode(path)?;
    let mut socket = None;
    for kv in query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "socket" if unix => socket = Some(PathBuf::from(percent_decode(v)?)),
            _ => return Err(format!("unsupported query parameter '{k}'")),
        }
    }
    let addr = if unix {
        if !authority.is_empty() {
            return Err("nbd+unix URIs have no host: write nbd+unix:///EXPORT?socket=PATH".into());
        }
        NbdAddr::Unix(socket.ok_or("nbd+unix needs ?socket=PATH")?)
    } else {
        if authority.is_empty() {
            return Err("no host".into());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, p) = v6.split_once(']').ok_or("unclosed '[' in the host")?;
            (h.to_string(), p.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| format!("bad port '{p}'"))?,
            None => crate::protocol::nbd::DEFAULT_PORT,
        };
        NbdAddr::Tcp(host, port)
    };
    if export.len() > 4096 {
        return Err("export name longer than 4096 bytes".into());
    }
    Ok(NbdSpec { addr, export })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbd_paths() {
        let l = Location::parse("rbd:rbd/disk1").unwrap();
        let Location::Rbd(r) = l else { panic!() };
        assert_eq!((r.pool.as_str(), r.image.as_str()), ("rbd", "disk1"));
        assert_eq!(r.snap, None);
        let Location::Rbd(r) =
            Location::parse("rbd:p/i@s1:conf=/tmp/c.conf:id=u:keyring=/k:rados_osd_op_timeout=5")
                .unwrap()
        else {
            panic!()
        };
        assert_eq!(r.snap.as_deref(), Some("s1"));
        assert_eq!(r.conf.as_deref(), Some(Path::new("/tmp/c.conf")));
        assert_eq!(r.id.as_deref(), Some("u"));
        assert_eq!(
            r.options,
            vec![
                ("keyring".to_string(), "/k".to_string()),
                ("rados_osd_op_timeout".to_string(), "5".to_string())
            ]
        );
        let Location::Rbd(r) = Location::parse(r"rbd:p/a\:b:conf=/x\:y").unwrap() else {
            panic!()
        };
        assert_eq!(r.image, "a:b");
        assert_eq!(r.conf.as_deref(), Some(Path::new("/x:y")));
        for bad in [
            "rbd:",
            "rbd:pool",
            "rbd:/img",
            "rbd:p/i@",
            "rbd:p/i:noequals",
            "rbd:a/b/c",
        ] {
            let e = Location::parse(bad).unwrap_err();
            assert!(e.contains("rbd:POOL/IMAGE"), "{bad}: {e}");
        }
    }

    #[test]
    fn rbd_secrets_are_refused_and_never_echoed() {
        for bad in [
            "rbd:p/i:id=app:key=AQBcSECRETcephxKEY==",
            "rbd:p/i:keyfile=AQBcSECRETcephxKEY==",
            "rbd:pool:id=app:key=AQBcSECRETcephxKEY==",
            "rbd:p/i@:key=AQBcSECRETcephxKEY==",
            "rbd:p/i:AQBcSECRETcephxKEY==",
        ] {
            let e = Location::parse(bad).unwrap_err();
            assert!(!e.contains("SECRET"), "{bad}: {e}");
            assert!(e.contains("rbd:p") && e.contains("rbd:POOL/IMAGE"), "{e}");
        }
        let e = Location::parse("rbd:p/i:key=AQBcSECRET").unwrap_err();
        assert!(e.contains("keyring=FILE") && e.contains(":key=…"), "{e}");
    }

    #[test]
    fn rbd_options_outside_the_allow_list_are_refused() {
        for (bad, why) in [
            ("log_file=/etc/cron.d/x", "create or write files"),
            ("admin_socket=/run/x", "create or write files"),
            ("run_dir=/tmp", "create or write files"),
            ("debug_rbd=20", "allowed: conf"),
            ("rbd_cache=true", "udm's own"),
            ("rbd_disable_zero_copy_writes=false", "udm's own"),
        ] {
            let e = Location::parse(&format!("rbd:p/i:{bad}")).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            let (k, v) = bad.split_once('=').unwrap();
            assert!(e.contains(k) && !e.contains(v), "{bad}: {e}");
        }
        let ok = "rbd:p/i:mon_host=10.0.0.1:keyring=/k:client_mount_timeout=5:udm_queue_depth=8";
        assert!(Location::parse(ok).is_ok());
    }

    #[test]
    fn nbd_uris() {
        let Location::Nbd(n) = Location::parse("nbd://127.0.0.1:10900/my%20disk").unwrap() else {
            panic!()
        };
        assert_eq!(n.addr, NbdAddr::Tcp("127.0.0.1".into(), 10900));
        assert_eq!(n.export, "my disk");
        let Location::Nbd(n) = Location::parse("nbd://host").unwrap() else {
            panic!()
        };
        assert_eq!(n.addr, NbdAddr::Tcp("host".into(), 10809));
        assert_eq!(n.export, "");
        let Location::Nbd(n) = Location::parse("nbd://[::1]:99/e").unwrap() else {
            panic!()
        };
        assert_eq!(n.addr, NbdAddr::Tcp("::1".into(), 99));
        let Location::Nbd(n) = Location::parse("nbd+unix:///ex?socket=/tmp/s.sock").unwrap() else {
            panic!()
        };
        assert_eq!(n.addr, NbdAddr::Unix("/tmp/s.sock".into()));
        assert_eq!(n.export, "ex");
        for bad in [
            "nbd+unix:///x",
            "nbd+unix://h/x?socket=/s",
            "nbds://h/x",
            "nbd://h:port/x",
            "nbd://",
            "nbd:/x",
            "nbd://h/x?tls=1",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad}");
        }
        let Location::Nbd(n) = Location::parse("nbd+unix:///a%2Fb%25?socket=/s%20k").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (n.export.as_str(), n.addr),
            ("a/b%", NbdAddr::Unix("/s k".into()))
        );
        for bad in [
            "nbd://h/x%2",
            "nbd://h/x%zz",
            "nbd://h/%ff",
            "nbd+unix:///?socket=%",
        ] {
            let e = Location::parse(bad).unwrap_err();
            assert!(
                e.contains("percent escape") || e.contains("UTF-8"),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            Location::parse("./rbd:x").unwrap(),
            Location::File("./rbd:x".into())
        );
        assert_eq!(
            Location::parse("/dev/shm/a").unwrap(),
            Location::File("/dev/shm/a".into())
        );
    }
}
