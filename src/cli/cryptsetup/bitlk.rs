//! cryptsetup's verbs for BitLocker volumes: `bitlkDump` and
//! `open --type bitlk` (`bitlkOpen`). The metadata is read by
//! `luks::foreign::bitlk`; this file asks for the secret as cryptsetup
//! does (a clear key first, then a passphrase, recovery password or
//! startup key file) and creates the device `luks::foreign::activate`
//! builds on a running server.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::active::flags;
use super::ctx::{key_source, ui, Ctx, Outcome};
use super::foreign::create_layers;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::foreign::activate;
use crate::luks::foreign::bitlk::{self, Metadata};
use crate::luks::secret::SecretText;
use zeroize::Zeroizing;

fn load(c: &Ctx) -> Result<Metadata, LuksError> {
    let disk = Disk::open(Path::new(&c.argv[0]), false)?;
    let mut m = bitlk::read(&disk).map_err(|e| {
        eprintln!("Device {} is not a valid BITLK device.", c.argv[0]);
        match e {
            LuksError::Usage(_) => LuksError::Silent(1),
            e => e,
        }
    })?;
    if c.a.has("no-kdf-limit") {
        m.cost_limit = None;
    }
    Ok(m)
}

/// Ask for a passphrase (or read the key file) and hand it to `try_one`,
/// `--tries` times on a terminal, until it gives anything but a wrong
/// passphrase; a wrong one is reported as cryptsetup reports it.
pub(super) fn with_passphrase<T>(
    c: &Ctx,
    try_one: impl Fn(&[u8]) -> Result<T, LuksError>,
) -> Result<T, LuksError> {
    let src = key_source(c, c.a.str("key-file"));
    let tries = if src.interactive() {
        c.a.u32("tries").unwrap_or(3).max(1)
    } else {
        1
    };
    let prompt = format!("Enter passphrase for {}: ", c.argv[0]);
    for _ in 0..tries {
        let pass = src.read(&prompt, false)?;
        match try_one(&pass) {
            Err(LuksError::WrongPassphrase) => eprintln!("No key available with this passphrase."),
            other => return other,
        }
    }
    Err(LuksError::Silent(2))
}

/// The FVEK: through a clear key if there is one, else from the
/// passphrase, recovery password or key file.
fn unlock(c: &Ctx, m: &Metadata) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    match m.volume_key(None) {
        Err(LuksError::WrongPassphrase) => {}
        other => return other,
    }
    m.check_cost()?;
    with_passphrase(c, |pass| m.volume_key(Some(pass)))
}

/// The volume key to a new file only the owner may read.
pub(super) fn write_key_file(p: &str, key: &[u8]) -> Outcome {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(p)
        .map_err(|e| LuksError::io(format!("Cannot create volume key file {p}"), e))?;
    f.write_all(key)
        .and_then(|_| f.sync_all())
        .map_err(|e| LuksError::io(format!("Cannot write volume key file {p}"), e))
}

/// cryptsetup's question before a volume key dump (BITLK and FVAULT2
/// ask the same); a no is "Operation aborted.".
pub(super) fn confirm_key_dump(c: &Ctx) -> Outcome {
    use crate::luks::feedback::Feedback;
    if !ui(c).confirm(
        "The header dump with volume key is sensitive information\nthat allows access to encrypted partition without a passphrase.\nThis dump should be stored encrypted in a safe place.",
    )? {
        return Err(LuksError::Denied("Operation aborted.".into()));
    }
    Ok(())
}

/// `bitlkDump [--dump-volume-key [--volume-key-file F]]`.
pub(super) fn dump(c: &Ctx) -> Outcome {
    let m = load(c)?;
    if !c.a.has("dump-volume-key") {
        print!("{}", m.dump_text(&c.argv[0]));
        return Ok(());
    }
    confirm_key_dump(c)?;
    let key = unlock(c, &m)?;
    let file = c.a.str("volume-key-file");
    if let Some(f) = file {
        write_key_file(f, &key)?;
    }
    let mut t = SecretText::with_capacity(1024 + key.len() * 4);
    let text = (|| -> std::fmt::Result {
        use std::fmt::Write;
        write!(
            t,
            "BITLK header information for {}\nCipher name:   \taes\nCipher mode:   \t{}\n\
             UUID:          \t{}\nMK bits:       \t{}\n",
            c.argv[0],
            m.cipher_mode,
            m.guid,
            key.len() * 8
        )?;
        if let Some(f) = file {
            return writeln!(t, "Key stored to file {f}.");
        }
        t.write_str("MK dump:\t")?;
        t.hex(&key, " ", 16, "\t\t")?;
        t.write_str("\n")
    })();
    print_dump(&t, text)
}

/// Print a volume key dump once it was written whole into `t`.
pub(super) fn print_dump(t: &SecretText, written: std::fmt::Result) -> Outcome {
    written.map_err(|_| LuksError::Usage("volume key dump does not fit its buffer".into()))?;
    print!("{}", t.as_str());
    Ok(())
}

/// `open --type bitlk DEVICE NAME` (and `--test-passphrase`); udm's
/// `--allow-partial-bitlk` maps a volume cryptsetup refuses from its map
/// of encrypted parts, read-only.
pub(super) fn open(c: &Ctx) -> Outcome {
    let m = load(c)?;
    let partial = c.a.has("allow-partial-bitlk");
    if let (Some(why), false) = (activate::bitlk_refusal(&m), partial) {
        // cryptsetup refuses before it asks for the secret, also for
        // --test-passphrase and --volume-key-file.
        eprintln!("{why}");
        return Err(LuksError::Silent(1));
    }
    let key = match c.a.str("volume-key-file") {
        Some(f) => {
            let len = (m.key_bits / 8) as usize;
            let k = crate::luks::ops::read_volume_key_file(Path::new(f), len)?;
            if c.a.has("test-passphrase") {
                // cryptsetup cannot check a volume key against BITLK metadata.
                eprintln!("This operation is not supported.");
                return Err(LuksError::Silent(1));
            }
            Zeroizing::new(k.to_vec())
        }
        None => unlock(c, &m)?,
    };
    if c.a.has("test-passphrase") {
        return Ok(());
    }
    let name = c
        .argv
        .get(1)
        .ok_or_else(|| LuksError::Usage("Argument <name> missing.".into()))?;
    let disk = Disk::open(&PathBuf::from(&c.argv[0]), false)?;
    let size = disk.size()?;
    if size != m.volume_size {
        print!(
            "WARNING: BitLocker volume size {} does not match the underlying device size {size}",
            m.volume_size
        );
    }
    if let Err(why) = activate::bitlk_check_cipher(&m, &key) {
        eprintln!("{why}");
        return Err(LuksError::Silent(1));
    }
    let (segs, partly) = match activate::bitlk_segments(&m, &disk, size / 512, partial) {
        Err(LuksError::Unsupported(why)) => {
            eprintln!("{why}");
            return Err(LuksError::Silent(1));
        }
        other => other?,
    };
    if partly {
        eprintln!(
            "BITLK device {} is mapped read-only: parts of it are not encrypted.",
            c.argv[0]
        );
    }
    let dev = super::ctx::table_dev(&c.argv[0]);
    let mut l = activate::bitlk_layer(&m, &key, name, &dev, &segs, &flags(c));
    l.read_only = partly;
    create_layers(c, &[l])
}
