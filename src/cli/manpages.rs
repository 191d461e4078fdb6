//! `udm man [DIR]` and `udm completions SHELL`: manual pages and shell
//! completions generated from the clap definitions `--help` prints, so the
//! three can never disagree. The personalities (`udm cryptsetup`,
//! `udm dmsetup`) parse their own argv; their pages carry their usage text
//! (the caller attaches it as the subcommand's long after-help).

use std::path::Path;

/// Write a page for `cmd` and every visible subcommand at any depth into
/// `dir` (`udm.1`, `udm-serve.1`, `udm-luks-format.1`, ...) and list them;
/// without `dir`, print `udm.1` on stdout.
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> i32 {
    let Some(dir) = dir else {
        let mut out = std::io::stdout().lock();
        return match clap_mangen::Man::new(cmd).render(&mut out) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("udm man: cannot write the page: {e}");
                1
            }
        };
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("udm man: cannot create {}: {e}", dir.display());
        return 1;
    }
    if let Err(e) = clap_mangen::generate_to(cmd, dir) {
        eprintln!(
            "udm man: cannot write pages into {}: {e} (is it writable?)",
            dir.display()
        );
        return 1;
    }
    let mut pages: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("udm") && n.ends_with(".1"))
        .collect();
    pages.sort();
    for p in pages {
        println!("{}", dir.join(p).display());
    }
    0
}

/// The completion script for `shell` on stdout.
pub fn completions(mut cmd: clap::Command, shell: clap_complete::Shell) -> i32 {
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
    0
}
