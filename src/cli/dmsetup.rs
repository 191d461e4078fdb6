//! `udm dmsetup VERB ...`: dmsetup's command line and output, talking to a
//! running `udm serve` over its control socket. Run as `dmsetup` (a
//! symlink to udm, or `alias dmsetup='udm dmsetup'`) it takes the same
//! arguments, prints the same lines and exits with the same codes (0 on
//! success, 1 on failure, after "Command failed." on stderr), so scripts
//! written for dmsetup run unchanged. udm-only additions: `--control
//! PATH`, `--json` on the reading verbs, `status --stats`. Its argv parser
//! stays hand-written: dmsetup's exact option forms and exit codes are the
//! contract, which a general parser crate would change.
//!
//! Differences from the kernel's dmsetup, all because udm devices are NBD
//! exports, not block devices: the major number is 0, device arguments of
//! tables print as they were given (a path, `@NAME`, `/dev/mapper/NAME`),
//! and `deps`/`ls --tree` show files by path.

use std::io::Read;
use std::path::PathBuf;

use serde_json::Value;
use zeroize::Zeroizing;

use crate::control::model::{DeviceInfo, DeviceStatus, TableDevice, TargetVersion, MAJOR};
use crate::control::proto::{Code, Request};
use crate::control::{default_path, Client, ClientError};
use crate::core::table::TableLine;

use super::dmsetup_report as report;

/// The parsed command line.
#[derive(Default, Debug)]
struct Opts {
    control: Option<PathBuf>,
    /// `create --allow LIST`: narrows who may use the device over NBD.
    allow: Option<String>,
    columns: bool,
    options: Option<String>,
    noheadings: bool,
    separator: Option<String>,
    nameprefixes: bool,
    notable: bool,
    table: Option<String>,
    readonly: bool,
    uuid: Option<String>,
    force: bool,
    deferred: bool,
    noflush: bool,
    showkeys: bool,
    target: Option<String>,
    tree: bool,
    inactive: bool,
    verbose: u32,
    json: bool,
    stats: bool,
    help: bool,
    version: bool,
    concise: bool,
    setuuid: bool,
    /// `ls --exec CMD`.
    exec: Option<String>,
    /// `--count N` / `--interval SECS`: repeated reports.
    count: Option<u64>,
    interval: Option<u64>,
    /// `--unquoted` (with `--nameprefixes`).
    unquoted: bool,
    /// `remove --retry`: try again while the device is busy.
    retry: bool,
    args: Vec<String>,
}

/// dmsetup's usage text (also the `udm-dmsetup` manual page's).
pub const USAGE: &str = "Usage:

