//! `cryptsetup reencrypt`: argv to `luks::reencrypt`. Starts a re-key
//! (`--cipher`, `--key-size`, `--sector-size`, new volume key), an
//! `--encrypt` or `--decrypt` (detached header; or, with `--header NEW`
//! naming no file, a volume whose header is on the device: the header
//! moves to NEW and the data back to byte 0), or resumes one that
//! either program started; `--init-only` writes the metadata and stops,
//! `--resume-only` refuses to start a new one. `--active-name NAME`
//! reencrypts online: NAME, a device of a running `udm serve` (control
//! socket), is suspended around each hotzone and reloaded with the
//! volume's new multi-segment table after it, so its NBD clients keep
//! reading and writing correct data; data shifts too, as cryptsetup 2.6
//! allows them online (a decryption with data shift starts online; an
//! encryption starts offline and `--encrypt DEVICE NAME` then creates
//! NAME on the server and goes on online). SIGINT/SIGTERM stop after
//! the current hotzone, leaving resumable metadata. Progress: a bar on a
//! terminal, or cryptsetup's lines on stdout every `--progress-frequency`
//! seconds, or its JSON lines with `--progress-json` (`progress.rs`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use super::ctx::{device, key_source, pbkdf, ui, Ctx, Outcome};
use crate::cli::ui::Ui;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::ops::format::{default_key_bits, luks_format, FormatOpts};
use crate::luks::passphrase::KeySource;
use crate::luks::reencrypt::{self, InitParams, Live, Mode, Outcome as Done};
use crate::luks::volume::Volume;

/// Set by SIGINT/SIGTERM (through `signal-hook`); the engine checks it
/// between hotzones.
static STOP: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

fn install_handlers() {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&STOP)) {
            tracing::warn!("cannot catch signal {sig} ({e}); it will stop udm mid-hotzone");
        }
    }
}

/// Progress as cryptsetup reports it, on stderr.
struct Progress {
    ui: Ui,
    every: Option<u64>,
    /// `--progress-json`: the device the JSON lines name.
    json: Option<String>,
    quiet: bool,
    total: Cell<u64>,
    start: Instant,
    last: Cell<Option<Instant>>,
    first: Cell<u64>,
    /// Test hook: request a stop after this many hotzones.
    stop_after: Cell<Option<u64>>,
    steps: Cell<u64>,
}

impl Feedback for Progress {
    fn begin(&self, what: &str, total: u64) {
        self.total.set(total);
        self.first.set(u64::MAX);
        if self.every.is_none() && self.json.is_none() && !self.quiet {
            self.ui.begin(what, total);
        }
    }
    fn advance(&self, done: u64) {
        if self.first.get() == u64::MAX {
            self.first.set(done);
            // cryptsetup's first report only starts the clock.
            self.last.set(Some(Instant::now()));
        } else {
            self.steps.set(self.steps.get() + 1);
            if self.stop_after.get().is_some_and(|n| self.steps.get() >= n) {
                STOP.store(true, Ordering::Relaxed);
            }
        }
        // cryptsetup: every --progress-frequency seconds, JSON every half
        // second without it, else the terminal bar.
        let every = match (self.every, &self.json) {
            (Some(e), _) => std::time::Duration::from_secs(e),
            (None, Some(_)) => std::time::Duration::from_millis(500),
            (None, None) => {
                if !self.quiet {
                    self.ui.advance(done);
                }
                return;
            }
        };
        let now = Instant::now();
        let due = self
            .last
            .get()
            .is_none_or(|l| now.duration_since(l) >= every);
        let total = self.total.get().max(1);
        if !due && done < total {
            return;
        }
        self.last.set(Some(now));
        let elapsed = now.duration_since(self.start);
        let secs = elapsed.as_secs_f64().max(1e-3);
        let bps = done.saturating_sub(self.first.get()) as f64 / secs;
        let us = elapsed.as_micros() as u64;
        let text = match &self.json {
            Some(dev) => super::progress::json(dev, done, total, bps, us),
            None if self.quiet => return,
            None => super::progress::line(done, total, bps, us),
        };
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
    fn end(&self) {
        self.ui.end();
    }
    fn confirm(&self, q: &str) -> Result<bool, LuksError> {
        self.ui.confirm(q)
    }
    fn warn(&self, m: &str) {
        self.ui.warn(m)
    }
    fn notice(&self, m: &str) {
        self.ui.notice(m)
    }
}

/// The new LUKS2 header `--encrypt` writes over a plaintext device: the
/// cipher, key size, sector size and labels of the command line, data at
/// `offset_sectors` (0 with a detached header, the shift's size on the
/// device).
fn encrypt_format(
    c: &Ctx,
    dev: &crate::luks::ops::Device,
    key: &crate::luks::passphrase::KeySource,
    slot: Option<u32>,
    offset_sectors: u64,
) -> FormatOpts {
    let cipher = c.a.str("cipher").unwrap_or("aes-xts-plain64").to_string();
    FormatOpts {
        dev: dev.clone(),
        key: key.clone(),
        version: 2,
        key_bits: Some(
            c.a.u32("key-size")
                .unwrap_or_else(|| default_key_bits(&cipher)),
        ),
        cipher: Some(cipher),
        sector_size: Some(c.a.u32("sector-size").unwrap_or(512)),
        label: c.a.str("label").map(str::to_string),
        subsystem: c.a.str("subsystem").map(str::to_string),
        uuid: c.a.str("uuid").map(str::to_string),
        offset_sectors: Some(offset_sectors),
        metadata_size: c.a.u64("luks2-metadata-size"),
        keyslots_size: c.a.u64("luks2-keyslots-size"),
        key_slot: slot,
        pbkdf: pbkdf(c),
        ..FormatOpts::default()
    }
}

fn not_in_progress() -> LuksError {
    LuksError::Usage("Device reencryption not in progress.".into())
}

fn unsupported(what: &str) -> LuksError {
    LuksError::Unsupported(what.into())
}

/// The served device `name` (`--active-name`); one that is not active
/// fails as cryptsetup's reencrypt does, exit 1.
fn active<'a>(c: &'a Ctx, name: &str) -> Result<super::active::LiveCtl<'a>, LuksError> {
    match super::active::live_device(c, name) {
        Err(LuksError::Silent(_)) => Err(LuksError::Silent(1)),
        r => r,
    }
}

