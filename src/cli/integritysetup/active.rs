//! `open`, `close` and `status` on a running `udm serve`, through its
//! control socket: `open` creates a device with an `integrity` table
//! (device UUID `CRYPT-INTEGRITY-<name>`, as libcryptsetup names it) and
//! so an NBD export of that name.

use std::path::PathBuf;

use serde_json::Value;

use super::args::Args;
use super::offline::{alg, data_device, journal_bytes, open_dev, read_superblock};
use super::{Fail, Outcome};
use crate::control::proto::{Code, Request};
use crate::control::{Client, ClientError};
use crate::core::table;
use crate::targets::integrity::params::{AlgSpec, IntegrityParams, Mode, Options};
use crate::targets::integrity::superblock::{flags, Superblock};

fn socket(a: &Args) -> Result<PathBuf, Fail> {
    if let Some(p) = a.str("control") {
        return Ok(PathBuf::from(p));
    }
    crate::control::default_path().ok_or_else(|| {
        Fail::usage(
            "no udm control socket: start `udm serve --control PATH` and give PATH with \
             --control or $UDM_CONTROL",
        )
    })
}

fn client_err(name: &str, e: ClientError) -> Fail {
    match e.code {
        Some(Code::Eexist) => Fail::new(5, format!("Device {name} already exists.")),
        Some(Code::Ebusy) => Fail::new(5, format!("Device {name} is still in use ({e}).")),
        Some(Code::Enxio) => Fail::new(4, format!("Device {name} is not active.")),
        Some(Code::Eperm) => Fail::new(2, e.to_string()),
        _ => Fail::usage(e.to_string()),
    }
}

fn call(a: &Args, name: &str, req: Request, payload: &[u8]) -> Result<(Value, Vec<u8>), Fail> {
    let mut cl = Client::connect(&socket(a)?).map_err(|e| Fail::usage(e.to_string()))?;
    cl.call(req, payload)
        .map(|(v, p)| (v, p.to_vec()))
        .map_err(|e| client_err(name, e))
}

fn req(op: &str, name: &str) -> Request {
    Request {
        op: op.into(),
        names: vec![name.to_string()],
        ..Request::default()
    }
}

fn mode(a: &Args) -> Result<Mode, Fail> {
    let picked: Vec<Mode> = [
        ("integrity-no-journal", Mode::Direct),
        ("integrity-bitmap-mode", Mode::Bitmap),
        ("integrity-recovery-mode", Mode::Recovery),
    ]
    .into_iter()
    .filter(|(f, _)| a.has(f))
    .map(|(_, m)| m)
    .collect();
    match picked[..] {
        [] => Ok(Mode::Journal),
        [m] => Ok(m),
        _ => Err(Fail::usage(
            "Only one of --integrity-no-journal, --integrity-bitmap-mode and \
             --integrity-recovery-mode is allowed.",
        )),
    }
}

/// The table line integritysetup would load for this superblock.
fn params(a: &Args, path: &str, sb: &Superblock) -> Result<IntegrityParams, Fail> {
    let h = alg(a)?;
    let mut o = Options {
        block_size: (sb.sector_size() != 512).then_some(sb.sector_size()),
        allow_discards: a.has("allow-discards"),
        fix_padding: sb.has(flags::FIXED_PADDING),
        fix_hmac: sb.has(flags::FIXED_HMAC),
        recalculate: a.has("integrity-recalculate"),
        reset_recalculate: a.has("integrity-recalculate-reset"),
        legacy_recalculate: a.has("integrity-legacy-recalculate"),
        internal_hash: h.as_ref().map(|h| AlgSpec {
            name: h.name().to_string(),
            key: h.key().map(|k| zeroize::Zeroizing::new(k.to_vec())),
        }),
        ..Options::default()
    };
    (o.journal_crypt, o.journal_mac) = super::offline::journal_algs(a)?;
    o.journal_watermark = a.u32("journal-watermark")?;
    o.commit_time = a.u32("journal-commit-time")?;
    o.buffer_sectors = a.u32("buffer-sectors")?;
    o.sectors_per_bit = a.u64("bitmap-sectors-per-bit")?;
    o.bitmap_flush_interval = a.u32("bitmap-flush-time")?;
    Ok(IntegrityParams {
        dev: path.to_string(),
        offset: 0,
        tag_size: Some(u32::from(sb.tag_size)),
        mode: mode(a)?,
        opts: o,
    })
}

