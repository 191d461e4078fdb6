//! `cryptsetup reencrypt`: argv to `luks::reencrypt`. Starts a re-key
//! (`--cipher`, `--key-size`, `--sector-size`, new volume key), an
//! `--encrypt` or `--decrypt` (detached header), or resumes one that
//! either program started; `--init-only` writes the metadata and stops,
//! `--resume-only` refuses to start a new one. `--active-name NAME`
//! reencrypts online: NAME, a device of a running `udm serve` (control
//! socket), is suspended around each hotzone and reloaded with the
//! volume's new multi-segment table after it, so its NBD clients keep
//! reading and writing correct data. SIGINT/SIGTERM stop after
//! the current hotzone, leaving resumable metadata. Progress goes to
//! stderr: a bar on a terminal, or a line every `--progress-frequency`
//! seconds.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::offline::{device, key_source, pbkdf, ui};
use super::{Ctx, Outcome};
use crate::cli::ui::Ui;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::ops::format::{default_key_bits, luks_format, FormatOpts};
use crate::luks::reencrypt::{self, InitParams, Mode, Outcome as Done};
use crate::luks::volume::Volume;

/// Set by SIGINT/SIGTERM; the engine checks it between hotzones.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
        // value; the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Progress as cryptsetup reports it, on stderr.
