//! Authenticated LUKS2 (a segment with `integrity`): the dm-integrity
//! device cryptsetup puts under the crypt device (`NAME_dif`, no internal
//! hash: the tags are dm-crypt's auth tag and random IV). luksFormat
//! writes its superblock at the data offset as the kernel does on the
//! first activation, then (unless `--integrity-no-wipe`) writes zeros
//! through the crypt layer so that every sector carries a tag that
//! authenticates; open reads the superblock back for the devices' size.

use std::path::Path;
use std::sync::Arc;

use super::error::LuksError;
use crate::core::{BlockDevice, WriteBuf};
use crate::store::OpenFlags;
use crate::targets::integrity::format::{self as iformat, Spec};
use crate::targets::integrity::params::{IntegrityParams, Mode, Options};
use crate::targets::integrity::superblock::{Superblock, SALT_SIZE};
use crate::targets::{DeviceResolver, TargetArgs, TargetOptions};

/// The integrity device under an authenticated segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// The segment's `integrity.type` (`hmac(sha256)`, `aead`, ...).
    pub kind: String,
    /// Tag bytes per sector: the auth tag, plus the IV when random.
    pub tag_size: u32,
    /// The segment's encryption sector size, also the integrity block size.
    pub sector_size: u32,
    /// Where the integrity superblock sits on the data device (the
    /// segment's offset), 512-byte sectors.
    pub offset_sectors: u64,
    /// What the integrity device provides (the superblock's
    /// `provided_data_sectors`): the size of both devices.
    pub provided_sectors: u64,
}

/// Bytes per sector an integrity device must keep for `cipher` with
/// `integrity` (the segment's `integrity.type`): the auth tag, plus the
/// IV when it is random. cryptsetup's `INTEGRITY_tag_size` for the modes
/// udm runs; 0 for a combination it cannot run.
pub fn integrity_tag_size(integrity: &str, cipher: &str) -> u32 {
    let mode = cipher.split_once('-').map_or("", |(_, m)| m);
    let iv = match mode {
        "xts-random" => 16,
        "gcm-random" => 12,
        "random" => 16,
        _ => 0,
    };
    match (integrity, mode) {
        ("aead", "gcm-random") => iv + 16,
        ("poly1305", "random") => 12 + 16,
        ("hmac(sha256)", "xts-random" | "xts-plain64") => iv + 32,
        ("hmac(sha512)", "xts-random" | "xts-plain64") => iv + 64,
        _ => 0,
    }
}

/// The name cryptsetup gives the integrity device under `name`.
pub fn dif_name(name: &str) -> String {
    format!("{name}_dif")
}

/// The device UUID cryptsetup gives `NAME_dif` (`dm_prepare_uuid` with
/// the type `INTEGRITY` and the volume's UUID without dashes).
pub fn dif_uuid(volume_uuid: &str, name: &str) -> String {
    format!(
        "CRYPT-INTEGRITY-{}-{}",
        volume_uuid.replace('-', ""),
        dif_name(name)
    )
}

fn io_err(what: String, e: impl std::fmt::Display) -> LuksError {
    LuksError::io(what, std::io::Error::other(e.to_string()))
}

fn open_data(image: &Path, write: bool) -> Result<Arc<dyn BlockDevice>, LuksError> {
    let spec = image
        .to_str()
        .ok_or_else(|| LuksError::Usage(format!("{}: the path is not UTF-8", image.display())))?;
    let flags = OpenFlags {
        read_only: !write,
        ..OpenFlags::default()
    };
    crate::store::open(spec, flags).map_err(|e| io_err(format!("cannot open {spec}"), e))
}

