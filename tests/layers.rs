//! The layering rule of docs/ARCHITECTURE.md, checked on the source: a
//! top-level module may use only modules of a lower layer, and the files
//! inside one module may not use each other in a circle. Reads `src/` as
//! text (every `crate::…` and `super::…` path outside comments), so a new
//! import that points up, or a new circle, fails the test suite.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first. A module may use modules of lower layers only
/// (not of its own layer, so that a layer's modules stay independent).
const LAYERS: &[&[&str]] = &[
    &["core", "protocol"],
    &["mem"],
    &["crypto", "store"],
    &["targets", "engine", "dm"],
    &["mapper"],
    &["luks", "nbd"],
    &["control"],
    &["cli", "fuzzing"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src/") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text without `//` comments (doc links name modules too) and without
/// string literals.
fn code_only(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// First path segments after `prefix` (`crate::`, `super::`), including
/// each name of a group: `crate::{a::x, b}` gives `a` and `b`.
fn segments_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Names at depth 0 of the group.
            let mut depth = 0;
            let mut word = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if (c.is_alphanumeric() || c == '_') && depth == 0 && at_start => {
                        word.push(c)
                    }
                    _ => {
                        if !word.is_empty() {
                            out.push(std::mem::take(&mut word));
                            at_start = false;
                        }
                    }
                }
            }
            if !word.is_empty() {
                out.push(word);
            }
        } else {
            let w: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !w.is_empty() {
                out.push(w);
            }
        }
    }
    out
}

/// `src/nbd/conn.rs` -> ("nbd", "conn"); `src/nbd/mod.rs` -> ("nbd", "mod");
/// `src/fuzzing.rs` -> ("fuzzing", "mod").
fn module_of(src: &Path, file: &Path) -> (String, String) {
    let rel = file.strip_prefix(src).expect("under src/");
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    match parts.as_slice() {
        [one] => (one.clone(), "mod".into()),
        [top, rest @ ..] => (top.clone(), rest[0].clone()),
        [] => unreachable!(),
    }
}

#[test]
fn modules_only_use_lower_layers_and_files_form_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut errors = Vec::new();
    // Per top-level module: file -> sibling files it uses.
    let mut graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let (top, sub) = module_of(&src, f);
        siblings.entry(top).or_default().insert(sub);
    }
    for f in &files {
        let (top, sub) = module_of(&src, f);
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(mine) = layer_of(&top) else {
            errors.push(format!(
                "src/{top}: a top-level module missing from the layer table \
                 (tests/layers.rs and docs/ARCHITECTURE.md)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).expect("read source");
        let code = code_only(&text);
        let rel = f.strip_prefix(&src).unwrap_or(f).display().to_string();
        let sibs = &siblings[&top];
        let mut uses = BTreeSet::new();
        for m in segments_after(&code, "crate::") {
            if m == top {
                continue;
            }
            match layer_of(&m) {
                Some(theirs) if theirs < mine => {}
                Some(_) => errors.push(format!(
                    "src/{rel}: {top} (layer {mine}) uses crate::{m} (layer {}), \
                     which is not below it",
                    layer_of(&m).unwrap_or(0)
                )),
                None => {}
            }
        }
        // Paths to siblings: `crate::top::x` and, from a file of the
        // module, `super::x`. Unit tests (a trailing `#[cfg(test)] mod`, or
        // a `tests.rs`) may use the whole module: not counted.
        let non_test = match code.find("#[cfg(test)]\nmod ") {
            Some(i) => &code[..i],
            None => &code[..],
        };
        if sub == "tests" {
            continue;
        }
        for w in segments_after(non_test, &format!("crate::{top}::")) {
            uses.insert(w);
        }
        if sub != "mod" {
            for w in segments_after(non_test, "super::") {
                uses.insert(w);
            }
        }
        let edges: BTreeSet<String> = uses
            .into_iter()
            .filter(|u| sibs.contains(u) && *u != sub && sub != "mod")
            .collect();
        graphs.entry(top).or_default().insert(sub.clone(), edges);
    }
    for (top, g) in &graphs {
        if let Some(cycle) = find_cycle(g) {
            errors.push(format!(
                "src/{top}: files use each other in a circle: {cycle}"
            ));
        }
    }
    assert!(errors.is_empty(), "layering broken:\n{}", errors.join("\n"));
}

fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c.join(" -> "));
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// The checker itself must catch what it is for.
#[test]
fn checker_sees_grouped_and_plain_paths() {
    let code = code_only(
        "use crate::{core::x, mem}; // crate::cli\nlet s = \"crate::nbd\"; crate::store::y();",
    );
    let mut got = segments_after(&code, "crate::");
    got.sort();
    assert_eq!(got, ["core", "mem", "store"]);
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(find_cycle(&g).is_some());
    g.insert("b".to_string(), BTreeSet::new());
    assert!(find_cycle(&g).is_none());
}
