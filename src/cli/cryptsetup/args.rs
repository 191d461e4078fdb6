//! cryptsetup's command line, parsed as its popt table does: long options
//! as `--name=value` or `--name value`, short ones as `-d FILE`, `-dFILE`
//! or bundled flags (`-qv`), options anywhere among the positional
//! arguments, `--` ending them. Each option lists the actions it is allowed
//! with; a misplaced one is a usage error (exit 1), as in cryptsetup.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// What an option takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Flag,
    Str,
    U32,
    I32,
    U64,
    /// A byte count with an optional unit (`16M`, `1GiB`, `8s` sectors).
    Size,
}

/// One option of cryptsetup 2.6's table.
pub struct Spec {
    pub name: &'static str,
    pub short: Option<char>,
    pub kind: Kind,
    /// Actions that accept it; empty: every action.
    pub actions: &'static [&'static str],
}

const FORMAT: &str = "luksFormat";
const OPEN: &str = "open";
const REENC: &str = "reencrypt";
const ADD: &str = "luksAddKey";
const CHANGE: &str = "luksChangeKey";
const CONVKEY: &str = "luksConvertKey";
const BENCH: &str = "benchmark";
const CONFIG: &str = "config";
const DUMP: &str = "luksDump";
const TOKEN: &str = "token";
const RESUME: &str = "luksResume";
const CLOSE: &str = "close";
const RESIZE: &str = "resize";

macro_rules! spec {
    ($n:expr, $s:expr, $k:ident) => {
        Spec { name: $n, short: $s, kind: Kind::$k, actions: &[] }
    };
    ($n:expr, $s:expr, $k:ident, [$($a:expr),*]) => {
        Spec { name: $n, short: $s, kind: Kind::$k, actions: &[$($a),*] }
    };
}

