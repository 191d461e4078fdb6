//! `udm serve`: build the named devices and export each over NBD until
//! SIGINT/SIGTERM. The first device named on the command line is also the
//! default export (`""`), as a client that names no export expects.

use std::path::PathBuf;
use std::sync::Arc;

use zeroize::Zeroizing;

use crate::mapper::{BuildOptions, DeviceSpec, Registry};
use crate::nbd::{Export, Listen, ServerConfig};
use crate::targets::TargetOptions;

/// Arguments of `udm serve`.
#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("listen_on").required(true).args(["socket", "listen"]))]
pub struct Args {
    /// Serve on this Unix socket path.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Serve on TCP, e.g. `127.0.0.1:10809` (port 10809 if omitted).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// A device defined by a dmsetup table file. Table device arguments may
    /// be paths or `@NAME` of another device of this server.
    #[arg(long = "table", value_name = "NAME=FILE")]
    pub tables: Vec<String>,
    /// A file or block device served as it is.
    #[arg(long = "file", value_name = "NAME=PATH")]
    pub files: Vec<String>,
    /// A LUKS1/LUKS2 volume, opened with the passphrase from --key-file or
    /// asked on the terminal.
    #[arg(long = "luks", value_name = "NAME=IMAGE")]
    pub luks: Vec<String>,
    /// Passphrase file for --luks (whole content; `-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Volumes from a crypttab file (systemd's format: NAME DEVICE
    /// KEYFILE OPTIONS), each served under its NAME; passphrases are asked
    /// on the terminal for lines whose key file is `none`.
    #[arg(long, value_name = "FILE")]
    pub crypttab: Option<PathBuf>,
    /// Try LUKS passphrases even on keyslots whose KDF cost is above
    /// udm's limit (see `udm cryptsetup --help`).
    #[arg(long)]
    pub no_kdf_limit: bool,
    /// Detached LUKS header for --luks (as cryptsetup's --header).
    #[arg(long, value_name = "FILE")]
    pub header: Option<PathBuf>,
    /// Export every device read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Worker threads executing requests (default: number of cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Threads a crypt target may split one request over (default: cores).
    #[arg(long, default_value_t = 0)]
    pub crypt_threads: usize,
    /// Total in-flight buffer memory for all devices, e.g. `32M`
    /// (default: 2 % of RAM).
    #[arg(long, value_name = "SIZE")]
    pub memory_budget: Option<String>,
    /// Open files with O_DIRECT (bypass the page cache).
    #[arg(long)]
    pub direct: bool,
    /// Never map files on tmpfs (by default they are mapped, so the crypt
    /// target encrypts straight into the file's pages).
    #[arg(long)]
    pub no_mmap: bool,
}

/// Split `NAME=VALUE`.
fn name_value(s: &str, flag: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, v)) if !n.is_empty() && !v.is_empty() => Ok((n.to_string(), v.to_string())),
        _ => Err(format!("{flag} expects NAME=VALUE, got '{s}'")),
    }
}

/// Position of an option value on the command line, to keep the user's
/// order of exports across the different flags.
fn position(value: &str) -> usize {
    std::env::args()
        .position(|a| a == value || a.ends_with(&format!("={value}")))
        .unwrap_or(usize::MAX)
}

pub fn run(a: Args) -> i32 {
    crate::cli::init_logging();
    match serve(a) {
        Ok(()) => 0,
        Err(e) => {
            crate::cli::report_error("serve", &e);
            1
        }
    }
}

