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
//!
//! Volumes of other systems take systemd's options for them: `tcrypt`
//! (with `tcrypt-hidden`, `tcrypt-system`, `tcrypt-veracrypt`,
//! `veracrypt-pim=`, `tcrypt-keyfile=`) and `bitlk`, and two of udm's in
//! their style for volumes cryptsetup refuses: `tcrypt-legacy`
//! (`--allow-tcrypt-legacy`: TrueCrypt's legacy CBC chains) and
//! `bitlk-partial` (`--allow-partial-bitlk`: a partly encrypted BitLocker
//! volume, served read-only). systemd warns about options it does not know
//! and ignores them, so on a systemd host such a line is refused by
//! cryptsetup instead. systemd has no
//! FileVault2 option, so neither has udm's crypttab (`udm serve --fvault2`
//! serves one). A TrueCrypt line's key file gives its first line as the
//! passphrase, as systemd reads it; a BitLocker line's key file is a
//! passphrase, recovery password or `.BEK` startup key, read whole. On a
//! TrueCrypt line `hash=` narrows the KDF search as cryptsetup's `--hash`
//! does (systemd ignores it there; each KDF tried costs a derivation).

use super::error::LuksError;
use super::foreign::{activate, tcrypt};
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

/// One device a line maps to, lowest first in [`CryptEntry::devices`].
pub struct LineDevice {
    pub name: String,
    /// The table, holding the key: zeroized on drop.
    pub table: Zeroizing<String>,
    /// Read-only whatever the line says (a partly encrypted BitLocker
    /// volume, whose map of encrypted parts udm does not keep current).
    pub read_only: bool,
}

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
    /// `tcrypt` (or one of its options): a TrueCrypt/VeraCrypt volume
    /// with these search options.
    pub tcrypt: Option<tcrypt::Params>,
    /// `bitlk`: a BitLocker volume.
    pub bitlk: bool,
    /// `bitlk-partial`: a BitLocker volume that cryptsetup refuses (partly
    /// encrypted) is mapped read-only from its map of encrypted parts.
    pub bitlk_partial: bool,
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
            tcrypt: None,
            bitlk: false,
            bitlk_partial: false,
            header: None,
            key_slot: None,
            tries: 3,
            read_only: false,
            discard: false,
            notes: Vec::new(),
        };
        options(&mut e, f.get(3).copied().unwrap_or(""), path)?;
        if e.discard {
            e.plain_params.flags.push("allow_discards");
        }
        out.push(e);
    }
    Ok(out)
}

/// The OPTIONS field of line `e.line`: the volume's kind and what
/// changes its mapping go into `e`.
fn options(e: &mut CryptEntry, field: &str, path: &Path) -> Result<(), LuksError> {
    let line = e.line;
    let mut kind: Option<&str> = None;
    // systemd always lets TrueCrypt's legacy KDF and CBC chains be
    // found, and VeraCrypt's only with `tcrypt-veracrypt`.
    let mut tc = tcrypt::Params {
        legacy: true,
        ..tcrypt::Params::default()
    };
    // Options that only a LUKS or plain line can use, by name.
    let mut mapping_opts: Vec<&str> = Vec::new();
    for opt in field.split(',').filter(|o| !o.is_empty()) {
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let new_kind = match k {
            "luks" | "plain" | "bitlk" | "tcrypt" => Some(k),
            "tcrypt-hidden" | "tcrypthidden" => {
                tc.hidden = true;
                Some("tcrypt")
            }
            "tcrypt-system" => {
                tc.system = true;
                Some("tcrypt")
            }
            "tcrypt-veracrypt" | "veracrypt" => {
                tc.veracrypt = true;
                Some("tcrypt")
            }
            "tcrypt-legacy" => {
                tc.map_legacy = true;
                Some("tcrypt")
            }
            "bitlk-partial" => {
                e.bitlk_partial = true;
                Some("bitlk")
            }
            "veracrypt-pim" => {
                tc.pim = num(path, line, k, v)?;
                None
            }
            "tcrypt-keyfile" => match v {
                Some(file) if !file.is_empty() => {
                    tc.keyfiles.push(PathBuf::from(file));
                    None
                }
                _ => return Err(err(path, line, "tcrypt-keyfile= needs a file name")),
            },
            _ => {
                mapping_option(e, k, v, path)?;
                None
            }
        };
        if k == "hash" {
            tc.hash = v.map(str::to_string);
        }
        match (kind, new_kind) {
            (Some(x), Some(n)) if x != n => {
                return Err(err(
                    path,
                    line,
                    format!("options {x} and {n} exclude each other"),
                ))
            }
            (_, Some(n)) => kind = Some(n),
            _ => {}
        }
        if matches!(
            k,
            "cipher"
                | "size"
                | "hash"
                | "offset"
                | "skip"
                | "sector-size"
                | "key-slot"
                | "keyslot"
                | "header"
        ) {
            mapping_opts.push(k);
        }
    }
    e.plain = kind == Some("plain");
    e.luks = kind == Some("luks");
    e.bitlk = kind == Some("bitlk");
    foreign_options(e, kind, tc, &mapping_opts)
        .map_err(|m| err(path, line, format!("volume {}: {m}", e.name)))
}