dmsetup
        [--version] [-h|--help [-c|-C|--columns]]
        [-v|--verbose [-v|--verbose ...]] [-f|--force]
        [-r|--readonly] [--noflush] [--showkeys] [--target <target_type>]
        [--control <socket>] [--json] [--count <count>] [--interval <seconds>]

        create <dev_name> [-u|uuid <uuid>] [--allow <list>] [-n|--notable|--table {<table>|<table_file>}]
        create --concise [<concise_device_spec_list>]
        load|reload <dev_name> [--table {<table>|<table_file>}]
        suspend [--noflush] <dev_name>...
        resume [--force] <dev_name>...
        remove [-f|--force] [--deferred] <dev_name>...
        remove_all [-f|--force] [--deferred]
        rename <dev_name> <new_name>
        clear <dev_name>
        wipe_table <dev_name>...
        ls [--target <target_type>] [--exec <command>] [-o devno|devname|blkdevname] [--tree]
        info [<dev_name>...]
        info -c|-C|--columns [--noheadings] [--separator <separator>]
             [-o <fields>|help] [--nameprefixes [--unquoted]] [<dev_name>...]
        deps [-o devno|devname|blkdevname] [<dev_name>...]
        table [--target <target_type>] [--inactive] [--showkeys] [--concise] [<dev_name>...]
        status [--target <target_type>] [--stats] [<dev_name>...]
        message <dev_name> <sector> <message>
        wait <dev_name> [<event_nr>]
        stats clear|print [<dev_name>...]
        stats create|delete|list|report ... (dmstats's options: dmstats --help)
        splitname <dev_name> [<subsystem>]
        udevcreatecookie
        targets
        version
        help

<dev_name> is a udm device (an NBD export of `udm serve`); tables may name
other udm devices as /dev/mapper/NAME or @NAME. The server is found at
--control PATH, else $UDM_CONTROL, else /run/udm/control (root) or
$XDG_RUNTIME_DIR/udm/control.
";

/// Options taking a value, long and short forms.
const WITH_VALUE: &[&str] = &[
    "--control",
    "--allow",
    "--options",
    "-o",
    "--separator",
    "--table",
    "--uuid",
    "-u",
    "--target",
    "--udevcookie",
    "--readahead",
    "--manglename",
    "--count",
    "--interval",
    "--sort",
    "-O",
    "--select",
    "-S",
    "--major",
    "-j",
    "--minor",
    "-m",
    "--exec",
];

fn parse(argv: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut i = 0;
    let mut only_args = false;
    while i < argv.len() {
        let a = &argv[i];
        i += 1;
        if only_args || !a.starts_with('-') || a == "-" {
            o.args.push(a.clone());
            continue;
        }
        if a == "--" {
            only_args = true;
            continue;
        }
        // --opt=value, -oVALUE
        let (name, mut value) = match a.split_once('=') {
            Some((n, v)) if a.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        if !name.starts_with("--") && !name.is_char_boundary(2.min(name.len())) {
            return Err(format!("unrecognized option '{name}'"));
        }
        let (name, short_value) = if !name.starts_with("--") && name.len() > 2 {
            // Bundled short options: -cv, or -oname.
            let first = &name[..2];
            if WITH_VALUE.contains(&first) {
                (first.to_string(), Some(name[2..].to_string()))
            } else {
                for c in name[2..].chars() {
                    // (each bundled flag is one ASCII letter, or refused)
                    apply_flag(&mut o, &format!("-{c}"))?;
                }
                (first.to_string(), None)
            }
        } else {
            (name, None)
        };
        if value.is_none() {
            value = short_value;
        }
        if WITH_VALUE.contains(&name.as_str()) {
            let v = match value {
                Some(v) => v,
                None => {
                    let v = argv
                        .get(i)
                        .ok_or_else(|| format!("option {name} needs a value"))?
                        .clone();
                    i += 1;
                    v
                }
            };
            match name.as_str() {
                "--control" => o.control = Some(PathBuf::from(v)),
                "--allow" => o.allow = Some(v),
                "--options" | "-o" => o.options = Some(v),
                "--separator" => o.separator = Some(v),
                "--table" => o.table = Some(v),
                "--uuid" | "-u" => o.uuid = Some(v),
                "--target" => o.target = Some(v),
                "--exec" => o.exec = Some(v),
                "--count" => o.count = Some(number(&name, &v)?),
                "--interval" => o.interval = Some(number(&name, &v)?),
                "--readahead" => {
                    return Err(
                        "--readahead is not supported: a udm device is an NBD export, \
                                and read-ahead belongs to the client's block device (set it \
                                there with blockdev --setra)"
                            .into(),
                    )
                }
                "--manglename" if v != "none" && v != "auto" => {
                    return Err(format!(
                        "--manglename {v}: udm takes device names as they are (none or auto)"
                    ))
                }
                "--sort" | "-O" | "--select" | "-S" => {
                    return Err(format!("{name} is not supported by udm dmsetup"))
                }
                "--major" | "-j" | "--minor" | "-m" => {
                    return Err(format!(
                        "{name}: udm devices are named, not numbered; give the device name"
                    ))
                }
                // --udevcookie: there is no udev to synchronise with, which
                // is what the cookie asks to wait for; --manglename none or
                // auto leaves names as they are, as udm does.
                _ => {}
            }
        } else {
            if value.is_some() {
                return Err(format!("option {name} takes no value"));
            }
            apply_flag(&mut o, &name)?;
        }
    }
    Ok(o)
}

fn number(name: &str, v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("{name} needs a whole number, got '{v}'"))
}

fn apply_flag(o: &mut Opts, name: &str) -> Result<(), String> {
    match name {
        "-c" | "-C" | "--columns" => o.columns = true,
        "--noheadings" => o.noheadings = true,
        "--nameprefixes" => o.nameprefixes = true,
        "-n" | "--notable" => o.notable = true,
        "-r" | "--readonly" => o.readonly = true,
        "-f" | "--force" => o.force = true,
        "--deferred" => o.deferred = true,
        "--noflush" => o.noflush = true,
        "--showkeys" => o.showkeys = true,
        "--tree" => o.tree = true,
        "--inactive" => o.inactive = true,
        "-v" | "--verbose" => o.verbose += 1,
        "--json" => o.json = true,
        "--stats" => o.stats = true,
        "-h" | "--help" => o.help = true,
        "--version" => o.version = true,
        "--concise" => o.concise = true,
        "--setuuid" => o.setuuid = true,
        "--unquoted" => o.unquoted = true,
        // What these ask for is what udm does anyway: it freezes no
        // filesystem on suspend (--nolockfs), never prompts (--yes), has no
        // udev to wait for or rules to run (--noudevsync, --noudevrules,
        // --verifyudev), always counts openers (--noopencount only lets
        // dmsetup skip it) and writes reports line by line (--unbuffered).
        "--nolockfs" | "-y" | "--yes" | "--noudevsync" | "--noudevrules" | "--verifyudev"
        | "--noopencount" | "--unbuffered" => {}
        "--addnodeoncreate" | "--addnodeonresume" => {
            return Err(format!(
                "{name} is not supported: udm dmsetup makes no device nodes (a device is an \
                 NBD export)"
            ))
        }
        "--retry" => o.retry = true,
        "--checks" => return Err(format!("{name} is not supported by udm dmsetup")),
        _ => return Err(format!("unrecognized option '{name}'")),
    }
    Ok(())
}

/// Entry point: the arguments after the program name (`dmsetup ARGS` or
/// `udm dmsetup ARGS`).
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let argv: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // dmstats' region verbs take dmstats' own options.
    let region_verb = |w: Option<&String>| {
        w.is_some_and(|v| matches!(v.as_str(), "create" | "delete" | "list" | "report"))
    };
    if let Some(i) = (0..argv.len()).find(|&i| argv[i] == "stats" && region_verb(argv.get(i + 1))) {
        let mut rest = argv;
        rest.remove(i);
        return super::dmstats::main(rest.into_iter().map(Into::into).collect());
    }
    let o = match parse(&argv) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("dmsetup: {e}");
            eprint!("{USAGE}");
            return 1;
        }
    };
    if o.help || o.args.first().is_some_and(|v| v == "help") {
        print!("{USAGE}");
        return 0;
    }
    if o.version && o.args.is_empty() {
        return run(&o, "version", &[]);
    }
    let Some(verb) = o.args.first().cloned() else {
        eprintln!("dmsetup: no command given");
        eprint!("{USAGE}");
        return 1;
    };
    let rest: Vec<String> = o.args[1..].to_vec();
    run(&o, &verb, &rest)
}

fn run(o: &Opts, verb: &str, args: &[String]) -> i32 {
    let named = match device_args(o, verb, args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dmsetup {verb}: {e}");
            eprintln!("Command failed.");
            return 1;
        }
    };
    let args = &named[..];
    match repeat(o, verb, args) {
        Ok(()) => 0,
        Err(Failure::Usage(msg)) => {
            eprintln!("dmsetup {verb}: {msg}");
            1
        }
        Err(Failure::Server(e)) => {
            if e.code == Some(Code::Enxio) && matches!(verb, "info" | "table" | "status" | "deps") {
                eprintln!("Device does not exist.");
            } else {
                eprintln!("udm dmsetup {verb}: {}", e.msg);
            }
            eprintln!("Command failed.");
            1
        }
    }
}

/// Verbs `-v` applies to: after a change, the device's `info` (as dmsetup
/// prints it), and `wait`/`info` themselves.
const VERBOSE_VERBS: &[&str] = &[
    "create",
    "load",
    "reload",
    "suspend",
    "resume",
    "clear",
    "rename",
    "wipe_table",
    "wait",
    "info",
    "version",
];

/// `-v` after a change: the changed devices' `info`.
fn show_after(o: &Opts, verb: &str, args: &[String]) -> Result<(), Failure> {
    if o.verbose == 0 || matches!(verb, "wait" | "info" | "version") || args.is_empty() || o.concise
    {
        return Ok(());
    }
    match verb {
        "rename" => info(o, &args[1..2]),
        "create" | "load" | "reload" | "clear" => info(o, &args[..1]),
        _ => info(o, args),
    }
}