fn serve(a: Args) -> Result<(), String> {
    let mut specs: Vec<(usize, String, DeviceSpec)> = Vec::new();
    for t in &a.tables {
        let (name, file) = name_value(t, "--table")?;
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("--table {name}: cannot read {file}: {e}"))?;
        specs.push((
            position(t),
            name,
            DeviceSpec::Table {
                text: Zeroizing::new(text),
                source: file,
            },
        ));
    }
    for f in &a.files {
        let (name, path) = name_value(f, "--file")?;
        specs.push((position(f), name, DeviceSpec::File(PathBuf::from(path))));
    }
    for l in &a.luks {
        let (name, image) = name_value(l, "--luks")?;
        let text = crate::luks::activation_table(
            &name,
            &image,
            a.header.as_deref(),
            a.key_file.as_deref(),
        )
        .map_err(|e| format!("--luks: {e}"))?;
        specs.push((
            position(l),
            name,
            DeviceSpec::Table {
                text,
                source: format!("LUKS volume {image}"),
            },
        ));
    }
    let mut read_only_devices = Vec::new();
    if let Some(ct) = &a.crypttab {
        let text = std::fs::read_to_string(ct)
            .map_err(|e| format!("--crypttab: cannot read {}: {e}", ct.display()))?;
        let entries = crate::luks::crypttab::parse(&text, ct).map_err(|e| e.to_string())?;
        for e in entries {
            for n in &e.notes {
                tracing::info!("{}:{} ({}): {n}", ct.display(), e.line, e.name);
            }
            let text = e.table(a.no_kdf_limit).map_err(|x| x.to_string())?;
            if e.read_only {
                read_only_devices.push(e.name.clone());
            }
            specs.push((
                position(&ct.display().to_string()).saturating_add(e.line),
                e.name.clone(),
                DeviceSpec::Table {
                    text,
                    source: format!("{} line {}", ct.display(), e.line),
                },
            ));
        }
    }
    if specs.is_empty() {
        return Err(
            "nothing to serve: give at least one --table, --file, --luks or --crypttab".into(),
        );
    }
    specs.sort_by_key(|(p, _, _)| *p);

    let budget = match &a.memory_budget {
        Some(s) => {
            Some(crate::core::units::parse_size(s).map_err(|e| format!("--memory-budget: {e}"))?)
        }
        None => None,
    };
    let listen = match (&a.socket, &a.listen) {
        (Some(p), _) => Listen::Unix(p.clone()),
        // The server adds the default port to an address without one.
        (None, Some(h)) => Listen::Tcp(h.clone()),
        (None, None) => unreachable!("clap requires one of --socket/--listen"),
    };
    serve_specs(
        specs.into_iter().map(|(_, n, s)| (n, s)).collect(),
        listen,
        &Settings {
            read_only: a.read_only,
            direct: a.direct,
            no_mmap: a.no_mmap,
            threads: a.threads,
            crypt_threads: a.crypt_threads,
            memory_budget: budget,
            read_only_devices,
        },
    )
}

/// Server-wide settings shared by `serve` and `demo`.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub read_only: bool,
    pub direct: bool,
    pub no_mmap: bool,
    pub threads: usize,
    pub crypt_threads: usize,
    pub memory_budget: Option<u64>,
    /// Devices exported read-only although the server is not (crypttab's
    /// `readonly`).
    pub read_only_devices: Vec<String>,
}

/// Build the devices and serve them until a signal arrives.
pub fn serve_specs(
    specs: Vec<(String, DeviceSpec)>,
    listen: Listen,
    st: &Settings,
) -> Result<(), String> {
    let registry = Registry::build(
        specs,
        BuildOptions {
            read_only: st.read_only,
            direct: st.direct,
            no_mmap: st.no_mmap,
            target: TargetOptions {
                crypt_threads: st.crypt_threads,
            },
        },
    )?;
    for e in &registry.entries {
        match &e.mapped {
            Some(m) => tracing::info!(
                "device {}: {} bytes, table:\n{}",
                e.name,
                e.device.size(),
                m.table_text(false).trim_end()
            ),
            None => tracing::info!("device {}: {} bytes (file)", e.name, e.device.size()),
        }
    }
    let exports = registry
        .entries
        .iter()
        .map(|e| Export {
            name: e.name.clone(),
            description: match &e.mapped {
                Some(_) => format!("udm mapped device {}", e.name),
                None => format!("udm file {}", e.name),
            },
            device: Arc::clone(&e.device),
            read_only: st.read_only || st.read_only_devices.contains(&e.name),
        })
        .collect();
    crate::nbd::server::serve_with(
        ServerConfig {
            listen,
            exports,
            threads: st.threads,
        },
        crate::nbd::server::ServeOptions {
            memory_budget: st.memory_budget,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}
