//! `udm luks ...`: format and manage LUKS volumes with cryptsetup's option
//! names and defaults, so scripts written for cryptsetup translate directly.

use crate::luks::disk::Disk;
use crate::luks::format::{self, FormatParams};
use crate::luks::hash::HashAlg;
use crate::luks::kdf::{self, Argon2Kind, Kdf};
use crate::luks::passphrase::{confirm, read_passphrase};
use crate::luks::volume::{Header, Volume};
use crate::luks::LuksError;
use clap::{Args, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zeroize::Zeroizing;

/// LUKS verbs.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create a LUKS header (cryptsetup luksFormat).
    Format(Box<FormatArgs>),
    /// Show the header (cryptsetup luksDump).
    Dump(DumpArgs),
    /// Add a passphrase to a free keyslot (cryptsetup luksAddKey).
    AddKey(Box<AddKeyArgs>),
    /// Remove the keyslot a passphrase opens (cryptsetup luksRemoveKey).
    RemoveKey(RemoveKeyArgs),
    /// Remove keyslot N (cryptsetup luksKillSlot).
    KillSlot(KillSlotArgs),
    /// Check a passphrase without mapping anything (cryptsetup open --test-passphrase).
    TestPassphrase(TestArgs),
    /// Save the header and keyslot areas to a file (cryptsetup luksHeaderBackup).
    HeaderBackup(BackupArgs),
    /// Write a saved header back (cryptsetup luksHeaderRestore).
    HeaderRestore(BackupArgs),
}

/// Options every verb shares.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Detached LUKS header file (the image then holds only data).
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// Read the passphrase from FILE (whole file; `-` for stdin).
    #[arg(long, short = 'd')]
    pub key_file: Option<PathBuf>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q')]
    pub batch_mode: bool,
}

/// PBKDF choice for new keyslots.
#[derive(Args, Debug, Clone, Default)]
pub struct PbkdfArgs {
    /// pbkdf2, argon2i or argon2id.
    #[arg(long)]
    pub pbkdf: Option<String>,
    /// Target unlock time in milliseconds (calibrated on this machine).
    #[arg(long, short = 'i')]
    pub iter_time: Option<u32>,
    /// Use exactly this many iterations (PBKDF2) or passes (Argon2); no benchmark.
    #[arg(long)]
    pub pbkdf_force_iterations: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long)]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 lanes.
    #[arg(long)]
    pub pbkdf_parallel: Option<u32>,
    /// Hash for PBKDF2 (and LUKS1 header hash / LUKS2 AF hash).
    #[arg(long)]
    pub hash: Option<String>,
}

#[derive(Args, Debug)]
pub struct FormatArgs {
    pub image: PathBuf,
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub pbkdf: PbkdfArgs,
    /// luks2 (default) or luks1.
    #[arg(long = "type", short = 'M', default_value = "luks2")]
    pub luks_type: String,
    #[arg(long, short = 'c', default_value = "aes-xts-plain64")]
    pub cipher: String,
    /// Volume key size in bits.
    #[arg(long, short = 's', default_value_t = 512)]
    pub key_size: u32,
    /// Encryption sector size (LUKS2): 512, 1024, 2048 or 4096.
    #[arg(long)]
    pub sector_size: Option<u32>,
    #[arg(long)]
    pub label: Option<String>,
    #[arg(long)]
    pub uuid: Option<String>,
    /// LUKS2 header size per copy (16k .. 4m).
    #[arg(long, value_parser = parse_size)]
    pub luks2_metadata_size: Option<u64>,
    /// LUKS2 keyslots area size.
    #[arg(long, value_parser = parse_size)]
    pub luks2_keyslots_size: Option<u64>,
    /// Create or grow the image file to this many bytes (K/M/G/T suffixes allowed).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    pub image: PathBuf,
    #[command(flatten)]
    pub common: Common,
    /// Print the JSON metadata (LUKS2).
    #[arg(long, alias = "dump-json-metadata")]
    pub json: bool,
    /// Print the volume key (asks for a passphrase).
    #[arg(long, alias = "dump-master-key")]
    pub dump_volume_key: bool,
}

#[derive(Args, Debug)]
pub struct AddKeyArgs {
    pub image: PathBuf,
    /// File with the new passphrase (whole file); prompted if absent.
    pub new_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub pbkdf: PbkdfArgs,
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
}

#[derive(Args, Debug)]
pub struct RemoveKeyArgs {
    pub image: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug)]
