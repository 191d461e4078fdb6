//! Volume keys during reencryption: there are two (old and new), each
//! verified by its own digest, and one passphrase may open a keyslot of
//! either. Keys live in `Zeroizing` buffers and are wiped on drop.

use crate::luks::cost::SlotCost;
use crate::luks::error::LuksError;
use crate::luks::kdf::Kdf;
use crate::luks::keyslot::{self, SlotParams};
use crate::luks::volume::Volume;
use zeroize::Zeroizing;

/// A volume key, wiped on drop.
pub type Key = Zeroizing<Vec<u8>>;

/// True if `key` matches digest `digest` of the header.
pub fn matches(vol: &Volume, digest: u32, key: &[u8]) -> bool {
    let Some(h) = vol.header.luks2() else {
        return false;
    };
    h.meta
        .digests
        .get(&digest)
        .is_some_and(|d| keyslot::digest_matches(d, key))
}

/// Unlock the key of digest `digest` with `passphrase`, trying the
/// keyslots bound to it (only `only` if given). Returns the slot and key.
pub fn unlock_digest(
    vol: &Volume,
    digest: u32,
    passphrase: &[u8],
    only: Option<u32>,
) -> Result<(u32, Key), LuksError> {
    let Some(h) = vol.header.luks2() else {
        return Err(LuksError::NotLuks2(vol.data_path.display().to_string()));
    };
    let d = h
        .meta
        .digests
        .get(&digest)
        .ok_or_else(|| LuksError::field("digests", digest, "missing"))?;
    let mut slots: Vec<u32> = d
        .keyslots
        .iter()
        .copied()
        .filter(|s| h.meta.keyslots.contains_key(s))
        .filter(|s| only.is_none_or(|o| o == *s))
        .collect();
    slots.sort_by_key(|s| (std::cmp::Reverse(h.meta.keyslots[s].priority), *s));
    if let Some(limit) = &vol.cost_limit {
        let digest_kdf = Kdf::Pbkdf2 {
            hash: d.hash,
            iterations: d.iterations,
        };
        let costs: Vec<_> = slots
            .iter()
            .map(|s| SlotCost {
                slot: *s,
                kdf: h.meta.keyslots[s].kdf,
                digest: Some(digest_kdf),
                key_len: h.meta.keyslots[s].area_key_size as usize,
                digest_len: d.digest.len(),
            })
            .collect();
        limit.check(&costs)?;
    }
    for s in slots {
        let k = &h.meta.keyslots[&s];
        let p = SlotParams::luks2(k);
        let key = keyslot::unlock(&vol.meta, &p, passphrase)?;
        if matches(vol, digest, &key) {
            return Ok((s, key));
        }
    }
    Err(LuksError::WrongPassphrase)
}

/// The old and new keys of a reencryption (None where that side is
/// plaintext). Both must open with `passphrase`: cryptsetup adds the new
/// keyslot with the same passphrase as the old one.
pub fn unlock_both(
    vol: &Volume,
    digest_old: Option<u32>,
    digest_new: Option<u32>,
    passphrase: &[u8],
) -> Result<(Option<Key>, Option<Key>), LuksError> {
    let old = match digest_old {
        Some(d) => Some(unlock_digest(vol, d, passphrase, None)?.1),
        None => None,
    };
    let new = match digest_new {
        Some(d) if Some(d) == digest_old => old.clone(),
        Some(d) => Some(unlock_digest(vol, d, passphrase, None)?.1),
        None => None,
    };
    Ok((old, new))
}
