//! The mapper directory's FUSE tuning, with each choice a run-time knob
//! (environment variables, read once at mount), so a benchmark can turn
//! one off against the defaults without a rebuild (`bench/fuse_bench.py
//! --options`; docs/BENCHMARKS.md has what each buys). They are for
//! measurement, not configuration: the defaults are the fast ones.
//!
//! | variable | default | what it sets |
//! |---|---|---|
//! | `UDM_FUSE_THREADS` | cores, 4 to 16 | session threads reading `/dev/fuse` |
//! | `UDM_FUSE_CLONE_FD` | 1 | each session thread on its own cloned `/dev/fuse` descriptor |
//! | `UDM_FUSE_MAX_WRITE` | 1 MiB | `max_write` and `max_readahead` (bytes, 4 KiB to 1 MiB) |
//! | `UDM_FUSE_MAX_PAGES` | 1 | `FUSE_MAX_PAGES` (off: the kernel caps requests at 128 KiB) |
//! | `UDM_FUSE_ASYNC_DIO` | 1 | `FUSE_ASYNC_DIO`: one file's direct I/O in flight at once |
//! | `UDM_FUSE_PARALLEL_WRITES` | 1 | `FOPEN_PARALLEL_DIRECT_WRITES`: writes not under the inode lock |
//! | `UDM_FUSE_DIRECT_IO` | 1 | `FOPEN_DIRECT_IO` (off: the kernel's page cache, stale against NBD writers) |
//! | `UDM_FUSE_MAX_BACKGROUND` | 128 | background (asynchronous) requests in flight |
//!
//! Replies always come from the engine's completion (the session thread
//! goes back to read at once). Splice is not among them: fuser reads requests with `read` and sends
//! replies with `writev` on `/dev/fuse`, and has no splice path to turn on.

use std::fmt;

/// Largest FUSE read or write: requests as large as NBD clients send.
pub const MAX_IO: u32 = 1 << 20;

/// One mount's FUSE choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tuning {
    pub threads: usize,
    pub clone_fd: bool,
    pub max_write: u32,
    pub max_pages: bool,
    pub async_dio: bool,
    pub parallel_writes: bool,
    pub direct_io: bool,
    pub max_background: u16,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            threads: default_threads(),
            clone_fd: true,
            max_write: MAX_IO,
            max_pages: true,
            async_dio: true,
            parallel_writes: true,
            direct_io: true,
            max_background: 128,
        }
    }
}

/// FUSE threads reading requests: each hands a request to the engine and
/// goes back to read (replies come from the engine's completion), so a few
/// are enough to keep every core busy; more keep small requests that run
/// inline from waiting behind each other.
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(4, 16)
}

/// A knob whose value does not parse: names the variable and what it takes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BadKnob(String);

impl fmt::Display for BadKnob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Tuning {
    /// The defaults with the `UDM_FUSE_*` variables of the environment
    /// applied.
    pub fn from_env() -> Result<Tuning, BadKnob> {
        Tuning::from_vars(|k| std::env::var(k).ok())
    }

