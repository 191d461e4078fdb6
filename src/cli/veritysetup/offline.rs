//! `format`, `verify` and `dump`: the hash tree and superblock on files,
//! as veritysetup writes and checks them in userspace (no device-mapper
//! needed, for veritysetup either).

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::args::Args;
use super::fec::{self, FecOpts, FecPlan};
use super::files::{open_dev, same_file, size_of, Setup};
use super::superblock::{block_size_ok, Superblock, SB_SIZE};
use super::{Fail, Outcome};
use crate::targets::verity::build::{build, compare_level, Mismatch, Tree};
use crate::targets::verity::tree::{Geometry, HashAlg};

/// The tree's parameters from the options; `format` picks a random salt
/// and UUID where none is given.
fn from_options(a: &Args, format: bool, hash_dev: &str) -> Result<Setup, Fail> {
    let hash_type = a.u64("format")?.unwrap_or(1);
    if hash_type > 1 {
        return Err(Fail::usage(format!(
            "Unsupported VERITY hash type {hash_type}."
        )));
    }
    let name = a.str("hash").unwrap_or("sha256").to_ascii_lowercase();
    let alg = HashAlg::from_name(&name).ok_or_else(|| {
        Fail::usage(format!(
            "Hash algorithm {name} not supported (udm verifies sha1, sha256 and sha512)."
        ))
    })?;
    let dbs = a.u64("data-block-size")?.unwrap_or(4096);
    let hbs = a.u64("hash-block-size")?.unwrap_or(4096);
    if !block_size_ok(dbs) || !block_size_ok(hbs) {
        return Err(Fail::usage("Unsupported VERITY block size."));
    }
    let salt = match a.str("salt") {
        Some("-") => Vec::new(),
        Some(s) => hex::decode(s)
            .ok()
            .filter(|s| s.len() <= 256)
            .ok_or_else(|| Fail::usage("Invalid salt string specified."))?,
        None if format => {
            let mut s = vec![0u8; 32];
            getrandom::fill(&mut s).map_err(|e| Fail::new(3, format!("No random salt: {e}.")))?;
            s
        }
        None => Vec::new(),
    };
    let uuid = match a.str("uuid") {
        Some(u) => Some(
            *uuid::Uuid::parse_str(u)
                .map_err(|_| {
                    Fail::usage(format!(
                        "Wrong VERITY UUID format provided on device {hash_dev}."
                    ))
                })?
                .as_bytes(),
        ),
        None if format => {
            let mut r = [0u8; 16];
            getrandom::fill(&mut r).map_err(|e| Fail::new(3, format!("No random UUID: {e}.")))?;
            Some(*uuid::Builder::from_random_bytes(r).into_uuid().as_bytes())
        }
        None => None,
    };
    let hash_offset = a.u64("hash-offset")?.unwrap_or(0);
    if hash_offset % 512 != 0 {
        return Err(Fail::usage("Unsupported VERITY hash offset."));
    }
    Ok(Setup {
        hash_type: hash_type as u32,
        alg,
        data_block_size: dbs as u32,
        hash_block_size: hbs as u32,
        data_blocks: a.u64("data-blocks")?.unwrap_or(0),
        salt,
        uuid,
        hash_offset,
        no_superblock: a.has("no-superblock"),
    })
}

/// The tree's parameters of an existing hash device: its superblock at
/// `--hash-offset`, or the options with `--no-superblock`.
fn load(a: &Args, hash: &File, hash_dev: &str, use_sb: bool) -> Result<Setup, Fail> {
    let mut s = from_options(a, false, hash_dev)?;
    if !use_sb {
        return Ok(s);
    }
    let mut b = [0u8; SB_SIZE];
    hash.read_exact_at(&mut b, s.hash_offset)
        .map_err(|_| Fail::usage(format!("Device {hash_dev} is not a valid VERITY device.")))?;
    let sb = Superblock::parse(&b, hash_dev)?;
    s.hash_type = sb.hash_type;
    s.alg = sb.alg;
    s.data_block_size = sb.data_block_size;
    s.hash_block_size = sb.hash_block_size;
    s.data_blocks = sb.data_blocks;
    s.salt = sb.salt;
    s.uuid = Some(sb.uuid);
    Ok(s)
}

/// Fills in the data block count from the data device's size, and
/// refuses a count the device does not hold (before any tree memory is
/// sized by it); `too_small` is what to say then.
pub(super) fn size_data(s: &mut Setup, data: &File, path: &str, too_small: &str) -> Outcome {
    let size = size_of(data, path)?;
    let dbs = u64::from(s.data_block_size);
    if s.data_blocks == 0 {
        s.data_blocks = size / dbs;
    }
    if s.data_blocks == 0 || s.data_blocks.checked_mul(dbs).is_none_or(|b| b > size) {
        return Err(Fail::usage(too_small));
    }
    Ok(())
}

