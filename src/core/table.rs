//! dmsetup table syntax: one segment per line,
//! `<start> <length> <target> <args...>` in 512-byte sectors.
//!
//! Parsing is split from building so that `udm table check` can report the
//! segments of a table without opening anything, and so that every error
//! names the line and the field a user has to fix.

use std::borrow::Cow;
use std::fmt;

use super::units::DecimalError;

/// Bytes per dm sector: tables always count in 512-byte units.
pub const SECTOR: u64 = 512;

/// Largest device dm accepts: sectors must fit `LLONG_MAX >> 9`.
const MAX_SECTORS: u64 = (i64::MAX as u64) >> 9;

/// Most segments a table may have (the kernel's DM_MAX_TARGETS).
const MAX_SEGMENTS: usize = 1 << 20;

/// Whether `c` would make a name look like another: Unicode format
/// characters (general category Cf: bidirectional overrides and
/// isolates, zero-width spaces and joiners, the BOM, soft hyphen, tag
/// characters), variation selectors, the combining grapheme joiner and the
/// Hangul fillers, which all show as nothing or reorder what follows.
/// Control characters and whitespace are refused by the callers' own
/// checks. Device names appear in `dmsetup ls`, NBD export lists, metrics
/// and logs, where an administrator must be able to tell them apart.
pub fn invisible_char(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x034F
            | 0x061C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    ) || (0x0600..=0x0605).contains(&(c as u32))
        || c as u32 == 0x06DD
        || c as u32 == 0x070F
        || c as u32 == 0x08E2
}

/// One parsed table line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLine {
    /// 1-based line number in the source text.
    pub line_no: usize,
    /// Start, in 512-byte sectors.
    pub start: u64,
    /// Length, in 512-byte sectors.
    pub len: u64,
    pub target: String,
    /// The words after the target type; a crypt line's key among them,
    /// so they are wiped when the line is dropped.
    pub args: Vec<String>,
}

impl Drop for TableLine {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.args.iter_mut().for_each(Zeroize::zeroize);
    }
}

impl TableLine {
    /// The line as dmsetup writes it (`start length target args…`, each
    /// word escaped so that [`parse`] reads the same line back). Holds a
    /// crypt key when the line does: callers wipe it.
    pub fn text(&self) -> String {
        let mut s = format!("{} {} {}", self.start, self.len, escape_arg(&self.target));
        for a in &self.args {
            s.push(' ');
            s.push_str(&escape_arg(a));
        }
        s
    }
}

/// A table error, located as precisely as possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError {
    /// 1-based line number (0 when the table as a whole is wrong).
    pub line: usize,
    /// The field at fault, e.g. `length` or `argument 2 (chunk_size)`.
    pub field: Option<String>,
    pub msg: String,
}

impl TableError {
    pub fn new(line: usize, field: Option<String>, msg: impl Into<String>) -> Self {
        TableError {
            line,
            field,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}", self.line)?;
            if let Some(field) = &self.field {
                write!(f, ", {field}")?;
            }
            write!(f, ": {}", self.msg)
        } else {
            write!(f, "{}", self.msg)
        }
    }
}

impl std::error::Error for TableError {}

/// Split a line into words the way the kernel's `dm_split_args` does:
/// whitespace separates, a backslash escapes the next character.
///
/// A word may be a key: each is built in one scratch buffer sized for the
/// whole line (it never grows, so never frees key bytes) and copied into a
/// string of exactly its size; the scratch is wiped before it is dropped.
pub fn split_args(line: &str) -> Vec<String> {
    use zeroize::Zeroize;
    let mut out = Vec::new();
    let mut cur = String::with_capacity(line.len());
    let mut in_word = false;
    // Zeroizing a string wipes its whole capacity and keeps it.
    let finish = |cur: &mut String, out: &mut Vec<String>| {
        let mut w = String::with_capacity(cur.len());
        w.push_str(cur);
        out.push(w);
        cur.zeroize();
    };
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            in_word = true;
            if let Some(n) = chars.next() {
                cur.push(n);
            }
        } else if c.is_whitespace() {
            if in_word {
                finish(&mut cur, &mut out);
                in_word = false;
            }
        } else {
            in_word = true;
            cur.push(c);
        }
    }
    if in_word {
        finish(&mut cur, &mut out);
    }
    cur.zeroize();
    out
}

