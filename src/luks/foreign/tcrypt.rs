//! TrueCrypt and VeraCrypt volumes (cryptsetup's `tcrypt` type).
//!
//! The header has no plaintext field naming its KDF or cipher, so opening
//! one is a search, in cryptsetup's order: every KDF the options allow
//! derives a 192-byte header key from the passphrase (mixed with the
//! keyfile pool), and every cipher chain the options allow is tried on the
//! encrypted 448 bytes until the magic `TRUE` or `VERA` appears. The same
//! order matters because `-h`/`-c` only narrow it by substring, as
//! cryptsetup's do. The data is then a stack of one crypt line per cipher
//! of the chain (the last cipher next to the disk), as cryptsetup maps it;
//! TrueCrypt's legacy blowfish and CBC cascades, which the kernel cannot
//! map and cryptsetup refuses, are one crypt line of udm's own
//! `CHAIN-cbc-tcrypt` / `CHAIN-cbci-tcrypt` spec (`crypto/tcrypt_cbc.rs`).

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::crc32;
use crate::crypto::SectorCrypt;
use crate::luks::disk::Disk;
use crate::luks::error::LuksError;

#[cfg(feature = "fuzzing")]
pub mod fuzz;

const SALT_LEN: usize = 64;
const HDR_LEN: usize = 448;
const HDR_KEY_LEN: usize = 192;
const POOL_TC: usize = 64;
const POOL_VC: usize = 128;
const KEYFILE_MAX: usize = 1 << 20;
const SYSTEM_OFFSET: i64 = 31744;
const HIDDEN_OFFSET: i64 = 65536;
const HIDDEN_OFFSET_OLD: i64 = -1536;
const HIDDEN_OFFSET_BACKUP: i64 = -65536;
const BACKUP_OFFSET: i64 = -131072;

/// One header KDF of TrueCrypt or VeraCrypt.
struct Kdf {
    legacy: bool,
    vera: bool,
    /// A PBKDF2 hash, or `argon2id`.
    hash: &'static str,
    iterations: u32,
    /// Argon2id only: lanes and memory (KiB).
    parallel: u32,
    memory: u32,
    pim_const: u32,
    pim_mult: u32,
}

const fn pbkdf2(legacy: bool, vera: bool, hash: &'static str, it: u32, c: u32, m: u32) -> Kdf {
    Kdf {
        legacy,
        vera,
        hash,
        iterations: it,
        parallel: 0,
        memory: 0,
        pim_const: c,
        pim_mult: m,
    }
}

/// cryptsetup's list and order (the boot-only entries are the ones with
/// a multiplier of 2048 and no constant).
const KDFS: &[Kdf] = &[
    pbkdf2(false, false, "ripemd160", 2000, 0, 0),
    pbkdf2(false, false, "ripemd160", 1000, 0, 0),
    pbkdf2(false, false, "sha512", 1000, 0, 0),
    pbkdf2(false, false, "whirlpool", 1000, 0, 0),
    pbkdf2(true, false, "sha1", 2000, 0, 0),
    pbkdf2(false, true, "sha512", 500_000, 15000, 1000),
    pbkdf2(false, true, "whirlpool", 500_000, 15000, 1000),
    pbkdf2(false, true, "sha256", 500_000, 15000, 1000),
    pbkdf2(false, true, "sha256", 200_000, 0, 2048),
    Kdf {
        legacy: false,
        vera: true,
        hash: "argon2id",
        iterations: 6,
        parallel: 1,
        memory: 425_984,
        pim_const: 0,
        pim_mult: 0,
    },
    pbkdf2(false, true, "blake2s-256", 500_000, 15000, 1000),
    pbkdf2(false, true, "blake2s-256", 200_000, 0, 2048),
    pbkdf2(false, true, "ripemd160", 655_331, 15000, 1000),
    pbkdf2(false, true, "ripemd160", 327_661, 0, 2048),
    pbkdf2(false, true, "stribog512", 500_000, 15000, 1000),
];

/// One cipher of a chain: where its key (and IV or tweak key) sit in the
/// header's key area.
struct Cipher {
    name: &'static str,
    key_size: usize,
    iv_size: usize,
    key_offset: usize,
    iv_offset: usize,
    key_extra: usize,
}

/// A cipher chain and its mode.
struct Chain {
    legacy: bool,
    key_size: usize,
    name: &'static str,
    mode: &'static str,
    ciphers: &'static [Cipher],
}

const fn c(name: &'static str, ks: usize, ivs: usize, ko: usize, io: usize, ex: usize) -> Cipher {
    Cipher {
        name,
        key_size: ks,
        iv_size: ivs,
        key_offset: ko,
        iv_offset: io,
        key_extra: ex,
    }
}

