//! `udm veritysetup` (or udm run through a link named `veritysetup`):
//! veritysetup 2.6's command line, its output and exit codes. `format`,
//! `verify` and `dump` work on files (the hash tree and superblock are
//! veritysetup's byte for byte); `open`, `close` and `status` act on a
//! running `udm serve` through its control socket, as `udm cryptsetup`
//! does, where veritysetup would talk to the kernel's device-mapper.
//!
//! Exit codes are veritysetup's: 1 wrong parameters or a root hash that
//! does not match, 2 a tree that does not match its data, 3 out of
//! memory, 4 wrong device, 5 busy or exists.

mod active;
mod args;
mod fec;
mod files;
mod offline;
mod superblock;

use args::Args;

/// The version line: veritysetup's command line, served by udm.
pub const VERSION: &str = concat!("veritysetup 2.6.1 (udm ", env!("CARGO_PKG_VERSION"), ")");

/// A failed command: its exit code and what to print on stderr (may be
/// several lines, or none).
#[derive(Debug)]
pub(crate) struct Fail {
    pub code: i32,
    pub msg: String,
}

impl Fail {
    pub fn new(code: i32, msg: impl Into<String>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }
    pub fn usage(msg: impl Into<String>) -> Fail {
        Fail::new(1, msg)
    }
}

pub(crate) type Outcome = Result<(), Fail>;

const USAGE: &str = "\
Usage: veritysetup [-?Vv] [-?|--help] [--usage] [-V|--version]
        [--cancel-deferred] [--check-at-most-once] [--data-block-size=bytes]
        [--data-blocks=blocks] [--debug] [--deferred] [--fec-device=path]
        [--fec-offset=bytes] [--fec-roots=bytes] [--format=number]
        [-h|--hash=string] [--hash-block-size=bytes] [--hash-offset=bytes]
        [--ignore-corruption] [--ignore-zero-blocks] [--no-superblock]
        [--panic-on-corruption] [--restart-on-corruption]
        [--root-hash-file=STRING] [--root-hash-signature=STRING]
        [-s|--salt=hex string] [--use-tasklets] [--uuid=STRING]
        [-v|--verbose] [OPTION...] <action> <action-specific>";

const HELP: &str = "\
<action> is one of:
\tformat <data_device> <hash_device> - format device
\tverify <data_device> <hash_device> [<root_hash>] - verify device
\topen <data_device> <name> <hash_device> [<root_hash>] - open device as <name>
\tclose <name> - close device (remove mapping)
\tstatus <name> - show active device status
\tdump <hash_device> - show on-disk information

udm: open, close and status act on a running `udm serve` (its control
socket from --control PATH or $UDM_CONTROL); the device is its NBD export.
Root hash signatures are not checked.";

/// An action: its name, the positional arguments it takes, its usage.
struct Action {
    name: &'static str,
    min: usize,
    max: usize,
    usage: &'static str,
    run: fn(&Args) -> Outcome,
}

const ACTIONS: &[Action] = &[
    Action {
        name: "format",
        min: 2,
        max: 2,
        usage: "<data_device> <hash_device>",
        run: offline::format,
    },
    Action {
        name: "verify",
        min: 2,
        max: 3,
        usage: "<data_device> <hash_device> [<root_hash>]",
        run: offline::verify,
    },
    Action {
        name: "open",
        min: 3,
        max: 4,
        usage: "<data_device> <name> <hash_device> [<root_hash>]",
        run: active::open,
    },
    Action {
        name: "close",
        min: 1,
        max: 1,
        usage: "<name>",
        run: active::close,
    },
    Action {
        name: "status",
        min: 1,
        max: 1,
        usage: "<name>",
        run: active::status,
    },
    Action {
        name: "dump",
        min: 1,
        max: 1,
        usage: "<hash_device>",
        run: offline::dump,
    },
];

/// veritysetup's words for an exit code, after "Command failed with code".
fn code_text(code: i32) -> &'static str {
    match code {
        2 => "no permission or bad passphrase",
        3 => "out of memory",
        4 => "wrong device or file specified",
        5 => "device already exists or device is busy",
        _ => "wrong or missing parameters",
    }
}

fn usage_error(msg: &str) -> i32 {
    eprintln!("{USAGE}");
    eprintln!("{msg}");
    1
}

/// Entry point: veritysetup's argv (without the program name).
pub fn main(argv: Vec<std::ffi::OsString>) -> i32 {
    let mut a = match Args::parse(argv) {
        Ok(a) => a,
        Err(e) => return usage_error(&e),
    };
    if a.has("help") {
        println!("{VERSION}\n{USAGE}\n\n{HELP}");
        return 0;
    }
    if a.has("usage") {
        println!("{USAGE}");
        return 0;
    }
    if a.has("version") {
        println!("{VERSION}");
        return 0;
    }
    let Some(name) = a.pos.first().cloned() else {
        return usage_error("veritysetup: Argument <action> missing.");
    };
    let name = match name.as_str() {
        // The old spelling: `create <name> <data_device> ...`.
        "create" => {
            if a.pos.len() > 2 {
                a.pos.swap(1, 2);
            }
            "open"
        }
        "remove" => "close",
        n => n,
    };
    let Some(act) = ACTIONS.iter().find(|x| x.name == name) else {
        return usage_error("veritysetup: Unknown action.");
    };
    let n = a.pos.len() - 1;
    if n < act.min || n > act.max {
        return usage_error(&format!(
            "veritysetup: {}: requires {} as arguments",
            act.name, act.usage
        ));
    }
    match (act.run)(&a) {
        Ok(()) => {
            if a.has("verbose") {
                println!("Command successful.");
            }
            0
        }
        Err(f) => {
            if !f.msg.is_empty() {
                eprintln!("{}", f.msg);
            }
            if a.has("verbose") {
                println!(
                    "Command failed with code -{} ({}).",
                    f.code,
                    code_text(f.code)
                );
            }
            f.code
        }
    }
}
