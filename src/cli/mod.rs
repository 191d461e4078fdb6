//! Command-line front end (clap). One module per command.

use clap::{CommandFactory, Parser, Subcommand};

pub mod attach;
pub mod benchmark;
pub mod cryptsetup;
pub mod daemon;
pub mod demo;
pub mod devarg;
pub mod dmsetup;
pub mod dmsetup_report;
pub mod dmstats;
pub mod integritysetup;
pub mod luks;
pub mod manpages;
pub mod replay_log;
pub mod serve;
mod setup_shell;
pub mod table;
pub mod ui;
pub mod veritysetup;

#[derive(Parser, Debug)]
#[command(
    name = "udm",
    version,
    about = "Userspace device-mapper: dm tables, dm-crypt and LUKS served over NBD"
)]
struct Cli {
    /// Log format on stderr: `text` for people (coloured only when stderr
    /// is a terminal and NO_COLOR is not set) or `json`, one object per
    /// line, for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Command,
}

/// How log lines are written on stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, fields, target).
    Json,
}

/// The format chosen on the command line, read by [`init_logging`] (set
/// once, before any command runs).
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

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
    /// cryptsetup's own command line (also when udm is run through a link
    /// named `cryptsetup`): `udm cryptsetup --help` lists the actions.
    #[command(disable_help_flag = true)]
    Cryptsetup {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Replay a log-writes log onto a device, to an entry or a mark, with
    /// an optional check at every flush or FUA write.
    ReplayLog(replay_log::Args),
    /// dmsetup's verbs on a running `udm serve` (also when udm is run
    /// through a link named `dmsetup`): `udm dmsetup help` lists them.
    #[command(disable_help_flag = true)]
    Dmsetup {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Put a loop device on a device's file in the server's mapper
    /// directory and print its path (/dev/loopN).
    Attach(attach::AttachArgs),
    /// Remove the loop devices of a device (or one /dev/loopN).
    Detach(attach::DetachArgs),
    /// Write manual pages for udm and every command into DIR (udm.1,
    /// udm-serve.1, ...), or udm.1 on stdout: `udm man /usr/local/share/man/man1`.
    Man {
        /// Where to write the pages (created if missing).
        dir: Option<std::path::PathBuf>,
    },
    /// Print a shell completion script: `udm completions bash >
    /// /etc/bash_completion.d/udm`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// The command line as clap knows it, with the personalities' own usage
/// texts attached, for `man` and `completions`.
fn documented_command() -> clap::Command {
    Cli::command()
        .mut_subcommand("dmsetup", |c| c.after_long_help(dmsetup::USAGE))
        .mut_subcommand("cryptsetup", |c| {
            c.after_long_help(cryptsetup::usage_text())
        })
}

/// A program udm can stand in for: it gets the arguments after its name.
pub type Personality = fn(Vec<std::ffi::OsString>) -> i32;

/// Programs udm runs as when started through a link of that name (argv[0]
/// dispatch: `ln -s udm cryptsetup`), or as `udm NAME ARGS...`. Each takes
/// that program's own command line and exit codes.
pub const PERSONALITIES: &[(&str, Personality)] = &[
    ("cryptsetup", cryptsetup::main),
    ("dmsetup", dmsetup::main),
    ("dmstats", dmstats::main),
    ("integritysetup", integritysetup::main),
    ("veritysetup", veritysetup::main),
];

/// The personality for this invocation and its arguments, if any.
fn personality(args: &[std::ffi::OsString]) -> Option<(Personality, Vec<std::ffi::OsString>)> {
    let name_of = |s: &std::ffi::OsString| {
        std::path::Path::new(s)
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
    };
    let find = |n: &str| PERSONALITIES.iter().find(|(p, _)| *p == n).map(|(_, f)| *f);
    if let Some(f) = args.first().and_then(name_of).and_then(|n| find(&n)) {
        return Some((f, args[1..].to_vec()));
    }
    let sub = args.get(1).and_then(|s| s.to_str())?;
    find(sub).map(|f| (f, args[2..].to_vec()))
}

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    quiet_on_closed_stdout();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some((run, rest)) = personality(&args) {
        return run(rest);
    }
    let cli = Cli::parse();
    let _ = LOG_FORMAT.set(cli.log_format);
    match cli.cmd {
        Command::Demo(a) => demo::run(a),
        Command::Serve(a) => serve::run(*a),
        Command::Table(c) => table::run(c),
        Command::Luks(c) => luks::run(c),
        Command::Benchmark(a) => benchmark::run(a),
        Command::Cryptsetup { args } => cryptsetup::main(args),
        Command::ReplayLog(a) => replay_log::run(a),
        Command::Dmsetup { args } => dmsetup::main(args),
        Command::Attach(a) => attach::run_attach(a),
        Command::Detach(a) => attach::run_detach(a),
        Command::Man { dir } => manpages::man(documented_command(), dir.as_deref()),
        Command::Completions { shell } => manpages::completions(documented_command(), shell),
    }
}

/// `udm … | head` must end quietly, as `cat` does, when the reader closes
/// the pipe. Rust ignores SIGPIPE (the server relies on that: a vanished
/// client is an EPIPE, not a dead process) and `println!` then panics on
/// the failed write; turn exactly that panic into the exit status a
/// SIGPIPE death would give (128 + 13) without a message. Every other
/// panic keeps the default report.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

/// Log to stderr through tracing; `UDM_LOG` (or `RUST_LOG`) sets the
/// filter, e.g. `UDM_LOG=debug`. Default: info. The format is the one of
/// `--log-format`; text is coloured only on a terminal (a log file or a
/// pipe gets no escape codes) and never when `NO_COLOR` is set.
pub fn init_logging() {
    let filter = std::env::var("UDM_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    let _ = match log_format() {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.with_ansi(colour_on_stderr()).try_init(),
    };
}

fn log_format() -> LogFormat {
    LOG_FORMAT.get().copied().unwrap_or_default()
}

/// Colour only for a person at a terminal: stderr is a tty and `NO_COLOR`
/// is unset or empty (no-color.org).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Print the error that ends a logging command (`serve`, `demo`): a plain
/// line for people, or a JSON log line under `--log-format json`, so a
/// log collector sees every line of stderr as JSON.
pub fn report_error(command: &str, e: &str) {
    match log_format() {
        LogFormat::Json => tracing::error!(command, "{e}"),
        LogFormat::Text => eprintln!("udm {command}: {e}"),
    }
}