const fn xts(name: &'static str, ciphers: &'static [Cipher]) -> Chain {
    Chain {
        legacy: false,
        key_size: 64 * ciphers.len(),
        name,
        mode: "xts-plain64",
        ciphers,
    }
}

const fn lrw(name: &'static str, ciphers: &'static [Cipher]) -> Chain {
    Chain {
        legacy: false,
        key_size: 48 * ciphers.len(),
        name,
        mode: "lrw-benbi",
        ciphers,
    }
}

const fn cbc(
    key_size: usize,
    name: &'static str,
    mode: &'static str,
    ciphers: &'static [Cipher],
) -> Chain {
    Chain {
        legacy: true,
        key_size,
        name,
        mode,
        ciphers,
    }
}

/// cryptsetup's list and order of chains.
const CHAINS: &[Chain] = &[
    xts("aes", &[c("aes", 64, 16, 0, 32, 0)]),
    xts("serpent", &[c("serpent", 64, 16, 0, 32, 0)]),
    xts("twofish", &[c("twofish", 64, 16, 0, 32, 0)]),
    xts(
        "twofish-aes",
        &[c("twofish", 64, 16, 0, 64, 0), c("aes", 64, 16, 32, 96, 0)],
    ),
    xts(
        "serpent-twofish-aes",
        &[
            c("serpent", 64, 16, 0, 96, 0),
            c("twofish", 64, 16, 32, 128, 0),
            c("aes", 64, 16, 64, 160, 0),
        ],
    ),
    xts(
        "aes-serpent",
        &[c("aes", 64, 16, 0, 64, 0), c("serpent", 64, 16, 32, 96, 0)],
    ),
    xts(
        "aes-twofish-serpent",
        &[
            c("aes", 64, 16, 0, 96, 0),
            c("twofish", 64, 16, 32, 128, 0),
            c("serpent", 64, 16, 64, 160, 0),
        ],
    ),
    xts(
        "serpent-twofish",
        &[
            c("serpent", 64, 16, 0, 64, 0),
            c("twofish", 64, 16, 32, 96, 0),
        ],
    ),
    xts("camellia", &[c("camellia", 64, 16, 0, 32, 0)]),
    xts("kuznyechik", &[c("kuznyechik", 64, 16, 0, 32, 0)]),
    xts(
        "kuznyechik-camellia",
        &[
            c("kuznyechik", 64, 16, 0, 64, 0),
            c("camellia", 64, 16, 32, 96, 0),
        ],
    ),
    xts(
        "twofish-kuznyechik",
        &[
            c("twofish", 64, 16, 0, 64, 0),
            c("kuznyechik", 64, 16, 32, 96, 0),
        ],
    ),
    xts(
        "serpent-camellia",
        &[
            c("serpent", 64, 16, 0, 64, 0),
            c("camellia", 64, 16, 32, 96, 0),
        ],
    ),
    xts(
        "aes-kuznyechik",
        &[
            c("aes", 64, 16, 0, 64, 0),
            c("kuznyechik", 64, 16, 32, 96, 0),
        ],
    ),
    xts(
        "camellia-serpent-kuznyechik",
        &[
            c("camellia", 64, 16, 0, 96, 0),
            c("serpent", 64, 16, 32, 128, 0),
            c("kuznyechik", 64, 16, 64, 160, 0),
        ],
    ),
    lrw("aes", &[c("aes", 48, 16, 32, 0, 0)]),
    lrw("serpent", &[c("serpent", 48, 16, 32, 0, 0)]),
    lrw("twofish", &[c("twofish", 48, 16, 32, 0, 0)]),
    lrw(
        "twofish-aes",
        &[c("twofish", 48, 16, 32, 0, 0), c("aes", 48, 16, 64, 0, 0)],
    ),
    lrw(
        "serpent-twofish-aes",
        &[
            c("serpent", 48, 16, 32, 0, 0),
            c("twofish", 48, 16, 64, 0, 0),
            c("aes", 48, 16, 96, 0, 0),
        ],
    ),
    lrw(
        "aes-serpent",
        &[c("aes", 48, 16, 32, 0, 0), c("serpent", 48, 16, 64, 0, 0)],
    ),
    lrw(
        "aes-twofish-serpent",
        &[
            c("aes", 48, 16, 32, 0, 0),
            c("twofish", 48, 16, 64, 0, 0),
            c("serpent", 48, 16, 96, 0, 0),
        ],
    ),
    lrw(
        "serpent-twofish",
        &[
            c("serpent", 48, 16, 32, 0, 0),
            c("twofish", 48, 16, 64, 0, 0),
        ],
    ),
    cbc(64, "aes", "cbc-tcw", &[c("aes", 32, 16, 32, 0, 32)]),
    cbc(64, "serpent", "cbc-tcw", &[c("serpent", 32, 16, 32, 0, 32)]),
    cbc(64, "twofish", "cbc-tcw", &[c("twofish", 32, 16, 32, 0, 32)]),
    cbc(
        96,
        "twofish-aes",
        "cbci-tcrypt",
        &[c("twofish", 32, 16, 32, 0, 0), c("aes", 32, 16, 64, 0, 32)],
    ),
    cbc(
        128,
        "serpent-twofish-aes",
        "cbci-tcrypt",
        &[
            c("serpent", 32, 16, 32, 0, 0),
            c("twofish", 32, 16, 64, 0, 0),
            c("aes", 32, 16, 96, 0, 32),
        ],
    ),
    cbc(
        96,
        "aes-serpent",
        "cbci-tcrypt",
        &[c("aes", 32, 16, 32, 0, 0), c("serpent", 32, 16, 64, 0, 32)],
    ),
    cbc(
        128,
        "aes-twofish-serpent",
        "cbci-tcrypt",
        &[
            c("aes", 32, 16, 32, 0, 0),
            c("twofish", 32, 16, 64, 0, 0),
            c("serpent", 32, 16, 96, 0, 32),
        ],
    ),
    cbc(
        96,
        "serpent-twofish",
        "cbci-tcrypt",
        &[
            c("serpent", 32, 16, 32, 0, 0),
            c("twofish", 32, 16, 64, 0, 32),
        ],
    ),
    cbc(40, "cast5", "cbc-tcw", &[c("cast5", 16, 8, 32, 0, 24)]),
    cbc(
        48,
        "des3_ede",
        "cbc-tcw",
        &[c("des3_ede", 24, 8, 32, 0, 24)],
    ),
    cbc(
        80,
        "blowfish_le",
        "cbc-tcrypt",
        &[c("blowfish_le", 56, 8, 32, 0, 24)],
    ),
    cbc(
        120,
        "blowfish_le-aes",
        "cbc-tcrypt",
        &[
            c("blowfish_le", 56, 8, 32, 0, 0),
            c("aes", 32, 16, 88, 0, 32),
        ],
    ),
    cbc(
        152,
        "serpent-blowfish_le-aes",
        "cbc-tcrypt",
        &[
            c("serpent", 32, 16, 32, 0, 0),
            c("blowfish_le", 56, 8, 64, 0, 0),
            c("aes", 32, 16, 120, 0, 32),
        ],
    ),
];