/// cryptsetup 2.6.1's options (src/cryptsetup_arg_list.h), with the
/// actions each is allowed for, plus udm's `--no-kdf-limit`.
pub static SPECS: &[Spec] = &[
    spec!("active-name", None, Str),
    spec!("align-payload", None, U32, [FORMAT, REENC]),
    spec!("allow-discards", None, Flag, [OPEN]),
    spec!("batch-mode", Some('q'), Flag),
    spec!("cancel-deferred", None, Flag, [CLOSE]),
    spec!("cipher", Some('c'), Str),
    spec!("debug", None, Flag),
    spec!("debug-json", None, Flag),
    spec!("deferred", None, Flag, [CLOSE]),
    spec!("device-size", None, Size, [OPEN, RESIZE, REENC]),
    spec!("decrypt", None, Flag),
    spec!("disable-external-tokens", None, Flag),
    spec!("disable-keyring", None, Flag),
    spec!("disable-locks", None, Flag),
    spec!("disable-veracrypt", None, Flag, [OPEN, "tcryptDump"]),
    spec!("dump-json-metadata", None, Flag),
    spec!("dump-volume-key", None, Flag),
    spec!("encrypt", None, Flag),
    spec!("force-password", None, Flag),
    spec!("force-offline-reencrypt", None, Flag, [REENC]),
    spec!("hash", Some('h'), Str),
    spec!("header", None, Str),
    spec!("header-backup-file", None, Str),
    spec!("hotzone-size", None, Size, [REENC]),
    spec!("init-only", None, Flag),
    spec!("integrity", Some('I'), Str, [FORMAT, REENC]),
    spec!("integrity-legacy-padding", None, Flag),
    spec!("integrity-no-journal", None, Flag),
    spec!("integrity-no-wipe", None, Flag, [FORMAT, REENC]),
    spec!(
        "iter-time",
        Some('i'),
        U32,
        [BENCH, FORMAT, ADD, CHANGE, CONVKEY, REENC]
    ),
    spec!("iv-large-sectors", None, Flag, [OPEN]),
    spec!("json-file", None, Str),
    spec!("keep-key", None, Flag, [REENC]),
    spec!("key-description", None, Str),
    spec!("key-file", Some('d'), Str),
    spec!(
        "key-size",
        Some('s'),
        U32,
        [OPEN, BENCH, FORMAT, REENC, ADD]
    ),
    spec!(
        "key-slot",
        Some('S'),
        I32,
        [OPEN, REENC, CONFIG, FORMAT, ADD, CHANGE, CONVKEY, DUMP, TOKEN, RESUME]
    ),
    spec!("keyfile-offset", None, U64),
    spec!("keyfile-size", Some('l'), U32),
    spec!(
        "keyslot-cipher",
        None,
        Str,
        [FORMAT, REENC, ADD, CHANGE, CONVKEY]
    ),
    spec!(
        "keyslot-key-size",
        None,
        U32,
        [FORMAT, REENC, ADD, CHANGE, CONVKEY]
    ),
    spec!("label", None, Str, [CONFIG, FORMAT, REENC]),
    spec!("luks2-keyslots-size", None, Size, [REENC, FORMAT]),
    spec!("luks2-metadata-size", None, Size, [REENC, FORMAT]),
    spec!("volume-key-file", None, Str),
    spec!("new-keyfile", None, Str, [ADD]),
    spec!("new-key-slot", None, I32, [ADD]),
    spec!("new-keyfile-offset", None, U64),
    spec!("new-keyfile-size", None, U32),
    spec!("new-token-id", None, I32, [ADD]),
    spec!("offset", Some('o'), U64, [OPEN, REENC, FORMAT]),
    spec!(
        "pbkdf",
        None,
        Str,
        [BENCH, FORMAT, ADD, CHANGE, CONVKEY, REENC]
    ),
    spec!(
        "pbkdf-force-iterations",
        None,
        U32,
        [FORMAT, ADD, CHANGE, CONVKEY, REENC]
    ),
    spec!("pbkdf-memory", None, U32),
    spec!("pbkdf-parallel", None, U32),
    spec!("perf-no_read_workqueue", None, Flag),
    spec!("perf-no_write_workqueue", None, Flag),
    spec!("perf-same_cpu_crypt", None, Flag),
    spec!("perf-submit_from_crypt_cpus", None, Flag),
    spec!("persistent", None, Flag, [OPEN]),
    spec!("priority", None, Str, [CONFIG]),
    spec!("progress-json", None, Flag, [FORMAT, REENC]),
    spec!("progress-frequency", None, U32),
    spec!("readonly", Some('r'), Flag),
    spec!("reduce-device-size", None, Size),
    spec!("refresh", None, Flag, [OPEN]),
    spec!("resilience", None, Str),
    spec!("resilience-hash", None, Str),
    spec!("resume-only", None, Flag),
    spec!("sector-size", None, U32, [OPEN, REENC, FORMAT]),
    spec!("serialize-memory-hard-pbkdf", None, Flag, [OPEN]),
    spec!("shared", None, Flag, [OPEN]),
    spec!("size", Some('b'), U64, [OPEN, RESIZE]),
    spec!("skip", Some('p'), U64, [OPEN]),
    spec!("subsystem", None, Str, [CONFIG, FORMAT, REENC]),
    spec!("tcrypt-backup", None, Flag, [OPEN, "tcryptDump"]),
    spec!("tcrypt-hidden", None, Flag, [OPEN, "tcryptDump"]),
    spec!("tcrypt-system", None, Flag, [OPEN, "tcryptDump"]),
    spec!("test-args", None, Flag),
    spec!("test-passphrase", None, Flag, [OPEN]),
    spec!("timeout", Some('t'), U32),
    spec!("token-id", None, I32),
    spec!("token-only", None, Flag),
    spec!("token-replace", None, Flag, [TOKEN]),
    spec!("token-type", None, Str),
    spec!("tries", Some('T'), U32),
    spec!("type", Some('M'), Str),
    spec!("unbound", None, Flag, [ADD, DUMP, OPEN, TOKEN]),
    spec!("use-random", None, Flag, [FORMAT]),
    spec!("use-urandom", None, Flag, [FORMAT]),
    spec!("uuid", None, Str, [FORMAT, "luksUUID", REENC]),
    spec!("veracrypt", None, Flag),
    spec!("veracrypt-pim", None, U32, [OPEN, "tcryptDump"]),
    spec!("veracrypt-query-pim", None, Flag),
    spec!("verbose", Some('v'), Flag),
    spec!("verify-passphrase", Some('y'), Flag),
    spec!("block-size", Some('B'), U32),
    spec!("use-directio", None, Flag),
    spec!("use-fsync", None, Flag),
    spec!("write-log", None, Flag),
    spec!("no-kdf-limit", None, Flag),
    spec!("allow-weak-cipher", None, Flag),
    // udm's: map a BitLocker volume cryptsetup refuses (partly encrypted).
    spec!("allow-partial-bitlk", None, Flag, [OPEN]),
    // udm's: map a TrueCrypt legacy CBC volume cryptsetup refuses.
    spec!("allow-tcrypt-legacy", None, Flag, [OPEN]),
    spec!("control", None, Str),
    // udm's: narrows who may use the opened device over NBD.
    spec!("allow", None, Str, [OPEN]),
    spec!("help", Some('?'), Flag),
    spec!("usage", None, Flag),
    spec!("version", Some('V'), Flag),
];

