//! The cross-option rules cryptsetup checks before running an action (its
//! `verify_*` functions and main's own checks), one function per action
//! that has its own, so each stays readable beside cryptsetup's.

use super::args::Args;

type Checked = Result<(), String>;

/// The cross-option rules cryptsetup checks before running an action
/// (its `verify_*` functions and main's own checks).
pub(super) fn verify(
    a: &Args,
    action: &str,
    argv: &[String],
    ty: Option<&str>,
) -> Result<(), String> {
    options(a, ty)?;
    match action {
        "open" => open(a, ty)?,
        "close" if a.has("cancel-deferred") && a.has("deferred") => {
            return Err(
                "Options --cancel-deferred and --deferred cannot be used at the same time.".into(),
            );
        }
        "resize" if a.has("device-size") && a.has("size") => {
            return Err("Options --device-size and --size cannot be combined.".into());
        }
        "reencrypt" => reencrypt(a)?,
        "config" if a.has("priority") && !a.has("key-slot") => {
            return Err("Keyslot specification is required.".into());
        }
        "luksFormat" => format(a)?,
        "luksAddKey" if a.has("unbound") && a.u32("key-size").unwrap_or(0) == 0 => {
            return Err("Key size is required with --unbound option.".into());
        }
        "luksDump" if a.has("unbound") && !a.has("key-slot") => {
            return Err("Keyslot specification is required.".into());
        }
        "token" => token(a, argv)?,
        _ => {}
    }
    not_in_udm(a)
}

/// Option values checked for every action.
fn options(a: &Args, ty: Option<&str>) -> Checked {
    if a.key_files > 1 && ty != Some("tcrypt") {
        return Err("Only one --key-file argument is allowed.".into());
    }
    if let Some(p) = a.str("pbkdf") {
        if !["pbkdf2", "argon2i", "argon2id"].contains(&p) {
            return Err("Password-based key derivation function (PBKDF) can be only pbkdf2 or argon2i/argon2id.".into());
        }
    }
    if a.has("pbkdf-force-iterations") && a.has("iter-time") {
        return Err(
            "PBKDF forced iterations cannot be combined with iteration time option.".into(),
        );
    }
    if a.has("keyslot-cipher") != a.has("keyslot-key-size") {
        return Err(
            "Options --keyslot-cipher and --keyslot-key-size must be used together.".into(),
        );
    }
    if let Some(k) = a.u32("key-size") {
        if k % 8 != 0 {
            return Err("Key size must be a multiple of 8 bits".into());
        }
    }
    if let Some(s) = a.i32("key-slot") {
        if s < 0 {
            return Err("Key slot is invalid.".into());
        }
    }
    if let Some(s) = a.u32("sector-size") {
        if !(512..=4096).contains(&s) || !s.is_power_of_two() {
            return Err("Unsupported encryption sector size.".into());
        }
    }
    if let Some(p) = a.str("priority") {
        if !["normal", "prefer", "ignore"].contains(&p) {
            return Err("Option --priority can be only ignore/normal/prefer.".into());
        }
    }
    if a.u64("hotzone-size") == Some(0) {
        return Err("Invalid max reencryption hotzone size specification.".into());
    }
    if let Some(d) = a.u64("device-size") {
        if d == 0 || d % 512 != 0 {
            return Err("Device size must be multiple of 512 bytes sector.".into());
        }
    }
    Ok(())
}

fn open(a: &Args, ty: Option<&str>) -> Checked {
    let plain = ty == Some("plain");
    if a.has("persistent") && a.has("test-passphrase") {
        return Err("Option --persistent is not allowed with --test-passphrase.".into());
    }
    if a.has("refresh") && a.has("test-passphrase") {
        return Err("Options --refresh and --test-passphrase are mutually exclusive.".into());
    }
    if a.has("shared") && !plain {
        return Err("Option --shared is allowed only for open of plain device.".into());
    }
    if a.has("skip") && !plain && ty != Some("loopaes") {
        return Err(
            "Option --skip is supported only for open of plain and loopaes devices.".into(),
        );
    }
    if a.has("offset") && !plain && ty != Some("loopaes") {
        return Err(
            "Option --offset with open action is only supported for plain and loopaes devices."
                .into(),
        );
    }
    if a.has("sector-size") && !plain {
        return Err(
            "Sector size option with open action is supported only for plain devices.".into(),
        );
    }
    if a.has("iv-large-sectors") && (!plain || a.u32("sector-size").unwrap_or(512) <= 512) {
        return Err("Large IV sectors option is supported only for opening plain type device with sector size larger than 512 bytes.".into());
    }
    let luks_like = ty.is_none_or(|t| t.starts_with("luks"))
        || matches!(ty, Some("tcrypt" | "bitlk" | "fvault2"));
    if a.has("test-passphrase") && !luks_like {
        return Err("Option --test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and FVAULT2 devices.".into());
    }
    if a.has("device-size") && a.has("size") {
        return Err("Options --device-size and --size cannot be combined.".into());
    }
    if a.has("unbound") && !a.has("test-passphrase") {
        return Err("Option --unbound cannot be used without --test-passphrase.".into());
    }
    Ok(())
}

