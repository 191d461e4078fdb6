//! Plain dm-crypt (`open --type plain`): no header, the key comes straight
//! from the passphrase by cryptsetup's rules, so a volume made by
//! `cryptsetup open --type plain` years ago opens with the same options.
//!
//! Key rules (cryptsetup 2.6, `crypt_plain_hash` and the plain `open`):
//! - a key file (not `-`) is never hashed: its first key-size bytes from
//!   `--keyfile-offset` are the key (`--hash` and `--keyfile-size` are
//!   ignored) and a shorter file is an error;
//! - a passphrase (terminal, a line of stdin, or `--key-file -`) is hashed
//!   with `--hash` (default ripemd160): the key is hash(pass) truncated to
//!   the key size, and when the hash is shorter than the key each further
//!   round hashes one more `A` before the passphrase ("hashalot" rule);
//!   `hash:N` hashes into the first N bytes and zero-fills the rest;
//! - `--hash plain` uses the passphrase itself (zero-padded or truncated;
//!   `plain:N` needs at least N bytes).
//!
//! The mapping is `0 <size> crypt <cipher> <key> <skip> <dev> <offset>`
//! plus `sector_size:`/`iv_large_sectors` and the discard/workqueue flags.

use super::error::LuksError;
use super::hash::HashAlg;
use super::passphrase::KeySource;
use super::secret::SecretBuf;
use zeroize::Zeroizing;

/// cryptsetup's plain defaults.
pub const DEFAULT_CIPHER: &str = "aes-cbc-essiv:sha256";
pub const DEFAULT_KEY_BITS: u32 = 256;
pub const DEFAULT_HASH: &str = "ripemd160";

/// Everything `open --type plain` takes.
#[derive(Clone, Debug)]
pub struct PlainParams {
    pub cipher: String,
    pub key_bytes: usize,
    /// `--hash` as given (None: the default); ignored for key files.
    pub hash: Option<String>,
    /// Data start on the device, 512-byte sectors (`--offset`).
    pub offset: u64,
    /// IV offset, 512-byte sectors (`--skip`).
    pub skip: u64,
    /// Mapped length in sectors (`--size`); None: to the end.
    pub size: Option<u64>,
    pub sector_size: u32,
    pub iv_large_sectors: bool,
    /// dm-crypt flags (allow_discards, ...), in cryptsetup's order.
    pub flags: Vec<&'static str>,
}

impl Default for PlainParams {
    fn default() -> Self {
        PlainParams {
            cipher: DEFAULT_CIPHER.into(),
            key_bytes: (DEFAULT_KEY_BITS / 8) as usize,
            hash: None,
            offset: 0,
            skip: 0,
            size: None,
            sector_size: 512,
            iv_large_sectors: false,
            flags: Vec::new(),
        }
    }
}

/// cryptsetup's `crypt_plain_hash`: `spec` is `hash[:len]` or `plain[:len]`.
pub fn hash_passphrase(spec: &str, key_bytes: usize, pass: &[u8]) -> Result<SecretBuf, LuksError> {
    if spec == "plain" {
        // No hash: the passphrase itself, truncated or zero-padded.
        let mut k = SecretBuf::with_capacity(key_bytes);
        let n = pass.len().min(key_bytes);
        k.extend(&pass[..n]).map_err(|()| oversize())?;
        k.extend(&vec![0u8; key_bytes - n])
            .map_err(|()| oversize())?;
        return Ok(k);
    }
    let (name, len) = match spec.split_once(':') {
        Some((n, l)) => {
            let l: usize = l.parse().map_err(|_| {
                LuksError::Usage(format!("Key processing error (using hash {spec})."))
            })?;
            if l > key_bytes {
                return Err(LuksError::Usage(format!(
                    "Key processing error (using hash {spec}): hash length {l} is larger than the key ({key_bytes} bytes)."
                )));
            }
            (n, l)
        }
        None => (spec, key_bytes),
    };
    let mut key = SecretBuf::with_capacity(key_bytes);
    if name == "plain" {
        if pass.len() < len {
            return Err(LuksError::Usage(format!(
                "Key processing error (using hash {spec}): passphrase shorter than {len} bytes."
            )));
        }
        key.extend(&pass[..len]).map_err(|()| oversize())?;
    } else {
        let h = HashAlg::from_name(name)
            .ok_or_else(|| LuksError::Usage(format!("Hash algorithm {name} not supported.")))?;
        let mut round = 0usize;
        while key.len() < len {
            let prefix = vec![b'A'; round];
            let d = Zeroizing::new(h.digest(&[&prefix, pass]));
            let take = d.len().min(len - key.len());
            key.extend(&d[..take]).map_err(|()| oversize())?;
            round += 1;
        }
    }
    key.extend(&vec![0u8; key_bytes - len])
        .map_err(|()| oversize())?;
    Ok(key)
}

