//! Actions on active devices, as clients of a running `udm serve`'s
//! control socket (`$UDM_CONTROL`, `--control PATH`, or the default path):
//! `open` creates a named device and NBD export as `cryptsetup open`
//! creates /dev/mapper/NAME (with cryptsetup's device UUID,
//! `CRYPT-LUKS2-<uuid>-NAME` / `CRYPT-PLAIN-NAME`, so `status` can tell
//! what it is), `close` removes it, `status` prints cryptsetup's report,
//! `resize` and `refresh` reload its table.

use std::path::PathBuf;

use super::ctx::{device, key_source, ui, unlock_tokens_first, Ctx, Outcome};
use crate::control::proto::{Code, Request};
use crate::control::{Client, ClientError};
use crate::core::table::{self, TableLine};
use crate::luks::error::LuksError;
use crate::luks::integrity;
use crate::luks::ops;
use crate::luks::plain::{self, PlainParams};
use crate::targets::integrity::params::{IntegrityParams, Mode};
use crate::targets::{crypt, crypt::CryptParams, linear};
use serde_json::Value;
use zeroize::Zeroizing;

fn socket(c: &Ctx) -> Result<PathBuf, LuksError> {
    if let Some(p) = c.a.str("control") {
        return Ok(PathBuf::from(p));
    }
    crate::control::default_path().ok_or_else(|| {
        LuksError::Usage(
            "no udm control socket: start `udm serve --control PATH` and give PATH with \
             --control or $UDM_CONTROL"
                .into(),
        )
    })
}

fn client_err(name: &str, e: ClientError) -> LuksError {
    match e.code {
        Some(Code::Eexist) => LuksError::Busy(format!("Device {name} already exists.")),
        Some(Code::Ebusy) => LuksError::Busy(format!("Device {name} is still in use ({e}).")),
        Some(Code::Enxio) => LuksError::Device(format!("{name} (not active)")),
        Some(Code::Eperm) => LuksError::Denied(e.to_string()),
        _ => LuksError::Usage(e.to_string()),
    }
}

pub(super) fn call(
    c: &Ctx,
    name: &str,
    req: Request,
    payload: &[u8],
) -> Result<(Value, Zeroizing<Vec<u8>>), LuksError> {
    let mut cl = Client::connect(&socket(c)?).map_err(|e| LuksError::Usage(e.to_string()))?;
    cl.call(req, payload).map_err(|e| client_err(name, e))
}

/// `remove` as cryptsetup does it: libdevmapper's retry-remove (which
/// cryptsetup turns on) tries again for about 5 s while the device is
/// busy, so a short-lived open — udev's scan on a kernel, the last
/// release of a mapper file, still on its way through FUSE, here — does
/// not fail a `close` that follows a reader at once.
pub(super) fn remove(c: &Ctx, name: &str, deferred: bool) -> Result<(), LuksError> {
    let mut r = req("remove", name);
    r.deferred = deferred;
    let mut tries = 25;
    loop {
        tries -= 1;
        match call(c, name, r.clone(), &[]) {
            Err(LuksError::Busy(_)) if tries > 0 => {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            res => return res.map(|_| ()),
        }
    }
}

pub(super) fn req(op: &str, name: &str) -> Request {
    Request {
        op: op.into(),
        names: vec![name.to_string()],
        ..Request::default()
    }
}

/// dm-crypt flags from `--allow-discards` and the `--perf-*` options, in
/// cryptsetup's order.
pub(super) fn flags(c: &Ctx) -> Vec<&'static str> {
    let mut f = Vec::new();
    for (opt, flag) in [
        ("allow-discards", "allow_discards"),
        ("perf-same_cpu_crypt", "same_cpu_crypt"),
        ("perf-submit_from_crypt_cpus", "submit_from_crypt_cpus"),
        ("perf-no_read_workqueue", "no_read_workqueue"),
        ("perf-no_write_workqueue", "no_write_workqueue"),
    ] {
        if c.a.has(opt) {
            f.push(flag);
        }
    }
    f
}