/// cryptsetup's refusal of `--encrypt --active-name` for a device that
/// is not in reencryption: the active device is LUKS already (an
/// encryption starts offline, over the plaintext device), exit 1.
fn already_luks(dev: &crate::luks::ops::Device) -> LuksError {
    let what = dev.header.as_deref().unwrap_or(&dev.path);
    LuksError::Usage(format!(
        "Device {} is already LUKS device. Aborting operation.",
        what.display()
    ))
}

pub(super) fn run(c: &Ctx) -> Outcome {
    check_args(c)?;
    let fb = progress(c);
    if let Some(name) = c.a.str("active-name") {
        // Online: the served device must exist before anything changes
        // (cryptsetup: "Device NAME is not active.", exit 1).
        active(c, name)?;
    }
    let dev = device(c);
    let hotzone = c.a.u64("hotzone-size");
    let key = key_source(c, c.a.str("key-file"));
    let slot = c.a.i32("key-slot").map(|s| s as u32);
    let prompt = format!("Enter passphrase for {}: ", dev.meta_path().display());

    if c.a.has("encrypt") && dev.header.is_none() {
        return encrypt_shift(c, &dev, &key, slot, &prompt, hotzone, &fb);
    }
    if c.a.has("encrypt") {
        return encrypt_detached(c, &dev, &key, slot, &prompt, hotzone, &fb);
    }

    if c.a.has("decrypt") {
        if let Some(h) = &dev.header {
            if std::fs::symlink_metadata(h).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            {
                return decrypt_shift(c, &dev, h, &key, slot, hotzone, &fb);
            }
        }
    }
    let mut vol = dev.load(true, &fb)?;
    if vol.version() != 2 {
        return Err(LuksError::Usage(
            "Reencryption of LUKS1 devices is not supported by udm; convert to LUKS2 first.".into(),
        ));
    }
    let in_progress = reencrypt::status(&vol)?.is_some();
    if in_progress {
        if c.a.has("init-only") {
            return Err(LuksError::Usage(
                "LUKS2 reencryption already initialized. Aborting operation.".into(),
            ));
        }
        drop(vol);
        return resume_only(c, &dev, &key, &prompt, hotzone, &fb);
    }
    if c.a.has("resume-only") {
        return Err(not_in_progress());
    }
    let mode = mode_of(c, &vol)?;
    let keep = mode == Mode::Reencrypt && c.a.has("keep-key");
    if keep {
        keep_key(c, &vol)?;
    }
    let mut others = Vec::new();
    let (pass, s, k_old) = if mode == Mode::Reencrypt {
        rekey_passphrases(c, &vol, &key, slot, keep, &mut others)?
    } else {
        let pass = key.read(&prompt, false)?;
        let (s, k) = vol.unlock(&pass, slot)?;
        c.verbose_msg(&format!("Key slot {s} unlocked."));
        (pass, s, k)
    };
    let others: Vec<(u32, &[u8])> = others.iter().map(|(n, p)| (*n, &p[..])).collect();
    let mut p = params(c, mode);
    p.keep_key = keep;
    let k_new = new_volume_key(c, mode, keep, &p, &k_old)?;
    if let Some(k) = k_new.as_ref().filter(|_| !keep) {
        p.kdf = new_kdf(c, k.len(), &fb)?;
    }
    reencrypt::init(
        &mut vol,
        &p,
        &pass,
        s,
        &others,
        Some(&k_old),
        k_new.as_ref(),
    )?;
    if c.a.has("init-only") {
        return Ok(());
    }
    go(c, &mut vol, &pass, hotzone, &fb)
}

