//! LUKS2 JSON metadata. The parsed `serde_json::Value` is kept beside the
//! typed views and edited in place, so tokens, unknown members and member
//! order survive a rewrite untouched. By job: `read` validates JSON into a
//! [`Metadata`], `types` holds the typed per-object views, `edit` makes the
//! changes udm writes (keyslots, tokens, config).

mod edit;
mod fields;
mod pretty;
mod read;
#[cfg(test)]
mod tests;
mod types;
pub mod validate;

pub use fields::parse_u64str;
pub use pretty::{hostile_char, to_pretty};
pub use types::{Digest, Keyslot, Segment, Unusable};

use base64::Engine;
use serde_json::Value;
use std::collections::BTreeMap;

/// cryptsetup's limit on keyslots and tokens.
pub const MAX_KEYSLOTS: u32 = 32;
pub const MAX_TOKENS: u32 = 32;
/// Largest key udm accepts (bytes).
pub const MAX_KEY_SIZE: u64 = 512;
/// Largest keyslots area cryptsetup allows.
pub const MAX_KEYSLOTS_SIZE: u64 = 128 * 1024 * 1024;

/// Validated metadata plus the JSON it came from.
#[derive(Clone, Debug)]
pub struct Metadata {
    pub value: Value,
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// Keyslots of types udm does not unlock (e.g. `reencrypt`), with their type.
    pub other_keyslots: BTreeMap<u32, String>,
    /// `luks2` keyslots udm cannot unlock, with why (the error when used).
    pub unusable: BTreeMap<u32, Unusable>,
    pub segments: BTreeMap<u32, Segment>,
    pub digests: BTreeMap<u32, Digest>,
    pub tokens: BTreeMap<u32, Vec<u32>>,
    pub json_size: u64,
    pub keyslots_size: u64,
    pub flags: Vec<String>,
    pub requirements: Vec<String>,
}

impl Metadata {
    /// The digest that verifies keyslot `slot`.
    pub fn digest_of(&self, slot: u32) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.keyslots.contains(&slot))
            .map(|(n, d)| (*n, d))
    }

    /// The digest bound to segment 0 (the volume key's digest).
    pub fn segment_digest(&self) -> Option<(u32, &Digest)> {
        self.digests
            .iter()
            .find(|(_, d)| d.segments.contains(&0))
            .map(|(n, d)| (*n, d))
    }

    /// Serialized compact JSON, as written to disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.value).unwrap_or_default()
    }
}

/// Standard Base64, as LUKS2 stores salts and digests.
pub fn b64_encode(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}