/// The integrity device (`NAME_dif`) under an authenticated LUKS2
/// volume's crypt device: name, table, device UUID.
struct Dif {
    name: String,
    table: String,
    uuid: String,
}

/// The table and device UUID `open` creates, and the integrity device it
/// must create first.
type Opened = (Zeroizing<String>, String, Option<Dif>);

/// cryptsetup's stack for an authenticated volume: the integrity device
/// over the data area (J mode, D with `--integrity-no-journal`), the crypt
/// table over it from its start.
fn integrity_stack(
    c: &Ctx,
    name: &str,
    act: &crate::luks::Activation,
    dev_arg: &str,
    volume_uuid: &str,
) -> Result<(Zeroizing<String>, Dif), LuksError> {
    let Some(l) = &act.integrity else {
        return Err(LuksError::Usage("no integrity device".into()));
    };
    if act.options.contains(&"allow_discards") {
        return Err(LuksError::Usage("Discard/TRIM is not supported.".into()));
    }
    let mode = if c.a.has("integrity-no-journal") {
        Mode::Direct
    } else {
        Mode::Journal
    };
    let dif = Dif {
        name: integrity::dif_name(name),
        table: l.table(dev_arg, mode),
        uuid: integrity::dif_uuid(volume_uuid, name),
    };
    let table = act.table(&format!("@{}", dif.name));
    Ok((table, dif))
}

fn open_table(c: &Ctx, name: &str) -> Result<Opened, LuksError> {
    let ty = c.device_type.as_deref().unwrap_or("luks");
    let data = c.argv[0].clone();
    let dev_arg = super::ctx::table_dev(&data);
    if ty == "plain" {
        let mut p = PlainParams {
            hash: c.a.str("hash").map(str::to_string),
            offset: c.a.u64("offset").unwrap_or(0),
            skip: c.a.u64("skip").unwrap_or(0),
            size: c.a.u64("size").or(c.a.u64("device-size").map(|b| b / 512)),
            sector_size: c.a.u32("sector-size").unwrap_or(512),
            iv_large_sectors: c.a.has("iv-large-sectors"),
            flags: flags(c),
            ..PlainParams::default()
        };
        if let Some(ci) = c.a.str("cipher") {
            p.cipher = ci.to_string();
        }
        if let Some(k) = c.a.u32("key-size") {
            p.key_bytes = (k / 8) as usize;
        }
        let key = plain::plain_key(
            &p,
            &key_source(c, c.a.str("key-file")),
            "Enter passphrase: ",
        )?;
        let size = crate::luks::disk::Disk::open(std::path::Path::new(&data), false)?.size()?;
        return Ok((
            plain::table(&p, &key, &dev_arg, size)?,
            format!("CRYPT-PLAIN-{name}"),
            None,
        ));
    }
    let dev = device(c);
    let fb = ui(c);
    let v = dev.load(false, &fb)?;
    if let Some(want) = match ty {
        "luks1" => Some(1),
        "luks2" => Some(2),
        _ => None,
    } {
        if v.version() != want {
            return Err(LuksError::NotLuks(dev.meta_path().display().to_string()));
        }
    }
    if crate::luks::reencrypt::status(&v)?.is_some() {
        // In reencryption: old and new segments, each with its own key.
        let pass = key_source(c, c.a.str("key-file")).read(
            &format!("Enter passphrase for {}: ", dev.meta_path().display()),
            false,
        )?;
        let act = crate::luks::reencrypt::activation(&v, &pass)?
            .ok_or_else(|| LuksError::Usage("reencryption state changed".into()))?;
        let uuid = format!("CRYPT-LUKS2-{}-{name}", v.uuid().replace('-', ""));
        return Ok((act.table(&dev_arg), uuid, None));
    }
    v.check_requirements()?;
    let (slot, key) = match c.a.str("volume-key-file") {
        Some(f) => {
            let len = v
                .header
                .key_size()
                .or(c.a.u32("key-size").map(|b| (b / 8) as usize))
                .unwrap_or(64);
            let k = ops::read_volume_key_file(std::path::Path::new(f), len)?;
            if !v.check_key(&k) {
                return Err(LuksError::Usage(
                    "Volume key does not match the volume.".into(),
                ));
            }
            (0, Zeroizing::new(k.to_vec()))
        }
        None => ops::unlock(
            &v,
            &unlock_tokens_first(c),
            &format!("Enter passphrase for {}: ", dev.meta_path().display()),
        )?,
    };
    c.verbose_msg(&format!("Key slot {slot} unlocked."));
    let mut act = v.activation(key, slot)?;
    for f in flags(c).into_iter().rev() {
        if !act.options.contains(&f) {
            act.options.insert(0, f);
        }
    }
    if let Some(s) = c.a.u64("size").or(c.a.u64("device-size").map(|b| b / 512)) {
        if let Some(seg) = act.segments.last_mut() {
            seg.len_sectors = seg.len_sectors.min(s);
        }
    }
    let uuid = format!(
        "CRYPT-LUKS{}-{}-{name}",
        v.version(),
        v.uuid().replace('-', "")
    );
    if act.integrity.is_some() {
        let (table, dif) = integrity_stack(c, name, &act, &dev_arg, v.uuid())?;
        return Ok((table, uuid, Some(dif)));
    }
    Ok((act.table(&dev_arg), uuid, None))
}

