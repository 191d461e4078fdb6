//! Every personality takes a device as the kernel's tools do: its name,
//! `/dev/mapper/NAME` (`$DM_DEV_DIR/mapper/NAME`, here the server's block
//! node link), the node it links to, and udm's own file for it in the
//! mapper directory (`cli::devarg`). Needs root, /dev/fuse and loop
//! devices, as tests/mapper_block.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::*;

struct Env {
    dir: tempfile::TempDir,
    ctl: PathBuf,
    files: PathBuf,
    dev: PathBuf,
    srv: Option<UdmServe>,
}

impl Env {
    fn start(tag: &str) -> Env {
        need("losetup");
        let dir = scratch(tag);
        let d = dir.path().canonicalize().unwrap();
        let (ctl, files, dev) = (d.join("ctl"), d.join("files"), d.join("dev"));
        std::fs::create_dir_all(dev.join("mapper")).unwrap();
        let args: Vec<String> = [
            "--control",
            &ctl.display().to_string(),
            "--mapper-dir",
            &files.display().to_string(),
            "--mapper-block",
            &dev.join("mapper").display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let srv = UdmServe::start(&d.join("nbd.sock"), &args);
        wait_for("the control socket", Duration::from_secs(10), || {
            ctl.exists()
        });
        Env {
            dir,
            ctl,
            files,
            dev,
            srv: Some(srv),
        }
    }

    fn tool(&self, argv0: &str, args: &[&str]) -> Output {
        udm()
            .arg(argv0)
            .args(args)
            .env("UDM_CONTROL", &self.ctl)
            .env("DM_DEV_DIR", &self.dev)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    /// The four spellings of device `name`, each a string a script may
    /// give: the name, `$DM_DEV_DIR/mapper/NAME`, the loop node it links
    /// to, the mapper directory's file.
    fn spellings(&self, name: &str) -> Vec<String> {
        let link = self.dev.join("mapper").join(name);
        wait_for("the block node", Duration::from_secs(10), || link.exists());
        let node = std::fs::canonicalize(&link).unwrap();
        assert!(
            node.to_string_lossy().starts_with("/dev/loop"),
            "{}",
            node.display()
        );
        vec![
            name.to_string(),
            link.display().to_string(),
            node.display().to_string(),
            self.files.join(name).display().to_string(),
        ]
    }

    fn exists(&self, name: &str) -> bool {
        self.tool("dmsetup", &["info", name]).status.success()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(s) = self.srv.take() {
            s.stop();
        }
    }
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn image(d: &Path, name: &str, mib: usize) -> PathBuf {
    write_file(d, name, &fast_bytes(3, mib << 20))
}

#[test]
fn dmsetup_takes_a_name_a_mapper_path_a_node_and_a_file() {
    let e = Env::start("devpaths-dm");
    let img = image(e.dir.path(), "d.img", 4);
    let t = format!("0 8192 linear {} 0", img.display());
    ok(e.tool("dmsetup", &["create", "v", "--table", &t]));
    for s in e.spellings("v") {
        let info = ok(e.tool("dmsetup", &["info", &s]));
        assert!(info.contains("Name:              v"), "{s}: {info}");
        let table = ok(e.tool("dmsetup", &["table", &s]));
        assert!(table.starts_with("0 8192 linear"), "{s}: {table}");
        ok(e.tool("dmsetup", &["status", &s]));
        ok(e.tool("dmsetup", &["suspend", &s]));
        ok(e.tool("dmsetup", &["resume", &s]));
        ok(e.tool("dmsetup", &["message", &s, "0", "@cancel_deferred_remove"]));
    }
    // The literal /dev/mapper/NAME too, whatever DM_DEV_DIR says.
    ok(e.tool("dmsetup", &["info", "/dev/mapper/v"]));
    // A path that is no device is named in the error.
    let o = e.tool("dmsetup", &["info", "/etc/hostname"]);
    assert!(!o.status.success());
    assert!(
        show(&o).contains("'/etc/hostname' is not a udm device"),
        "{}",
        show(&o)
    );
    let file = e.files.join("v").display().to_string();
    ok(e.tool("dmsetup", &["remove", &file]));
    assert!(!e.exists("v"));
}

#[test]
fn cryptsetup_status_and_close_take_every_spelling() {
    let e = Env::start("devpaths-cs");
    let img = image(e.dir.path(), "c.img", 4);
    let key = write_file(e.dir.path(), "key", &[7u8; 64]);
    let open = |name: &str| {
        ok(e.tool(
            "cryptsetup",
            &[
                "open",
                "--type",
                "plain",
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "512",
                "--key-file",
                &key.display().to_string(),
                &img.display().to_string(),
                name,
            ],
        ))
    };
    open("c");
    let spellings = e.spellings("c");
    for s in &spellings {
        let st = ok(e.tool("cryptsetup", &["status", s]));
        assert!(st.contains("is active"), "{s}: {st}");
        assert!(st.contains("type:    PLAIN"), "{s}: {st}");
    }
    // close by each spelling but the name (dracut closes /dev/mapper/NAME).
    for i in 1..4 {
        open("c2");
        let s = e.spellings("c2")[i].clone();
        ok(e.tool("cryptsetup", &["close", &s]));
        assert!(!e.exists("c2"), "close {s} left c2");
    }
    ok(e.tool("cryptsetup", &["close", "c"]));
    assert!(!e.exists("c"));
}

#[test]
fn integritysetup_status_and_close_take_every_spelling() {
    let e = Env::start("devpaths-int");
    let img = image(e.dir.path(), "i.img", 8);
    let p = img.display().to_string();
    ok(e.tool("integritysetup", &["format", "-q", &p]));
    for (i, s) in ["name", "link", "node", "file"].iter().enumerate() {
        let name = format!("i{i}");
        ok(e.tool("integritysetup", &["open", &p, &name]));
        let spelled = e.spellings(&name)[i].clone();
        let st = ok(e.tool("integritysetup", &["status", &spelled]));
        assert!(st.contains("is active"), "{s}: {st}");
        ok(e.tool("integritysetup", &["close", &spelled]));
        assert!(!e.exists(&name), "close by {s} left {name}");
    }
}
