//! `udm man` and `udm completions` come from the same clap definitions as
//! `--help`: every command `udm --help` lists (and every `udm luks` and
//! `udm table` command) has a page, and the bash completion offers each.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::*;

/// The commands a `--help` text lists under "Commands:" (without `help`).
fn commands_of(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

#[test]
fn every_command_has_a_manual_page() {
    let d = scratch("udm-man-");
    let dir = d.path().join("man1");
    let listed = run_text(udm().arg("man").arg(&dir));
    let top = commands_of(&run_text(udm().arg("--help")));
    assert!(
        top.len() >= 10 && top.contains("serve") && top.contains("man"),
        "{top:?}"
    );
    let mut want = vec!["udm".to_string()];
    for c in &top {
        want.push(format!("udm-{c}"));
        let sub = commands_of(&run_text(udm().args([c.as_str(), "--help"])));
        want.extend(sub.iter().map(|s| format!("udm-{c}-{s}")));
    }
    assert!(want.iter().any(|w| w == "udm-luks-format"), "{want:?}");
    for w in &want {
        let page = dir.join(format!("{w}.1"));
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|e| panic!("no page {}: {e}\nlisted:\n{listed}", page.display()));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{w}: not roff"
        );
        assert!(
            listed.contains(&page.display().to_string()),
            "{w} not listed"
        );
    }
    // The options of --help are in the page, and the personalities' pages
    // carry their own usage.
    let serve = std::fs::read_to_string(dir.join("udm-serve.1")).unwrap();
    for opt in ["pidfile", "print\\-uri", "crypttab", "socket\\-mode"] {
        assert!(serve.contains(opt), "udm-serve.1 lacks {opt}");
    }
    let dm = std::fs::read_to_string(dir.join("udm-dmsetup.1")).unwrap();
    assert!(
        dm.contains("splitname") && dm.contains("remove_all"),
        "{dm}"
    );
    let cs = std::fs::read_to_string(dir.join("udm-cryptsetup.1")).unwrap();
    assert!(cs.contains("luksFormat"), "{cs}");
    // man(1) renders it, when installed.
    if std::path::Path::new("/usr/bin/man").exists() {
        let o = Command::new("man")
            .arg("-l")
            .arg(dir.join("udm-serve.1"))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && text.contains("--pidfile"),
            "{}",
            show(&o)
        );
    }
    // Without a directory: the top page on stdout.
    let top_page = run_text(udm().arg("man"));
    assert!(top_page.contains(".TH udm"), "{top_page}");
}

#[test]
fn completions_name_every_command_and_load_in_their_shells() {
    let bash = run_text(udm().args(["completions", "bash"]));
    for c in commands_of(&run_text(udm().arg("--help"))) {
        assert!(bash.contains(&c), "bash completion lacks {c}");
    }
    assert!(bash.contains("--print-uri") && bash.contains("--crypttab"));
    // bash parses it and registers the completion.
    let d = scratch("udm-compl-");
    let f = write_file(d.path(), "udm.bash", bash.as_bytes());
    let o = run(Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p udm", f.display())));
    assert!(String::from_utf8_lossy(&o.stdout).contains("udm"));
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let s = run_text(udm().args(["completions", shell]));
        assert!(s.contains("serve") && s.contains("dmsetup"), "{shell}");
    }
    let o = udm().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("tcsh"));
}