/// `--count`/`--interval`: the report verbs again and again (`--interval`
/// alone: until interrupted; `--count` alone: every second).
/// The arguments with each device argument turned into its name, as
/// libdm takes `/dev/mapper/NAME` or a device node wherever a name stands
/// (`cli::devarg`): every argument of the verbs over devices, the first of
/// those that take one device and more.
fn device_args(o: &Opts, verb: &str, args: &[String]) -> Result<Vec<String>, String> {
    let which = match verb {
        "suspend" | "resume" | "remove" | "info" | "deps" | "table" | "status" | "wipe_table"
        | "mknodes" => 0..args.len(),
        "load" | "reload" | "rename" | "clear" | "message" | "wait" => 0..args.len().min(1),
        "stats" => 1.min(args.len())..args.len(),
        _ => 0..0,
    };
    let control = || {
        o.control
            .clone()
            .or_else(default_path)
            .ok_or_else(|| "no control socket: give --control PATH or set $UDM_CONTROL".into())
    };
    let mut out = args.to_vec();
    for i in which {
        out[i] = super::devarg::device_name(&args[i], control)?;
    }
    Ok(out)
}

fn repeat(o: &Opts, verb: &str, args: &[String]) -> Result<(), Failure> {
    if o.verbose > 0 && !VERBOSE_VERBS.contains(&verb) {
        return Err(Failure::Usage(format!(
            "-v/--verbose does nothing for {verb} in udm dmsetup; it shows the device after \
             {}",
            VERBOSE_VERBS.join(", ")
        )));
    }
    if o.count.is_none() && o.interval.is_none() {
        dispatch(o, verb, args)?;
        return show_after(o, verb, args);
    }
    if !matches!(verb, "info" | "status" | "stats" | "table" | "ls" | "deps") {
        return Err(Failure::Usage(format!(
            "--count/--interval repeat reports (info, status, stats, table, ls, deps), not {verb}"
        )));
    }
    let interval = std::time::Duration::from_secs(o.interval.unwrap_or(1));
    let mut i = 0u64;
    loop {
        dispatch(o, verb, args)?;
        i += 1;
        if o.count.is_some_and(|c| i >= c) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

enum Failure {
    Usage(String),
    Server(ClientError),
}

/// A failure on this side, reported as the server's are.
fn failed(msg: String) -> Failure {
    Failure::Server(ClientError { code: None, msg })
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Server(e)
    }
}

fn client(o: &Opts) -> Result<Client, Failure> {
    let path = o.control.clone().or_else(default_path).ok_or_else(|| {
        Failure::Usage(
            "no control socket: give --control PATH or set $UDM_CONTROL (or \
             $XDG_RUNTIME_DIR)"
                .into(),
        )
    })?;
    Ok(Client::connect(&path)?)
}

fn req(op: &str, names: &[String]) -> Request {
    Request {
        op: op.to_string(),
        names: names.to_vec(),
        ..Request::default()
    }
}

fn need_args(args: &[String], min: usize, max: usize, usage: &str) -> Result<(), Failure> {
    if args.len() < min || args.len() > max {
        return Err(Failure::Usage(format!("usage: dmsetup {usage}")));
    }
    Ok(())
}

/// The table a `create`/`load` gives: `--table`, a file, or stdin.
fn read_table(o: &Opts, file: Option<&String>) -> Result<Zeroizing<Vec<u8>>, Failure> {
    if let Some(t) = &o.table {
        let mut v = Zeroizing::new(t.clone().into_bytes());
        if !v.ends_with(b"\n") {
            v.push(b'\n');
        }
        return Ok(v);
    }
    let mut buf = Zeroizing::new(Vec::new());
    match file {
        Some(f) => {
            let mut fh = std::fs::File::open(f)
                .map_err(|e| Failure::Usage(format!("Couldn't open '{f}' for reading: {e}")))?;
            fh.read_to_end(&mut buf)
                .map_err(|e| Failure::Usage(format!("cannot read {f}: {e}")))?;
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| Failure::Usage(format!("cannot read the table from stdin: {e}")))?;
        }
    }
    Ok(buf)
}

