//! An `integrity` table line read into values and written back the way
//! the kernel prints it (`dm_integrity_status`), shared by the target and
//! `udm integritysetup`, so the syntax lives in one place.

use zeroize::Zeroizing;

use crate::core::units::parse_decimal;
use crate::targets::TargetError;

/// Names of the fixed arguments, for errors.
pub const ARGS: &[&str] = &["device", "offset", "tag_size", "mode", "#opt_params"];

/// How writes keep data and tags in step (the line's fourth word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `J`: through the journal; a crash leaves every sector matching.
    Journal,
    /// `D`: straight to their places; a crash can leave a sector whose
    /// tag does not match.
    Direct,
    /// `B`: straight to their places, dirty regions noted in a bitmap
    /// and their tags recomputed after a crash.
    Bitmap,
    /// `R`: recovery, read-only, tags not checked.
    Recovery,
}

impl Mode {
    pub fn letter(self) -> char {
        match self {
            Mode::Journal => 'J',
            Mode::Direct => 'D',
            Mode::Bitmap => 'B',
            Mode::Recovery => 'R',
        }
    }
}

/// `internal_hash:`, `journal_crypt:` or `journal_mac:`: an algorithm in
/// the kernel's crypto API spelling and an optional key (hex in tables).
#[derive(Clone, PartialEq, Eq)]
pub struct AlgSpec {
    pub name: String,
    pub key: Option<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for AlgSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}",
            self.name,
            if self.key.is_some() { ":<key>" } else { "" }
        )
    }
}

impl AlgSpec {
    fn parse(word: &str, idx: usize) -> Result<AlgSpec, TargetError> {
        let (kind, rest) = word.split_once(':').unwrap_or((word, ""));
        let (name, key) = match rest.split_once(':') {
            Some((n, k)) => (n, Some(k)),
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(TargetError::at(idx, format!("{kind}: algorithm missing")));
        }
        let key = key
            .map(|k| {
                hex::decode(k).map(Zeroizing::new).map_err(|_| {
                    TargetError::at(
                        idx,
                        format!("{kind}: the key is not an even number of hex digits"),
                    )
                })
            })
            .transpose()?;
        Ok(AlgSpec {
            name: name.to_string(),
            key,
        })
    }

    fn write(&self, out: &mut Vec<String>, kind: &str, show_keys: bool) {
        let mut w = format!("{kind}:{}", self.name);
        if let Some(k) = &self.key {
            w.push(':');
            if show_keys {
                w.push_str(&hex::encode(&**k));
            } else {
                w.push_str(&"0".repeat(k.len() * 2));
            }
        }
        out.push(w);
    }
}

/// The optional parameters, with the kernel's defaults where it has them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    pub journal_sectors: Option<u64>,
    pub interleave_sectors: Option<u32>,
    pub buffer_sectors: Option<u32>,
    pub journal_watermark: Option<u32>,
    pub commit_time: Option<u32>,
    pub meta_device: Option<String>,
    pub block_size: Option<u32>,
    pub sectors_per_bit: Option<u64>,
    pub bitmap_flush_interval: Option<u32>,
    pub internal_hash: Option<AlgSpec>,
    pub journal_crypt: Option<AlgSpec>,
    pub journal_mac: Option<AlgSpec>,
    pub recalculate: bool,
    pub reset_recalculate: bool,
    pub allow_discards: bool,
    pub fix_padding: bool,
    pub fix_hmac: bool,
    pub legacy_recalculate: bool,
}

/// Every value of an `integrity` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityParams {
    pub dev: String,
    /// Sectors.
    pub offset: u64,
    /// `None`: `-`, the internal hash's digest size.
    pub tag_size: Option<u32>,
    pub mode: Mode,
    pub opts: Options,
}

fn num(word: &str, v: &str, idx: usize) -> Result<u64, TargetError> {
    parse_decimal(v)
        .map_err(|_| TargetError::at(idx, format!("{word}: '{v}' is not a decimal number")))
}

fn num32(word: &str, v: &str, idx: usize) -> Result<u32, TargetError> {
    u32::try_from(num(word, v, idx)?)
        .map_err(|_| TargetError::at(idx, format!("{word}: '{v}' is too large")))
}

