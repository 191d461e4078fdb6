//! Command-line front end (clap). One module per command.

use clap::{Parser, Subcommand};

pub mod benchmark;
pub mod demo;
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
    /// Serve a built-in demo stack (crypt over striped over two files) on a
    /// Unix socket and print how to reach it.
    Demo(demo::Args),
    /// Serve devices over NBD until SIGINT/SIGTERM.
    Serve(Box<serve::Args>),
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
        Command::Demo(a) => demo::run(a),
        Command::Serve(a) => serve::run(*a),
        Command::Table(c) => table::run(c),
        Command::Luks(c) => luks::run(c),
        Command::Benchmark(a) => benchmark::run(a),
    }
}

/// Log to stderr through tracing; `UDM_LOG` (or `RUST_LOG`) sets the
/// filter, e.g. `UDM_LOG=debug`. Default: info.
pub fn init_logging() {
    let filter = std::env::var("UDM_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}