pub struct KillSlotArgs {
    pub image: PathBuf,
    pub slot: u32,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug)]
pub struct TestArgs {
    pub image: PathBuf,
    #[command(flatten)]
    pub common: Common,
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
}

#[derive(Args, Debug)]
pub struct BackupArgs {
    pub image: PathBuf,
    #[arg(long)]
    pub header_backup_file: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

use crate::mem::parse_size;

/// Run a verb; returns the process exit code (cryptsetup's codes).
pub fn run(c: Cmd) -> i32 {
    let r = match c {
        Cmd::Format(a) => cmd_format(*a),
        Cmd::Dump(a) => cmd_dump(a),
        Cmd::AddKey(a) => cmd_add_key(*a),
        Cmd::RemoveKey(a) => cmd_remove_key(a),
        Cmd::KillSlot(a) => cmd_kill_slot(a),
        Cmd::TestPassphrase(a) => cmd_test(a),
        Cmd::HeaderBackup(a) => cmd_backup(a),
        Cmd::HeaderRestore(a) => cmd_restore(a),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("udm luks: {e}");
            e.exit_code()
        }
    }
}

fn spinner(msg: &str) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message(msg.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}

fn bar(len: u64, msg: &str) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(len);
        pb.set_message(msg.to_string());
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}

fn get_hash(p: &PbkdfArgs) -> Result<HashAlg, LuksError> {
    match &p.hash {
        None => Ok(HashAlg::Sha256),
        Some(h) => HashAlg::from_name(h).ok_or_else(|| {
            LuksError::Usage(format!(
                "Hash {h} is not supported (sha1, sha224, sha256, sha384, sha512)."
            ))
        }),
    }
}

/// Resolve PBKDF options to a KDF with costs, benchmarking unless forced.
fn resolve_kdf(p: &PbkdfArgs, version: u8, key_len: usize) -> Result<Kdf, LuksError> {
    let hash = get_hash(p)?;
    let name = p.pbkdf.clone().unwrap_or_else(|| {
        if version == 1 {
            "pbkdf2".into()
        } else {
            "argon2id".into()
        }
    });
    let iter_time = p.iter_time.unwrap_or(2000);
    match name.as_str() {
        "pbkdf2" => {
            let iterations = match p.pbkdf_force_iterations {
                Some(n) if n < kdf::MIN_PBKDF2_ITERATIONS => {
                    return Err(LuksError::Usage(format!(
                        "Forced iteration count is too low for pbkdf2 (minimum is {}).",
                        kdf::MIN_PBKDF2_ITERATIONS
                    )));
                }
                Some(n) => n,
                None => {
                    let pb = spinner("Benchmarking PBKDF2...");
                    let n = kdf::calibrate_pbkdf2(hash, key_len, iter_time);
                    pb.finish_and_clear();
                    n
                }
            };
            Ok(Kdf::Pbkdf2 { hash, iterations })
        }
        "argon2i" | "argon2id" => {
            if version == 1 {
                return Err(LuksError::Usage(
                    "LUKS1 supports only the pbkdf2 PBKDF.".into(),
                ));
            }
            let kind = if name == "argon2i" {
                Argon2Kind::I
            } else {
                Argon2Kind::Id
            };
            let cpus = p.pbkdf_parallel.unwrap_or_else(kdf::default_parallel);
            let memory = p.pbkdf_memory.unwrap_or_else(kdf::default_memory_kib);
            if !(32..=kdf::MAX_ARGON2_MEMORY_KIB).contains(&memory) {
                return Err(LuksError::Usage(format!(
                    "Requested PBKDF memory {memory} KiB is outside 32..{} KiB.",
                    kdf::MAX_ARGON2_MEMORY_KIB
                )));
            }
            let (time, memory) = match p.pbkdf_force_iterations {
                Some(n) if n < kdf::MIN_ARGON2_TIME => {
                    return Err(LuksError::Usage(format!(
                        "Forced iteration count is too low for {name} (minimum is {}).",
                        kdf::MIN_ARGON2_TIME
                    )));
                }
                Some(n) => (n, memory),
                None => {
                    let pb = spinner("Benchmarking Argon2...");
                    let r = kdf::calibrate_argon2(kind, memory, cpus, key_len, iter_time);
                    pb.finish_and_clear();
                    r
                }
            };
            let k = Kdf::Argon2 {
                kind,
                time,
                memory_kib: memory,
                cpus,
            };
            k.check("--pbkdf")?;
            Ok(k)
        }
        other => Err(LuksError::Usage(format!(
            "Unknown PBKDF {other} (pbkdf2, argon2i, argon2id)."
        ))),
    }
}

