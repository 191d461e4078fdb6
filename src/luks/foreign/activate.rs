//! The devices cryptsetup creates for a volume of another system, as
//! tables: one place for `udm cryptsetup open --type tcrypt|bitlk|fvault2`
//! (which sends them to a running server) and for `udm serve` and its
//! crypttab lines (which build them at start), so that a volume maps the
//! same whichever way it is opened.
//!
//! The table builders take an unlocked header and give the device chain,
//! lowest device first (the order it must be created in); the `open_*`
//! functions also read the header and the secret, for callers that have
//! no terminal dialogue of their own.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::bitlk;
use super::bitlk_partial;
use super::fvault2;
use super::partition;
use super::tcrypt::{self, Header, Params};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::passphrase::KeySource;

/// One device of a volume's chain.
pub struct Layer {
    pub name: String,
    /// The table, holding the key in hex: zeroized on drop.
    pub table: Zeroizing<String>,
    /// The device UUID cryptsetup gives it (`status` and `close` read
    /// the volume type from it).
    pub uuid: String,
    /// The device must be read-only (a partly encrypted BitLocker volume,
    /// whose chunk map udm does not keep current).
    pub read_only: bool,
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer")
            .field("name", &self.name)
            .field("uuid", &self.uuid)
            .finish_non_exhaustive()
    }
}

/// `NAME` for the outermost cipher of a chain, `NAME_i` for the others.
pub fn layer_name(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_string()
    } else {
        format!("{name}_{i}")
    }
}

/// The dm-crypt optional arguments, `sector_size:N` added when the
/// volume's sectors are not 512 bytes (with `large` also
/// `iv_large_sectors`, as BitLocker counts IVs in its own sectors).
fn opt_tail(flags: &[&str], sector_size: u32, large: bool) -> String {
    let mut opts: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    if sector_size != 512 {
        opts.push(format!("sector_size:{sector_size}"));
        if large {
            opts.push("iv_large_sectors".into());
        }
    }
    if opts.is_empty() {
        String::new()
    } else {
        format!(" {} {}", opts.len(), opts.join(" "))
    }
}

/// Where a TCRYPT volume's data is: the device (a system volume's may
/// be a partition found on the drive), and offset, IV offset and length
/// in 512-byte sectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcryptGeometry {
    pub dev: PathBuf,
    pub offset: u64,
    pub iv: u64,
    pub size: u64,
}

/// The device a header is read from: a system volume's header is in its
/// drive's boot track, so for a partition that is the drive.
pub fn tcrypt_header_device(meta: &Path, p: &Params) -> PathBuf {
    match partition::of(meta) {
        Some(part) if p.system => part.disk,
        _ => meta.to_path_buf(),
    }
}

/// The data's place, with cryptsetup's guesses for system volumes, whose
/// header sits outside the encrypted partition and whose IVs count from
/// the drive's start (`TCRYPT_activate`'s order: the data or header device
/// is a partition; a partition of the drive matches the header; the
/// header is on the data device; else `data` is a copy of the partition).
/// The second value is cryptsetup's warning when it has to guess.
pub fn tcrypt_geometry(
    hdr: &Header,
    p: &Params,
    meta: &Path,
    meta_size: u64,
    data: &Path,
) -> Result<(TcryptGeometry, Option<&'static str>), LuksError> {
    let mut g = TcryptGeometry {
        dev: data.to_path_buf(),
        offset: hdr.data_offset(p, meta_size),
        iv: hdr.iv_offset(p, meta_size),
        size: hdr.size_sectors(p),
    };
    let mut note = None;
    if p.system {
        let area = hdr.volume_size / 512;
        if let Some(part) = partition::of(data).or_else(|| partition::of(meta)) {
            (g.offset, g.iv) = (0, part.start);
        } else if let Some(dev) =
            partition::find(data, g.iv, area).or_else(|| partition::find(meta, g.iv, area))
        {
            (g.dev, g.offset) = (dev, 0);
        } else if meta == data {
            note = Some(
                "Cannot determine TCRYPT system partition offset, activating whole encrypted area.",
            );
            g.size = area;
        } else {
            note = Some("Cannot determine TCRYPT system partition offset, activating device as a system partition.");
            g.offset = 0;
        }
    }
    let data_sectors = sectors_of(&g.dev)?;
    if g.size == 0 {
        g.size = data_sectors.saturating_sub(g.offset);
    }
    if g.offset
        .checked_add(g.size)
        .is_none_or(|end| end > data_sectors)
        || g.size == 0
    {
        // cryptsetup's words and exit code (1: its -EINVAL); a Device
        // error would wrap the sentence in another one.
        return Err(LuksError::Usage(format!(
            "Device {} is too small.",
            g.dev.display()
        )));
    }
    Ok((g, note))
}

