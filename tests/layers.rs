//! The layering rule of docs/ARCHITECTURE.md, checked on the source: a
//! top-level module may use only modules of a lower layer, and no files use
//! each other in a circle, inside a folder or across folders. Reads `src/`
//! as text: every `crate::…`, `super::…`, `self::…` path and every path
//! through a child module, outside comments and strings, is resolved to the
//! file it names (a `mod.rs` stands for its folder; a `pub use` is followed
//! to the file it re-exports), so a new import that points up, or a new
//! circle between two files anywhere, fails the test suite. A file's use of
//! its own folder's items is not an edge; a `mod.rs`'s use of its files is.

use std::collections::{BTreeMap, BTreeSet};
#[path = "common/src_tree.rs"]
mod src_tree;
use src_tree::rust_files;

use std::path::Path;

/// The layers, bottom first. A module may use modules of lower layers only
/// (not of its own layer, so that a layer's modules stay independent).
const LAYERS: &[&[&str]] = &[
    &["core", "protocol"],
    &["mem"],
    &["crypto", "store"],
    &["targets", "engine", "dm"],
    &["mapper"],
    &["luks", "nbd"],
    &["control", "fuse"],
    &["cli"],
    &["fuzzing"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// A module path: `src/cli/cryptsetup/active.rs` is `cli::cryptsetup::active`,
/// `src/cli/cryptsetup/mod.rs` is `cli::cryptsetup`.
type Node = Vec<String>;

fn show(n: &[String]) -> String {
    n.join("::")
}

/// `cli/cryptsetup/active.rs` -> `[cli, cryptsetup, active]`; a `mod.rs`
/// names its folder; `lib.rs` and `main.rs` are the root (`[]`).
fn node_of(rel: &str) -> Node {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The text without comments (doc links name modules too) and without the
/// contents of string literals (plain, byte and raw).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && raw_start(b, i) {
            let hashes = raw_hashes(b, i + 1).unwrap_or(0);
            i += 1 + hashes + 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.extend_from_slice(b"\"\"");
        } else if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.extend_from_slice(b"\"\"");
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the `r` at `i` starts a raw string (`r"`, `r#"`, `br"`).
fn raw_start(b: &[u8], i: usize) -> bool {
    let free = |k: usize| k == 0 || !is_ident(b[k - 1]);
    (free(i) || (b[i - 1] == b'b' && free(i - 1))) && raw_hashes(b, i + 1).is_some()
}

/// From the byte after an `r`: the number of `#` before a `"`, if a raw
/// string starts there.
fn raw_hashes(b: &[u8], at: usize) -> Option<usize> {
    let n = b[at..].iter().take_while(|&&c| c == b'#').count();
    (b.get(at + n) == Some(&b'"')).then_some(n)
}

/// The code without `#[cfg(test)] mod x { … }` blocks: unit tests may use
/// the whole module, so their paths do not count.
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let t = after.trim_start();
        let Some(m) = t.strip_prefix("mod ") else {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        };
        let name_end = m.find(|c: char| !(c.is_alphanumeric() || c == '_'));
        let tail = name_end.map_or("", |e| m[e..].trim_start());
        if !tail.starts_with('{') {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let mut depth = 0;
        let mut end = tail.len();
        for (i, c) in tail.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Child modules declared `#[cfg(test)] mod x;`: test-only files.
fn test_children(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        rest = &rest[at + "#[cfg(test)]".len()..];
        if let Some(m) = rest.trim_start().strip_prefix("mod ") {
            let name: String = m
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if m[name.len()..].trim_start().starts_with(';') {
                out.push(name);
            }
        }
    }
    out
}

/// Skips spaces; returns the new position.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// One path tree from `i` (`a::b::{c, d::e}`): every full path it spells.
fn parse_tree(b: &[u8], i: usize, prefix: &[String], out: &mut Vec<Node>) -> usize {
    let i = skip_ws(b, i);
    if b.get(i) == Some(&b'{') {
        let mut j = i + 1;
        loop {
            j = skip_ws(b, j);
            match b.get(j) {
                None => return j,
                Some(b'}') => return j + 1,
                Some(b',') => j += 1,
                Some(_) => {
                    let k = parse_tree(b, j, prefix, out);
                    j = if k == j { j + 1 } else { k };
                }
            }
        }
    }
    let start = i;
    let mut j = i;
    while j < b.len() && is_ident(b[j]) {
        j += 1;
    }
    if j == start {
        if b.get(j) == Some(&b'*') {
            out.push(prefix.to_vec());
            return j + 1;
        }
        return j;
    }
    let mut path = prefix.to_vec();
    let word = String::from_utf8_lossy(&b[start..j]).into_owned();
    if word != "self" {
        path.push(word);
    }
    if b[j..].starts_with(b"::") {
        return parse_tree(b, j + 2, &path, out);
    }
    out.push(path);
    j
}

/// Every path in `code` that starts at `crate`, `super`, `self` or one of
/// `children` (module names a path may start with here).
fn paths_in(code: &str, children: &BTreeSet<String>) -> Vec<Node> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        let word = &code[i..j];
        let starts = matches!(word, "crate" | "super" | "self") || children.contains(word);
        if starts && b[j..].starts_with(b"::") {
            let mut found = Vec::new();
            let end = parse_tree(b, j + 2, &[word.to_string()], &mut found);
            out.extend(found);
            i = end.max(j);
        } else {
            i = j;
        }
    }
    out
}

