//! No function in `src/` is over 150 lines (from its `fn` line to its
//! closing brace), except the data tables listed below: a function that
//! long does several jobs, and a reader cannot hold it in mind. Reads the
//! sources as text; braces inside strings, chars and comments do not count.

#[path = "common/src_tree.rs"]
mod src_tree;
use src_tree::rust_files;

use std::path::Path;

const MAX_LINES: usize = 150;

/// Functions allowed over the limit, as (file under `src/`, name): data
/// tables only, and there are none today.
const ALLOWED: &[(&str, &str)] = &[];

/// The source with comments, string and char literals blanked (newlines
/// kept, so line numbers stay), as chars.
fn blank_literals(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for x in out.iter_mut().take(to.min(c.len())).skip(from) {
            if *x != '\n' {
                *x = ' ';
            }
        }
    };
    let ident = |k: usize| c[k].is_alphanumeric() || c[k] == '_';
    let mut i = 0;
    while i < c.len() {
        let end = if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len())
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            block_comment_end(&c, i)
        } else if c[i] == 'r'
            && (i == 0 || !ident(i - 1) || (c[i - 1] == 'b' && (i < 2 || !ident(i - 2))))
        {
            match raw_string_end(&c, i + 1) {
                Some(e) => e,
                None => i + 1,
            }
        } else if c[i] == '"' {
            let mut k = i + 1;
            while k < c.len() && c[k] != '"' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        } else if c[i] == '\'' {
            char_literal_end(&c, i).unwrap_or(i + 1)
        } else {
            i + 1
        };
        if end > i + 1 {
            blank(&mut out, i, end);
        }
        i = end.max(i + 1);
    }
    out
}

fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// From the char after an `r`: the end of a raw string starting there.
fn raw_string_end(c: &[char], at: usize) -> Option<usize> {
    let hashes = c[at.min(c.len())..]
        .iter()
        .take_while(|&&x| x == '#')
        .count();
    if c.get(at + hashes) != Some(&'"') {
        return None;
    }
    let mut k = at + hashes + 1;
    while k < c.len() {
        if c[k] == '"' && (1..=hashes).all(|h| c.get(k + h) == Some(&'#')) {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(c.len())
}

/// The end of a char literal at `i` (`'x'`, `'\n'`, `'\u{7b}'`), or None
/// for a lifetime or label.
fn char_literal_end(c: &[char], i: usize) -> Option<usize> {
    if c.get(i + 1) == Some(&'\\') {
        return (i + 3..c.len()).find(|&k| c[k] == '\'').map(|k| k + 1);
    }
    (c.get(i + 2) == Some(&'\'')).then_some(i + 3)
}

/// Every function with a body: (name, line of `fn`, lines it spans).
fn functions(src: &str) -> Vec<(String, usize, usize)> {
    let c = blank_literals(src);
    let line_at = |k: usize| c[..k].iter().filter(|&&x| x == '\n').count() + 1;
    let ident = |x: char| x.is_alphanumeric() || x == '_';
    let mut out = Vec::new();
    for i in 0..c.len().saturating_sub(3) {
        let word_start = i == 0 || !ident(c[i - 1]);
        if !(word_start && c[i] == 'f' && c[i + 1] == 'n' && c[i + 2].is_whitespace()) {
            continue;
        }
        let mut k = i + 2;
        while k < c.len() && c[k].is_whitespace() {
            k += 1;
        }
        let name: String = c[k..].iter().take_while(|&&x| ident(x)).collect();
        if name.is_empty() {
            continue;
        }
        // The body starts at the first `{` outside the signature's
        // brackets; a `;` first means a declaration without one.
        let mut depth = 0i32;
        let mut open = None;
        for (j, &x) in c.iter().enumerate().skip(k) {
            match x {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut depth = 0;
        let close = (open..c.len()).find(|&j| {
            match c[j] {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        let close = close.unwrap_or(c.len() - 1);
        let first = line_at(i);
        out.push((name, first, line_at(close) - first + 1));
    }
    out
}

#[test]
fn no_function_in_src_is_over_150_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut long = Vec::new();
    let mut allowed_seen = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        let rel = rel.to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(f).expect("read source");
        for (name, line, lines) in functions(&text) {
            if lines <= MAX_LINES {
                continue;
            }
            if ALLOWED.contains(&(rel.as_str(), name.as_str())) {
                allowed_seen.push((rel.clone(), name));
                continue;
            }
            long.push(format!(
                "src/{rel}:{line}: fn {name} is {lines} lines (limit {MAX_LINES}): \
                 split it by job"
            ));
        }
    }
    assert!(long.is_empty(), "functions too long:\n{}", long.join("\n"));
    let stale: Vec<String> = ALLOWED
        .iter()
        .filter(|(f, n)| !allowed_seen.iter().any(|(sf, sn)| sf == f && sn == n))
        .map(|(f, n)| format!("src/{f}: fn {n}"))
        .collect();
    assert!(
        stale.is_empty(),
        "allowed to be long but no longer are (take them off ALLOWED in \
         tests/fn_length.rs):\n{}",
        stale.join("\n")
    );
}

/// The counter itself: braces in strings, chars and comments do not
/// count, declarations without a body are not functions, `fn` types are
/// not functions.
#[test]
fn counter_skips_literals_and_comments() {
    let src = "trait T { fn decl(&self); }\n\
               fn a() {\n    let s = \"}}\"; let c = '}'; let l: &'static str = r#\"{\"#;\n\
               // }\n    /* { */ let f: fn(u8) -> u8 = |x| x;\n    let e = '\\u{7b}';\n}\n\
               pub(crate) fn b<'a>(x: &'a [u8; 2]) -> Option<()> where u8: Copy { None }\n";
    let got = functions(src);
    assert_eq!(
        got,
        [("a".to_string(), 2, 6), ("b".to_string(), 8, 1)],
        "{got:?}"
    );
}

/// A body of 151 lines is caught, one of 150 is not.
#[test]
fn counter_measures_from_fn_line_to_closing_brace() {
    let body = |n: usize| format!("fn long() {{\n{}}}\n", "    x();\n".repeat(n - 2));
    assert_eq!(functions(&body(150))[0].2, 150);
    assert_eq!(functions(&body(151))[0].2, 151);
}
