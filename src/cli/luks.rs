//! `udm luks ...` verbs (filled by the LUKS work).

/// LUKS verbs.
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {}

pub fn run(c: Cmd) -> i32 {
    match c {}
}
