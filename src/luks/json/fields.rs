//! Typed access to members of a JSON object, each failure naming the
//! dotted path of the member (`keyslots.0.area.offset`) and what it must be.

use crate::luks::error::LuksError;
use crate::luks::hash::HashAlg;
use base64::Engine;
use serde_json::{Map, Value};

pub(super) fn obj<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, LuksError> {
    v.as_object()
        .ok_or_else(|| LuksError::field(field, short(v), "must be a JSON object"))
}

pub(super) fn short(v: &Value) -> String {
    v.to_string()
}

pub(super) fn member<'a>(
    o: &'a Map<String, Value>,
    name: &str,
    field: &str,
) -> Result<&'a Value, LuksError> {
    o.get(name).ok_or_else(|| {
        LuksError::field(
            format!("{field}.{name}"),
            "(missing)",
            "required member is missing",
        )
    })
}

pub(super) fn string<'a>(
    o: &'a Map<String, Value>,
    name: &str,
    field: &str,
) -> Result<&'a str, LuksError> {
    let v = member(o, name, field)?;
    v.as_str()
        .ok_or_else(|| LuksError::field(format!("{field}.{name}"), short(v), "must be a string"))
}

/// A 64-bit quantity stored as a decimal string.
pub(super) fn u64str(o: &Map<String, Value>, name: &str, field: &str) -> Result<u64, LuksError> {
    let s = string(o, name, field)?;
    parse_u64str(s).ok_or_else(|| {
        LuksError::field(
            format!("{field}.{name}"),
            s,
            "must be a decimal string of an unsigned 64-bit number",
        )
    })
}

/// LUKS2's decimal strings: core's one decimal parser, at most 20 digits
/// (cryptsetup refuses a longer string even with leading zeros).
pub fn parse_u64str(s: &str) -> Option<u64> {
    crate::core::units::parse_decimal_digits(s, 20).ok()
}

pub(super) fn int(
    o: &Map<String, Value>,
    name: &str,
    field: &str,
    min: u64,
    max: u64,
) -> Result<u32, LuksError> {
    let v = member(o, name, field)?;
    match v.as_u64() {
        Some(n) if n >= min && n <= max && n <= u64::from(u32::MAX) => Ok(n as u32),
        _ => Err(LuksError::field(
            format!("{field}.{name}"),
            short(v),
            format!("must be an integer in {min}..={max}"),
        )),
    }
}

pub(super) fn b64(o: &Map<String, Value>, name: &str, field: &str) -> Result<Vec<u8>, LuksError> {
    let s = string(o, name, field)?;
    if s.len() > 1024 {
        return Err(LuksError::field(format!("{field}.{name}"), s, "too long"));
    }
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| LuksError::field(format!("{field}.{name}"), s, "not valid Base64"))
}

pub(super) fn hash(o: &Map<String, Value>, name: &str, field: &str) -> Result<HashAlg, LuksError> {
    let s = string(o, name, field)?;
    HashAlg::from_name(s)
        .ok_or_else(|| LuksError::field(format!("{field}.{name}"), s, "unsupported hash"))
}

pub(super) fn id(key: &str, field: &str, max: u32) -> Result<u32, LuksError> {
    match parse_u64str(key) {
        Some(n) if n < u64::from(max) && (key == "0" || !key.starts_with('0')) => Ok(n as u32),
        _ => Err(LuksError::field(
            field,
            key,
            format!("member name must be a decimal number below {max}"),
        )),
    }
}

pub(super) fn id_list(
    o: &Map<String, Value>,
    name: &str,
    field: &str,
    max: u32,
) -> Result<Vec<u32>, LuksError> {
    let v = member(o, name, field)?;
    let a = v
        .as_array()
        .ok_or_else(|| LuksError::field(format!("{field}.{name}"), short(v), "must be an array"))?;
    let mut out = Vec::with_capacity(a.len().min(64));
    for e in a {
        let s = e.as_str().ok_or_else(|| {
            LuksError::field(
                format!("{field}.{name}"),
                short(e),
                "entries must be strings",
            )
        })?;
        out.push(id(s, &format!("{field}.{name}"), max)?);
    }
    Ok(out)
}

pub(super) fn strings(
    o: &Map<String, Value>,
    name: &str,
    field: &str,
) -> Result<Vec<String>, LuksError> {
    match o.get(name) {
        None => Ok(Vec::new()),
        Some(v) => {
            let a = v.as_array().ok_or_else(|| {
                LuksError::field(format!("{field}.{name}"), short(v), "must be an array")
            })?;
            a.iter()
                .map(|e| {
                    e.as_str().map(str::to_string).ok_or_else(|| {
                        LuksError::field(
                            format!("{field}.{name}"),
                            short(e),
                            "entries must be strings",
                        )
                    })
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_u64str;

    /// The exact set the LUKS2 reader took before it used core's parser.
    #[test]
    fn decimal_strings_as_cryptsetup_reads_them() {
        assert_eq!(parse_u64str("0"), Some(0));
        assert_eq!(parse_u64str("0016384"), Some(16384));
        assert_eq!(parse_u64str("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            " 1",
            "1 ",
            "+1",
            "-1",
            "0x10",
            "1_000",
            "18446744073709551616",
            "000000000000000000001",
        ] {
            assert_eq!(parse_u64str(bad), None, "{bad:?}");
        }
    }
}