pub(super) fn open(c: &Ctx) -> Outcome {
    let refresh = c.a.has("refresh");
    let name = if refresh {
        c.argv.get(1).unwrap_or(&c.argv[0]).clone()
    } else {
        c.argv[1].clone()
    };
    let (table, uuid, dif) = open_table(c, &name)?;
    if refresh {
        let mut r = req("load", &name);
        r.has_table = true;
        call(c, &name, r, table.as_bytes())?;
        call(c, &name, req("resume", &name), &[])?;
        return Ok(());
    }
    if let Some(d) = &dif {
        create(c, &d.name, d.uuid.clone(), d.table.as_bytes())?;
    }
    let made = create(c, &name, uuid, table.as_bytes());
    if let (Err(_), Some(d)) = (&made, &dif) {
        let _ = call(c, &d.name, req("remove", &d.name), &[]);
    }
    made
}

/// `create` of one device of `open`, with the command line's
/// `--readonly` and `--allow`.
fn create(c: &Ctx, name: &str, uuid: String, table: &[u8]) -> Outcome {
    let mut r = req("create", name);
    r.has_table = true;
    r.readonly = c.a.has("readonly");
    r.uuid = Some(uuid);
    r.allow = c.a.str("allow").map(str::to_string);
    call(c, name, r, table)?;
    Ok(())
}

/// Create `name` on the server mapping the LUKS2 volume `uuid` of
/// `argv[0]` as `act` says (with the command line's dm-crypt flags), as
/// `open` does.
pub(super) fn create_luks2(
    c: &Ctx,
    name: &str,
    mut act: crate::luks::Activation,
    uuid: &str,
) -> Outcome {
    for f in flags(c).into_iter().rev() {
        if !act.options.contains(&f) {
            act.options.insert(0, f);
        }
    }
    let table = act.table(&super::ctx::table_dev(&c.argv[0]));
    let mut r = req("create", name);
    r.has_table = true;
    r.uuid = Some(format!("CRYPT-LUKS2-{}-{name}", uuid.replace('-', "")));
    r.allow = c.a.str("allow").map(str::to_string);
    call(c, name, r, table.as_bytes())?;
    Ok(())
}

