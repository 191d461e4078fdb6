//! integritysetup's options, popt style: `--name=value` or `--name
//! value`, short letters, options anywhere among the positional
//! arguments, `--` ending them.

use std::collections::HashMap;

/// Options with a value: long name, short letter.
const VALUED: &[(&str, Option<char>)] = &[
    ("integrity", Some('I')),
    ("integrity-key-file", None),
    ("integrity-key-size", None),
    ("tag-size", Some('t')),
    ("sector-size", Some('s')),
    ("journal-size", Some('j')),
    ("interleave-sectors", None),
    ("buffer-sectors", None),
    ("journal-watermark", None),
    ("journal-commit-time", None),
    ("bitmap-sectors-per-bit", None),
    ("bitmap-flush-time", None),
    ("journal-integrity", None),
    ("journal-integrity-key-file", None),
    ("journal-integrity-key-size", None),
    ("journal-crypt", None),
    ("journal-crypt-key-file", None),
    ("journal-crypt-key-size", None),
    ("data-device", None),
    ("progress-frequency", None),
    ("device-size", None),
    ("size", Some('b')),
    // udm's own: the control socket and an NBD access rule.
    ("control", None),
    ("allow", None),
];

/// Options without a value.
const FLAGS: &[(&str, Option<char>)] = &[
    ("allow-discards", None),
    ("batch-mode", Some('q')),
    ("integrity-no-journal", Some('D')),
    ("integrity-bitmap-mode", Some('B')),
    ("integrity-recovery-mode", Some('R')),
    ("integrity-recalculate", None),
    ("integrity-recalculate-reset", None),
    ("integrity-legacy-padding", None),
    ("integrity-legacy-hmac", None),
    ("integrity-legacy-recalculate", None),
    ("no-wipe", None),
    ("wipe", None),
    ("progress-json", None),
    ("deferred", None),
    ("cancel-deferred", None),
    ("verbose", Some('v')),
    ("debug", None),
    ("help", Some('?')),
    ("usage", None),
    ("version", Some('V')),
];

pub(crate) struct Args {
    values: HashMap<&'static str, String>,
    flags: Vec<&'static str>,
    /// The action first, then its arguments.
    pub pos: Vec<String>,
}

fn find(
    table: &[(&'static str, Option<char>)],
    long: Option<&str>,
    short: Option<char>,
) -> Option<&'static str> {
    table
        .iter()
        .find(|(l, s)| long == Some(*l) || (short.is_some() && short == *s))
        .map(|(l, _)| *l)
}

/// One word that starts with `-`: long name, short letter, inline value.
fn split_option(w: &str) -> (Option<String>, Option<char>, Option<String>) {
    match w.strip_prefix("--") {
        Some(rest) => match rest.split_once('=') {
            Some((k, v)) => (Some(k.to_string()), None, Some(v.to_string())),
            None => (Some(rest.to_string()), None, None),
        },
        None => {
            let mut cs = w[1..].chars();
            let c = cs.next();
            let rest: String = cs.collect();
            (None, c, (!rest.is_empty()).then_some(rest))
        }
    }
}

impl Args {
    pub fn parse(argv: Vec<std::ffi::OsString>) -> Result<Args, String> {
        let mut a = Args {
            values: HashMap::new(),
            flags: Vec::new(),
            pos: Vec::new(),
        };
        let argv: Vec<String> = argv
            .into_iter()
            .map(|s| {
                s.into_string()
                    .map_err(|s| format!("{}: not valid UTF-8", s.to_string_lossy()))
            })
            .collect::<Result<_, _>>()?;
        let mut it = argv.into_iter();
        let mut only_pos = false;
        while let Some(w) = it.next() {
            if only_pos || w == "-" || !w.starts_with('-') {
                a.pos.push(w);
                continue;
            }
            if w == "--" {
                only_pos = true;
                continue;
            }
            let (long, short, inline) = split_option(&w);
            if let Some(name) = find(VALUED, long.as_deref(), short) {
                let v = match inline {
                    Some(v) => v,
                    None => it.next().ok_or_else(|| format!("{w}: missing argument"))?,
                };
                a.values.insert(name, v);
            } else if let Some(name) =
                find(FLAGS, long.as_deref(), short).filter(|_| inline.is_none())
            {
                a.flags.push(name);
            } else {
                return Err(format!("{w}: unknown option"));
            }
        }
        Ok(a)
    }

    pub fn has(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// A numeric option; a value that is not a number is a usage error
    /// naming the option.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, super::Fail> {
        self.str(name)
            .map(|v| {
                crate::core::units::parse_decimal(v).map_err(|_| {
                    super::Fail::usage(format!(
                        "Invalid value '{v}' of --{name}: expected a number."
                    ))
                })
            })
            .transpose()
    }

    /// [`Args::u64`] for options that must fit 32 bits.
    pub fn u32(&self, name: &str) -> Result<Option<u32>, super::Fail> {
        self.u64(name)?
            .map(|v| {
                u32::try_from(v).map_err(|_| {
                    super::Fail::usage(format!("Invalid value '{v}' of --{name}: too large."))
                })
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(Into::into).collect())
    }

    #[test]
    fn popt_spellings() {
        let a = p("format -q --tag-size=8 d.img -I sha256 -s4096 --no-wipe").unwrap();
        assert_eq!(a.pos, ["format", "d.img"]);
        assert_eq!(a.str("tag-size"), Some("8"));
        assert_eq!(a.str("integrity"), Some("sha256"));
        assert_eq!(a.str("sector-size"), Some("4096"));
        assert!(a.has("batch-mode") && a.has("no-wipe") && !a.has("debug"));
        assert_eq!(
            p("dump --bogus x").err().unwrap(),
            "--bogus: unknown option"
        );
        assert!(p("dump --tag-size").is_err());
        assert!(p("x --journal-size=abc")
            .unwrap()
            .u64("journal-size")
            .is_err());
    }
}
