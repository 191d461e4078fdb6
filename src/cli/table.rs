//! `udm table check FILE`: validate a table before serving it — every line
//! through its target's constructor over placeholder devices (`--open`:
//! over the real devices, opened read-only) — and print its segments, or
//! only the error with its line and field.

use std::path::PathBuf;

use crate::core::table;
use crate::mapper::{self, CheckDevices};
use crate::targets::crypt;

/// Table commands.
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Validate a table file and print its segments (start, length,
    /// target, arguments), or only the error naming the line and field
    /// (exit code 1). Every line is checked by its target's own rules (key
    /// length against the cipher, stripe count against the devices, chunk
    /// size, sector_size, iv_offset, feature arguments) without opening
    /// any device. Keys of crypt lines are masked.
    Check {
        /// Table file in dmsetup syntax (`-` for stdin).
        file: PathBuf,
        /// Also open the devices (read-only) and check that every area
        /// fits in its device and matches its block size.
        #[arg(long)]
        open: bool,
    },
    /// Build the device of a table (opening its devices read-only) and
    /// print its table as `dmsetup table` does. Crypt keys are shown as
    /// zeros unless --showkeys.
    Show {
        /// Table file in dmsetup syntax.
        file: PathBuf,
        /// Print crypt keys instead of zeros.
        #[arg(long)]
        showkeys: bool,
    },
}

pub fn run(c: Cmd) -> i32 {
    match c {
        Cmd::Check { file, open } => check(&file, open),
        Cmd::Show { file, showkeys } => show(&file, showkeys),
    }
}

fn show(file: &std::path::Path, showkeys: bool) -> i32 {
    use crate::mapper::compile::{compile, Files, Lookup};
    /// `table show` builds one table alone: no other device exists.
    struct Alone;
    impl Lookup for Alone {
        fn routes_of(&mut self, name: &str) -> Result<std::sync::Arc<crate::dm::Routes>, String> {
            Err(format!(
                "the table names device '{name}', which only exists on a running server: \
                 use 'udm dmsetup table' there, or 'udm table check' here"
            ))
        }
    }
    let text = match std::fs::read_to_string(file) {
        Ok(s) => zeroize::Zeroizing::new(s),
        Err(e) => {
            eprintln!("udm table show: cannot read {}: {e}", file.display());
            return 1;
        }
    };
    let flags = crate::store::OpenFlags {
        read_only: true,
        direct: false,
        no_map: true,
    };
    let opts = crate::targets::TargetOptions::default();
    match compile(&text, &mut Alone, &mut Files::default(), flags, &opts, true) {
        Ok(c) => {
            let shown = zeroize::Zeroizing::new(c.mapped.table_text(showkeys));
            print!("{}", shown.as_str());
            0
        }
        Err(e) => {
            eprintln!("udm table show: table {}: {e}", file.display());
            1
        }
    }
}

fn check(file: &std::path::Path, open: bool) -> i32 {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
            eprintln!("udm table check: cannot read stdin: {e}");
            return 1;
        }
        s
    } else {
        match std::fs::read_to_string(file) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("udm table check: cannot read {}: {e}", file.display());
                return 1;
            }
        }
    };
    let text = zeroize::Zeroizing::new(text);
    let devices = if open {
        CheckDevices::OpenReadOnly
    } else {
        CheckDevices::Placeholders
    };
    // Everything is checked before anything is printed: on error the
    // error is the only output.
    let lines = match table::parse(&text).and_then(|l| mapper::check(&l, devices).map(|()| l)) {
        Ok(lines) => lines,
        Err(e) => {
            eprintln!("udm table check: {}: {e}", file.display());
            return 1;
        }
    };
    println!(
        "{:>12} {:>12}  {:<8} arguments",
        "start", "length", "target"
    );
    for l in &lines {
        let mut args = zeroize::Zeroizing::new(l.args.clone());
        if l.target == crypt::TYPE.name && args.len() > 1 {
            args[1] = crypt::mask_key(&args[1]);
        }
        println!(
            "{:>12} {:>12}  {:<8} {}",
            l.start,
            l.len,
            l.target,
            args.join(" ")
        );
    }
    let total: u64 = lines.iter().map(|l| l.len).sum();
    println!(
        "{} segment(s), {} sectors ({} bytes)",
        lines.len(),
        total,
        total * 512
    );
    0
}
