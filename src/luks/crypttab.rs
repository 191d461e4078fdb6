//! /etc/crypttab (systemd's format) for `udm serve --crypttab FILE`: one
//! volume per line, `NAME DEVICE [KEYFILE [OPTIONS]]`, `#` comments.
//!
//! DEVICE is a path, or `UUID=`/`PARTUUID=`/`LABEL=`/`PARTLABEL=` resolved
//! through /dev/disk/by-* (udev's links; an image file is named by path).
//! KEYFILE `none` or `-` (or absent) means: ask for the passphrase.
//! OPTIONS are comma-separated; those that change the mapping are honoured
//! (`luks`, `plain`, `cipher=`, `size=`, `hash=`, `offset=`, `skip=`,
//! `header=`, `keyfile-offset=`, `keyfile-size=`, `key-slot=`, `tries=`,
//! `sector-size=`, `readonly`, `discard`, ...), those that only matter to
//! systemd's boot ordering are accepted with a note, and anything else is
//! an error naming the line.

use super::error::LuksError;
use super::passphrase::KeySource;
use super::plain::{self, PlainParams};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Options systemd uses for ordering or for its own tools; they do not
/// change what udm serves.
const IGNORED: &[&str] = &[
    "noauto",
    "nofail",
    "_netdev",
    "initramfs",
    "noearly",
    "headless",
    "x-initrd.attach",
    "bypass-workqueues",
];

/// dm-crypt performance flags: accepted, udm's crypt target has no
/// workqueues to bypass.
const PERF: &[&str] = &[
    "no-read-workqueue",
    "no-write-workqueue",
    "same-cpu-crypt",
    "submit-from-crypt-cpus",
];

/// One crypttab line.
#[derive(Clone, Debug)]
pub struct CryptEntry {
    pub line: usize,
    pub name: String,
    pub device: PathBuf,
    pub key: KeySource,
    /// `plain` given: plain dm-crypt.
    pub plain: bool,
    /// `luks` given: LUKS only. With neither, a device without a LUKS
    /// header is taken as plain (systemd-cryptsetup's rule), unless it
    /// shows LUKS remnants (then refused).
    pub luks: bool,
    pub plain_params: PlainParams,
    pub header: Option<PathBuf>,
    pub key_slot: Option<u32>,
    pub tries: u32,
    pub read_only: bool,
    pub discard: bool,
    /// Notes for the log (options accepted without effect).
    pub notes: Vec<String>,
}

fn err(path: &Path, line: usize, msg: impl std::fmt::Display) -> LuksError {
    LuksError::Usage(format!("{}:{line}: {msg}", path.display()))
}

fn num<T: std::str::FromStr>(
    path: &Path,
    line: usize,
    k: &str,
    v: Option<&str>,
) -> Result<T, LuksError> {
    v.and_then(|v| v.parse().ok()).ok_or_else(|| {
        err(
            path,
            line,
            format!("option {k}= needs a number, got {:?}", v.unwrap_or("")),
        )
    })
}

/// Resolve `UUID=…` and friends through /dev/disk/by-*.
fn resolve(spec: &str) -> Option<PathBuf> {
    for (prefix, dir) in [
        ("UUID=", "by-uuid"),
        ("PARTUUID=", "by-partuuid"),
        ("LABEL=", "by-label"),
        ("PARTLABEL=", "by-partlabel"),
    ] {
        if let Some(v) = spec.strip_prefix(prefix) {
            let p = Path::new("/dev/disk").join(dir).join(v.trim_matches('"'));
            return p.exists().then_some(p);
        }
    }
    Some(PathBuf::from(spec))
}