/// The first line of cryptsetup's refusal of a legacy chain (its
/// `TCRYPT_activate`, exit code 1), which scripts grep for.
pub const TCRYPT_LEGACY_REFUSAL: &str =
    "Kernel does not support activation for this TCRYPT legacy mode.";

/// Why a TCRYPT volume is not mapped, if it is not: cryptsetup's reasons
/// in its order (the sector size, then a legacy `-tcrypt` chain), the
/// legacy one followed by udm's way out unless `p.map_legacy` takes it.
/// cryptsetup refuses only at activation, after the header was found, so
/// `--test-passphrase` and `tcryptDump` still work on such a volume.
pub fn tcrypt_refusal(hdr: &Header, p: &Params) -> Option<String> {
    if let Some(why) = hdr.activation_refusal() {
        return Some(why);
    }
    if !hdr.legacy_mode() || p.map_legacy {
        return None;
    }
    Some(format!(
        "{TCRYPT_LEGACY_REFUSAL}\nudm can map it read-write with its own {}-{} crypt line \
         (a table the kernel cannot load): add --allow-tcrypt-legacy (to cryptsetup open, \
         or to serve with --tcrypt), or tcrypt-legacy to its crypttab line.",
        hdr.cipher(),
        hdr.mode()
    ))
}

/// Every layer's spec must be one udm can run, checked before anything
/// is created; the error is cryptsetup's message for a kernel without
/// the mode, after the reason.
pub fn tcrypt_check_ciphers(hdr: &Header) -> Result<(), String> {
    for (_, spec, key) in hdr.layers() {
        if let Err(e) = crate::crypto::SectorCrypt::new(&spec, &key, 512, false) {
            return Err(format!(
                "udm cannot map {spec}: {e}\nKernel does not support TCRYPT compatible mapping."
            ));
        }
    }
    Ok(())
}

/// The chain cryptsetup stacks for a TCRYPT volume `name` on `dev` (a
/// table word): `NAME_2` on the disk, `NAME_1` on it, `NAME` on top, one
/// cipher each; returned lowest first.
pub fn tcrypt_layers(
    hdr: &Header,
    name: &str,
    dev: &str,
    g: &TcryptGeometry,
    flags: &[&str],
) -> Vec<Layer> {
    let layers = hdr.layers();
    let last = layers.len().saturating_sub(1);
    let tail = opt_tail(flags, hdr.sector_size, false);
    let mut out = Vec::with_capacity(layers.len());
    for (i, spec, key) in layers.iter().rev() {
        let dev_name = layer_name(name, *i);
        let (under, off) = if *i == last {
            (dev.to_string(), g.offset)
        } else {
            (format!("@{}", layer_name(name, i + 1)), 0)
        };
        let mut t = Zeroizing::new(format!("0 {} crypt {spec} ", g.size));
        t.push_str(&Zeroizing::new(hex::encode(key)));
        t.push_str(&format!(" {} {under} {off}{tail}", g.iv));
        let uuid = if *i == 0 {
            format!("CRYPT-TCRYPT-{name}")
        } else {
            format!("CRYPT-SUBDEV-TCRYPT-{dev_name}")
        };
        out.push(Layer {
            name: dev_name,
            table: t,
            uuid,
            read_only: false,
        });
    }
    out
}

