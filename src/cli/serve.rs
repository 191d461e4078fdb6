//! `udm serve`: build the named devices and export each over NBD until
//! SIGINT/SIGTERM. The first device named on the command line is also the
//! default export (`""`), as a client that names no export expects.
//!
//! Every device is a runtime device (`mapper::Devices`): the ones given on
//! the command line are created, loaded and resumed at start, exactly as
//! `udm dmsetup create` would, and the control socket (`--control`)
//! manages them and any others while the server runs.

use std::path::PathBuf;
use std::sync::Arc;

use zeroize::Zeroizing;

use crate::control::{self, ControlServer, Service};
use crate::engine::Engine;
use crate::mapper::{BuildOptions, DeviceSpec, Devices};
use crate::nbd::export::{parse_allow_list, AccessPolicy, BudgetPolicy};
use crate::nbd::{ExportSet, Listen, ServerConfig};
use crate::targets::TargetOptions;

use super::daemon::{normalised_line, CrypttabSource, Pidfile, Reloader};

/// Arguments of `udm serve`.
#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("listen_on").args(["socket", "listen"]))]
pub struct Args {
    /// Serve on this Unix socket path. One of --socket and --listen is
    /// needed unless a service manager passes the socket (socket
    /// activation: LISTEN_FDS, the control socket named `control`).
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
    /// A TrueCrypt/VeraCrypt volume (cryptsetup's `open --type tcrypt`);
    /// a cipher cascade is served as NAME over NAME_1 (over NAME_2), as
    /// cryptsetup stacks it.
    #[arg(long = "tcrypt", value_name = "NAME=IMAGE")]
    pub tcrypt: Vec<String>,
    /// A BitLocker volume (cryptsetup's `open --type bitlk`), opened
    /// through its clear key if it has one, else with the passphrase,
    /// recovery password or startup key (.BEK) of --key-file.
    #[arg(long = "bitlk", value_name = "NAME=IMAGE")]
    pub bitlk: Vec<String>,
    /// For --bitlk: map a volume cryptsetup refuses (its encryption never
    /// finished, or it encrypts used space only) read-only, crypt where
    /// its metadata says encrypted and linear where it says clear.
    #[arg(long)]
    pub allow_partial_bitlk: bool,
    /// For --tcrypt: map a TrueCrypt legacy volume cryptsetup refuses
    /// (blowfish, CBC cascades) with udm's own crypt line, which the
    /// kernel cannot load.
    #[arg(long)]
    pub allow_tcrypt_legacy: bool,
    /// A FileVault2 volume (cryptsetup's `open --type fvault2`).
    #[arg(long = "fvault2", value_name = "NAME=IMAGE")]
    pub fvault2: Vec<String>,
    /// Passphrase file for --luks, --bitlk and --fvault2 (whole content;
    /// `-` for stdin), and for --tcrypt (its first line, as systemd reads
    /// a TrueCrypt key file); without it the passphrase is asked.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// A TrueCrypt keyfile for --tcrypt, mixed in in the order given
    /// (cryptsetup's `--key-file` for tcrypt, crypttab's tcrypt-keyfile=).
    #[arg(long = "tcrypt-keyfile", value_name = "FILE")]
    pub tcrypt_keyfiles: Vec<PathBuf>,
    /// For --tcrypt: try only KDFs whose hash name contains this (as
    /// cryptsetup's --hash for tcrypt); each KDF tried costs a full
    /// key derivation, so naming it saves seconds per volume.
    #[arg(long, value_name = "HASH")]
    pub hash: Option<String>,
    /// VeraCrypt's Personal Iterations Multiplier for --tcrypt.
    #[arg(long, value_name = "PIM")]
    pub veracrypt_pim: Option<u32>,
    /// Accepted for cryptsetup's sake: VeraCrypt volumes are looked for
    /// unless --disable-veracrypt.
    #[arg(long, conflicts_with = "disable_veracrypt")]
    pub veracrypt: bool,
    /// --tcrypt finds TrueCrypt volumes only (not VeraCrypt's KDFs).
    #[arg(long)]
    pub disable_veracrypt: bool,
    /// --tcrypt serves the hidden volume (with the hidden volume's
    /// passphrase).
    #[arg(long)]
    pub tcrypt_hidden: bool,
    /// --tcrypt serves a system (boot) volume: the header is in sector 62.
    #[arg(long)]
    pub tcrypt_system: bool,
    /// --tcrypt reads the backup header (at the end of the device).
    #[arg(long)]
    pub tcrypt_backup: bool,
    /// Volumes from a crypttab file (systemd's format: NAME DEVICE
    /// KEYFILE OPTIONS), each served under its NAME; passphrases are asked
    /// on the terminal for lines whose key file is `none`.
    #[arg(long, value_name = "FILE")]
    pub crypttab: Option<PathBuf>,
    /// Try passphrases even where the header's KDF cost is above udm's
    /// limit (LUKS keyslots, FileVault2 and BitLocker headers, a
    /// VeraCrypt PIM; see `udm cryptsetup --help`), for --luks, --tcrypt,
    /// --bitlk, --fvault2 and --crypttab.
    #[arg(long)]
    pub no_kdf_limit: bool,
    /// Open LUKS volumes whose header asks for the null cipher or ECB
    /// (refused by default: an edited header can ask for them).
    #[arg(long)]
    pub allow_weak_cipher: bool,
    /// Detached header for --luks and --tcrypt (as cryptsetup's --header).
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
    /// Total metadata memory all devices may pin for as long as they are
    /// active because their on-disk format sizes it (snapshot chunk
    /// buffers and exception tables, integrity journals kept in memory),
    /// e.g. `4G` (default: half of RAM). A device asking for more than is
    /// left is refused at activation.
    #[arg(long, value_name = "SIZE")]
    pub pinned_memory: Option<String>,
    /// Open files with O_DIRECT (bypass the page cache).
    #[arg(long)]
    pub direct: bool,
    /// Never map files on tmpfs (by default they are mapped, so the crypt
    /// target encrypts straight into the file's pages).
    #[arg(long)]
    pub no_mmap: bool,
    /// How files on a disk filesystem and block devices are read and
    /// written: `uring` (one io_uring per file, no thread waits for the
    /// disk; the default where the kernel has it) or `pwrite` (the
    /// syscalls, on workers sized from the queue depth). Default: the
    /// `UDM_FILE_IO` environment variable, else `uring`.
    #[arg(long, value_name = "uring|pwrite")]
    pub file_io: Option<crate::store::FileIo>,
    /// Most open client connections (default 16384, or what the descriptor
    /// limit allows). At the cap the oldest unfinished handshake is dropped
    /// to make room; a client is refused only when all are past it.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most lines of a table created or loaded through the control socket
    /// (default 16384).
    #[arg(long, value_name = "N")]
    pub max_table_lines: Option<usize>,
    /// Most connections of one client: a TCP address (an IPv6 /64) or a
    /// Unix uid other than root's and the server's (default: a quarter of
    /// --max-connections).
    #[arg(long, value_name = "N")]
    pub max_connections_per_client: Option<usize>,
    /// Seconds a client may take to finish the handshake.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub handshake_timeout: f64,
    /// Drop a client with nothing in flight and no request for this many
    /// seconds (default: never).
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<f64>,
    /// Drop a client whose replies make no progress (it stopped reading)
    /// for this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub reply_timeout: f64,
    /// Drop a client whose write payload makes no progress for this many
    /// seconds (its buffer holds export memory meanwhile).
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub payload_timeout: f64,
    /// Microseconds an event loop keeps polling for the next request after
    /// its last event before it sleeps (0: sleep at once). A wake-up on
    /// another core costs tens of microseconds on a virtual machine, more
    /// than a small request; polling trades that for CPU time, only while
    /// requests keep coming.
    #[arg(long, value_name = "USECS", default_value_t = 50)]
    pub poll_us: u64,
    /// Most requests one connection may have in flight.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_inflight_requests: u32,
    /// Most bytes one connection may have in flight (payloads and replies
    /// not yet sent), e.g. `64M`.
    #[arg(long, value_name = "SIZE", default_value = "64M")]
    pub max_inflight_bytes: String,
    /// Event loop threads for the sockets (default: cores).
    #[arg(long, default_value_t = 0)]
    pub net_threads: usize,
    /// TLS (NBD STARTTLS): off, on (offered) or require, as nbdkit.
    #[arg(long, value_name = "off|on|require", default_value = "off")]
    pub tls: String,
    /// Directory with ca-cert.pem, server-cert.pem, server-key.pem (the
    /// layout nbdkit and qemu use).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Accept only TLS clients with a certificate signed by ca-cert.pem.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Who may use an export: NAME=ENTRY[,ENTRY...] with entries `unix`,
    /// `uid:N` (Unix socket clients of that user), `tls`, an IP address or
    /// ADDRESS/PREFIX. The rule belongs to the name: it also binds a device
    /// of that name created, renamed or re-created later.
    #[arg(long = "allow", value_name = "NAME=LIST")]
    pub allow: Vec<String>,
    /// The device a client that gives no export name (`""`) gets
    /// (default: the first on the command line). Bound to the name: when
    /// no device has it, such clients get none rather than another one.
    #[arg(long, value_name = "NAME")]
    pub default_export: Option<String>,
    /// The rule of every name without an --allow of its own (default:
    /// every client that reaches the server).
    #[arg(long, value_name = "LIST")]
    pub allow_default: Option<String>,
    /// Mode of the --socket file, octal (default 0600: the server's user
    /// and root only; it never depends on the umask).
    #[arg(long, value_name = "MODE")]
    pub socket_mode: Option<String>,
    /// The control socket (`udm dmsetup` talks to it). Default:
    /// $UDM_CONTROL, else /run/udm/control as root, else
    /// $XDG_RUNTIME_DIR/udm/control; a default path another server holds
    /// is skipped with a warning.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Run without a control socket (devices are fixed at start).
    #[arg(long, conflicts_with = "control")]
    pub no_control: bool,
    /// Serve every device's counters as Prometheus text on HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Who may scrape --metrics: IP addresses or ADDRESS/PREFIX networks,
    /// comma-separated (default: loopback only, 127.0.0.0/8,::1); others
    /// get 403.
    #[arg(long, value_name = "LIST", requires = "metrics")]
    pub metrics_allow: Option<String>,
    /// Start devices with latency histograms off (counters stay on;
    /// `dmsetup message NAME 0 @stats_histograms on` turns them on).
    #[arg(long)]
    pub no_histograms: bool,
    /// Do not compile stacked tables flat (each layer is then one more
    /// call per request); for measuring what flattening saves.
    #[arg(long, hide = true)]
    pub no_flatten: bool,
    /// Also show every device as a regular file DIR/NAME (FUSE; created if
    /// missing, e.g. /run/udm/mapper, or /dev/mapper in a private mount
    /// namespace). A dead mount a killed server left there is cleared.
    #[arg(long, value_name = "DIR")]
    pub mapper_dir: Option<PathBuf>,
    /// Also give every device a block node: a loop device on its file in
    /// --mapper-dir, and DIR/NAME a symlink to it, as /dev/mapper/NAME is
    /// on a udev system (created if missing; e.g. /dev/mapper in a private
    /// mount namespace, with --mapper-dir a private directory). The node is
    /// there when a create replies and goes before a remove does; an open
    /// node makes a remove fail as busy. Loop devices and links a killed
    /// server left are cleared.
    #[arg(long, value_name = "DIR", requires = "mapper_dir")]
    pub mapper_block: Option<PathBuf>,
    /// Write the server's pid to FILE once it is ready (devices served,
    /// sockets listening); removed on exit. A FILE naming a running
    /// process is refused.
    #[arg(long, value_name = "FILE")]
    pub pidfile: Option<PathBuf>,
    /// Print the NBD URI of each device on stdout once the server is
    /// ready, one per line.
    #[arg(long)]
    pub print_uri: bool,
}