fn print_header(
    hash_dev: &str,
    s: &Setup,
    geo: &Geometry,
    root: Option<&[u8]>,
    fec: Option<&FecPlan>,
) {
    let uuid = match (s.no_superblock, s.uuid) {
        (false, Some(u)) => uuid::Uuid::from_bytes(u).hyphenated().to_string(),
        _ => String::new(),
    };
    let salt = if s.salt.is_empty() {
        "-".to_string()
    } else {
        hex::encode(&s.salt)
    };
    println!("VERITY header information for {hash_dev}");
    println!("UUID:            \t{uuid}");
    println!("Hash type:       \t{}", s.hash_type);
    println!("Data blocks:     \t{}", s.data_blocks);
    println!("Data block size: \t{}", s.data_block_size);
    println!("Hash blocks:     \t{}", geo.hash_blocks());
    println!("Hash block size: \t{}", s.hash_block_size);
    println!("Hash algorithm:  \t{}", s.alg.name());
    let fec = fec.filter(|f| f.layout.blocks > 0);
    if let Some(f) = fec {
        println!("FEC RS roots:   \t{}", f.layout.roots);
        println!("FEC blocks:     \t{}", f.layout.parity_blocks());
    }
    println!("Salt:            \t{salt}");
    if let Some(r) = root {
        println!("Root hash:      \t{}", hex::encode(r));
    }
    // As veritysetup: with the parity on the hash device, it is taken to
    // follow the tree directly.
    let parity_here = fec
        .filter(|f| f.on_hash_device)
        .map_or(0, |f| f.layout.parity_blocks());
    if s.hash_offset == 0 {
        println!(
            "Hash device size: \t{} [bytes]",
            (geo.end + parity_here) * u64::from(s.hash_block_size)
        );
    }
    if let Some(f) = fec.filter(|f| !f.on_hash_device && f.offset == 0) {
        println!(
            "FEC device size: \t{} [bytes]",
            f.layout.parity_blocks() * u64::from(s.data_block_size)
        );
    }
}

fn tree_of(s: &Setup, geo: &Geometry, data: &File, path: &str) -> Result<Tree, Fail> {
    let dbs = u64::from(s.data_block_size);
    build(geo, s.alg, &s.salt, &mut |j, b| {
        data.read_exact_at(b, j * dbs)
            .map_err(|e| Fail::usage(format!("Cannot read data device {path}: {e}.")))
    })
}

/// veritysetup's refusals of a FEC area on the data or hash device that
/// would overlap what is there.
fn fec_overlaps(s: &Setup, f: &FecOpts, data_path: &str, hash_path: &str) -> Outcome {
    let geo = s.geometry()?;
    let tree_end = s.hash_offset + geo.hash_blocks() * u64::from(s.hash_block_size);
    if same_file(hash_path, &f.path) && tree_end > f.offset {
        return Err(Fail::usage("Hash area overlaps with FEC area."));
    }
    if same_file(data_path, &f.path) && s.data_blocks * u64::from(s.data_block_size) > f.offset {
        return Err(Fail::usage("Data area overlaps with FEC area."));
    }
    Ok(())
}

pub(super) fn format(a: &Args) -> Outcome {
    let (data_path, hash_path) = (&a.pos[1], &a.pos[2]);
    let mut s = from_options(a, true, hash_path)?;
    let data = open_dev(data_path, false)?;
    size_data(
        &mut s,
        &data,
        data_path,
        "Input/output error while creating hash area.",
    )?;
    let hash = open_dev(hash_path, true)?;
    if same_file(data_path, hash_path)
        && s.data_blocks * u64::from(s.data_block_size) > s.hash_offset
    {
        return Err(Fail::usage("Data area overlaps with hash area."));
    }
    let fec = fec::options(a)?;
    if let Some(f) = &fec {
        fec_overlaps(&s, f, data_path, hash_path)?;
    }
    let geo = s.geometry()?;
    let tree = tree_of(&s, &geo, &data, data_path)?;
    let werr =
        |e: std::io::Error| Fail::usage(format!("Cannot write to hash device {hash_path}: {e}."));
    if !s.no_superblock {
        let sb = Superblock {
            hash_type: s.hash_type,
            uuid: s.uuid.unwrap_or_default(),
            alg: s.alg,
            data_block_size: s.data_block_size,
            hash_block_size: s.hash_block_size,
            data_blocks: s.data_blocks,
            salt: s.salt.clone(),
        };
        hash.write_all_at(&sb.to_bytes(), s.hash_offset)
            .map_err(werr)?;
    }
    for (i, level) in tree.levels.iter().enumerate() {
        let at = geo.level_start[i] * u64::from(s.hash_block_size);
        hash.write_all_at(level, at).map_err(werr)?;
    }
    // As veritysetup, a hash file is extended to the end of the hash
    // area even where no level reaches it (a one-block image: the
    // superblock block alone).
    let end = geo.end * u64::from(s.hash_block_size);
    let meta = hash.metadata().map_err(werr)?;
    if meta.is_file() && meta.len() < end {
        hash.set_len(end).map_err(werr)?;
    }
    hash.sync_all().map_err(werr)?;
    let plan = match &fec {
        Some(f) => Some(fec::write_parity(&s, f, &data, &hash, hash_path)?),
        None => None,
    };
    if let Some(f) = a.str("root-hash-file") {
        std::fs::write(f, hex::encode(&tree.root))
            .map_err(|e| Fail::usage(format!("Cannot write root hash file {f}: {e}.")))?;
    }
    print_header(hash_path, &s, &geo, Some(&tree.root), plan.as_ref());
    Ok(())
}

