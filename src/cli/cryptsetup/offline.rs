//! Actions that work on a header without a running device: argv to
//! `luks::ops` requests, cryptsetup's verbose messages, and the option
//! precedence rules of cryptsetup's action functions.

use std::path::{Path, PathBuf};

use super::ctx::{
    device, key_source, new_key_source, pbkdf, ui, unlock, unlock_tokens_first, Ctx, Outcome,
};
use crate::luks::error::LuksError;
use crate::luks::ops::{self, Device, Unlock};

/// LUKS version `--type` asks for: None = any (`luks`).
fn wanted_version(c: &Ctx) -> Result<Option<u8>, LuksError> {
    match c.device_type.as_deref() {
        None | Some("luks") => Ok(None),
        Some("luks1") => Ok(Some(1)),
        Some("luks2") => Ok(Some(2)),
        Some(t) => Err(LuksError::Usage(format!(
            "Unrecognized metadata device type {t}."
        ))),
    }
}

/// cryptsetup loads the header as the requested type; a LUKS1 header read
/// as `--type luks2` (or the reverse) is "not a valid LUKS device".
fn check_type(c: &Ctx, dev: &Device) -> Outcome {
    if let Some(v) = wanted_version(c)? {
        let fb = ui(c);
        let vol = dev.load(false, &fb)?;
        if vol.version() != v {
            return Err(LuksError::NotLuks(dev.meta_path().display().to_string()));
        }
    }
    Ok(())
}

fn slot_msg(c: &Ctx, slot: u32, what: &str) {
    c.verbose_msg(&format!("Key slot {slot} {what}."));
}

pub(super) fn format(c: &Ctx) -> Outcome {
    let version = wanted_version(c)?.unwrap_or(2);
    // A second positional argument is the key file, unless --key-file.
    let kf = match (c.a.str("key-file"), c.argv.get(1)) {
        (Some(k), Some(_)) => {
            eprintln!("Option --key-file takes precedence over specified key file argument.");
            Some(k)
        }
        (Some(k), None) => Some(k),
        (None, p) => p.map(String::as_str),
    };
    let o = ops::format::FormatOpts {
        dev: device(c),
        key: key_source(c, kf),
        version,
        cipher: c.a.str("cipher").map(str::to_string),
        key_bits: c.a.u32("key-size"),
        sector_size: c.a.u32("sector-size"),
        label: c.a.str("label").map(str::to_string),
        subsystem: c.a.str("subsystem").map(str::to_string),
        uuid: c.a.str("uuid").map(str::to_string),
        metadata_size: c.a.u64("luks2-metadata-size"),
        keyslots_size: c.a.u64("luks2-keyslots-size"),
        offset_sectors: c.a.u64("offset"),
        align_sectors: c.a.u32("align-payload").map(u64::from),
        key_slot: c.a.i32("key-slot").map(|s| s as u32),
        volume_key_file: c.a.str("volume-key-file").map(PathBuf::from),
        pbkdf: pbkdf(c),
        create_size: None,
        integrity: c.a.str("integrity").map(str::to_string),
        integrity_no_wipe: c.a.has("integrity-no-wipe"),
    };
    let slot = ops::format::luks_format(&o, &ui(c))?;
    slot_msg(c, slot, "created");
    Ok(())
}

pub(super) fn add_key(c: &Ctx) -> Outcome {
    if c.a.has("unbound") {
        return add_unbound_key(c);
    }
    check_type(c, &device(c))?;
    let new_file = c.argv.get(1).map(String::as_str).or(c.a.str("new-keyfile"));
    // Old behaviour kept by cryptsetup: --key-slot alone names the new slot.
    let mut u = unlock(c);
    // Any token option makes the token the only proof of the existing key.
    if c.a.has("token-id") || c.a.has("token-type") {
        u.token.only = true;
    }
    let mut new_slot = c.a.i32("new-key-slot").map(|s| s as u32);
    if !c.a.has("new-key-slot") && c.a.has("key-slot") {
        if !c.batch() {
            println!("WARNING: The --key-slot parameter is used for new keyslot number.");
        }
        new_slot = u.slot.take();
    }
    let new_key = new_key_source(c, new_file);
    let o = ops::keys::AddKeyOpts {
        dev: device(c),
        unlock: u,
        new_key,
        new_slot,
        volume_key_file: c.a.str("volume-key-file").map(PathBuf::from),
        pbkdf: pbkdf(c),
    };
    let slot = ops::keys::add_key(&o, &ui(c))?;
    slot_msg(c, slot, "created");
    Ok(())
}