/// What cryptsetup refuses before it looks at the device, and what udm
/// does not do.
fn check_args(c: &Ctx) -> Outcome {
    if c.argv.is_empty() {
        return Err(LuksError::Usage(
            "Command requires device as argument.".into(),
        ));
    };
    if c.a.has("reduce-device-size") && !c.a.has("encrypt") {
        return Err(unsupported(
            "--reduce-device-size without --encrypt (udm shifts data only to encrypt)",
        ));
    }
    for (opt, why) in [("integrity", "--integrity")] {
        if c.a.has(opt) {
            return Err(unsupported(why));
        }
    }
    if c.a.has("encrypt") && c.a.has("decrypt") {
        return Err(LuksError::Usage(
            "Options --encrypt and --decrypt cannot be combined.".into(),
        ));
    }
    Ok(())
}

/// The progress report the command line asks for.
fn progress(c: &Ctx) -> Progress {
    Progress {
        ui: ui(c),
        every: c
            .a
            .u32("progress-frequency")
            .map(u64::from)
            .filter(|&f| f > 0),
        json: c.a.has("progress-json").then(|| c.argv[0].clone()),
        quiet: c.batch(),
        total: Cell::new(0),
        start: Instant::now(),
        last: Cell::new(None),
        first: Cell::new(u64::MAX),
        stop_after: Cell::new(None),
        steps: Cell::new(0),
    }
}

/// `--encrypt` with a detached header: resume one in progress, or format
/// the header (shifting the data in place with `--reduce-device-size`),
/// start, map and run the encryption.
fn encrypt_detached(
    c: &Ctx,
    dev: &crate::luks::ops::Device,
    key: &KeySource,
    slot: Option<u32>,
    prompt: &str,
    hotzone: Option<u64>,
    fb: &Progress,
) -> Outcome {
    let Some(hdr) = dev.header.clone() else {
        return Err(not_in_progress());
    };
    if hdr.exists() && std::fs::metadata(&hdr).is_ok_and(|m| m.len() > 0) {
        let vol = Volume::load(&dev.path, Some(&hdr), false);
        if vol
            .as_ref()
            .is_ok_and(|v| reencrypt::status(v).ok().flatten().is_some())
        {
            return resume_only(c, dev, key, prompt, hotzone, fb);
        }
    }
    if c.a.has("resume-only") {
        return Err(not_in_progress());
    }
    if c.a.has("active-name") {
        return Err(already_luks(dev));
    }
    // A detached header: the data stays where --offset says.
    let mut o = encrypt_format(c, dev, key, slot, c.a.u64("offset").unwrap_or(0));
    let reduce = c.a.u64("reduce-device-size");
    if let Some(n) = reduce {
        in_place_shift(c, dev, n, &mut o)?;
    }
    luks_format(&o, fb)?;
    let mut vol = dev.load(true, fb)?;
    let pass = key.read(prompt, false)?;
    let (s, k) = vol.unlock(&pass, slot)?;
    let mut p = params(c, Mode::Encrypt);
    p.shift = reduce;
    reencrypt::init(&mut vol, &p, &pass, s, &[], None, Some(&k))?;
    let name = activate(c, &vol, &pass)?;
    if c.a.has("init-only") {
        return Ok(());
    }
    go_online(c, &mut vol, &pass, hotzone, fb, name)
}

/// `--decrypt` (detached header, data at offset 0 only) or a reencryption.
fn mode_of(c: &Ctx, vol: &Volume) -> Result<Mode, LuksError> {
    Ok(if c.a.has("decrypt") {
        if !vol.detached {
            return Err(LuksError::Usage(
                "LUKS2 decryption requires --header option.".into(),
            ));
        }
        // LUKS1 was refused above: this is the lowest data segment.
        if vol.data_offset() > 0 {
            return Err(LuksError::Unsupported(
                "LUKS2 decryption is supported with detached header device only (with data \
                 offset set to 0)."
                    .into(),
            ));
        }
        Mode::Decrypt
    } else {
        Mode::Reencrypt
    })
}

/// The new volume key: the old one with `--keep-key` (its size must fit
/// the new cipher), `--volume-key-file`'s, or a random one; none to decrypt.
fn new_volume_key(
    c: &Ctx,
    mode: Mode,
    keep: bool,
    p: &InitParams,
    k_old: &zeroize::Zeroizing<Vec<u8>>,
) -> Result<Option<zeroize::Zeroizing<Vec<u8>>>, LuksError> {
    Ok(match mode {
        Mode::Reencrypt if keep => {
            // The same volume key under new segment parameters.
            if p.key_bytes.is_some_and(|l| l != k_old.len()) {
                return Err(LuksError::Usage(format!(
                    "Unable to use cipher specification {} for LUKS2.",
                    p.cipher.as_deref().unwrap_or("(current)")
                )));
            }
            Some(k_old.clone())
        }
        Mode::Reencrypt => {
            let len = p.key_bytes.unwrap_or(k_old.len());
            Some(match c.a.str("volume-key-file") {
                Some(f) => zeroize::Zeroizing::new(
                    crate::luks::ops::read_volume_key_file(std::path::Path::new(f), len)?.to_vec(),
                ),
                None => crate::luks::keyslot::random(len)?,
            })
        }
        _ => None,
    })
}

