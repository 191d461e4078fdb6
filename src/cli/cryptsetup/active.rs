//! Actions on active devices, as clients of a running `udm serve`'s
//! control socket (`$UDM_CONTROL`, `--control PATH`, or the default path):
//! `open` creates a named device and NBD export as `cryptsetup open`
//! creates /dev/mapper/NAME (with cryptsetup's device UUID,
//! `CRYPT-LUKS2-<uuid>-NAME` / `CRYPT-PLAIN-NAME`, so `status` can tell
//! what it is), `close` removes it, `status` prints cryptsetup's report,
//! `resize` and `refresh` reload its table.

use std::path::PathBuf;

use super::offline::{device, key_source, ui, unlock};
use super::{Ctx, Outcome};
use crate::control::proto::{Code, Request};
use crate::control::{Client, ClientError};
use crate::luks::error::LuksError;
use crate::luks::ops;
use crate::luks::plain::{self, PlainParams};
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

fn call(
    c: &Ctx,
    name: &str,
    req: Request,
    payload: &[u8],
) -> Result<(Value, Zeroizing<Vec<u8>>), LuksError> {
    let mut cl = Client::connect(&socket(c)?).map_err(|e| LuksError::Usage(e.to_string()))?;
    cl.call(req, payload).map_err(|e| client_err(name, e))
}

fn req(op: &str, name: &str) -> Request {
    Request {
        op: op.into(),
        names: vec![name.to_string()],
        ..Request::default()
    }
}

/// dm-crypt flags from `--allow-discards` and the `--perf-*` options, in
/// cryptsetup's order.
fn flags(c: &Ctx) -> Vec<&'static str> {
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

