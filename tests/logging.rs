//! Logs on stderr: colour only for a terminal (a pipe or a log file gets no
//! escape codes, and `NO_COLOR` turns colour off even on a terminal), and
//! `--log-format json` gives one JSON object per line for log collectors.
//!
//! Every run is `udm serve` with one file export and a socket path whose
//! directory does not exist: the device is built (an INFO line), then
//! listening fails (the error) and udm exits 1 by itself.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{need, scratch, show, udm};

const ESC: u8 = 0x1b;

/// The arguments of a serve run that logs one device and then fails.
fn failing_serve(dir: &Path) -> Vec<String> {
    let img = dir.join("a.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let sock: PathBuf = dir.join("no-such-dir").join("s");
    vec![
        "serve".into(),
        "--socket".into(),
        sock.display().to_string(),
        "--file".into(),
        format!("a={}", img.display()),
    ]
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert_eq!(out.status.code(), Some(1), "{cmd:?}:\n{}", show(&out));
    out
}

#[test]
fn no_colour_when_stderr_is_a_pipe() {
    let d = scratch("udm-log-");
    let out = run(udm()
        .args(failing_serve(d.path()))
        .env_remove("NO_COLOR")
        .env("UDM_LOG", "info")
        .stderr(Stdio::piped()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("device a"), "no INFO line:\n{err}");
    assert!(err.contains("cannot listen"), "no error:\n{err}");
    assert!(
        !out.stderr.contains(&ESC),
        "escape codes in a pipe:\n{err:?}"
    );
}

/// Under a terminal (a pty from `script`) the text format is coloured,
/// unless `NO_COLOR` is set.
#[test]
fn colour_on_a_terminal_unless_no_color() {
    need("script");
    let d = scratch("udm-log-");
    let line = std::iter::once(env!("CARGO_BIN_EXE_udm").to_string())
        .chain(failing_serve(d.path()))
        .collect::<Vec<_>>()
        .join(" ");
    for (no_color, want_colour) in [(None, true), (Some("1"), false)] {
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .env("UDM_LOG", "info")
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = run(&mut cmd);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("device a"), "no INFO line:\n{text}");
        assert_eq!(
            out.stdout.contains(&ESC),
            want_colour,
            "NO_COLOR={no_color:?}, terminal output:\n{text:?}"
        );
    }
}

/// `--log-format json`, as a global option before the command or as an
/// option of `serve`: every line of stderr is a JSON object, the error
/// that ends the run included.
#[test]
fn json_log_lines_parse() {
    let d = scratch("udm-log-");
    let args = failing_serve(d.path());
    let before: Vec<String> = ["--log-format".to_string(), "json".into()]
        .into_iter()
        .chain(args.iter().cloned())
        .collect();
    let mut after = args.clone();
    after.extend(["--log-format".to_string(), "json".into()]);
    for argv in [before, after] {
        let out = run(udm()
            .args(&argv)
            .env("UDM_LOG", "info")
            .stderr(Stdio::piped()));
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<serde_json::Value> = err
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
            .collect();
        assert!(lines.iter().all(|v| v.is_object()), "{err}");
        let message = |v: &serde_json::Value| {
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            lines
                .iter()
                .any(|v| v["level"] == "INFO" && message(v).contains("device a")),
            "{argv:?}: no INFO line for the device:\n{err}"
        );
        assert!(
            lines
                .iter()
                .any(|v| v["level"] == "ERROR" && message(v).contains("cannot listen")),
            "{argv:?}: the error is not a JSON line:\n{err}"
        );
        assert!(!out.stderr.contains(&ESC), "{err:?}");
    }
}

/// `udm … | head`: a reader that goes away early ends the writer quietly
/// with the status a SIGPIPE death gives (141, or 0 where the parser
/// prints the help itself), not with a panic report.
/// The pipe's read end is closed before udm starts, so its first line of
/// help output already fails.
#[test]
fn closed_stdout_ends_quietly() {
    for args in [
        &["cryptsetup", "--help"][..],
        &["--help"][..],
        &["dmsetup", "help"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_udm"))
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked"),
            "udm {args:?} with stdout closed: {err}"
        );
        // clap's own --help ignores the failed write and exits 0.
        assert!(
            matches!(out.status.code(), Some(0 | 141)),
            "udm {args:?}: {:?} {err}",
            out.status
        );
    }
}