fn params(c: &Ctx, mode: Mode) -> InitParams {
    let cipher = c.a.str("cipher").map(str::to_string);
    let key_bytes = c.a.u32("key-size").map(|b| (b / 8) as usize).or_else(|| {
        cipher
            .as_deref()
            .map(|ci| (default_key_bits(ci) / 8) as usize)
    });
    InitParams {
        mode,
        resilience: c.a.str("resilience").unwrap_or("checksum").to_string(),
        hash: c.a.str("resilience-hash").unwrap_or("sha256").to_string(),
        cipher,
        key_bytes,
        sector_size: c.a.u32("sector-size"),
        key_slot: c.a.i32("key-slot").map(|s| s as u32),
        shift: None,
        move_first: false,
        hotzone: None,
        kdf: None,
        device_size: c.a.u64("device-size"),
        keep_key: false,
    }
}

/// The new keyslot's KDF as cryptsetup picks it: the command line's
/// choice (benchmarked unless forced) when `--pbkdf`, `--hash`,
/// `--iter-time` or `--pbkdf-force-iterations` is given, else None (the
/// old keyslot's KDF; `--pbkdf-memory` or `--pbkdf-parallel` alone do not
/// change it, as in cryptsetup 2.6).
fn new_kdf(
    c: &Ctx,
    key_len: usize,
    fb: &dyn Feedback,
) -> Result<Option<(crate::luks::kdf::Kdf, crate::luks::hash::HashAlg)>, LuksError> {
    if !["pbkdf", "hash", "iter-time", "pbkdf-force-iterations"]
        .iter()
        .any(|o| c.a.has(o))
    {
        return Ok(None);
    }
    if c.a.has("pbkdf-force-iterations") && c.a.has("iter-time") {
        return Err(LuksError::Usage(
            "PBKDF forced iterations cannot be combined with iteration time option.".into(),
        ));
    }
    let choice = pbkdf(c);
    Ok(Some((choice.resolve(2, key_len, fb)?, choice.hash()?)))
}

/// `--keep-key` on a re-key: with nothing else changed cryptsetup
/// refuses with its message (exit 1); else the data is reencrypted under
/// the same volume key with the new cipher or sector size.
fn keep_key(c: &Ctx, vol: &Volume) -> Outcome {
    let Some(h) = vol.header.luks2() else {
        return Ok(());
    };
    let Some(seg) = h.meta.segments.values().find(|s| !s.is_backup()) else {
        return Ok(());
    };
    let key_bytes = h.meta.keyslots.values().next().map(|k| k.key_size);
    let cipher_changes = c.a.str("cipher").is_some_and(|ci| ci != seg.encryption);
    let ss_changes =
        c.a.u32("sector-size")
            .is_some_and(|ss| ss != seg.sector_size);
    let ks_changes =
        c.a.u32("key-size")
            .is_some_and(|b| Some(b / 8) != key_bytes);
    if !(cipher_changes || ss_changes || ks_changes) {
        return Err(LuksError::Usage(
            "No data segment parameters changed. Reencryption aborted.".into(),
        ));
    }
    Ok(())
}

/// The passphrases of a re-key, as cryptsetup asks for them: with
/// `--key-slot` that keyslot's; else every active keyslot's in turn
/// ("Enter passphrase for key slot N: ", one line each from a pipe), so
/// each gets a keyslot for the new key. A key file serves only when one
/// keyslot is active. With `keep` (`--keep-key`, no new keyslots) only
/// the first active keyslot's passphrase is needed. Returns the first
/// keyslot's passphrase, number and volume key; the others go to
/// `others`.
#[allow(clippy::type_complexity)]
fn rekey_passphrases(
    c: &Ctx,
    vol: &Volume,
    key: &crate::luks::passphrase::KeySource,
    slot: Option<u32>,
    keep: bool,
    others: &mut Vec<(u32, crate::luks::secret::SecretBuf)>,
) -> Result<
    (
        crate::luks::secret::SecretBuf,
        u32,
        zeroize::Zeroizing<Vec<u8>>,
    ),
    LuksError,
