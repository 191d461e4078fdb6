//! What a `thin-pool` or `thin` line builds into when `udm table check`
//! did not open its devices: the line's own rules have been applied (the
//! block size, features, ids), but there is no metadata to open and no
//! pool to bind to, so the check gets this stand-in, which refuses I/O.

use std::sync::Arc;

use crate::core::device::Refusing;
use crate::targets::Target;

/// The line a stand-in was built from, for `table`.
pub struct Line {
    name: &'static str,
    params: String,
}

/// A target over a line whose devices a check did not open.
pub fn target(name: &'static str, args: &[String], len: u64) -> Arc<dyn Target> {
    let params: Vec<String> = args
        .iter()
        .map(|a| crate::core::table::escape_arg(a).into_owned())
        .collect();
    Arc::new(Refusing {
        size: len,
        why: "I/O on a thin target that a table check built without its devices",
        line: Line {
            name,
            params: params.join(" "),
        },
    })
}

impl Target for Refusing<Line> {
    fn type_name(&self) -> &'static str {
        self.line.name
    }
    fn table_params(&self, _show_keys: bool) -> String {
        self.line.params.clone()
    }
}
