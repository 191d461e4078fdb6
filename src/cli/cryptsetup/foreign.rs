//! cryptsetup's verbs for volumes of other systems: `tcryptDump` and
//! `open --type tcrypt` (`tcryptOpen`), `close` of what they created.
//! The formats are read by `luks::foreign`; this file maps argv, asks for
//! the passphrase as cryptsetup does, and creates the devices on a
//! running server, one per cipher of a chain as cryptsetup stacks them
//! (`NAME_2` on the disk, `NAME_1` on it, `NAME` on top; the tables come
//! from `luks::foreign::activate`, which `udm serve` shares).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::active::{call, flags, req};
use super::ctx::{ui, Ctx, Outcome};
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;
use crate::luks::foreign::activate;
use crate::luks::foreign::tcrypt::{self, Header, Params};
use crate::luks::passphrase::KeySource;
use crate::luks::secret::SecretText;

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
        map_legacy: c.a.has("allow-tcrypt-legacy"),
        no_cost_limit: c.a.has("no-kdf-limit"),
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
    let disk = Disk::open(&activate::tcrypt_header_device(&meta, &p), false)?;
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

/// `open --type tcrypt DEVICE NAME` (and `--test-passphrase`, which
/// cryptsetup passes before any refusal: it refuses only activation).
/// udm's `--allow-tcrypt-legacy` maps a legacy CBC volume cryptsetup
/// refuses.
pub(super) fn open(c: &Ctx) -> Outcome {
    let l = load(c)?;
    if c.a.has("test-passphrase") {
        return Ok(());
    }
    if let Some(why) = activate::tcrypt_refusal(&l.hdr, &l.p) {
        eprintln!("{why}");
        return Err(LuksError::Silent(1));
    }
    if let Err(why) = activate::tcrypt_check_ciphers(&l.hdr) {
        eprintln!("{why}");
        return Err(LuksError::Silent(1));
    }
    let name = c
        .argv
        .get(1)
        .ok_or_else(|| LuksError::Usage("Argument <name> missing.".into()))?;
    let (g, note) =
        activate::tcrypt_geometry(&l.hdr, &l.p, &l.meta, l.meta_size, Path::new(&c.argv[0]))?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let layers = activate::tcrypt_layers(
        &l.hdr,
        name,
        &super::ctx::table_dev(&g.dev.to_string_lossy()),
        &g,
        &flags(c),
    );
    create_layers(c, &layers)
}

/// Create a volume's devices on the running server, lowest first (the
/// order cryptsetup stacks them in); if one fails, remove those already
/// made, top first, so that no half-built stack is left behind.
pub(super) fn create_layers(c: &Ctx, layers: &[activate::Layer]) -> Outcome {
    let mut created: Vec<&str> = Vec::new();
    for layer in layers {
        let mut r = req("create", &layer.name);
        r.has_table = true;
        r.readonly = c.a.has("readonly") || layer.read_only;
        r.allow = c.a.str("allow").map(str::to_string);
        r.uuid = Some(layer.uuid.clone());
        if let Err(e) = call(c, &layer.name, r, layer.table.as_bytes()) {
            for d in created.iter().rev() {
                let _ = call(c, d, req("remove", d), &[]);
            }
            return Err(e);
        }
        created.push(&layer.name);
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
            let sub = activate::layer_name(&name, i);
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