pub(super) fn close(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    remove(c, name, c.a.has("deferred")).map_err(|e| match e {
        LuksError::Device(_) => LuksError::Device(format!("{name} (not active)")),
        e => e,
    })?;
    // The integrity device an authenticated volume's open put under it
    // (named and tagged as cryptsetup's: NAME_dif, CRYPT-INTEGRITY-…).
    let dif = integrity::dif_name(name);
    let ours = call(c, &dif, req("info", &dif), &[])
        .ok()
        .and_then(|(v, _)| v["devices"][0]["uuid"].as_str().map(str::to_string))
        .is_some_and(|u| u.starts_with("CRYPT-INTEGRITY-") && u.ends_with(&format!("-{dif}")));
    if ours {
        remove(c, &dif, c.a.has("deferred"))?;
    }
    Ok(())
}

/// The live crypt table of `name`, with its key (`--showkeys`) only when
/// the caller must rebuild the table: keys leave the server only when
/// asked for, and the masked key (zeros of the same length) still says the
/// key size.
fn live_table(
    c: &Ctx,
    name: &str,
    showkeys: bool,
) -> Result<(Value, Zeroizing<String>), LuksError> {
    let (info, _) = call(c, name, req("info", name), &[])?;
    let mut t = req("table", name);
    t.showkeys = showkeys;
    let (_, payload) = call(c, name, t, &[])?;
    let text = Zeroizing::new(String::from_utf8_lossy(&payload).into_owned());
    Ok((info["devices"][0].clone(), text))
}

/// Table lines read back through core's table grammar; the keys they may
/// hold are wiped on drop.
struct Lines(Vec<TableLine>);

impl Drop for Lines {
    fn drop(&mut self) {
        for l in &mut self.0 {
            l.args.iter_mut().for_each(zeroize::Zeroize::zeroize);
        }
    }
}

/// Parses the table the server gave for `name` (none for a device
/// without a table).
fn lines_of(name: &str, text: &str) -> Result<Lines, LuksError> {
    if text.trim().is_empty() {
        return Ok(Lines(Vec::new()));
    }
    table::parse(text).map(Lines).map_err(|e| {
        LuksError::Device(format!(
            "the table of {name} from the server does not parse: {e}"
        ))
    })
}

/// A crypt line's parameters, through the crypt target's own reader.
fn crypt_params(l: &TableLine) -> Option<CryptParams> {
    (l.target == crypt::TYPE.name)
        .then(|| CryptParams::parse(&l.args).ok())
        .flatten()
}

pub(super) fn status(c: &Ctx) -> Outcome {
    let arg = c.argv[0].as_str();
    // cryptsetup takes a name, a /dev/mapper path or a node
    // (`cli::devarg`); one that names no device is inactive.
    let Ok(name) = crate::cli::devarg::device_name(arg, || socket(c).map_err(|e| e.to_string()))
    else {
        println!("{} is inactive.", super::status::head(arg));
        return Err(LuksError::Silent(4));
    };
    let name = name.as_str();
    let (info, table) = match live_table(c, name, false) {
        Ok(x) => x,
        Err(LuksError::Device(_)) => {
            println!("{} is inactive.", super::status::head(arg));
            return Err(LuksError::Silent(4));
        }
        Err(e) => return Err(e),
    };
    let lines = lines_of(name, &table)?;
    let Some(p) = lines.0.first().and_then(crypt_params) else {
        println!("{} is active.", super::status::head(arg));
        return Ok(());
    };
    let uuid = info["uuid"].as_str().unwrap_or("");
    let ty = if uuid.starts_with("CRYPT-LUKS2") {
        "LUKS2"
    } else if uuid.starts_with("CRYPT-LUKS1") {
        "LUKS1"
    } else if uuid.starts_with("CRYPT-PLAIN") {
        "PLAIN"
    } else if uuid.starts_with("CRYPT-TCRYPT") {
        "TCRYPT"
    } else if uuid.starts_with("CRYPT-BITLK") {
        "BITLK"
    } else if uuid.starts_with("CRYPT-FVAULT2") {
        "FVAULT2"
    } else {
        "n/a"
    };
    let reencrypting = ty == "LUKS2" && in_reencryption(c, &p.device);
    // With a mapper directory the device is a file there: name it as
    // cryptsetup names /dev/mapper/NAME, and say where NBD clients find it.
    let file = info["file"].as_str().map(str::to_string);
    let report = super::status::Report {
        arg: file.as_deref().unwrap_or(arg),
        in_use: info["open_count"].as_u64().unwrap_or(0) > 0,
        ty,
        reencrypting,
        params: &p,
        keyring: lines.0[0].args.get(1).is_some_and(|k| k.starts_with(':')),
        size: lines.0.iter().map(|l| l.len).sum(),
        read_only: info["read_only"].as_bool().unwrap_or(false),
        suspended: info["suspended"].as_bool().unwrap_or(false),
        auth: authenticated(c, &p),
    };
    print!("{}", super::status::text(&report));
    if let (Some(_), Some(u)) = (&file, info["nbd_uri"].as_str()) {
        println!("  nbd uri: {u}");
    }
    Ok(())
}

