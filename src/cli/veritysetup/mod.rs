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
pub(crate) mod superblock;

/// The version line: veritysetup's command line, served by udm.
pub const VERSION: &str = concat!("veritysetup 2.6.1 (udm ", env!("CARGO_PKG_VERSION"), ")");

use super::setup_shell::{Action, Tool};
pub(crate) use super::setup_shell::{Fail, Outcome};

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
        run: super::setup_shell::close,
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

const TOOL: Tool = Tool {
    name: "veritysetup",
    version: VERSION,
    usage: USAGE,
    help: HELP,
    valued: args::VALUED,
    flags: args::FLAGS,
    actions: ACTIONS,
};

/// Entry point: veritysetup's argv (without the program name).
pub fn main(argv: Vec<std::ffi::OsString>) -> i32 {
    super::setup_shell::main(&TOOL, argv)
}