/// Old names that mean another option.
const ALIASES: &[(&str, &str)] = &[
    ("dump-master-key", "dump-volume-key"),
    ("master-key-file", "volume-key-file"),
    ("new", "encrypt"),
];

/// A parsed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Val {
    Flag,
    Str(String),
    Num(i64),
    U64(u64),
}

/// The parsed command line.
#[derive(Clone, Debug, Default)]
pub struct Args {
    pub opts: BTreeMap<&'static str, Val>,
    /// Every positional argument; the first is the action.
    pub pos: Vec<String>,
    /// Key files given (cryptsetup allows one, except for tcrypt).
    pub key_files: usize,
    /// Every `-d`/`--key-file` in order: TCRYPT mixes them all into its
    /// keyfile pool (`key-file` in `opts` holds the last).
    pub key_file_list: Vec<String>,
}

impl Args {
    pub fn has(&self, name: &str) -> bool {
        self.opts.contains_key(name)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        match self.opts.get(name) {
            Some(Val::Str(s)) => Some(s),
            _ => None,
        }
    }

    pub fn u32(&self, name: &str) -> Option<u32> {
        match self.opts.get(name) {
            Some(Val::Num(n)) => u32::try_from(*n).ok(),
            _ => None,
        }
    }

    pub fn i32(&self, name: &str) -> Option<i32> {
        match self.opts.get(name) {
            Some(Val::Num(n)) => i32::try_from(*n).ok(),
            _ => None,
        }
    }

    pub fn u64(&self, name: &str) -> Option<u64> {
        match self.opts.get(name) {
            Some(Val::U64(n)) => Some(*n),
            Some(Val::Num(n)) => u64::try_from(*n).ok(),
            _ => None,
        }
    }
}

fn spec_long(name: &str) -> Option<&'static Spec> {
    let name = ALIASES
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(_, t)| *t)
        .unwrap_or(name);
    SPECS.iter().find(|s| s.name == name)
}

fn spec_short(c: char) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.short == Some(c))
}

/// cryptsetup's size strings: digits, then optionally a unit K/M/G/T
/// (powers of 1024; `KB`-style powers of 1000, `KiB`-style of 1024) or
/// `s`/`S` for 512-byte sectors.
pub fn parse_size(s: &str) -> Option<u64> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = s[..digits].parse().ok()?;
    let unit = &s[digits..];
    if unit.is_empty() {
        return Some(n);
    }
    let base: u64 = match unit.len() {
        1 => 1024,
        2 if unit.ends_with('B') => 1000,
        3 if unit.ends_with("iB") => 1024,
        _ => return None,
    };
    let pow = match unit.as_bytes()[0] {
        b's' | b'S' => return n.checked_mul(512),
        b'k' | b'K' => 1,
        b'm' | b'M' => 2,
        b'g' | b'G' => 3,
        b't' | b'T' => 4,
        _ => return None,
    };
    n.checked_mul(base.checked_pow(pow)?)
}

fn value(spec: &Spec, v: &str) -> Result<Val, String> {
    let bad = || format!("--{}: bad numeric value", spec.name);
    let strict_digits = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    match spec.kind {
        Kind::Flag => Ok(Val::Flag),
        Kind::Str => Ok(Val::Str(v.to_string())),
        Kind::U32 => {
            if !strict_digits(v) {
                return Err(bad());
            }
            v.parse::<u32>()
                .map(|n| Val::Num(i64::from(n)))
                .map_err(|_| bad())
        }
        Kind::I32 => v
            .parse::<i32>()
            .map(|n| Val::Num(i64::from(n)))
            .map_err(|_| bad()),
        Kind::U64 => {
            if !strict_digits(v) {
                return Err(bad());
            }
            v.parse::<u64>().map(Val::U64).map_err(|_| bad())
        }
        Kind::Size => parse_size(v)
            .map(Val::U64)
            .ok_or_else(|| format!("Invalid size specification in parameter --{}.", spec.name)),
    }
}

