//! `journal_crypt:` and `journal_mac:`: the journal on disk as the kernel
//! protects it (`dm-integrity.c`: `create_journal`, `xor_journal`,
//! `crypt_journal`, `section_mac`, `sb_mac`), so a journal written by udm
//! replays in the kernel and the other way round.
//!
//! - `journal_mac`: each section's 8 entry sectors carry 8 bytes each of
//!   one digest over (with `FIXED_HMAC`) the salt and the section number,
//!   then every entry's sector field; with `FIXED_HMAC` the superblock's
//!   first sector ends with a digest of the rest of it. A wrong key is
//!   caught there, or by the sections' MACs.
//! - `journal_crypt` with a stream cipher (`ctr(aes)`, `chacha20`): the
//!   journal is XORed with the keystream of an all-zero IV, byte for byte
//!   from the journal's start; the keystream that follows the journal
//!   (rounded up to 4 KiB pages) encrypts the four commit ID bases.
//! - with a block cipher (`cbc(aes)`): each section is encrypted whole,
//!   its IV the encryption of its number (little-endian u32, zero-padded
//!   to a block) under an all-zero IV.
//!
//! The MAC is computed on the plain section, before encryption.

use zeroize::Zeroizing;

use super::journal::{self, Ids, KERNEL_IDS};
use super::layout::{Geometry, JOURNAL_BLOCK_SECTORS, JOURNAL_MAC_PER_SECTOR, JOURNAL_SECTOR_DATA};
use super::params::AlgSpec;
use super::superblock::{flags, Superblock, SALT_SIZE};
use super::tags::Alg;
use crate::core::{BlockDevice, DevResult, WriteBuf};
use aes::cipher::consts::U16;
use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

const PAGE: u64 = 4096;

type Block = Array<u8, U16>;

fn as_blocks(data: &mut [u8]) -> &mut [Block] {
    Array::slice_as_chunks_mut(data).0
}

/// AES of any key size (the crate's types zeroize their schedules).
enum Aes {
    A128(aes::Aes128),
    A192(aes::Aes192),
    A256(aes::Aes256),
}

impl Aes {
    fn new(name: &str, key: &[u8]) -> Result<Aes, String> {
        let bad = |_| format!("journal_crypt: {name}: bad key");
        Ok(match key.len() {
            16 => Aes::A128(aes::Aes128::new_from_slice(key).map_err(bad)?),
            24 => Aes::A192(aes::Aes192::new_from_slice(key).map_err(bad)?),
            32 => Aes::A256(aes::Aes256::new_from_slice(key).map_err(bad)?),
            n => {
                return Err(format!(
                    "journal_crypt: {name} takes a key of 128, 192 or 256 bits, not {}",
                    n * 8
                ))
            }
        })
    }

    fn encrypt_blocks(&self, b: &mut [Block]) {
        match self {
            Aes::A128(c) => c.encrypt_blocks(b),
            Aes::A192(c) => c.encrypt_blocks(b),
            Aes::A256(c) => c.encrypt_blocks(b),
        }
    }

    fn decrypt_blocks(&self, b: &mut [Block]) {
        match self {
            Aes::A128(c) => c.decrypt_blocks(b),
            Aes::A192(c) => c.decrypt_blocks(b),
            Aes::A256(c) => c.decrypt_blocks(b),
        }
    }
}

enum Crypt {
    /// The keystream over the whole journal (the kernel's `journal_xor`).
    Stream(Zeroizing<Vec<u8>>),
    /// The cipher and each section's IV.
    Cbc(Box<Aes>, Vec<Block>),
}

/// How one device's journal is sealed on disk.
pub struct Seal {
    mac: Option<Alg>,
    salt: Option<[u8; SALT_SIZE]>,
    crypt: Option<Crypt>,
    ids: Ids,
    section_bytes: usize,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal")
    }
}

/// The keystream of `name` keyed with `key` from an all-zero IV, `len`
/// bytes; `None`: not a stream cipher udm has.
fn keystream(name: &str, key: &[u8], len: usize) -> Result<Option<Zeroizing<Vec<u8>>>, String> {
    let mut ks = Zeroizing::new(vec![0u8; len.div_ceil(16) * 16]);
    match name {
        "ctr(aes)" => {
            let c = aes_cipher(name, key)?;
            for (n, b) in as_blocks(&mut ks).iter_mut().enumerate() {
                b.copy_from_slice(&(n as u128).to_be_bytes());
            }
            c.encrypt_blocks(as_blocks(&mut ks));
        }
        "chacha20" => {
            use chacha20::cipher::{KeyIvInit, StreamCipher};
            let key: &[u8; 32] = key.try_into().map_err(|_| {
                format!(
                    "journal_crypt: chacha20 takes a 256-bit key, not {} bits",
                    key.len() * 8
                )
            })?;
            chacha20::ChaCha20::new(key.into(), &[0u8; 12].into()).apply_keystream(&mut ks);
        }
        _ => return Ok(None),
    }
    ks.truncate(len);
    Ok(Some(ks))
}