/// What the command line says about the volume (cryptsetup's
/// `crypt_params_tcrypt`).
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// `-h`: only KDFs whose hash name contains this.
    pub hash: Option<String>,
    /// `-c`: only chains whose name contains this.
    pub cipher: Option<String>,
    /// VeraCrypt KDFs and the `VERA` magic (off with `--disable-veracrypt`).
    pub veracrypt: bool,
    /// `--veracrypt-pim`: 0 for none.
    pub pim: u32,
    pub hidden: bool,
    pub system: bool,
    pub backup: bool,
    /// `-d` files, mixed into the keyfile pool in order.
    pub keyfiles: Vec<PathBuf>,
    /// TrueCrypt's legacy KDF and CBC chains (cryptsetup's command line
    /// always allows them).
    pub legacy: bool,
    /// udm's `--allow-tcrypt-legacy`: map a legacy `-tcrypt` chain, which
    /// cryptsetup finds but refuses to activate, with udm's own crypt
    /// line. Without it udm refuses as cryptsetup does, so that scripts
    /// that expect the refusal see it.
    pub map_legacy: bool,
    /// `--no-kdf-limit`: try every KDF whatever the work a PIM asks for.
    pub no_cost_limit: bool,
}

/// A decrypted header.
pub struct Header {
    vera: bool,
    pub version: u16,
    pub version_tc: u16,
    pub hidden_volume_size: u64,
    pub volume_size: u64,
    pub mk_offset: u64,
    pub flags: u32,
    pub sector_size: u32,
    keys: Zeroizing<Vec<u8>>,
    kdf: &'static Kdf,
    chain: &'static Chain,
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tcrypt::Header({}-{}, keys hidden)",
            self.chain.name, self.chain.mode
        )
    }
}