/// What one file says: the paths it uses, its `pub use` re-exports (name ->
/// path) and its glob re-exports, and the names it defines itself.
#[derive(Default)]
struct FileInfo {
    uses: Vec<Node>,
    reexports: BTreeMap<String, Node>,
    globs: Vec<Node>,
    defines: BTreeSet<String>,
}

/// Absolute form of a path written in `node` (`super`, `self` and child
/// names resolved; `crate` dropped).
fn absolute(node: &[String], path: &[String]) -> Node {
    let mut base: Node = node.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {}
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    base
}

fn file_info(node: &[String], code: &str, nodes: &BTreeSet<Node>) -> FileInfo {
    let children: BTreeSet<String> = nodes
        .iter()
        .filter(|n| n.len() == node.len() + 1 && n.starts_with(node))
        .map(|n| n[node.len()].clone())
        .collect();
    let mut info = FileInfo {
        uses: paths_in(code, &children)
            .iter()
            .map(|p| absolute(node, p))
            .collect(),
        ..FileInfo::default()
    };
    for stmt in use_statements(code) {
        let mut found = Vec::new();
        parse_tree(stmt.as_bytes(), 0, &[], &mut found);
        let glob = stmt.trim_end().ends_with('*');
        for p in found {
            let abs = absolute(node, &p);
            match p.last() {
                _ if glob => info.globs.push(abs),
                // `use a::b as c` is read as `a::b`: known as `b`.
                Some(last) => {
                    info.reexports.insert(last.clone(), abs);
                }
                None => {}
            }
        }
    }
    let kw = [
        "fn ", "struct ", "enum ", "type ", "trait ", "const ", "static ", "mod ", "union ",
    ];
    for k in kw {
        for part in code.split(k).skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            info.defines.insert(name);
        }
    }
    info
}

/// The text of each `use` item (after `use`, before `;`), at any
/// visibility: a private `use` in a parent is visible to its children too.
fn use_statements(code: &str) -> Vec<&str> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("use ") {
        let at = from + at;
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        if let Some(end) = code[from..].find(';') {
            out.push(&code[from..from + end]);
        }
    }
    out
}

/// The file a path names: the longest module prefix that is a file,
/// following re-exports when the next name is not defined there.
fn resolve(path: &[String], infos: &BTreeMap<Node, FileInfo>, depth: usize) -> Option<Node> {
    let n = (0..=path.len())
        .rev()
        .find(|&k| infos.contains_key(&path[..k]))?;
    let at = path[..n].to_vec();
    if depth > 8 || n == path.len() {
        return Some(at);
    }
    let info = &infos[&at];
    let next = &path[n];
    if info.defines.contains(next) {
        return Some(at);
    }
    if let Some(target) = info.reexports.get(next) {
        let mut p = target.clone();
        p.extend(path[n + 1..].iter().cloned());
        return resolve(&p, infos, depth + 1).or(Some(at));
    }
    for g in &info.globs {
        let mut p = g.clone();
        p.extend(path[n..].iter().cloned());
        if let Some(r) = resolve(&p, infos, depth + 1) {
            if r.len() > g.len() || infos.get(&r).is_some_and(|i| i.defines.contains(next)) {
                return Some(r);
            }
        }
    }
    Some(at)
}

