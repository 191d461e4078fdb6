//! Typed views of the LUKS2 JSON objects udm uses: keyslots, segments and
//! digests. They are read-only copies made by validation; edits go to the
//! JSON value itself (see `edit`), so nothing udm does not model is lost.

use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use crate::luks::kdf::Kdf;

/// A `luks2` keyslot.
#[derive(Clone, Debug)]
pub struct Keyslot {
    pub key_size: u32,
    /// 0 = ignore unless asked for by number, 1 = normal, 2 = high.
    pub priority: u32,
    pub kdf: Kdf,
    pub salt: Vec<u8>,
    pub af_hash: HashAlg,
    pub stripes: u32,
    pub area_offset: u64,
    pub area_size: u64,
    pub area_encryption: String,
    pub area_key_size: u32,
}

/// A segment; only `crypt` ones can be activated.
#[derive(Clone, Debug)]
pub struct Segment {
    pub kind: String,
    pub offset: u64,
    /// None = "dynamic" (to the end of the device).
    pub size: Option<u64>,
    pub iv_tweak: u64,
    pub encryption: String,
    pub sector_size: u32,
    pub integrity: bool,
    pub flags: Vec<String>,
}

impl Segment {
    /// Backup segments exist only during reencryption and are never mapped.
    pub fn is_backup(&self) -> bool {
        self.flags.iter().any(|f| f.starts_with("backup-"))
    }
}

/// A `pbkdf2` digest binding keyslots to segments.
#[derive(Clone, Debug)]
pub struct Digest {
    pub keyslots: Vec<u32>,
    pub segments: Vec<u32>,
    pub hash: HashAlg,
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub digest: Vec<u8>,
}

/// A `luks2` keyslot cryptsetup's validation accepts but udm cannot
/// unlock (an unknown KDF, limits udm keeps): why, to be the error when
/// the keyslot is used, and its priority (where it stands in the order of
/// keyslots tried).
#[derive(Clone, Debug)]
pub struct Unusable {
    field: String,
    value: String,
    why: String,
    pub priority: u32,
}

impl Unusable {
    pub fn new(e: LuksError, priority: u32) -> Unusable {
        let (field, value, why) = match e {
            LuksError::Field { field, value, why } => (field, value, why),
            e => (String::new(), String::new(), e.to_string()),
        };
        Unusable {
            field,
            value,
            why,
            priority,
        }
    }

    /// The error of using this keyslot.
    pub fn error(&self) -> LuksError {
        LuksError::field(&self.field, &self.value, &self.why)
    }
}
