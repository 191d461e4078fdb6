//! veritysetup's options, popt style: `--name=value` or `--name value`,
//! short `-h`, `-s`, `-v`, `-V`, `-?`, options anywhere among the
//! positional arguments, `--` ending them.

use crate::cli::setup_shell::OptTable;

/// Options with a value: long name, short letter.
pub(super) const VALUED: OptTable = &[
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
pub(super) const FLAGS: OptTable = &[
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

pub(crate) use crate::cli::setup_shell::Args;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        Args::parse_words(s, VALUED, FLAGS)
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