    /// The defaults with the variables `get` returns applied.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Tuning, BadKnob> {
        let mut t = Tuning::default();
        let flag = |name: &str, v: &mut bool| -> Result<(), BadKnob> {
            match get(name).as_deref() {
                None => Ok(()),
                Some("1" | "on" | "yes" | "true") => {
                    *v = true;
                    Ok(())
                }
                Some("0" | "off" | "no" | "false") => {
                    *v = false;
                    Ok(())
                }
                Some(x) => Err(BadKnob(format!("{name}={x}: give 1 (on) or 0 (off)"))),
            }
        };
        flag("UDM_FUSE_CLONE_FD", &mut t.clone_fd)?;
        flag("UDM_FUSE_MAX_PAGES", &mut t.max_pages)?;
        flag("UDM_FUSE_ASYNC_DIO", &mut t.async_dio)?;
        flag("UDM_FUSE_PARALLEL_WRITES", &mut t.parallel_writes)?;
        flag("UDM_FUSE_DIRECT_IO", &mut t.direct_io)?;
        if let Some(n) = number(&get, "UDM_FUSE_THREADS", 1, 64)? {
            t.threads = n as usize;
        }
        if let Some(n) = number(&get, "UDM_FUSE_MAX_WRITE", 4096, u64::from(MAX_IO))? {
            t.max_write = n as u32;
        }
        if let Some(n) = number(&get, "UDM_FUSE_MAX_BACKGROUND", 1, u64::from(u16::MAX))? {
            t.max_background = n as u16;
        }
        Ok(t)
    }

    /// The choices that differ from the defaults, for the log.
    pub fn changed(&self) -> Vec<String> {
        let d = Tuning::default();
        let mut out = Vec::new();
        let mut note = |differs: bool, what: String| {
            if differs {
                out.push(what);
            }
        };
        note(
            self.threads != d.threads,
            format!("threads={}", self.threads),
        );
        note(
            self.clone_fd != d.clone_fd,
            format!("clone_fd={}", self.clone_fd),
        );
        note(
            self.max_write != d.max_write,
            format!("max_write={}", self.max_write),
        );
        note(
            self.max_pages != d.max_pages,
            format!("max_pages={}", self.max_pages),
        );
        note(
            self.async_dio != d.async_dio,
            format!("async_dio={}", self.async_dio),
        );
        note(
            self.parallel_writes != d.parallel_writes,
            format!("parallel_writes={}", self.parallel_writes),
        );
        note(
            self.direct_io != d.direct_io,
            format!("direct_io={}", self.direct_io),
        );
        note(
            self.max_background != d.max_background,
            format!("max_background={}", self.max_background),
        );
        out
    }
}

/// The whole number in variable `name`, if set, within `[min, max]`.
fn number(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, BadKnob> {
    let Some(v) = get(name) else {
        return Ok(None);
    };
    match v.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ => Err(BadKnob(format!(
            "{name}={v}: give a whole number from {min} to {max}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Tuning, BadKnob> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::from_vars(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn no_variables_give_the_defaults() {
        let t = with(&[]).unwrap();
        assert_eq!(t, Tuning::default());
        assert!(t.changed().is_empty());
        assert!(t.direct_io && t.clone_fd);
        assert_eq!(t.max_write, MAX_IO);
    }

    #[test]
    fn each_variable_sets_its_choice() {
        let t = with(&[
            ("UDM_FUSE_THREADS", "2"),
            ("UDM_FUSE_CLONE_FD", "0"),
            ("UDM_FUSE_MAX_WRITE", "131072"),
            ("UDM_FUSE_ASYNC_DIO", "off"),
            ("UDM_FUSE_MAX_BACKGROUND", "16"),
        ])
        .unwrap();
        assert_eq!(t.threads, 2);
        assert!(!t.clone_fd && !t.async_dio);
        assert_eq!(t.max_write, 128 << 10);
        assert_eq!(t.max_background, 16);
        assert!(t.parallel_writes && t.direct_io && t.max_pages);
        assert_eq!(t.changed().len(), 5);
    }

    #[test]
    fn bad_values_name_the_variable_and_the_fix() {
        let e = with(&[("UDM_FUSE_DIRECT_IO", "maybe")]).unwrap_err();
        assert!(e.to_string().contains("UDM_FUSE_DIRECT_IO=maybe"), "{e}");
        assert!(e.to_string().contains("1 (on) or 0 (off)"), "{e}");
        let e = with(&[("UDM_FUSE_MAX_WRITE", "8")]).unwrap_err();
        assert!(e.to_string().contains("4096 to 1048576"), "{e}");
        let e = with(&[("UDM_FUSE_THREADS", "0")]).unwrap_err();
        assert!(e.to_string().contains("UDM_FUSE_THREADS"), "{e}");
    }
}