fn reencrypt(a: &Args) -> Checked {
    if let Some(r) = a.u64("reduce-device-size") {
        if r > 1 << 30 {
            return Err("Maximum device reduce size is 1 GiB.".into());
        }
        if r % 512 != 0 {
            return Err("Reduce size must be multiple of 512 bytes sector.".into());
        }
    }
    if a.has("reduce-device-size") && a.has("device-size") {
        return Err("Options --reduce-device-size and --data-size cannot be combined.".into());
    }
    if a.has("active-name") && a.has("force-offline-reencrypt") {
        return Err(
            "Options --active-name and --force-offline-reencrypt cannot be combined.".into(),
        );
    }
    Ok(())
}

fn format(a: &Args) -> Checked {
    if a.has("align-payload") && a.has("offset") {
        return Err("Options --align-payload and --offset cannot be combined.".into());
    }
    if a.has("integrity-no-wipe") && !a.has("integrity") {
        return Err("Option --integrity-no-wipe can be used only for format action with integrity extension.".into());
    }
    if a.has("use-random") && a.has("use-urandom") {
        return Err("Only one of --use-[u]random options is allowed.".into());
    }
    Ok(())
}

fn token(a: &Args, argv: &[String]) -> Checked {
    let verb = argv.first().map(String::as_str).unwrap_or("");
    if !["add", "remove", "import", "export", "unassign"].contains(&verb) {
        return Err("Invalid token action.".into());
    }
    if verb == "add" && !a.has("key-description") {
        return Err("--key-description parameter is mandatory for token add action.".into());
    }
    if !a.has("token-id") && (verb == "remove" || verb == "export") {
        return Err("Action requires specific token. Use --token-id parameter.".into());
    }
    if a.has("unbound") {
        if verb != "add" {
            return Err("Option --unbound is valid only with token add action.".into());
        }
        if a.has("key-slot") {
            return Err("Options --key-slot and --unbound cannot be combined.".into());
        }
    }
    if verb == "unassign" {
        if !a.has("key-slot") {
            return Err("Action requires specific keyslot. Use --key-slot parameter.".into());
        }
        if !a.has("token-id") {
            return Err("Action requires specific token. Use --token-id parameter.".into());
        }
    }
    Ok(())
}

/// cryptsetup 2.6.1 options udm knows but does not do, each refused by
/// name rather than accepted and ignored.
const NOT_IN_UDM: [(&str, &str); 9] = [
    (
        "persistent",
        "udm does not store activation flags in the LUKS2 header; pass them to every open",
    ),
    (
        "shared",
        "udm does not map one device into several shared plain mappings",
    ),
    (
        "new-token-id",
        "udm does not bind a token to the new keyslot; use `token add --key-slot` after",
    ),
    (
        "cancel-deferred",
        "udm's control socket has no cancel for a deferred removal",
    ),
    (
        "serialize-memory-hard-pbkdf",
        "udm does not take a lock across processes around Argon2; each process keeps to its own memory limit",
    ),
    (
        "block-size",
        "it sets the block size of LUKS1's offline reencryption, which udm does not do (LUKS2's online reencryption takes --hotzone-size)",
    ),
    (
        "use-directio",
        "it belongs to LUKS1's offline reencryption, which udm does not do",
    ),
    (
        "use-fsync",
        "it belongs to LUKS1's offline reencryption, which udm does not do",
    ),
    (
        "write-log",
        "it belongs to LUKS1's offline reencryption, which udm does not do",
    ),
];

/// Options that turn off something udm never does, so they hold as
/// given; `--verbose` says so for each.
pub(super) const ALWAYS_SO: [(&str, &str); 4] = [
    (
        "disable-external-tokens",
        "udm loads no external token plugins",
    ),
    (
        "disable-keyring",
        "udm never loads volume keys into the kernel keyring (its server holds them)",
    ),
    ("disable-locks", "udm takes no cryptsetup metadata locks"),
    ("force-password", "udm applies no password quality rules"),
];

fn not_in_udm(a: &Args) -> Checked {
    match NOT_IN_UDM.iter().find(|(o, _)| a.has(o)) {
        Some((o, why)) => Err(format!("Option --{o} is not supported by udm: {why}.")),
        None => Ok(()),
    }
}
