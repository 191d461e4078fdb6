//! `format` and `dump`: the superblock, journal and wipe written straight
//! to the device, and the superblock read back in integritysetup's words.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use zeroize::Zeroizing;

use super::args::Args;
use super::{Fail, Outcome};
use crate::core::BlockDevice;
use crate::store::OpenFlags;
use crate::targets::integrity::format::{self, Spec};
use crate::targets::integrity::layout::journal_sectors_of;
use crate::targets::integrity::params::AlgSpec;
use crate::targets::integrity::seal::Seal;
use crate::targets::integrity::superblock::{flags, Superblock, SALT_SIZE};
use crate::targets::integrity::tags::Alg;

/// An algorithm option in the kernel's spelling, as libcryptsetup turns
/// it: `MODE-NAME` is `MODE(NAME)` (`hmac-sha256` is `hmac(sha256)`,
/// `cbc-aes` is `cbc(aes)`) unless NAME starts with a digit
/// (`blake2b-256` stays). A name already in the kernel's spelling is
/// kept.
pub(super) fn kernel_spelling(name: &str) -> String {
    match name.split_once('-') {
        Some((mode, rest))
            if !name.contains('(') && !rest.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            format!("{mode}({rest})")
        }
        _ => name.to_string(),
    }
}

/// The kernel's name of an `--integrity` or `--journal-integrity`
/// algorithm, or `None` for `none`; one udm cannot compute is refused
/// here, by name.
pub(super) fn kernel_alg(name: &str) -> Result<Option<String>, Fail> {
    if name == "none" {
        return Ok(None);
    }
    let n = kernel_spelling(name);
    if !crate::targets::integrity::tags::is_known(&n) {
        return Err(Fail::usage(format!(
            "Integrity algorithm {name} is not supported: udm has {}.",
            crate::targets::integrity::tags::known_names()
        )));
    }
    Ok(Some(n))
}

/// `--integrity-key-file` (at most `--integrity-key-size` bits of it).
pub(super) fn key(a: &Args) -> Result<Option<Zeroizing<Vec<u8>>>, Fail> {
    key_of(a, "integrity")
}

/// The largest key integritysetup reads from a key file, in bytes.
const MAX_KEY_BYTES: u64 = 4096;

/// `--OPT-key-file`: its first `--OPT-key-size` bytes (integritysetup
/// counts key sizes in bytes), or the whole file without a size (udm's
/// leniency; integritysetup wants both).
fn key_of(a: &Args, opt: &str) -> Result<Option<Zeroizing<Vec<u8>>>, Fail> {
    let size = a.u64(&format!("{opt}-key-size"))?;
    if size.is_some_and(|n| n == 0 || n > MAX_KEY_BYTES) {
        return Err(Fail::usage(format!(
            "Invalid --{opt}-key-size size. Maximum is {MAX_KEY_BYTES} bytes."
        )));
    }
    let Some(path) = a.str(&format!("{opt}-key-file")) else {
        return Ok(None);
    };
    let mut k = Zeroizing::new(
        std::fs::read(path)
            .map_err(|e| Fail::new(4, format!("Cannot read keyfile {path}: {e}.")))?,
    );
    if let Some(n) = size {
        let n = n as usize;
        if n > k.len() {
            return Err(Fail::usage(format!(
                "Cannot read {n} bytes from keyfile {path}."
            )));
        }
        k.truncate(n);
    }
    if k.len() as u64 > MAX_KEY_BYTES {
        return Err(Fail::usage(format!(
            "Key file {path} holds more than {MAX_KEY_BYTES} bytes: give --{opt}-key-size."
        )));
    }
    Ok(Some(k))
}

/// The internal hash of `--integrity` with its key.
pub(super) fn alg(a: &Args) -> Result<Option<Alg>, Fail> {
    let Some(name) = kernel_alg(a.str("integrity").unwrap_or("crc32c"))? else {
        return Ok(None);
    };
    Alg::new(&name, key(a)?)
        .map(Some)
        .map_err(|e| Fail::usage(format!("{e}: give it with --integrity-key-file.")))
}

