//! cryptsetup's verbs for volumes of other systems: `tcryptDump` and
//! `open --type tcrypt` (`tcryptOpen`), `close` of what they created.
//! The formats are read by `luks::foreign`; this file maps argv, asks for
//! the passphrase as cryptsetup does, and creates the devices on a
//! running server, one per cipher of a chain as cryptsetup stacks them
//! (`NAME_2` on the disk, `NAME_1` on it, `NAME` on top).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::active::{call, flags, req};
use super::ctx::{ui, Ctx, Outcome};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::foreign::partition;
use crate::luks::foreign::tcrypt::{self, Header, Params};
use crate::luks::passphrase::KeySource;
use crate::luks::secret::SecretText;
use zeroize::Zeroizing;

/// Whether `open` is for a type this file handles.
pub(super) fn handles_open(c: &Ctx) -> bool {
    c.device_type.as_deref() == Some("tcrypt")
}

fn params(c: &Ctx) -> Params {
    Params {
        hash: c.a.str("hash").map(str::to_string),
        cipher: c.a.str("cipher").map(str::to_string),
        veracrypt: !c.a.has("disable-veracrypt"),
        pim: c.a.u32("veracrypt-pim").unwrap_or(0),
        hidden: c.a.has("tcrypt-hidden"),
        system: c.a.has("tcrypt-system"),
        backup: c.a.has("tcrypt-backup"),
        keyfiles: c.a.key_file_list.iter().map(PathBuf::from).collect(),
        legacy: true,
    }
}

fn stdin_source(c: &Ctx) -> KeySource {
    KeySource {
        timeout: c
            .a
            .u32("timeout")
            .filter(|&t| t > 0)
            .map(|t| Duration::from_secs(u64::from(t))),
        verify: c.a.has("verify-passphrase"),
        ..KeySource::default()
    }
}

/// `--veracrypt-query-pim`: the PIM asked after the passphrase.
fn query_pim(c: &Ctx) -> Result<u32, LuksError> {
    let raw = stdin_source(c).read("Enter VeraCrypt PIM: ", false)?;
    let text = std::str::from_utf8(&raw).unwrap_or("");
    let n: u64 = text
        .parse()
        .map_err(|_| LuksError::Usage("Invalid PIM value: parse error.".into()))?;
    match n {
        0 => Err(LuksError::Usage("Invalid PIM value: 0.".into())),
        n => u32::try_from(n)
            .map_err(|_| LuksError::Usage("Invalid PIM value: outside of range.".into())),
    }
}

/// A decrypted header with what it came from.
struct Loaded {
    hdr: Header,
    p: Params,
    meta: PathBuf,
    meta_size: u64,
}

