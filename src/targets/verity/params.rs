//! A `verity` table line read into values, and written back the way the
//! kernel prints it. The target builds itself from this, and `udm
//! veritysetup` writes and reads lines through it, so the syntax lives in
//! one place.

use super::tree::HashAlg;
use crate::core::table::escape_arg;
use crate::core::units::parse_decimal;
use crate::targets::TargetError;

/// Largest salt veritysetup writes (its superblock's salt field).
pub const MAX_SALT: usize = 256;
/// Largest block the kernel takes (its page size on x86).
pub const MAX_BLOCK: u32 = 4096;

/// What a corrupt block does (dm-verity's mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The request fails with EIO (the default).
    #[default]
    Eio,
    /// `ignore_corruption`: logged, the data is returned anyway.
    Ignore,
    /// `restart_on_corruption`: the kernel reboots; udm fails the device
    /// (every later read errors) and raises an event.
    Restart,
    /// `panic_on_corruption`: as `Restart` here.
    Panic,
}

impl Mode {
    /// The word of an error mode (`Options::on_error`).
    pub fn error_word(self) -> Option<&'static str> {
        match self {
            Mode::Restart => Some("restart_on_error"),
            Mode::Panic => Some("panic_on_error"),
            Mode::Eio | Mode::Ignore => None,
        }
    }

    fn word(self) -> Option<&'static str> {
        match self {
            Mode::Eio => None,
            Mode::Ignore => Some("ignore_corruption"),
            Mode::Restart => Some("restart_on_corruption"),
            Mode::Panic => Some("panic_on_corruption"),
        }
    }
}

/// `use_fec_from_device <dev> fec_roots <n> fec_blocks <n> fec_start <n>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fec {
    pub dev: String,
    pub roots: u32,
    pub blocks: u64,
    pub start: u64,
}

/// The optional parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    pub mode: Mode,
    /// What a data block that cannot be read does: `restart_on_error`
    /// (`Restart`) or `panic_on_error` (`Panic`) treat it as a corrupt one
    /// (udm: the device fails from then on); otherwise (`Eio`) only the
    /// request fails.
    pub on_error: Mode,
    pub ignore_zero_blocks: bool,
    pub check_at_most_once: bool,
    pub try_verify_in_tasklet: bool,
    pub fec: Option<Fec>,
    pub root_hash_sig_key_desc: Option<String>,
}

/// Every value of a `verity` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityParams {
    pub version: u32,
    pub data_dev: String,
    pub hash_dev: String,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    pub data_blocks: u64,
    /// In hash blocks, from the start of the hash device.
    pub hash_start: u64,
    pub alg: HashAlg,
    pub root: Vec<u8>,
    pub salt: Vec<u8>,
    pub opts: Options,
}

/// Names of the fixed arguments, for errors.
pub const ARGS: &[&str] = &[
    "version",
    "data_dev",
    "hash_dev",
    "data_block_size",
    "hash_block_size",
    "num_data_blocks",
    "hash_start_block",
    "algorithm",
    "root_digest",
    "salt",
    "#opt_params",
];

fn number(args: &[String], i: usize, what: &str) -> Result<u64, TargetError> {
    parse_decimal(&args[i]).map_err(|_| {
        TargetError::at(
            i,
            format!("{what}: expected a decimal number, got '{}'", args[i]),
        )
    })
}

fn block_size(args: &[String], i: usize, what: &str) -> Result<u32, TargetError> {
    let v = number(args, i, what)?;
    if !(512..=u64::from(MAX_BLOCK)).contains(&v) || !v.is_power_of_two() {
        return Err(TargetError::at(
            i,
            format!("{what} {v}: must be a power of two from 512 to {MAX_BLOCK} bytes"),
        ));
    }
    Ok(v as u32)
}

fn hex_arg(args: &[String], i: usize, what: &str) -> Result<Vec<u8>, TargetError> {
    hex::decode(&args[i])
        .map_err(|_| TargetError::at(i, format!("{what}: '{}' is not a hex string", args[i])))
}

