//! `cryptsetup status`'s report, line for line as cryptsetup 2.6.1's
//! `action_status` prints it, so scripts that read it (`grep mode:`,
//! `awk '/offset:/'`) read udm's the same way. Built from what the server
//! says of the device; never shows the key.

use crate::targets::crypt::CryptParams;
use std::fmt::Write;

/// What the report needs to know of an active crypt device.
pub(super) struct Report<'a> {
    /// The argument as given: a name (printed under /dev/mapper) or a path.
    pub arg: &'a str,
    pub in_use: bool,
    /// LUKS1, LUKS2, PLAIN or n/a.
    pub ty: &'a str,
    /// A LUKS2 header in reencryption.
    pub reencrypting: bool,
    /// The first crypt line.
    pub params: &'a CryptParams,
    /// Its key is a kernel keyring reference, not hex.
    pub keyring: bool,
    /// All lines, 512-byte sectors.
    pub size: u64,
    pub read_only: bool,
    pub suspended: bool,
    /// An authenticated LUKS2 volume: what cryptsetup reads from the
    /// header and the integrity device below instead of the crypt line.
    pub auth: Option<Auth>,
}

/// The lines of an authenticated volume (crypt over `NAME_dif`).
pub(super) struct Auth {
    /// The segment's `encryption` (`aes-xts-plain64`), not the crypt
    /// line's `capi:` spec.
    pub cipher: String,
    /// The segment's `integrity.type`.
    pub kind: String,
    /// The data device under the integrity device.
    pub device: String,
}

/// The integrity key's bytes within the volume key (`INTEGRITY_key_size`).
fn integrity_key_bytes(kind: &str) -> u32 {
    match kind {
        "hmac(sha1)" => 20,
        "hmac(sha256)" => 32,
        "hmac(sha512)" => 64,
        _ => 0,
    }
}

/// The header line: a name is shown under /dev/mapper, a path as given.
pub(super) fn head(arg: &str) -> String {
    if arg.contains('/') {
        arg.to_string()
    } else {
        format!("/dev/mapper/{arg}")
    }
}