/// Read a passphrase; when prompting for a new one, ask twice.
fn passphrase(
    key_file: Option<&Path>,
    prompt: &str,
    verify: bool,
) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let p = read_passphrase(key_file, prompt)?;
    if key_file.is_none() && verify {
        let again = read_passphrase(None, "Verify passphrase: ")?;
        if *again != *p {
            return Err(LuksError::Usage("Passphrases do not match.".into()));
        }
    }
    if p.is_empty() && key_file.is_none() {
        return Err(LuksError::Usage("Empty passphrase.".into()));
    }
    Ok(p)
}

fn cmd_format(a: FormatArgs) -> Result<(), LuksError> {
    let version = match a.luks_type.as_str() {
        "luks2" | "luks" => 2,
        "luks1" => 1,
        t => {
            return Err(LuksError::Usage(format!(
                "Unsupported LUKS type {t} (luks1, luks2)."
            )))
        }
    };
    if a.key_size == 0 || a.key_size % 8 != 0 {
        return Err(LuksError::Usage(format!(
            "Key size {} must be a multiple of 8 bits.",
            a.key_size
        )));
    }
    if version == 1 && a.sector_size.is_some_and(|s| s != 512) {
        return Err(LuksError::Usage(
            "LUKS1 supports only 512-byte sectors.".into(),
        ));
    }
    if let Some(size) = a.size {
        let d = Disk::create(&a.image)?;
        d.grow_to(size)?;
    } else if !a.image.exists()
        && !a
            .image
            .to_str()
            .is_some_and(crate::store::Location::is_remote)
    {
        return Err(LuksError::Usage(format!(
            "Device {} does not exist; use --size to create it.",
            a.image.display()
        )));
    }
    if !a.common.batch_mode {
        let q = format!(
            "\nWARNING!\n========\nThis will overwrite data on {} irrevocably.\n\nAre you sure? (Type 'YES' in capital letters): ",
            a.common.header.as_deref().unwrap_or(&a.image).display()
        );
        if !confirm(&q)? {
            return Err(LuksError::Usage("Operation aborted.".into()));
        }
    }
    let pass = passphrase(
        a.common.key_file.as_deref(),
        &format!("Enter passphrase for {}: ", a.image.display()),
        true,
    )?;
    let key_len = (a.key_size / 8) as usize;
    let kdf = resolve_kdf(&a.pbkdf, version, key_len)?;
    let hash = get_hash(&a.pbkdf)?;
    let digest_iterations = if a.pbkdf.pbkdf_force_iterations.is_some() {
        kdf::MIN_PBKDF2_ITERATIONS
    } else {
        kdf::calibrate_pbkdf2(
            if version == 1 { hash } else { HashAlg::Sha256 },
            key_len,
            125,
        )
    };
    let p = FormatParams {
        version,
        cipher: a.cipher,
        key_bytes: a.key_size / 8,
        sector_size: a.sector_size,
        kdf,
        digest_iterations,
        hash,
        label: a.label.unwrap_or_default(),
        uuid: a.uuid,
        metadata_size: a.luks2_metadata_size.unwrap_or(16 * 1024),
        keyslots_size: a.luks2_keyslots_size,
    };
    let pb = bar(0, "Wiping header area");
    let key = format::format(
        &a.image,
        a.common.header.as_deref(),
        &p,
        &pass,
        &mut |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        },
    )?;
    pb.finish_and_clear();
    drop(key);
    Ok(())
}

fn load(image: &Path, c: &Common, write: bool) -> Result<Volume, LuksError> {
    let v = Volume::load(image, c.header.as_deref(), write)?;
    for w in v.warnings() {
        eprintln!("WARNING: {w}");
    }
    Ok(v)
}

fn hex_lines(b: &[u8], indent: &str) -> String {
    let mut s = String::new();
    for (i, chunk) in b.chunks(16).enumerate() {
        if i > 0 {
            s.push('\n');
            s.push_str(indent);
        }
        for x in chunk {
            s.push_str(&format!("{x:02x} "));
        }
    }
    s
}

/// Append one formatted line to a String.
macro_rules! p {
    ($o:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o, $($arg)*);
    }};
}

