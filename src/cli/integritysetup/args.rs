//! integritysetup's options, popt style: `--name=value` or `--name
//! value`, short letters, options anywhere among the positional
//! arguments, `--` ending them.

use crate::cli::setup_shell::OptTable;

/// Options with a value: long name, short letter.
pub(super) const VALUED: OptTable = &[
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
pub(super) const FLAGS: OptTable = &[
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

pub(crate) use crate::cli::setup_shell::Args;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        Args::parse_words(s, VALUED, FLAGS)
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
