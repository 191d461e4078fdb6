//! Every environment variable udm reads stands in one table
//! (`core::knobs::KNOBS`) and on one page (docs/KNOBS.md): a variable
//! added in a module and forgotten there fails here.

#[path = "common/src_tree.rs"]
mod src_tree;

use std::collections::BTreeSet;
use std::path::Path;

use udm::core::knobs::{Kind, KNOBS};

/// The `"UDM_…"` string literals of a text (a literal ending in `_` is a
/// prefix a module matches on, not a variable).
fn literals(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("\"UDM_") {
        let tail = &rest[at + 1..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if tail[end..].starts_with('"') && !name.ends_with('_') {
            out.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_variable_read_in_src_is_in_the_table_and_on_the_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    src_tree::rust_files(&root.join("src"), &mut files);
    let mut read = BTreeSet::new();
    for f in files {
        if f.ends_with("core/knobs.rs") {
            continue;
        }
        read.extend(literals(&std::fs::read_to_string(&f).unwrap()));
    }
    let table: BTreeSet<String> = KNOBS.iter().map(|k| k.name.to_string()).collect();
    assert_eq!(table.len(), KNOBS.len(), "a name twice in KNOBS");
    let missing: Vec<_> = read.difference(&table).collect();
    assert!(
        missing.is_empty(),
        "read in src/ but not in core::knobs::KNOBS: {missing:?}"
    );
    let stale: Vec<_> = table.difference(&read).collect();
    assert!(
        stale.is_empty(),
        "in core::knobs::KNOBS but read nowhere: {stale:?}"
    );

    let page = std::fs::read_to_string(root.join("docs/KNOBS.md")).unwrap();
    for k in KNOBS {
        let kind = match k.kind {
            Kind::Setting => "setting",
            Kind::Measure => "measure",
            Kind::Test => "test",
        };
        let row = format!("| `{}` | {kind} | {} | {} |", k.name, k.default, k.what);
        assert!(
            page.contains(&row),
            "docs/KNOBS.md lacks (or words otherwise) the row:\n{row}"
        );
    }
    let rows = page.lines().filter(|l| l.starts_with("| `UDM_")).count();
    assert_eq!(
        rows,
        KNOBS.len(),
        "docs/KNOBS.md has rows the table has not"
    );
}

#[test]
fn literals_are_found_and_prefixes_are_not() {
    let t = r#"const A: &str = "UDM_FILE_IO"; x.starts_with("UDM_TEST_"); "UDM_X" "#;
    let got: Vec<_> = literals(t).into_iter().collect();
    assert_eq!(got, ["UDM_FILE_IO", "UDM_X"]);
}
