//! Command-line front end (clap). One module per command.

use clap::{Parser, Subcommand};

pub mod benchmark;
pub mod luks;
pub mod serve;
pub mod table;

#[derive(Parser, Debug)]
#[command(
    name = "udm",
    version,
    about = "Userspace device-mapper: dm tables, dm-crypt and LUKS served over NBD"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve devices over NBD until SIGINT/SIGTERM.
    Serve(serve::Args),
    /// Work with dmsetup-syntax tables.
    #[command(subcommand)]
    Table(table::Cmd),
    /// Open, format and manage LUKS1/LUKS2 volumes.
    #[command(subcommand)]
    Luks(luks::Cmd),
    /// Measure cipher and KDF speed, as `cryptsetup benchmark` does.
    Benchmark(benchmark::Args),
}

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.cmd {
        Command::Serve(a) => serve::run(a),
        Command::Table(c) => table::run(c),
        Command::Luks(c) => luks::run(c),
        Command::Benchmark(a) => benchmark::run(a),
    }
}