/// The file graph of a set of sources (`rel path -> text`, relative to
/// `src/`): each file to the files it uses. Test-only files are left out.
/// A file's uses of files inside its own folder (`mod.rs`, or `x.rs` beside
/// `x/`) are not edges: the folder holds them; every other use is, from a
/// child to its parent's `mod.rs`, between siblings, across folders.
fn file_graph(sources: &BTreeMap<String, String>) -> BTreeMap<Node, BTreeSet<Node>> {
    let mut codes = BTreeMap::new();
    let mut tests = BTreeSet::new();
    for (rel, text) in sources {
        let node = node_of(rel);
        let code = code_only(text);
        for t in test_children(&code) {
            let mut n = node.clone();
            n.push(t);
            tests.insert(n);
        }
        codes.insert(node, without_test_modules(&code));
    }
    codes.retain(|n, _| !tests.contains(n) && n.last().is_none_or(|l| l != "tests"));
    let nodes: BTreeSet<Node> = codes.keys().cloned().collect();
    let infos: BTreeMap<Node, FileInfo> = codes
        .iter()
        .map(|(n, c)| (n.clone(), file_info(n, c, &nodes)))
        .collect();
    let mut graph = BTreeMap::new();
    for (n, info) in &infos {
        let mut edges = BTreeSet::new();
        if !n.is_empty() {
            for p in &info.uses {
                if let Some(t) = resolve(p, &infos, 0) {
                    // A file using the items of a folder it lies in (its
                    // `mod.rs`, through `super::`) is structure: the folder
                    // is where it belongs. A `mod.rs` calling into its own
                    // files is a use like any other, so a circle through
                    // one (`mod.rs` -> child -> elsewhere -> `mod.rs`) is
                    // seen.
                    let ancestor = n.len() > t.len() && n.starts_with(&t);
                    if &t != n && !t.is_empty() && !ancestor {
                        edges.insert(t);
                    }
                }
            }
        }
        graph.insert(n.clone(), edges);
    }
    graph
}

/// Every circle (strongly connected set of more than one file), each as
/// one path that walks it.
fn circles(g: &BTreeMap<Node, BTreeSet<Node>>) -> Vec<String> {
    // Tarjan's algorithm, iterative enough for a crate's few hundred files.
    struct St<'a> {
        g: &'a BTreeMap<Node, BTreeSet<Node>>,
        index: BTreeMap<&'a Node, usize>,
        low: BTreeMap<&'a Node, usize>,
        stack: Vec<&'a Node>,
        on: BTreeSet<&'a Node>,
        sccs: Vec<Vec<&'a Node>>,
    }
    fn strong<'a>(s: &mut St<'a>, v: &'a Node) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                strong(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                s.sccs.push(scc);
            }
        }
    }
    let mut s = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        sccs: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            strong(&mut s, v);
        }
    }
    s.sccs
        .iter()
        .map(|scc| {
            let mut names: Vec<String> = scc.iter().map(|n| show(n)).collect();
            names.sort();
            format!("{{{}}}", names.join(", "))
        })
        .collect()
}

/// Uses that point to a top-level module not below the user's.
fn layer_errors(g: &BTreeMap<Node, BTreeSet<Node>>) -> Vec<String> {
    let mut errors = BTreeSet::new();
    for (from, to) in g {
        let Some(top) = from.first() else { continue };
        let Some(mine) = layer_of(top) else {
            errors.insert(format!(
                "src/{top}: a top-level module missing from the layer table \
                 (tests/layers.rs and docs/ARCHITECTURE.md)"
            ));
            continue;
        };
        for t in to {
            let theirs = &t[0];
            if theirs == top {
                continue;
            }
            if let Some(l) = layer_of(theirs).filter(|&l| l >= mine) {
                errors.insert(format!(
                    "{}: {top} (layer {mine}) uses {} ({theirs} is layer {l}), \
                     which is not below it",
                    show(from),
                    show(t)
                ));
            }
        }
    }
    errors.into_iter().collect()
}