/// Write collected output to stdout; a closed pipe ends quietly.
fn emit(o: &str) -> Result<(), LuksError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(o.as_bytes()).and_then(|_| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(LuksError::io("cannot write to standard output", e)),
    }
}

fn cmd_dump(a: DumpArgs) -> Result<(), LuksError> {
    let v = load(&a.image, &a.common, false)?;
    // Collected first and written once: a closed pipe (`| head`) is not an error worth a panic.
    let mut o = Zeroizing::new(String::new());
    if a.dump_volume_key {
        let pass = read_passphrase(
            a.common.key_file.as_deref(),
            &format!("Enter passphrase for {}: ", a.image.display()),
        )?;
        let (_, key) = v.unlock(&pass, None)?;
        let (cipher, payload) = match &v.header {
            Header::Luks1(h) => (h.cipher_spec(), u64::from(h.payload_offset)),
            Header::Luks2(h) => {
                let s = h.meta.segments.get(&0);
                (
                    s.map(|s| s.encryption.clone()).unwrap_or_default(),
                    s.map(|s| s.offset / 512).unwrap_or(0),
                )
            }
        };
        let (name, mode) = cipher.split_once('-').unwrap_or((cipher.as_str(), ""));
        let text = Zeroizing::new(format!(
            "LUKS header information for {}\nCipher name:   \t{name}\nCipher mode:   \t{mode}\nPayload offset:\t{payload}\nUUID:          \t{}\nMK bits:       \t{}\nMK dump:\t{}\n",
            a.image.display(),
            v.uuid(),
            key.len() * 8,
            hex_lines(&key, "\t\t")
        ));
        o.push_str(&text);
        return emit(&o);
    }
    match &v.header {
        Header::Luks1(h) => {
            if a.json {
                return Err(LuksError::Usage("LUKS1 has no JSON metadata.".into()));
            }
            p!(o, "LUKS header information for {}\n", a.image.display());
            p!(o, "Version:       \t1");
            p!(o, "Cipher name:   \t{}", h.cipher_name);
            p!(o, "Cipher mode:   \t{}", h.cipher_mode);
            p!(o, "Hash spec:     \t{}", h.hash.name());
            p!(o, "Payload offset:\t{}", h.payload_offset);
            p!(o, "MK bits:       \t{}", h.key_bytes * 8);
            p!(o, "MK digest:     \t{}", hex_lines(&h.mk_digest, "\t\t"));
            p!(
                o,
                "MK salt:       \t{}",
                hex_lines(&h.mk_digest_salt, "               \t")
            );
            p!(o, "MK iterations: \t{}", h.mk_digest_iter);
            p!(o, "UUID:          \t{}\n", h.uuid);
            for (i, s) in h.slots.iter().enumerate() {
                if s.active {
                    p!(o, "Key Slot {i}: ENABLED");
                    p!(o, "\tIterations:         \t{}", s.iterations);
                    p!(
                        o,
                        "\tSalt:               \t{}",
                        hex_lines(&s.salt, "\t                      \t")
                    );
                    p!(o, "\tKey material offset:\t{}", s.key_offset);
                    p!(o, "\tAF stripes:            \t{}", s.stripes);
                } else {
                    p!(o, "Key Slot {i}: DISABLED");
                }
            }
        }
        Header::Luks2(h) => {
            if a.json {
                p!(
                    o,
                    "{}",
                    serde_json::to_string_pretty(&h.meta.value).unwrap_or_default()
                );
                return emit(&o);
            }
            let m = &h.meta;
            p!(o, "LUKS header information");
            p!(o, "Version:       \t2");
            p!(o, "Epoch:         \t{}", h.bin.seqid);
            p!(o, "Metadata area: \t{} [bytes]", h.bin.hdr_size);
            p!(o, "Keyslots area: \t{} [bytes]", m.keyslots_size);
            p!(o, "UUID:          \t{}", h.bin.uuid);
            p!(
                o,
                "Label:         \t{}",
                if h.bin.label.is_empty() {
                    "(no label)"
                } else {
                    &h.bin.label
                }
            );
            p!(
                o,
                "Subsystem:     \t{}",
                if h.bin.subsystem.is_empty() {
                    "(no subsystem)"
                } else {
                    &h.bin.subsystem
                }
            );
            p!(
                o,
                "Flags:       \t{}",
                if m.flags.is_empty() {
                    "(no flags)".to_string()
                } else {
                    m.flags.join(" ")
                }
            );
            if !m.requirements.is_empty() {
                p!(o, "Requirements:\t{}", m.requirements.join(" "));
            }
            p!(o, "\nData segments:");
            for (n, s) in &m.segments {
                p!(o, "  {n}: {}", s.kind);
                p!(o, "\toffset: {} [bytes]", s.offset);
                match s.size {
                    Some(z) => p!(o, "\tlength: {z} [bytes]"),
                    None => p!(o, "\tlength: (whole device)"),
                }
                if s.kind == "crypt" {
                    p!(o, "\tcipher: {}", s.encryption);
                    p!(o, "\tsector: {} [bytes]", s.sector_size);
                }
            }
            p!(o, "\nKeyslots:");
            for (n, k) in &m.keyslots {
                p!(o, "  {n}: luks2");
                p!(o, "\tKey:        {} bits", k.key_size * 8);
                p!(
                    o,
                    "\tPriority:   {}",
                    ["ignored", "normal", "high"]
                        .get(k.priority as usize)
                        .unwrap_or(&"?")
                );
                p!(o, "\tCipher:     {}", k.area_encryption);
                p!(o, "\tCipher key: {} bits", k.area_key_size * 8);
                match k.kdf {
                    Kdf::Pbkdf2 { hash, iterations } => {
                        p!(o, "\tPBKDF:      pbkdf2");
                        p!(o, "\tHash:       {}", hash.name());
                        p!(o, "\tIterations: {iterations}");
                    }
                    Kdf::Argon2 {
                        time,
                        memory_kib,
                        cpus,
                        ..
                    } => {
                        p!(o, "\tPBKDF:      {}", k.kdf.type_name());
                        p!(o, "\tTime cost:  {time}");
                        p!(o, "\tMemory:     {memory_kib}");
                        p!(o, "\tThreads:    {cpus}");
                    }
                }
                p!(o, "\tSalt:       {}", hex_lines(&k.salt, "\t            "));
                p!(o, "\tAF stripes: {}", k.stripes);
                p!(o, "\tAF hash:    {}", k.af_hash.name());
                p!(o, "\tArea offset:{} [bytes]", k.area_offset);
                p!(o, "\tArea length:{} [bytes]", k.area_size);
                if let Some((d, _)) = m.digest_of(*n) {
                    p!(o, "\tDigest ID:  {d}");
                }
            }
            for (n, t) in &m.other_keyslots {
                p!(o, "  {n}: {t} (not used by udm)");
            }
            p!(o, "Tokens:");
            if let Some(tokens) = m.value.get("tokens").and_then(|t| t.as_object()) {
                for (n, t) in tokens {
                    p!(
                        o,
                        "  {n}: {}",
                        t.get("type").and_then(|x| x.as_str()).unwrap_or("?")
                    );
                    if let Some(ks) = m.tokens.get(&n.parse().unwrap_or(u32::MAX)) {
                        for k in ks {
                            p!(o, "\tKeyslot:    {k}");
                        }
                    }
                }
            }
            p!(o, "Digests:");
            for (n, d) in &m.digests {
                p!(o, "  {n}: pbkdf2");
                p!(o, "\tHash:       {}", d.hash.name());
                p!(o, "\tIterations: {}", d.iterations);
                p!(o, "\tSalt:       {}", hex_lines(&d.salt, "\t            "));
                p!(
                    o,
                    "\tDigest:     {}",
                    hex_lines(&d.digest, "\t            ")
                );
            }
        }
    }
    emit(&o)
}