impl IntegrityParams {
    pub fn parse(args: &[String]) -> Result<IntegrityParams, TargetError> {
        if args.len() < 4 {
            return Err(TargetError::line(
                "integrity needs <dev> <offset> <tag_size> <mode> [<#opt_params> <opt_params>]",
            ));
        }
        let offset = num("offset", &args[1], 1)?;
        let tag_size = match args[2].as_str() {
            "-" => None,
            v => match num32("tag_size", v, 2)? {
                0 => return Err(TargetError::at(2, "tag size 0: give a size or '-'")),
                n => Some(n),
            },
        };
        let mode = match args[3].as_str() {
            "J" => Mode::Journal,
            "D" => Mode::Direct,
            "B" => Mode::Bitmap,
            "R" => Mode::Recovery,
            "I" => {
                return Err(TargetError::at(
                    3,
                    "inline mode (I) needs a disk with its own metadata: use J, D, B or R",
                ))
            }
            m => {
                return Err(TargetError::at(
                    3,
                    format!("invalid mode '{m}' (expecting J, B, D, R)"),
                ))
            }
        };
        let mut opts = Options::default();
        if args.len() > 4 {
            let n = num("#opt_params", &args[4], 4)? as usize;
            if n != args.len() - 5 || n > 18 {
                return Err(TargetError::at(
                    4,
                    format!(
                        "{n} optional parameters announced, {} given",
                        args.len() - 5
                    ),
                ));
            }
            for (i, w) in args[5..].iter().enumerate() {
                opts.set(w, 5 + i)?;
            }
        }
        Ok(IntegrityParams {
            dev: args[0].clone(),
            offset,
            tag_size,
            mode,
            opts,
        })
    }
}

impl Options {
    fn set(&mut self, w: &str, idx: usize) -> Result<(), TargetError> {
        let (k, v) = w.split_once(':').unwrap_or((w, ""));
        match k {
            "journal_sectors" => self.journal_sectors = Some(num(k, v, idx)?.max(1)),
            "interleave_sectors" => self.interleave_sectors = Some(num32(k, v, idx)?),
            "buffer_sectors" => self.buffer_sectors = Some(num32(k, v, idx)?),
            "journal_watermark" => match num32(k, v, idx)? {
                p @ 0..=100 => self.journal_watermark = Some(p),
                _ => {
                    return Err(TargetError::at(
                        idx,
                        "journal_watermark is a percentage, 0 to 100",
                    ))
                }
            },
            "commit_time" => self.commit_time = Some(num32(k, v, idx)?),
            "meta_device" => self.meta_device = Some(v.to_string()),
            "block_size" => {
                let b = num32(k, v, idx)?;
                if !(512..=4096).contains(&b) || !b.is_power_of_two() {
                    return Err(TargetError::at(
                        idx,
                        "block_size is 512, 1024, 2048 or 4096",
                    ));
                }
                self.block_size = Some(b);
            }
            "sectors_per_bit" => self.sectors_per_bit = Some(num(k, v, idx)?),
            "bitmap_flush_interval" => self.bitmap_flush_interval = Some(num32(k, v, idx)?),
            "internal_hash" => self.internal_hash = Some(AlgSpec::parse(w, idx)?),
            "journal_crypt" => self.journal_crypt = Some(AlgSpec::parse(w, idx)?),
            "journal_mac" => self.journal_mac = Some(AlgSpec::parse(w, idx)?),
            "recalculate" if v.is_empty() => self.recalculate = true,
            "reset_recalculate" if v.is_empty() => {
                self.recalculate = true;
                self.reset_recalculate = true;
            }
            "allow_discards" if v.is_empty() => self.allow_discards = true,
            "fix_padding" if v.is_empty() => self.fix_padding = true,
            "fix_hmac" if v.is_empty() => self.fix_hmac = true,
            "legacy_recalculate" if v.is_empty() => self.legacy_recalculate = true,
            _ => return Err(TargetError::at(idx, format!("invalid argument '{w}'"))),
        }
        Ok(())
    }