/// Whether udm can run the volume's BitLocker mode with this key; the
/// error is cryptsetup's message for a kernel without it, after the
/// reason.
pub fn bitlk_check_cipher(m: &bitlk::Metadata, key: &[u8]) -> Result<(), String> {
    let spec = format!("aes-{}", m.cipher_mode);
    match crate::crypto::SectorCrypt::new(&spec, key, m.sector_size, m.sector_size != 512) {
        Ok(_) => Ok(()),
        Err(e) => {
            let what = if m.cipher_mode.contains("elephant") {
                "BITLK Elephant diffuser"
            } else {
                "BITLK IV"
            };
            Err(format!(
                "udm cannot map {spec}: {e}\nCannot activate device, kernel dm-crypt is missing \
                 support for {what}."
            ))
        }
    }
}

/// Why cryptsetup would not map a BitLocker volume, if it would not:
/// its message, then how udm could map it anyway (not for a volume of
/// unknown type, whose layout no one knows).
pub fn bitlk_refusal(m: &bitlk::Metadata) -> Option<String> {
    let why = m.activation_refusal()?;
    if m.kind == 2 {
        return Some(why.to_string());
    }
    Some(format!(
        "{why}\nudm can map it read-only as its metadata describes it (crypt where it \
         is encrypted, linear where it is still in the clear): add --allow-partial-bitlk \
         (to cryptsetup open, or to serve with --bitlk), or bitlk-partial to its crypttab line."
    ))
}

/// The segments of a BitLocker volume on `disk` of `sectors`: cryptsetup's
/// layout, or, for a volume cryptsetup refuses and with `allow_partial`,
/// the one its map of encrypted parts gives (then the second value is
/// true: the device must be read-only). The error names the refusal.
pub fn bitlk_segments(
    m: &bitlk::Metadata,
    disk: &Disk,
    sectors: u64,
    allow_partial: bool,
) -> Result<(bitlk::Segments, bool), LuksError> {
    match (bitlk_refusal(m), allow_partial) {
        (None, _) => Ok((m.segments(sectors)?, false)),
        (Some(why), false) => Err(LuksError::Unsupported(why)),
        (Some(_), true) => Ok((bitlk_partial::layout(m, disk, sectors)?, true)),
    }
}

/// The device cryptsetup creates for a BitLocker volume `name` over `dev`
/// (a table word) from its segments: crypt where it is encrypted, zero
/// over the metadata, and (partly encrypted volumes only) linear where it
/// is in the clear. A partly encrypted volume's layer must then be made
/// read-only by the caller, which knows how the segments were found.
pub fn bitlk_layer(
    m: &bitlk::Metadata,
    key: &[u8],
    name: &str,
    dev: &str,
    segs: &[(u64, u64, bitlk::Seg)],
    flags: &[&str],
) -> Layer {
    let spec = format!("aes-{}", m.cipher_mode);
    let tail = opt_tail(flags, m.sector_size, true);
    let hex_key = Zeroizing::new(hex::encode(key));
    let mut t = Zeroizing::new(String::new());
    for &(start, len, seg) in segs {
        match seg {
            bitlk::Seg::Zero => t.push_str(&format!("{start} {len} zero\n")),
            bitlk::Seg::Clear(at) => t.push_str(&format!("{start} {len} linear {dev} {at}\n")),
            bitlk::Seg::Crypt(iv) => {
                t.push_str(&format!("{start} {len} crypt {spec} "));
                t.push_str(&hex_key);
                t.push_str(&format!(" {iv} {dev} {iv}{tail}\n"));
            }
        }
    }
    Layer {
        name: name.to_string(),
        table: t,
        uuid: format!("CRYPT-BITLK-{}-{name}", m.guid.replace('-', "")),
        read_only: false,
    }
}

