//! docs/ARCHITECTURE.md's floor table says what the code does: every
//! top-level module of `src/` sits on the floor that tests/layers.rs's
//! `LAYERS` gives it (read from that file, so there is one list), and its
//! "uses" column names exactly the modules its code uses outside unit
//! tests. A new import, a moved module or a stale row fails the suite.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Tokens that matter for paths: identifiers and `::`, `{`, `}`, `,`.
/// Comments, string and char literals are skipped (they name modules in
/// prose and messages).
fn tokens(src: &str) -> Vec<String> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let rest = |k: usize| c.get(i + k).copied();
        match c[i] {
            '/' if rest(1) == Some('/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            // A char literal ('x', '\n', '"'); a lifetime has no closing quote.
            '\'' if rest(1) == Some('\\') || rest(2) == Some('\'') => {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            ':' if rest(1) == Some(':') => {
                out.push("::".into());
                i += 2;
            }
            '{' | '}' | ',' => {
                out.push(c[i].to_string());
                i += 1;
            }
            x if x.is_alphanumeric() || x == '_' => {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                out.push(c[start..i].iter().collect());
            }
            _ => i += 1,
        }
    }
    out
}

/// The first module after each `crate::`, and each first name of a
/// `crate::{…}` group.
fn crate_uses(t: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (k, w) in t.iter().enumerate() {
        let path_start = k == 0 || t[k - 1] != "::";
        if w != "crate" || !path_start || t.get(k + 1).map(String::as_str) != Some("::") {
            continue;
        }
        match t.get(k + 2).map(String::as_str) {
            Some("{") => {
                let mut depth = 0;
                let mut first = true;
                for x in &t[k + 3..] {
                    match x.as_str() {
                        "{" => depth += 1,
                        "}" if depth == 0 => break,
                        "}" => depth -= 1,
                        "," if depth == 0 => first = true,
                        name if depth == 0 && first && name != "::" => {
                            out.insert(name.to_string());
                            first = false;
                        }
                        _ => {}
                    }
                }
            }
            Some(name) => {
                out.insert(name.to_string());
            }
            None => {}
        }
    }
    out
}

/// Module -> modules its code uses, outside `#[cfg(test)] mod` blocks at
/// the end of a file and `tests.rs` files.
fn uses_in_code(dir: &Path, top: Option<&str>, out: &mut BTreeMap<String, BTreeSet<String>>) {
    for e in std::fs::read_dir(dir).expect("read src/") {
        let p = e.expect("dir entry").path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let module = top.map_or_else(|| name.trim_end_matches(".rs").to_string(), str::to_string);
        if p.is_dir() {
            uses_in_code(&p, Some(&module), out);
            continue;
        }
        if !name.ends_with(".rs") || name == "tests.rs" || module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read source");
        let code = match text.find("#[cfg(test)]\nmod ") {
            Some(at) => &text[..at],
            None => &text[..],
        };
        let uses = out.entry(module.clone()).or_default();
        uses.extend(
            crate_uses(&tokens(code))
                .into_iter()
                .filter(|m| *m != module),
        );
    }
}

/// `LAYERS` of tests/layers.rs: module -> floor.
fn layers(text: &str) -> BTreeMap<String, usize> {
    let start = text
        .find("const LAYERS")
        .expect("tests/layers.rs has LAYERS");
    let body = &text[start..start + text[start..].find("];").expect("LAYERS ends")];
    let rows = body.lines().filter(|l| l.trim_start().starts_with("&["));
    let mut out = BTreeMap::new();
    for (floor, row) in rows.enumerate() {
        for name in row.split('"').skip(1).step_by(2) {
            out.insert(name.to_string(), floor);
        }
    }
    out
}

/// The doc's floor table: module -> (floor, uses).
fn floor_table(doc: &str) -> BTreeMap<String, (usize, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    let rows = doc.lines().skip_while(|l| !l.starts_with("| floor |"));
    for row in rows.take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        let Ok(floor) = cells[0].parse::<usize>() else {
            continue;
        };
        let module = cells[1].trim_matches('`').trim_end_matches('/');
        let uses = cells[cells.len() - 1]
            .split(", ")
            .filter(|u| *u != "—")
            .map(str::to_string)
            .collect();
        out.insert(module.trim_end_matches(".rs").to_string(), (floor, uses));
    }
    out
}

fn differences(
    table: &BTreeMap<String, (usize, BTreeSet<String>)>,
    floors: &BTreeMap<String, usize>,
    code: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut errors = Vec::new();
    for (m, floor) in floors {
        let Some((f, uses)) = table.get(m) else {
            errors.push(format!("{m}: missing from the floor table"));
            continue;
        };
        if f != floor {
            errors.push(format!("{m}: floor {f} in the doc, {floor} in LAYERS"));
        }
        let actual: BTreeSet<String> = code
            .get(m)
            .into_iter()
            .flatten()
            .filter(|u| floors.contains_key(*u))
            .cloned()
            .collect();
        if *uses != actual {
            errors.push(format!(
                "{m}: the doc says it uses {uses:?}, the code {actual:?}"
            ));
        }
    }
    for m in table.keys().filter(|m| !floors.contains_key(*m)) {
        errors.push(format!("{m}: in the floor table but not in LAYERS"));
    }
    errors
}

#[test]
fn floor_table_matches_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let table = floor_table(&read("docs/ARCHITECTURE.md"));
    let floors = layers(&read("tests/layers.rs"));
    let mut code = BTreeMap::new();
    uses_in_code(&root.join("src"), None, &mut code);
    let errors = differences(&table, &floors, &code);
    assert!(
        errors.is_empty(),
        "floor table out of date:\n{}",
        errors.join("\n")
    );
}

/// The checker sees what it must: grouped and plain paths, not comments,
/// strings or nested paths; and a stale row is reported.
#[test]
fn checker_sees_uses_and_stale_rows() {
    let code = "use crate::{core::x, mem}; // crate::cli\nlet s = \"crate::nbd\";\n\
                let q = '\"'; crate::store::y(); other::crate::luks; fn f<'a>(_: &'a crate::dm::T) {}";
    let got: Vec<String> = crate_uses(&tokens(code)).into_iter().collect();
    assert_eq!(got, ["core", "dm", "mem", "store"]);
    let doc = "| floor | module | job | uses |\n|---|---|---|---|\n\
               | 0 | `core/` | x | — |\n| 1 | `mem/` | y | core |\n";
    let table = floor_table(doc);
    let floors = layers("const LAYERS: &[&[&str]] = &[\n    &[\"core\"],\n    &[\"mem\"],\n];");
    let mut code = BTreeMap::new();
    code.insert("mem".to_string(), BTreeSet::from(["core".to_string()]));
    assert!(differences(&table, &floors, &code).is_empty());
    code.insert("core".to_string(), BTreeSet::from(["mem".to_string()]));
    let e = differences(&table, &floors, &code);
    assert!(e.len() == 1 && e[0].starts_with("core:"), "{e:?}");
}