/// The table and device UUID `open` creates.
fn open_table(c: &Ctx, name: &str) -> Result<(Zeroizing<String>, String), LuksError> {
    let ty = c.device_type.as_deref().unwrap_or("luks");
    let data = c.argv[0].clone();
    let dev_arg = crate::core::table::escape_arg(&data);
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
    v.check_requirements()?;
    let (slot, key) = match c.a.str("volume-key-file") {
        Some(f) => {
            let len = match &v.header {
                crate::luks::volume::Header::Luks1(h) => h.key_bytes as usize,
                crate::luks::volume::Header::Luks2(h) => h
                    .meta
                    .keyslots
                    .values()
                    .next()
                    .map(|k| k.key_size as usize)
                    .or(c.a.u32("key-size").map(|b| (b / 8) as usize))
                    .unwrap_or(64),
            };
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
            &unlock(c),
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
    Ok((act.table(&dev_arg), uuid))
}

pub(super) fn open(c: &Ctx) -> Outcome {
    let refresh = c.a.has("refresh");
    let name = if refresh {
        c.argv.get(1).unwrap_or(&c.argv[0]).clone()
    } else {
        c.argv[1].clone()
    };
    let (table, uuid) = open_table(c, &name)?;
    if refresh {
        let mut r = req("load", &name);
        r.has_table = true;
        call(c, &name, r, table.as_bytes())?;
        call(c, &name, req("resume", &name), &[])?;
        return Ok(());
    }
    let mut r = req("create", &name);
    r.has_table = true;
    r.readonly = c.a.has("readonly");
    r.uuid = Some(uuid);
    call(c, &name, r, table.as_bytes())?;
    Ok(())
}

pub(super) fn close(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    let mut r = req("remove", name);
    r.deferred = c.a.has("deferred");
    call(c, name, r, &[]).map_err(|e| match e {
        LuksError::Device(_) => LuksError::Device(format!("{name} (not active)")),
        e => e,
    })?;
    Ok(())
}

/// The live crypt table of `name` with its key (`--showkeys`).
fn live_table(c: &Ctx, name: &str) -> Result<(Value, Zeroizing<String>), LuksError> {
    let (info, _) = call(c, name, req("info", name), &[])?;
    let mut t = req("table", name);
    t.showkeys = true;
    let (_, payload) = call(c, name, t, &[])?;
    let text = Zeroizing::new(String::from_utf8_lossy(&payload).into_owned());
    Ok((info["devices"][0].clone(), text))
}

pub(super) fn status(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    let (info, table) = match live_table(c, name) {
        Ok(x) => x,
        Err(LuksError::Device(_)) => {
            println!("/dev/mapper/{name} is inactive.");
            return Err(LuksError::Silent(4));
        }
        Err(e) => return Err(e),
    };
    let line = table.lines().next().unwrap_or("");
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 || f[2] != "crypt" {
        println!("/dev/mapper/{name} is active.");
        return Ok(());
    }
    let uuid = info["uuid"].as_str().unwrap_or("");
    let ty = if uuid.starts_with("CRYPT-LUKS2") {
        "LUKS2"
    } else if uuid.starts_with("CRYPT-LUKS1") {
        "LUKS1"
    } else if uuid.starts_with("CRYPT-PLAIN") {
        "PLAIN"
    } else {
        "n/a"
    };
    let size: u64 = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    let ss = f
        .iter()
        .find_map(|o| o.strip_prefix("sector_size:"))
        .unwrap_or("512");
    let suspended = info["suspended"].as_bool().unwrap_or(false);
    println!(
        "/dev/mapper/{name} is active{}.",
        if info["open_count"].as_u64().unwrap_or(0) > 0 {
            " and is in use"
        } else {
            ""
        }
    );
    println!("  type:    {ty}");
    println!("  cipher:  {}", f[3]);
    println!("  keysize: {} bits", f[4].len() / 2 * 8);
    println!("  key location: dm-crypt");
    println!("  device:  {}", f[6]);
    println!("  sector size:  {ss}");
    println!("  offset:  {} sectors", f[7]);
    println!("  size:    {size} sectors");
    if suspended {
        println!("  mode:    suspended");
    } else if info["read_only"].as_bool().unwrap_or(false) {
        println!("  mode:    readonly");
    } else {
        println!("  mode:    read/write");
    }
    for o in [
        "allow_discards",
        "same_cpu_crypt",
        "submit_from_crypt_cpus",
        "no_read_workqueue",
        "no_write_workqueue",
    ] {
        if f.contains(&o) {
            println!("  flags:   {}", o.replace('_', "-"));
        }
    }
    Ok(())
}

pub(super) fn resize(c: &Ctx) -> Outcome {
    let name = &c.argv[0];
    let (_, table) = live_table(c, name)?;
    let lines: Vec<&str> = table.lines().collect();
    if lines.len() != 1 {
        return Err(LuksError::Unsupported(
            "resize of a device with more than one crypt segment".into(),
        ));
    }
    let mut f: Vec<String> = lines[0].split_whitespace().map(str::to_string).collect();
    if f.len() < 8 || f[2] != "crypt" {
        return Err(LuksError::Usage(format!(
            "{name} is not an active crypt device."
        )));
    }
    let new_len = match (c.a.u64("size"), c.a.u64("device-size")) {
        (Some(s), _) => s,
        (None, Some(b)) => b / 512,
        (None, None) => {
            // To the end of the backing file or device.
            let dev = std::path::Path::new(&f[6]);
            let bytes = crate::luks::disk::Disk::open(dev, false)?.size()?;
            let off: u64 = f[7].parse().unwrap_or(0);
            (bytes / 512).saturating_sub(off)
        }
    };
    if new_len == 0 {
        return Err(LuksError::Usage("Device size must not be zero.".into()));
    }
    f[1] = new_len.to_string();
    let new = Zeroizing::new(f.join(" ") + "\n");
    f.iter_mut().for_each(zeroize::Zeroize::zeroize);
    let mut r = req("load", name);
    r.has_table = true;
    call(c, name, r, new.as_bytes())?;
    call(c, name, req("resume", name), &[])?;
    Ok(())
}