/// `luksAddKey --unbound --key-size BITS`: `--key-slot` names the new
/// keyslot, the positional or `--new-keyfile` key file its passphrase.
fn add_unbound_key(c: &Ctx) -> Outcome {
    let new_file = c.argv.get(1).map(String::as_str).or(c.a.str("new-keyfile"));
    let new_key = new_key_source(c, new_file);
    let o = ops::keys::AddUnboundOpts {
        dev: device(c),
        new_key,
        new_slot: c.a.i32("key-slot").map(|s| s as u32),
        key_bytes: (c.a.u32("key-size").unwrap_or(0) / 8) as usize,
        volume_key_file: c.a.str("volume-key-file").map(PathBuf::from),
        pbkdf: pbkdf(c),
    };
    let slot = ops::keys::add_unbound_key(&o, &ui(c))?;
    slot_msg(c, slot, "created");
    Ok(())
}

pub(super) fn remove_key(c: &Ctx) -> Outcome {
    check_type(c, &device(c))?;
    let mut u = unlock(c);
    if c.a.str("key-file").is_none() {
        u.key.key_file = c.argv.get(1).map(PathBuf::from);
    } else if c.argv.len() > 1 {
        eprintln!("Option --key-file takes precedence over specified key file argument.");
    }
    u.slot = None;
    let slot = ops::keys::remove_key(&device(c), &u, &ui(c))?;
    slot_msg(c, slot, "removed");
    Ok(())
}

pub(super) fn change_key(c: &Ctx) -> Outcome {
    check_type(c, &device(c))?;
    let new = new_key_source(c, c.argv.get(1).map(String::as_str));
    let slot = ops::keys::change_key(&device(c), &unlock(c), &new, &pbkdf(c), &ui(c))?;
    slot_msg(c, slot, "created");
    Ok(())
}

pub(super) fn convert_key(c: &Ctx) -> Outcome {
    let slot = ops::keys::convert_key(&device(c), &unlock(c), &pbkdf(c), &ui(c))?;
    slot_msg(c, slot, "created");
    Ok(())
}

pub(super) fn kill_slot(c: &Ctx) -> Outcome {
    let dev = device(c);
    check_type(c, &dev)?;
    let slot: u32 = c.argv[1]
        .parse()
        .map_err(|_| LuksError::Usage("Key slot is invalid.".into()))?;
    let stdin_tty = {
        use std::io::IsTerminal;
        std::io::stdin().is_terminal()
    };
    // cryptsetup asks for a remaining passphrase unless in batch mode with
    // no key file on a terminal.
    let proof = (!c.batch() || c.a.has("key-file") || !stdin_tty).then(|| {
        let mut u = unlock(c);
        u.slot = None;
        u
    });
    ops::keys::kill_slot(&dev, slot, proof.as_ref(), &ui(c))?;
    slot_msg(c, slot, "removed");
    Ok(())
}

pub(super) fn uuid(c: &Ctx) -> Outcome {
    let dev = device(c);
    check_type(c, &dev)?;
    if let Some(u) = ops::info::luks_uuid(&dev, c.a.str("uuid"), &ui(c))? {
        println!("{u}");
    }
    Ok(())
}

pub(super) fn is_luks(c: &Ctx) -> Outcome {
    if c.argv.len() > 1 {
        // cryptsetup's message and exit code 4 (-ENODEV); a Device error
        // would wrap the sentence in another one.
        eprintln!("Only one device argument for isLuks operation is supported.");
        return Err(LuksError::Silent(4));
    }
    let dev = device(c);
    // isLuks is quiet: the exit code is the answer (messages only with -v).
    match ops::info::is_luks(&dev, wanted_version(c)?) {
        Ok(()) => Ok(()),
        Err(e) if c.verbose() => Err(e),
        Err(e) => Err(LuksError::Silent(e.exit_code())),
    }
}

