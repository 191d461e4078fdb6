//! `udm luks ...`: LUKS verbs under udm's own names with cryptsetup's
//! option names and defaults. Every verb is a thin layer over
//! `luks::ops`, the same functions `udm cryptsetup` calls: this file only
//! maps arguments (`args.rs`) to requests and results to exit codes.

mod args;

pub use args::*;

use crate::cli::ui::{Style, Ui};
use crate::luks::error::LuksError;
use crate::luks::ops::{
    self, format::FormatOpts, info::DumpKind, keys::AddKeyOpts, Device, Unlock,
};
use crate::luks::passphrase::KeySource;
use clap::Subcommand;

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
    /// Reencrypt, encrypt or decrypt in place, resumable and interoperable
    /// with cryptsetup (cryptsetup reencrypt; takes its options, e.g.
    /// `--key-file`, `--cipher`, `--resilience`, `--hotzone-size`,
    /// `--init-only`, `--resume-only`, `--encrypt`, `--decrypt`, `--header`).
    #[command(disable_help_flag = true)]
    Reencrypt {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

fn device(image: &std::path::Path, c: &Common) -> Device {
    Device {
        path: image.to_path_buf(),
        header: c.header.clone(),
        no_cost_limit: c.no_kdf_limit,
        allow_weak_cipher: c.allow_weak_cipher,
    }
}

fn unlock(c: &Common, slot: Option<u32>) -> Unlock {
    Unlock {
        key: c.key_source(),
        slot,
        tries: 3,
        unbound: false,
        token: Default::default(),
    }
}

/// Run a verb; returns the process exit code (cryptsetup's codes).
pub fn run(c: Cmd) -> i32 {
    crate::mem::secret::forbid_core_dumps_or_warn();
    let r = match c {
        // The same code as `udm cryptsetup reencrypt`: only the name differs.
        Cmd::Reencrypt { args } => {
            let mut argv = vec![std::ffi::OsString::from("reencrypt")];
            argv.extend(args);
            return crate::cli::cryptsetup::main(argv);
        }
        Cmd::Format(a) => {
            let ui = Ui::new(a.common.batch_mode, Style::Strict);
            let version = match a.luks_type.as_str() {
                "luks2" | "luks" => Ok(2),
                "luks1" => Ok(1),
                t => Err(LuksError::Usage(format!(
                    "Unsupported LUKS type {t} (luks1, luks2)."
                ))),
            };
            version.and_then(|version| {
                let o = FormatOpts {
                    dev: device(&a.image, &a.common),
                    key: a.common.key_source(),
                    version,
                    cipher: Some(a.cipher.clone()),
                    key_bits: Some(a.key_size),
                    sector_size: a.sector_size,
                    label: a.label.clone(),
                    uuid: a.uuid.clone(),
                    metadata_size: a.luks2_metadata_size,
                    keyslots_size: a.luks2_keyslots_size,
                    pbkdf: a.pbkdf.choice(),
                    create_size: a.size,
                    ..Default::default()
                };
                ops::format::luks_format(&o, &ui).map(|_| ())
            })
        }
        Cmd::Dump(a) => {
            let ui = Ui::new(true, Style::Strict);
            let kind = if a.dump_volume_key {
                DumpKind::VolumeKey(None)
            } else if a.json {
                DumpKind::Json
            } else {
                DumpKind::Header
            };
            ops::info::luks_dump(
                &device(&a.image, &a.common),
                &kind,
                &unlock(&a.common, None),
                &ui,
            )
            .and_then(|t| {
                let nl = matches!(kind, DumpKind::Json);
                crate::cli::ui::emit(t.as_bytes(), nl)
            })
        }
        Cmd::AddKey(a) => {
            let ui = Ui::new(a.common.batch_mode, Style::Strict);
            let o = AddKeyOpts {
                dev: device(&a.image, &a.common),
                unlock: unlock(&a.common, None),
                new_key: KeySource::file(a.new_key_file.as_deref()),
                new_slot: a.key_slot,
                volume_key_file: None,
                pbkdf: a.pbkdf.choice(),
            };
            ops::keys::add_key(&o, &ui).map(|slot| eprintln!("Key slot {slot} created."))
        }
        Cmd::RemoveKey(a) => {
            let ui = Ui::new(a.common.batch_mode, Style::Strict);
            ops::keys::remove_key(&device(&a.image, &a.common), &unlock(&a.common, None), &ui)
                .map(|slot| eprintln!("Key slot {slot} removed."))
        }
        Cmd::KillSlot(a) => {
            let ui = Ui::new(a.common.batch_mode, Style::Strict);
            // As cryptsetup: unless in batch mode without a key file, prove
            // knowledge of another slot's passphrase.
            let proof = (a.common.key_file.is_some() || !a.common.batch_mode)
                .then(|| unlock(&a.common, None));
            ops::keys::kill_slot(&device(&a.image, &a.common), a.slot, proof.as_ref(), &ui)
                .map(|()| eprintln!("Key slot {} removed.", a.slot))
        }
        Cmd::TestPassphrase(a) => {
            let ui = Ui::new(true, Style::Strict);
            ops::test_passphrase(
                &device(&a.image, &a.common),
                &unlock(&a.common, a.key_slot),
                &ui,
            )
            .map(|slot| eprintln!("Key slot {slot} unlocked."))
        }
        Cmd::HeaderBackup(a) => {
            let ui = Ui::new(a.common.batch_mode, Style::Strict);
            ops::header::backup(&device(&a.image, &a.common), &a.header_backup_file, &ui)
        }
        Cmd::HeaderRestore(a) => {
            let ui = Ui::new(a.common.batch_mode, Style::Strict);
            ops::header::restore(&device(&a.image, &a.common), &a.header_backup_file, &ui)
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("udm luks: {e}");
            e.exit_code()
        }
    }
}
