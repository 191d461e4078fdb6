//! `udm replay-log`: replay a dm-log-writes log onto a device, with the
//! kernel tree's `replay-log` option names: to an entry count or a mark,
//! optionally running a check command (`--fsck`) at every flush, FUA write
//! or N entries, stopping at the first check that fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::core::BlockDevice;
use crate::store::file::{FileStore, OpenFlags};
use crate::targets::log_replay::{self, Check, LogReader, ReplayPlan};

/// Arguments of `udm replay-log`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The log device or file written by a log-writes target.
    #[arg(long, value_name = "PATH")]
    pub log: PathBuf,
    /// The device or file to replay onto (a copy of the logged device as
    /// it was when logging started). Not needed with --find or --list.
    #[arg(long, value_name = "PATH")]
    pub replay: Option<PathBuf>,
    /// Replay at most this many entries (counted from the log's start).
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Do not apply entries before this index.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub start_entry: u64,
    /// Do not apply entries before the entry with this mark.
    #[arg(long, value_name = "MARK")]
    pub start_mark: Option<String>,
    /// Stop after the entry with this mark.
    #[arg(long, value_name = "MARK")]
    pub end_mark: Option<String>,
    /// Run --fsck at every `flush`, every `fua` write, or every N entries
    /// (and after the last entry applied).
    #[arg(long, value_name = "flush|fua|N")]
    pub check: Option<String>,
    /// Command run (by `sh -c`) at each check point; the replay stops with
    /// an error when it exits non-zero.
    #[arg(long, value_name = "COMMAND")]
    pub fsck: Option<String>,
    /// With --end-mark: print the entry index of the mark and exit.
    #[arg(long)]
    pub find: bool,
    /// Print every entry of the log and exit.
    #[arg(long)]
    pub list: bool,
    /// Print each check point.
    #[arg(short, long)]
    pub verbose: bool,
}

pub fn run(a: Args) -> i32 {
    crate::cli::init_logging();
    match replay(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("udm replay-log: {e}");
            1
        }
    }
}

fn open(path: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>, String> {
    FileStore::open(
        path,
        OpenFlags {
            read_only,
            ..OpenFlags::default()
        },
    )
    .map(|f| Arc::new(f) as Arc<dyn BlockDevice>)
    .map_err(|e| e.to_string())
}

fn replay(a: Args) -> Result<(), String> {
    let log = open(&a.log, true)?;
    if a.list {
        let mut r = LogReader::open(log)?;
        println!(
            "log {}: {} entries, sector size {}",
            a.log.display(),
            r.nr_entries,
            r.sectorsize
        );
        while let Some(e) = r.next_entry()? {
            println!("{}", e.describe());
        }
        return Ok(());
    }
    if a.find {
        let mark = a
            .end_mark
            .as_deref()
            .ok_or("--find needs --end-mark MARK")?;
        return match log_replay::find_mark(log, mark)? {
            Some(i) => {
                println!("{i}");
                Ok(())
            }
            None => Err(format!("mark '{mark}' is not in the log")),
        };
    }
    let target = a
        .replay
        .as_deref()
        .ok_or("give --replay PATH (the device to replay onto)")?;
    let check = a.check.as_deref().map(str::parse::<Check>).transpose()?;
    if check.is_some() != a.fsck.is_some() {
        return Err("--check and --fsck go together".into());
    }
    let dev = open(target, false)?;
    let plan = ReplayPlan {
        start_mark: a.start_mark.clone(),
        start_entry: a.start_entry,
        limit: a.limit,
        end_mark: a.end_mark.clone(),
        check,
    };
    let verbose = a.verbose;
    let fsck = a.fsck.clone();
    let mut checkpoint = |e: &log_replay::Entry| -> Result<(), String> {
        if verbose {
            eprintln!("check at {}", e.describe());
        }
        let Some(cmd) = &fsck else { return Ok(()) };
        let st = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .status()
            .map_err(|err| format!("cannot run --fsck '{cmd}': {err}"))?;
        if !st.success() {
            return Err(format!(
                "--fsck '{cmd}' failed ({st}) after {}; the replay device holds the state at \
                 that point",
                e.describe()
            ));
        }
        Ok(())
    };
    let rep = log_replay::replay(log, dev.as_ref(), &plan, &mut checkpoint)?;
    dev.flush().map_err(|e| e.to_string())?;
    eprintln!(
        "replayed {} entries{}{}",
        rep.applied,
        rep.last
            .map(|l| format!(", up to entry {l}"))
            .unwrap_or_default(),
        if check.is_some() {
            format!(", {} checks passed", rep.checks)
        } else {
            String::new()
        }
    );
    Ok(())
}