pub(super) fn open(a: &Args) -> Outcome {
    let (path, name) = (&a.pos[1], &a.pos[2]);
    let dev = open_dev(path, true)?;
    let sb = read_superblock(&*dev, path)?;
    // The server resolves the path from its own directory.
    let absolute = |p: &str| {
        std::fs::canonicalize(p).map_or_else(|_| p.to_string(), |f| f.display().to_string())
    };
    let full = absolute(path);
    let mut p = params(a, &full, &sb)?;
    // With --data-device the positional device holds the metadata: the
    // table maps the data device, with the metadata as `meta_device`.
    if let Some(data) = data_device(a, path) {
        p.opts.meta_device = Some(full);
        p.dev = absolute(data);
    }
    let line = format!(
        "0 {} integrity {}",
        sb.provided_data_sectors,
        p.table_args(true)
    );
    let line = zeroize::Zeroizing::new(line);
    let mut r = req("create", name);
    r.has_table = true;
    r.readonly = p.mode == Mode::Recovery;
    r.uuid = Some(format!("CRYPT-INTEGRITY-{name}"));
    r.allow = a.str("allow").map(str::to_string);
    call(a, name, r, line.as_bytes())?;
    Ok(())
}

pub(super) fn close(a: &Args) -> Outcome {
    let name = &a.pos[1];
    let mut r = req("remove", name);
    r.deferred = a.has("deferred");
    call(a, name, r, &[])?;
    Ok(())
}

pub(super) fn status(a: &Args) -> Outcome {
    let name = &a.pos[1];
    let path = format!("/dev/mapper/{name}");
    let st = match call(a, name, req("status", name), &[]) {
        Ok((v, _)) => v,
        Err(f) if f.code == 4 => {
            println!("{path} is inactive.");
            return Err(Fail::new(4, ""));
        }
        Err(f) => return Err(f),
    };
    let dev = &st["devices"][0];
    let (_, text) = call(a, name, req("table", name), &[])?;
    let text = String::from_utf8_lossy(&text);
    let lines = table::parse(&text).map_err(|e| {
        Fail::usage(format!(
            "the table of {name} from the server does not parse: {e}"
        ))
    })?;
    let in_use = dev["open_count"].as_u64().unwrap_or(0) > 0;
    println!(
        "{path} is active{}.",
        if in_use { " and is in use" } else { "" }
    );
    let Some((l, p)) = lines
        .first()
        .filter(|l| l.target == "integrity")
        .and_then(|l| IntegrityParams::parse(&l.args).ok().map(|p| (l, p)))
    else {
        return Ok(());
    };
    let failures = dev["targets"][0]["status"]
        .as_str()
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or("0")
        .to_string();
    print_status(&p, l.len, &failures);
    Ok(())
}

fn print_status(p: &IntegrityParams, sectors: u64, failures: &str) {
    println!("  type:    INTEGRITY");
    println!("  tag size: {}", p.tag_size.unwrap_or(0));
    let h = p
        .opts
        .internal_hash
        .as_ref()
        .map_or("(none)", |h| h.name.as_str());
    println!("  integrity: {h}");
    let meta = p.opts.meta_device.as_deref();
    let detached = if meta.is_some() { " (detached)" } else { "" };
    println!("  device:  {}{detached}", p.dev);
    if let Some(m) = meta {
        println!("  metadata device:  {m}");
    }
    println!("  sector size:  {} bytes", p.opts.block_size.unwrap_or(512));
    // The kernel's: 1 (2^0) with a separate metadata device.
    let interleave = match meta {
        Some(_) => 1,
        None => p.opts.interleave_sectors.unwrap_or(32768),
    };
    println!("  interleave sectors: {interleave}");
    println!("  size:    {sectors} sectors");
    let rw = if p.mode == Mode::Recovery {
        "readonly"
    } else {
        "read/write"
    };
    println!("  mode:    {rw}");
    println!("  failures: {failures}");
    let sb_path = meta.unwrap_or(&p.dev);
    let sb = open_dev(sb_path, true)
        .ok()
        .and_then(|dev| read_superblock(&*dev, sb_path).ok());
    if p.mode == Mode::Bitmap {
        // The line's, else the superblock's (the format's default).
        let per_bit = p.opts.sectors_per_bit.unwrap_or_else(|| {
            sb.as_ref().map_or(0, |sb| {
                u64::from(sb.sector_size() / 512) << sb.log2_blocks_per_bitmap_bit
            })
        });
        println!("  bitmap 512-byte sectors per bit: {per_bit}");
        println!(
            "  bitmap flush interval: {} ms",
            p.opts.bitmap_flush_interval.unwrap_or(10000)
        );
    }
    if let Some(sb) = &sb {
        println!("  journal size: {} bytes", journal_bytes(sb));
    }
    if p.mode == Mode::Journal {
        println!(
            "  journal watermark: {}%",
            p.opts.journal_watermark.unwrap_or(50)
        );
        println!(
            "  journal commit time: {} ms",
            p.opts.commit_time.unwrap_or(10000)
        );
    }
}
