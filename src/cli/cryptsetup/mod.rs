//! `udm cryptsetup ...`, or udm run through a link named `cryptsetup`:
//! cryptsetup 2.6's own command line (actions, option names and forms,
//! which option goes with which action, exit codes), so scripts written
//! for cryptsetup run unchanged. The LUKS work is done by `luks::ops`, the
//! same functions as `udm luks`; this module maps argv to them. The
//! argument parser stays hand-written (`args.rs`), not a parser crate's:
//! cryptsetup's exact forms, option-to-action rules and exit codes are the
//! contract, and no general parser reproduces them.
//!
//! Exit codes are cryptsetup's: 0 success, 1 wrong or missing parameters
//! (and invalid headers), 2 no permission or bad passphrase, 3 out of
//! memory, 4 wrong device or file, 5 device busy or already exists.

mod active;
mod args;
mod bitlk;
mod ctx;
mod foreign;
mod fvault2;
mod offline;
mod progress;
mod reencrypt;
mod status;
mod verify;

use std::ffi::OsString;

use crate::luks::error::LuksError;

pub use args::{parse, parse_size, Args};
pub(crate) use ctx::{Ctx, Outcome};

/// One cryptsetup action: name, positional arguments it needs (after the
/// action), their description, and the handler.
struct Action {
    name: &'static str,
    min_args: usize,
    usage: &'static str,
    run: fn(&Ctx) -> Outcome,
}

/// `open`: the offline checks (and `--test-passphrase`), then the mapping.
fn open(c: &Ctx) -> Outcome {
    if c.a.has("allow-partial-bitlk") && c.device_type.as_deref() != Some("bitlk") {
        return Err(LuksError::Usage(
            "Option --allow-partial-bitlk is allowed only with --type bitlk.".into(),
        ));
    }
    if c.a.has("allow-tcrypt-legacy") && !foreign::handles_open(c) {
        return Err(LuksError::Usage(
            "Option --allow-tcrypt-legacy is allowed only with --type tcrypt.".into(),
        ));
    }
    if foreign::handles_open(c) {
        return foreign::open(c);
    }
    match c.device_type.as_deref() {
        Some("bitlk") => return bitlk::open(c),
        Some("fvault2") => return fvault2::open(c),
        _ => {}
    }
    if offline::open_checks(c)? {
        return Ok(());
    }
    active::open(c)
}

/// Actions whose first argument is an active device.
const ACTIVE_NAME: &[&str] = &["close", "resize", "luksSuspend", "luksResume"];