> {
    let (bound, unbound): (Vec<u32>, Vec<u32>) = match vol.header.luks2() {
        Some(h) => {
            let seg = h.meta.segment_digest().map(|(n, _)| n);
            vol.active_slots()
                .into_iter()
                .partition(|s| h.meta.digest_of(*s).map(|(n, _)| n) == seg)
        }
        None => (vol.active_slots(), Vec::new()),
    };
    let max = crate::luks::json::MAX_KEYSLOTS as usize;
    let new_vk = usize::from(!keep);
    let full = bound.len() + unbound.len() + new_vk + 1 > max
        || (!keep && slot.is_none() && 2 * bound.len() + unbound.len() + 1 > max);
    if full {
        return Err(LuksError::Usage(
            "Not enough free keyslots for reencryption.".into(),
        ));
    }
    let wanted = match slot {
        Some(s) if bound.contains(&s) => vec![s],
        Some(_) => return Err(LuksError::NoUsableKeyslot),
        None if keep => bound.into_iter().take(1).collect(),
        None => {
            if key.key_file.is_some() && bound.len() > 1 {
                return Err(LuksError::Usage(
                    "Key file can be used only with --key-slot or with exactly one key slot \
                     active."
                        .into(),
                ));
            }
            bound
        }
    };
    let tries = if key.interactive() {
        c.a.u32("tries").unwrap_or(3).max(1)
    } else {
        1
    };
    let mut first = None;
    for s in wanted {
        let prompt = format!("Enter passphrase for key slot {s}: ");
        let mut got = None;
        for _ in 0..tries {
            let pass = key.read(&prompt, false)?;
            match vol.unlock(&pass, Some(s)) {
                Ok((_, k)) => {
                    c.verbose_msg(&format!("Key slot {s} unlocked."));
                    got = Some((pass, k));
                    break;
                }
                Err(LuksError::WrongPassphrase) => {
                    eprintln!("No key available with this passphrase.")
                }
                Err(e) => return Err(e),
            }
        }
        let Some((pass, k)) = got else {
            return Err(LuksError::Silent(2));
        };
        if first.is_none() {
            first = Some((pass, s, k));
        } else {
            others.push((s, pass));
        }
    }
    first.ok_or(LuksError::NoUsableKeyslot)
}

/// cryptsetup's resilience of a decryption with data shift: the moved
/// segment is protected by checksums (default) or a journal.
fn unshift_resilience(c: &Ctx) -> Result<&'static str, LuksError> {
    match c.a.str("resilience") {
        None | Some("checksum") | Some("datashift-checksum") => Ok("datashift-checksum"),
        Some("journal") | Some("datashift-journal") => Ok("datashift-journal"),
        Some("datashift") | Some("none") => Err(LuksError::Usage(
            "Requested --resilience option cannot be applied to current reencryption operation."
                .into(),
        )),
        Some(r) => Err(LuksError::Usage(format!("Unsupported resilience mode {r}"))),
    }
}

/// `--decrypt --header NEW` of a volume whose header is on the device
/// (NEW does not exist): as cryptsetup, the header is exported to NEW
/// (owner read/write), the device's LUKS signatures are wiped, and the
/// data moves back to byte 0 while it is decrypted. Should starting fail
/// after the signatures are gone, the exported header is written back.
fn decrypt_shift(
    c: &Ctx,
    dev: &crate::luks::ops::Device,
    hdr: &std::path::Path,
    key: &crate::luks::passphrase::KeySource,
    slot: Option<u32>,
    hotzone: Option<u64>,
    fb: &Progress,
) -> Outcome {
    let mut on_dev = dev.clone();
    on_dev.header = None;
    let missing = || {
        LuksError::Usage(format!(
            "Device {} does not exist or access denied.",
            hdr.display()
        ))
    };
    let vol = on_dev.load(false, fb).map_err(|_| missing())?;
    if vol.version() != 2 || reencrypt::status(&vol).ok().flatten().is_some() {
        return Err(missing());
    }
    if c.a.has("resume-only") {
        return Err(not_in_progress());
    }
    let resilience = unshift_resilience(c)?;
    let mut live = match c.a.str("active-name") {
        Some(name) => Some(active(c, name)?),
        None => None,
    };
    if !c.batch() {
        crate::luks::ops::confirm_or(
            fb,
            &format!(
                "Header file {h} does not exist. Do you want to initialize LUKS2 decryption of \
                 device {d} and export LUKS2 header to file {h}?",
                h = hdr.display(),
                d = dev.path.display()
            ),
            "Operation aborted.",
        )?;
    }
    let prompt = format!("Enter passphrase for {}: ", dev.path.display());
    let pass = key.read(&prompt, false)?;
    vol.unlock(&pass, slot)?;
    drop(vol);
    crate::luks::ops::header::backup(&on_dev, hdr, fb)?;
    let mut suspended = false;
    let started = (|| -> Result<(), LuksError> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(hdr)
            .map_err(|e| LuksError::io(format!("{}", hdr.display()), e))?
            .permissions()
            .mode();
        std::fs::set_permissions(hdr, std::fs::Permissions::from_mode(mode | 0o600)).map_err(
            |_| {
                LuksError::Usage(
                    "Failed to add read/write permissions to exported header file.".into(),
                )
            },
        )?;
        let mut vol = dev.load(true, fb)?;
        let (s, k_old) = vol.unlock(&pass, slot)?;
        if let Some(l) = live.as_mut() {
            check_live(c, l, &vol)?;
            // The first hotzone's ciphertext is copied to byte 0 before
            // the header names it: no client may write it meanwhile.
            l.suspend()?;
            suspended = true;
        }
        wipe_luks_magic(&dev.path, vol.header_len())?;
        let mut p = params(c, Mode::Decrypt);
        p.resilience = resilience.to_string();
        p.move_first = true;
        p.hotzone = hotzone;
        reencrypt::init(&mut vol, &p, &pass, s, &[], Some(&k_old), None)?;
        if let Some(l) = live.as_mut() {
            let vol = dev.load(false, fb)?;
            let act = reencrypt::activation(&vol, &pass)?
                .ok_or_else(|| LuksError::Usage("reencryption state changed".into()))?;
            reload(l, act)?;
            suspended = false;
        }
        Ok(())
    })();
    if let Err(e) = started {
        if suspended {
            // The header goes back below; the old table maps it again.
            let _ = live.as_mut().map(|l| l.resume());
        }
        // Nothing of the reencryption reached the header: put the
        // original header back on the device and drop the export.
        match restore_header(&dev.path, hdr) {
            Ok(()) => {
                let _ = std::fs::remove_file(hdr);
            }
            Err(_) => eprintln!(
                "Reencryption initialization failed. Header backup is available in {}.",
                hdr.display()
            ),
        }
        return Err(e);
    }
    drop(live);
    if c.a.has("init-only") {
        return Ok(());
    }
    let mut vol = dev.load(true, fb)?;
    go(c, &mut vol, &pass, hotzone, fb)
}

