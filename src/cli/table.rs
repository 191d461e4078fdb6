//! `udm table ...` (filled by the core work).

/// Table commands.
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {}

pub fn run(c: Cmd) -> i32 {
    match c {}
}
