//! `open`, `close` and `status` on a running `udm serve`, through its
//! control socket: `open` creates a read-only device with a `verity`
//! table (device UUID `CRYPT-VERITY-<uuid>-<name>`, as libcryptsetup names
//! it) and so an NBD export of that name.

use super::args::Args;
use super::offline::{open_checked, Checked};
use super::{Fail, Outcome};
use crate::cli::setup_shell::{active_status, call, req};
use crate::targets::verity::params::{Fec, Mode, Options, VerityParams};

fn options(a: &Args) -> Result<Options, Fail> {
    let mut o = Options::default();
    let modes = [
        ("ignore-corruption", Mode::Ignore),
        ("restart-on-corruption", Mode::Restart),
        ("panic-on-corruption", Mode::Panic),
    ];
    for (flag, m) in modes {
        if a.has(flag) {
            if o.mode != Mode::Eio {
                return Err(Fail::usage(
                    "Option --ignore-corruption, --restart-on-corruption or \
                     --panic-on-corruption is allowed only once.",
                ));
            }
            o.mode = m;
        }
    }
    if a.has("error-as-corruption") {
        if !matches!(o.mode, Mode::Restart | Mode::Panic) {
            return Err(Fail::usage(
                "Option --error-as-corruption must be used with --restart-on-corruption \
                 or --panic-on-corruption.",
            ));
        }
        o.on_error = o.mode;
    }
    o.ignore_zero_blocks = a.has("ignore-zero-blocks");
    o.check_at_most_once = a.has("check-at-most-once");
    o.try_verify_in_tasklet = a.has("use-tasklets");
    Ok(o)
}

pub(super) fn open(a: &Args) -> Outcome {
    let (data_path, name, hash_path) = (&a.pos[1], &a.pos[2], &a.pos[3]);
    let fec_opts = super::fec::options(a)?;
    let use_sb = !a.has("no-superblock");
    let Checked { s, root, hash, .. } =
        open_checked(a, data_path, hash_path, a.pos.get(4), use_sb)?;
    if a.str("root-hash-signature").is_some() {
        eprintln!("udm does not check root hash signatures: the root hash given is trusted as is.");
    }
    let mut opts = options(a)?;
    if let Some(f) = &fec_opts {
        let plan = super::fec::plan(&s, f, &hash, hash_path)?;
        opts.fec = Some(Fec {
            dev: absolute(&f.path),
            roots: f.roots,
            blocks: plan.layout.blocks,
            start: f.offset / u64::from(s.hash_block_size),
        });
    }
    let p = VerityParams {
        version: s.hash_type,
        data_dev: absolute(data_path),
        hash_dev: absolute(hash_path),
        data_block_size: s.data_block_size,
        hash_block_size: s.hash_block_size,
        data_blocks: s.data_blocks,
        hash_start: s.hash_start(),
        alg: s.alg,
        root,
        salt: s.salt.clone(),
        opts,
    };
    let sectors = s.data_blocks * u64::from(s.data_block_size) / 512;
    let line = format!("0 {sectors} verity {}", p.table_args());
    let uuid = match s.uuid.filter(|_| use_sb) {
        Some(u) => format!("CRYPT-VERITY-{}-{name}", hex::encode(u)),
        None => format!("CRYPT-VERITY-{name}"),
    };
    let mut r = req("create", name);
    r.has_table = true;
    r.readonly = true;
    r.uuid = Some(uuid);
    r.allow = a.str("allow").map(str::to_string);
    call(a, name, r, line.as_bytes())?;
    Ok(())
}

/// `path` from the root: the server resolves paths from its own folder.
fn absolute(path: &str) -> String {
    std::fs::canonicalize(path).map_or_else(|_| path.to_string(), |p| p.display().to_string())
}

pub(super) fn status(a: &Args) -> Outcome {
    let (dev, lines) = active_status(a, &a.pos[1])?;
    let Some(p) = lines
        .first()
        .filter(|l| l.target == "verity")
        .and_then(|l| VerityParams::parse(&l.args).ok())
    else {
        return Ok(());
    };
    let corrupt = dev["targets"][0]["status"]
        .as_str()
        .is_some_and(|st| st.starts_with('C'));
    print_status(&p, lines.iter().map(|l| l.len).sum(), corrupt);
    Ok(())
}

fn print_status(p: &VerityParams, sectors: u64, corrupt: bool) {
    println!("  type:        VERITY");
    println!(
        "  status:      {}",
        if corrupt { "corrupted" } else { "verified" }
    );
    println!("  hash type:   {}", p.version);
    println!("  data block:  {}", p.data_block_size);
    println!("  hash block:  {}", p.hash_block_size);
    println!("  hash name:   {}", p.alg.name());
    let salt = if p.salt.is_empty() {
        "-".to_string()
    } else {
        hex::encode(&p.salt)
    };
    println!("  salt:        {salt}");
    println!("  data device: {}", p.data_dev);
    println!(
        "  size:        {sectors} [512-byte units] ({} [bytes])",
        sectors * 512
    );
    println!("  mode:        readonly");
    println!("  hash device: {}", p.hash_dev);
    println!(
        "  hash offset: {} sectors",
        p.hash_start * u64::from(p.hash_block_size) / 512
    );
    if let Some(f) = &p.opts.fec {
        println!("  FEC device:  {}", f.dev);
        println!(
            "  FEC offset:  {} sectors",
            f.start * u64::from(p.hash_block_size) / 512
        );
        println!("  FEC roots:   {}", f.roots);
    }
    println!("  root hash:   {}", hex::encode(&p.root));
    let o = &p.opts;
    let mut flags = String::new();
    for (on, w) in [
        (o.mode == Mode::Ignore, "ignore_corruption "),
        (o.mode == Mode::Restart, "restart_on_corruption "),
        (o.mode == Mode::Panic, "panic_on_corruption "),
        (o.on_error == Mode::Restart, "restart_on_error "),
        (o.on_error == Mode::Panic, "panic_on_error "),
        (o.ignore_zero_blocks, "ignore_zero_blocks "),
        (o.check_at_most_once, "check_at_most_once "),
        (o.try_verify_in_tasklet, "try_verify_in_tasklet "),
    ] {
        if on {
            flags.push_str(w);
        }
    }
    if !flags.is_empty() {
        println!("  flags:       {flags}");
    }
}