fn aes_cipher(name: &str, key: &[u8]) -> Result<Aes, String> {
    Aes::new(name, key)
}

fn crypt_of(spec: &AlgSpec, g: &Geometry) -> Result<(Crypt, Ids), String> {
    let key = spec.key.as_ref().filter(|k| !k.is_empty()).ok_or_else(|| {
        format!(
            "journal_crypt:{} needs a key (journal_crypt:ALG:HEXKEY)",
            spec.name
        )
    })?;
    let journal = g.journal_sections * g.section_sectors * 512;
    let pages = journal.div_ceil(PAGE) * PAGE;
    if let Some(ks) = keystream(&spec.name, key, (pages + 32) as usize)? {
        // The bases are encrypted by the keystream after the journal's
        // pages, then made distinct as the kernel does.
        let mut ids = KERNEL_IDS;
        for k in 0..ids.len() {
            let at = pages as usize + 8 * k;
            let mut b = ids[k].to_le_bytes();
            b.iter_mut().zip(&ks[at..at + 8]).for_each(|(x, y)| *x ^= y);
            let mut id = u64::from_le_bytes(b);
            while ids[..k].contains(&id) {
                id = id.wrapping_add(1);
            }
            ids[k] = id;
        }
        let mut ks = ks;
        ks.truncate(journal as usize);
        return Ok((Crypt::Stream(ks), ids));
    }
    if spec.name != "cbc(aes)" {
        return Err(format!(
            "journal_crypt: udm has ctr(aes), chacha20 and cbc(aes), not '{}'",
            spec.name
        ));
    }
    let c = aes_cipher(&spec.name, key)?;
    let ivs = (0..g.journal_sections)
        .map(|i| {
            let mut b = Block::default();
            b[..4].copy_from_slice(&(i as u32).to_le_bytes());
            c.encrypt_blocks(std::slice::from_mut(&mut b));
            b
        })
        .collect();
    Ok((Crypt::Cbc(Box::new(c), ivs), KERNEL_IDS))
}

/// Whether `journal_crypt` keeps a keystream as long as the journal
/// (the stream ciphers; `cbc(aes)` keeps one IV per section).
fn keeps_keystream(crypt: Option<&AlgSpec>) -> bool {
    crypt.is_some_and(|c| c.name != "cbc(aes)")
}

/// Reserve, from the server's pinned memory, what `J` mode's in-memory
/// journal and a stream cipher's keystream will take, before either is
/// allocated: each fits half of RAM alone, but not every device's together.
pub fn pin_journal(
    options: &crate::targets::TargetOptions,
    p: &super::params::IntegrityParams,
    g: &Geometry,
) -> Result<crate::mem::Pinned, String> {
    let in_memory = p.mode == super::params::Mode::Journal;
    let ks = keeps_keystream(p.opts.journal_crypt.as_ref());
    let bytes = super::layout::pinned_journal_bytes(g, in_memory, ks);
    let what = format!(
        "integrity on {}: its journal of {} sections of {} sectors{}",
        p.dev,
        g.journal_sections,
        g.section_sectors,
        match (in_memory, ks) {
            (true, true) => " (kept in memory, and its keystream)",
            (true, false) => " (kept in memory)",
            _ => "'s keystream",
        }
    );
    options.pin(
        &what,
        bytes,
        "format the device with a smaller journal (`udm integritysetup format --journal-size`)",
    )
}

impl Seal {
    /// The seal a line's `journal_crypt`/`journal_mac` asks for over the
    /// device whose superblock is `sb`; `None` when it asks for neither.
    pub fn new(
        crypt: Option<&AlgSpec>,
        mac: Option<&AlgSpec>,
        sb: &Superblock,
        g: &Geometry,
    ) -> Result<Option<Seal>, String> {
        if crypt.is_none() && mac.is_none() {
            return Ok(None);
        }
        let mac = mac
            .map(|m| Alg::new(&m.name, m.key.clone()).map_err(|e| format!("journal_mac: {e}")))
            .transpose()?;
        let (crypt, ids) = match crypt {
            Some(c) => {
                let (c, ids) = crypt_of(c, g)?;
                (Some(c), ids)
            }
            None => (None, KERNEL_IDS),
        };
        Ok(Some(Seal {
            mac,
            salt: sb.has(flags::FIXED_HMAC).then_some(sb.salt),
            crypt,
            ids,
            section_bytes: (g.section_sectors * 512) as usize,
        }))
    }

