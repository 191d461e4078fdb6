//! The Rust files under a folder, for the tests that read `src/` as text
//! (`layers.rs`, `fn_length.rs`). Included by `#[path]` rather than through
//! `mod common`, so those tests do not build the peer helpers they never use.

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, at any depth.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src/") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