/// PBKDF2 with a hash named as cryptsetup names it; false if udm has no
/// such hash.
fn pbkdf2_named(hash: &str, pw: &[u8], salt: &[u8], iter: u32, out: &mut [u8]) -> bool {
    use pbkdf2::pbkdf2_hmac as p;
    match hash {
        "sha1" => p::<sha1::Sha1>(pw, salt, iter, out),
        "sha256" => p::<sha2::Sha256>(pw, salt, iter, out),
        "sha512" => p::<sha2::Sha512>(pw, salt, iter, out),
        "ripemd160" => p::<ripemd::Ripemd160>(pw, salt, iter, out),
        "whirlpool" => p::<whirlpool::Whirlpool>(pw, salt, iter, out),
        "stribog512" => p::<streebog::Streebog512>(pw, salt, iter, out),
        "blake2s-256" => {
            if pbkdf2::pbkdf2::<hmac::SimpleHmac<blake2::Blake2s256>>(pw, salt, iter, out).is_err()
            {
                return false;
            }
        }
        _ => return false,
    }
    true
}

/// Iterations and memory of `k`, with the PIM applied where VeraCrypt
/// applies it. A PIM that would make the KDF run for days is refused.
fn kdf_cost(k: &Kdf, pim: u32) -> Result<(u32, u32), LuksError> {
    if pim == 0 || !k.vera {
        return Ok((k.iterations, k.memory));
    }
    let bad = || {
        LuksError::Usage(format!(
            "--veracrypt-pim {pim} asks for more KDF work than udm will do (use a PIM VeraCrypt accepts)"
        ))
    };
    if k.hash == "argon2id" {
        return Ok(if pim <= 31 {
            ((pim - 1) / 3 + 3, 1024 * (64 + (pim - 1) * 32))
        } else {
            (pim.checked_sub(18).ok_or_else(bad)?, 1024 * 1024)
        });
    }
    let it = u64::from(k.pim_const) + u64::from(k.pim_mult) * u64::from(pim);
    u32::try_from(it).ok().map(|n| (n, 0)).ok_or_else(bad)
}

/// The KDF runs trying one passphrase on `headers` header places costs,
/// as LUKS keyslots count (`keyslot` N: the N-th KDF tried), so one
/// limit and one `--no-kdf-limit` cover every format.
fn check_cost(p: &Params, headers: usize) -> Result<(), LuksError> {
    use crate::luks::cost::{CostLimit, SlotCost};
    use crate::luks::hash::HashAlg;
    use crate::luks::kdf::{Argon2Kind, Kdf as LuksKdf};
    if p.no_cost_limit {
        return Ok(());
    }
    let mut slots = Vec::new();
    for (n, k) in KDFS.iter().filter(|k| kdf_allowed(k, p)).enumerate() {
        let (iterations, memory) = kdf_cost(k, p.pim)?;
        let kdf = if k.hash == "argon2id" {
            LuksKdf::Argon2 {
                kind: Argon2Kind::Id,
                time: iterations,
                memory_kib: memory,
                cpus: k.parallel,
            }
        } else {
            // Hashes LUKS has no name for are counted by their output
            // size, which is what sets PBKDF2's blocks.
            let hash = match k.hash {
                "sha1" => HashAlg::Sha1,
                "ripemd160" => HashAlg::Ripemd160,
                "sha512" | "stribog512" => HashAlg::Sha512,
                "whirlpool" => HashAlg::Whirlpool,
                _ => HashAlg::Sha256,
            };
            LuksKdf::Pbkdf2 { hash, iterations }
        };
        for _ in 0..headers {
            slots.push(SlotCost {
                slot: n as u32,
                kdf,
                digest: None,
                key_len: HDR_KEY_LEN,
                digest_len: 0,
            });
        }
    }
    CostLimit::default().check_foreign("TCRYPT header KDFs (keyslot N: the N-th KDF tried)", &slots)
}

fn derive(
    k: &Kdf,
    pool: &[u8],
    salt: &[u8],
    pim: u32,
) -> Result<Option<Zeroizing<Vec<u8>>>, LuksError> {
    let (iterations, memory) = kdf_cost(k, pim)?;
    let mut key = Zeroizing::new(vec![0u8; HDR_KEY_LEN]);
    if k.hash == "argon2id" {
        let params = argon2::Params::new(memory, iterations, k.parallel, Some(HDR_KEY_LEN))
            .map_err(|e| LuksError::Usage(format!("VeraCrypt Argon2id parameters: {e}")))?;
        let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        if a.hash_password_into(pool, salt, &mut key).is_err() {
            return Ok(None);
        }
    } else if !pbkdf2_named(k.hash, pool, salt, iterations, &mut key) {
        return Ok(None);
    }
    Ok(Some(key))
}

/// `len` bytes of a cipher's sector transform over the first `len` bytes
/// of `buf` at sector 0 (the header is 448 bytes, a crypt transform works
/// on 512: the tail is scratch and every mode here is blockwise or
/// chained forward, so it does not change the head).
fn sector0(spec: &str, key: &[u8], buf: &mut [u8; HDR_LEN]) -> Option<()> {
    let t = SectorCrypt::new(spec, key, 512, false).ok()?;
    let mut s = Zeroizing::new([0u8; 512]);
    s[..HDR_LEN].copy_from_slice(buf);
    t.decrypt(&mut s[..], 0);
    buf.copy_from_slice(&s[..HDR_LEN]);
    Some(())
}

