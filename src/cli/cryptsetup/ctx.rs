//! The parsed command line as every action sees it, and the requests the
//! actions build from it (device, key sources, unlock and key-derivation
//! options). A leaf: it uses none of the action files, so they can all
//! share it without using each other.

use std::path::PathBuf;
use std::time::Duration;

use super::args::Args;
use crate::cli::ui::{Style, Ui};
use crate::luks::error::LuksError;
use crate::luks::ops::{self, Device, Unlock};
use crate::luks::passphrase::KeySource;
use crate::luks::pbkdf::PbkdfChoice;

/// A local path as the server must see it (absolute: the server does
/// not share this command's working directory); other names unchanged.
pub(super) fn server_path(p: &str) -> String {
    match std::fs::canonicalize(p) {
        Ok(abs) if !p.contains("://") && !p.starts_with("rbd:") => abs.display().to_string(),
        _ => p.to_string(),
    }
}

/// A device argument as it goes into a table sent to the server: made
/// absolute by [`server_path`], then escaped as a table word.
pub(super) fn table_dev(p: &str) -> String {
    crate::core::table::escape_arg(&server_path(p)).to_string()
}

/// What a verb returns: Ok, or the error to print and its exit code.
pub(crate) type Outcome = Result<(), LuksError>;

/// The parsed command line as the handlers see it.
pub(crate) struct Ctx {
    pub a: Args,
    /// Positional arguments after the action.
    pub argv: Vec<String>,
    /// `--type`, or what an old action name implies (`luksOpen` → luks).
    pub device_type: Option<String>,
}

impl Ctx {
    pub fn verbose(&self) -> bool {
        // udm's debug output has no JSON metadata dumps: --debug-json
        // gives what --debug gives.
        self.a.has("verbose") || self.a.has("debug") || self.a.has("debug-json")
    }

    pub fn batch(&self) -> bool {
        self.a.has("batch-mode")
    }

    /// `log_verbose` of cryptsetup: a message only with `-v`.
    pub fn verbose_msg(&self, m: &str) {
        if self.verbose() {
            println!("{m}");
        }
    }
}

pub(super) fn ui(c: &Ctx) -> Ui {
    Ui::new(c.batch(), Style::Cryptsetup)
}

pub(super) fn device(c: &Ctx) -> Device {
    Device {
        path: PathBuf::from(&c.argv[0]),
        header: c.a.str("header").map(PathBuf::from),
        no_cost_limit: c.a.has("no-kdf-limit"),
        allow_weak_cipher: c.a.has("allow-weak-cipher"),
    }
}

pub(super) fn key_source(c: &Ctx, key_file: Option<&str>) -> KeySource {
    KeySource {
        key_file: key_file.map(PathBuf::from),
        offset: c.a.u64("keyfile-offset").unwrap_or(0),
        size: c.a.u32("keyfile-size").map(u64::from).filter(|&s| s > 0),
        timeout: c
            .a
            .u32("timeout")
            .filter(|&t| t > 0)
            .map(|t| Duration::from_secs(u64::from(t))),
        verify: c.a.has("verify-passphrase"),
    }
}

pub(super) fn unlock(c: &Ctx) -> Unlock {
    Unlock {
        key: key_source(c, c.a.str("key-file")),
        slot: c.a.i32("key-slot").map(|s| s as u32),
        tries: c.a.u32("tries").unwrap_or(3),
        unbound: false,
        token: ops::token::TokenUse {
            try_first: false,
            only: c.a.has("token-only"),
            id: c.a.i32("token-id").and_then(|n| u32::try_from(n).ok()),
            kind: c.a.str("token-type").map(str::to_string),
        },
    }
}

/// Where a new passphrase comes from: `file` (the positional key file or
/// `--new-keyfile`) with `--new-keyfile-offset` and `--new-keyfile-size`.
pub(super) fn new_key_source(c: &Ctx, file: Option<&str>) -> KeySource {
    let mut k = key_source(c, file);
    k.offset = c.a.u64("new-keyfile-offset").unwrap_or(0);
    k.size =
        c.a.u32("new-keyfile-size")
            .map(u64::from)
            .filter(|&s| s > 0);
    k
}

/// [`unlock`] for the verbs that try the volume's tokens before asking
/// for a passphrase, as cryptsetup's `open` and `luksResume` do.
pub(super) fn unlock_tokens_first(c: &Ctx) -> Unlock {
    let mut u = unlock(c);
    u.token.try_first = true;
    u
}

/// The key-derivation options of the command line (also used by
/// `reencrypt` for the new keyslot).
pub(super) fn pbkdf(c: &Ctx) -> PbkdfChoice {
    PbkdfChoice {
        pbkdf: c.a.str("pbkdf").map(str::to_string),
        iter_time: c.a.u32("iter-time"),
        force_iterations: c.a.u32("pbkdf-force-iterations"),
        memory: c.a.u32("pbkdf-memory"),
        parallel: c.a.u32("pbkdf-parallel"),
        hash: c.a.str("hash").map(str::to_string),
    }
}