/// Parse argv (without the program name). Errors are usage errors.
pub fn parse(argv: &[OsString]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut i = 0;
    let mut only_pos = false;
    let strs: Vec<String> = argv
        .iter()
        .map(|s| {
            s.to_str()
                .map(str::to_string)
                .ok_or_else(|| format!("argument {s:?} is not valid UTF-8"))
        })
        .collect::<Result<_, _>>()?;
    let set = |a: &mut Args, spec: &'static Spec, v: Val| {
        if spec.name == "key-file" {
            a.key_files += 1;
            if let Val::Str(f) = &v {
                a.key_file_list.push(f.clone());
            }
        }
        a.opts.insert(spec.name, v);
    };
    while i < strs.len() {
        let arg = &strs[i];
        i += 1;
        if only_pos || arg == "-" || !arg.starts_with('-') {
            a.pos.push(arg.clone());
            continue;
        }
        if arg == "--" {
            only_pos = true;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let spec = spec_long(name).ok_or_else(|| format!("--{name}: unknown option"))?;
            let v = if spec.kind == Kind::Flag {
                if inline.is_some() {
                    return Err(format!("--{name}: option does not take an argument"));
                }
                Val::Flag
            } else {
                let raw = match inline {
                    Some(v) => v,
                    None => {
                        let v = strs
                            .get(i)
                            .ok_or_else(|| format!("--{name}: missing argument"))?;
                        i += 1;
                        v.clone()
                    }
                };
                value(spec, &raw)?
            };
            set(&mut a, spec, v);
            continue;
        }
        // Short options, possibly bundled; one taking a value ends the bundle.
        let chars: Vec<char> = arg[1..].chars().collect();
        let mut j = 0;
        while j < chars.len() {
            let c = chars[j];
            j += 1;
            let spec = spec_short(c).ok_or_else(|| format!("-{c}: unknown option"))?;
            if spec.kind == Kind::Flag {
                set(&mut a, spec, Val::Flag);
                continue;
            }
            let raw: String = if j < chars.len() {
                let r: String = chars[j..].iter().collect();
                j = chars.len();
                r
            } else {
                let v = strs
                    .get(i)
                    .ok_or_else(|| format!("-{c}: missing argument"))?;
                i += 1;
                v.clone()
            };
            let v = value(spec, &raw)?;
            set(&mut a, spec, v);
        }
    }
    Ok(a)
}

/// The usage error cryptsetup gives for an option used with an action that
/// does not take it.
pub fn check_allowed(a: &Args, action: &str) -> Result<(), String> {
    for name in a.opts.keys() {
        if let Some(s) = SPECS.iter().find(|s| s.name == *name) {
            if !s.actions.is_empty() && !s.actions.contains(&action) {
                return Err(format!(
                    "Option --{name} is not allowed with {action} action."
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<Args, String> {
        parse(&v.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn popt_forms() {
        let a = p(&[
            "-q",
            "luksFormat",
            "--type=luks2",
            "img",
            "-d",
            "kf",
            "-S3",
            "--pbkdf",
            "pbkdf2",
        ])
        .unwrap();
        assert_eq!(a.pos, ["luksFormat", "img"]);
        assert!(a.has("batch-mode"));
        assert_eq!(a.str("type"), Some("luks2"));
        assert_eq!(a.str("key-file"), Some("kf"));
        assert_eq!(a.i32("key-slot"), Some(3));
        assert_eq!(a.str("pbkdf"), Some("pbkdf2"));
        let a = p(&["-qv", "isLuks", "--", "-weird"]).unwrap();
        assert!(a.has("verbose") && a.has("batch-mode"));
        assert_eq!(a.pos, ["isLuks", "-weird"]);
        assert!(p(&["--nonsense"]).is_err());
        assert!(p(&["--key-slot=x"]).is_err());
        assert!(p(&["--iter-time=-1"]).is_err());
        assert!(p(&["--dump-master-key"]).unwrap().has("dump-volume-key"));
        let a = p(&["--hotzone-size", "16M", "--luks2-metadata-size=64k"]).unwrap();
        assert_eq!(a.u64("hotzone-size"), Some(16 << 20));
        assert_eq!(a.u64("luks2-metadata-size"), Some(64 << 10));
    }

    #[test]
    fn sizes_as_cryptsetup() {
        assert_eq!(parse_size("16"), Some(16));
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("1KB"), Some(1000));
        assert_eq!(parse_size("1KiB"), Some(1024));
        assert_eq!(parse_size("2s"), Some(1024));
        assert_eq!(parse_size("1MB"), Some(1_000_000));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("1Q"), None);
        assert_eq!(parse_size("1KiBB"), None);
    }

    #[test]
    fn options_checked_against_the_action() {
        let a = p(&["luksDump", "--label=x", "img"]).unwrap();
        assert!(check_allowed(&a, "luksDump")
            .unwrap_err()
            .contains("--label"));
        assert!(check_allowed(&a, "luksFormat").is_ok());
    }
}