fn devices_of<T: serde::de::DeserializeOwned>(v: &Value) -> Result<Vec<T>, Failure> {
    serde_json::from_value(v.get("devices").cloned().unwrap_or(Value::Null)).map_err(|e| {
        Failure::Server(ClientError {
            code: None,
            msg: format!("unexpected reply: {e}"),
        })
    })
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn dispatch(o: &Opts, verb: &str, args: &[String]) -> Result<(), Failure> {
    match verb {
        "create" => create(o, args),
        "load" | "reload" => load(o, args),
        "suspend" | "resume" => suspend_resume(o, verb, args),
        "remove" => remove(o, args),
        "remove_all" => remove_all(o, args),
        "rename" => rename(o, args),
        "clear" => {
            need_args(args, 1, 1, "clear <dev_name>")?;
            client(o)?.call(req("clear", args), &[])?;
            Ok(())
        }
        "wipe_table" => wipe_table(o, args),
        "ls" => ls(o, args),
        "info" => info(o, args),
        "deps" => deps(o, args),
        "table" => table(o, args),
        "status" => status(o, args),
        "message" => message(o, args),
        "wait" => wait(o, args),
        "targets" => targets(o),
        "version" => version(o),
        "stats" => stats(o, args),
        "splitname" => splitname(o, args),
        "udevcreatecookie" => {
            // dm's cookie layout: its magic in the upper half, a
            // semaphore number below; nothing waits on it here.
            let mut b = [0u8; 2];
            getrandom::fill(&mut b).map_err(|e| failed(format!("no random bytes: {e}")))?;
            println!(
                "0x{:08X}",
                0x0D4D_0000u32 | u32::from(u16::from_ne_bytes(b))
            );
            Ok(())
        }
        "mknodes" | "udevcomplete_all" | "udevcookie" | "udevflags" | "udevcomplete"
        | "udevreleasecookie" => {
            // No device nodes, no udev: nothing to do, as on a system
            // where everything is already in place.
            Ok(())
        }
        other => Err(Failure::Usage(format!(
            "unknown command '{other}' (see dmsetup help)"
        ))),
    }
}

/// `create --concise [LIST]`: every device of dmsetup's concise list
/// (from the argument or stdin), created and loaded in order.
fn create_concise(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(args, 0, 1, "create --concise [<concise_device_spec_list>]")?;
    let text = match args.first() {
        Some(t) => Zeroizing::new(t.clone()),
        None => {
            let raw = read_table(o, None)?;
            Zeroizing::new(String::from_utf8_lossy(&raw).into_owned())
        }
    };
    let devs = report::parse_concise(&text).map_err(Failure::Usage)?;
    let mut c = client(o)?;
    for d in devs {
        let mut r = req("create", std::slice::from_ref(&d.name));
        r.uuid = (!d.uuid.is_empty()).then(|| d.uuid.clone());
        r.readonly = d.read_only || o.readonly;
        r.allow = o.allow.clone();
        r.has_table = true;
        let mut table = Zeroizing::new(Vec::with_capacity(
            d.lines.iter().map(|l| l.len() + 1).sum(),
        ));
        for l in &d.lines {
            table.extend_from_slice(l.as_bytes());
            table.push(b'\n');
        }
        c.call(r, &table)?;
    }
    Ok(())
}

/// `create NAME [TABLE]`: with `--notable` or an empty table, a device without one, as dmsetup.
fn create(o: &Opts, args: &[String]) -> Result<(), Failure> {
    if o.concise {
        return create_concise(o, args);
    }
    need_args(
        args,
        1,
        2,
        "create <dev_name> [--table <table> | <table_file>]",
    )?;
    let mut r = req("create", &args[..1]);
    r.uuid = o.uuid.clone();
    r.readonly = o.readonly;
    r.allow = o.allow.clone();
    let table = if o.notable {
        Zeroizing::new(Vec::new())
    } else {
        r.has_table = true;
        read_table(o, args.get(1))?
    };
    if r.has_table && table.iter().all(|b| b.is_ascii_whitespace()) {
        // dmsetup creates the device without a table then.
        r.has_table = false;
    }
    client(o)?.call(r, &table)?;
    Ok(())
}

/// `load`/`reload NAME [TABLE]`: the inactive table.
fn load(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(
        args,
        1,
        2,
        "load <dev_name> [--table <table> | <table_file>]",
    )?;
    let mut r = req("load", &args[..1]);
    r.force = o.force;
    r.has_table = true;
    let table = read_table(o, args.get(1))?;
    client(o)?.call(r, &table)?;
    Ok(())
}

/// `suspend`/`resume NAME...`, one device after the other.
fn suspend_resume(o: &Opts, verb: &str, args: &[String]) -> Result<(), Failure> {
    need_args(args, 1, usize::MAX, &format!("{verb} <dev_name>..."))?;
    let mut c = client(o)?;
    for n in args {
        let mut r = req(verb, std::slice::from_ref(n));
        r.noflush = o.noflush;
        r.force = o.force;
        c.call(r, &[])?;
    }
    Ok(())
}

/// `remove NAME...`.
fn remove(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(
        args,
        1,
        usize::MAX,
        "remove [-f|--force] [--deferred] <dev_name>...",
    )?;
    let mut c = client(o)?;
    for n in args {
        let mut r = req("remove", std::slice::from_ref(n));
        r.force = o.force;
        r.deferred = o.deferred;
        // --retry: as dmsetup, 25 tries 0.2 s apart while it is busy.
        let mut tries = if o.retry { 25 } else { 1 };
        loop {
            tries -= 1;
            match c.call(r.clone(), &[]) {
                Err(e) if tries > 0 && e.code == Some(Code::Ebusy) => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                res => break res.map(|_| ())?,
            }
        }
    }
    Ok(())
}

/// `remove_all`.
fn remove_all(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(args, 0, 0, "remove_all [-f|--force] [--deferred]")?;
    let mut r = req("remove_all", &[]);
    r.force = o.force;
    r.deferred = o.deferred;
    client(o)?.call(r, &[])?;
    Ok(())
}

/// `rename NAME NEW`; `--setuuid` is refused (the uuid is given at create).
fn rename(o: &Opts, args: &[String]) -> Result<(), Failure> {
    if o.setuuid {
        return Err(Failure::Usage(
            "--setuuid is not supported: give the uuid at create (-u)".into(),
        ));
    }
    need_args(args, 2, 2, "rename <dev_name> <new_name>")?;
    let mut r = req("rename", &args[..1]);
    r.new_name = Some(args[1].clone());
    client(o)?.call(r, &[])?;
    Ok(())
}

/// `wipe_table NAME...`: an `error` table of the same size, loaded and resumed.
fn wipe_table(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(args, 1, usize::MAX, "wipe_table <dev_name>...")?;
    let mut c = client(o)?;
    for n in args {
        let (v, _) = c.call(req("info", std::slice::from_ref(n)), &[])?;
        let d: Vec<DeviceInfo> = devices_of(&v)?;
        let size = d.first().map_or(0, |d| d.size_sectors);
        let mut r = req("load", std::slice::from_ref(n));
        r.has_table = true;
        r.force = true;
        let line = TableLine {
            line_no: 1,
            start: 0,
            len: size,
            target: crate::targets::error::TYPE.name.into(),
            args: Vec::new(),
        };
        c.call(r, (line.text() + "\n").as_bytes())?;
        let mut r = req("resume", std::slice::from_ref(n));
        r.force = true;
        c.call(r, &[])?;
    }
    Ok(())
}

/// `message NAME SECTOR TEXT...`: the text goes in the payload, never the JSON (`key set` carries a key).
fn message(o: &Opts, args: &[String]) -> Result<(), Failure> {
    if args.len() < 3 {
        return Err(Failure::Usage(
            "usage: dmsetup message <dev_name> <sector> <message>".into(),
        ));
    }
    let sector: u64 = args[1]
        .parse()
        .map_err(|_| Failure::Usage("Invalid sector.".into()))?;
    let mut r = req("message", &args[..1]);
    r.sector = sector;
    // In the payload, never the JSON: `key set` carries a key.
    let text = zeroize::Zeroizing::new(args[2..].join(" "));
    let (v, _) = client(o)?.call(r, text.as_bytes())?;
    if let Some(s) = v.get("response").and_then(Value::as_str) {
        if s.is_empty() || s.ends_with('\n') {
            print!("{s}");
        } else {
            println!("{s}");
        }
    }
    Ok(())
}

/// `wait NAME [EVENT_NR]`.
fn wait(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(args, 1, 2, "wait <dev_name> [<event_nr>]")?;
    let mut r = req("wait", &args[..1]);
    if let Some(n) = args.get(1) {
        r.event_nr = n
            .parse()
            .map_err(|_| Failure::Usage(format!("invalid event number '{n}'")))?;
    }
    let (v, _) = client(o)?.call(r, &[])?;
    if o.verbose > 0 {
        info(o, &args[..1])?;
    }
    if o.json {
        print_json(&v);
    }
    Ok(())
}

/// `targets`: name and version of each.
fn targets(o: &Opts) -> Result<(), Failure> {
    let (v, _) = client(o)?.call(req("targets", &[]), &[])?;
    if o.json {
        print_json(&v);
        return Ok(());
    }
    let t: Vec<TargetVersion> =
        serde_json::from_value(v.get("targets").cloned().unwrap_or(Value::Null))
            .unwrap_or_default();
    for t in t {
        println!(
            "{:<16} v{}.{}.{}",
            t.name, t.version[0], t.version[1], t.version[2]
        );
    }
    Ok(())
}

/// The libdevmapper and dm ioctl interface versions udm's dmsetup
/// behaves as (scripts compare them: "driver ≥ 4.x").
const LIBRARY_VERSION: &str = "1.02.185";
const DRIVER_VERSION: &str = "4.48.0";

/// `version` in dmsetup's two lines; udm's own versions go after the date
/// slot of the first, and with `--json`/`-v` on lines of their own.
fn version(o: &Opts) -> Result<(), Failure> {
    println!(
        "Library version:   {LIBRARY_VERSION} (udm {})",
        env!("CARGO_PKG_VERSION")
    );
    let (v, _) = client(o)?.call(req("version", &[]), &[])?;
    println!("Driver version:    {DRIVER_VERSION}");
    if o.verbose > 0 {
        println!(
            "udm serve:         {} (control protocol {})",
            v.get("version").and_then(Value::as_str).unwrap_or("?"),
            v.get("protocol").and_then(Value::as_u64).unwrap_or(0)
        );
    }
    Ok(())
}

/// `stats clear|print [NAME...]`.
fn stats(o: &Opts, args: &[String]) -> Result<(), Failure> {
    let Some(sub) = args.first() else {
        return Err(Failure::Usage(
            "usage: dmsetup stats clear|print [<dev_name>...]".into(),
        ));
    };
    match sub.as_str() {
        "clear" => {
            client(o)?.call(req("stats_clear", &args[1..]), &[])?;
            Ok(())
        }
        "print" => {
            let (v, _) = client(o)?.call(req("status", &args[1..]), &[])?;
            let devs: Vec<DeviceStatus> = devices_of(&v)?;
            if o.json {
                print_json(&v);
            } else {
                for d in &devs {
                    print_stats(d);
                }
            }
            Ok(())
        }
        other => Err(Failure::Usage(format!(
            "stats {other}: udm takes dmstats' create, delete, list and report (regions), \
             and 'stats print' and 'stats clear' for its per-device counters"
        ))),
    }
}

/// udm's counters, one line per operation.
fn print_stats(d: &DeviceStatus) {
    let s = &d.stats;
    println!(
        "{}: in_flight {} interval {:.1}s histograms {}",
        d.name,
        s.in_flight,
        s.interval_s,
        if s.histograms { "on" } else { "off" }
    );
    for (name, c) in [
        ("read", &s.read),
        ("write", &s.write),
        ("flush", &s.flush),
        ("discard", &s.discard),
    ] {
        print!(
            "  {name:<7} ios {} sectors {} errors {}",
            c.ios, c.sectors, c.errors
        );
        if let Some(l) = c.latency {
            print!(
                " p50 {}us p99 {}us p999 {}us max {}us",
                l.p50_ns / 1000,
                l.p99_ns / 1000,
                l.p999_ns / 1000,
                l.max_ns / 1000
            );
        }
        println!();
    }
}

fn names_or_all(c: &mut Client, args: &[String]) -> Result<Vec<DeviceInfo>, Failure> {
    let (v, _) = c.call(req("info", args), &[])?;
    devices_of(&v)
}

fn ls(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(args, 0, 0, "ls [--target <target_type>] [--tree]")?;
    let mut c = client(o)?;
    let (v, _) = c.call(req("ls", &[]), &[])?;
    if o.json {
        print_json(&v);
        return Ok(());
    }
    let mut devs: Vec<DeviceInfo> = devices_of(&v)?;
    if devs.is_empty() {
        println!("No devices found");
        return Ok(());
    }
    if o.tree {
        print!("{}", tree(&devs, o.options.as_deref().unwrap_or("")));
        return Ok(());
    }
    let by_name = matches!(o.options.as_deref(), Some("devname" | "blkdevname"));
    if let Some(cmd) = &o.exec {
        if let Some(t) = &o.target {
            devs.retain(|d| d.target_types.iter().any(|x| x == t));
        }
        return exec_each(cmd, &devs);
    }
    if let Some(t) = &o.target {
        devs.retain(|d| d.target_types.iter().any(|x| x == t));
        for d in &devs {
            println!("{}\t({MAJOR}, {})", d.name, d.minor);
        }
        return Ok(());
    }
    for d in &devs {
        if by_name {
            println!("{}\t({})", d.name, d.name);
        } else {
            println!("{}\t({MAJOR}:{})", d.name, d.minor);
        }
    }
    Ok(())
}

/// `ls --exec CMD`: CMD (split at blanks) run for each device with the
/// device's path appended, `${DM_DEV_DIR:-/dev}/mapper/NAME`, as dmsetup
/// does; one after the other, each waited for.
fn exec_each(cmd: &str, devs: &[DeviceInfo]) -> Result<(), Failure> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let Some((prog, rest)) = words.split_first() else {
        return Err(Failure::Usage("--exec needs a command".into()));
    };
    let dev_dir = std::env::var("DM_DEV_DIR").unwrap_or_else(|_| "/dev".into());
    for d in devs {
        let path = format!("{}/mapper/{}", dev_dir.trim_end_matches('/'), d.name);
        std::process::Command::new(prog)
            .args(rest)
            .arg(&path)
            .status()
            .map_err(|e| failed(format!("--exec: cannot run {prog}: {e}")))?;
    }
    Ok(())
}