/// The root hash from the command line or `--root-hash-file`.
fn root_hash(a: &Args, arg: Option<&String>, alg: HashAlg) -> Result<Vec<u8>, Fail> {
    let text = match (arg, a.str("root-hash-file")) {
        (Some(r), _) => r.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| Fail::new(4, format!("Cannot read root hash file {f}: {e}.")))?
            .trim()
            .to_string(),
        (None, None) => {
            return Err(Fail::usage(
                "Command requires <root_hash> or --root-hash-file option as argument.",
            ))
        }
    };
    hex::decode(&text)
        .ok()
        .filter(|r| r.len() == alg.digest_size())
        .ok_or_else(|| Fail::usage("Invalid root hash string specified."))
}

/// What `verify` and `open` start from: the hash device and the tree's
/// parameters on it, the root hash, and the data device holding the
/// blocks the tree covers.
pub(super) struct Checked {
    pub s: Setup,
    pub root: Vec<u8>,
    pub hash: File,
    pub data: File,
}

/// Opens the hash device, reads the tree's parameters (its superblock
/// unless `use_sb` is false), takes the root hash (`root_arg` or
/// `--root-hash-file`) and opens the data device, refusing one too small
/// for the tree: the common start of `verify` and `open`, with
/// veritysetup's messages and codes.
pub(super) fn open_checked(
    a: &Args,
    data_path: &str,
    hash_path: &str,
    root_arg: Option<&String>,
    use_sb: bool,
) -> Result<Checked, Fail> {
    let hash = open_dev(hash_path, false)?;
    let mut s = load(a, &hash, hash_path, use_sb)?;
    let root = root_hash(a, root_arg, s.alg)?;
    let data = open_dev(data_path, false)?;
    size_data(
        &mut s,
        &data,
        data_path,
        &format!("Device {data_path} is too small."),
    )?;
    Ok(Checked {
        s,
        root,
        hash,
        data,
    })
}

pub(super) fn verify(a: &Args) -> Outcome {
    let (data_path, hash_path) = (&a.pos[1], &a.pos[2]);
    let fec = fec::options(a)?;
    let use_sb = !a.has("no-superblock");
    let Checked {
        s,
        root,
        hash,
        data,
    } = open_checked(a, data_path, hash_path, a.pos.get(3), use_sb)?;
    let geo = s.geometry()?;
    let tree = tree_of(&s, &geo, &data, data_path)?;
    match (compare_tree(&s, &geo, &tree, &root, &hash, hash_path), fec) {
        (Err(e), Some(f)) if e.code == 2 || e.msg == ROOT_MISMATCH => {
            fec::verify_after_failure(&s, &f, &data, &hash, hash_path, e)
        }
        (r, _) => r,
    }
}

const ROOT_MISMATCH: &str = "Verification of root hash failed.";

/// The tree on the hash device against the one built from the data, and
/// its root against the one given: veritysetup's messages and codes.
fn compare_tree(
    s: &Setup,
    geo: &Geometry,
    tree: &Tree,
    root: &[u8],
    hash: &File,
    hash_path: &str,
) -> Outcome {
    let hbs = u64::from(s.hash_block_size);
    for i in 0..geo.levels() {
        let mut disk = vec![0u8; (geo.level_blocks[i] * hbs) as usize];
        hash.read_exact_at(&mut disk, geo.level_start[i] * hbs)
            .map_err(|e| Fail::usage(format!("Cannot read hash device {hash_path}: {e}.")))?;
        let what = match compare_level(geo, tree, i, &disk) {
            None => continue,
            Some(Mismatch::Digest(p)) => format!("Verification failed at position {p}."),
            Some(Mismatch::Spare(p)) => format!("Spare area is not zeroed at position {p}."),
        };
        return Err(Fail::new(
            2,
            format!("{what}\nVerification of data area failed."),
        ));
    }
    if tree.root != root {
        return Err(Fail::usage(ROOT_MISMATCH));
    }
    Ok(())
}

pub(super) fn dump(a: &Args) -> Outcome {
    let hash_path = &a.pos[1];
    let fec = fec::options(a)?;
    let hash = open_dev(hash_path, false)?;
    let mut s = load(a, &hash, hash_path, true)?;
    s.no_superblock = false;
    let geo = s.geometry()?;
    let plan = match &fec {
        Some(f) => Some(fec::plan(&s, f, &hash, hash_path)?),
        None => None,
    };
    print_header(hash_path, &s, &geo, None, plan.as_ref());
    Ok(())
}