    /// The words of the line after `#opt_params`, as given (for a line
    /// udm writes, e.g. `udm integritysetup open`).
    pub fn words(&self, show_keys: bool) -> Vec<String> {
        let mut o = Vec::new();
        let mut num = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                o.push(format!("{k}:{v}"));
            }
        };
        num(
            "journal_sectors",
            self.journal_sectors.map(|v| v.to_string()),
        );
        num(
            "interleave_sectors",
            self.interleave_sectors.map(|v| v.to_string()),
        );
        num("buffer_sectors", self.buffer_sectors.map(|v| v.to_string()));
        num(
            "journal_watermark",
            self.journal_watermark.map(|v| v.to_string()),
        );
        num("commit_time", self.commit_time.map(|v| v.to_string()));
        num("meta_device", self.meta_device.clone());
        num("block_size", self.block_size.map(|v| v.to_string()));
        num(
            "sectors_per_bit",
            self.sectors_per_bit.map(|v| v.to_string()),
        );
        num(
            "bitmap_flush_interval",
            self.bitmap_flush_interval.map(|v| v.to_string()),
        );
        for (on, w) in [
            (self.recalculate && !self.reset_recalculate, "recalculate"),
            (self.reset_recalculate, "reset_recalculate"),
            (self.allow_discards, "allow_discards"),
            (self.fix_padding, "fix_padding"),
            (self.fix_hmac, "fix_hmac"),
            (self.legacy_recalculate, "legacy_recalculate"),
        ] {
            if on {
                o.push(w.to_string());
            }
        }
        for (a, k) in [
            (&self.internal_hash, "internal_hash"),
            (&self.journal_crypt, "journal_crypt"),
            (&self.journal_mac, "journal_mac"),
        ] {
            if let Some(a) = a {
                a.write(&mut o, k, show_keys);
            }
        }
        o
    }
}

impl IntegrityParams {
    /// The line's arguments (after `integrity`) as given.
    pub fn table_args(&self, show_keys: bool) -> String {
        let words = self.opts.words(show_keys);
        let tag = self.tag_size.map_or("-".to_string(), |t| t.to_string());
        let mut s = format!(
            "{} {} {tag} {} {}",
            self.dev,
            self.offset,
            self.mode.letter(),
            words.len()
        );
        for w in words {
            s.push(' ');
            s.push_str(&w);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<IntegrityParams, TargetError> {
        let v: Vec<String> = s.split_whitespace().map(Into::into).collect();
        IntegrityParams::parse(&v)
    }

    #[test]
    fn kernel_lines_parse_and_print_back() {
        let l = "/d 0 4 J 4 journal_sectors:1024 interleave_sectors:32768 fix_padding \
                 internal_hash:crc32c";
        let x = p(l).unwrap();
        assert_eq!(x.tag_size, Some(4));
        assert_eq!(x.mode, Mode::Journal);
        assert_eq!(x.opts.journal_sectors, Some(1024));
        assert_eq!(x.opts.internal_hash.as_ref().unwrap().name, "crc32c");
        assert_eq!(
            x.table_args(false),
            l.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        let k = p("/d 0 32 J 1 internal_hash:hmac(sha256):0a0b").unwrap();
        assert_eq!(
            k.table_args(false),
            "/d 0 32 J 1 internal_hash:hmac(sha256):0000"
        );
        assert_eq!(
            k.table_args(true),
            "/d 0 32 J 1 internal_hash:hmac(sha256):0a0b"
        );
        assert!(p("/d 0 - D 0").unwrap().tag_size.is_none());
    }

    #[test]
    fn bad_lines_name_the_field() {
        assert_eq!(p("/d 0 4 X 0").unwrap_err().arg, Some(3));
        assert_eq!(p("/d 0 4 J 2 fix_padding").unwrap_err().arg, Some(4));
        assert_eq!(p("/d 0 4 J 1 bogus").unwrap_err().arg, Some(5));
        assert_eq!(p("/d 0 4 J 1 block_size:1000").unwrap_err().arg, Some(5));
        assert_eq!(
            p("/d 0 4 J 1 internal_hash:sha1:zz").unwrap_err().arg,
            Some(5)
        );
        assert_eq!(p("/d x 4 J").unwrap_err().arg, Some(1));
        assert!(p("/d 0 4").is_err());
    }
}
