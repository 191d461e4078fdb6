//! Benchmark figures live in docs/ (docs/BENCHMARKS.md and the history
//! under docs/benchmarks/), where the command, the machine and the peers
//! of the same run stand beside them; a figure copied into a comment goes
//! stale the day the code or the machine changes. A comment says why, and
//! points at the doc for how much.

#[path = "common/src_tree.rs"]
mod src_tree;

use std::path::Path;

/// What a measured figure looks like in prose: a ratio against a peer or
/// against one thread, a throughput, CPU time per request.
fn figure(comment: &str) -> Option<&'static str> {
    let lower = comment.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',' || c == ';')
        .filter(|w| !w.is_empty())
        .collect();
    let number = |w: &str| {
        let w = w.trim_start_matches(['~', '≈']);
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == '–' || c == '-')
            && w.chars().next().is_some_and(|c| c.is_ascii_digit())
            && w.chars().last().is_some_and(|c| c.is_ascii_digit())
    };
    for (i, w) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or("");
        // 1.11x, 0.7–0.9x, 2×
        if let Some(n) = w.strip_suffix('x').or_else(|| w.strip_suffix('×')) {
            if number(n) && n.contains('.') {
                return Some("a ratio");
            }
            if number(n) && ["nbdkit", "nbdkit-file", "qemu-nbd", "of"].contains(&next) {
                return Some("a ratio");
            }
        }
        // 2.9 GB/s, 128 MiB/s
        if number(w) && ["gb/s", "mb/s", "gib/s", "mib/s", "kiops", "iops"].contains(&next) {
            return Some("a throughput");
        }
        for unit in ["gb/s", "mb/s", "gib/s", "mib/s"] {
            if let Some(n) = w.strip_suffix(unit) {
                if number(n) {
                    return Some("a throughput");
                }
            }
        }
    }
    if lower.contains("µs of server cpu") || lower.contains("us of server cpu") {
        return Some("CPU time per request");
    }
    None
}

/// The comment text of a Rust file's lines, with line numbers.
fn comments(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let at = l.find("//")?;
            // Not inside a string literal on the same line (rough: an
            // even number of quotes before the slashes).
            (l[..at].matches('"').count() % 2 == 0).then(|| (i + 1, l[at..].to_string()))
        })
        .collect()
}

#[test]
fn no_benchmark_figure_stands_in_a_source_comment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for dir in ["src", "benches", "fuzz"] {
        let mut files = Vec::new();
        src_tree::rust_files(&root.join(dir), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (n, c) in comments(&text) {
                if let Some(kind) = figure(&c) {
                    let rel = f.strip_prefix(root).unwrap().display().to_string();
                    bad.push(format!("{rel}:{n}: {kind}: {}", c.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "benchmark figures in source comments (move them to docs/BENCHMARKS.md and say why \
         in the comment):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_the_figures_it_is_for() {
    assert_eq!(
        figure("/// 1 MiB writes at QD16 ran at 0.94x nbdkit-file"),
        Some("a ratio")
    );
    assert_eq!(figure("//! 0.7–0.9x where one writer"), Some("a ratio"));
    assert_eq!(
        figure("//! four streams stay level (0.985×)."),
        Some("a ratio")
    );
    assert_eq!(
        figure("//! went from ~2.4 to ~2.9 GB/s"),
        Some("a throughput")
    );
    assert_eq!(figure("// caps it near 1.5GB/s"), Some("a throughput"));
    assert_eq!(
        figure("/// 7.1 µs of server CPU per request"),
        Some("CPU time per request")
    );
    assert_eq!(figure("/// one 4 KiB page, 2 % of RAM by default"), None);
    assert_eq!(figure("/// 16x16 matrix; version 2.x"), None);
}
