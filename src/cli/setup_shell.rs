//! The command shell `udm veritysetup` and `udm integritysetup` share,
//! as the two tools share libcryptsetup's: popt-style options, the action
//! table and its argument counts, `--help`/`--usage`/`--version`, the
//! `create`/`remove` aliases, the exit codes and their `--verbose` words,
//! and the calls to a running `udm serve` that `open`, `close` and
//! `status` make. Each tool gives its option tables, actions and texts.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::control::proto::{Code, Request};
use crate::control::{Client, ClientError};

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

/// Options: long name, short letter.
pub(crate) type OptTable = &'static [(&'static str, Option<char>)];

/// A tool's parsed command line.
pub(crate) struct Args {
    values: HashMap<&'static str, String>,
    flags: Vec<&'static str>,
    /// The action first, then its arguments.
    pub pos: Vec<String>,
}

fn find(table: OptTable, long: Option<&str>, short: Option<char>) -> Option<&'static str> {
    table
        .iter()
        .find(|(l, s)| long == Some(*l) || (short.is_some() && short == *s))
        .map(|(l, _)| *l)
}

/// One word that starts with `-`: long name, short letter, inline value.
fn split_option(w: &str) -> (Option<String>, Option<char>, Option<String>) {
    match w.strip_prefix("--") {
        Some(rest) => match rest.split_once('=') {
            Some((k, v)) => (Some(k.to_string()), None, Some(v.to_string())),
            None => (Some(rest.to_string()), None, None),
        },
        None => {
            let mut cs = w[1..].chars();
            let c = cs.next();
            let rest: String = cs.collect();
            (None, c, (!rest.is_empty()).then_some(rest))
        }
    }
}

#[cfg(test)]
impl Args {
    /// [`Args::parse`] of a test's command line, split at whitespace.
    pub(crate) fn parse_words(s: &str, valued: OptTable, flags: OptTable) -> Result<Args, String> {
        Args::parse(
            s.split_whitespace().map(Into::into).collect(),
            valued,
            flags,
        )
    }
}

impl Args {
    /// popt's rules: `--name=value` or `--name value`, `-xVALUE` or `-x
    /// VALUE`, options anywhere among the positional arguments, `--`
    /// ending them; an unknown option is an error naming it.
    pub fn parse(
        argv: Vec<std::ffi::OsString>,
        valued: OptTable,
        flags: OptTable,
    ) -> Result<Args, String> {
        let mut a = Args {
            values: HashMap::new(),
            flags: Vec::new(),
            pos: Vec::new(),
        };
        let argv: Vec<String> = argv
            .into_iter()
            .map(|s| {
                s.into_string()
                    .map_err(|s| format!("{}: not valid UTF-8", s.to_string_lossy()))
            })
            .collect::<Result<_, _>>()?;
        let mut it = argv.into_iter();
        let mut only_pos = false;
        while let Some(w) = it.next() {
            if only_pos || w == "-" || !w.starts_with('-') {
                a.pos.push(w);
                continue;
            }
            if w == "--" {
                only_pos = true;
                continue;
            }
            let (long, short, inline) = split_option(&w);
            if let Some(name) = find(valued, long.as_deref(), short) {
                let v = match inline {
                    Some(v) => v,
                    None => it.next().ok_or_else(|| format!("{w}: missing argument"))?,
                };
                a.values.insert(name, v);
            } else if let Some(name) =
                find(flags, long.as_deref(), short).filter(|_| inline.is_none())
            {
                a.flags.push(name);
            } else {
                return Err(format!("{w}: unknown option"));
            }
        }
        Ok(a)
    }

    pub fn has(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// A numeric option; a value that is not a number is a usage error
    /// naming the option.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, Fail> {
        self.str(name)
            .map(|v| {
                crate::core::units::parse_decimal(v).map_err(|_| {
                    Fail::usage(format!(
                        "Invalid value '{v}' of --{name}: expected a number."
                    ))
                })
            })
            .transpose()
    }

    /// [`Args::u64`] for options that must fit 32 bits.
    pub fn u32(&self, name: &str) -> Result<Option<u32>, Fail> {
        self.u64(name)?
            .map(|v| {
                u32::try_from(v).map_err(|_| {
                    Fail::usage(format!("Invalid value '{v}' of --{name}: too large."))
                })
            })
            .transpose()
    }
}

/// An action: its name, the positional arguments it takes, its usage.
pub(crate) struct Action {
    pub name: &'static str,
    pub min: usize,
    /// More are an error (veritysetup) or ignored (`usize::MAX`,
    /// integritysetup).
    pub max: usize,
    pub usage: &'static str,
    pub run: fn(&Args) -> Outcome,
}

/// What one tool gives the shell.
pub(crate) struct Tool {
    /// The program name, in "NAME: Unknown action." and the like.
    pub name: &'static str,
    pub version: &'static str,
    pub usage: &'static str,
    pub help: &'static str,
    pub valued: OptTable,
    pub flags: OptTable,
    pub actions: &'static [Action],
}