/// An authenticated volume's status lines: the LUKS2 form of the crypt
/// line's cipher, and the data device the integrity device below names.
fn authenticated(c: &Ctx, p: &CryptParams) -> Option<super::status::Auth> {
    if p.options.integrity_tag == 0 {
        return None;
    }
    let (cipher, kind) = crate::luks::cipher::luks_form_of_authenticated(&p.cipher)?;
    let below = p.device.strip_prefix('@')?;
    let (_, payload) = call(c, below, req("table", below), &[]).ok()?;
    let lines = lines_of(below, &String::from_utf8_lossy(&payload)).ok()?;
    let device = lines
        .0
        .first()
        .filter(|l| l.target == crate::targets::integrity::TYPE.name)
        .and_then(|l| IntegrityParams::parse(&l.args).ok())
        .map_or_else(|| p.device.clone(), |ip| ip.dev);
    Some(super::status::Auth {
        cipher,
        kind,
        device,
    })
}

/// Whether the LUKS2 header of `device` (or `--header`) is in
/// reencryption; a header that cannot be read is not.
fn in_reencryption(c: &Ctx, device: &str) -> bool {
    let header = c.a.str("header").map(std::path::Path::new);
    crate::luks::volume::Volume::load(std::path::Path::new(device), header, false)
        .ok()
        .and_then(|v| crate::luks::reencrypt::status(&v).ok().flatten())
        .is_some()
}

pub(super) fn resize(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    let (_, table) = live_table(c, name, true)?;
    let mut lines = lines_of(name, &table)?;
    if lines.0.len() != 1 {
        return Err(LuksError::Unsupported(
            "resize of a device with more than one crypt segment".into(),
        ));
    }
    let Some(p) = crypt_params(&lines.0[0]) else {
        return Err(LuksError::Usage(format!(
            "{name} is not an active crypt device."
        )));
    };
    let new_len = match (c.a.u64("size"), c.a.u64("device-size")) {
        (Some(s), _) => s,
        (None, Some(b)) => b / 512,
        (None, None) => {
            // To the end of the backing file or device.
            let dev = std::path::Path::new(&p.device);
            let bytes = crate::luks::disk::Disk::open(dev, false)?.size()?;
            (bytes / 512).saturating_sub(p.offset)
        }
    };
    if new_len == 0 {
        return Err(LuksError::Usage("Device size must not be zero.".into()));
    }
    lines.0[0].len = new_len;
    let new = Zeroizing::new(lines.0[0].text() + "\n");
    let mut r = req("load", name);
    r.has_table = true;
    call(c, name, r, new.as_bytes())?;
    call(c, name, req("resume", name), &[])?;
    Ok(())
}

