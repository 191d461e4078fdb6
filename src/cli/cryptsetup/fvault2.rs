//! cryptsetup's verbs for FileVault2 volumes: `fvault2Dump` and
//! `open --type fvault2`. The Core Storage metadata is read by
//! `luks::foreign::fvault2`; here the passphrase is asked as cryptsetup
//! asks it and the logical volume becomes the one crypt line
//! `luks::foreign::activate` builds, on a running server.

use std::path::Path;

use super::active::flags;
use super::bitlk::{confirm_key_dump, print_dump, with_passphrase, write_key_file};
use super::ctx::{Ctx, Outcome};
use super::foreign::create_layers;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::foreign::activate;
use crate::luks::foreign::fvault2::{self, Metadata};
use crate::luks::secret::SecretText;
use zeroize::Zeroizing;

fn load(c: &Ctx) -> Result<Metadata, LuksError> {
    let disk = Disk::open(Path::new(&c.argv[0]), false)?;
    let mut m = fvault2::read(&disk).map_err(|e| {
        eprintln!("Device {} is not a valid FVAULT2 device.", c.argv[0]);
        match e {
            LuksError::Unsupported(m) => LuksError::Unsupported(m),
            _ => LuksError::Silent(1),
        }
    })?;
    if c.a.has("no-kdf-limit") {
        m.cost_limit = None;
    }
    Ok(m)
}

/// `fvault2Dump [--dump-volume-key [--volume-key-file F]]`: the header,
/// then (asked for) the volume key, which also goes to the file if named.
pub(super) fn dump(c: &Ctx) -> Outcome {
    let m = load(c)?;
    if !c.a.has("dump-volume-key") {
        print!("{}", m.dump_text(&c.argv[0]));
        return Ok(());
    }
    confirm_key_dump(c)?;
    m.check_cost()?;
    let key = with_passphrase(c, |pass| m.volume_key(pass))?;
    if let Some(f) = c.a.str("volume-key-file") {
        write_key_file(f, &key[..])?;
    }
    let head = m.dump_text(&c.argv[0]);
    let mut t = SecretText::with_capacity(head.len() + 256);
    let text = (|| -> std::fmt::Result {
        use std::fmt::Write;
        t.write_str(&head)?;
        t.write_str("Volume key:       \t")?;
        t.hex(&key[..], " ", 0, "")?;
        t.write_str(" \n")
    })();
    print_dump(&t, text)
}

/// `open --type fvault2 DEVICE NAME` (and `--test-passphrase`).
pub(super) fn open(c: &Ctx) -> Outcome {
    let m = load(c)?;
    let key = match c.a.str("volume-key-file") {
        Some(f) => {
            let k = crate::luks::ops::read_volume_key_file(Path::new(f), 32)?;
            if c.a.has("test-passphrase") {
                eprintln!("This operation is not supported.");
                return Err(LuksError::Silent(1));
            }
            Zeroizing::new(k.to_vec())
        }
        None => {
            m.check_cost()?;
            Zeroizing::new(with_passphrase(c, |pass| m.volume_key(pass))?.to_vec())
        }
    };
    if c.a.has("test-passphrase") {
        return Ok(());
    }
    let name = c
        .argv
        .get(1)
        .ok_or_else(|| LuksError::Usage("Argument <name> missing.".into()))?;
    let disk_sectors = Disk::open(Path::new(&c.argv[0]), false)?.size()? / 512;
    let dev = super::ctx::table_dev(&c.argv[0]);
    let l = activate::fvault2_layer(&m, &key, name, &dev, disk_sectors, &flags(c), &c.argv[0])?;
    create_layers(c, &[l])
}