/// `ls --tree`, drawn as dmsetup draws it (ASCII): each device that no
/// other device uses is a root, with what it is built on below it.
fn tree(devs: &[DeviceInfo], options: &str) -> String {
    let mut out = String::new();
    let inverted = options.split(',').any(|x| x == "inverted");
    // Children of a node: what it uses (or, inverted, who uses it).
    let children = |name: &str| -> Vec<(String, bool)> {
        if inverted {
            devs.iter()
                .filter(|d| d.deps.iter().any(|x| x.kind == "device" && x.name == name))
                .map(|d| (d.name.clone(), true))
                .collect()
        } else {
            devs.iter()
                .find(|d| d.name == name)
                .map(|d| {
                    d.deps
                        .iter()
                        .map(|x| (x.name.clone(), x.kind == "device"))
                        .collect()
                })
                .unwrap_or_default()
        }
    };
    let used = |name: &str| {
        devs.iter()
            .any(|d| d.deps.iter().any(|x| x.kind == "device" && x.name == name))
    };
    let roots: Vec<&DeviceInfo> = devs
        .iter()
        .filter(|d| {
            if inverted {
                !d.deps.iter().any(|x| x.kind == "device")
            } else {
                !used(&d.name)
            }
        })
        .collect();
    fn label(devs: &[DeviceInfo], name: &str, is_dev: bool) -> String {
        match devs.iter().find(|d| d.name == name).filter(|_| is_dev) {
            Some(d) => format!("{} ({MAJOR}:{})", d.name, d.minor),
            None => format!(" ({name})"),
        }
    }
    #[allow(clippy::too_many_arguments)]
    fn walk(
        out: &mut String,
        devs: &[DeviceInfo],
        children: &dyn Fn(&str) -> Vec<(String, bool)>,
        name: &str,
        is_dev: bool,
        depth: usize,
        more: &mut Vec<bool>,
        last: bool,
    ) {
        if more.len() <= depth {
            more.resize(depth + 1, false);
        }
        more[depth] = !last;
        for d in 0..depth {
            out.push(' ');
            out.push_str(if d == depth - 1 {
                if more[depth] {
                    "|-"
                } else {
                    "`-"
                }
            } else if more[d + 1] {
                "| "
            } else {
                "  "
            });
        }
        out.push_str(&label(devs, name, is_dev));
        out.push('\n');
        if !is_dev || depth > 64 {
            return;
        }
        let kids = children(name);
        let n = kids.len();
        for (i, (k, kd)) in kids.into_iter().enumerate() {
            walk(out, devs, children, &k, kd, depth + 1, more, i + 1 == n);
        }
    }
    let mut more = Vec::new();
    let n = roots.len();
    for (i, r) in roots.iter().enumerate() {
        walk(
            &mut out,
            devs,
            &children,
            &r.name,
            true,
            0,
            &mut more,
            i + 1 == n,
        );
    }
    out
}