/// The key a cipher of `mode` gets from the header key area (or from the
/// header key, for the header itself), as cryptsetup lays it out.
fn cipher_key(ci: &Cipher, mode: &str, key: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(ci.key_size + ci.key_extra));
    if mode.starts_with("xts") {
        let half = ci.key_size / 2;
        out.extend_from_slice(&key[ci.key_offset..ci.key_offset + half]);
        out.extend_from_slice(&key[ci.iv_offset..ci.iv_offset + half]);
    } else if mode.starts_with("lrw") {
        let k = ci.key_size - 16;
        out.extend_from_slice(&key[ci.key_offset..ci.key_offset + k]);
        out.extend_from_slice(&key[..16]);
    } else {
        out.extend_from_slice(&key[ci.key_offset..ci.key_offset + ci.key_size]);
        out.extend_from_slice(&key[ci.iv_offset..ci.iv_offset + ci.key_extra]);
    }
    out
}

/// The kernel's name of a cipher (blowfish is little-endian in TrueCrypt:
/// the words are swapped around the kernel's big-endian blowfish).
fn kernel_name(name: &str) -> &str {
    name.strip_suffix("_le").unwrap_or(name)
}

fn swap_words(buf: &mut [u8], bs: usize) {
    if bs == 8 {
        for w in buf.chunks_exact_mut(4) {
            w.reverse();
        }
    }
}

/// ECB-decrypt `buf` with each cipher of `list`, last first.
fn ecb_all(list: &[&Cipher], key: &[u8], buf: &mut [u8; HDR_LEN]) -> Option<()> {
    for ci in list.iter().rev() {
        let k = &key[ci.key_offset..ci.key_offset + ci.key_size];
        let le = ci.name.ends_with("_le");
        if le {
            swap_words(buf, ci.iv_size);
        }
        sector0(&format!("{}-ecb", kernel_name(ci.name)), k, buf)?;
        if le {
            swap_words(buf, ci.iv_size);
        }
    }
    Some(())
}

/// TrueCrypt's legacy CBC header: whitening removed, then CBC with the
/// chain's ciphers applied to each block together ("outer" CBC).
fn decrypt_cbc(list: &[&Cipher], key: &[u8], buf: &mut [u8; HDR_LEN]) -> Option<()> {
    for (i, b) in buf.iter_mut().enumerate() {
        *b ^= key[8 + i % 8];
    }
    let bs = list[0].iv_size;
    let cipher_text = Zeroizing::new(*buf);
    ecb_all(list, key, buf)?;
    let iv = &key[list[0].iv_offset..list[0].iv_offset + bs];
    for (i, b) in buf.iter_mut().enumerate() {
        *b ^= if i < bs { iv[i] } else { cipher_text[i - bs] };
    }
    Some(())
}

/// Decrypt the header's 448 bytes with `chain`; None when a cipher of the
/// chain is not available in udm.
fn decrypt_with(
    chain: &Chain,
    key: &[u8],
    enc: &[u8; HDR_LEN],
) -> Option<Zeroizing<[u8; HDR_LEN]>> {
    let mut buf = Zeroizing::new(*enc);
    let all: Vec<&Cipher> = chain.ciphers.iter().collect();
    if chain.mode.starts_with("cbci") {
        decrypt_cbc(&all, key, &mut buf)?;
        return Some(buf);
    }
    for ci in chain.ciphers.iter().rev() {
        if chain.mode.starts_with("cbc") {
            decrypt_cbc(&[ci], key, &mut buf)?;
            continue;
        }
        let k = cipher_key(ci, chain.mode, key);
        sector0(&format!("{}-{}", ci.name, chain.mode), &k, &mut buf)?;
    }
    Some(buf)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// The decrypted header's fields, after its checksums.
fn parse(d: &[u8; HDR_LEN], kdf: &'static Kdf, chain: &'static Chain) -> Result<Header, LuksError> {
    let version = be16(d, 4);
    if version > 3 && crc32(&d[..188]) != be32(d, 188) {
        return Err(LuksError::field(
            "TCRYPT header",
            "CRC32",
            "header checksum mismatch",
        ));
    }
    if crc32(&d[192..]) != be32(d, 8) {
        return Err(LuksError::field(
            "TCRYPT header",
            "keys CRC32",
            "key area checksum mismatch",
        ));
    }
    let mk_offset = match be64(d, 44) {
        0 => 512,
        n => n,
    };
    let sector_size = match be32(d, 64) {
        0 => 512,
        n => n,
    };
    Ok(Header {
        vera: &d[..4] == b"VERA",
        version,
        version_tc: be16(d, 6),
        hidden_volume_size: be64(d, 28),
        volume_size: be64(d, 36),
        mk_offset,
        flags: be32(d, 60),
        sector_size,
        keys: Zeroizing::new(d[192..].to_vec()),
        kdf,
        chain,
    })
}

/// TrueCrypt's keyfile pool: a running CRC-32 over each file's first MiB,
/// its register's bytes added into the pool in turn.
fn mix_keyfile(pool: &mut [u8], len: usize, path: &Path) -> Result<(), LuksError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| {
        LuksError::Usage(format!("Failed to open key file {}: {e}.", path.display()))
    })?;
    let mut data = Zeroizing::new(Vec::with_capacity(KEYFILE_MAX));
    f.take(KEYFILE_MAX as u64)
        .read_to_end(&mut data)
        .map_err(|e| LuksError::io(format!("Error reading keyfile {}", path.display()), e))?;
    let mut crc = !0u32;
    let mut j = 0;
    for &b in data.iter() {
        crc = super::crc32_update(crc, &[b]);
        for byte in crc.to_be_bytes() {
            pool[j] = pool[j].wrapping_add(byte);
            j += 1;
        }
        j %= len;
    }
    Ok(())
}

