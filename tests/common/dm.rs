//! A `udm serve` with a control socket and `udm dmsetup` against it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::{show, udm, UdmServe};

pub struct DmServer {
    pub serve: UdmServe,
    pub ctl: PathBuf,
}

impl DmServer {
    /// `udm serve` on `dir/nbd.sock` with its control socket at
    /// `dir/control`, and `extra` arguments (devices, options).
    pub fn start(dir: &Path, extra: &[&str]) -> DmServer {
        let ctl = dir.join("control");
        let mut args: Vec<String> = vec!["--control".into(), ctl.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let serve = UdmServe::start(&dir.join("nbd.sock"), &args);
        DmServer { serve, ctl }
    }

    /// `udm dmsetup --control CTL args...`.
    pub fn cmd(&self) -> Command {
        let mut c = udm();
        c.arg("dmsetup").arg("--control").arg(&self.ctl);
        c
    }

    /// Run `udm dmsetup args`, whatever its outcome.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run udm dmsetup")
    }

    /// Run it with `input` on stdin.
    pub fn run_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run udm dmsetup");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// Run it; it must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "udm dmsetup {args:?} failed:\n{}",
            show(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Run it; it must fail with dmsetup's exit code 1; its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert_eq!(
            o.status.code(),
            Some(1),
            "udm dmsetup {args:?} should fail with 1:\n{}",
            show(&o)
        );
        String::from_utf8_lossy(&o.stderr).into_owned()
    }

    pub fn uri(&self, export: &str) -> String {
        self.serve.uri(export)
    }

    /// `status --json` of one device.
    pub fn status_json(&self, name: &str) -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["status", "--json", name])).unwrap();
        v["devices"][0].clone()
    }
}
