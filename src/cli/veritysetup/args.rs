//! veritysetup's options, popt style: `--name=value` or `--name value`,
//! short `-h`, `-s`, `-v`, `-V`, `-?`, options anywhere among the
//! positional arguments, `--` ending them.

use std::collections::HashMap;

/// Options with a value: long name, short letter.
const VALUED: &[(&str, Option<char>)] = &[
    ("data-block-size", None),
    ("hash-block-size", None),
    ("data-blocks", None),
    ("hash-offset", None),
    ("salt", Some('s')),
    ("uuid", None),
    ("hash", Some('h')),
    ("format", None),
    ("root-hash-file", None),
    ("root-hash-signature", None),
    ("fec-device", None),
    ("fec-offset", None),
    ("fec-roots", None),
    // udm's own: the control socket and an NBD access rule, as in
    // `udm cryptsetup`.
    ("control", None),
    ("allow", None),
];

/// Options without a value.
const FLAGS: &[(&str, Option<char>)] = &[
    ("no-superblock", None),
    ("ignore-corruption", None),
    ("restart-on-corruption", None),
    ("panic-on-corruption", None),
    ("ignore-zero-blocks", None),
    ("check-at-most-once", None),
    ("use-tasklets", None),
    ("error-as-corruption", None),
    ("shared", None),
    ("deferred", None),
    ("cancel-deferred", None),
    ("verbose", Some('v')),
    ("debug", None),
    ("batch-mode", None),
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
            let (long, short, inline) = match w.strip_prefix("--") {
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
            };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(Into::into).collect())
    }

    #[test]
    fn popt_spellings() {
        let a = p("format -v --salt=00 d.img --hash sha1 -s11 h.img --no-superblock").unwrap();
        assert_eq!(a.pos, ["format", "d.img", "h.img"]);
        assert_eq!(a.str("salt"), Some("11"));
        assert_eq!(a.str("hash"), Some("sha1"));
        assert!(a.has("verbose") && a.has("no-superblock") && !a.has("debug"));
        assert_eq!(
            p("dump --bogus x").err().unwrap(),
            "--bogus: unknown option"
        );
        assert!(p("dump --salt").is_err());
        assert!(p("dump --no-superblock=1").is_err());
        let a = p("verify -- -d h").unwrap();
        assert_eq!(a.pos, ["verify", "-d", "h"]);
        assert!(p("x --hash-offset=abc")
            .unwrap()
            .u64("hash-offset")
            .is_err());
    }
}