impl Layer {
    /// Reads the superblock luksFormat (or the kernel) wrote at the
    /// segment's offset and checks it against the header.
    pub fn read(
        image: &Path,
        kind: &str,
        tag_size: u32,
        sector_size: u32,
        offset: u64,
    ) -> Result<Layer, LuksError> {
        let dev = open_data(image, false)?;
        let mut b = vec![0u8; 4096];
        dev.read(offset, &mut b).map_err(|e| {
            io_err(
                format!(
                    "cannot read the integrity superblock of {}",
                    image.display()
                ),
                e,
            )
        })?;
        let sb = match Superblock::parse(&b) {
            Ok(Some(sb)) => sb,
            Ok(None) => {
                return Err(LuksError::Usage(format!(
                    "{}: no dm-integrity superblock at the data offset ({offset} bytes); \
                     the volume was formatted without one: format it again with \
                     `udm cryptsetup luksFormat --integrity`",
                    image.display()
                )))
            }
            Err(e) => return Err(LuksError::Usage(format!("{}: {e}", image.display()))),
        };
        if u32::from(sb.tag_size) != tag_size || sb.sector_size() != sector_size {
            return Err(LuksError::Usage(format!(
                "{}: the integrity superblock keeps {} tag bytes per {}-byte sector, the LUKS2 \
                 segment needs {tag_size} per {sector_size} (Unsupported device integrity \
                 configuration)",
                image.display(),
                sb.tag_size,
                sb.sector_size()
            )));
        }
        Ok(Layer {
            kind: kind.to_string(),
            tag_size,
            sector_size,
            offset_sectors: offset / 512,
            provided_sectors: sb.provided_data_sectors,
        })
    }

    /// Formats the integrity device at `offset` bytes of `image` as the
    /// kernel does when cryptsetup's `INTEGRITY_format` first maps it: J
    /// mode defaults, `fix_padding`, the whole device's size for the
    /// journal's default size.
    pub fn format(
        image: &Path,
        kind: &str,
        tag_size: u32,
        sector_size: u32,
        offset: u64,
    ) -> Result<Layer, LuksError> {
        let dev = open_data(image, true)?;
        let spec = Spec {
            start: offset / 512,
            tag_size,
            sector_size,
            fix_padding: true,
            fix_hmac: true,
            ..Spec::default()
        };
        // No internal hash: the kernel keeps no salt.
        let (sb, g) =
            iformat::superblock(&spec, dev.size() / 512, [0u8; SALT_SIZE]).map_err(|e| {
                LuksError::Usage(format!(
                    "cannot format integrity for {}: {e}",
                    image.display()
                ))
            })?;
        iformat::format(&*dev, &sb, &g, None, None).map_err(|e| {
            io_err(
                format!("cannot format integrity for {}", image.display()),
                e,
            )
        })?;
        Ok(Layer {
            kind: kind.to_string(),
            tag_size,
            sector_size,
            offset_sectors: offset / 512,
            provided_sectors: sb.provided_data_sectors,
        })
    }

    /// The `integrity` line's arguments over `dev` (mode J, or D for a
    /// wipe that needs no journal, as cryptsetup's `--integrity-no-journal`).
    pub fn table_args(&self, dev: &str, mode: Mode) -> String {
        IntegrityParams {
            dev: dev.to_string(),
            offset: self.offset_sectors,
            tag_size: Some(self.tag_size),
            mode,
            opts: Options {
                block_size: (self.sector_size != 512).then_some(self.sector_size),
                fix_padding: true,
                fix_hmac: true,
                ..Options::default()
            },
        }
        .table_args(false)
    }

    /// The whole table of `NAME_dif` over `dev`.
    pub fn table(&self, dev: &str, mode: Mode) -> String {
        format!(
            "0 {} integrity {}\n",
            self.provided_sectors,
            self.table_args(dev, mode)
        )
    }

    /// luksFormat's wipe (`_wipe_data_device`): zeros written through the
    /// crypt layer over a D-mode integrity device, so every sector gets a
    /// tag that authenticates. `crypt_spec` is the dm-crypt cipher with its
    /// `integrity:` option ([`super::cipher::authenticated_dm_cipher`]).
    pub fn wipe(
        &self,
        image: &Path,
        crypt_spec: &str,
        key: &[u8],
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), LuksError> {
        let data = open_data(image, true)?;
        let opts = TargetOptions::default();
        let len = self.provided_sectors * 512;
        let iargs: Vec<String> = self
            .table_args("data", Mode::Direct)
            .split(' ')
            .map(str::to_string)
            .collect();
        let dif = crate::targets::integrity::new(TargetArgs {
            args: &iargs,
            len,
            resolver: &mut One(data),
            options: &opts,
        })
        .map_err(|e| {
            LuksError::Usage(format!(
                "integrity device of {}: {}",
                image.display(),
                e.msg
            ))
        })?;
        let crypt = crypt_over(dif, crypt_spec, key, self.sector_size, len)?;
        let chunk = 1usize << 20;
        let mut buf = vec![0u8; chunk];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk as u64) as usize;
            buf[..n].fill(0);
            crypt
                .write(done, WriteBuf::Owned(&mut buf[..n]), false)
                .map_err(|e| io_err(format!("cannot wipe {}", image.display()), e))?;
            done += n as u64;
            progress(done);
        }
        crypt
            .flush()
            .map_err(|e| io_err(format!("cannot wipe {}", image.display()), e))
    }
}