/// The active LUKS device `name` as luksSuspend/luksResume find it: its
/// info and the table lines of its crypt segments (keys masked), or
/// cryptsetup's error for a device that is not there.
fn active_luks(c: &Ctx, name: &str) -> Result<(Value, Lines), LuksError> {
    let info = match call(c, name, req("info", name), &[]) {
        Ok((v, _)) => v["devices"][0].clone(),
        Err(LuksError::Device(_)) => {
            eprintln!("Device {name} is not active.");
            return Err(LuksError::Silent(4));
        }
        Err(e) => return Err(e),
    };
    let (_, payload) = call(c, name, req("table", name), &[])?;
    let mut lines = lines_of(name, &String::from_utf8_lossy(&payload))?;
    lines.0.retain(|l| l.target == crypt::TYPE.name);
    Ok((info, lines))
}

/// A dm-crypt message to every crypt segment of `name` (a LUKS2 device
/// maps one key over every segment), the words in the payload: `key set`
/// carries the key.
fn crypt_message(c: &Ctx, name: &str, lines: &Lines, text: &[u8]) -> Outcome {
    for l in &lines.0 {
        let mut r = req("message", name);
        r.sector = l.start;
        call(c, name, r, text)?;
    }
    Ok(())
}

/// `luksSuspend NAME`: suspend (held requests wait, in-flight ones finish,
/// the device is flushed), then wipe the key of every crypt segment; a
/// failed wipe resumes the device again, as libcryptsetup does.
pub(super) fn luks_suspend(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    let (info, lines) = active_luks(c, name)?;
    let uuid = info["uuid"].as_str().unwrap_or("");
    if !uuid.starts_with("CRYPT-LUKS1-") && !uuid.starts_with("CRYPT-LUKS2-") || lines.0.is_empty()
    {
        return Err(LuksError::Usage(
            "This operation is supported only for LUKS device.".into(),
        ));
    }
    if info["suspended"].as_bool().unwrap_or(false) {
        return Err(LuksError::Usage(format!(
            "Volume {name} is already suspended."
        )));
    }
    if let Err(e) = call(c, name, req("suspend", name), &[]) {
        eprintln!("Error during suspending device {name}.");
        return Err(e);
    }
    if let Err(e) = crypt_message(c, name, &lines, b"key wipe") {
        let _ = call(c, name, req("resume", name), &[]);
        eprintln!("Error during suspending device {name}.");
        return Err(e);
    }
    Ok(())
}

/// `luksResume NAME`: unlock the header of the device's data device (or
/// `--header`) with a passphrase or key file, set the volume key into
/// every crypt segment, resume.
pub(super) fn luks_resume(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    let want = match c.device_type.as_deref() {
        None | Some("luks") => None,
        Some("luks1") => Some(1),
        Some("luks2") => Some(2),
        Some(_) => return Err(LuksError::Silent(1)),
    };
    let (info, lines) = active_luks(c, name)?;
    let data = lines.0.first().and_then(crypt_params).map(|p| p.device);
    let not_luks = || {
        LuksError::Usage(format!(
            "{name} is not active LUKS device name or header is missing."
        ))
    };
    let Some(data) = data else {
        return Err(not_luks());
    };
    let dev = ops::Device {
        path: PathBuf::from(&data),
        header: c.a.str("header").map(PathBuf::from),
        no_cost_limit: c.a.has("no-kdf-limit"),
        allow_weak_cipher: c.a.has("allow-weak-cipher"),
    };
    let fb = ui(c);
    let v = match dev.load(false, &fb) {
        Ok(v) => v,
        Err(LuksError::NotLuks(_)) => return Err(not_luks()),
        Err(e) => return Err(e),
    };
    if let Some(w) = want {
        if v.version() != w {
            return Err(LuksError::Usage(format!(
                "{name} is not active LUKS{w} device name."
            )));
        }
    }
    if !info["suspended"].as_bool().unwrap_or(false) {
        return Err(LuksError::Usage(format!("Volume {name} is not suspended.")));
    }
    let (slot, key) = ops::unlock(
        &v,
        &unlock_tokens_first(c),
        &format!("Enter passphrase for {}: ", dev.meta_path().display()),
    )?;
    c.verbose_msg(&format!("Key slot {slot} unlocked."));
    // "key set " and the key in hex, in one buffer sized up front and
    // wiped on drop.
    let mut text = Zeroizing::new(Vec::with_capacity(8 + 2 * key.len()));
    text.extend_from_slice(b"key set ");
    if key.is_empty() {
        text.push(b'-');
    }
    for b in key.iter() {
        text.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
    }
    let r = crypt_message(c, name, &lines, &text)
        .and_then(|()| call(c, name, req("resume", name), &[]).map(|_| ()));
    if let Err(e) = r {
        eprintln!("Error during resuming device {name}.");
        return Err(e);
    }
    Ok(())
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A device of a running server that follows an online reencryption
/// (`reencrypt --active-name NAME`): suspended around each hotzone, then
/// loaded with the volume's new multi-segment table and resumed.
pub(super) struct LiveCtl<'a> {
    c: &'a Ctx,
    name: String,
    data: String,
    options: Vec<&'static str>,
    sectors: Option<u64>,
    /// The device UUID, `CRYPT-LUKS2-<volume uuid>-NAME`.
    pub uuid: String,
}

