//! Numbers as tables, headers and command lines write them: strict decimal
//! integers (table fields, target arguments, LUKS2's decimal strings) and
//! sizes with a binary suffix (`--memory-budget 32M`). One parser for each,
//! so every place accepts and refuses the same spellings; each caller turns
//! the refusal into an error naming its own field.

/// Why a decimal string was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecimalError {
    /// Nothing was given.
    Empty,
    /// Something other than the digits 0-9 (a sign, a space, `0x`, `_`, `.`).
    NotDigits,
    /// More than `u64::MAX`.
    TooLarge,
}

/// An unsigned decimal written with ASCII digits only, as dm and the LUKS2
/// JSON write them: no sign, no spaces, no separators, no other base
/// (leading zeros are accepted, as `strtoull` does).
pub fn parse_decimal(s: &str) -> Result<u64, DecimalError> {
    if s.is_empty() {
        return Err(DecimalError::Empty);
    }
    let mut v = 0u64;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return Err(DecimalError::NotDigits);
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(DecimalError::TooLarge)?;
    }
    Ok(v)
}

/// [`parse_decimal`] with at most `max_digits` digits, leading zeros
/// included: LUKS2's JSON reader (json-c with cryptsetup's checks) refuses
/// a longer string even when its value would fit, so a header udm accepts
/// is one cryptsetup accepts too. Too many digits is `TooLarge`.
pub fn parse_decimal_digits(s: &str, max_digits: usize) -> Result<u64, DecimalError> {
    let v = parse_decimal(s)?;
    if s.len() > max_digits {
        return Err(DecimalError::TooLarge);
    }
    Ok(v)
}

/// A size such as `4096`, `64K`, `32M`, `1G`, `2T` (binary multiples; an
/// optional trailing `B` or `iB` is accepted: `32MiB`, `1GB`; surrounding
/// spaces are ignored). Errors quote the input and say what would do.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(
            "empty size: give a number with an optional K, M, G or T suffix (e.g. 32M)".into(),
        );
    }
    let (num, suffix) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n = match parse_decimal(num) {
        Ok(n) => n,
        Err(DecimalError::TooLarge) => {
            return Err(format!("invalid size {s:?}: the number is too large"))
        }
        Err(_) => {
            return Err(format!(
                "invalid size {s:?}: it must start with a number (e.g. 32M, 1G, 4096)"
            ))
        }
    };
    let upper = suffix.to_ascii_uppercase();
    let unit = match upper.strip_suffix("IB") {
        Some(u) => u,
        None if upper.len() > 1 => upper.strip_suffix('B').unwrap_or(&upper),
        None => &upper,
    };
    let shift = match unit {
        "" | "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "invalid size {s:?}: unknown suffix {suffix:?} (use K, M, G or T, e.g. 32M)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size {s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_digits_caps_the_length_not_only_the_value() {
        assert_eq!(parse_decimal_digits("00000000000000000001", 20), Ok(1));
        assert_eq!(
            parse_decimal_digits("000000000000000000001", 20),
            Err(DecimalError::TooLarge)
        );
        assert_eq!(parse_decimal_digits("", 20), Err(DecimalError::Empty));
        assert_eq!(parse_decimal_digits("+1", 20), Err(DecimalError::NotDigits));
        assert_eq!(
            parse_decimal_digits("18446744073709551616", 20),
            Err(DecimalError::TooLarge)
        );
    }

    #[test]
    fn decimals_are_digits_only() {
        assert_eq!(parse_decimal("0"), Ok(0));
        assert_eq!(parse_decimal("007"), Ok(7));
        assert_eq!(parse_decimal("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_decimal("18446744073709551616"),
            Err(DecimalError::TooLarge)
        );
        assert_eq!(parse_decimal(""), Err(DecimalError::Empty));
        for bad in ["+1", "-1", " 1", "1 ", "0x10", "1_000", "1.5", "١"] {
            assert_eq!(parse_decimal(bad), Err(DecimalError::NotDigits), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("16k"), Ok(16384));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("32MiB"), Ok(32 << 20));
        assert_eq!(parse_size("1GB"), Ok(1 << 30));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size(" 8M "), Ok(8 << 20));
        for bad in [
            "",
            "M",
            "12Q",
            "-1",
            "1.5G",
            "1x",
            "99999999999999999999",
            "99999999999999999999t",
            "20000000000T",
            "1 G",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains("size"), "{bad}: {e}");
        }
    }
}