/// Split `NAME=VALUE`.
fn name_value(s: &str, flag: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((n, v)) if !n.is_empty() && !v.is_empty() => Ok((n.to_string(), v.to_string())),
        _ => Err(format!("{flag} expects NAME=VALUE, got '{s}'")),
    }
}

/// `ro:NAME=VALUE` (a read-only export) or `NAME=VALUE`.
fn export_value(s: &str, flag: &str) -> Result<(String, String, bool), String> {
    match s.strip_prefix("ro:") {
        Some(rest) => name_value(rest, flag).map(|(n, v)| (n, v, true)),
        None => name_value(s, flag).map(|(n, v)| (n, v, false)),
    }
}

fn seconds(v: f64, flag: &str) -> Result<std::time::Duration, String> {
    if v.is_finite() && v > 0.0 && v < 1e9 {
        Ok(std::time::Duration::from_secs_f64(v))
    } else {
        Err(format!(
            "{flag} expects a positive number of seconds, got {v}"
        ))
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
    crate::mem::secret::forbid_core_dumps_or_warn();
    match serve(a) {
        Ok(()) => 0,
        Err(e) => {
            crate::cli::report_error("serve", &e);
            1
        }
    }
}

/// Position on the command line, name and spec of each device
/// (`--table`, `--file`, `--luks`, `--crypttab`), and the names given
/// `ro:`.
type Specs = (Vec<(usize, String, DeviceSpec)>, Vec<String>);

fn serve(a: Args) -> Result<(), String> {
    if let Some(io) = a.file_io {
        crate::store::file_io::set_default_io(io);
    }
    let (mut specs, mut read_only_exports) = table_and_file_specs(&a)?;
    foreign_specs(&a, &mut specs, &mut read_only_exports)?;
    let crypttab = crypttab_specs(&a, &mut specs, &mut read_only_exports)?;
    if specs.is_empty() && a.no_control {
        return Err(
            "nothing to serve: give at least one --table, --file, --luks, --tcrypt, --bitlk, \
             --fvault2 or --crypttab, or a control socket to create devices through"
                .into(),
        );
    }
    specs.sort_by_key(|(p, _, _)| *p);

    let budget = match &a.memory_budget {
        Some(s) => {
            Some(crate::core::units::parse_size(s).map_err(|e| format!("--memory-budget: {e}"))?)
        }
        None => None,
    };
    let pinned_memory = a
        .pinned_memory
        .as_deref()
        .map(|s| crate::core::units::parse_size(s).map_err(|e| format!("--pinned-memory: {e}")))
        .transpose()?;
    let (listen, control_socket) = listen_on(&a)?;
    let policy = access_policy(&a, read_only_exports)?;
    let tls = crate::nbd::TlsOptions {
        mode: a.tls.parse()?,
        certificates: a.tls_certificates.clone(),
        verify_peer: a.tls_verify_peer,
    };
    check_tls(&tls, &policy)?;
    let socket_mode = a
        .socket_mode
        .as_deref()
        .map(parse_socket_mode)
        .transpose()?;
    let net = net_options(&a, tls.mode)?;
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
            pinned_memory,
            policy,
            socket_mode,
            max_connections: a.max_connections,
            max_table_lines: a.max_table_lines,
            net_threads: a.net_threads,
            net,
            tls,
            control: if a.no_control {
                ControlPath::Off
            } else {
                match a.control {
                    Some(p) => ControlPath::Given(p),
                    None => ControlPath::Default,
                }
            },
            metrics: a.metrics,
            metrics_allow: crate::nbd::export::parse_address_list(
                a.metrics_allow.as_deref().unwrap_or(DEFAULT_METRICS_ALLOW),
            )
            .map_err(|e| format!("--metrics-allow: {e}"))?,
            histograms: !a.no_histograms,
            flatten: !a.no_flatten,
            default_export: a.default_export.clone(),
            mapper_dir: a.mapper_dir.clone(),
            mapper_block: a.mapper_block.clone(),
            service: ServiceOptions {
                pidfile: a.pidfile.clone(),
                print_uri: a.print_uri,
                control_socket,
                crypttab,
            },
        },
    )
}