impl VerityParams {
    /// Reads the words after `verity` in a table line, with the kernel's
    /// rules; errors name the argument.
    pub fn parse(args: &[String]) -> Result<VerityParams, TargetError> {
        if args.len() < 10 {
            return Err(TargetError::line(format!(
                "not enough arguments: expected <version> <data_dev> <hash_dev> \
                 <data_block_size> <hash_block_size> <num_data_blocks> <hash_start_block> \
                 <algorithm> <root_digest> <salt> [<#opt_params> <opt_params>], got {}",
                args.len()
            )));
        }
        let version = number(args, 0, "version")?;
        if version > 1 {
            return Err(TargetError::at(
                0,
                format!("invalid version {version}: 0 or 1"),
            ));
        }
        let data_block_size = block_size(args, 3, "data block size")?;
        let hash_block_size = block_size(args, 4, "hash block size")?;
        let data_blocks = number(args, 5, "number of data blocks")?;
        if data_blocks
            .checked_mul(u64::from(data_block_size))
            .is_none_or(|b| b > i64::MAX as u64)
        {
            return Err(TargetError::at(
                5,
                format!("{data_blocks} data blocks is too large"),
            ));
        }
        let hash_start = number(args, 6, "hash start block")?;
        if hash_start.checked_mul(u64::from(hash_block_size)).is_none() {
            return Err(TargetError::at(
                6,
                format!("hash start block {hash_start} is too large"),
            ));
        }
        let alg = HashAlg::from_name(&args[7]).ok_or_else(|| {
            TargetError::at(
                7,
                format!(
                    "hash algorithm '{}' is not supported (sha1, sha256, sha512)",
                    args[7]
                ),
            )
        })?;
        let root = hex_arg(args, 8, "root digest")?;
        if root.len() != alg.digest_size() {
            return Err(TargetError::at(
                8,
                format!(
                    "root digest has {} bytes, {} needs {}",
                    root.len(),
                    alg.name(),
                    alg.digest_size()
                ),
            ));
        }
        let salt = if args[9] == "-" {
            Vec::new()
        } else {
            hex_arg(args, 9, "salt")?
        };
        if salt.len() > MAX_SALT {
            return Err(TargetError::at(
                9,
                format!("salt longer than {MAX_SALT} bytes"),
            ));
        }
        Ok(VerityParams {
            version: version as u32,
            data_dev: args[1].clone(),
            hash_dev: args[2].clone(),
            data_block_size,
            hash_block_size,
            data_blocks,
            hash_start,
            alg,
            root,
            salt,
            opts: parse_options(args, 10)?,
        })
    }

    /// The line's arguments as `dmsetup table` prints them.
    pub fn table_args(&self) -> String {
        let salt = if self.salt.is_empty() {
            "-".to_string()
        } else {
            hex::encode(&self.salt)
        };
        let mut s = format!(
            "{} {} {} {} {} {} {} {} {} {salt}",
            self.version,
            escape_arg(&self.data_dev),
            escape_arg(&self.hash_dev),
            self.data_block_size,
            self.hash_block_size,
            self.data_blocks,
            self.hash_start,
            self.alg.name(),
            hex::encode(&self.root),
        );
        let o = &self.opts;
        let mut words: Vec<String> = Vec::new();
        words.extend(o.mode.word().map(str::to_string));
        words.extend(o.on_error.error_word().map(str::to_string));
        for (on, w) in [
            (o.ignore_zero_blocks, "ignore_zero_blocks"),
            (o.check_at_most_once, "check_at_most_once"),
            (o.try_verify_in_tasklet, "try_verify_in_tasklet"),
        ] {
            if on {
                words.push(w.into());
            }
        }
        if let Some(f) = &o.fec {
            words.push("use_fec_from_device".into());
            words.push(escape_arg(&f.dev).into_owned());
            // The kernel's order.
            for (k, v) in [
                ("fec_blocks", f.blocks),
                ("fec_start", f.start),
                ("fec_roots", u64::from(f.roots)),
            ] {
                words.push(k.into());
                words.push(v.to_string());
            }
        }
        if let Some(k) = &o.root_hash_sig_key_desc {
            words.push("root_hash_sig_key_desc".into());
            words.push(escape_arg(k).into_owned());
        }
        if !words.is_empty() {
            s.push_str(&format!(" {} {}", words.len(), words.join(" ")));
        }
        s
    }
}

/// The FEC parameters, given all together or not at all.
fn fec_of(f: FecWords) -> Result<Option<Fec>, TargetError> {
    Ok(match f {
        (None, None, None, None) => None,
        (Some(dev), Some(roots), Some(blocks), Some(start)) => {
            if !(2..=24).contains(&roots) {
                return Err(TargetError::line(format!(
                    "fec_roots {roots}: must be 2 to 24"
                )));
            }
            Some(Fec {
                dev,
                roots: roots as u32,
                blocks,
                start,
            })
        }
        _ => {
            return Err(TargetError::line(
                "FEC needs all of use_fec_from_device, fec_roots, fec_blocks and fec_start",
            ))
        }
    })
}

/// `use_fec_from_device`, `fec_roots`, `fec_blocks`, `fec_start` as seen.
type FecWords = (Option<String>, Option<u64>, Option<u64>, Option<u64>);

