//! `open`, `close`, `status` and `resize` on a running `udm serve`,
//! through its control socket: `open` creates a device with an
//! `integrity` table (device UUID `CRYPT-INTEGRITY-<name>`, as
//! libcryptsetup names it) and so an NBD export of that name.

use super::args::Args;
use super::offline::{alg, data_device, journal_bytes, open_dev, read_superblock};
use super::{Fail, Outcome, Wording};
use crate::cli::setup_shell::{active_status, call, req};
use crate::core::{table, BlockDevice, WriteBuf};
use crate::targets::integrity::layout::{log2_buffer_of, Geometry};
use crate::targets::integrity::params::{AlgSpec, IntegrityParams, Mode, Options};
use crate::targets::integrity::superblock::{flags, Superblock};

/// The mode the flags pick, as libcryptsetup picks it: recovery, else
/// bitmap, else direct (`-D` with `-B` is bitmap mode), else journal.
fn mode(a: &Args) -> Result<Mode, Fail> {
    let (r, b) = (
        a.has("integrity-recovery-mode"),
        a.has("integrity-bitmap-mode"),
    );
    if r && b {
        return Err(Fail::usage(
            "Recovery and bitmap mode options are mutually exclusive.",
        ));
    }
    Ok(if r {
        Mode::Recovery
    } else if b {
        Mode::Bitmap
    } else if a.has("integrity-no-journal") {
        Mode::Direct
    } else {
        Mode::Journal
    })
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

/// A name device-mapper cannot take (a `/`, or longer than its 127
/// bytes), refused before anything is read, as libcryptsetup does.
fn check_name(name: &str) -> Outcome {
    if name.is_empty() || name.contains('/') || name.len() > 127 || name == "." || name == ".." {
        return Err(Fail::usage(format!(
            "Device name {name} is invalid: use at most 127 characters and no '/'."
        )));
    }
    Ok(())
}

pub(super) fn open(a: &Args) -> Outcome {
    let (path, name) = (&a.pos[1], &a.pos[2]);
    check_name(name)?;
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
    // As libcryptsetup: a recovery-mode device is not read-only in dm's
    // eyes (the target refuses writes itself), so status says
    // "read/write recovery".
    r.readonly = false;
    r.uuid = Some(format!("CRYPT-INTEGRITY-{name}"));
    r.allow = a.str("allow").map(str::to_string);
    call(a, name, r, line.as_bytes())?;
    Ok(())
}

pub(super) fn status(a: &Args) -> Outcome {
    let (dev, lines) = active_status(a, &a.pos[1])?;
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
    print_status(&p, l.len, &failures, super::wording());
    Ok(())
}

/// Units as each integritysetup writes them.
struct Units(Wording);

impl Units {
    fn bytes(&self, n: u64) -> String {
        match self.0 {
            Wording::V2_6 => format!("{n} bytes"),
            Wording::V2_8 => format!("{n} [bytes]"),
        }
    }
    fn ms(&self, n: u64) -> String {
        match self.0 {
            Wording::V2_6 => format!("{n} ms"),
            Wording::V2_8 => format!("{n} [ms]"),
        }
    }
    fn tag(&self, n: u32) -> String {
        match self.0 {
            Wording::V2_6 => n.to_string(),
            Wording::V2_8 => format!("{n} [bytes]"),
        }
    }
    fn sectors(&self, n: u64) -> String {
        match self.0 {
            Wording::V2_6 => format!("{n} sectors"),
            Wording::V2_8 => format!("{n} [512-byte units] ({} [bytes])", n.saturating_mul(512)),
        }
    }
}

/// integritysetup's report of an active device, from its table (and the
/// superblock for what the table leaves to it), line for line.
fn print_status(p: &IntegrityParams, sectors: u64, failures: &str, w: Wording) {
    let u = Units(w);
    // With a metadata device the superblock (and the table's offset) is
    // on it, not on the data device.
    let sb_path = p.opts.meta_device.as_deref().unwrap_or(&p.dev);
    let sb = open_dev(sb_path, true)
        .ok()
        .and_then(|dev| read_superblock_at(&*dev, sb_path, p.offset).ok());
    println!("  type:    INTEGRITY");
    println!("  tag size: {}", u.tag(p.tag_size.unwrap_or(0)));
    let h = p
        .opts
        .internal_hash
        .as_ref()
        .map_or("(none)", |h| h.name.as_str());
    println!("  integrity: {h}");
    // integritysetup 2.6.1 says "(detached)" too, as 2.8 does.
    let detached = if p.opts.meta_device.is_some() {
        " (detached)"
    } else {
        ""
    };
    println!("  device:  {}{detached}", p.dev);
    if let Some(m) = &p.opts.meta_device {
        println!("  metadata device:  {m}");
    }
    let block = p.opts.block_size.unwrap_or(512);
    println!("  sector size:  {}", u.bytes(u64::from(block)));
    // The kernel's: 1 (2^0) with a separate metadata device, whatever
    // the line says.
    let interleave = match &p.opts.meta_device {
        Some(_) => 1,
        None => p.opts.interleave_sectors.unwrap_or_else(|| {
            sb.as_ref()
                .map_or(32768, |sb| 1 << sb.log2_interleave_sectors)
        }),
    };
    println!("  interleave sectors: {interleave}");
    println!("  size:    {}", u.sectors(sectors));
    let recovery = if p.mode == Mode::Recovery {
        " recovery"
    } else {
        ""
    };
    println!("  mode:    read/write{recovery}");
    println!("  failures: {failures}");
    let journal = sb.as_ref().map_or(0, journal_bytes);
    print_journal(p, &u, sb.as_ref(), journal);
    if p.opts.allow_discards {
        println!("  flags: discards ");
    }
}

/// The bitmap and journal lines. libcryptsetup reads a bitmap-mode
/// line's `sectors_per_bit` and `bitmap_flush_interval` into the journal
/// watermark and commit time, so integritysetup prints them twice there.
fn print_journal(p: &IntegrityParams, u: &Units, sb: Option<&Superblock>, journal: u64) {
    let o = &p.opts;
    let (watermark, commit) = if p.mode == Mode::Bitmap {
        // The line's, else the superblock's (the format's default).
        let per_bit = o.sectors_per_bit.unwrap_or_else(|| {
            sb.map_or(0, |sb| {
                u64::from(sb.sector_size() / 512) << sb.log2_blocks_per_bitmap_bit
            })
        });
        let flush = u64::from(o.bitmap_flush_interval.unwrap_or(10000));
        println!("  bitmap 512-byte sectors per bit: {per_bit}");
        println!("  bitmap flush interval: {}", u.ms(flush));
        (per_bit, flush)
    } else {
        (
            u64::from(o.journal_watermark.unwrap_or(50)),
            u64::from(o.commit_time.unwrap_or(10000)),
        )
    };
    if p.mode == Mode::Direct {
        println!("  journal: not active");
        return;
    }
    println!("  journal size: {}", u.bytes(journal));
    println!("  journal watermark: {watermark}%");
    println!("  journal commit time: {}", u.ms(commit));
    if let Some(m) = &o.journal_mac {
        println!("  journal integrity MAC: {}", m.name);
    }
    if let Some(c) = &o.journal_crypt {
        println!("  journal encryption: {}", c.name);
    }
}

/// The superblock at `offset` sectors of `dev`.
fn read_superblock_at(dev: &dyn BlockDevice, path: &str, offset: u64) -> Result<Superblock, Fail> {
    if offset == 0 {
        return read_superblock(dev, path);
    }
    let mut b = vec![0u8; 512];
    dev.read(offset * 512, &mut b)
        .map_err(|e| Fail::new(4, format!("Cannot read superblock on device {path}: {e}.")))?;
    match Superblock::parse(&b) {
        Ok(Some(sb)) => Ok(sb),
        _ => Err(Fail::usage(format!(
            "No integrity superblock detected on {path}."
        ))),
    }
}

/// The active line of `name` with its keys: its length and values.
fn live_line(a: &Args, name: &str) -> Result<(u64, IntegrityParams), Fail> {
    let mut r = req("table", name);
    r.showkeys = true;
    let (_, text) = call(a, name, r, &[])?;
    let text = zeroize::Zeroizing::new(String::from_utf8_lossy(&text).into_owned());
    let lines = table::parse(&text)
        .map_err(|e| Fail::usage(format!("the table of {name} does not parse: {e}")))?;
    match &lines[..] {
        [l] if l.target == "integrity" => IntegrityParams::parse(&l.args)
            .map(|p| (l.len, p))
            .map_err(|e| Fail::usage(format!("the table of {name}: {}", e.msg))),
        _ => Err(Fail::usage(format!(
            "Device {name} is not an active INTEGRITY device."
        ))),
    }
}

/// `--device-size` in 512-byte sectors; `None` for none or 0 (the most
/// the device holds).
fn wanted_sectors(a: &Args) -> Result<Option<u64>, Fail> {
    let Some(v) = a.str("device-size") else {
        return Ok(None);
    };
    let bytes = crate::core::units::parse_size(v).map_err(|e| {
        Fail::usage(format!(
            "Invalid size specification in parameter --device-size: {e}."
        ))
    })?;
    if bytes % 512 != 0 {
        return Err(Fail::usage(format!(
            "Device size {bytes} is not a multiple of 512 bytes (--device-size)."
        )));
    }
    Ok((bytes != 0).then_some(bytes / 512))
}

/// `resize NAME [--device-size BYTES] [--wipe]`: the same line loaded
/// with the new length (0 or none: all the device now provides, which
/// grows with it). A grown area's tags are recomputed by the target
/// (`recalculate`), or, with `--wipe`, its sectors written with zeros
/// through the device, as integritysetup 2.7 does.
pub(super) fn resize(a: &Args) -> Outcome {
    let name = &a.pos[1];
    let (old, mut p) = live_line(a, name)?;
    let max = max_sectors(&p)?;
    let new = wanted_sectors(a)?.unwrap_or(max);
    if new > max {
        return Err(Fail::usage(format!(
            "Not enough space on {} for {new} sectors: it provides {max}.",
            p.dev
        )));
    }
    let wipe = a.has("wipe") && new > old;
    if new > old && !wipe && p.opts.internal_hash.is_some() {
        p.opts.recalculate = true;
    }
    let line = zeroize::Zeroizing::new(format!("0 {new} integrity {}", p.table_args(true)));
    let mut r = req("load", name);
    r.has_table = true;
    call(a, name, r, line.as_bytes())?;
    call(a, name, req("resume", name), &[])?;
    if wipe {
        wipe_range(a, name, old, new)?;
    }
    Ok(())
}

/// The most sectors the line's devices provide now. With a metadata
/// device the superblock is there and the data device's whole blocks
/// count, as far as their tags fit the metadata device.
fn max_sectors(p: &IntegrityParams) -> Result<u64, Fail> {
    let sb_path = p.opts.meta_device.as_deref().unwrap_or(&p.dev);
    let meta = open_dev(sb_path, true)?;
    let sb = read_superblock_at(&*meta, sb_path, p.offset)?;
    let g = match &p.opts.meta_device {
        None => Geometry::of(&sb, p.offset, meta.size() / 512),
        Some(_) => {
            let data = open_dev(&p.dev, true)?;
            let log2_buffer = log2_buffer_of(p.opts.buffer_sectors);
            Geometry::of_separate(
                &sb,
                p.offset,
                meta.size() / 512,
                data.size() / 512,
                log2_buffer,
            )
        }
    };
    g.map(|g| g.provided_data_sectors)
        .map_err(|e| Fail::usage(format!("{sb_path}: {e}")))
}

/// Zeros over sectors `from..to` of the active device, through its NBD
/// export, so the target writes their tags.
fn wipe_range(a: &Args, name: &str, from: u64, to: u64) -> Outcome {
    let (v, _) = call(a, name, req("info", name), &[])?;
    let uri = v["devices"][0]["nbd_uri"].as_str().ok_or_else(|| {
        Fail::usage(format!(
            "Device {name} has no NBD export to wipe through: resize without --wipe."
        ))
    })?;
    let flags = crate::store::OpenFlags::default();
    let dev = crate::store::open(uri, flags)
        .map_err(|e| Fail::new(4, format!("Cannot open {uri} to wipe: {e}.")))?;
    let io = |e| Fail::new(4, format!("Cannot wipe device {name}: {e}."));
    let chunk = vec![0u8; 1 << 20];
    let (mut at, end) = (from * 512, to * 512);
    while at < end {
        let n = (end - at).min(chunk.len() as u64) as usize;
        dev.write(at, WriteBuf::Borrowed(&chunk[..n]), false)
            .map_err(io)?;
        at += n as u64;
    }
    dev.flush().map_err(io)
}