fn cmd_add_key(a: AddKeyArgs) -> Result<(), LuksError> {
    let mut v = load(&a.image, &a.common, true)?;
    let old = read_passphrase(
        a.common.key_file.as_deref(),
        "Enter any existing passphrase: ",
    )?;
    let (_, key) = v.unlock(&old, None)?;
    let new = passphrase(
        a.new_key_file.as_deref(),
        "Enter new passphrase for key slot: ",
        true,
    )?;
    let mut pb = a.pbkdf.clone();
    if v.version() == 1 {
        if let Header::Luks1(h) = &v.header {
            pb.hash = Some(h.hash.name().to_string());
        }
    }
    let kdf = resolve_kdf(&pb, v.version(), key.len())?;
    let slot = v.add_key(&key, &new, a.key_slot, kdf, get_hash(&pb)?)?;
    eprintln!("Key slot {slot} created.");
    Ok(())
}

fn last_slot_guard(v: &Volume, slot: u32, batch: bool) -> Result<(), LuksError> {
    let active = v.active_slots();
    if active.len() == 1 && active[0] == slot && !batch {
        let ok = confirm("This is the last keyslot. Device will become unusable after purging this key.\nAre you sure? (Type 'YES' in capital letters): ")?;
        if !ok {
            return Err(LuksError::Usage(
                "Operation aborted, the keyslot was NOT wiped.".into(),
            ));
        }
    }
    Ok(())
}