/// The rules of `info` in one line: `10.0.0.0/8` or
/// `(unix,uid:0) and (uid:0)`.
fn describe_access(rules: &[String]) -> String {
    match rules {
        [one] => one.clone(),
        many => many
            .iter()
            .map(|r| format!("({r})"))
            .collect::<Vec<_>>()
            .join(" and "),
    }
}

fn info(o: &Opts, args: &[String]) -> Result<(), Failure> {
    let mut c = client(o)?;
    let (v, _) = c.call(req("info", args), &[])?;
    if o.json {
        print_json(&v);
        return Ok(());
    }
    let devs: Vec<DeviceInfo> = devices_of(&v)?;
    if o.columns {
        // The reverse relations (names_using_dev...) need every device.
        let all = if args.is_empty() {
            devs.clone()
        } else {
            names_or_all(&mut c, &[])?
        };
        return columns(o, &devs, &all);
    }
    if devs.is_empty() && args.is_empty() {
        println!("No devices found");
        return Ok(());
    }
    for d in &devs {
        println!("Name:              {}", d.name);
        println!(
            "State:             {}{}{}",
            if d.suspended { "SUSPENDED" } else { "ACTIVE" },
            if d.read_only { " (READ-ONLY)" } else { "" },
            if d.deferred_remove {
                " (DEFERRED REMOVE)"
            } else {
                ""
            }
        );
        // udm's own line, only for a failed device (`core::fault`).
        if let Some(why) = &d.failed {
            println!("Failed:            {why}");
        }
        // And for one whose requests fail because a device under it did.
        if let Some(why) = &d.lower_failed {
            println!("Lower failed:      {why}");
        }
        println!("Read Ahead:        {}", report::READ_AHEAD);
        if !d.live_table && !d.inactive_table {
            println!("Tables present:    None");
        } else {
            println!(
                "Tables present:    {}{}{}",
                if d.live_table { "LIVE" } else { "" },
                if d.live_table && d.inactive_table {
                    " & "
                } else {
                    ""
                },
                if d.inactive_table { "INACTIVE" } else { "" }
            );
        }
        println!("Open count:        {}", d.open_count);
        // Only with rules: without, dmsetup's output stays as it is.
        if !d.allow.is_empty() {
            println!("NBD clients:       {}", describe_access(&d.allow));
        }
        // Where the device is reached (udm's own lines, only from a
        // server with a mapper directory, so dmsetup's output stays as it
        // is otherwise).
        if let Some(f) = &d.file {
            println!("File:              {f}");
            if let Some(u) = &d.nbd_uri {
                println!("NBD URI:           {u}");
            }
        }
        println!("Event number:      {}", d.event_nr);
        println!("Major, minor:      {MAJOR}, {}", d.minor);
        println!("Number of targets: {}", d.target_count);
        if !d.uuid.is_empty() {
            println!("UUID: {}", d.uuid);
        }
        println!();
    }
    Ok(())
}

const DEFAULT_COLUMNS: &str = "name,major,minor,attr,open,segments,events,uuid";