struct Progress {
    ui: Ui,
    every: Option<u64>,
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
        if self.every.is_none() && !self.quiet {
            self.ui.begin(what, total);
        }
    }
    fn advance(&self, done: u64) {
        if self.first.get() == u64::MAX {
            self.first.set(done);
        } else {
            self.steps.set(self.steps.get() + 1);
            if self.stop_after.get().is_some_and(|n| self.steps.get() >= n) {
                STOP.store(true, Ordering::Relaxed);
            }
        }
        let Some(every) = self.every else {
            if !self.quiet {
                self.ui.advance(done);
            }
            return;
        };
        let now = Instant::now();
        let due = self
            .last
            .get()
            .is_none_or(|l| now.duration_since(l).as_secs() >= every);
        let total = self.total.get().max(1);
        if !due && done < total {
            return;
        }
        self.last.set(Some(now));
        let secs = now.duration_since(self.start).as_secs_f64().max(1e-3);
        let moved = done.saturating_sub(self.first.get());
        let speed = moved as f64 / secs;
        let eta = if speed > 0.0 {
            (total.saturating_sub(done) as f64 / speed) as u64
        } else {
            0
        };
        eprintln!(
            "Progress: {:5.1}%, ETA {:02}:{:02}, {} MiB written, speed {:5.1} MiB/s",
            done as f64 * 100.0 / total as f64,
            eta / 60,
            eta % 60,
            moved >> 20,
            speed / f64::from(1 << 20)
        );
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

pub(super) fn run(c: &Ctx) -> Outcome {
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
    for (opt, why) in [
        ("integrity", "--integrity"),
        ("device-size", "--device-size (fixed-size reencryption)"),
        ("keep-key", "--keep-key"),
    ] {
        if c.a.has(opt) {
            return Err(unsupported(why));
        }
    }
    if c.a.has("encrypt") && c.a.has("decrypt") {
        return Err(LuksError::Usage(
            "Options --encrypt and --decrypt cannot be combined.".into(),
        ));
    }
    let fb = Progress {
        ui: ui(c),
        every: c
            .a
            .u32("progress-frequency")
            .map(u64::from)
            .filter(|&f| f > 0),
        quiet: c.batch(),
        total: Cell::new(0),
        start: Instant::now(),
        last: Cell::new(None),
        first: Cell::new(u64::MAX),
        stop_after: Cell::new(None),
        steps: Cell::new(0),
    };
    if let Some(name) = c.a.str("active-name") {
        // Online: the served device must exist before anything changes.
        super::active::live_device(c, name)?;
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
        if c.a.has("reduce-device-size") {
            return Err(unsupported("--reduce-device-size with a detached --header"));
        }
        let Some(hdr) = dev.header.clone() else {
            return Err(not_in_progress());
        };
        if hdr.exists() && std::fs::metadata(&hdr).is_ok_and(|m| m.len() > 0) {
            let vol = Volume::load(&dev.path, Some(&hdr), false);
            if vol
                .as_ref()
                .is_ok_and(|v| reencrypt::status(v).ok().flatten().is_some())
            {
                return resume_only(c, &dev, &key, &prompt, hotzone, &fb);
            }
        }
        if c.a.has("resume-only") {
            return Err(not_in_progress());
        }
        let o = encrypt_format(c, &dev, &key, slot, 0);
        luks_format(&o, &fb)?;
        let mut vol = dev.load(true, &fb)?;
        let pass = key.read(&prompt, false)?;
        let (s, k) = vol.unlock(&pass, slot)?;
        let p = params(c, Mode::Encrypt);
        reencrypt::init(&mut vol, &p, &pass, s, None, Some(&k))?;
        if c.a.has("init-only") {
            return Ok(());
        }
        return go(c, &mut vol, &pass, hotzone, &fb);
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
    let mode = if c.a.has("decrypt") {
        if !vol.detached {
            return Err(unsupported(
                "--decrypt of a volume whose header is on the device (cryptsetup moves the \
                 data with a data shift); detach the header first",
            ));
        }
        Mode::Decrypt
    } else {
        Mode::Reencrypt
    };
    if mode == Mode::Reencrypt && slot.is_none() && vol.active_slots().len() > 1 {
        // cryptsetup asks for every keyslot's passphrase; udm re-keys the
        // keyslot it is given, and the others would be dropped at the end.
        return Err(LuksError::Usage(if key.key_file.is_some() {
            "Key file can be used only with --key-slot or with exactly one key slot active.".into()
        } else {
            "udm re-keys one keyslot: choose it with --key-slot (the other keyslots of the \
             old key are removed when the reencryption finishes)."
                .into()
        }));
    }
    let pass = key.read(&prompt, false)?;
    let (s, k_old) = vol.unlock(&pass, slot)?;
    c.verbose_msg(&format!("Key slot {s} unlocked."));
    let p = params(c, mode);
    let k_new = match mode {
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
    };
    reencrypt::init(&mut vol, &p, &pass, s, Some(&k_old), k_new.as_ref())?;
    if c.a.has("init-only") {
        return Ok(());
    }
    go(c, &mut vol, &pass, hotzone, &fb)
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
    }
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
    let Some(reduce) = c.a.u64("reduce-device-size") else {
        return Err(unsupported(
            "--encrypt without --header needs --reduce-device-size (room for the header)",
        ));
    };
    if c.a.has("offset") || c.a.has("luks2-keyslots-size") {
        return Err(unsupported(
            "--offset or --luks2-keyslots-size with --reduce-device-size",
        ));
    }
    let shift = reduce / 2;
    if reduce == 0 || reduce % 8192 != 0 || shift > 1 << 30 {
        return Err(LuksError::Usage(
            "Device size reduction must be a multiple of 8 KiB, at most 2 GiB.".into(),
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
    let o = encrypt_format(c, dev, key, slot, shift / 512);
    luks_format(&o, fb)?;
    let mut vol = dev.load(true, fb)?;
    let (s, k) = vol.unlock(&pass, slot)?;
    let mut p = params(c, Mode::Encrypt);
    p.shift = Some(shift);
    reencrypt::init(&mut vol, &p, &pass, s, None, Some(&k))?;
    if c.a.has("init-only") {
        return Ok(());
    }
    go(c, &mut vol, &pass, hotzone, fb)
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

fn go(c: &Ctx, vol: &mut Volume, pass: &[u8], hotzone: Option<u64>, fb: &Progress) -> Outcome {
    install_handlers();
    // Test hooks (the interop tests stop or crash udm at a chosen hotzone).
    let hook = |n: &str| std::env::var(n).ok().and_then(|v| v.parse::<u64>().ok());
    fb.stop_after.set(hook("UDM_TEST_REENCRYPT_STOP_AFTER"));
    let mut live = match c.a.str("active-name") {
        Some(name) => Some(super::active::live_device(c, name)?),
        None => None,
    };
    let r = reencrypt::resume(
        vol,
        pass,
        hotzone,
        &STOP,
        fb,
        hook("UDM_TEST_REENCRYPT_CRASH_IN"),
        live.as_mut().map(|l| l as &mut dyn reencrypt::Live),
    );
    let r = match (r, c.a.str("active-name")) {
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
