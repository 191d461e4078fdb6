//! dmstats' `create`, `delete`, `list` and `report` (argv[0] `dmstats`,
//! or `dmsetup stats VERB`): dm-stats regions of a running server's
//! devices over the control socket, printed in dmstats' columns.
//!
//! Rates in `report` are over the time since the region was created
//! (dmstats without `--interval` shows the same since its last read).
//! udm merges no requests, so the merge columns are 0; it has no disk
//! busy time either, so `Util%` is the average queue size, capped at 100.

use serde_json::Value;

use crate::control::proto::Request;
use crate::control::{default_path, Client};
use crate::dm::stats::RegionInfo;

pub const USAGE: &str = "\
usage: dmstats create [--start S --length L] [--areas N | --areasize S] [--programid ID] [NAME...]
       dmstats delete (--regionid N | --allregions) [NAME...]
       dmstats list [NAME...]
       dmstats report [NAME...]
  (also: dmsetup stats VERB ...). Sizes are sectors, or take a suffix
  b s k m g t (powers of 1024); no NAME means every device.
  --control PATH or $UDM_CONTROL names the server's control socket.
";

#[derive(Default)]
struct Opts {
    control: Option<std::path::PathBuf>,
    start: u64,
    length: u64,
    area: String,
    program: String,
    region: Option<String>,
    names: Vec<String>,
}

/// A size in sectors: bare digits are sectors, a suffix names the unit.
fn size_sectors(flag: &str, v: &str) -> Result<u64, String> {
    let bad = || format!("{flag} needs a size (sectors, or with a b/s/k/m/g/t suffix), got '{v}'");
    let (num, mult) = match v.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'b' => 1,
                's' => 512,
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => return Err(bad()),
            };
            (&v[..i], m)
        }
        _ => (v, 512),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(mult).ok_or_else(bad)?;
    if bytes % 512 != 0 {
        return Err(format!(
            "{flag} {v} is not a whole number of 512-byte sectors"
        ));
    }
    Ok(bytes / 512)
}

fn parse(args: &[String]) -> Result<(String, Opts), String> {
    let mut o = Opts {
        area: "whole".into(),
        program: "dmstats".into(),
        ..Opts::default()
    };
    let mut verb = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if a.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("option {name} needs a value"))
        };
        match name {
            "--control" => o.control = Some(value()?.into()),
            "--start" => o.start = size_sectors(name, &value()?)?,
            "--length" | "--len" => o.length = size_sectors(name, &value()?)?,
            "--areas" => o.area = format!("count:{}", value()?),
            "--areasize" => o.area = format!("size:{}", size_sectors(name, &value()?)?),
            "--programid" => o.program = value()?,
            "--regionid" => o.region = Some(value()?),
            "--allregions" => o.region = Some("all".into()),
            "--alldevices" => {}
            n if n.starts_with('-') => {
                return Err(format!("option {n} is not one udm's dmstats takes"))
            }
            _ if verb.is_none() => verb = Some(a.clone()),
            _ => o.names.push(a.clone()),
        }
    }
    let verb = verb.ok_or("no command given")?;
    Ok((verb, o))
}

/// Entry point of the `dmstats` personality.
pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    let argv: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if argv
        .iter()
        .any(|a| a == "-h" || a == "--help" || a == "help")
    {
        print!("{USAGE}");
        return 0;
    }
    match parse(&argv).and_then(|(verb, o)| run(&verb, &o)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dmstats: {e}");
            1
        }
    }
}

fn run(verb: &str, o: &Opts) -> Result<(), String> {
    let path = o
        .control
        .clone()
        .or_else(default_path)
        .ok_or("no control socket: give --control PATH or set $UDM_CONTROL")?;
    let mut c = Client::connect(&path).map_err(|e| e.to_string())?;
    let mut call = |op: &str, message: Vec<String>| {
        let req = Request {
            op: op.into(),
            names: o.names.clone(),
            message,
            ..Request::default()
        };
        c.call(req, &[]).map(|(v, _)| v).map_err(|e| e.msg)
    };
    match verb {
        "create" => {
            if o.start > 0 && o.length == 0 {
                return Err("--start needs --length".into());
            }
            let words = [o.start, o.length].map(|n| n.to_string());
            let words = [&words[..], &[o.area.clone(), o.program.clone()]].concat();
            let v = call("stats_create", words)?;
            for d in v["created"].as_array().into_iter().flatten() {
                println!(
                    "{}: Created new region with {} area(s) as region ID {}",
                    d["name"].as_str().unwrap_or("?"),
                    d["areas"],
                    d["id"]
                );
            }
            Ok(())
        }
        "delete" => {
            let r = o
                .region
                .clone()
                .ok_or("delete needs --regionid N or --allregions")?;
            call("stats_delete", vec![r]).map(drop)
        }
        "list" | "report" => {
            let devs = devices(call("stats_list", Vec::new())?);
            if verb == "list" {
                print_list(&devs);
            } else {
                print_report(&devs);
            }
            Ok(())
        }
        other => Err(format!(
            "'{other}' is not a dmstats command udm has (create, delete, list, report; \
             'dmsetup stats clear|print' for udm's own counters)"
        )),
    }
}