/// Where to listen: the sockets a service manager passed (NBD and
/// control), or `--socket`/`--listen`; both at once is an error.
fn listen_on(a: &Args) -> Result<(Listen, Option<Arc<std::os::unix::net::UnixListener>>), String> {
    let activated = super::daemon::take_activated()?;
    let listen = match (&a.socket, &a.listen, activated.nbd) {
        (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
            return Err(
                "--socket/--listen with an NBD socket passed by the service manager: \
                 give one of them (drop the option, or the socket unit's NBD socket)"
                    .into(),
            )
        }
        (_, _, Some(l)) => l,
        (Some(p), _, None) => Listen::Unix(p.clone()),
        // The server adds the default port to an address without one.
        (None, Some(h), None) => Listen::Tcp(h.clone()),
        (None, None, None) => {
            return Err(
                "where to listen: give --socket PATH or --listen HOST[:PORT] (or \
                 start udm from a socket unit)"
                    .into(),
            )
        }
    };
    let control_socket = activated.control.map(Arc::new);
    if control_socket.is_some() && (a.no_control || a.control.is_some()) {
        return Err(
            "--control/--no-control with a control socket passed by the service \
             manager: drop the option, or the socket unit's 'control' socket"
                .into(),
        );
    }
    Ok((listen, control_socket))
}