/// Load the mapping `act` into the served device (its flags, its size)
/// and resume it.
fn reload(l: &mut super::active::LiveCtl<'_>, act: crate::luks::Activation) -> Outcome {
    let table = reencrypt::live_table(l, act);
    l.reload(&table)
}

/// `--encrypt --reduce-device-size N` with a detached header, as
/// cryptsetup 2.6.1 does it (src/utils_reencrypt.c encrypt_luks2_init,
/// lib/luks2/luks2_reencrypt.c): the header file's metadata areas are
/// `--luks2-metadata-size` (16 KiB) each and its keyslots area the rest
/// of N, the data stays where it is (data offset 0, nothing reduced) and
/// is encrypted in place, backward, in hotzones of N under resilience
/// `datashift`, which keeps no copy of a hotzone (at `--offset`, if
/// given). cryptsetup's hotzone arithmetic only ends at the data offset
/// when N divides the data area, so udm takes only such devices.
fn in_place_shift(c: &Ctx, dev: &crate::luks::ops::Device, n: u64, o: &mut FormatOpts) -> Outcome {
    let meta = c.a.u64("luks2-metadata-size").unwrap_or(0x4000);
    let mut slots = match c.a.u64("luks2-keyslots-size") {
        Some(k) => k,
        None => n.saturating_sub(2 * meta),
    };
    if 2 * meta + slots > n {
        return Err(LuksError::Usage(
            "LUKS2 metadata size is larger than data shift value.".into(),
        ));
    }
    // Below a data offset, as libcryptsetup keeps even a detached
    // header's areas (it could go back on the device).
    let offset = c.a.u64("offset").unwrap_or(0).saturating_mul(512);
    if offset > 0 && 2 * meta + slots > offset {
        slots = offset.saturating_sub(2 * meta) / 4096 * 4096;
        println!("WARNING: LUKS2 keyslots area size changed to {slots} bytes.");
    }
    let size = crate::luks::disk::Disk::open(&dev.path, false)?
        .size()?
        .saturating_sub(offset);
    if n % 4096 != 0 || n > reencrypt::UDM_MAX_HOTZONE || size == 0 || size % n != 0 {
        return Err(unsupported(&format!(
            "--reduce-device-size {n} with a detached --header and a data area of {size} bytes: \
             udm encrypts in place only when the reduction (4 KiB aligned, at most 64 MiB) \
             divides the data area, where cryptsetup's hotzones end at the data offset"
        )));
    }
    o.metadata_size = Some(meta);
    o.keyslots_size = Some(slots);
    Ok(())
}

/// The served device must map this volume (its device UUID names the
/// volume's, else cryptsetup's "Mismatching parameters on device NAME.")
/// and `--device-size` must equal its size ("Active device size and
/// requested reencryption size don't match."); both exit 1.
fn check_live(c: &Ctx, l: &super::active::LiveCtl<'_>, vol: &Volume) -> Outcome {
    let want = format!("CRYPT-LUKS2-{}-", vol.uuid().replace('-', ""));
    if !l.uuid.starts_with(&want) {
        return Err(LuksError::Usage(format!(
            "Mismatching parameters on device {}.",
            c.a.str("active-name").unwrap_or("")
        )));
    }
    if let (Some(want), Some(have)) = (c.a.u64("device-size"), l.sectors()) {
        if want != have * 512 {
            return Err(LuksError::Usage(
                "Active device size and requested reencryption size don't match.".into(),
            ));
        }
    }
    Ok(())
}

/// Zero the magic of both LUKS2 header copies on `path` (as blkid's
/// signature wipe does), so the device no longer looks like LUKS.
fn wipe_luks_magic(path: &std::path::Path, header_len: u64) -> Result<(), LuksError> {
    let mut d = crate::luks::disk::Disk::open(path, true)?;
    let mut magic = [0u8; 6];
    for at in [
        0u64,
        16384,
        32768,
        65536,
        131072,
        262144,
        524288,
        1 << 20,
        2 << 20,
        4 << 20,
    ] {
        if at + 6 > header_len {
            break;
        }
        d.read_at(at, &mut magic)?;
        if &magic == b"LUKS\xba\xbe" || &magic == b"SKUL\xba\xbe" {
            d.write_at(at, &[0u8; 6])?;
        }
    }
    d.sync()
}