/// Find `name` on the server: the data device its table names (a crypt
/// line's, or a linear line's while no data is encrypted yet), its
/// dm-crypt flags and its size.
pub(super) fn live_device<'a>(c: &'a Ctx, name: &str) -> Result<LiveCtl<'a>, LuksError> {
    let (info, _) = active_luks(c, name)?;
    let (_, payload) = call(c, name, req("table", name), &[])?;
    let lines = lines_of(name, &String::from_utf8_lossy(&payload))?;
    let crypt = lines.0.iter().find_map(crypt_params);
    let data = lines.0.iter().find_map(|l| match crypt_params(l) {
        Some(p) => Some(p.device),
        None if l.target == linear::TYPE.name => linear::device_of(&l.args).map(str::to_string),
        None => None,
    });
    let (true, Some(data)) = (
        info["uuid"]
            .as_str()
            .unwrap_or("")
            .starts_with("CRYPT-LUKS2-"),
        data,
    ) else {
        return Err(LuksError::Usage(format!(
            "Active device {name} is not LUKS2."
        )));
    };
    let sectors = Some(lines.0.iter().map(|l| l.len).sum());
    // The flags the reloaded tables keep (cryptsetup's activation flags:
    // not high_priority); the sector size comes from each segment instead.
    let options = crypt
        .map(|p| p.options.flags())
        .unwrap_or_default()
        .into_iter()
        .filter(|f| *f != "high_priority")
        .collect();
    Ok(LiveCtl {
        c,
        name: name.to_string(),
        data,
        options,
        sectors,
        uuid: info["uuid"].as_str().unwrap_or("").to_string(),
    })
}

impl crate::luks::reencrypt::Live for LiveCtl<'_> {
    fn suspend(&mut self) -> Result<(), LuksError> {
        call(self.c, &self.name, req("suspend", &self.name), &[]).map(|_| ())
    }

    fn reload(&mut self, table: &str) -> Result<(), LuksError> {
        let mut r = req("load", &self.name);
        r.has_table = true;
        call(self.c, &self.name, r, table.as_bytes())?;
        call(self.c, &self.name, req("resume", &self.name), &[]).map(|_| ())
    }

    fn data_device(&self) -> &str {
        &self.data
    }

    fn options(&self) -> Vec<&'static str> {
        self.options.clone()
    }

    fn resume(&mut self) -> Result<(), LuksError> {
        call(self.c, &self.name, req("resume", &self.name), &[]).map(|_| ())
    }

    fn sectors(&self) -> Option<u64> {
        self.sectors
    }
}
