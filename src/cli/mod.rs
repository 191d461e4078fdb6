//! Command-line front end (clap). One module per command.

use clap::{Parser, Subcommand};

pub mod benchmark;
pub mod demo;
pub mod dmsetup;
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
    Serve(serve::Args),
    /// Work with dmsetup-syntax tables.
    #[command(subcommand)]
    Table(table::Cmd),
    /// Open, format and manage LUKS1/LUKS2 volumes.
    #[command(subcommand)]
    Luks(luks::Cmd),
    /// Measure cipher and KDF speed, as `cryptsetup benchmark` does.
    Benchmark(benchmark::Args),
    /// dmsetup's verbs on a running `udm serve` (see `udm dmsetup help`);
    /// also what udm does when run through a symlink named `dmsetup`.
    Dmsetup {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Tools udm also is: run as `udm NAME ARGS...`, or through a symlink
/// called NAME (argv[0] dispatch, so existing scripts run unchanged).
/// Each entry gets the whole argv, argv[0] being its own name.
pub static TOOLS: &[(&str, ToolMain)] = &[("dmsetup", dmsetup::main)];

/// A tool's entry point: the whole argv in, the exit code out.
pub type ToolMain = fn(Vec<String>) -> i32;

/// The tool `argv` asks for, by program name or first argument, and the
/// argv to give it.
fn tool_of(argv: &[String]) -> Option<(ToolMain, Vec<String>)> {
    let prog = std::path::Path::new(argv.first()?)
        .file_name()?
        .to_string_lossy()
        .into_owned();
    if let Some((_, f)) = TOOLS.iter().find(|(n, _)| *n == prog) {
        return Some((*f, argv.to_vec()));
    }
    let first = argv.get(1)?;
    TOOLS
        .iter()
        .find(|(n, _)| n == first)
        .map(|(_, f)| (*f, argv[1..].to_vec()))
}

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some((tool, args)) = tool_of(&argv) {
        return tool(args);
    }
    let cli = Cli::parse();
    match cli.cmd {
        Command::Demo(a) => demo::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Table(c) => table::run(c),
        Command::Luks(c) => luks::run(c),
        Command::Benchmark(a) => benchmark::run(a),
        Command::Dmsetup { mut args } => {
            args.insert(0, "dmsetup".into());
            dmsetup::main(args)
        }
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
