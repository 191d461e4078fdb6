//! `udm integritysetup` (or udm run through a link named
//! `integritysetup`): integritysetup 2.6's command line, output and exit
//! codes. `format` and `dump` work on the device itself (the superblock
//! and journal are the kernel's byte for byte, so the real
//! `integritysetup dump` reads udm's format); `open`, `close` and
//! `status` act on a running `udm serve` through its control socket, as
//! `udm cryptsetup` does, where integritysetup would talk to the kernel.
//!
//! Exit codes are integritysetup's: 1 wrong parameters, 2 no permission,
//! 3 out of memory, 4 wrong device, 5 busy or exists.
//!
//! The words are integritysetup 2.6.1's, the version installed beside
//! udm, whose `dump` output udm's must equal. Scripts written against
//! integritysetup 2.8 (cryptsetup's own tests among them) read `dump` and
//! `status` lines that name their units; `UDM_INTEGRITYSETUP_OUTPUT=2.8`
//! prints those. `resize` (2.7's) is there either way.

mod active;
mod args;
mod offline;

/// The version line: integritysetup's command line, served by udm.
pub const VERSION: &str = concat!("integritysetup 2.6.1 (udm ", env!("CARGO_PKG_VERSION"), ")");

use super::setup_shell::{Action, Tool};
pub(crate) use super::setup_shell::{Fail, Outcome};

/// Whose words `dump` and `status` print (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wording {
    V2_6,
    V2_8,
}

const WORDING_VAR: &str = "UDM_INTEGRITYSETUP_OUTPUT";

/// `UDM_INTEGRITYSETUP_OUTPUT` read: unset or `2.6`, or `2.8`; anything
/// else is an error naming the variable.
fn wording_from_env() -> Result<Wording, String> {
    match std::env::var(WORDING_VAR).ok().as_deref() {
        None | Some("" | "2.6" | "2.6.1") => Ok(Wording::V2_6),
        Some("2.8") => Ok(Wording::V2_8),
        Some(v) => Err(format!(
            "{WORDING_VAR}={v}: udm prints integritysetup 2.6 (unset, or 2.6) or 2.8 output."
        )),
    }
}

/// The wording in force; [`main`] has refused a bad value already.
pub(crate) fn wording() -> Wording {
    wording_from_env().unwrap_or(Wording::V2_6)
}

const USAGE: &str = "\
Usage: integritysetup [-?VqDBRv] [-?|--help] [--usage] [-V|--version]
        [--allow-discards] [-q|--batch-mode] [--buffer-sectors=SECTORS]
        [--bitmap-flush-time=ms] [--bitmap-sectors-per-bit=INT]
        [-I|--integrity=STRING] [--integrity-key-file=STRING]
        [--integrity-key-size=BITS] [-D|--integrity-no-journal]
        [--interleave-sectors=SECTORS] [--journal-commit-time=ms]
        [--journal-crypt=STRING] [--journal-crypt-key-file=STRING]
        [--journal-crypt-key-size=BITS] [--journal-integrity=STRING]
        [--journal-integrity-key-file=STRING]
        [--journal-integrity-key-size=BITS]
        [-j|--journal-size=bytes] [--journal-watermark=percent] [--no-wipe]
        [-B|--integrity-bitmap-mode] [-R|--integrity-recovery-mode]
        [-s|--sector-size=bytes] [-t|--tag-size=bytes] [-v|--verbose]
        [--device-size=bytes] [--wipe] [--deferred] [--cancel-deferred]
        [OPTION...] <action> <action-specific>";

const HELP: &str = "\
<action> is one of:
\tformat <integrity_device> - format device
\topen <integrity_device> <name> - open device as <name>
\tclose <name> - close device (remove mapping)
\tstatus <name> - show active device status
\tdump <integrity_device> - show on-disk information

udm: open, close and status act on a running `udm serve` (its control
socket from --control PATH or $UDM_CONTROL); the device is its NBD export.";

const ACTIONS: &[Action] = &[
    Action {
        name: "format",
        min: 1,
        max: usize::MAX,
        usage: "<integrity_device>",
        run: offline::format,
    },
    Action {
        name: "open",
        min: 2,
        max: usize::MAX,
        usage: "<integrity_device> <name>",
        run: active::open,
    },
    Action {
        name: "close",
        min: 1,
        max: usize::MAX,
        usage: "<name>",
        run: super::setup_shell::close,
    },
    Action {
        name: "status",
        min: 1,
        max: usize::MAX,
        usage: "<name>",
        run: active::status,
    },
    Action {
        name: "dump",
        min: 1,
        max: usize::MAX,
        usage: "<integrity_device>",
        run: offline::dump,
    },
    Action {
        name: "resize",
        min: 1,
        max: usize::MAX,
        usage: "<name>",
        run: active::resize,
    },
];

/// integritysetup for the shell; arguments past an action's own are
/// ignored, as integritysetup ignores them.
const TOOL: Tool = Tool {
    name: "integritysetup",
    version: VERSION,
    usage: USAGE,
    help: HELP,
    valued: args::VALUED,
    flags: args::FLAGS,
    actions: ACTIONS,
};

/// Entry point: integritysetup's argv (without the program name).
pub fn main(argv: Vec<std::ffi::OsString>) -> i32 {
    if let Err(e) = wording_from_env() {
        eprintln!("{USAGE}");
        eprintln!("{e}");
        return 1;
    }
    super::setup_shell::main(&TOOL, argv)
}