fn cmd_remove_key(a: RemoveKeyArgs) -> Result<(), LuksError> {
    let mut v = load(&a.image, &a.common, true)?;
    let pass = read_passphrase(
        a.common.key_file.as_deref(),
        "Enter passphrase to be deleted: ",
    )?;
    let (slot, _key) = v.unlock(&pass, None)?;
    last_slot_guard(&v, slot, a.common.batch_mode)?;
    v.kill_slot(slot)?;
    eprintln!("Key slot {slot} removed.");
    Ok(())
}

fn cmd_kill_slot(a: KillSlotArgs) -> Result<(), LuksError> {
    let mut v = load(&a.image, &a.common, true)?;
    if !v.active_slots().contains(&a.slot) {
        return Err(LuksError::Usage(format!(
            "Keyslot {} is not active.",
            a.slot
        )));
    }
    // As cryptsetup: unless in batch mode without a key file, prove knowledge
    // of a passphrase of this volume (cryptsetup accepts any active slot's).
    if a.common.key_file.is_some() || !a.common.batch_mode {
        let pass = read_passphrase(
            a.common.key_file.as_deref(),
            "Enter any remaining passphrase: ",
        )?;
        v.unlock(&pass, None)?;
    }
    last_slot_guard(&v, a.slot, a.common.batch_mode)?;
    v.kill_slot(a.slot)?;
    eprintln!("Key slot {} removed.", a.slot);
    Ok(())
}

fn cmd_test(a: TestArgs) -> Result<(), LuksError> {
    let v = load(&a.image, &a.common, false)?;
    v.check_requirements()?;
    let pass = read_passphrase(
        a.common.key_file.as_deref(),
        &format!("Enter passphrase for {}: ", a.image.display()),
    )?;
    let (slot, key) = v.unlock(&pass, a.key_slot)?;
    v.activation(key, slot)?;
    eprintln!("Key slot {slot} unlocked.");
    Ok(())
}

fn cmd_backup(a: BackupArgs) -> Result<(), LuksError> {
    let v = load(&a.image, &a.common, false)?;
    let len = v.header_len();
    if a.header_backup_file.exists() {
        return Err(LuksError::Usage(format!(
            "Requested header backup file {} already exists.",
            a.header_backup_file.display()
        )));
    }
    let mut buf = vec![0u8; len as usize];
    v.meta.read_at(0, &mut buf)?;
    let mut out = Disk::create(&a.header_backup_file)?;
    out.write_at(0, &buf)?;
    out.sync()
}

fn cmd_restore(a: BackupArgs) -> Result<(), LuksError> {
    // The backup must itself be a valid header (validated as a detached header of the image).
    let backup = Volume::load(&a.image, Some(&a.header_backup_file), false)?;
    let len = backup.header_len();
    let target = a.common.header.as_deref().unwrap_or(&a.image);
    if let Ok(cur) = Volume::load(&a.image, a.common.header.as_deref(), false) {
        if cur.uuid() != backup.uuid() && !a.common.batch_mode {
            let q = format!(
                "Device {} already contains a LUKS header with UUID {}; replacing it with UUID {} destroys its keyslots.\nAre you sure? (Type 'YES' in capital letters): ",
                target.display(),
                cur.uuid(),
                backup.uuid()
            );
            if !confirm(&q)? {
                return Err(LuksError::Usage("Operation aborted.".into()));
            }
        }
    }
    let mut buf = vec![0u8; len as usize];
    backup.meta.read_at(0, &mut buf)?;
    let mut out = Disk::open(target, true)?;
    if out.size()? < len {
        return Err(LuksError::Usage(format!(
            "Device {} is too small for the {len}-byte header backup.",
            target.display()
        )));
    }
    out.write_at(0, &buf)?;
    out.sync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16k"), Ok(16384));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("1x").is_err());
        assert!(parse_size("99999999999999999999t").is_err());
    }
}
