//! The LUKS operations behind both command lines. `udm luks VERB` and
//! `udm cryptsetup VERB` only turn their argv into the request structs
//! here; reading passphrases, unlocking with retries, confirmations and
//! messages follow cryptsetup's rules in one place.
//!
//! By job: `format` (luksFormat), `keys` (add, remove, change, convert,
//! kill, erase), `info` (dump, UUID, isLuks, config), `header` (backup,
//! restore, convert, repair), `token` (LUKS2 tokens).

pub mod format;
pub mod header;
pub mod info;
pub mod keys;
pub mod token;

use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::passphrase::KeySource;
use crate::luks::secret::SecretBuf;
use crate::luks::volume::{SlotUse, Volume};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The volume a verb works on: the device (data) and, with `--header`, the
/// detached metadata file.
#[derive(Clone, Debug, Default)]
pub struct Device {
    pub path: PathBuf,
    pub header: Option<PathBuf>,
    /// Try passphrases even when keyslots demand more KDF work than udm's
    /// limit (the user said so).
    pub no_cost_limit: bool,
    /// Unlock and map null or ECB ciphers (`--allow-weak-cipher`): a
    /// header edited on the storage can ask for them.
    pub allow_weak_cipher: bool,
}

impl Device {
    pub fn new(path: impl Into<PathBuf>, header: Option<PathBuf>) -> Device {
        Device {
            path: path.into(),
            header,
            no_cost_limit: false,
            allow_weak_cipher: false,
        }
    }

    /// Where the metadata is (the header file, else the device), as
    /// cryptsetup names it in messages.
    pub fn meta_path(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.path)
    }

    /// Read and validate the header; warnings about it go to `fb`.
    pub fn load(&self, write: bool, fb: &dyn Feedback) -> Result<Volume, LuksError> {
        for p in std::iter::once(&self.path).chain(self.header.iter()) {
            if !exists(p) {
                return Err(LuksError::Device(p.display().to_string()));
            }
        }
        let mut v = match Volume::load(&self.path, self.header.as_deref(), write) {
            Ok(v) => v,
            Err(LuksError::NotLuks(_)) => {
                return Err(LuksError::NotLuks(self.meta_path().display().to_string()))
            }
            Err(e) => return Err(e),
        };
        if self.no_cost_limit {
            v.cost_limit = None;
        }
        v.allow_weak_cipher = self.allow_weak_cipher;
        for w in v.warnings() {
            fb.warn(&w);
        }
        Ok(v)
    }
}

/// Whether `p` names an existing file or device (a remote image, `rbd:` or
/// `nbd://`, is found only by opening it, which the caller does next).
pub fn exists(p: &Path) -> bool {
    p.to_str().is_some_and(crate::store::Location::is_remote) || std::fs::metadata(p).is_ok()
}

/// How to unlock an existing keyslot.
#[derive(Clone, Debug, Default)]
pub struct Unlock {
    pub key: KeySource,
    /// `--key-slot`: try this slot only.
    pub slot: Option<u32>,
    /// `--tries` for a passphrase typed on a terminal (cryptsetup: 3).
    pub tries: u32,
    /// Keyslots holding an unbound key may answer too (`--unbound`,
    /// `luksChangeKey`).
    pub unbound: bool,
    /// Tokens tried before a passphrase.
    pub token: token::TokenUse,
}

/// The volume key, wiped on drop.
pub type VolumeKey = Zeroizing<Vec<u8>>;

/// Ask for a passphrase and unlock; a wrong passphrase typed on a terminal
/// is asked again up to `tries` times, as cryptsetup does.
pub fn unlock(v: &Volume, u: &Unlock, prompt: &str) -> Result<(u32, VolumeKey), LuksError> {
    let tries = if u.key.interactive() {
        u.tries.max(1)
    } else {
        1
    };
    let usable = if u.unbound {
        SlotUse::Any
    } else {
        SlotUse::Segment
    };
    if u.token.wanted() {
        match token::unlock_by_token(v, &u.token, usable) {
            Ok(r) => return Ok(r),
            Err(token::TokenMiss::Failed(e)) => return Err(e),
            Err(miss) if u.token.only => return Err(miss.into_error(&u.token)),
            Err(_) => {}
        }
    }
    let mut last = LuksError::WrongPassphrase;
    for _ in 0..tries {
        let pass = u.key.read(prompt, false)?;
        match v.unlock_for(&pass, u.slot, usable) {
            Ok(r) => return Ok(r),
            Err(LuksError::WrongPassphrase) => {
                if tries > 1 {
                    eprintln!("No key available with this passphrase.");
                }
                last = LuksError::WrongPassphrase;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// `open --test-passphrase`: unlock and build the mapping (so a header
/// that cannot be activated fails here too), map nothing. Returns the slot.
pub fn test_passphrase(dev: &Device, u: &Unlock, fb: &dyn Feedback) -> Result<u32, LuksError> {
    let v = dev.load(false, fb)?;
    v.check_requirements()?;
    let (slot, key) = unlock(
        &v,
        u,
        &format!("Enter passphrase for {}: ", dev.meta_path().display()),
    )?;
    // An unbound key opens no segment: there is no mapping to check.
    if !v.slot_is_unbound(slot) {
        v.activation(key, slot)?;
    }
    Ok(slot)
}

/// Exactly `len` bytes of a volume key file (`--volume-key-file`).
pub fn read_volume_key_file(path: &Path, len: usize) -> Result<SecretBuf, LuksError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| LuksError::io(format!("Cannot open volume key file {}", path.display()), e))?;
    let mut b = SecretBuf::with_capacity(len);
    let mut got = 0;
    while got < len {
        let n = {
            let spare = b.spare();
            let want = (len - got).min(spare.len());
            f.read(&mut spare[..want]).map_err(|e| {
                LuksError::io(format!("Cannot read volume key file {}", path.display()), e)
            })?
        };
        if n == 0 {
            break;
        }
        b.advance(n);
        got += n;
    }
    if got != len {
        return Err(LuksError::Usage(format!(
            "Cannot read {len} bytes from volume key file {}.",
            path.display()
        )));
    }
    Ok(b)
}

/// Ask `question` unless the user confirmed already (batch mode is the
/// feedback's business); a "no" becomes `refused`.
pub(crate) fn confirm_or(
    fb: &dyn Feedback,
    question: &str,
    refused: &str,
) -> Result<(), LuksError> {
    if fb.confirm(question)? {
        Ok(())
    } else {
        Err(LuksError::Usage(refused.to_string()))
    }
}