/// The whole report, each line ending in a newline.
pub(super) fn text(r: &Report<'_>) -> String {
    let p = r.params;
    let mut o = String::new();
    let busy = if r.in_use { " and is in use" } else { "" };
    let _ = writeln!(o, "{} is active{busy}.", head(r.arg));
    let _ = writeln!(o, "  type:    {}", r.ty);
    if r.reencrypting {
        o.push_str("  reencryption:  in-progress\n");
    }
    let cipher = r.auth.as_ref().map_or(&p.cipher, |a| &a.cipher);
    let _ = writeln!(o, "  cipher:  {cipher}");
    let _ = writeln!(o, "  keysize: {} bits", p.key_bits());
    let loc = if r.keyring { "keyring" } else { "dm-crypt" };
    let _ = writeln!(o, "  key location: {loc}");
    if let Some(a) = &r.auth {
        let _ = writeln!(o, "  integrity: {}", a.kind);
        let k = integrity_key_bytes(&a.kind);
        if k != 0 {
            let _ = writeln!(o, "  integrity keysize: {} bits", k * 8);
        }
    }
    let device = r.auth.as_ref().map_or(&p.device, |a| &a.device);
    let _ = writeln!(o, "  device:  {device}");
    let _ = writeln!(o, "  sector size:  {}", p.options.sector_size);
    let _ = writeln!(o, "  offset:  {} sectors", p.offset);
    let _ = writeln!(o, "  size:    {} sectors", r.size);
    if p.iv_offset != 0 {
        let _ = writeln!(o, "  skipped: {} sectors", p.iv_offset);
    }
    let _ = writeln!(
        o,
        "  mode:    {}{}",
        if r.read_only {
            "readonly"
        } else {
            "read/write"
        },
        if r.suspended { " (suspended)" } else { "" }
    );
    // One line, cryptsetup's words, each but the last followed by a space
    // whether or not a later one is set (its printf does exactly that).
    let f = &p.options;
    let words = [
        (f.allow_discards, "discards "),
        (f.same_cpu_crypt, "same_cpu_crypt "),
        (f.submit_from_crypt_cpus, "submit_from_crypt_cpus "),
        (f.no_read_workqueue, "no_read_workqueue "),
        (f.no_write_workqueue, "no_write_workqueue"),
    ];
    if words.iter().any(|(on, _)| *on) {
        o.push_str("  flags:   ");
        for (on, w) in words {
            if on {
                o.push_str(w);
            }
        }
        o.push('\n');
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(line: &str) -> CryptParams {
        let args: Vec<String> = line.split(' ').map(str::to_string).collect();
        CryptParams::parse(&args).unwrap()
    }

    /// The expected text written out from cryptsetup 2.6.1's format
    /// strings (src/cryptsetup.c, action_status).
    fn expected(lines: &[&str]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn plain_active_device() {
        let key = "00".repeat(64);
        let p = params(&format!("aes-xts-plain64 {key} 0 /img 32768"));
        let r = Report {
            arg: "vol",
            in_use: false,
            ty: "LUKS2",
            reencrypting: false,
            params: &p,
            keyring: false,
            size: 8192,
            read_only: false,
            suspended: false,
            auth: None,
        };
        assert_eq!(
            text(&r),
            expected(&[
                "/dev/mapper/vol is active.",
                "  type:    LUKS2",
                "  cipher:  aes-xts-plain64",
                "  keysize: 512 bits",
                "  key location: dm-crypt",
                "  device:  /img",
                "  sector size:  512",
                "  offset:  32768 sectors",
                "  size:    8192 sectors",
                "  mode:    read/write",
            ])
        );
    }

    #[test]
    fn every_optional_line() {
        let key = "00".repeat(32);
        let p = params(&format!(
            "aes-cbc-essiv:sha256 {key} 8 /dev/x 4096 4 allow_discards no_write_workqueue \
             same_cpu_crypt sector_size:4096"
        ));
        let r = Report {
            arg: "/dev/mapper/vol",
            in_use: true,
            ty: "LUKS2",
            reencrypting: true,
            params: &p,
            keyring: true,
            size: 16,
            read_only: true,
            suspended: true,
            auth: None,
        };
        assert_eq!(
            text(&r),
            expected(&[
                "/dev/mapper/vol is active and is in use.",
                "  type:    LUKS2",
                "  reencryption:  in-progress",
                "  cipher:  aes-cbc-essiv:sha256",
                "  keysize: 256 bits",
                "  key location: keyring",
                "  device:  /dev/x",
                "  sector size:  4096",
                "  offset:  4096 sectors",
                "  size:    16 sectors",
                "  skipped: 8 sectors",
                "  mode:    readonly (suspended)",
                "  flags:   discards same_cpu_crypt no_write_workqueue",
            ])
        );
        // The trailing space of a word before an unset last word stays.
        let p = params(&format!("aes-xts-plain64 {key} 0 /d 0 1 allow_discards"));
        let r = Report { params: &p, ..r };
        assert!(text(&r).ends_with("  flags:   discards \n"));
    }

    /// cryptsetup 2.6.1 reads the cipher from the header and the device
    /// from the integrity device; the crypt line's offset (0) stays.
    #[test]
    fn authenticated_volume() {
        let key = "00".repeat(96);
        let p = params(&format!(
            "capi:authenc(hmac(sha256),xts(aes))-plain64 {key} 0 @vol_dif 0 2 \
             sector_size:4096 integrity:32:aead"
        ));
        let r = Report {
            arg: "vol",
            in_use: false,
            ty: "LUKS2",
            reencrypting: false,
            params: &p,
            keyring: false,
            size: 96736,
            read_only: false,
            suspended: false,
            auth: Some(Auth {
                cipher: "aes-xts-plain64".into(),
                kind: "hmac(sha256)".into(),
                device: "/img".into(),
            }),
        };
        assert_eq!(
            text(&r),
            expected(&[
                "/dev/mapper/vol is active.",
                "  type:    LUKS2",
                "  cipher:  aes-xts-plain64",
                "  keysize: 768 bits",
                "  key location: dm-crypt",
                "  integrity: hmac(sha256)",
                "  integrity keysize: 256 bits",
                "  device:  /img",
                "  sector size:  4096",
                "  offset:  0 sectors",
                "  size:    96736 sectors",
                "  mode:    read/write",
            ])
        );
    }

    #[test]
    fn head_of_a_path_is_the_path() {
        assert_eq!(head("x"), "/dev/mapper/x");
        assert_eq!(head("/dev/mapper/x"), "/dev/mapper/x");
    }
}