/// Parse crypttab text (`path` names it in errors).
pub fn parse(text: &str, path: &Path) -> Result<Vec<CryptEntry>, LuksError> {
    let mut out: Vec<CryptEntry> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 2 || f.len() > 4 {
            return Err(err(
                path,
                line,
                format!(
                    "expected NAME DEVICE [KEYFILE [OPTIONS]], got {} fields",
                    f.len()
                ),
            ));
        }
        let name = f[0].to_string();
        if name.contains('/') {
            return Err(err(
                path,
                line,
                format!("volume name {name:?} may not contain '/'"),
            ));
        }
        if out.iter().any(|e| e.name == name) {
            return Err(err(path, line, format!("volume {name} is defined twice")));
        }
        let device = resolve(f[1]).ok_or_else(|| {
            err(
                path,
                line,
                format!("device {} not found (no /dev/disk entry for it)", f[1]),
            )
        })?;
        let key_file = match f.get(2) {
            None | Some(&"none") | Some(&"-") => None,
            Some(p) => Some(PathBuf::from(p)),
        };
        let mut e = CryptEntry {
            line,
            name,
            device,
            key: KeySource {
                key_file,
                ..KeySource::default()
            },
            plain: false,
            luks: false,
            plain_params: PlainParams::default(),
            header: None,
            key_slot: None,
            tries: 3,
            read_only: false,
            discard: false,
            notes: Vec::new(),
        };
        let mut kind: Option<&str> = None;
        for opt in f.get(3).map(|o| o.split(',')).into_iter().flatten() {
            if opt.is_empty() {
                continue;
            }
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            match k {
                "luks" | "plain" => {
                    if kind.is_some_and(|x| x != k) {
                        return Err(err(path, line, "options luks and plain exclude each other"));
                    }
                    kind = Some(if k == "luks" { "luks" } else { "plain" });
                }
                "cipher" => e.plain_params.cipher = v.unwrap_or_default().to_string(),
                "size" => {
                    let bits: u32 = num(path, line, k, v)?;
                    if bits == 0 || bits % 8 != 0 {
                        return Err(err(path, line, "size= must be a multiple of 8 bits"));
                    }
                    e.plain_params.key_bytes = (bits / 8) as usize;
                }
                "hash" => e.plain_params.hash = v.map(str::to_string),
                "offset" => e.plain_params.offset = num(path, line, k, v)?,
                "skip" => e.plain_params.skip = num(path, line, k, v)?,
                "sector-size" => e.plain_params.sector_size = num(path, line, k, v)?,
                "header" => e.header = v.map(PathBuf::from),
                "keyfile-offset" => e.key.offset = num(path, line, k, v)?,
                "keyfile-size" => e.key.size = Some(num(path, line, k, v)?),
                "key-slot" | "keyslot" => e.key_slot = Some(num(path, line, k, v)?),
                "tries" => e.tries = num(path, line, k, v)?,
                "readonly" | "read-only" => e.read_only = true,
                "discard" => e.discard = true,
                "timeout" | "keyfile-timeout" | "password-echo" | "token-timeout" => {
                    e.notes.push(format!("option {k} has no effect in udm"))
                }
                k if PERF.contains(&k) => e.notes.push(format!(
                    "option {k} accepted; udm's crypt target has no workqueues"
                )),
                k if IGNORED.contains(&k) || k.starts_with("x-systemd.") => e
                    .notes
                    .push(format!("option {k} concerns boot ordering only; ignored")),
                other => {
                    return Err(err(
                        path,
                        line,
                        format!(
                            "unknown or unsupported option {other:?} for volume {}",
                            e.name
                        ),
                    ))
                }
            }
        }
        e.plain = kind == Some("plain");
        e.luks = kind == Some("luks");
        if e.discard {
            e.plain_params.flags.push("allow_discards");
        }
        out.push(e);
    }
    Ok(out)
}

impl CryptEntry {
    /// Whether a line with neither `luks` nor `plain` is plain dm-crypt:
    /// systemd's rule (no LUKS header, so plain), except that a device
    /// with LUKS remnants is refused. Wiping the magics is all a storage
    /// holder needs to turn a LUKS volume into a KDF-less plain mapping
    /// at offset 0, whose first writes destroy the keyslots.
    fn falls_back_to_plain(&self, dev: &str) -> Result<bool, LuksError> {
        let header = self.header.as_deref();
        if !matches!(
            super::volume::Volume::load(&self.device, header, false),
            Err(LuksError::NotLuks(_))
        ) {
            return Ok(false);
        }
        if let Some(found) = luks_remnant(header.unwrap_or(&self.device))? {
            return Err(LuksError::Usage(format!(
                "{dev} is not a valid LUKS device but carries LUKS remnants ({found}); \
                 refusing to map it as plain dm-crypt. Add 'plain' to the line if this \
                 is really a plain volume, or restore the LUKS header \
                 (cryptsetup luksHeaderRestore) and add 'luks'"
            )));
        }
        tracing::warn!(
            "crypttab line {} ({}): {dev} has no LUKS header, so it is mapped as plain \
             dm-crypt (no KDF, offset 0); add 'plain' to the line to say so, or 'luks' \
             to refuse this",
            self.line,
            self.name
        );
        Ok(true)
    }

