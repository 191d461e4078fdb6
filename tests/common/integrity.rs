//! The `udm integritysetup` helpers the integrity tests share: the
//! command, a run that must succeed, a dump field, and a libnbd client.

use std::path::Path;
use std::process::{Command, Output};

use super::{need_python_module, show, udm, PYTHON};

/// `udm integritysetup`.
pub fn uis() -> Command {
    let mut c = udm();
    c.arg("integritysetup");
    c
}

/// Run `c`, which must succeed; its stdout.
pub fn ok(c: &mut Command) -> String {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?} failed:\n{}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Field `name` of an `integritysetup dump` (empty for a bare flag).
pub fn field<'a>(dump: &'a str, name: &str) -> &'a str {
    dump.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map(str::trim)
        .or_else(|| dump.lines().any(|l| l.trim() == name).then_some(""))
        .unwrap_or_else(|| panic!("no '{name}' in:\n{dump}"))
}

/// Run Python `code` with `h`, a libnbd handle connected to `export` on
/// `sock`.
pub fn nbd_py(sock: &Path, export: &str, code: &str) -> Output {
    need_python_module("nbd", "python3-libnbd");
    let prog = format!(
        "import nbd, sys\nh = nbd.NBD()\nh.set_export_name({export:?})\n\
         h.connect_unix({:?})\n{code}\n",
        sock.to_str().unwrap()
    );
    Command::new(PYTHON).arg("-c").arg(prog).output().unwrap()
}