/// Copy the exported header `hdr` back over the start of `path`.
fn restore_header(path: &std::path::Path, hdr: &std::path::Path) -> Result<(), LuksError> {
    let buf = zeroize::Zeroizing::new(
        std::fs::read(hdr).map_err(|e| LuksError::io(format!("{}", hdr.display()), e))?,
    );
    let mut d = crate::luks::disk::Disk::open(path, true)?;
    d.write_at(0, &buf)?;
    d.sync()
}

/// `--encrypt` of a plaintext device with the header put on it: resume
/// one in progress, or start one with `--reduce-device-size` (the first
/// half of the reduction holds the header, the data moves by as much).
fn encrypt_shift(
    c: &Ctx,
    dev: &crate::luks::ops::Device,
    key: &crate::luks::passphrase::KeySource,
    slot: Option<u32>,
    prompt: &str,
    hotzone: Option<u64>,
    fb: &Progress,
) -> Outcome {
    let in_progress = Volume::load(&dev.path, None, false)
        .ok()
        .is_some_and(|v| reencrypt::status(&v).ok().flatten().is_some());
    if in_progress {
        if c.a.has("init-only") {
            return Err(LuksError::Usage(
                "LUKS2 reencryption already initialized. Aborting operation.".into(),
            ));
        }
        return resume_only(c, dev, key, prompt, hotzone, fb);
    }
    if c.a.has("resume-only") {
        return Err(not_in_progress());
    }
    if c.a.has("active-name") {
        return Err(already_luks(dev));
    }
    let Some(mut reduce) = c.a.u64("reduce-device-size") else {
        return Err(unsupported(
            "--encrypt without --header needs --reduce-device-size (room for the header)",
        ));
    };
    // cryptsetup's --offset (sectors) with the header on the device: at
    // most half the reduction; less shrinks the reduction to twice it.
    if let Some(off) = c.a.u64("offset").filter(|&o| o > 0) {
        let half = reduce / 1024;
        if off > half {
            return Err(LuksError::Usage(
                "Requested data offset must be less than or equal to half of \
                 --reduce-device-size parameter."
                    .into(),
            ));
        }
        if off < half {
            reduce = off * 1024;
            println!(
                "Adjusting --reduce-device-size value to twice the --offset {} (sectors).",
                off * 2
            );
        }
    }
    let shift = reduce / 2;
    if reduce == 0 || reduce % 8192 != 0 {
        return Err(LuksError::Usage(
            "Device size reduction must be a multiple of 8 KiB (udm moves whole 4 KiB blocks)."
                .into(),
        ));
    }
    let size = crate::luks::disk::Disk::open(&dev.path, false)?.size()?;
    let plain = size.saturating_sub(reduce);
    if plain == 0 || plain % 4096 != 0 {
        return Err(LuksError::Usage(format!(
            "Device {} is too small (or not 4 KiB aligned) for a reduction of {reduce} bytes.",
            dev.path.display()
        )));
    }
    let pass = key.read(prompt, false)?;
    // Before the header overwrites it, the start of the plaintext goes to
    // the end of the device (cryptsetup's moved segment).
    {
        let mut d = crate::luks::disk::Disk::open(&dev.path, true)?;
        let n = plain.min(shift);
        let mut done = 0u64;
        while done < n {
            let len = (n - done).min(reencrypt::UDM_MAX_HOTZONE);
            let mut buf = zeroize::Zeroizing::new(vec![0u8; len as usize]);
            d.read_at(done, &mut buf)?;
            d.write_at(size - shift + done, &buf)?;
            done += len;
        }
        d.sync()?;
    }
    let mut o = encrypt_format(c, dev, key, slot, shift / 512);
    // The header takes the shift: a larger keyslots area shrinks to fit,
    // as libcryptsetup shrinks it.
    let meta = o.metadata_size.unwrap_or(0x4000);
    if let Some(ks) = o.keyslots_size.filter(|&k| 2 * meta + k > shift) {
        let fit = shift.saturating_sub(2 * meta) / 4096 * 4096;
        if fit != ks {
            println!("WARNING: LUKS2 keyslots area size changed to {fit} bytes.");
        }
        o.keyslots_size = Some(fit);
    }
    luks_format(&o, fb)?;
    let mut vol = dev.load(true, fb)?;
    let (s, k) = vol.unlock(&pass, slot)?;
    let mut p = params(c, Mode::Encrypt);
    p.shift = Some(shift);
    reencrypt::init(&mut vol, &p, &pass, s, &[], None, Some(&k))?;
    let name = activate(c, &vol, &pass)?;
    if c.a.has("init-only") {
        return Ok(());
    }
    go_online(c, &mut vol, &pass, hotzone, fb, name)
}