fn table_and_file_specs(a: &Args) -> Result<Specs, String> {
    let mut specs: Vec<(usize, String, DeviceSpec)> = Vec::new();
    let mut read_only_exports = Vec::new();
    for t in &a.tables {
        let (name, file, ro) = export_value(t, "--table")?;
        if ro {
            read_only_exports.push(name.clone());
        }
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("--table {name}: cannot read {file}: {e}"))?;
        crate::luks::passphrase::warn_if_table_key_readable(std::path::Path::new(&file), &text);
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
        let (name, path, ro) = export_value(f, "--file")?;
        if ro {
            read_only_exports.push(name.clone());
        }
        specs.push((position(f), name, DeviceSpec::File(PathBuf::from(path))));
    }
    for l in &a.luks {
        let (name, image, ro) = export_value(l, "--luks")?;
        if ro {
            read_only_exports.push(name.clone());
        }
        let tables = crate::luks::activation_tables(
            &name,
            &image,
            a.header.as_deref(),
            a.key_file.as_deref(),
            a.allow_weak_cipher,
            a.no_kdf_limit,
        )
        .map_err(|e| format!("--luks: {e}"))?;
        // The volume's own device before its integrity device (NAME_dif)
        // in the export order, so it stays the default export.
        for (dev, text) in tables.into_iter().rev() {
            if ro && dev != name {
                read_only_exports.push(dev.clone());
            }
            specs.push((
                position(l),
                dev,
                DeviceSpec::Table {
                    text,
                    source: format!("LUKS volume {image}"),
                },
            ));
        }
    }
    Ok((specs, read_only_exports))
}

/// The `--tcrypt`, `--bitlk` and `--fvault2` volumes, each unlocked now
/// and served as the devices `cryptsetup open` would create (the
/// volume's own device first in the export order, so that it stays the
/// default export).
fn foreign_specs(
    a: &Args,
    specs: &mut Vec<(usize, String, DeviceSpec)>,
    read_only_exports: &mut Vec<String>,
) -> Result<(), String> {
    use crate::luks::foreign::activate;
    if a.allow_partial_bitlk && a.bitlk.is_empty() {
        return Err("--allow-partial-bitlk is for --bitlk volumes, and none is given".into());
    }
    if a.allow_tcrypt_legacy && a.tcrypt.is_empty() {
        return Err("--allow-tcrypt-legacy is for --tcrypt volumes, and none is given".into());
    }
    let key = crate::luks::passphrase::KeySource::file(a.key_file.as_deref());
    let tc = crate::luks::foreign::tcrypt::Params {
        hash: a.hash.clone(),
        veracrypt: !a.disable_veracrypt,
        pim: a.veracrypt_pim.unwrap_or(0),
        hidden: a.tcrypt_hidden,
        system: a.tcrypt_system,
        backup: a.tcrypt_backup,
        keyfiles: a.tcrypt_keyfiles.clone(),
        legacy: true,
        map_legacy: a.allow_tcrypt_legacy,
        cipher: None,
        no_cost_limit: a.no_kdf_limit,
    };
    let kinds: [(&str, &str, &Vec<String>); 3] = [
        ("--tcrypt", "TCRYPT", &a.tcrypt),
        ("--bitlk", "BITLK", &a.bitlk),
        ("--fvault2", "FVAULT2", &a.fvault2),
    ];
    for (flag, kind, values) in kinds {
        for v in values {
            let (name, image, ro) = export_value(v, flag)?;
            let device = PathBuf::from(&image);
            let r = activate::Request {
                name: &name,
                device: &device,
                header: if flag == "--tcrypt" {
                    a.header.as_deref()
                } else {
                    None
                },
                key: &key,
                tries: 3,
                flags: &[],
                no_cost_limit: a.no_kdf_limit,
            };
            let layers = match flag {
                "--tcrypt" => activate::open_tcrypt(&r, &tc),
                "--bitlk" => activate::open_bitlk_with(&r, a.allow_partial_bitlk),
                _ => activate::open_fvault2(&r),
            }
            .map_err(|e| format!("{flag} {name}: {kind} volume on {image}: {e}"))?;
            tracing::info!("{kind} volume {name} on {image} opened");
            for l in layers.into_iter().rev() {
                if ro || l.read_only {
                    read_only_exports.push(l.name.clone());
                }
                specs.push((
                    position(v),
                    l.name,
                    DeviceSpec::Table {
                        text: l.table,
                        source: format!("{kind} volume {image}"),
                    },
                ));
            }
        }
    }
    Ok(())
}