fn crate_sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).expect("under src/");
            let rel = rel.to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(f).expect("read source"))
        })
        .collect()
}

#[test]
fn modules_only_use_lower_layers_and_files_form_no_circle() {
    let g = file_graph(&crate_sources());
    let mut errors = layer_errors(&g);
    for c in circles(&g) {
        errors.push(format!("files use each other in a circle: {c}"));
    }
    assert!(errors.is_empty(), "layering broken:\n{}", errors.join("\n"));
}

/// The whole crate, file by file across top-level modules, has no circle
/// (the layer rule implies it between modules; this says it for files).
#[test]
fn file_graph_of_the_crate_has_no_circle() {
    let g = file_graph(&crate_sources());
    assert!(g.len() > 50, "found only {} files in src/", g.len());
    let c = circles(&g);
    assert!(c.is_empty(), "{} circles:\n{}", c.len(), c.join("\n"));
}

fn set(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

fn node(s: &str) -> Node {
    s.split("::").map(str::to_string).collect()
}

/// The checker itself must catch what it is for.
#[test]
fn checker_sees_grouped_and_plain_paths() {
    let code = code_only(
        "use crate::{core::x, mem}; // crate::cli\nlet s = \"crate::nbd\"; \
         let r = r#\"crate::luks\"#; crate::store::y(); /* crate::engine */",
    );
    let mut got = paths_in(&code, &BTreeSet::new());
    got.sort();
    assert_eq!(
        got,
        [
            node("crate::core::x"),
            node("crate::mem"),
            node("crate::store::y")
        ]
    );
    let code = "use super::super::a::{b::{self, C}, d};";
    let got: Vec<Node> = paths_in(code, &BTreeSet::new())
        .iter()
        .map(|p| absolute(&node("x::y::z"), p))
        .collect();
    assert_eq!(got, [node("x::a::b"), node("x::a::b::C"), node("x::a::d")]);
}

/// A circle like the one at 4f3e294: files of a folder at depth two and a
/// sibling folder's `mod.rs` call each other through `super::`,
/// `crate::a::b::c` and a re-export.
#[test]
fn checker_catches_a_circle_inside_nested_folders() {
    let files = set(&[
        ("lib.rs", "pub mod cli;"),
        ("cli/mod.rs", "pub mod cryptsetup; pub mod luks; mod ui;"),
        ("cli/ui.rs", "pub struct Ui;"),
        (
            "cli/cryptsetup/mod.rs",
            "mod active; mod offline;\npub use offline::run;\npub struct Ctx;",
        ),
        (
            "cli/cryptsetup/offline.rs",
            "use super::Ctx;\nuse crate::cli::ui::Ui;\npub fn device() {}\n\
             pub fn run() { super::active::open(); crate::cli::luks::emit(); }",
        ),
        (
            "cli/cryptsetup/active.rs",
            "use super::offline::device;\npub fn open() { device() }",
        ),
        (
            "cli/luks/mod.rs",
            "pub fn emit() {}\npub fn main() { crate::cli::cryptsetup::run() }",
        ),
        (
            "cli/luks/tests.rs",
            "use crate::cli::cryptsetup::Ctx; use super::emit;",
        ),
    ]);
    let g = file_graph(&files);
    assert!(g[&node("cli::cryptsetup::active")].contains(&node("cli::cryptsetup::offline")));
    // `crate::cli::cryptsetup::run` is `offline.rs`'s, re-exported.
    assert!(g[&node("cli::luks")].contains(&node("cli::cryptsetup::offline")));
    assert!(!g.contains_key(&node("cli::luks::tests")));
    let c = circles(&g);
    assert_eq!(
        c,
        ["{cli::cryptsetup::active, cli::cryptsetup::offline, cli::luks}"]
    );

    // Helpers moved to a leaf file that imports none of its users: no circle.
    let mut fixed = files.clone();
    fixed.insert(
        "cli/cryptsetup/mod.rs".into(),
        "mod active; mod offline; mod ctx;\npub use offline::run;\npub use ctx::Ctx;".into(),
    );
    fixed.insert("cli/cryptsetup/ctx.rs".into(), "pub struct Ctx;".into());
    fixed.insert(
        "cli/cryptsetup/offline.rs".into(),
        "use super::Ctx;\npub fn device() {}\npub fn run() { crate::cli::luks::emit(); }".into(),
    );
    fixed.insert(
        "cli/cryptsetup/active.rs".into(),
        "use super::offline::device;\npub fn open() { device() }".into(),
    );
    fixed.insert(
        "cli/luks/mod.rs".into(),
        "pub fn emit() {}\npub fn main(c: crate::cli::cryptsetup::Ctx) {}".into(),
    );
    let g = file_graph(&fixed);
    assert!(g[&node("cli::cryptsetup::offline")].contains(&node("cli::cryptsetup::ctx")));
    assert_eq!(circles(&g), Vec::<String>::new());
}

/// The circle of 402eec8: a folder's `mod.rs` dispatches into its own
/// file, which calls a sibling folder's helper, whose folder calls back
/// into the first `mod.rs`. Pointing from a `mod.rs` into its own files
/// counts as a use, so this is seen; a child using its folder's items
/// is not a circle.
#[test]
fn checker_sees_a_circle_through_a_folders_own_mod_rs() {
    let files = set(&[
        ("lib.rs", "pub mod cli;"),
        ("cli/mod.rs", "pub mod cryptsetup; pub mod luks;"),
        (
            "cli/cryptsetup/mod.rs",
            "mod offline; mod ctx;\npub use ctx::Ctx;\n\
             pub fn main() { offline::add_key() }",
        ),
        ("cli/cryptsetup/ctx.rs", "pub struct Ctx;"),
        (
            "cli/cryptsetup/offline.rs",
            "use super::Ctx;\npub fn add_key() { crate::cli::luks::emit() }",
        ),
        (
            "cli/luks/mod.rs",
            "pub fn emit() {}\npub fn run() { crate::cli::cryptsetup::main() }",
        ),
    ]);
    let g = file_graph(&files);
    assert!(g[&node("cli::cryptsetup")].contains(&node("cli::cryptsetup::offline")));
    assert!(!g[&node("cli::cryptsetup::offline")].contains(&node("cli::cryptsetup")));
    assert_eq!(
        circles(&g),
        ["{cli::cryptsetup, cli::cryptsetup::offline, cli::luks}"]
    );
    // `emit` moved to a leaf both use: no circle.
    let mut fixed = files.clone();
    fixed.insert("cli/ui.rs".into(), "pub fn emit() {}".into());
    fixed.insert(
        "cli/cryptsetup/offline.rs".into(),
        "use super::Ctx;\npub fn add_key() { crate::cli::ui::emit() }".into(),
    );
    fixed.insert(
        "cli/luks/mod.rs".into(),
        "pub fn run() { crate::cli::cryptsetup::main() }".into(),
    );
    fixed.insert(
        "cli/mod.rs".into(),
        "pub mod cryptsetup; pub mod luks; pub mod ui;".into(),
    );
    assert_eq!(circles(&file_graph(&fixed)), Vec::<String>::new());
}

/// A use across top-level modules that points up is reported with the
/// file that makes it.
#[test]
fn checker_reports_a_use_that_points_up() {
    let files = set(&[
        ("core/mod.rs", "pub mod units;"),
        ("core/units.rs", "use crate::cli::ui::Ui;"),
        ("cli/mod.rs", "pub mod ui;"),
        ("cli/ui.rs", "use crate::core::units; pub struct Ui;"),
    ]);
    let g = file_graph(&files);
    let e = layer_errors(&g);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("core::units: core (layer 0) uses cli::ui"));
    assert_eq!(circles(&g).len(), 1);
}