/// cryptsetup's online encryption: `reencrypt --encrypt DEVICE NAME`
/// activates NAME (here: a device of the running server) once the
/// encryption is initialised, and the rest of it runs online (also with
/// `--init-only`, which stops after the activation).
fn activate<'c>(c: &'c Ctx, vol: &Volume, pass: &[u8]) -> Result<Option<&'c str>, LuksError> {
    let Some(name) = c.argv.get(1) else {
        return Ok(None);
    };
    let act = reencrypt::activation(vol, pass)?
        .ok_or_else(|| LuksError::Usage("reencryption state changed".into()))?;
    super::active::create_luks2(c, name, act, vol.uuid())?;
    println!("{name} is now active and ready for online encryption.");
    Ok(Some(name.as_str()))
}

fn resume_only(
    c: &Ctx,
    dev: &crate::luks::ops::Device,
    key: &crate::luks::passphrase::KeySource,
    prompt: &str,
    hotzone: Option<u64>,
    fb: &Progress,
) -> Outcome {
    let mut vol = dev.load(true, fb)?;
    let pass = key.read(prompt, false)?;
    match go(c, &mut vol, &pass, hotzone, fb) {
        // cryptsetup fails a resume with a wrong passphrase with code 1.
        Err(LuksError::WrongPassphrase) => {
            eprintln!("{}", LuksError::WrongPassphrase);
            Err(LuksError::Silent(1))
        }
        r => r,
    }
}

/// The re-encryption test hooks: stop after, or simulate a crash inside,
/// hotzone N.
#[derive(Clone, Copy)]
enum Hook {
    StopAfter,
    CrashIn,
}

/// A test hook's value from the environment (`env`), read only in builds
/// with the `test-hooks` feature, which only the test build enables
/// (`cargo test --all-features`; tests/cryptsetup_reencrypt.rs requires
/// it). Why a build-time switch and not a flag: a production binary must
/// not be breakable mid-hotzone by whoever controls its environment (an
/// `EnvironmentFile=`, `sudo` keeping variables), and without the
/// feature it does not even contain the variables' names.
#[cfg(feature = "test-hooks")]
fn test_hook(h: Hook, env: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let name = match h {
        Hook::StopAfter => "UDM_TEST_REENCRYPT_STOP_AFTER",
        Hook::CrashIn => "UDM_TEST_REENCRYPT_CRASH_IN",
    };
    env(name).and_then(|v| v.parse().ok())
}

#[cfg(not(feature = "test-hooks"))]
fn test_hook(_: Hook, _: impl Fn(&str) -> Option<String>) -> Option<u64> {
    None
}

fn go(c: &Ctx, vol: &mut Volume, pass: &[u8], hotzone: Option<u64>, fb: &Progress) -> Outcome {
    go_online(c, vol, pass, hotzone, fb, c.a.str("active-name"))
}

/// [`go`], online when `name` names the served device.
fn go_online(
    c: &Ctx,
    vol: &mut Volume,
    pass: &[u8],
    hotzone: Option<u64>,
    fb: &Progress,
    name: Option<&str>,
) -> Outcome {
    install_handlers();
    let env = |n: &str| std::env::var(n).ok();
    fb.stop_after.set(test_hook(Hook::StopAfter, env));
    let mut live = match name {
        Some(name) => Some(active(c, name)?),
        None => None,
    };
    if let Some(l) = &live {
        check_live(c, l, vol)?;
    }
    let r = reencrypt::resume(
        vol,
        pass,
        reencrypt::Sizes {
            hotzone,
            device: c.a.u64("device-size"),
        },
        &STOP,
        fb,
        test_hook(Hook::CrashIn, env),
        live.as_mut().map(|l| l as &mut dyn reencrypt::Live),
    );
    let r = match (r, name) {
        (Err(e), Some(name)) => {
            // As libcryptsetup leaves a failed hotzone unreachable: the
            // device stays suspended until the hotzone is recovered.
            eprintln!(
                "Online reencryption failed; device {name} may be left suspended. Recover \
                 with `reencrypt --resume-only --active-name {name}`."
            );
            return Err(e);
        }
        (r, _) => r?,
    };
    if r == Done::Interrupted {
        eprintln!("\nReencryption interrupted.");
    }
    Ok(())
}

#[cfg(test)]
mod hook_tests {
    use super::*;

    fn env(n: &str) -> Option<String> {
        n.starts_with("UDM_TEST_REENCRYPT_")
            .then(|| "2".to_string())
    }

    /// A production build ignores the hook variables whatever they say.
    #[cfg(not(feature = "test-hooks"))]
    #[test]
    fn hooks_are_dead_without_the_test_hooks_feature() {
        assert_eq!(test_hook(Hook::StopAfter, env), None);
        assert_eq!(test_hook(Hook::CrashIn, env), None);
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn hooks_read_their_variables_in_test_builds() {
        assert_eq!(test_hook(Hook::StopAfter, env), Some(2));
        assert_eq!(test_hook(Hook::CrashIn, env), Some(2));
        assert_eq!(test_hook(Hook::CrashIn, |_| Some("x".into())), None);
    }
}