pub(super) fn dump(c: &Ctx) -> Outcome {
    let dev = device(c);
    check_type(c, &dev)?;
    let kind = if c.a.has("dump-volume-key") {
        ops::info::DumpKind::VolumeKey(c.a.str("volume-key-file").map(PathBuf::from))
    } else if c.a.has("unbound") {
        ops::info::DumpKind::UnboundKey(
            c.a.i32("key-slot").unwrap_or(0) as u32,
            c.a.str("volume-key-file").map(PathBuf::from),
        )
    } else if c.a.has("dump-json-metadata") {
        ops::info::DumpKind::Json
    } else {
        ops::info::DumpKind::Header
    };
    let mut u = unlock(c);
    u.slot = None;
    let t = ops::info::luks_dump(&dev, &kind, &u, &ui(c))?;
    crate::cli::ui::emit(t.as_bytes(), false)
}

pub(super) fn header_backup(c: &Ctx) -> Outcome {
    let Some(f) = c.a.str("header-backup-file") else {
        return Err(LuksError::Usage(
            "Option --header-backup-file is required.".into(),
        ));
    };
    ops::header::backup(&device(c), Path::new(f), &ui(c))
}

pub(super) fn header_restore(c: &Ctx) -> Outcome {
    let Some(f) = c.a.str("header-backup-file") else {
        return Err(LuksError::Usage(
            "Option --header-backup-file is required.".into(),
        ));
    };
    ops::header::restore(&device(c), Path::new(f), &ui(c))
}

pub(super) fn erase(c: &Ctx) -> Outcome {
    let dev = device(c);
    check_type(c, &dev)?;
    ops::keys::erase(&dev, &ui(c))
}

pub(super) fn config(c: &Ctx) -> Outcome {
    let priority = match c.a.str("priority") {
        None => None,
        Some(p) => {
            let n = match p {
                "ignore" => 0,
                "normal" => 1,
                _ => 2,
            };
            Some((c.a.i32("key-slot").unwrap_or(0) as u32, n))
        }
    };
    let o = ops::info::ConfigOpts {
        priority,
        label: c.a.str("label").map(str::to_string),
        subsystem: c.a.str("subsystem").map(str::to_string),
    };
    ops::info::config(&device(c), &o, &ui(c))
}

/// What `open` checks before a device is mapped, and `open
/// --test-passphrase`, which maps nothing: Ok(true) when that was all.
pub(super) fn open_checks(c: &Ctx) -> Result<bool, LuksError> {
    let ty = c.device_type.as_deref().unwrap_or("luks");
    if ty.starts_with("luks") && c.a.has("test-passphrase") {
        let dev = device(c);
        check_type(c, &dev)?;
        // As cryptsetup: testing one keyslot by number, or asking for
        // unbound keys, lets a keyslot of an unbound key answer.
        let u = Unlock {
            unbound: c.a.has("unbound") || c.a.has("key-slot"),
            ..unlock_tokens_first(c)
        };
        let slot = ops::test_passphrase(&dev, &u, &ui(c))?;
        slot_msg(c, slot, "unlocked");
        return Ok(true);
    }
    if !matches!(ty, "luks" | "luks1" | "luks2" | "plain") {
        return Err(LuksError::Unsupported(format!(
            "device type {ty} (udm opens LUKS and plain dm-crypt only)"
        )));
    }
    if c.argv.len() < 2 && !c.a.has("refresh") {
        return Err(LuksError::Usage(
            "Command requires device and mapped name as arguments.".into(),
        ));
    }
    Ok(false)
}

pub(super) fn benchmark(c: &Ctx) -> Outcome {
    let a = crate::cli::benchmark::Args {
        cipher: c.a.str("cipher").map(str::to_string),
        key_size: c.a.u32("key-size"),
        sector_size: 512,
        time_ms: 500,
        iter_time: u64::from(c.a.u32("iter-time").unwrap_or(2000)),
        json: false,
    };
    match crate::cli::benchmark::run(a) {
        0 => Ok(()),
        _ => Err(LuksError::Usage(String::new())),
    }
}