/// The integrity device of `header`'s authenticated segment 0 on
/// `data` (None for a volume without integrity), its superblock read.
pub fn layer_of(header: &super::header::Header, data: &Path) -> Result<Option<Layer>, LuksError> {
    let Some(h) = header.luks2() else {
        return Ok(None);
    };
    let Some(seg) = h.meta.segments.get(&0).filter(|s| s.integrity) else {
        return Ok(None);
    };
    let i = &h.meta.value["segments"]["0"]["integrity"];
    let kind = i["type"].as_str().unwrap_or("");
    for j in ["journal_encryption", "journal_integrity"] {
        if i[j].as_str() != Some("none") {
            return Err(LuksError::Unsupported(format!(
                "segments.0.integrity.{j} other than \"none\" (Unsupported device integrity \
                 configuration)"
            )));
        }
    }
    let tag = integrity_tag_size(kind, &seg.encryption);
    if tag == 0 {
        return Err(LuksError::Unsupported(format!(
            "segments.0: cipher {} with integrity {kind} (udm runs aes-gcm-random with aead, \
             chacha20-random with poly1305, aes-xts-plain64 or aes-xts-random with \
             hmac(sha256) or hmac(sha512))",
            seg.encryption
        )));
    }
    Layer::read(data, kind, tag, seg.sector_size, seg.offset).map(Some)
}

/// A resolver that hands out one device whatever the line names.
struct One(Arc<dyn BlockDevice>);

impl DeviceResolver for One {
    fn resolve(&mut self, _spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        Ok(self.0.clone())
    }
}

/// The crypt target of an authenticated segment over `dif`; the key's hex
/// is wiped once the target holds the key.
fn crypt_over(
    dif: Arc<dyn crate::targets::Target>,
    crypt_spec: &str,
    key: &[u8],
    sector_size: u32,
    len: u64,
) -> Result<Arc<dyn crate::targets::Target>, LuksError> {
    let (cipher, integrity) = crypt_spec.split_once(' ').unwrap_or((crypt_spec, ""));
    let mut args = vec![
        cipher.to_string(),
        hex::encode(key),
        "0".into(),
        "dif".into(),
        "0".into(),
    ];
    let mut opts = vec![integrity.to_string()];
    if sector_size != 512 {
        opts.push(format!("sector_size:{sector_size}"));
    }
    args.push(opts.len().to_string());
    args.extend(opts);
    let dev: Arc<dyn BlockDevice> = dif;
    let r = crate::targets::crypt::new(TargetArgs {
        args: &args,
        len,
        resolver: &mut One(dev),
        options: &TargetOptions::default(),
    });
    zeroize::Zeroize::zeroize(&mut args[1]);
    r.map_err(|e| LuksError::Usage(format!("crypt layer ({cipher}): {}", e.msg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_table_are_cryptsetups() {
        assert_eq!(dif_name("vol"), "vol_dif");
        assert_eq!(
            dif_uuid("6f1a3c2e-8d4b-4c1a-9e2f-0123456789ab", "vol"),
            "CRYPT-INTEGRITY-6f1a3c2e8d4b4c1a9e2f0123456789ab-vol_dif"
        );
        let l = Layer {
            kind: "hmac(sha256)".into(),
            tag_size: 32,
            sector_size: 4096,
            offset_sectors: 32768,
            provided_sectors: 1000,
        };
        assert_eq!(
            l.table("/img", Mode::Journal),
            "0 1000 integrity /img 32768 32 J 3 block_size:4096 fix_padding fix_hmac\n"
        );
        let l = Layer {
            sector_size: 512,
            ..l
        };
        assert_eq!(
            l.table_args("/img", Mode::Direct),
            "/img 32768 32 D 2 fix_padding fix_hmac"
        );
    }
}