fn oversize() -> LuksError {
    LuksError::Usage("plain key larger than its buffer".into())
}

/// The volume key of a plain device, read and processed as cryptsetup
/// does (module docs). `keyfile_size` is `--keyfile-size` (0: none).
pub fn plain_key(p: &PlainParams, src: &KeySource, prompt: &str) -> Result<SecretBuf, LuksError> {
    let file = src
        .key_file
        .as_deref()
        .filter(|f| *f != std::path::Path::new("-"));
    if file.is_some() {
        // Raw key bytes: exactly the key size, never hashed.
        let mut s = src.clone();
        s.size = Some(p.key_bytes as u64);
        return s.read(prompt, false);
    }
    let hash = p.hash.as_deref().unwrap_or(DEFAULT_HASH);
    let hash = (hash != "plain").then_some(hash);
    let mut s = src.clone();
    if src.key_file.is_some() && hash.is_none() {
        // `--key-file -` with no hash: key-size bytes of stdin.
        s.size = Some(p.key_bytes as u64);
    }
    let pass = s.read(prompt, false)?;
    hash_passphrase(hash.unwrap_or("plain"), p.key_bytes, &pass)
}

/// The dm-crypt table of a plain device over `dev` of `dev_size` bytes.
pub fn table(
    p: &PlainParams,
    key: &[u8],
    dev: &str,
    dev_size: u64,
) -> Result<Zeroizing<String>, LuksError> {
    use std::fmt::Write;
    if !(512..=4096).contains(&p.sector_size) || !p.sector_size.is_power_of_two() {
        return Err(LuksError::Usage(
            "Unsupported encryption sector size.".into(),
        ));
    }
    let ss = u64::from(p.sector_size / 512);
    let len = match p.size {
        Some(s) => s,
        None => (dev_size / 512)
            .checked_sub(p.offset)
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                LuksError::Usage(format!(
                    "Device {dev} is too small for a plain mapping at offset {} sectors.",
                    p.offset
                ))
            })?,
    };
    if p.size.is_some_and(|s| p.offset + s > dev_size / 512) {
        return Err(LuksError::Usage(format!(
            "Device {dev} is too small for {len} sectors at offset {}.",
            p.offset
        )));
    }
    if len % ss != 0 {
        return Err(LuksError::Usage(
            "Device size is not aligned to requested sector size.".into(),
        ));
    }
    let mut opts: Vec<String> = p.flags.iter().map(|f| f.to_string()).collect();
    if p.iv_large_sectors {
        opts.push("iv_large_sectors".into());
    }
    if p.sector_size != 512 {
        opts.push(format!("sector_size:{}", p.sector_size));
    }
    let cap = 256
        + p.cipher.len()
        + 2 * key.len()
        + dev.len()
        + opts.iter().map(|o| o.len() + 1).sum::<usize>();
    let mut out = Zeroizing::new(String::with_capacity(cap));
    let _ = write!(out, "0 {len} crypt {} ", p.cipher);
    for b in key {
        let _ = write!(out, "{b:02x}");
    }
    let _ = write!(out, " {} {dev} {}", p.skip, p.offset);
    if !opts.is_empty() {
        let _ = write!(out, " {} {}", opts.len(), opts.join(" "));
    }
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hx(spec: &str, bits: usize, pass: &[u8]) -> String {
        hex::encode(&*hash_passphrase(spec, bits / 8, pass).unwrap())
    }

    /// Expected keys from cryptsetup's own plain-mode test (password-hash-test).
    #[test]
    fn keys_as_cryptsetup_derives_them() {
        assert_eq!(
            hx("ripemd160", 256, b"xxx"),
            "aeb26d1f69eb6dddfb9381eed4d7299f091e99aa5d3ff06866d4ce9f620f7aca"
        );
        assert_eq!(
            hx("ripemd160", 128, b"xxx"),
            "aeb26d1f69eb6dddfb9381eed4d7299f"
        );
        assert_eq!(
            hx("sha1", 256, b"xxx"),
            "b60d121b438a380c343d5ec3c2037564b82ffef30b1e0a6ad9af7a73aa91c197"
        );
        assert_eq!(
            hx("sha256", 256, b"xxx"),
            "cd2eb0837c9b4c962c22d2ff8b5441b7b45805887f051d39bf133b583baf6860"
        );
        assert_eq!(
            hx("sha256", 256, b"xxx\n"),
            "042aea10a0f14f2d391373599be69d53a75dde9951fc3d3cd10b6100aa7a9f24"
        );
        assert_eq!(
            hx("sha256:20", 256, b"xxx"),
            "cd2eb0837c9b4c962c22d2ff8b5441b7b4580588000000000000000000000000"
        );
        assert_eq!(
            hx("plain", 256, b"xxxxxxxx"),
            "7878787878787878000000000000000000000000000000000000000000000000"
        );
        assert_eq!(
            hx("plain:2", 256, b"xxxxxxxx"),
            "7878000000000000000000000000000000000000000000000000000000000000"
        );
        assert!(hash_passphrase("plain:9", 32, b"xxxxxxxx").is_err());
        assert!(hash_passphrase("sha256:", 32, b"xxx").is_err());
        assert!(hash_passphrase("sha256:xx", 32, b"xxx").is_err());
        assert_eq!(
            hx("sha1", 256, b"0123456789abcdef"),
            "fe5567e8d769550852182cdf69d74bb16dff8e295e4b6077d6d3fc73e7fe33b0"
        );
        assert_eq!(
            hx("sha224", 256, b"0123456789abcdef"),
            "7330215f6741fd2bacbd3658681a70f65e2e90a02887989018974ce83775a568"
        );
        assert_eq!(
            hx("sha384", 256, b"0123456789abcdef"),
            "fc6304023487cb6f85ac80e47817760c6b153c02da46c6429649e963b031e525"
        );
        assert_eq!(
            hx("sha512", 256, b"0123456789abcdef"),
            "1c043fbe4bca7c7920dae536c680fd44c15d71ec12cd82a2a9491b0043b57f4d"
        );
        assert_eq!(
            hx("ripemd160", 256, b"0123456789abcdef"),
            "edf4e38018cd71dd489b9c1e54b32054eb42dfad9fdcc22d629d756391a24982"
        );
    }

    #[test]
    fn plain_table_layout() {
        let p = PlainParams {
            offset: 8,
            skip: 16,
            sector_size: 4096,
            iv_large_sectors: true,
            flags: vec!["allow_discards"],
            ..PlainParams::default()
        };
        let t = table(&p, &[0xab; 32], "/dev/x", 1 << 20).unwrap();
        assert_eq!(
            &*t,
            &format!(
                "0 2040 crypt aes-cbc-essiv:sha256 {} 16 /dev/x 8 3 allow_discards iv_large_sectors sector_size:4096\n",
                "ab".repeat(32)
            )
        );
    }
}