/// The crypttab's volumes; returns what SIGHUP needs to re-read it.
fn crypttab_specs(
    a: &Args,
    specs: &mut Vec<(usize, String, DeviceSpec)>,
    read_only_exports: &mut Vec<String>,
) -> Result<Option<CrypttabSource>, String> {
    let mut source = None;
    if let Some(ct) = &a.crypttab {
        let mut lines = std::collections::HashMap::new();
        let mut lower = std::collections::HashMap::new();
        let text = std::fs::read_to_string(ct)
            .map_err(|e| format!("--crypttab: cannot read {}: {e}", ct.display()))?;
        let entries = crate::luks::crypttab::parse(&text, ct).map_err(|e| e.to_string())?;
        for e in entries {
            for n in &e.notes {
                tracing::info!("{}:{} ({}): {n}", ct.display(), e.line, e.name);
            }
            let devs = e
                .devices(a.no_kdf_limit, a.allow_weak_cipher)
                .map_err(|x| x.to_string())?;
            lines.insert(e.name.clone(), normalised_line(&text, e.line));
            lower.insert(
                e.name.clone(),
                devs.iter()
                    .map(|d| d.name.clone())
                    .filter(|n| *n != e.name)
                    .collect(),
            );
            // The volume's own device first, so that the first line's is
            // the default export.
            for d in devs.into_iter().rev() {
                if e.read_only || d.read_only {
                    read_only_exports.push(d.name.clone());
                }
                specs.push((
                    position(&ct.display().to_string()).saturating_add(e.line),
                    d.name,
                    DeviceSpec::Table {
                        text: d.table,
                        source: format!("{} line {}", ct.display(), e.line),
                    },
                ));
            }
        }
        source = Some(CrypttabSource {
            path: ct.clone(),
            no_kdf_limit: a.no_kdf_limit,
            allow_weak_cipher: a.allow_weak_cipher,
            lines,
            lower,
        });
    }
    Ok(source)
}

/// The event loops' deadlines and per-connection caps.
fn net_options(a: &Args, tls: crate::nbd::TlsMode) -> Result<crate::nbd::NetOptions, String> {
    let max_bytes = crate::mem::parse_size(&a.max_inflight_bytes)
        .map_err(|e| format!("--max-inflight-bytes: {e}"))?;
    Ok(crate::nbd::NetOptions {
        handshake_timeout: seconds(a.handshake_timeout, "--handshake-timeout")?,
        idle_timeout: a
            .idle_timeout
            .map(|v| seconds(v, "--idle-timeout"))
            .transpose()?,
        reply_timeout: seconds(a.reply_timeout, "--reply-timeout")?,
        payload_timeout: seconds(a.payload_timeout, "--payload-timeout")?,
        max_connections_per_client: a.max_connections_per_client.map(|n| n.max(1)),
        unused_timeout: crate::nbd::NetOptions::default().unused_timeout,
        client: crate::engine::ClientLimits {
            max_requests: a.max_inflight_requests.max(1),
            max_bytes: max_bytes.max(1),
        },
        tls,
        busy_poll: std::time::Duration::from_micros(a.poll_us.min(1_000_000)),
    })
}

/// The access rules of `--allow`, `--allow-default` and `ro:NAME`.
fn access_policy(a: &Args, read_only: Vec<String>) -> Result<AccessPolicy, String> {
    let mut names = Vec::new();
    for entry in &a.allow {
        let (name, list) = name_value(entry, "--allow")?;
        let rules = parse_allow_list(&list).map_err(|e| format!("--allow {name}: {e}"))?;
        names.push((name, rules));
    }
    let default = match &a.allow_default {
        Some(l) => parse_allow_list(l).map_err(|e| format!("--allow-default: {e}"))?,
        None => Vec::new(),
    };
    Ok(AccessPolicy {
        names,
        read_only,
        default,
    })
}

/// TLS options that cannot do what they say are refused before any
/// device is opened. `--tls=on` with `--tls-verify-peer` lets a plain
/// client past the certificate check altogether, so it is refused unless
/// some rule names `tls` (`--allow NAME=tls`, `--allow-default tls`): the
/// legitimate mix where some exports need a verified certificate and the
/// others are open in plain text.
fn check_tls(tls: &crate::nbd::TlsOptions, policy: &AccessPolicy) -> Result<(), String> {
    crate::nbd::tls::check_options(tls)?;
    let names_tls = policy
        .names
        .iter()
        .map(|(_, r)| r)
        .chain(std::iter::once(&policy.default))
        .any(|r| r.contains(&crate::nbd::Allow::Tls));
    if names_tls && !tls.verify_peer {
        return Err(
            "an allow rule names 'tls', which admits only clients whose certificate the \
                    server verified: add --tls-verify-peer (with --tls=require and ca-cert.pem \
                    in --tls-certificates), or drop 'tls' from the rule"
                .into(),
        );
    }
    if tls.mode == crate::nbd::TlsMode::On && tls.verify_peer && !names_tls {
        return Err(
            "--tls=on with --tls-verify-peer: clients that stay in plain text skip the \
                    certificate check; use --tls=require, or name the exports that need a \
                    certificate with --allow NAME=tls (or --allow-default tls)"
                .into(),
        );
    }
    Ok(())
}