/// `info -c [-o FIELDS|help]` (`all`: every device, for the fields that
/// name the devices using one).
fn columns(o: &Opts, devs: &[DeviceInfo], all: &[DeviceInfo]) -> Result<(), Failure> {
    let spec = match o.options.as_deref() {
        None => DEFAULT_COLUMNS.to_string(),
        Some(s) if s.starts_with('+') => format!("{DEFAULT_COLUMNS},{}", &s[1..]),
        Some(s) => s.to_string(),
    };
    if matches!(spec.as_str(), "help" | "?") {
        eprint!("{}", report::help());
        return Ok(());
    }
    let ids = report::expand(&spec).map_err(Failure::Usage)?;
    let cols: Vec<(&str, (&str, usize, bool))> =
        ids.iter().map(|id| (*id, report::heading(id))).collect();
    let rows: Vec<Vec<String>> = devs
        .iter()
        .map(|d| ids.iter().map(|id| report::value(id, d, all)).collect())
        .collect();
    print_report(o, &cols, &rows);
    Ok(())
}

/// Rows laid out as libdevmapper's reports: columns padded to the wider
/// of their default width and their contents, numbers right-aligned, one
/// space between; `--separator` turns alignment off.
fn print_report(o: &Opts, cols: &[(&str, (&str, usize, bool))], rows: &[Vec<String>]) {
    let aligned = o.separator.is_none();
    let sep = o.separator.clone().unwrap_or_else(|| " ".into());
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, (_, c))| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([c.1])
                .max()
                .unwrap_or(c.1)
        })
        .collect();
    if o.nameprefixes {
        let q = if o.unquoted { "" } else { "'" };
        for r in rows {
            let fields: Vec<String> = cols
                .iter()
                .zip(r)
                .map(|((id, _), v)| format!("DM_{}={q}{v}{q}", id.to_uppercase()))
                .collect();
            println!("{}", fields.join(&sep));
        }
        return;
    }
    if !o.noheadings {
        let h: Vec<String> = cols
            .iter()
            .zip(&widths)
            .map(|((_, c), w)| {
                if aligned {
                    format!("{:<w$}", c.0, w = *w)
                } else {
                    c.0.to_string()
                }
            })
            .collect();
        println!("{}", h.join(&sep));
    }
    for r in rows {
        let f: Vec<String> = r
            .iter()
            .zip(cols)
            .zip(&widths)
            .map(|((v, (_, c)), w)| {
                if !aligned {
                    v.clone()
                } else if c.2 {
                    format!("{v:>w$}", w = *w)
                } else {
                    format!("{v:<w$}", w = *w)
                }
            })
            .collect();
        println!("{}", f.join(&sep));
    }
}

/// `splitname NAME [SUBSYSTEM]`: an LVM name's parts (other subsystems'
/// names are not split: empty fields, as dmsetup).
fn splitname(o: &Opts, args: &[String]) -> Result<(), Failure> {
    need_args(args, 1, 2, "splitname <dev_name> [<subsystem>]")?;
    let subsystem = args.get(1).map_or("LVM", String::as_str);
    let (vg, lv, layer) = if subsystem == "LVM" {
        report::split_lvm_name(&args[0])
    } else {
        Default::default()
    };
    let spec = o.options.as_deref().unwrap_or("vg_name,lv_name,lv_layer");
    let ids = report::expand(spec).map_err(Failure::Usage)?;
    let mut row = Vec::new();
    for id in &ids {
        row.push(match *id {
            "subsystem" => subsystem.to_string(),
            "vg_name" => vg.clone(),
            "lv_name" => lv.clone(),
            "lv_layer" => layer.clone(),
            other => {
                return Err(Failure::Usage(format!(
                    "splitname reports subsystem, vg_name, lv_name and lv_layer, not {other}"
                )))
            }
        });
    }
    let cols: Vec<(&str, (&str, usize, bool))> =
        ids.iter().map(|id| (*id, report::heading(id))).collect();
    print_report(o, &cols, &[row]);
    Ok(())
}

fn deps(o: &Opts, args: &[String]) -> Result<(), Failure> {
    let mut c = client(o)?;
    let devs = names_or_all(&mut c, args)?;
    if o.json {
        let v = serde_json::json!({ "devices": devs });
        print_json(&v);
        return Ok(());
    }
    if devs.is_empty() {
        println!("No devices found");
        return Ok(());
    }
    let multiple = args.len() != 1;
    let by_name = matches!(o.options.as_deref(), Some("devname" | "blkdevname"));
    for d in &devs {
        if multiple {
            print!("{}: ", d.name);
        }
        print!("{} dependencies\t:", d.deps.len());
        for x in &d.deps {
            match x.minor {
                Some(m) if !by_name => print!(" ({MAJOR}, {m})"),
                _ => print!(" ({})", x.name),
            }
        }
        println!();
    }
    Ok(())
}

fn table(o: &Opts, args: &[String]) -> Result<(), Failure> {
    let mut c = client(o)?;
    let mut r = req("table", args);
    r.showkeys = o.showkeys;
    r.inactive = o.inactive;
    let (v, payload) = c.call(r, &[])?;
    let devs: Vec<TableDevice> = devices_of(&v)?;
    // Read in place: the payload is the only copy of the keys, and it is
    // wiped on drop.
    let text = std::str::from_utf8(&payload)
        .map_err(|_| failed("the server sent a table that is not UTF-8 text".to_string()))?;
    let mut lines = text.lines();
    if devs.is_empty() {
        println!("No devices found");
        return Ok(());
    }
    let multiple = args.len() != 1;
    if o.json {
        return table_json(o, &devs, &mut lines);
    }
    if o.concise {
        let infos = names_or_all(&mut c, args)?;
        return table_concise(o, &devs, &infos, &mut lines, text.len());
    }
    // Sized before writing, so it never grows (a grown buffer leaves a
    // copy of the keys in the memory it gave back): the lines, plus a
    // "NAME: " per line or per empty device.
    let prefixes: usize = devs
        .iter()
        .map(|d| if multiple { (d.name.len() + 2) * d.lines.max(1) } else { 0 } + 1)
        .sum();
    let mut out = Zeroizing::new(String::with_capacity(text.len() + prefixes));
    let cap = out.capacity();
    for d in &devs {
        let shown = device_lines(o, d, &mut lines);
        if shown.is_empty() && o.target.is_none() {
            if multiple {
                out.push_str(&format!("{}: ", d.name));
            }
            out.push('\n');
        }
        for l in shown {
            if multiple {
                out.push_str(&format!("{}: ", d.name));
            }
            out.push_str(l);
            out.push('\n');
        }
    }
    debug_assert_eq!(out.capacity(), cap, "the table buffer grew");
    print!("{}", out.as_str());
    Ok(())
}