const ACTIONS: &[Action] = &[
    Action {
        name: "open",
        min_args: 1,
        usage: "<device> [--type <type>] [<name>]",
        run: open,
    },
    Action {
        name: "close",
        min_args: 1,
        usage: "<name>",
        run: foreign::close,
    },
    Action {
        name: "resize",
        min_args: 1,
        usage: "<name>",
        run: active::resize,
    },
    Action {
        name: "status",
        min_args: 1,
        usage: "<name>",
        run: active::status,
    },
    Action {
        name: "benchmark",
        min_args: 0,
        usage: "[--cipher <cipher>]",
        run: offline::benchmark,
    },
    Action {
        name: "repair",
        min_args: 1,
        usage: "<device>",
        run: offline::repair,
    },
    Action {
        name: "reencrypt",
        min_args: 0,
        usage: "<device>",
        run: reencrypt::run,
    },
    Action {
        name: "erase",
        min_args: 1,
        usage: "<device>",
        run: offline::erase,
    },
    Action {
        name: "convert",
        min_args: 1,
        usage: "<device>",
        run: offline::convert,
    },
    Action {
        name: "config",
        min_args: 1,
        usage: "<device>",
        run: offline::config,
    },
    Action {
        name: "luksFormat",
        min_args: 1,
        usage: "<device> [<new key file>]",
        run: offline::format,
    },
    Action {
        name: "luksAddKey",
        min_args: 1,
        usage: "<device> [<new key file>]",
        run: offline::add_key,
    },
    Action {
        name: "luksRemoveKey",
        min_args: 1,
        usage: "<device> [<key file>]",
        run: offline::remove_key,
    },
    Action {
        name: "luksChangeKey",
        min_args: 1,
        usage: "<device> [<key file>]",
        run: offline::change_key,
    },
    Action {
        name: "luksConvertKey",
        min_args: 1,
        usage: "<device> [<key file>]",
        run: offline::convert_key,
    },
    Action {
        name: "luksKillSlot",
        min_args: 2,
        usage: "<device> <key slot>",
        run: offline::kill_slot,
    },
    Action {
        name: "luksUUID",
        min_args: 1,
        usage: "<device>",
        run: offline::uuid,
    },
    Action {
        name: "isLuks",
        min_args: 1,
        usage: "<device>",
        run: offline::is_luks,
    },
    Action {
        name: "luksDump",
        min_args: 1,
        usage: "<device>",
        run: offline::dump,
    },
    Action {
        name: "luksSuspend",
        min_args: 1,
        usage: "<device>",
        run: active::luks_suspend,
    },
    Action {
        name: "luksResume",
        min_args: 1,
        usage: "<device>",
        run: active::luks_resume,
    },
    Action {
        name: "luksHeaderBackup",
        min_args: 1,
        usage: "<device>",
        run: offline::header_backup,
    },
    Action {
        name: "luksHeaderRestore",
        min_args: 1,
        usage: "<device>",
        run: offline::header_restore,
    },
    Action {
        name: "bitlkDump",
        min_args: 1,
        usage: "<device>",
        run: bitlk::dump,
    },
    Action {
        name: "fvault2Dump",
        min_args: 1,
        usage: "<device>",
        run: fvault2::dump,
    },
    Action {
        name: "tcryptDump",
        min_args: 1,
        usage: "<device>",
        run: foreign::tcrypt_dump,
    },
    Action {
        name: "token",
        min_args: 2,
        usage: "<add|remove|import|export> <device>",
        run: offline::token,
    },
];

/// The version line: cryptsetup's command line, served by udm.
pub const VERSION: &str = concat!("cryptsetup 2.6.1 (udm ", env!("CARGO_PKG_VERSION"), ")");

fn usage_error(msg: &str) -> i32 {
    eprintln!("Usage: cryptsetup [OPTION...] <action> <action-specific>");
    eprintln!("cryptsetup: {msg}");
    1
}

fn help() {
    println!("{VERSION}");
    print!("{}", usage_text());
}

/// The usage and actions `--help` prints (also the `udm-cryptsetup`
/// manual page's).
pub fn usage_text() -> String {
    let mut s = String::from("Usage: cryptsetup [OPTION...] <action> <action-specific>\n\n");
    s.push_str("<action> is one of:\n");
    for a in ACTIONS {
        s.push_str(&format!("\t{} {}\n", a.name, a.usage));
    }
    s.push_str(
        "\nOptions are those of cryptsetup 2.6 (see cryptsetup(8)); README.md lists which\n\
         udm implements. --no-kdf-limit lets udm try passphrases on keyslots whose KDF\n\
         cost is above its limit; --allow-weak-cipher lets it open a header whose data\n\
         or keyslot cipher is cipher_null or ECB; --allow-partial-bitlk maps a BitLocker\n\
         volume cryptsetup refuses (partly encrypted) read-only from its metadata;\n\
         --allow-tcrypt-legacy maps a TrueCrypt legacy CBC volume cryptsetup refuses\n\
         (blowfish, CBC cascades) with udm's own crypt line.\n",
    );
    s
}

/// Old action names and what they mean: (alias, action, implied type).
const ALIASES: &[(&str, &str, Option<&str>)] = &[
    ("create", "open", Some("plain")),
    ("plainOpen", "open", Some("plain")),
    ("luksOpen", "open", Some("luks")),
    ("loopaesOpen", "open", Some("loopaes")),
    ("tcryptOpen", "open", Some("tcrypt")),
    ("tcryptDump", "tcryptDump", Some("tcrypt")),
    ("bitlkDump", "bitlkDump", Some("bitlk")),
    ("bitlkOpen", "open", Some("bitlk")),
    ("fvault2Open", "open", Some("fvault2")),
    ("fvault2Dump", "fvault2Dump", Some("fvault2")),
    ("remove", "close", None),
    ("plainClose", "close", None),
    ("luksClose", "close", None),
    ("loopaesClose", "close", None),
    ("tcryptClose", "close", None),
    ("bitlkClose", "close", None),
    ("fvault2Close", "close", None),
    ("luksErase", "erase", Some("luks")),
    ("luksConfig", "config", Some("luks2")),
    ("refresh", "open", None),
];