/// cryptsetup's `tcrypt_load`: read the passphrase (from the terminal,
/// `--tries` times, or one line of standard input) and search the header.
fn load(c: &Ctx) -> Result<Loaded, LuksError> {
    let meta = PathBuf::from(c.a.str("header").unwrap_or(&c.argv[0]));
    let mut p = params(c);
    // A system volume's header is in its drive's boot track.
    let from = match partition::of(&meta) {
        Some(part) if p.system => part.disk,
        _ => meta.clone(),
    };
    let disk = Disk::open(&from, false)?;
    let src = stdin_source(c);
    let tries = if src.interactive() {
        c.a.u32("tries").unwrap_or(3).max(1)
    } else {
        1
    };
    let prompt = format!("Enter passphrase for {}: ", c.argv[0]);
    let mut last = LuksError::WrongPassphrase;
    for _ in 0..tries {
        let pass = src.read(&prompt, false)?;
        if c.a.has("veracrypt-query-pim") {
            p.pim = query_pim(c)?;
        }
        match tcrypt::load(&disk, &pass, &p) {
            Ok(hdr) => {
                let meta_size = disk.size()?;
                return Ok(Loaded {
                    hdr,
                    p,
                    meta,
                    meta_size,
                });
            }
            Err(LuksError::WrongPassphrase) => {
                eprintln!("No device header detected with this passphrase.");
                last = LuksError::Silent(2);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// `tcryptDump [--dump-volume-key]`.
pub(super) fn tcrypt_dump(c: &Ctx) -> Outcome {
    let l = load(c)?;
    if !c.a.has("dump-volume-key") {
        print!("{}", l.hdr.dump_text(&l.meta.display().to_string()));
        return Ok(());
    }
    use crate::luks::feedback::Feedback;
    if !ui(c).confirm(
        "Header dump with volume key is sensitive information\nwhich allows access to encrypted partition without passphrase.\nThis dump should be always stored encrypted on safe place.",
    )? {
        return Err(LuksError::Denied("Operation aborted.".into()));
    }
    let key = l.hdr.volume_key();
    let mut t = SecretText::with_capacity(1024 + key.len() * 4);
    let text = (|| -> std::fmt::Result {
        use std::fmt::Write;
        write!(
            t,
            "TCRYPT header information for {}\nCipher chain:  \t{}\nCipher mode:   \t{}\n\
             Payload offset:\t{}\nMK bits:       \t{}\nMK dump:\t",
            c.argv[0],
            l.hdr.cipher(),
            l.hdr.mode(),
            l.hdr.data_offset(&l.p, l.meta_size),
            key.len() * 8
        )?;
        t.hex(&key, " ", 16, "\t\t")?;
        t.write_str("\n")
    })();
    text.map_err(|_| LuksError::Usage("volume key dump does not fit its buffer".into()))?;
    print!("{}", t.as_str());
    Ok(())
}

/// Where a volume's data is: the device, its offset, the IV offset and
/// the length, in 512-byte sectors.
struct Place {
    dev: PathBuf,
    offset: u64,
    iv: u64,
    size: u64,
}

/// The data's place on `data`, with cryptsetup's guesses for system
/// volumes, whose header sits outside the encrypted partition and whose
/// IVs count from the drive's start (`TCRYPT_activate`'s order: the data
/// or header device is a partition; a partition of the drive matches the
/// header; the header is on the data device; else `data` is taken to be
/// a copy of the partition).
fn geometry(l: &Loaded, data: &Path) -> Result<Place, LuksError> {
    let mut at = Place {
        dev: data.to_path_buf(),
        offset: l.hdr.data_offset(&l.p, l.meta_size),
        iv: l.hdr.iv_offset(&l.p, l.meta_size),
        size: l.hdr.size_sectors(&l.p),
    };
    if l.p.system {
        let area = l.hdr.volume_size / 512;
        if let Some(part) = partition::of(data).or_else(|| partition::of(&l.meta)) {
            (at.offset, at.iv) = (0, part.start);
        } else if let Some(dev) =
            partition::find(data, at.iv, area).or_else(|| partition::find(&l.meta, at.iv, area))
        {
            (at.dev, at.offset) = (dev, 0);
        } else if l.meta == data {
            eprintln!(
                "Cannot determine TCRYPT system partition offset, activating whole encrypted area."
            );
            at.size = area;
        } else {
            eprintln!("Cannot determine TCRYPT system partition offset, activating device as a system partition.");
            at.offset = 0;
        }
    }
    let data_sectors = Disk::open(&at.dev, false)?.size()? / 512;
    if at.size == 0 {
        at.size = data_sectors.saturating_sub(at.offset);
    }
    if at
        .offset
        .checked_add(at.size)
        .is_none_or(|end| end > data_sectors)
        || at.size == 0
    {
        return Err(LuksError::Device(format!(
            "Device {} is too small.",
            at.dev.display()
        )));
    }
    Ok(at)
}

/// What every layer of a chain shares: IV offset, length and sector size.
struct Span {
    iv: u64,
    size: u64,
    sector_size: u32,
}

/// The crypt table of one layer, over `dev` from sector `offset`.
fn layer_table(
    c: &Ctx,
    spec: &str,
    key: &[u8],
    span: &Span,
    dev: &str,
    offset: u64,
) -> Zeroizing<String> {
    let mut opts: Vec<String> = flags(c).iter().map(|f| f.to_string()).collect();
    if span.sector_size != 512 {
        opts.push(format!("sector_size:{}", span.sector_size));
    }
    let mut t = Zeroizing::new(format!("0 {} crypt {spec} ", span.size));
    t.push_str(&Zeroizing::new(hex::encode(key)));
    t.push_str(&format!(" {} {dev} {offset}", span.iv));
    if !opts.is_empty() {
        t.push_str(&format!(" {} {}", opts.len(), opts.join(" ")));
    }
    t
}

fn layer_name(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_string()
    } else {
        format!("{name}_{i}")
    }
}

/// Every layer's spec must be one udm can run, checked before anything
/// is created; cryptsetup's message for a kernel without the mode.
fn check_ciphers(hdr: &Header) -> Outcome {
    for (_, spec, key) in hdr.layers() {
        if let Err(e) = crate::crypto::SectorCrypt::new(&spec, &key, 512, false) {
            eprintln!("udm cannot map {spec}: {e}");
            eprintln!("Kernel does not support TCRYPT compatible mapping.");
            return Err(LuksError::Silent(1));
        }
    }
    Ok(())
}

/// `open --type tcrypt DEVICE NAME` (and `--test-passphrase`).
pub(super) fn open(c: &Ctx) -> Outcome {
    let l = load(c)?;
    if c.a.has("test-passphrase") {
        return Ok(());
    }
    if let Some(why) = l.hdr.activation_refusal() {
        eprintln!("{why}");
        return Err(LuksError::Silent(1));
    }
    check_ciphers(&l.hdr)?;
    let name = c
        .argv
        .get(1)
        .ok_or_else(|| LuksError::Usage("Argument <name> missing.".into()))?;
    let at = geometry(&l, Path::new(&c.argv[0]))?;
    let span = Span {
        iv: at.iv,
        size: at.size,
        sector_size: l.hdr.sector_size,
    };
    let layers = l.hdr.layers();
    let last = layers.len() - 1;
    let mut created: Vec<String> = Vec::new();
    for (i, spec, key) in layers.iter().rev() {
        let dev_name = layer_name(name, *i);
        let (dev, off) = if *i == last {
            (super::ctx::table_dev(&at.dev.to_string_lossy()), at.offset)
        } else {
            (format!("@{}", layer_name(name, i + 1)), 0)
        };
        let table = layer_table(c, spec, key, &span, &dev, off);
        let mut r = req("create", &dev_name);
        r.has_table = true;
        r.readonly = c.a.has("readonly");
        r.allow = c.a.str("allow").map(str::to_string);
        r.uuid = Some(if *i == 0 {
            format!("CRYPT-TCRYPT-{name}")
        } else {
            format!("CRYPT-SUBDEV-TCRYPT-{dev_name}")
        });
        if let Err(e) = call(c, &dev_name, r, table.as_bytes()) {
            for d in created.iter().rev() {
                let _ = call(c, d, req("remove", d), &[]);
            }
            return Err(e);
        }
        created.push(dev_name);
    }
    Ok(())
}

/// `close NAME`: NAME, then the layers cryptsetup put under it.
pub(super) fn close(c: &Ctx) -> Outcome {
    let name = c.argv[0].clone();
    let uuid = call(c, &name, req("info", &name), &[])
        .ok()
        .and_then(|(v, _)| v["devices"][0]["uuid"].as_str().map(str::to_string));
    super::active::close(c)?;
    if uuid.is_some_and(|u| u.starts_with("CRYPT-TCRYPT-")) {
        for i in 1..=2 {
            let sub = layer_name(&name, i);
            let sub_uuid = call(c, &sub, req("info", &sub), &[])
                .ok()
                .and_then(|(v, _)| v["devices"][0]["uuid"].as_str().map(str::to_string));
            if sub_uuid.as_deref() == Some(&format!("CRYPT-SUBDEV-TCRYPT-{sub}")) {
                super::active::remove(c, &sub, false)?;
            }
        }
    }
    Ok(())
}