/// The inverse of [`split_args`] for one word: backslash-escape what would
/// otherwise split it, start a comment or be taken as an escape, so that a
/// printed table reads back as the same table (a device path with a space,
/// a cipher spec with a backslash). Plain words are returned as they are.
pub fn escape_arg(word: &str) -> Cow<'_, str> {
    let special = |c: char| c == '\\' || c == '#' || c.is_whitespace();
    if !word.contains(special) {
        return Cow::Borrowed(word);
    }
    let mut out = String::with_capacity(word.len() + 8);
    for c in word.chars() {
        if special(c) {
            out.push('\\');
        }
        out.push(c);
    }
    Cow::Owned(out)
}

fn parse_u64(s: &str, line: usize, field: &str) -> Result<u64, TableError> {
    super::units::parse_decimal(s).map_err(|e| {
        let msg = match e {
            DecimalError::TooLarge => format!("'{s}' is too large"),
            _ => format!("expected a decimal number of 512-byte sectors, got '{s}'"),
        };
        TableError::new(line, Some(field.to_string()), msg)
    })
}

/// Parse table text into lines, checking the layout rules dm enforces:
/// segments start at 0, are contiguous, non-empty and do not overflow.
pub fn parse(text: &str) -> Result<Vec<TableLine>, TableError> {
    let mut lines = Vec::new();
    let mut expect_start = 0u64;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = raw.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        // Wiped on every way out, errors included.
        let mut words = zeroize::Zeroizing::new(split_args(strip_comment(raw)));
        if words.is_empty() {
            continue;
        }
        if words.len() < 3 {
            return Err(TableError::new(
                line_no,
                None,
                "expected '<start> <length> <target> [args...]' (start and length in 512-byte sectors)",
            ));
        }
        let start = parse_u64(&words[0], line_no, "start")?;
        let len = parse_u64(&words[1], line_no, "length")?;
        let target = words[2].clone();
        // The arguments are moved, not copied: a copy would leave the
        // key's bytes in `words`, freed unwiped.
        let args: Vec<String> = words.drain(3..).collect();
        if len == 0 {
            return Err(TableError::new(
                line_no,
                Some("length".into()),
                "zero-length segment; every segment must cover at least one sector",
            ));
        }
        if start != expect_start {
            let what = if start > expect_start {
                "gap"
            } else {
                "overlap"
            };
            return Err(TableError::new(
                line_no,
                Some("start".into()),
                format!(
                    "{what} in table: this segment starts at sector {start} but the previous one ends at {expect_start}; segments must be contiguous from sector 0"
                ),
            ));
        }
        let end = start.checked_add(len).filter(|&e| e <= MAX_SECTORS).ok_or_else(|| {
            TableError::new(
                line_no,
                Some("length".into()),
                format!("device too large: start {start} + length {len} exceeds {MAX_SECTORS} sectors"),
            )
        })?;
        if target.len() > 15 {
            return Err(TableError::new(
                line_no,
                Some("target".into()),
                format!("target type '{target}' is longer than 15 characters"),
            ));
        }
        if lines.len() >= MAX_SEGMENTS {
            return Err(TableError::new(
                line_no,
                None,
                format!("more than {MAX_SEGMENTS} segments"),
            ));
        }
        expect_start = end;
        lines.push(TableLine {
            line_no,
            start,
            len,
            target,
            args,
        });
    }
    if lines.is_empty() {
        return Err(TableError::new(
            0,
            None,
            "table is empty: it needs at least one segment line",
        ));
    }
    Ok(lines)
}