/// `table --concise`: every device on one line, `;` between devices.
fn table_concise(
    o: &Opts,
    devs: &[TableDevice],
    infos: &[DeviceInfo],
    lines: &mut std::str::Lines<'_>,
    text_len: usize,
) -> Result<(), Failure> {
    let names: usize = infos
        .iter()
        .map(|d| 2 * (d.name.len() + d.uuid.len()) + 32)
        .sum();
    // Sized so it never grows (it may hold keys): escaping at most
    // doubles the text.
    let mut out = Zeroizing::new(String::with_capacity(2 * text_len + names + 1));
    for (i, d) in devs.iter().enumerate() {
        let shown = device_lines(o, d, lines);
        let info = infos
            .iter()
            .find(|x| x.name == d.name)
            .ok_or_else(|| failed(format!("device '{}' went away", d.name)))?;
        if i > 0 {
            out.push(';');
        }
        report::push_concise(&mut out, info, &shown);
    }
    out.push('\n');
    print!("{}", out.as_str());
    Ok(())
}

/// The lines of the next device (`d.lines` of them) that `--target`
/// selects.
fn device_lines<'a>(o: &Opts, d: &TableDevice, lines: &mut std::str::Lines<'a>) -> Vec<&'a str> {
    (0..d.lines)
        .filter_map(|_| lines.next())
        .filter(|l| {
            o.target
                .as_ref()
                .is_none_or(|t| l.split(' ').nth(2) == Some(t.as_str()))
        })
        .collect()
}

/// `table --json`: serialised straight from the payload's lines into a
/// buffer sized for the worst escaping (6 bytes per input byte) plus the
/// structure, so no copy of a key is left in a grown or intermediate
/// buffer.
fn table_json(
    o: &Opts,
    devs: &[TableDevice],
    lines: &mut std::str::Lines<'_>,
) -> Result<(), Failure> {
    #[derive(serde::Serialize)]
    struct Dev<'a> {
        name: &'a str,
        table: Vec<&'a str>,
    }
    #[derive(serde::Serialize)]
    struct All<'a> {
        devices: Vec<Dev<'a>>,
    }
    let all = All {
        devices: devs
            .iter()
            .map(|d| Dev {
                name: &d.name,
                table: device_lines(o, d, lines),
            })
            .collect(),
    };
    let size: usize = all
        .devices
        .iter()
        .map(|d| 64 + 6 * d.name.len() + d.table.iter().map(|l| 16 + 6 * l.len()).sum::<usize>())
        .sum::<usize>()
        + 64;
    let mut buf = Zeroizing::new(Vec::with_capacity(size));
    let cap = buf.capacity();
    serde_json::to_writer_pretty(&mut *buf, &all)
        .map_err(|e| failed(format!("cannot write the table as JSON: {e}")))?;
    buf.push(b'\n');
    debug_assert_eq!(buf.capacity(), cap, "the JSON buffer grew");
    use std::io::Write;
    std::io::stdout()
        .write_all(&buf)
        .map_err(|e| failed(format!("cannot write the table: {e}")))?;
    Ok(())
}

fn status(o: &Opts, args: &[String]) -> Result<(), Failure> {
    let mut c = client(o)?;
    let (v, _) = c.call(req("status", args), &[])?;
    if o.json {
        print_json(&v);
        return Ok(());
    }
    let devs: Vec<DeviceStatus> = devices_of(&v)?;
    if devs.is_empty() {
        println!("No devices found");
        return Ok(());
    }
    let multiple = args.len() != 1;
    for d in &devs {
        let shown: Vec<_> = d
            .targets
            .iter()
            .filter(|t| o.target.as_ref().is_none_or(|x| &t.target_type == x))
            .collect();
        if shown.is_empty() && o.target.is_none() {
            if multiple {
                print!("{}: ", d.name);
            }
            println!();
        }
        for t in shown {
            if multiple {
                print!("{}: ", d.name);
            }
            println!("{} {} {} {}", t.start, t.length, t.target_type, t.status);
        }
        if o.stats {
            print_stats(d);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::model::DepInfo;

    fn dev(name: &str, minor: u32, deps: &[(&str, bool)]) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            uuid: String::new(),
            major: 0,
            minor,
            read_only: false,
            allow: Vec::new(),
            file: None,
            nbd_uri: None,
            failed: None,
            lower_failed: None,
            suspended: false,
            live_table: true,
            inactive_table: false,
            deferred_remove: false,
            open_count: 0,
            event_nr: 0,
            target_count: 1,
            target_types: vec!["linear".into()],
            size_sectors: 8,
            deps: deps
                .iter()
                .map(|(n, d)| DepInfo {
                    kind: if *d { "device" } else { "path" }.into(),
                    name: n.to_string(),
                    minor: None,
                })
                .collect(),
        }
    }

    #[test]
    fn options_parse_as_getopt_does() {
        let a: Vec<String> = ["-cv", "info", "--control=/x", "-o", "name,attr", "d", "-f"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = parse(&a).unwrap();
        assert!(o.columns && o.force);
        assert_eq!(o.verbose, 1);
        assert_eq!(o.options.as_deref(), Some("name,attr"));
        assert_eq!(o.control, Some(PathBuf::from("/x")));
        assert_eq!(o.args, ["info", "d"]);
        assert!(parse(&["--bogus".to_string()]).is_err());
        assert!(parse(&["-é".to_string()]).is_err());
        assert!(parse(&["-cé".to_string()]).is_err());
    }

    /// The tree as dmsetup draws it for a stack and its files.
    #[test]
    fn tree_is_drawn_as_dmsetup_draws_it() {
        let devs = vec![
            dev("l1", 0, &[("/a", false)]),
            dev("l2", 1, &[("/b", false)]),
            dev("s", 2, &[("l1", true), ("l2", true)]),
            dev("top", 3, &[("s", true)]),
        ];
        assert_eq!(
            tree(&devs, ""),
            "top (0:3)\n `-s (0:2)\n    |-l1 (0:0)\n    |  `- (/a)\n    `-l2 (0:1)\n       `- (/b)\n"
        );
    }
}