/// libcryptsetup's words for an exit code, after "Command failed with
/// code".
fn code_text(code: i32) -> &'static str {
    match code {
        2 => "no permission or bad passphrase",
        3 => "out of memory",
        4 => "wrong device or file specified",
        5 => "device already exists or device is busy",
        _ => "wrong or missing parameters",
    }
}

fn usage_error(tool: &Tool, msg: &str) -> i32 {
    eprintln!("{}", tool.usage);
    eprintln!("{msg}");
    1
}

/// The action `a` names, aliases resolved (`create NAME DEV ...` is the
/// old spelling of `open DEV NAME ...`, `remove` of `close`), with its
/// argument count checked.
fn pick<'t>(tool: &'t Tool, a: &mut Args) -> Result<&'t Action, String> {
    let Some(name) = a.pos.first().cloned() else {
        return Err(format!("{}: Argument <action> missing.", tool.name));
    };
    let name = match name.as_str() {
        "create" => {
            if a.pos.len() > 2 {
                a.pos.swap(1, 2);
            }
            "open"
        }
        "remove" => "close",
        n => n,
    };
    let Some(act) = tool.actions.iter().find(|x| x.name == name) else {
        return Err(format!("{}: Unknown action.", tool.name));
    };
    let n = a.pos.len() - 1;
    if n < act.min || n > act.max {
        return Err(format!(
            "{}: {}: requires {} as arguments",
            tool.name, act.name, act.usage
        ));
    }
    Ok(act)
}