    /// Unlock (asking for the passphrase if there is no key file) and
    /// build the crypt table this line stands for.
    pub fn table(
        &self,
        no_cost_limit: bool,
        allow_weak_cipher: bool,
    ) -> Result<Zeroizing<String>, LuksError> {
        let dev = self.device.display().to_string();
        let at = |e: LuksError| {
            LuksError::Usage(format!("crypttab line {} ({}): {e}", self.line, self.name))
        };
        if self.plain || (!self.luks && self.falls_back_to_plain(&dev).map_err(at)?) {
            let key = plain::plain_key(
                &self.plain_params,
                &self.key,
                &format!("Enter passphrase for {} ({dev}): ", self.name),
            )
            .map_err(at)?;
            let size = super::disk::Disk::open(&self.device, false)
                .and_then(|d| d.size())
                .map_err(at)?;
            return plain::table(
                &self.plain_params,
                &key,
                &crate::core::table::escape_arg(&dev),
                size,
            )
            .map_err(at);
        }
        let d = super::ops::Device {
            path: self.device.clone(),
            header: self.header.clone(),
            no_cost_limit,
            allow_weak_cipher,
        };
        let v = d.load(false, &super::feedback::Quiet).map_err(at)?;
        v.check_requirements().map_err(at)?;
        let u = super::ops::Unlock {
            key: self.key.clone(),
            slot: self.key_slot,
            tries: self.tries,
            unbound: false,
            token: Default::default(),
        };
        let (slot, key) = super::ops::unlock(
            &v,
            &u,
            &format!("Enter passphrase for {} ({dev}): ", self.name),
        )
        .map_err(at)?;
        let mut act = v.activation(key, slot).map_err(at)?;
        if act.integrity.is_some() {
            return Err(at(LuksError::Unsupported(
                "an authenticated LUKS2 volume (integrity) in --crypttab; serve it with \
                 --luks NAME=IMAGE or map it with `udm cryptsetup open`"
                    .into(),
            )));
        }
        if self.discard && !act.options.contains(&"allow_discards") {
            act.options.insert(0, "allow_discards");
        }
        Ok(act.table(&crate::core::table::escape_arg(&dev)))
    }
}

/// What on `path` still looks like LUKS after the header failed to load:
/// a LUKS1/LUKS2 magic at a header copy's offset, a LUKS2 JSON area
/// behind one, or a LUKS1 header with only its magic wiped. None when the
/// device shows none of these.
fn luks_remnant(path: &Path) -> Result<Option<String>, LuksError> {
    let disk = super::disk::Disk::open(path, false)?;
    let size = disk.size()?;
    let mut buf = vec![0u8; 4096 + 16];
    // The first copy at 0, the second after a header of any size
    // cryptsetup writes (16 KiB to 4 MiB).
    for off in std::iter::once(0).chain(super::luks2::HDR_SIZES) {
        if off + buf.len() as u64 > size {
            break;
        }
        disk.read_at(off, &mut buf)?;
        if buf[..6] == super::luks2::MAGIC_PRIMARY || buf[..6] == super::luks2::MAGIC_SECONDARY {
            return Ok(Some(format!("a LUKS magic at byte {off}")));
        }
        if buf[4096..].starts_with(b"{\"keyslots\"") || buf[4096..].starts_with(b"{\"config\"") {
            return Ok(Some(format!("LUKS2 metadata at byte {}", off + 4096)));
        }
        if off == 0 && looks_like_luks1(&buf) {
            return Ok(Some(
                "a LUKS1 header without its magic at byte 0".to_string(),
            ));
        }
    }
    Ok(None)
}

/// A LUKS1 header whose magic is gone: version 1, and printable cipher
/// and hash names where LUKS1 keeps them.
fn looks_like_luks1(b: &[u8]) -> bool {
    let name = |r: std::ops::Range<usize>| {
        let f = &b[r];
        let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
        end > 0 && f[end..].iter().all(|&c| c == 0) && f[..end].iter().all(|c| c.is_ascii_graphic())
    };
    b[6..8] == [0, 1] && name(8..40) && name(40..72) && name(72..104)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_options_and_errors() {
        let p = Path::new("/etc/crypttab");
        let t = "# comment\n\nhome /dev/x /k luks,discard,key-slot=1,tries=1,noauto,x-systemd.device-timeout=10\n\
                 swap /dev/y /dev/urandom plain,cipher=aes-xts-plain64,size=512,hash=sha512,offset=8,skip=16,sector-size=4096,no-read-workqueue,readonly\n\
                 ask /dev/z none\n";
        let e = parse(t, p).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(
            (e[0].line, e[0].key_slot, e[0].tries, e[0].discard),
            (3, Some(1), 1, true)
        );
        assert!(!e[0].plain);
        assert_eq!(e[0].notes.len(), 2);
        let s = &e[1].plain_params;
        assert!(e[1].plain && e[1].read_only);
        assert_eq!(
            (s.key_bytes, s.offset, s.skip, s.sector_size),
            (64, 8, 16, 4096)
        );
        assert_eq!(s.hash.as_deref(), Some("sha512"));
        assert!(e[2].key.key_file.is_none());
        let bad = parse("a /dev/x none luks,frobnicate\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("/etc/crypttab:1") && bad.contains("frobnicate"),
            "{bad}"
        );
        assert!(parse("a\n", p).unwrap_err().to_string().contains(":1:"));
        assert!(parse("a /x - luks,plain\n", p).is_err());
        assert!(parse("a /x - size=13\n", p).is_err());
        assert!(parse("a /x\na /y\n", p)
            .unwrap_err()
            .to_string()
            .contains(":2:"));
    }
}