/// The optional parameters from `args[at]` (their count) on.
fn parse_options(args: &[String], at: usize) -> Result<Options, TargetError> {
    let mut o = Options::default();
    if args.len() == at {
        return Ok(o);
    }
    let n = number(args, at, "number of optional parameters")? as usize;
    if args.len() - at - 1 != n {
        return Err(TargetError::at(
            at,
            format!(
                "{n} optional parameters announced, {} given",
                args.len() - at - 1
            ),
        ));
    }
    let mut i = at + 1;
    let value = |i: usize| -> Result<&String, TargetError> {
        args.get(i)
            .ok_or_else(|| TargetError::at(i - 1, format!("'{}' needs a value", args[i - 1])))
    };
    let mut fec: FecWords = Default::default();
    while i < args.len() {
        let w = args[i].as_str();
        let mode = match w {
            "ignore_corruption" => Some(Mode::Ignore),
            "restart_on_corruption" => Some(Mode::Restart),
            "panic_on_corruption" => Some(Mode::Panic),
            _ => None,
        };
        match (w, mode) {
            (_, Some(m)) => {
                if o.mode != Mode::Eio && o.mode != m {
                    return Err(TargetError::at(
                        i,
                        "only one of ignore_corruption, restart_on_corruption, panic_on_corruption",
                    ));
                }
                o.mode = m;
            }
            ("restart_on_error", _) => o.on_error = Mode::Restart,
            ("panic_on_error", _) => o.on_error = Mode::Panic,
            ("ignore_zero_blocks", _) => o.ignore_zero_blocks = true,
            ("check_at_most_once", _) => o.check_at_most_once = true,
            ("try_verify_in_tasklet", _) => o.try_verify_in_tasklet = true,
            ("use_fec_from_device", _) => {
                fec.0 = Some(value(i + 1)?.clone());
                i += 1;
            }
            ("fec_roots" | "fec_blocks" | "fec_start", _) => {
                value(i + 1)?;
                let v = number(args, i + 1, w)?;
                match w {
                    "fec_roots" => fec.1 = Some(v),
                    "fec_blocks" => fec.2 = Some(v),
                    _ => fec.3 = Some(v),
                }
                i += 1;
            }
            ("root_hash_sig_key_desc", _) => {
                o.root_hash_sig_key_desc = Some(value(i + 1)?.clone());
                i += 1;
            }
            _ => {
                return Err(TargetError::at(
                    i,
                    format!(
                        "unrecognized verity feature '{w}' (ignore_corruption, \
                         restart_on_corruption, panic_on_corruption, restart_on_error, \
                         panic_on_error, ignore_zero_blocks, \
                         check_at_most_once, try_verify_in_tasklet, use_fec_from_device, \
                         fec_roots, fec_blocks, fec_start, root_hash_sig_key_desc)"
                    ),
                ))
            }
        }
        i += 1;
    }
    o.fec = fec_of(fec)?;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    const ROOT: &str = "2c31d74a62386c3bc57d9dbbace2ccdd3d6592ba9a3bb9f3dd08f41494fc9661";

    #[test]
    fn a_line_reads_back_as_printed() {
        for line in [
            format!("1 d.img h.img 4096 4096 256 1 sha256 {ROOT} 00112233"),
            format!("0 d.img h.img 512 1024 7 0 sha256 {ROOT} -"),
            format!(
                "1 d h 4096 4096 256 1 sha256 {ROOT} - 13 restart_on_corruption \
                 ignore_zero_blocks check_at_most_once use_fec_from_device f fec_blocks 300 \
                 fec_start 0 fec_roots 2 root_hash_sig_key_desc key:1"
            ),
        ] {
            let p = VerityParams::parse(&words(&line)).unwrap();
            assert_eq!(p.table_args(), line);
        }
        let p = VerityParams::parse(&words(&format!(
            "1 d h 4096 4096 256 1 sha256 {ROOT} ab 1 ignore_corruption"
        )))
        .unwrap();
        assert_eq!(p.opts.mode, Mode::Ignore);
        assert_eq!(p.salt, [0xab]);
    }

    #[test]
    fn bad_lines_name_the_argument() {
        let bad = [
            ("1 d h 4096 4096 256 1 sha256 00", None),
            (&*format!("2 d h 4096 4096 256 1 sha256 {ROOT} -"), Some(0)),
            (&*format!("1 d h 4000 4096 256 1 sha256 {ROOT} -"), Some(3)),
            (&*format!("1 d h 4096 8192 256 1 sha256 {ROOT} -"), Some(4)),
            (&*format!("1 d h 4096 4096 x 1 sha256 {ROOT} -"), Some(5)),
            (&*format!("1 d h 4096 4096 256 1 md5 {ROOT} -"), Some(7)),
            ("1 d h 4096 4096 256 1 sha1 00ff -", Some(8)),
            (
                &*format!("1 d h 4096 4096 256 1 sha256 {ROOT} xyz"),
                Some(9),
            ),
            (
                &*format!("1 d h 4096 4096 256 1 sha256 {ROOT} - 2 ignore_zero_blocks"),
                Some(10),
            ),
            (
                &*format!("1 d h 4096 4096 256 1 sha256 {ROOT} - 1 bogus"),
                Some(11),
            ),
            (
                &*format!("1 d h 4096 4096 256 1 sha256 {ROOT} - 1 root_hash_sig_key_desc"),
                Some(11),
            ),
            (
                &*format!("1 d h 4096 4096 256 1 sha256 {ROOT} - 2 fec_roots 2"),
                None,
            ),
        ];
        for (line, at) in bad {
            let e = VerityParams::parse(&words(line)).unwrap_err();
            assert_eq!(e.arg, at, "{line}: {}", e.msg);
        }
    }
}