/// The one crypt line cryptsetup loads for a FileVault2 volume: the
/// logical volume, AES-XTS with sector numbers from its start.
pub fn fvault2_layer(
    m: &fvault2::Metadata,
    key: &[u8],
    name: &str,
    dev: &str,
    disk_sectors: u64,
    flags: &[&str],
    data: &str,
) -> Result<Layer, LuksError> {
    let (off, len) = (m.log_vol_off / 512, m.log_vol_size / 512);
    if off.saturating_add(len) > disk_sectors {
        return Err(LuksError::Usage(format!("Device {data} is too small.")));
    }
    let tail = opt_tail(flags, 512, false);
    let mut t = Zeroizing::new(format!("0 {len} crypt aes-xts-plain64 "));
    t.push_str(&Zeroizing::new(hex::encode(key)));
    t.push_str(&format!(" 0 {dev} {off}{tail}\n"));
    Ok(Layer {
        name: name.to_string(),
        table: t,
        uuid: format!("CRYPT-FVAULT2-{}-{name}", m.family_uuid.replace('-', "")),
        read_only: false,
    })
}

/// What `udm serve` and a crypttab line know of a volume to open.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The volume's name (its top device).
    pub name: &'a str,
    /// The data device (and header, unless `header` is given).
    pub device: &'a Path,
    /// A detached header (TCRYPT only).
    pub header: Option<&'a Path>,
    /// Where the passphrase (or recovery password, or startup key)
    /// comes from.
    pub key: &'a KeySource,
    /// Times to ask on a terminal before giving up.
    pub tries: u32,
    /// dm-crypt flags for every table (`allow_discards`, ...).
    pub flags: &'a [&'static str],
    /// `--no-kdf-limit`: try the secret whatever KDF work the header
    /// asks for.
    pub no_cost_limit: bool,
}

impl Request<'_> {
    fn dev_word(&self) -> String {
        crate::core::table::escape_arg(&self.device.display().to_string()).to_string()
    }

    fn prompt(&self) -> String {
        format!(
            "Enter passphrase for {} ({}): ",
            self.name,
            self.device.display()
        )
    }

    /// Read a secret and try it, again on a terminal while it is wrong
    /// (`tries` times); `first_line`: a key file gives its first line
    /// (systemd's rule for TrueCrypt, whose passphrases hold no newline).
    fn with_secret<T>(
        &self,
        first_line: bool,
        try_one: impl Fn(&[u8]) -> Result<T, LuksError>,
    ) -> Result<T, LuksError> {
        let tries = if self.key.interactive() {
            self.tries.max(1)
        } else {
            1
        };
        let mut last = LuksError::WrongPassphrase;
        for _ in 0..tries {
            let pass = self.key.read(&self.prompt(), false)?;
            let mut s: &[u8] = &pass;
            if first_line {
                s = &s[..s.iter().position(|&b| b == b'\n').unwrap_or(s.len())];
            }
            match try_one(s) {
                Err(LuksError::WrongPassphrase) => last = LuksError::WrongPassphrase,
                other => return other,
            }
        }
        Err(last)
    }
}

fn sectors_of(p: &Path) -> Result<u64, LuksError> {
    Ok(Disk::open(p, false)?.size()? / 512)
}

/// Unlock a TrueCrypt/VeraCrypt volume and give its device chain, lowest
/// first. A passphrase that finds no header is `WrongPassphrase`.
pub fn open_tcrypt(r: &Request, p: &Params) -> Result<Vec<Layer>, LuksError> {
    let lifted;
    let p = if r.no_cost_limit && !p.no_cost_limit {
        lifted = Params {
            no_cost_limit: true,
            ..p.clone()
        };
        &lifted
    } else {
        p
    };
    let meta = r.header.unwrap_or(r.device);
    let disk = Disk::open(&tcrypt_header_device(meta, p), false)?;
    let hdr = r.with_secret(true, |pass| tcrypt::load(&disk, pass, p))?;
    if let Some(why) = tcrypt_refusal(&hdr, p) {
        return Err(LuksError::Usage(why));
    }
    tcrypt_check_ciphers(&hdr).map_err(LuksError::Usage)?;
    let (g, note) = tcrypt_geometry(&hdr, p, meta, disk.size()?, r.device)?;
    if let Some(n) = note {
        tracing::warn!("TCRYPT volume {}: {n}", r.name);
    }
    let dev = crate::core::table::escape_arg(&g.dev.display().to_string()).to_string();
    Ok(tcrypt_layers(&hdr, r.name, &dev, &g, r.flags))
}

