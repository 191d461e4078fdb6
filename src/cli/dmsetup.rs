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
    args: Vec<String>,
}

const USAGE: &str = "Usage:

dmsetup
        [--version] [-h|--help [-c|-C|--columns]]
        [-v|--verbose [-v|--verbose ...]] [-f|--force]
        [-r|--readonly] [--noflush] [--showkeys] [--target <target_type>]
        [--control <socket>] [--json]

        create <dev_name> [-u|uuid <uuid>] [--allow <list>] [-n|--notable|--table {<table>|<table_file>}]
        load|reload <dev_name> [--table {<table>|<table_file>}]
        suspend [--noflush] <dev_name>...
        resume [--force] <dev_name>...
        remove [-f|--force] [--deferred] <dev_name>...
        remove_all [-f|--force] [--deferred]
        rename <dev_name> <new_name>
        clear <dev_name>
        wipe_table <dev_name>...
        ls [--target <target_type>] [-o devno|devname|blkdevname] [--tree]
        info [<dev_name>...]
        info -c|-C|--columns [--noheadings] [--separator <separator>]
             [-o <fields>] [--nameprefixes] [<dev_name>...]
        deps [-o devno|devname|blkdevname] [<dev_name>...]
        table [--target <target_type>] [--inactive] [--showkeys] [<dev_name>...]
        status [--target <target_type>] [--stats] [<dev_name>...]
        message <dev_name> <sector> <message>
        wait <dev_name> [<event_nr>]
        stats clear|print [<dev_name>...]
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
                "--sort" | "-O" | "--select" | "-S" => {
                    return Err(format!("{name} is not supported by udm dmsetup"))
                }
                "--major" | "-j" | "--minor" | "-m" => {
                    return Err(format!(
                        "{name}: udm devices are named, not numbered; give the device name"
                    ))
                }
                // udev, readahead, name mangling, repeated reports: no
                // meaning for NBD exports; accepted so scripts run.
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
        // Accepted for compatibility; nothing to do for NBD exports.
        "--nolockfs" | "--retry" | "-y" | "--yes" | "--noudevsync" | "--noudevrules"
        | "--verifyudev" | "--addnodeoncreate" | "--addnodeonresume" | "--noopencount"
        | "--checks" | "--unbuffered" | "--unquoted" => {}
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
    match dispatch(o, verb, args) {
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
        "mknodes" | "udevcomplete_all" | "udevcookie" | "udevflags" | "udevcomplete"
        | "udevreleasecookie" | "udevcreatecookie" => {
            // No device nodes, no udev: nothing to do, as on a system
            // where everything is already in place.
            Ok(())
        }
        other => Err(Failure::Usage(format!(
            "unknown command '{other}' (see dmsetup help)"
        ))),
    }
}

/// `create NAME [TABLE]`: with `--notable` or an empty table, a device without one, as dmsetup.
fn create(o: &Opts, args: &[String]) -> Result<(), Failure> {
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
        c.call(r, &[])?;
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

/// `version`: ours and the server's.
fn version(o: &Opts) -> Result<(), Failure> {
    println!(
        "Library version:   {} (udm dmsetup)",
        env!("CARGO_PKG_VERSION")
    );
    let (v, _) = client(o)?.call(req("version", &[]), &[])?;
    println!(
        "Driver version:    {} (udm serve, control protocol {})",
        v.get("version").and_then(Value::as_str).unwrap_or("?"),
        v.get("protocol").and_then(Value::as_u64).unwrap_or(0)
    );
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
        "print" | "report" | "list" => {
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
            "stats {other}: udm supports 'stats clear' and 'stats print'"
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
        return columns(o, &devs);
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

/// A report column: heading, width, right-aligned, value.
type Column = (&'static str, usize, bool, fn(&DeviceInfo) -> String);

fn column(id: &str) -> Option<Column> {
    Some(match id {
        "name" => ("Name", 16, false, |d| d.name.clone()),
        "uuid" => ("UUID", 32, false, |d| d.uuid.clone()),
        "major" => ("Maj", 3, true, |_| MAJOR.to_string()),
        "minor" => ("Min", 3, true, |d| d.minor.to_string()),
        "attr" => ("Stat", 4, false, |d| {
            format!(
                "{}{}{}{}",
                if d.live_table { 'L' } else { '-' },
                if d.inactive_table { 'I' } else { '-' },
                if d.suspended { 's' } else { '-' },
                if d.read_only { 'r' } else { 'w' }
            )
        }),
        "tables_loaded" => ("Tables", 6, false, |d| {
            match (d.live_table, d.inactive_table) {
                (true, true) => "Both",
                (true, false) => "Live",
                (false, true) => "Inactive",
                (false, false) => "None",
            }
            .to_string()
        }),
        "suspended" => ("Suspended", 9, false, |d| {
            if d.suspended { "Suspended" } else { "Active" }.to_string()
        }),
        "readonly" => ("Read-only", 9, false, |d| {
            if d.read_only {
                "Read-only"
            } else {
                "Writeable"
            }
            .to_string()
        }),
        "devno" => ("DevNo", 5, false, |d| format!("{MAJOR}:{}", d.minor)),
        "open" => ("Open", 4, true, |d| d.open_count.to_string()),
        "segments" => ("Targ", 4, true, |d| d.target_count.to_string()),
        "events" => ("Event", 6, true, |d| d.event_nr.to_string()),
        "device_count" => ("#Devs", 5, true, |d| d.deps.len().to_string()),
        "devs_used" => ("DevNamesUsed", 16, false, |d| {
            d.deps
                .iter()
                .filter(|x| x.kind == "device")
                .map(|x| x.name.clone())
                .collect::<Vec<_>>()
                .join(",")
        }),
        "devnos_used" => ("DevNosUsed", 16, false, |d| {
            d.deps
                .iter()
                .map(|x| match x.minor {
                    Some(m) => format!("{MAJOR}:{m}"),
                    None => x.name.clone(),
                })
                .collect::<Vec<_>>()
                .join(",")
        }),
        _ => return None,
    })
}

const DEFAULT_COLUMNS: &str = "name,major,minor,attr,open,segments,events,uuid";

/// `info -c`, laid out as libdevmapper's reports: columns padded to the
/// wider of their default width and their contents, numbers right-aligned,
/// one space between; `--separator` turns alignment off.
fn columns(o: &Opts, devs: &[DeviceInfo]) -> Result<(), Failure> {
    let spec = match o.options.as_deref() {
        None => DEFAULT_COLUMNS.to_string(),
        Some(s) if s.starts_with('+') => format!("{DEFAULT_COLUMNS},{}", &s[1..]),
        Some(s) => s.to_string(),
    };
    let mut cols = Vec::new();
    for id in spec.split(',').filter(|s| !s.is_empty()) {
        let c = column(id).ok_or_else(|| Failure::Usage(format!("Unrecognised field: {id}")))?;
        cols.push((id.to_string(), c));
    }
    let rows: Vec<Vec<String>> = devs
        .iter()
        .map(|d| cols.iter().map(|(_, c)| (c.3)(d)).collect())
        .collect();
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
        for r in &rows {
            let fields: Vec<String> = cols
                .iter()
                .zip(r)
                .map(|((id, _), v)| format!("DM_{}='{}'", id.to_uppercase(), v))
                .collect();
            println!("{}", fields.join(&sep));
        }
        return Ok(());
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
    for r in &rows {
        let f: Vec<String> = r
            .iter()
            .zip(&cols)
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