/// Entry point: the tool's argv (without the program name); the exit
/// code.
pub(crate) fn main(tool: &Tool, argv: Vec<std::ffi::OsString>) -> i32 {
    let mut a = match Args::parse(argv, tool.valued, tool.flags) {
        Ok(a) => a,
        Err(e) => return usage_error(tool, &e),
    };
    if a.has("help") {
        println!("{}\n{}\n\n{}", tool.version, tool.usage, tool.help);
        return 0;
    }
    if a.has("usage") {
        println!("{}", tool.usage);
        return 0;
    }
    if a.has("version") {
        println!("{}", tool.version);
        return 0;
    }
    let act = match pick(tool, &mut a) {
        Ok(act) => act,
        Err(e) => return usage_error(tool, &e),
    };
    // The actions over an active device take it as the real tools do:
    // its name, /dev/mapper/NAME, or its node (`cli::devarg`).
    if matches!(act.name, "close" | "status" | "resize") && a.pos.len() > 1 {
        match super::devarg::device_name(&a.pos[1], || socket(&a).map_err(|f| f.msg)) {
            Ok(n) => a.pos[1] = n,
            Err(e) => {
                eprintln!("{e}");
                return 4;
            }
        }
    }
    let r = (act.run)(&a);
    let verbose = a.has("verbose");
    match r {
        Ok(()) => {
            if verbose {
                println!("Command successful.");
            }
            0
        }
        Err(f) => {
            if !f.msg.is_empty() {
                eprintln!("{}", f.msg);
            }
            if verbose {
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

/// The control socket: `--control`, else `$UDM_CONTROL` or the default.
fn socket(a: &Args) -> Result<PathBuf, Fail> {
    if let Some(p) = a.str("control") {
        return Ok(PathBuf::from(p));
    }
    crate::control::default_path().ok_or_else(|| {
        Fail::usage(
            "no udm control socket: start `udm serve --control PATH` and give PATH with \
             --control or $UDM_CONTROL",
        )
    })
}

/// A server's error as libcryptsetup reports the kernel's.
fn client_err(name: &str, e: ClientError) -> Fail {
    match e.code {
        Some(Code::Eexist) => Fail::new(5, format!("Device {name} already exists.")),
        Some(Code::Ebusy) => Fail::new(5, format!("Device {name} is still in use ({e}).")),
        Some(Code::Enxio) => Fail::new(4, format!("Device {name} is not active.")),
        Some(Code::Eperm) => Fail::new(2, e.to_string()),
        _ => Fail::usage(e.to_string()),
    }
}

/// One request to the server about device `name`: its result and its
/// payload (a table).
pub(crate) fn call(
    a: &Args,
    name: &str,
    req: Request,
    payload: &[u8],
) -> Result<(Value, Vec<u8>), Fail> {
    let mut cl = Client::connect(&socket(a)?).map_err(|e| Fail::usage(e.to_string()))?;
    cl.call(req, payload)
        .map(|(v, p)| (v, p.to_vec()))
        .map_err(|e| client_err(name, e))
}

/// The start of both tools' `status NAME`: "/dev/mapper/NAME is
/// inactive." (exit 4), or "... is active[ and is in use]." printed and
/// the device's status entry and table lines returned, for the tool to
/// print its own target's lines.
pub(crate) fn active_status(
    a: &Args,
    name: &str,
) -> Result<(Value, Vec<crate::core::table::TableLine>), Fail> {
    let path = format!("/dev/mapper/{name}");
    let st = match call(a, name, req("status", name), &[]) {
        Ok((v, _)) => v,
        Err(f) if f.code == 4 => {
            println!("{path} is inactive.");
            return Err(Fail::new(4, ""));
        }
        Err(f) => return Err(f),
    };
    let dev = st["devices"][0].clone();
    let (_, text) = call(a, name, req("table", name), &[])?;
    let text = String::from_utf8_lossy(&text);
    let lines = crate::core::table::parse(&text).map_err(|e| {
        Fail::usage(format!(
            "the table of {name} from the server does not parse: {e}"
        ))
    })?;
    let in_use = dev["open_count"].as_u64().unwrap_or(0) > 0;
    println!(
        "{path} is active{}.",
        if in_use { " and is in use" } else { "" }
    );
    Ok((dev, lines))
}

/// A request of `op` about device `name`.
pub(crate) fn req(op: &str, name: &str) -> Request {
    Request {
        op: op.into(),
        names: vec![name.to_string()],
        ..Request::default()
    }
}

/// `close NAME [--deferred | --cancel-deferred]`, as both tools do it;
/// `--deferred` on a device still in use says so.
pub(crate) fn close(a: &Args) -> Outcome {
    let name = &a.pos[1];
    if a.has("cancel-deferred") {
        if a.has("deferred") {
            return Err(Fail::usage(
                "Options --cancel-deferred and --deferred cannot be used at the same time.",
            ));
        }
        // dm's own message, as libcryptsetup sends it.
        let mut r = req("message", name);
        r.message = vec!["@cancel_deferred_remove".into()];
        call(a, name, r, &[])?;
        return Ok(());
    }
    remove(a, name, a.has("deferred"))?;
    if a.has("deferred") && call(a, name, req("info", name), &[]).is_ok() {
        println!("Device {name} is still active and scheduled for deferred removal.");
    }
    Ok(())
}

/// `remove` as libcryptsetup does it for both tools: libdevmapper's
/// retry-remove tries again for about 5 s while the device is busy, so
/// the last release of a block node or mapper file, still on its way
/// through the loop driver and FUSE, does not fail a `close` that
/// follows a writer at once.
fn remove(a: &Args, name: &str, deferred: bool) -> Outcome {
    let mut r = req("remove", name);
    r.deferred = deferred;
    for _ in 1..25 {
        let mut cl = Client::connect(&socket(a)?).map_err(|e| Fail::usage(e.to_string()))?;
        match cl.call(r.clone(), &[]) {
            Err(e) if e.code == Some(Code::Ebusy) => {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            res => return res.map(|_| ()).map_err(|e| client_err(name, e)),
        }
    }
    call(a, name, r, &[]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUED: OptTable = &[("tag-size", Some('t')), ("salt", Some('s'))];
    const FLAGS: OptTable = &[("batch-mode", Some('q')), ("verbose", Some('v'))];

    fn p(s: &str) -> Result<Args, String> {
        Args::parse_words(s, VALUED, FLAGS)
    }

    #[test]
    fn popt_spellings() {
        let a = p("format -q --tag-size=8 d.img -s11 h -- -v").unwrap();
        assert_eq!(a.pos, ["format", "d.img", "h", "-v"]);
        assert_eq!(a.str("tag-size"), Some("8"));
        assert_eq!(a.str("salt"), Some("11"));
        assert!(a.has("batch-mode") && !a.has("verbose"));
        assert_eq!(p("x --bogus").err().unwrap(), "--bogus: unknown option");
        assert!(p("x --tag-size").is_err());
        assert!(p("x --batch-mode=1").is_err());
        assert!(p("x --tag-size=abc").unwrap().u64("tag-size").is_err());
        assert!(p("x -t 4294967296").unwrap().u32("tag-size").is_err());
    }

    fn ok(_: &Args) -> Outcome {
        Ok(())
    }

    #[test]
    fn actions_aliases_and_counts() {
        const ACTIONS: &[Action] = &[
            Action {
                name: "open",
                min: 2,
                max: 3,
                usage: "<a> <b>",
                run: ok,
            },
            Action {
                name: "close",
                min: 1,
                max: 1,
                usage: "<name>",
                run: ok,
            },
        ];
        let tool = Tool {
            name: "t",
            version: "t 1",
            usage: "Usage: t",
            help: "",
            valued: VALUED,
            flags: FLAGS,
            actions: ACTIONS,
        };
        let mut a = p("create n d").unwrap();
        assert_eq!(pick(&tool, &mut a).unwrap().name, "open");
        assert_eq!(a.pos, ["create", "d", "n"]);
        assert_eq!(
            pick(&tool, &mut p("remove n").unwrap()).unwrap().name,
            "close"
        );
        let e = pick(&tool, &mut p("close").unwrap()).err().unwrap();
        assert_eq!(e, "t: close: requires <name> as arguments");
        assert!(pick(&tool, &mut p("close a b").unwrap()).is_err());
        let e = pick(&tool, &mut p("bogus").unwrap()).err().unwrap();
        assert!(e.contains("Unknown action"), "{e}");
        let e = pick(&tool, &mut p("").unwrap()).err().unwrap();
        assert!(e.contains("missing"), "{e}");
    }
}