fn devices(v: Value) -> Vec<(String, Vec<RegionInfo>)> {
    v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let name = d["name"].as_str().unwrap_or("?").to_string();
            let regions = serde_json::from_value(d["regions"].clone()).unwrap_or_default();
            (name, regions)
        })
        .collect()
}

/// A size as dmstats prints one: two decimals and a 1024-based unit.
fn human(bytes: f64) -> String {
    if bytes < 0.005 {
        return "0".into();
    }
    let mut v = bytes;
    for u in ["b", "k", "m", "g", "t"] {
        if v < 1024.0 {
            return format!("{v:.2}{u}");
        }
        v /= 1024.0;
    }
    format!("{v:.2}p")
}

fn print_list(devs: &[(String, Vec<RegionInfo>)]) {
    println!("Name             RgID  RStart RSize  #Areas ASize  ProgID");
    for (name, regions) in devs {
        for r in regions {
            println!(
                "{name:<16} {:>4} {:>7} {:>6} {:>6} {:>6} {}",
                r.id,
                human((r.start * 512) as f64),
                human((r.len * 512) as f64),
                r.areas.len(),
                human((r.area_len * 512) as f64),
                r.program_id
            );
        }
    }
}

fn print_report(devs: &[(String, Vec<RegionInfo>)]) {
    println!(
        "Name             RgID  ArID  AStart ASize  RRqM/s   WRqM/s   R/s   W/s    \
         RSz/s WSz/s   AvRqSz  QSize Util%      AWait RdAWa WrAWa"
    );
    for (name, regions) in devs {
        for r in regions {
            let t = r.interval_s.max(1e-9);
            for (i, a) in r.areas.iter().enumerate() {
                let ios = a.reads + a.writes;
                let ms = |ns: u64, n: u64| {
                    if n == 0 {
                        0.0
                    } else {
                        ns as f64 / 1e6 / n as f64
                    }
                };
                let qsize = (a.read_ns + a.write_ns) as f64 / 1e9 / t;
                let avg = if ios == 0 {
                    0.0
                } else {
                    ((a.read_sectors + a.write_sectors) * 512) as f64 / ios as f64
                };
                let a_start = (r.start + i as u64 * r.area_len) * 512;
                let a_len = (r.area_len * 512).min(r.len * 512 - (a_start - r.start * 512));
                println!(
                    "{name:<16} {:>4} {:>5} {:>7} {:>6} {:>8.2} {:>8.2} {:>5.2} {:>6.2} {:>8} {:>7} {:>8} {:>6.2} {:>5.2} {:>10.2} {:>5.2} {:>5.2}",
                    r.id,
                    i,
                    human(a_start as f64),
                    human(a_len as f64),
                    0.0,
                    0.0,
                    a.reads as f64 / t,
                    a.writes as f64 / t,
                    human((a.read_sectors * 512) as f64 / t),
                    human((a.write_sectors * 512) as f64 / t),
                    human(avg),
                    qsize,
                    (qsize * 100.0).min(100.0),
                    ms(a.read_ns + a.write_ns, ios),
                    ms(a.read_ns, a.reads),
                    ms(a.write_ns, a.writes),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_sectors_unless_a_suffix_says_otherwise() {
        assert_eq!(size_sectors("--start", "8").unwrap(), 8);
        assert_eq!(size_sectors("--start", "1m").unwrap(), 2048);
        assert_eq!(size_sectors("--start", "4096b").unwrap(), 8);
        assert!(size_sectors("--start", "100b").is_err());
        assert!(size_sectors("--start", "1x").is_err());
        assert_eq!(human(0.0), "0");
        assert_eq!(human(1536.0), "1.50k");
        assert_eq!(human((61u64 << 30) as f64), "61.00g");
    }

    #[test]
    fn options_and_names_are_told_apart() {
        let a: Vec<String> = [
            "create",
            "--start",
            "1m",
            "--length=2m",
            "--areas",
            "4",
            "d0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (verb, o) = parse(&a).unwrap();
        assert_eq!(verb, "create");
        assert_eq!((o.start, o.length), (2048, 4096));
        assert_eq!(o.area, "count:4");
        assert_eq!(o.names, ["d0"]);
        assert!(parse(&["list".into(), "--bogus".into()]).is_err());
    }
}