/// `--journal-crypt` and `--journal-integrity` with their key files, in
/// the table's spelling (`ctr-aes` is `ctr(aes)`, `hmac-sha256` is
/// `hmac(sha256)`).
pub(super) fn journal_algs(a: &Args) -> Result<(Option<AlgSpec>, Option<AlgSpec>), Fail> {
    let crypt = match a.str("journal-crypt") {
        None => None,
        Some(n) => {
            let name = kernel_spelling(n);
            let key = key_of(a, "journal-crypt")?.ok_or_else(|| {
                Fail::usage(format!(
                    "Journal encryption {n} needs a key: give it with --journal-crypt-key-file."
                ))
            })?;
            Some(AlgSpec {
                name,
                key: Some(key),
            })
        }
    };
    let mac = match a.str("journal-integrity") {
        None => None,
        Some(n) => {
            let name = kernel_alg(n)?.ok_or_else(|| {
                Fail::usage("Journal integrity none: leave --journal-integrity out.")
            })?;
            let key = key_of(a, "journal-integrity")?;
            Alg::new(&name, key.clone()).map_err(|e| {
                Fail::usage(format!("{e}: give it with --journal-integrity-key-file."))
            })?;
            Some(AlgSpec { name, key })
        }
    };
    Ok((crypt, mac))
}

pub(super) fn open_dev(path: &str, read_only: bool) -> Result<Arc<dyn BlockDevice>, Fail> {
    let flags = OpenFlags {
        read_only,
        ..OpenFlags::default()
    };
    crate::store::open(path, flags)
        .map_err(|_| Fail::new(4, format!("Device {path} does not exist or access denied.")))
}

pub(super) fn read_superblock(dev: &dyn BlockDevice, path: &str) -> Result<Superblock, Fail> {
    let mut b = vec![0u8; 512];
    dev.read(0, &mut b)
        .map_err(|e| Fail::new(4, format!("Cannot read superblock on device {path}: {e}.")))?;
    match Superblock::parse(&b) {
        Ok(Some(sb)) => Ok(sb),
        Ok(None) | Err(_) => Err(Fail::usage(format!(
            "No integrity superblock detected on {path}."
        ))),
    }
}

fn confirm(path: &str) -> Outcome {
    let q = format!(
        "\nWARNING!\n========\nThis will overwrite data on {path} irrevocably.\n\n\
         Are you sure? (Type 'yes' in capital letters): "
    );
    print!("{q}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let stdin = std::io::stdin();
    if !stdin.is_terminal() && stdin.lock().read_line(&mut line).unwrap_or(0) == 0 {
        return Err(Fail::usage("\nOperation aborted."));
    }
    if line.is_empty() {
        let _ = stdin.lock().read_line(&mut line);
    }
    if line.trim_end() != "YES" {
        return Err(Fail::usage("Operation aborted."));
    }
    Ok(())
}

fn spec(a: &Args, alg: &Option<Alg>) -> Result<Spec, Fail> {
    let tag_size = match a.u32("tag-size")? {
        Some(t) => t,
        None => alg.as_ref().map_or(0, |h| h.digest_size() as u32),
    };
    if tag_size == 0 {
        return Err(Fail::usage("Tag size must be given with --integrity none."));
    }
    Ok(Spec {
        start: 0,
        tag_size,
        sector_size: a.u32("sector-size")?.unwrap_or(512),
        journal_sectors: a.u64("journal-size")?.map(|b| b / 512),
        interleave_sectors: a.u32("interleave-sectors")?,
        journal_mac: a.str("journal-integrity").is_some(),
        fix_padding: !a.has("integrity-legacy-padding"),
        fix_hmac: !a.has("integrity-legacy-hmac"),
        has_hash: alg.is_some(),
        bitmap_mode: a.has("integrity-bitmap-mode"),
        sectors_per_bit: a.u64("bitmap-sectors-per-bit")?,
        buffer_sectors: a.u32("buffer-sectors")?,
    })
}

/// `--data-device`: the device of the data when the positional one holds
/// only the metadata (the same path as the positional one is no
/// separate device, as libcryptsetup takes it).
pub(super) fn data_device<'a>(a: &'a Args, path: &str) -> Option<&'a str> {
    a.str("data-device").filter(|d| *d != path)
}