/// Entry point: `argv` without the program name. Returns the exit code.
pub fn main(argv: Vec<OsString>) -> i32 {
    crate::mem::secret::forbid_core_dumps_or_warn();
    let a = match args::parse(&argv) {
        Ok(a) => a,
        Err(e) => return usage_error(&e),
    };
    if a.has("help") {
        help();
        return 0;
    }
    if a.has("version") {
        println!("{VERSION}");
        return 0;
    }
    if a.has("usage") {
        println!("Usage: cryptsetup [OPTION...] <action> <action-specific>");
        return 0;
    }
    let Some(first) = a.pos.first().cloned() else {
        return usage_error("Argument <action> missing.");
    };
    let mut argv: Vec<String> = a.pos[1..].to_vec();
    // cryptsetup's default device type is LUKS (any version).
    let mut device_type = Some(a.str("type").unwrap_or("luks").to_string());
    let mut a = a;
    let name = match ALIASES.iter().find(|(n, _, _)| *n == first) {
        Some((alias, action, ty)) => {
            if *alias == "create" && argv.len() >= 2 {
                argv.swap(0, 1);
            }
            if *alias == "refresh" {
                a.opts.insert("refresh", args::Val::Flag);
            }
            if let Some(t) = ty {
                device_type = Some(t.to_string());
            }
            *action
        }
        None => first.as_str(),
    };
    let Some(action) = ACTIONS.iter().find(|x| x.name == name) else {
        return usage_error("Unknown action.");
    };
    if argv.len() < action.min_args {
        let what = action
            .usage
            .split_whitespace()
            .nth(argv.len())
            .unwrap_or("<device>");
        return usage_error(&format!("Argument {what} missing."));
    }
    if let Err(e) = args::check_allowed(&a, action.name) {
        return usage_error(&e);
    }
    if let Err(e) = verify::verify(&a, action.name, &argv, device_type.as_deref()) {
        return usage_error(&e);
    }
    if a.has("test-args") {
        println!("No action taken. Invoked with --test-args option.");
        return 0;
    }
    // The verbs over an active device take it as cryptsetup does: its
    // name, /dev/mapper/NAME, or its node (`status` reads the argument
    // itself: it prints it as given).
    if ACTIVE_NAME.contains(&action.name) {
        let control = || {
            a.str("control")
                .map(std::path::PathBuf::from)
                .or_else(crate::control::default_path)
                .ok_or_else(|| {
                    "no udm control socket: give --control PATH or set $UDM_CONTROL".into()
                })
        };
        match crate::cli::devarg::device_name(&argv[0], control) {
            Ok(n) => argv[0] = n,
            Err(e) => {
                eprintln!("{e}");
                return 4;
            }
        }
    }
    let ctx = Ctx {
        a,
        argv,
        device_type,
    };
    for (o, why) in verify::ALWAYS_SO.iter().filter(|(o, _)| ctx.a.has(o)) {
        ctx.verbose_msg(&format!("Option --{o} holds: {why}."));
    }
    match (action.run)(&ctx) {
        Ok(()) => {
            ctx.verbose_msg("Command successful.");
            0
        }
        Err(e) => {
            // cryptsetup reports a token that failed in verbose mode only,
            // on stdout as its other verbose lines.
            let msg = match &e {
                LuksError::Token { msg, .. } => {
                    if ctx.verbose() && !msg.is_empty() {
                        println!("{msg}");
                    }
                    String::new()
                }
                _ => e.to_string(),
            };
            if !msg.is_empty() {
                eprintln!("{msg}");
            }
            let code = e.exit_code();
            if ctx.verbose() {
                let what = match code {
                    1 => "wrong or missing parameters",
                    2 => "no permission or bad passphrase",
                    3 => "out of memory",
                    4 => "wrong device or file specified",
                    5 => "device already exists or device is busy",
                    _ => "unknown error",
                };
                println!("Command failed with code -{code} ({what}).");
            }
            code
        }
    }
}