/// The KDF input: the passphrase, or the keyfile pool with the passphrase
/// added into it.
fn key_pool(pass: &[u8], p: &Params) -> Result<Zeroizing<Vec<u8>>, LuksError> {
    let max = if p.veracrypt && pass.len() > POOL_TC {
        POOL_VC
    } else {
        POOL_TC
    };
    if pass.len() > max {
        eprintln!("Maximum TCRYPT passphrase length ({max}) exceeded.");
        return Err(LuksError::WrongPassphrase);
    }
    let mut pool = Zeroizing::new(vec![0u8; max]);
    for kf in &p.keyfiles {
        mix_keyfile(&mut pool, max, kf)?;
    }
    for (d, s) in pool.iter_mut().zip(pass) {
        *d = d.wrapping_add(*s);
    }
    if p.keyfiles.is_empty() {
        pool.truncate(pass.len());
    }
    Ok(pool)
}

fn kdf_allowed(k: &Kdf, p: &Params) -> bool {
    if let Some(h) = &p.hash {
        if !k.hash.contains(h.as_str()) {
            return false;
        }
    }
    if (k.vera && !p.veracrypt) || (k.legacy && !p.legacy) {
        return false;
    }
    // With a PIM only VeraCrypt's KDFs are tried.
    !(p.veracrypt && p.pim != 0 && !k.vera)
}