/// An octal file mode for `--socket-mode` (`0600`, `660`).
fn parse_socket_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| {
            format!("--socket-mode expects an octal mode such as 0600 or 0660, got '{s}'")
        })
}

/// Who may scrape `--metrics` unless `--metrics-allow` says otherwise.
const DEFAULT_METRICS_ALLOW: &str = "127.0.0.0/8,::1";

/// Where the control socket goes.
#[derive(Debug, Clone, Default)]
pub enum ControlPath {
    /// The default path, if free (else run without, with a warning).
    #[default]
    Default,
    /// This path; failing to listen there is an error.
    Given(PathBuf),
    Off,
}

/// Server-wide settings shared by `serve` and `demo`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub read_only: bool,
    pub direct: bool,
    pub no_mmap: bool,
    pub threads: usize,
    pub crypt_threads: usize,
    pub memory_budget: Option<u64>,
    /// `--pinned-memory` (`None`: half of RAM).
    pub pinned_memory: Option<u64>,
    /// Access rules by name (`--allow`, `--allow-default`, `ro:NAME`).
    pub policy: AccessPolicy,
    /// `--socket-mode`.
    pub socket_mode: Option<u32>,
    pub max_connections: Option<usize>,
    /// `--max-table-lines` (`None`: the service's default).
    pub max_table_lines: Option<usize>,
    pub net_threads: usize,
    pub net: crate::nbd::NetOptions,
    pub tls: crate::nbd::TlsOptions,
    pub control: ControlPath,
    pub metrics: Option<String>,
    /// `--metrics-allow`: who may scrape.
    pub metrics_allow: Vec<crate::nbd::Allow>,
    pub histograms: bool,
    pub flatten: bool,
    /// `--default-export`: the name `""` stands for (default: the first
    /// device).
    pub default_export: Option<String>,
    /// `--mapper-dir`: where the devices show as files.
    pub mapper_dir: Option<PathBuf>,
    /// `--mapper-block`: where their block nodes' links go.
    pub mapper_block: Option<PathBuf>,
    /// Running under a service manager: pidfile, URIs, passed sockets,
    /// SIGHUP.
    pub service: ServiceOptions,
}

/// What `serve` does as a service (cli/daemon.rs).
#[derive(Debug, Clone, Default)]
pub struct ServiceOptions {
    /// `--pidfile`.
    pub pidfile: Option<PathBuf>,
    /// `--print-uri`.
    pub print_uri: bool,
    /// The control socket the service manager passed.
    pub control_socket: Option<Arc<std::os::unix::net::UnixListener>>,
    /// The `--crypttab` SIGHUP re-reads.
    pub crypttab: Option<CrypttabSource>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            read_only: false,
            direct: false,
            no_mmap: false,
            threads: 0,
            crypt_threads: 0,
            memory_budget: None,
            pinned_memory: None,
            control: ControlPath::Default,
            metrics: None,
            metrics_allow: crate::nbd::export::parse_address_list(DEFAULT_METRICS_ALLOW)
                .unwrap_or_default(),
            histograms: true,
            flatten: true,
            policy: AccessPolicy::default(),
            socket_mode: None,
            max_connections: None,
            max_table_lines: None,
            net_threads: 0,
            net: crate::nbd::NetOptions::default(),
            tls: crate::nbd::TlsOptions::default(),
            default_export: None,
            mapper_dir: None,
            mapper_block: None,
            service: ServiceOptions::default(),
        }
    }
}

/// The table text of a spec, and where it came from (for errors).
fn spec_table(spec: DeviceSpec, st: &Settings) -> Result<(Zeroizing<String>, String), String> {
    match spec {
        DeviceSpec::Table { text, source } => Ok((text, format!("table {source}"))),
        DeviceSpec::File(path) => {
            let f = crate::store::location::open_path(
                &path,
                crate::store::OpenFlags {
                    read_only: true,
                    direct: false,
                    no_map: true,
                },
            )?;
            let size = f.size();
            drop(f);
            if size % 512 != 0 {
                tracing::warn!(
                    "{} is {size} bytes, not whole 512-byte sectors: serving its first {} sectors",
                    path.display(),
                    size / 512
                );
            }
            if size < 512 {
                return Err(format!(
                    "{} is smaller than one 512-byte sector: nothing to serve",
                    path.display()
                ));
            }
            let _ = st;
            Ok((
                crate::mapper::compile::file_table(&path, size),
                format!("file {}", path.display()),
            ))
        }
    }
}