pub(super) fn token(c: &Ctx) -> Outcome {
    let verb = c.argv[0].as_str();
    let dev = Device {
        path: PathBuf::from(&c.argv[1]),
        header: c.a.str("header").map(PathBuf::from),
        no_cost_limit: c.a.has("no-kdf-limit"),
        allow_weak_cipher: c.a.has("allow-weak-cipher"),
    };
    let fb = ui(c);
    let id = c.a.i32("token-id").map(|t| t as u32);
    let slot = c.a.i32("key-slot").map(|s| s as u32);
    let replace = c.a.has("token-replace");
    match verb {
        "add" => {
            let desc = c.a.str("key-description").unwrap_or("");
            let n =
                ops::token::add_keyring(&dev, desc, id, slot, c.a.has("unbound"), replace, &fb)?;
            c.verbose_msg(&format!("Token {n} created."));
            Ok(())
        }
        "remove" => {
            let n = id.unwrap_or(0);
            ops::token::remove(&dev, n, &fb)?;
            c.verbose_msg(&format!("Token {n} removed."));
            Ok(())
        }
        "import" => {
            use std::io::Read;
            let mut json = Vec::new();
            match c.a.str("json-file") {
                Some(f) if f != "-" => {
                    json = std::fs::read(f).map_err(|e| {
                        LuksError::io(format!("Failed to open file {f} in read-only mode"), e)
                    })?;
                }
                _ => {
                    std::io::stdin()
                        .lock()
                        .take(4 << 20)
                        .read_to_end(&mut json)
                        .map_err(|e| LuksError::io("Failed to read JSON file", e))?;
                }
            }
            let n = ops::token::import(&dev, &json, id, slot, replace, &fb)?;
            c.verbose_msg(&format!("Token {n} created."));
            Ok(())
        }
        "export" => {
            let json = ops::token::export(&dev, id.unwrap_or(0), &fb)?;
            match c.a.str("json-file") {
                Some(f) if f != "-" => {
                    use std::io::Write;
                    use std::os::unix::fs::OpenOptionsExt;
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        // As cryptsetup: a shorter token over a longer
                        // file must not leave the old tail behind.
                        .truncate(true)
                        .mode(0o600)
                        .open(f)
                        .and_then(|mut o| o.write_all(json.as_bytes()))
                        .map_err(|e| {
                            LuksError::io(format!("Failed to open file {f} in write mode"), e)
                        })
                }
                _ => {
                    use std::io::IsTerminal;
                    let nl = std::io::stdout().is_terminal();
                    crate::cli::ui::emit(json.as_bytes(), nl)
                }
            }
        }
        _ => ops::token::unassign(&dev, id.unwrap_or(0), slot.unwrap_or(0), &fb),
    }
}

pub(super) fn convert(c: &Ctx) -> Outcome {
    let to = match c.a.str("type") {
        Some("luks2") => 2,
        Some("luks1") => 1,
        _ => {
            return Err(LuksError::Usage(
                "Invalid LUKS type, only luks1 and luks2 are supported.".into(),
            ))
        }
    };
    ops::header::convert(&device(c), to, &ui(c))
}

pub(super) fn repair(c: &Ctx) -> Outcome {
    // A LUKS2 header with an interrupted reencryption hotzone: recover the
    // hotzone's data (from checksums or the journal), as cryptsetup does.
    let dev = device(c);
    if let Ok(v) = dev.load(false, &ui(c)) {
        if crate::luks::reencrypt::status(&v)
            .ok()
            .flatten()
            .is_some_and(|s| s.hot.is_some())
        {
            drop(v);
            let mut v = dev.load(true, &ui(c))?;
            let pass = key_source(c, c.a.str("key-file")).read(
                &format!("Enter passphrase for {}: ", dev.meta_path().display()),
                false,
            )?;
            crate::luks::reencrypt::recover_only(&mut v, &pass)?;
            return Ok(());
        }
    }
    for m in ops::header::repair(&device(c), &ui(c))? {
        if m.starts_with("No known problems") {
            c.verbose_msg(&m);
        } else {
            eprintln!("{m}");
        }
    }
    Ok(())
}