/// Unlock a BitLocker volume (through its clear key if it has one, else
/// with the passphrase, recovery password or startup key file) and give
/// its device, as cryptsetup maps it.
pub fn open_bitlk(r: &Request) -> Result<Vec<Layer>, LuksError> {
    open_bitlk_with(r, false)
}

/// [`open_bitlk`], where a volume cryptsetup refuses is mapped with
/// `allow_partial` (read-only, see `bitlk_partial`).
pub fn open_bitlk_with(r: &Request, allow_partial: bool) -> Result<Vec<Layer>, LuksError> {
    let disk = Disk::open(r.device, false)?;
    let mut m = bitlk::read(&disk)?;
    if r.no_cost_limit {
        m.cost_limit = None;
    }
    if let (Some(why), false) = (bitlk_refusal(&m), allow_partial) {
        // cryptsetup refuses before it asks for the secret.
        return Err(LuksError::Usage(why));
    }
    let key = match m.volume_key(None) {
        Err(LuksError::WrongPassphrase) => {
            m.check_cost()?;
            r.with_secret(false, |s| m.volume_key(Some(s)))?
        }
        other => other?,
    };
    let size = disk.size()?;
    if size != m.volume_size {
        tracing::warn!(
            "BitLocker volume {}: volume size {} does not match the underlying device size {size}",
            r.name,
            m.volume_size
        );
    }
    bitlk_check_cipher(&m, &key).map_err(LuksError::Usage)?;
    let (segs, partly) =
        bitlk_segments(&m, &disk, size / 512, allow_partial).map_err(|e| match e {
            LuksError::Unsupported(why) => LuksError::Usage(why),
            e => e,
        })?;
    let mut l = bitlk_layer(&m, &key, r.name, &r.dev_word(), &segs, r.flags);
    l.read_only = partly;
    Ok(vec![l])
}

/// Unlock a FileVault2 volume and give its device.
pub fn open_fvault2(r: &Request) -> Result<Vec<Layer>, LuksError> {
    let disk = Disk::open(r.device, false)?;
    let mut m = fvault2::read(&disk)?;
    if r.no_cost_limit {
        m.cost_limit = None;
    }
    m.check_cost()?;
    let key = r.with_secret(false, |pass| m.volume_key(pass))?;
    let l = fvault2_layer(
        &m,
        &key[..],
        r.name,
        &r.dev_word(),
        disk.size()? / 512,
        r.flags,
        &r.device.display().to_string(),
    )?;
    Ok(vec![l])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_and_option_tails() {
        assert_eq!(layer_name("v", 0), "v");
        assert_eq!(layer_name("v", 2), "v_2");
        assert_eq!(opt_tail(&[], 512, true), "");
        assert_eq!(
            opt_tail(&["allow_discards"], 512, false),
            " 1 allow_discards"
        );
        assert_eq!(
            opt_tail(&[], 4096, true),
            " 2 sector_size:4096 iv_large_sectors"
        );
        assert_eq!(opt_tail(&[], 4096, false), " 1 sector_size:4096");
    }

    #[test]
    fn a_layer_debug_print_shows_no_table() {
        let l = Layer {
            name: "v".into(),
            table: Zeroizing::new("0 8 crypt aes-xts-plain64 00112233 0 /x 0".into()),
            uuid: "CRYPT-TCRYPT-v".into(),
            read_only: false,
        };
        let s = format!("{l:?}");
        assert!(
            s.contains("CRYPT-TCRYPT-v") && !s.contains("00112233"),
            "{s}"
        );
    }
}