/// Create, load and resume the command line's devices; returns their
/// names in command-line order. They may name each other in any order:
/// build what can be built, repeat while that makes progress.
fn build_devices(
    service: &Service,
    specs: Vec<(String, DeviceSpec)>,
    st: &Settings,
) -> Result<Vec<String>, String> {
    let order: Vec<String> = specs.iter().map(|(n, _)| n.clone()).collect();
    let mut pending: Vec<(String, Zeroizing<String>, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, spec) in specs {
        if !seen.insert(name.clone()) {
            return Err(format!("device name '{name}' is used twice"));
        }
        let (text, source) = spec_table(spec, st).map_err(|e| format!("device '{name}': {e}"))?;
        pending.push((name, text, source));
    }
    while !pending.is_empty() {
        let before = pending.len();
        let mut errors = Vec::new();
        pending.retain(
            |(name, text, source)| match service.activate(name, text.clone(), false) {
                Ok(()) => false,
                Err(e) => {
                    errors.push(format!("device '{name}' ({source}): {e}"));
                    true
                }
            },
        );
        if pending.len() == before {
            return Err(errors.swap_remove(0));
        }
    }
    Ok(order)
}

/// Add the exports again in command-line order: the first device of the
/// command line is the default export.
fn reorder_exports(exports: &ExportSet, devices: &Devices, order: &[String]) -> Result<(), String> {
    let mut ordered = exports.list();
    ordered.sort_by_key(|e| order.iter().position(|n| *n == e.export.name));
    for e in &ordered {
        exports.remove(&e.export.name);
    }
    for e in ordered {
        let ex = crate::nbd::Export {
            name: e.export.name.clone(),
            description: e.export.description.clone(),
            device: e.export.device.clone(),
            read_only: e.export.read_only,
        };
        // Its rules include those inherited from devices it is stacked on.
        let rules = e.rules();
        // The old export (and with it its engine queue) goes before the
        // new one is added: a device with a queue depth (RBD, a remote NBD
        // export) reserves that many engine workers per queue, and workers
        // never stop, so holding both queues at once would start that many
        // idle threads twice, for good.
        drop(e);
        if let Ok(segs) = devices.segments(&ex.name, false, false) {
            let table: String = segs
                .unwrap_or_default()
                .iter()
                .map(|s| format!("{} {} {} {}\n", s.start, s.len, s.target, s.params.as_str()))
                .collect();
            tracing::info!(
                "device {}: {} bytes, table:\n{}",
                ex.name,
                ex.device.size(),
                table.trim_end()
            );
        }
        exports.add_ruled(ex, rules).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The control socket, if any (a default path in use is skipped with a
/// warning; a given one that cannot be bound is an error).
fn start_control(st: &Settings, service: &Arc<Service>) -> Result<Option<ControlServer>, String> {
    if let Some(l) = &st.service.control_socket {
        let l = l.try_clone().map_err(|e| format!("control socket: {e}"))?;
        return ControlServer::adopt(l, service.clone())
            .map(Some)
            .map_err(|e| e.to_string());
    }
    Ok(match &st.control {
        ControlPath::Off => None,
        ControlPath::Given(p) => {
            Some(ControlServer::start(p, service.clone()).map_err(|e| e.to_string())?)
        }
        ControlPath::Default => match control::default_path() {
            None => {
                tracing::warn!(
                    "no control socket: neither $UDM_CONTROL nor $XDG_RUNTIME_DIR is set \
                     (give --control PATH)"
                );
                None
            }
            Some(p) => match ControlServer::start(&p, service.clone()) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("running without a control socket: {e}");
                    None
                }
            },
        },
    })
}

/// Bind `""` to `--default-export NAME` or the first device, by name.
fn bind_default_export(
    exports: &ExportSet,
    order: &[String],
    given: Option<&str>,
) -> Result<(), String> {
    match (given, order.first().map(String::as_str)) {
        (Some(n), _) if !order.iter().any(|o| o == n) => Err(format!(
            "--default-export {n}: no device of that name; give one of the names of \
             --table/--file/--luks/--tcrypt/--bitlk/--fvault2/--crypttab ({})",
            order.join(", ")
        )),
        (Some(n), _) | (None, Some(n)) => {
            exports.set_default_name(n);
            Ok(())
        }
        (None, None) => Ok(()),
    }
}

/// Without a control socket no device can appear later: a rule for a
/// name nothing serves is a typo.
fn check_rule_names(st: &Settings, exports: &ExportSet) -> Result<(), String> {
    for (name, _) in &st.policy.names {
        if !exports.list().iter().any(|e| &e.export.name == name) {
            return Err(format!(
                "--allow {name}: no device of that name (and no control socket to \
                 create it through)"
            ));
        }
    }
    Ok(())
}

/// Build the devices and serve them until a signal arrives.
pub fn serve_specs(
    specs: Vec<(String, DeviceSpec)>,
    listen: Listen,
    st: &Settings,
) -> Result<(), String> {
    let pidfile = st
        .service
        .pidfile
        .as_deref()
        .map(Pidfile::claim)
        .transpose()?;
    let devices = Arc::new(Devices::new(
        BuildOptions {
            read_only: st.read_only,
            direct: st.direct,
            no_mmap: st.no_mmap,
            target: TargetOptions {
                crypt_threads: st.crypt_threads,
                pinned: Some(crate::mem::PinnedLedger::new(
                    st.pinned_memory
                        .unwrap_or_else(crate::mem::default_pinned_total),
                )),
                ..Default::default()
            },
        },
        st.flatten,
        st.histograms,
    ));
    let engine = Arc::new(Engine::start(st.threads).map_err(|e| e.to_string())?);
    let exports = Arc::new(ExportSet::new(
        engine,
        BudgetPolicy {
            total: st.memory_budget,
            exports: specs.len().max(1),
        },
    ));
    // Before any device exists: every export, from the command line or
    // created later, gets the rules of its name.
    exports.set_policy(st.policy.clone());
    let service = Arc::new(Service::new(devices.clone(), exports.clone(), st.read_only));
    if let Some(n) = st.max_table_lines {
        service.set_max_table_lines(n);
    }
    let order = build_devices(&service, specs, st)?;
    reorder_exports(&exports, &devices, &order)?;
    bind_default_export(&exports, &order, st.default_export.as_deref())?;
    let control = start_control(st, &service)?;
    let metrics = match &st.metrics {
        Some(a) => Some(
            control::metrics::Metrics::start(a, service.clone(), st.metrics_allow.clone())
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    if control.is_none() {
        check_rule_names(st, &exports)?;
    }
    let mapper = st
        .mapper_dir
        .as_deref()
        .map(|d| crate::fuse::MapperDir::mount(d, exports.clone(), st.mapper_block.as_deref()))
        .transpose()?;
    if let Some(nodes) = mapper.as_ref().and_then(|m| m.block_nodes()) {
        service.set_nodes(Arc::new(Nodes(nodes.clone())));
    }
    service.set_locations(control::Locations {
        mapper_dir: mapper.as_ref().map(|m| m.dir().to_path_buf()),
        nbd: Some(listen.clone()),
    });
    let reloader = Reloader::start(service.clone(), st.service.crypttab.clone())
        .map_err(|e| format!("cannot catch SIGHUP: {e}"))?;
    // Unmounted when the server starts stopping, before its final flush
    // (the hook runs then): a write through a file after that flush would
    // be acknowledged but not synced.
    let mapper = Arc::new(std::sync::Mutex::new(mapper));
    let events = service_events(st, &exports, pidfile, mapper.clone());
    let r = crate::nbd::server::serve_with(
        ServerConfig {
            listen,
            exports: Vec::new(),
            threads: st.threads,
        },
        crate::nbd::server::ServeOptions {
            memory_budget: st.memory_budget,
            max_connections: st.max_connections,
            net_threads: st.net_threads,
            net: st.net.clone(),
            tls: st.tls.clone(),
            socket_mode: st.socket_mode,
            exports: Some(exports),
            events: Some(events),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string());
    drop(mapper.lock().unwrap_or_else(|p| p.into_inner()).take());
    drop(reloader);
    service.stop();
    drop(control);
    drop(metrics);
    r
}

/// The block nodes of `--mapper-block`, as the control service sees them.
struct Nodes(Arc<crate::fuse::block::BlockNodes>);

impl control::DeviceNodes for Nodes {
    fn present(&self, name: &str) -> Result<(), String> {
        self.0.present(name)
    }
    fn release(&self, name: &str, force: bool) -> Result<(), String> {
        self.0.release(name, force)
    }
    fn release_when_closed(&self, name: &str) -> Result<(), String> {
        self.0.release_when_closed(name)
    }
    fn keep(&self, name: &str) {
        self.0.keep(name)
    }
    fn renamed(&self, old: &str, new: &str) {
        self.0.renamed(old, new)
    }
    fn holds(&self, name: &str) -> usize {
        self.0.holds(name)
    }
}

/// The hook that tells the world the server is ready (sd_notify, the
/// pidfile, `--print-uri`) and that it is stopping. The pidfile is
/// removed when the hook goes, with the server.
fn service_events(
    st: &Settings,
    exports: &Arc<ExportSet>,
    pidfile: Option<Pidfile>,
    mapper: Arc<std::sync::Mutex<Option<crate::fuse::MapperDir>>>,
) -> crate::nbd::server::EventHook {
    let pidfile = std::sync::Mutex::new(pidfile);
    let exports = Arc::downgrade(exports);
    let print_uri = st.service.print_uri;
    let tls = st.tls.mode != crate::nbd::TlsMode::Off;
    Arc::new(move |ev| match ev {
        crate::nbd::ServerEvent::Listening(bound) => {
            let names: Vec<String> = exports
                .upgrade()
                .map(|x| x.list().iter().map(|e| e.export.name.clone()).collect())
                .unwrap_or_default();
            let uris = super::daemon::uris(&bound, &names, tls);
            if let Some(p) = pidfile.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                if let Err(e) = p.write() {
                    tracing::error!("--pidfile: cannot write it: {e}");
                }
            }
            if print_uri {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                for u in &uris {
                    let _ = writeln!(out, "{u}");
                }
                let _ = out.flush();
            }
            let status = format!("serving {} device(s) on {}", names.len(), uris[0]);
            super::daemon::notify(&[
                sd_notify::NotifyState::Ready,
                sd_notify::NotifyState::Status(&status),
            ]);
        }
        crate::nbd::ServerEvent::Stopping => {
            super::daemon::notify(&[
                sd_notify::NotifyState::Stopping,
                sd_notify::NotifyState::Status("stopping: finishing in-flight requests"),
            ]);
            drop(mapper.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
    })
}
