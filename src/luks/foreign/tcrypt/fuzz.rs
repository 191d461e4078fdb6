//! Hooks for the `tcrypt` fuzz driver (`crate::fuzzing`, feature
//! `fuzzing`): the header stages after key derivation, so that a fuzz run
//! does not spend the KDF's seconds on every input; and the decryption of
//! a real header with its passphrase, which makes the driver's seeds.

use super::*;

/// Bytes of the decrypted header (the sector after its 64-byte salt).
pub const HEADER_LEN: usize = HDR_LEN;
/// Bytes of a header key.
pub const KEY_LEN: usize = HDR_KEY_LEN;

/// Parse a decrypted header as if KDF number `kdf` and chain number
/// `chain` (taken modulo their counts) had decrypted it.
pub fn parse_plain(plain: &[u8; HDR_LEN], kdf: usize, chain: usize) -> Result<Header, LuksError> {
    parse(
        plain,
        &KDFS[kdf % KDFS.len()],
        &CHAINS[chain % CHAINS.len()],
    )
}

/// Every chain `p` allows tried on `enc` with the header key `key`; true
/// if one found the magic.
pub fn try_every_chain(
    key: &[u8; HDR_KEY_LEN],
    enc: &[u8; HDR_LEN],
    p: &Params,
) -> Result<bool, LuksError> {
    try_chains(key, enc, p).map(|f| f.is_some())
}

/// The decrypted header of `raw` (salt and encrypted header) with the
/// numbers of its KDF and chain, using the real KDFs (slow: for making
/// seeds only).
pub fn decrypt_for_seed(
    raw: &[u8; 512],
    pass: &[u8],
    p: &Params,
) -> Option<(usize, usize, [u8; HDR_LEN])> {
    let pool = key_pool(pass, p).ok()?;
    let enc: &[u8; HDR_LEN] = raw[SALT_LEN..].try_into().ok()?;
    for (ki, kdf) in KDFS.iter().enumerate() {
        if !kdf_allowed(kdf, p) {
            continue;
        }
        let Some(key) = derive(kdf, &pool, &raw[..SALT_LEN], p.pim).ok()? else {
            continue;
        };
        if let Some((d, chain)) = try_chains(&key, enc, p).ok()? {
            // CHAINS is a constant: compare contents, not addresses.
            let ci = CHAINS
                .iter()
                .position(|c| c.name == chain.name && c.mode == chain.mode)?;
            return Some((ki, ci, *d));
        }
    }
    None
}
