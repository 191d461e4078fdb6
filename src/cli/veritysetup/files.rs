//! The files `veritysetup` works on and the parameters of their tree,
//! shared by the offline actions, the FEC parity and `open`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::superblock::SB_SIZE;
use super::Fail;
use crate::targets::verity::tree::{Geometry, HashAlg};

/// The parameters of a tree, from the command line or a superblock.
pub(super) struct Setup {
    pub hash_type: u32,
    pub alg: HashAlg,
    pub data_block_size: u32,
    pub hash_block_size: u32,
    /// 0: not known yet (taken from the data device's size).
    pub data_blocks: u64,
    pub salt: Vec<u8>,
    pub uuid: Option<[u8; 16]>,
    pub hash_offset: u64,
    pub no_superblock: bool,
}

impl Setup {
    /// The first hash block of the tree: after the superblock, rounded up
    /// to a hash block (veritysetup's `VERITY_hash_offset_block`).
    pub fn hash_start(&self) -> u64 {
        let hbs = u64::from(self.hash_block_size);
        if self.no_superblock {
            self.hash_offset / hbs
        } else {
            (self.hash_offset + SB_SIZE as u64).div_ceil(hbs)
        }
    }

    pub fn geometry(&self) -> Result<Geometry, Fail> {
        Geometry::new(
            self.hash_type,
            self.data_block_size,
            self.hash_block_size,
            self.data_blocks,
            self.hash_start(),
            self.alg,
        )
        .map_err(Fail::usage)
    }
}

pub(super) fn open_dev(path: &str, write: bool) -> Result<File, Fail> {
    let mut o = OpenOptions::new();
    o.read(true);
    if write {
        o.write(true).create(true).mode(0o600);
    }
    o.open(path)
        .map_err(|_| Fail::new(4, format!("Device {path} does not exist or access denied.")))
}

pub(super) fn size_of(f: &File, path: &str) -> Result<u64, Fail> {
    use std::io::{Seek, SeekFrom};
    let mut f = f;
    f.seek(SeekFrom::End(0))
        .map_err(|e| Fail::new(4, format!("Cannot get the size of device {path}: {e}.")))
}

pub(super) fn same_file(a: &str, b: &str) -> bool {
    match (Path::new(a).canonicalize(), Path::new(b).canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