/// A decrypted header and the chain that decrypted it.
type Found = (Zeroizing<[u8; HDR_LEN]>, &'static Chain);

/// Try every allowed chain on `enc` with one header key.
fn try_chains(key: &[u8], enc: &[u8; HDR_LEN], p: &Params) -> Result<Option<Found>, LuksError> {
    let mut any = false;
    for chain in CHAINS {
        if p.cipher.as_deref().is_some_and(|c| !chain.name.contains(c))
            || (chain.legacy && !p.legacy)
        {
            continue;
        }
        any = true;
        let Some(d) = decrypt_with(chain, key, enc) else {
            continue;
        };
        if &d[..4] == b"TRUE" || (p.veracrypt && &d[..4] == b"VERA") {
            return Ok(Some((d, chain)));
        }
    }
    if !any {
        return Err(LuksError::Usage(format!(
            "No TCRYPT cipher chain matches '{}'.",
            p.cipher.as_deref().unwrap_or("")
        )));
    }
    Ok(None)
}

/// Decrypt one 512-byte header with `pass`: every allowed KDF, every
/// allowed chain, in cryptsetup's order.
fn init(raw: &[u8; 512], pass: &[u8], p: &Params) -> Result<Header, LuksError> {
    let pool = key_pool(pass, p)?;
    let salt = &raw[..SALT_LEN];
    let enc: &[u8; HDR_LEN] = raw[SALT_LEN..]
        .try_into()
        .map_err(|_| LuksError::WrongPassphrase)?;
    for kdf in KDFS {
        if !kdf_allowed(kdf, p) {
            continue;
        }
        let Some(key) = derive(kdf, &pool, salt, p.pim)? else {
            continue;
        };
        if let Some((d, chain)) = try_chains(&key, enc, p)? {
            return parse(&d, kdf, chain);
        }
    }
    Err(LuksError::WrongPassphrase)
}

fn read_at(disk: &Disk, off: i64) -> Result<Zeroizing<[u8; 512]>, LuksError> {
    let size = disk.size()?;
    let at = if off < 0 {
        size.checked_sub(off.unsigned_abs())
    } else {
        Some(off as u64)
    };
    let mut b = Zeroizing::new([0u8; 512]);
    match at {
        Some(a) if a + 512 <= size => disk.read_at(a, &mut b[..])?,
        _ => {
            return Err(LuksError::Usage(format!(
                "Device {} is too small for a TCRYPT header.",
                disk.path().display()
            )))
        }
    }
    Ok(b)
}

/// Find and decrypt the header the options point at (normal, hidden,
/// backup, system), as cryptsetup's `TCRYPT_read_phdr`.
pub fn load(disk: &Disk, pass: &[u8], p: &Params) -> Result<Header, LuksError> {
    let offsets: &[i64] = if p.system {
        &[SYSTEM_OFFSET]
    } else if p.hidden && p.backup {
        &[HIDDEN_OFFSET_BACKUP]
    } else if p.hidden {
        &[HIDDEN_OFFSET, HIDDEN_OFFSET_OLD]
    } else if p.backup {
        &[BACKUP_OFFSET]
    } else {
        &[0]
    };
    check_cost(p, offsets.len())?;
    let mut last = LuksError::WrongPassphrase;
    for &off in offsets {
        // A device too small for one place may still hold the other.
        let raw = match read_at(disk, off) {
            Ok(r) => r,
            Err(e) => {
                last = e;
                continue;
            }
        };
        match init(&raw, pass, p) {
            Ok(h) => return Ok(h),
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl Header {
    pub fn cipher(&self) -> &'static str {
        self.chain.name
    }

    pub fn mode(&self) -> &'static str {
        self.chain.mode
    }

    /// Key bytes of the whole chain.
    pub fn key_size(&self) -> usize {
        self.chain.key_size
    }

    /// The chain's keys, first cipher first (cryptsetup's volume key).
    pub fn volume_key(&self) -> Zeroizing<Vec<u8>> {
        let mut k = Zeroizing::new(Vec::with_capacity(self.chain.key_size));
        for ci in self.chain.ciphers {
            k.extend_from_slice(&cipher_key(ci, self.chain.mode, &self.keys));
        }
        k
    }

    /// Where the data starts on the device, in 512-byte sectors
    /// (cryptsetup's `TCRYPT_get_data_offset`; `meta_size` is the size of
    /// the device the header was read from).
    pub fn data_offset(&self, p: &Params, meta_size: u64) -> u64 {
        let old_hidden = || {
            meta_size
                .saturating_sub(self.hidden_volume_size)
                .saturating_sub(1536)
                / 512
        };
        if p.system {
            return self.mk_offset / 512;
        }
        if self.chain.mode.starts_with("xts") {
            if self.version < 3 {
                return 1;
            }
            if p.hidden && self.version <= 3 {
                return old_hidden();
            }
        } else if p.hidden {
            return old_hidden();
        }
        self.mk_offset / 512
    }

    /// dm-crypt's iv_offset for the data (cryptsetup's `TCRYPT_get_iv_offset`).
    pub fn iv_offset(&self, p: &Params, meta_size: u64) -> u64 {
        if self.chain.mode.starts_with("xts") {
            self.data_offset(p, meta_size)
        } else if self.chain.mode.starts_with("lrw") {
            0
        } else {
            self.mk_offset / 512
        }
    }

    /// The volume's size in sectors as the header gives it (0: the rest
    /// of the device, for system volumes).
    pub fn size_sectors(&self, p: &Params) -> u64 {
        if p.system {
            0
        } else if p.hidden {
            self.hidden_volume_size / 512
        } else {
            self.volume_size / 512
        }
    }

    /// `tcryptDump`'s text, as cryptsetup 2.6 prints it (Argon2id, which
    /// it does not know, as later versions print it).
    pub fn dump_text(&self, device: &str) -> String {
        let kind = if self.vera { "VERACRYPT" } else { "TCRYPT" };
        let kdf = if self.kdf.hash == "argon2id" {
            "PBKDF:\t\tArgon2id\n".to_string()
        } else {
            format!("PBKDF2 hash:\t{}\n", self.kdf.hash)
        };
        format!(
            "{kind} header information for {device}\nVersion:       \t{}\nDriver req.:\t{:x}.{:x}\n\
             Sector size:\t{}\nMK offset:\t{}\n{kdf}Cipher chain:\t{}\nCipher mode:\t{}\nMK bits:       \t{}\n",
            self.version,
            self.version_tc >> 8,
            self.version_tc & 0xff,
            self.sector_size,
            self.mk_offset,
            self.chain.name,
            self.chain.mode,
            self.chain.key_size * 8
        )
    }

    /// Whether the chain is one of TrueCrypt's legacy blowfish and CBC
    /// cascade modes (`cbc-tcrypt`, `cbci-tcrypt`), which cryptsetup's
    /// `TCRYPT_activate` refuses because no kernel target maps them.
    pub fn legacy_mode(&self) -> bool {
        self.chain.mode.contains("-tcrypt")
    }

    /// Why cryptsetup would not map this volume, if it would not.
    pub fn activation_refusal(&self) -> Option<String> {
        if self.version == 0 || self.sector_size % 512 != 0 {
            return Some(format!(
                "Activation is not supported for {} sector size.",
                self.sector_size
            ));
        }
        None
    }

    /// One crypt line per cipher of the chain, outermost (the first
    /// cipher) first: `(index, cipher spec, key)`. Index `i > 0` is the
    /// device cryptsetup names `NAME_i`, stacked on `NAME_{i+1}`; the
    /// highest index sits on the data device. A legacy `-tcrypt` chain is
    /// one line: its passes share one IV seed and, for the outer CBC,
    /// every block goes through the whole chain, so it cannot be split
    /// into stacked devices; the spec is the chain and mode as
    /// `tcryptDump` prints them, the key cryptsetup's volume key.
    pub fn layers(&self) -> Vec<(usize, String, Zeroizing<Vec<u8>>)> {
        if self.chain.mode.ends_with("-tcrypt") {
            let spec = format!("{}-{}", self.chain.name, self.chain.mode);
            return vec![(0, spec, self.volume_key())];
        }
        self.chain
            .ciphers
            .iter()
            .enumerate()
            .map(|(i, ci)| {
                (
                    i,
                    format!("{}-{}", kernel_name(ci.name), self.chain.mode),
                    cipher_key(ci, self.chain.mode, &self.keys),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyfile_pool_adds_crc_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, b"A").unwrap();
        let p = Params {
            keyfiles: vec![f],
            ..Params::default()
        };
        let pool = key_pool(b"x", &p).unwrap();
        assert_eq!(pool.len(), POOL_TC);
        let crc = super::super::crc32_update(!0, b"A").to_be_bytes();
        assert_eq!(pool[0], crc[0].wrapping_add(b'x'));
        assert_eq!(&pool[1..4], &crc[1..]);
        assert!(pool[4..].iter().all(|&b| b == 0));
    }

    #[test]
    fn long_passphrase_switches_to_veracrypt_pool() {
        let p = Params {
            veracrypt: true,
            ..Params::default()
        };
        assert_eq!(key_pool(&[b'a'; 72], &p).unwrap().len(), 72);
        assert!(key_pool(&[b'a'; 129], &p).is_err());
        let tc = Params::default();
        assert!(key_pool(&[b'a'; 65], &tc).is_err());
    }

    #[test]
    fn pim_changes_iterations_and_is_bounded() {
        let sha512 = &KDFS[5];
        assert_eq!(kdf_cost(sha512, 0).unwrap(), (500_000, 0));
        assert_eq!(kdf_cost(sha512, 1234).unwrap(), (15000 + 1_234_000, 0));
        assert!(kdf_cost(sha512, u32::MAX).is_err());
        // One limit with LUKS: a PIM whose KDF work is above it is refused
        // naming the cost and the flag, unless the flag is given.
        let p = Params {
            veracrypt: true,
            pim: 2_000_000,
            ..Params::default()
        };
        let e = check_cost(&p, 1).unwrap_err().to_string();
        assert!(e.contains("TCRYPT") && e.contains("--no-kdf-limit"), "{e}");
        check_cost(
            &Params {
                no_cost_limit: true,
                ..p.clone()
            },
            1,
        )
        .unwrap();
        let usual = Params {
            veracrypt: true,
            legacy: true,
            ..Params::default()
        };
        check_cost(&usual, 2).unwrap();
        let argon = &KDFS[9];
        assert_eq!(kdf_cost(argon, 8).unwrap(), (5, 1024 * (64 + 7 * 32)));
        assert_eq!(kdf_cost(argon, 33).unwrap(), (15, 1024 * 1024));
    }

    #[test]
    fn filters_are_substrings() {
        let p = Params {
            hash: Some("sha".into()),
            veracrypt: true,
            legacy: true,
            ..Params::default()
        };
        let n = KDFS.iter().filter(|k| kdf_allowed(k, &p)).count();
        assert_eq!(n, 5, "sha512 x2, sha1, sha256 x2");
        let p = Params {
            hash: Some("xxxx".into()),
            ..Params::default()
        };
        assert!(KDFS.iter().all(|k| !kdf_allowed(k, &p)));
    }
}
