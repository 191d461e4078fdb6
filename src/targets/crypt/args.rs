//! The crypt target's arguments: the feature options (`crypt_ctr_optional`),
//! and the hex key, each error naming the argument it is about and never
//! quoting the key.

use zeroize::Zeroizing;

use crate::core::units::parse_decimal;
use crate::targets::TargetError;

/// Optional parameters (dm-crypt feature args).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CryptOptions {
    pub allow_discards: bool,
    pub same_cpu_crypt: bool,
    pub high_priority: bool,
    pub submit_from_crypt_cpus: bool,
    pub no_read_workqueue: bool,
    pub no_write_workqueue: bool,
    pub sector_size: u32,
    pub iv_large_sectors: bool,
    /// `integrity:<bytes>:<type>`: tag-area bytes per sector (0: none).
    pub integrity_tag: u32,
    /// The `<type>` is `aead` (false: `none`, an IV-only tag area).
    pub integrity_aead: bool,
}

/// dm-crypt's largest `integrity:` tag (`MAX_TAG_SIZE`).
const MAX_TAG_SIZE: u64 = 480;

/// Parse the feature args group starting at `args[5]`.
pub(super) fn parse_options(args: &[String]) -> Result<CryptOptions, TargetError> {
    let mut o = CryptOptions {
        sector_size: 512,
        ..Default::default()
    };
    let Some(count) = args.get(5) else {
        return Ok(o);
    };
    let n = parse_decimal(count)
        .ok()
        .filter(|n| *n <= 9)
        .ok_or_else(|| {
            TargetError::at(
                5,
                format!("invalid number of optional parameters '{count}' (0 to 9)"),
            )
        })?;
    let have = args.len() - 6;
    if n != have as u64 {
        return Err(TargetError::at(
            5,
            format!("{n} optional parameters announced but {have} given"),
        ));
    }
    for (i, word) in args[6..].iter().enumerate() {
        let idx = 6 + i;
        let lower = word.to_ascii_lowercase();
        match lower.as_str() {
            "allow_discards" => o.allow_discards = true,
            "same_cpu_crypt" => o.same_cpu_crypt = true,
            "high_priority" => o.high_priority = true,
            "submit_from_crypt_cpus" => o.submit_from_crypt_cpus = true,
            "no_read_workqueue" => o.no_read_workqueue = true,
            "no_write_workqueue" => o.no_write_workqueue = true,
            "iv_large_sectors" => o.iv_large_sectors = true,
            s if s.starts_with("sector_size:") => {
                let v = &s["sector_size:".len()..];
                o.sector_size = parse_decimal(v)
                    .ok()
                    .filter(|n| (512..=4096).contains(n) && n.is_power_of_two())
                    .map(|n| n as u32)
                    .ok_or_else(|| {
                        TargetError::at(
                            idx,
                            format!(
                                "invalid sector_size '{v}' (a power of two from 512 to 4096)"
                            ),
                        )
                    })?;
            }
            s if s.starts_with("integrity:") => {
                let (n, kind) = parse_integrity(&word["integrity:".len()..], idx)?;
                o.integrity_tag = n;
                o.integrity_aead = kind;
            }
            s if s.starts_with("integrity_key_size:") => {
                return Err(TargetError::at(
                    idx,
                    format!(
                        "'{word}' is not supported by udm (the HMAC key size follows from the \
                         authenc cipher, as in kernels before 6.12)"
                    ),
                ));
            }
            _ => {
                return Err(TargetError::at(
                    idx,
                    format!(
                        "unknown optional parameter '{word}' (allow_discards, same_cpu_crypt, high_priority, \
                         submit_from_crypt_cpus, no_read_workqueue, no_write_workqueue, sector_size:N, iv_large_sectors, \
                         integrity:<bytes>:aead)"
                    ),
                ))
            }
        }
    }
    Ok(o)
}

/// `<bytes>:<type>` of `integrity:`, as `crypt_ctr_optional`: 1 to 480
/// bytes, `aead` or `none` (any case).
fn parse_integrity(v: &str, idx: usize) -> Result<(u32, bool), TargetError> {
    let bad = |why: &str| {
        TargetError::at(
            idx,
            format!("invalid integrity arguments 'integrity:{v}': {why}"),
        )
    };
    let (n, kind) = v
        .split_once(':')
        .ok_or_else(|| bad("expected integrity:<bytes>:<type>"))?;
    let n = parse_decimal(n)
        .ok()
        .filter(|n| (1..=MAX_TAG_SIZE).contains(n))
        .ok_or_else(|| bad("<bytes> must be 1 to 480"))?;
    let aead = if kind.eq_ignore_ascii_case("aead") {
        true
    } else if kind.eq_ignore_ascii_case("none") {
        false
    } else {
        return Err(bad("unknown integrity profile (aead or none)"));
    };
    Ok((n as u32, aead))
}

/// Decode a dm-crypt key argument: hex (key size = length / 2, a trailing
/// odd digit ignored as the kernel does), or `-` for an empty key. Errors
/// never quote the key.
pub(super) fn parse_key(arg: &str) -> Result<Zeroizing<Vec<u8>>, TargetError> {
    if arg == "-" {
        return Ok(Zeroizing::new(Vec::new()));
    }
    if arg.starts_with(':') {
        return Err(TargetError::at(
            1,
            "kernel keyring keys (':<size>:<type>:<description>') are not supported by udm; give the key in hex",
        ));
    }
    let n = arg.len() / 2;
    let mut key = Zeroizing::new(vec![0u8; n]);
    hex::decode_to_slice(&arg.as_bytes()[..2 * n], &mut key[..]).map_err(|_| {
        TargetError::at(
            1,
            format!(
                "the key is not valid hexadecimal ({} characters; the key is not shown)",
                arg.len()
            ),
        )
    })?;
    Ok(key)
}