    /// The commit ID bases this journal uses.
    pub fn ids(&self) -> &Ids {
        &self.ids
    }

    fn section_mac(&self, mac: &Alg, g: &Geometry, i: u64, buf: &[u8]) -> [u8; 64] {
        let sectors = journal::entry_sectors(g, buf);
        let n = (i).to_le_bytes();
        let mut parts: Vec<&[u8]> = Vec::with_capacity(3);
        if let Some(s) = &self.salt {
            parts.push(s);
            parts.push(&n);
        }
        parts.push(&sectors);
        let mut d = mac.digest(&parts);
        d[mac.digest_size().min(64)..].fill(0);
        d
    }

    /// MACs and encrypts section `i` (plain, as filled) in place.
    pub fn seal(&self, g: &Geometry, i: u64, buf: &mut [u8]) {
        if let Some(m) = &self.mac {
            let d = self.section_mac(m, g, i, buf);
            for j in 0..JOURNAL_BLOCK_SECTORS as usize {
                let at = j * 512 + JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR;
                buf[at..at + JOURNAL_MAC_PER_SECTOR].copy_from_slice(
                    &d[j * JOURNAL_MAC_PER_SECTOR..(j + 1) * JOURNAL_MAC_PER_SECTOR],
                );
            }
        }
        self.crypt(i, buf, true);
    }

    /// Decrypts section `i` as read from disk, in place.
    pub fn unseal(&self, i: u64, buf: &mut [u8]) {
        self.crypt(i, buf, false);
    }

    /// Whether the plain section `i` carries its MAC (true without a MAC).
    pub fn mac_ok(&self, g: &Geometry, i: u64, buf: &[u8]) -> bool {
        let Some(m) = &self.mac else {
            return true;
        };
        let d = self.section_mac(m, g, i, buf);
        (0..JOURNAL_BLOCK_SECTORS as usize).all(|j| {
            let at = j * 512 + JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR;
            buf[at..at + JOURNAL_MAC_PER_SECTOR]
                == d[j * JOURNAL_MAC_PER_SECTOR..(j + 1) * JOURNAL_MAC_PER_SECTOR]
        })
    }

    fn crypt(&self, i: u64, buf: &mut [u8], encrypt: bool) {
        match &self.crypt {
            None => {}
            Some(Crypt::Stream(ks)) => {
                let (at, n) = (i as usize * self.section_bytes, buf.len());
                buf.iter_mut()
                    .zip(&ks[at..at + n])
                    .for_each(|(x, y)| *x ^= y);
            }
            Some(Crypt::Cbc(c, ivs)) => {
                let iv = ivs[i as usize];
                if encrypt {
                    let mut prev = iv;
                    for b in as_blocks(buf) {
                        b.iter_mut().zip(prev.iter()).for_each(|(x, y)| *x ^= y);
                        c.encrypt_blocks(std::slice::from_mut(b));
                        prev = *b;
                    }
                } else {
                    let saved = buf.to_vec();
                    let blocks = as_blocks(buf);
                    c.decrypt_blocks(blocks);
                    for (k, b) in blocks.iter_mut().enumerate() {
                        let p = if k == 0 {
                            &iv[..]
                        } else {
                            &saved[(k - 1) * 16..k * 16]
                        };
                        b.iter_mut().zip(p).for_each(|(x, y)| *x ^= y);
                    }
                }
            }
        }
    }

    /// The superblock MAC (`FIXED_HMAC` with `journal_mac`) over `bytes`.
    pub fn sb_mac(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let m = self.mac.as_ref().filter(|_| self.salt.is_some())?;
        Some(m.digest(&[bytes])[..m.digest_size()].to_vec())
    }

    /// Whether the superblock sector `sb` carries its MAC (true when it
    /// has none to carry).
    pub fn sb_mac_ok(&self, sb: &[u8]) -> bool {
        let Some(m) = self.mac.as_ref().filter(|_| self.salt.is_some()) else {
            return true;
        };
        let n = m.digest_size();
        let at = 512 - n;
        m.digest(&[&sb[..at]])[..n] == sb[at..512]
    }

    /// Writes an empty journal, every section sealed with sequence
    /// number `seq` (not flushed).
    pub fn write_empty(&self, dev: &dyn BlockDevice, g: &Geometry, seq: u8) -> DevResult<()> {
        let mut buf = vec![0u8; self.section_bytes];
        for i in 0..g.journal_sections {
            journal::fill_section_in(g, &self.ids, &mut buf, i, seq, &[]);
            self.seal(g, i, &mut buf);
            dev.write(
                g.journal_sector(i, 0) * 512,
                WriteBuf::Borrowed(&buf),
                false,
            )?;
        }
        Ok(())
    }
}