/// Drop a trailing `# comment` that follows whitespace (an unescaped `#`
/// inside a word is kept, e.g. in a path).
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        if b == b'\\' {
            escaped = true;
        } else if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_exact_copies_and_lines_wipe_their_arguments() {
        let w = split_args(r"0 8 crypt aes-xts-plain64 00ff\ ee 0 /dev/a\ b 0");
        assert_eq!(w[4], "00ff ee");
        assert_eq!(w[6], "/dev/a b");
        // Each word in a string of its own size, not the line's.
        assert!(w.iter().all(|x| x.capacity() == x.len()), "{w:?}");
        let l = parse("0 8 crypt aes-xts-plain64 00112233 0 /dev/a 0\n").unwrap();
        assert_eq!(l[0].args[1], "00112233");
        // That dropping a line leaves no key bytes behind is checked with a
        // watching allocator: tests/hostile_keys.rs.
    }

    #[test]
    fn format_and_invisible_characters_are_named() {
        for c in [
            '\u{202E}',
            '\u{200B}',
            '\u{200D}',
            '\u{2066}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{E0041}',
            '\u{FE0F}',
            '\u{3164}',
            '\u{061C}',
        ] {
            assert!(invisible_char(c), "U+{:04X} passed", c as u32);
        }
        for c in ['a', 'Z', '0', '-', '_', '.', 'é', 'ж', '中'] {
            assert!(!invisible_char(c), "{c} refused");
        }
    }

    #[test]
    fn parses_comments_blank_lines_and_escapes() {
        let t = "# a table\n\n0 8 zero\n8 8 linear /tmp/a\\ b 0 # trailing\n";
        let l = parse(t).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[1].line_no, 4);
        assert_eq!(l[1].args, vec!["/tmp/a b", "0"]);
    }

    #[test]
    fn rejects_gap_overlap_and_zero_length() {
        let e = parse("0 8 zero\n9 8 zero\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("gap"), "{e}");
        let e = parse("0 8 zero\n4 8 zero\n").unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        let e = parse("0 0 zero\n").unwrap_err();
        assert!(e.to_string().contains("zero-length"), "{e}");
        let e = parse("8 8 zero\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("start"));
    }

    #[test]
    fn rejects_bad_numbers_and_short_lines() {
        let e = parse("0 x zero\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("length"));
        assert!(e.to_string().contains("'x'"));
        assert!(parse("0 8\n").is_err());
        assert!(parse("").is_err());
        assert!(parse("0 99999999999999999999 zero").is_err());
        assert!(parse(&format!("0 {} zero", u64::MAX)).is_err());
    }

    #[test]
    fn a_line_prints_as_it_parses() {
        let t = "0 8 linear /tmp/a\\ b 0\n8 16 crypt aes-xts-plain64 00ff 0 /d\\#1 8 1 allow_discards\n";
        let lines = parse(t).expect("valid table");
        let back: Vec<String> = lines.iter().map(TableLine::text).collect();
        assert_eq!(back[0], "0 8 linear /tmp/a\\ b 0");
        assert_eq!(lines[1].args[3], "/d#1");
        assert_eq!(parse(&(back.join("\n") + "\n")).expect("reparse"), lines);
    }

    #[test]
    fn escaped_words_split_back() {
        for w in ["plain", "/tmp/a b", "a\\b", "#x", "c\\ #\t\\", "\\"] {
            let e = escape_arg(w);
            assert_eq!(split_args(&format!("x {e} y")), vec!["x", w, "y"], "{w:?}");
        }
        assert!(matches!(escape_arg("/dev/sda"), Cow::Borrowed(_)));
        assert_eq!(
            strip_comment(&format!("0 8 linear {} 0", escape_arg("#d"))),
            "0 8 linear \\#d 0"
        );
    }
}
