//! A crypt line's parameters read back as values, without building the
//! target: for callers that read a device's table (`cryptsetup status`,
//! `resize`, `luksResume`) and must not count words themselves, and the
//! one rule for how a key shows when keys are hidden.

use zeroize::Zeroizing;

use super::args::{parse_options, CryptOptions};
use crate::core::units::parse_decimal;
use crate::targets::TargetError;

/// The arguments of a crypt line (after `crypt`), in dm-crypt's order.
/// The key stays a word (hex, `-`, or a keyring reference) and is wiped
/// on drop; only its size is exposed.
pub struct CryptParams {
    pub cipher: String,
    key: Zeroizing<String>,
    /// IV offset, in sectors.
    pub iv_offset: u64,
    /// The device as the table names it.
    pub device: String,
    /// Start on `device`, in 512-byte sectors.
    pub offset: u64,
    pub options: CryptOptions,
}

impl CryptParams {
    /// Reads the words of a crypt line as the constructor does (the same
    /// option parser), checking their form but not the cipher or the key.
    pub fn parse(args: &[String]) -> Result<Self, TargetError> {
        const NAMES: [&str; 5] = ["cipher", "key", "iv_offset", "device", "offset"];
        if args.len() < NAMES.len() {
            return Err(TargetError::line(format!(
                "a crypt line needs {} arguments ({}), got {}",
                NAMES.len(),
                NAMES.join(" "),
                args.len()
            )));
        }
        let number = |i: usize| {
            parse_decimal(&args[i])
                .map_err(|_| TargetError::at(i, format!("{} must be a decimal number", NAMES[i])))
        };
        Ok(CryptParams {
            cipher: args[0].clone(),
            key: Zeroizing::new(args[1].clone()),
            iv_offset: number(2)?,
            device: args[3].clone(),
            offset: number(4)?,
            options: parse_options(args)?,
        })
    }

    /// The key's size in bits (0 for `-`); a keyring reference
    /// (`:SIZE:TYPE:DESC`) gives its stated size.
    pub fn key_bits(&self) -> usize {
        match self.key.strip_prefix(':') {
            Some(r) => r
                .split(':')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
                .saturating_mul(8),
            None if self.key.as_str() == "-" => 0,
            None => self.key.len() / 2 * 8,
        }
    }
}

impl CryptOptions {
    /// The flags that are set, by their table names, in the order the
    /// kernel prints them (`sector_size:N` is a value, not among them).
    pub fn flags(&self) -> Vec<&'static str> {
        [
            (self.allow_discards, "allow_discards"),
            (self.same_cpu_crypt, "same_cpu_crypt"),
            (self.high_priority, "high_priority"),
            (self.submit_from_crypt_cpus, "submit_from_crypt_cpus"),
            (self.no_read_workqueue, "no_read_workqueue"),
            (self.no_write_workqueue, "no_write_workqueue"),
            (self.iv_large_sectors, "iv_large_sectors"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

impl CryptOptions {
    /// The feature words of a table line in the kernel's order: the flags,
    /// then `integrity:N:TYPE` and `sector_size:N` (when not 512) before
    /// `iv_large_sectors`.
    pub fn words(&self) -> Vec<String> {
        let mut w: Vec<String> = self.flags().into_iter().map(str::to_string).collect();
        let mut at = w.len() - usize::from(self.iv_large_sectors);
        if self.integrity_tag != 0 {
            let kind = if self.integrity_aead { "aead" } else { "none" };
            w.insert(at, format!("integrity:{}:{kind}", self.integrity_tag));
            at += 1;
        }
        if self.sector_size != 512 {
            w.insert(at, format!("sector_size:{}", self.sector_size));
        }
        w
    }
}

/// How a key word shows when keys are hidden (`dmsetup table` without
/// `--showkeys`): hex as zeros of the same length; `-` and a keyring
/// reference, which hold no key, as they are.
pub fn mask_key(word: &str) -> String {
    if word == "-" || word.starts_with(':') {
        word.to_string()
    } else {
        zeros(word.len())
    }
}

/// A hidden hex key of `hex_len` digits.
pub(super) fn zeros(hex_len: usize) -> String {
    "0".repeat(hex_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn a_crypt_line_reads_back_as_values() {
        let p = CryptParams::parse(&words(
            "aes-xts-plain64 00112233445566778899aabbccddeeff 7 /dev/x 4096 3 allow_discards sector_size:4096 iv_large_sectors",
        ))
        .expect("valid line");
        assert_eq!(p.cipher, "aes-xts-plain64");
        assert_eq!(p.key_bits(), 128);
        assert_eq!(
            (p.iv_offset, p.device.as_str(), p.offset),
            (7, "/dev/x", 4096)
        );
        assert_eq!(p.options.sector_size, 4096);
        assert_eq!(p.options.flags(), ["allow_discards", "iv_large_sectors"]);
        assert_eq!(
            p.options.words(),
            ["allow_discards", "sector_size:4096", "iv_large_sectors"]
        );
        let plain = CryptParams::parse(&words("cipher_null-ecb - 0 mem 0")).expect("valid");
        assert_eq!((plain.key_bits(), plain.options.sector_size), (0, 512));
    }

    #[test]
    fn a_short_or_bad_line_names_the_field() {
        let e = CryptParams::parse(&words("aes-xts-plain64 00 0 /d")).err();
        assert!(e.is_some_and(|e| e.msg.contains("5 arguments")));
        let e = CryptParams::parse(&words("aes-xts-plain64 00 x /d 0")).err();
        assert!(e.is_some_and(|e| e.arg == Some(2) && e.msg.contains("iv_offset")));
    }

    #[test]
    fn hidden_keys_keep_their_length_and_references() {
        assert_eq!(mask_key("00ff"), "0000");
        assert_eq!(mask_key("-"), "-");
        assert_eq!(mask_key(":32:logon:k"), ":32:logon:k");
    }
}