pub(super) fn format(a: &Args) -> Outcome {
    let path = &a.pos[1];
    let alg = alg(a)?;
    let (jcrypt, jmac) = journal_algs(a)?;
    let spec = spec(a, &alg)?;
    let dev = open_dev(path, false)?;
    let data = data_device(a, path)
        .map(|d| open_dev(d, false))
        .transpose()?;
    if !a.has("batch-mode") {
        confirm(path)?;
    }
    let mut salt = [0u8; SALT_SIZE];
    getrandom::fill(&mut salt).map_err(|e| Fail::new(3, format!("No random salt: {e}.")))?;
    let meta_sectors = dev.size() / 512;
    let (sb, g) = match &data {
        None => format::superblock(&spec, meta_sectors, salt),
        Some(d) => format::superblock_separate(&spec, meta_sectors, d.size() / 512, salt),
    }
    .map_err(|e| Fail::usage(format!("Cannot format integrity for device {path}: {e}.")))?;
    let io = |e| Fail::new(4, format!("Cannot write to device {path}: {e}."));
    let seal = Seal::new(jcrypt.as_ref(), jmac.as_ref(), &sb, &g).map_err(Fail::usage)?;
    match &seal {
        None => format::format(&*dev, &sb, &g, None, None).map_err(io)?,
        Some(s) => {
            s.write_empty(&*dev, &g, 0).map_err(io)?;
            let mac = |b: &[u8]| s.sb_mac(b).unwrap_or_default();
            format::write_superblock(&*dev, &sb, 0, Some(&mac)).map_err(io)?;
            dev.flush().map_err(io)?;
        }
    }
    // integritysetup says nothing of this in batch mode (-q).
    let quiet = a.has("batch-mode");
    if !quiet {
        println!(
            "Formatted with tag size {}, internal integrity {}.",
            sb.tag_size,
            alg.as_ref().map_or("none", |h| h.name())
        );
    }
    if a.has("no-wipe") {
        return Ok(());
    }
    if !quiet {
        println!(
            "Wiping device to initialize integrity checksum.\n\
             You can interrupt this by pressing CTRL+c (rest of not wiped device will contain \
             invalid checksum)."
        );
    }
    let salt = sb.has(flags::FIXED_HMAC).then_some(&sb.salt[..]);
    let data = data.unwrap_or_else(|| dev.clone());
    format::wipe_to(&*data, &*dev, &g, alg.as_ref(), salt).map_err(io)
}

fn flag_words(sb: &Superblock) -> String {
    let mut s = String::new();
    for (f, w) in [
        (flags::HAVE_JOURNAL_MAC, "have_journal_mac "),
        (flags::RECALCULATING, "recalculating "),
        (flags::DIRTY_BITMAP, "dirty_bitmap "),
        (flags::FIXED_PADDING, "fix_padding "),
        (flags::FIXED_HMAC, "fix_hmac "),
    ] {
        if sb.has(f) {
            s.push_str(w);
        }
    }
    s
}

pub(super) fn dump(a: &Args) -> Outcome {
    let path = &a.pos[1];
    let dev = open_dev(path, true)?;
    let sb = read_superblock(&*dev, path)?;
    if super::wording() == super::Wording::V2_8 {
        dump_units(path, &sb);
        return Ok(());
    }
    println!("Info for integrity device {path}.");
    println!("superblock_version {}", sb.version);
    println!("log2_interleave_sectors {}", sb.log2_interleave_sectors);
    println!("integrity_tag_size {}", sb.tag_size);
    println!("journal_sections {}", sb.journal_sections);
    println!("provided_data_sectors {}", sb.provided_data_sectors);
    println!("sector_size {}", sb.sector_size());
    if sb.version >= 2 && sb.has(flags::RECALCULATING) {
        println!("recalc_sector {}", sb.recalc_sector);
    }
    println!("log2_blocks_per_bitmap {}", sb.log2_blocks_per_bitmap_bit);
    println!("flags {}", flag_words(&sb));
    Ok(())
}

/// The same fields as integritysetup 2.8 prints them, with their units.
fn dump_units(path: &str, sb: &Superblock) {
    let n = sb.provided_data_sectors;
    println!("INTEGRITY header information for {path}.");
    println!("version: {}", sb.version);
    println!("tag size: {} [bytes]", sb.tag_size);
    println!("sector size: {} [bytes]", sb.sector_size());
    println!(
        "data size: {n} [512-byte units] ({} [bytes])",
        n.saturating_mul(512)
    );
    if sb.version >= 2 && sb.has(flags::RECALCULATING) {
        println!("recalculate sector: {}", sb.recalc_sector);
    }
    println!("journal sections: {}", sb.journal_sections);
    println!("log2 interleave sectors: {}", sb.log2_interleave_sectors);
    println!("log2 blocks per bitmap: {}", sb.log2_blocks_per_bitmap_bit);
    println!("flags: {}", flag_words(sb));
}

/// The journal size in bytes of a formatted device (also of a separate
/// metadata device, whose data device's size it does not need).
pub(super) fn journal_bytes(sb: &Superblock) -> u64 {
    journal_sectors_of(sb) * 512
}