/// One option that is not a kind: a mapping parameter, a key file
/// option, or one udm accepts without effect; anything else is refused.
fn mapping_option(
    e: &mut CryptEntry,
    k: &str,
    v: Option<&str>,
    path: &Path,
) -> Result<(), LuksError> {
    let line = e.line;
    match k {
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
    Ok(())
}

/// Check what a TrueCrypt or BitLocker line may not have, and keep the
/// TrueCrypt options on a TrueCrypt line.
fn foreign_options(
    e: &mut CryptEntry,
    kind: Option<&str>,
    tc: tcrypt::Params,
    mapping_opts: &[&str],
) -> Result<(), String> {
    if kind != Some("tcrypt") && (tc.pim != 0 || !tc.keyfiles.is_empty()) {
        return Err(
            "veracrypt-pim= and tcrypt-keyfile= belong to a TrueCrypt/VeraCrypt line: add \
             tcrypt (tcrypt-veracrypt for a PIM)"
                .into(),
        );
    }
    if kind == Some("tcrypt") && tc.pim != 0 && !tc.veracrypt {
        return Err("veracrypt-pim= is a VeraCrypt option: add tcrypt-veracrypt".into());
    }
    let misplaced = mapping_opts
        .iter()
        .find(|o| !(kind == Some("tcrypt") && matches!(**o, "header" | "hash")));
    if let (Some(k @ ("tcrypt" | "bitlk")), Some(o)) = (kind, misplaced) {
        // The header gives what these set; a header= of its own, and a
        // hash= to narrow the KDF search, only a TrueCrypt volume can have.
        return Err(format!(
            "option {o} does not apply to a {k} volume; remove it"
        ));
    }
    if kind == Some("tcrypt") {
        e.tcrypt = Some(tc);
    }
    Ok(())
}

impl CryptEntry {
    /// Unlock the volume (asking for the passphrase if there is no key
    /// file) and give the devices it maps to, lowest first, each a name
    /// and its table: one for LUKS, plain and BitLocker, one per cipher
    /// for a TrueCrypt cascade (`NAME_2`, `NAME_1`, `NAME`).
    pub fn devices(
        &self,
        no_cost_limit: bool,
        allow_weak_cipher: bool,
    ) -> Result<Vec<LineDevice>, LuksError> {
        if self.tcrypt.is_none() && !self.bitlk {
            let table = self.table(no_cost_limit, allow_weak_cipher)?;
            return Ok(vec![LineDevice {
                name: self.name.clone(),
                table,
                read_only: false,
            }]);
        }
        let flags: &[&'static str] = if self.discard {
            &["allow_discards"]
        } else {
            &[]
        };
        let r = activate::Request {
            name: &self.name,
            device: &self.device,
            header: self.header.as_deref(),
            key: &self.key,
            tries: self.tries,
            flags,
            no_cost_limit,
        };
        let layers = match &self.tcrypt {
            Some(p) => activate::open_tcrypt(&r, p),
            None => activate::open_bitlk_with(&r, self.bitlk_partial),
        }
        .map_err(|e| {
            let kind = if self.bitlk { "BITLK" } else { "TCRYPT" };
            LuksError::Usage(format!(
                "crypttab line {} ({}): {kind} volume on {}: {e}",
                self.line,
                self.name,
                self.device.display()
            ))
        })?;
        Ok(layers
            .into_iter()
            .map(|l| LineDevice {
                name: l.name,
                table: l.table,
                read_only: l.read_only,
            })
            .collect())
    }

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

    #[test]
    fn truecrypt_and_bitlocker_lines() {
        let p = Path::new("/etc/crypttab");
        let t = "tc /img/tc /k hash=sha256,tcrypt-veracrypt,veracrypt-pim=42,tcrypt-hidden,tcrypt-keyfile=/a,tcrypt-keyfile=/b,header=/h\n\
                 sys /img/sys none tcrypt-system,readonly\n\
                 bl /img/bl /r.BEK bitlk,discard,tries=1\n";
        let e = parse(t, p).unwrap();
        let tc = e[0].tcrypt.as_ref().unwrap();
        assert!(tc.veracrypt && tc.hidden && !tc.system && tc.legacy);
        assert_eq!((tc.pim, tc.hash.as_deref()), (42, Some("sha256")));
        assert_eq!(tc.keyfiles, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(e[0].header.as_deref(), Some(Path::new("/h")));
        assert!(!e[0].bitlk && !e[0].luks && !e[0].plain);
        let sys = e[1].tcrypt.as_ref().unwrap();
        assert!(sys.system && !sys.veracrypt && e[1].read_only);
        assert!(e[2].bitlk && e[2].tcrypt.is_none() && e[2].discard && e[2].tries == 1);
        assert!(!tc.map_legacy && !e[2].bitlk_partial);

        // udm's options for volumes cryptsetup refuses, each implying its
        // kind as systemd's tcrypt-* options do.
        let t = "old /img/old /k tcrypt-legacy,hash=sha1\npart /img/part /k bitlk-partial\n";
        let e = parse(t, p).unwrap();
        let old = e[0].tcrypt.as_ref().unwrap();
        assert!(old.map_legacy && old.legacy && !e[0].bitlk);
        assert!(e[1].bitlk && e[1].bitlk_partial && e[1].tcrypt.is_none());

        for (line, want) in [
            (
                "a /x - tcrypt,bitlk",
                "options tcrypt and bitlk exclude each other",
            ),
            (
                "a /x - luks,tcrypt-hidden",
                "options luks and tcrypt exclude each other",
            ),
            ("a /x - tcrypt,veracrypt-pim=5", "add tcrypt-veracrypt"),
            (
                "a /x - bitlk,tcrypt-legacy",
                "options bitlk and tcrypt exclude each other",
            ),
            (
                "a /x - luks,bitlk-partial",
                "options luks and bitlk exclude each other",
            ),
            (
                "a /x - luks,veracrypt-pim=5",
                "belong to a TrueCrypt/VeraCrypt line",
            ),
            (
                "a /x - bitlk,cipher=aes",
                "option cipher does not apply to a bitlk volume",
            ),
            (
                "a /x - bitlk,header=/h",
                "option header does not apply to a bitlk volume",
            ),
            (
                "a /x - tcrypt,offset=8",
                "option offset does not apply to a tcrypt volume",
            ),
            (
                "a /x - tcrypt,tcrypt-keyfile=",
                "tcrypt-keyfile= needs a file name",
            ),
            // systemd has no FileVault2 option: refused by name.
            (
                "a /x - fvault2",
                "unknown or unsupported option \"fvault2\"",
            ),
        ] {
            let got = parse(line, p).unwrap_err().to_string();
            assert!(got.contains(want) && got.contains(":1:"), "{line}: {got}");
        }
    }
}
