//! Arguments of `udm luks` verbs (clap), with cryptsetup's option names.

use crate::luks::passphrase::KeySource;
use crate::luks::pbkdf::PbkdfChoice;
use crate::mem::parse_size;
use clap::Args;
use std::path::PathBuf;

/// Options every verb shares.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Detached LUKS header file (the image then holds only data).
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// Read the passphrase from FILE (whole file; `-` for stdin).
    #[arg(long, short = 'd')]
    pub key_file: Option<PathBuf>,
    /// Bytes to skip at the start of the key file.
    #[arg(long, default_value_t = 0)]
    pub keyfile_offset: u64,
    /// Read exactly this many bytes of the key file.
    #[arg(long, short = 'l')]
    pub keyfile_size: Option<u64>,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q')]
    pub batch_mode: bool,
    /// Try passphrases even if the keyslots demand more KDF work or memory
    /// than udm's limit (a header from an untrusted source can make each
    /// try cost minutes or gigabytes).
    #[arg(long)]
    pub no_kdf_limit: bool,
    /// Unlock and map a volume whose header asks for the null cipher or
    /// ECB (refused by default: an edited header can ask for them).
    #[arg(long)]
    pub allow_weak_cipher: bool,
}

impl Common {
    pub fn key_source(&self) -> KeySource {
        KeySource {
            key_file: self.key_file.clone(),
            offset: self.keyfile_offset,
            size: self.keyfile_size,
            timeout: None,
            verify: false,
        }
    }
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

impl PbkdfArgs {
    pub fn choice(&self) -> PbkdfChoice {
        PbkdfChoice {
            pbkdf: self.pbkdf.clone(),
            iter_time: self.iter_time,
            force_iterations: self.pbkdf_force_iterations,
            memory: self.pbkdf_memory,
            parallel: self.pbkdf_parallel,
            hash: self.hash.clone(),
        }
    }
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
