//! dm-crypt cipher specification parsing.
//!
//! The kernel accepts two spellings (`aes-xts-plain64` and
//! `capi:xts(aes)-plain64`) and splits them with different rules (first `-`
//! versus last `-`); both are reproduced here exactly so a table that loads in
//! the kernel parses the same way here, and one the kernel rejects is rejected.
//! Anything the kernel knows but udm cannot honour is refused *by name*, so the
//! user learns that the volume is valid but unsupported, not malformed.

use super::CryptoError;

/// Block cipher algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    Aes,
    Serpent,
    Twofish,
    Camellia,
    /// 8-byte block: only the chain modes that take any block size.
    Cast5,
    /// 8-byte block, big-endian as the kernel's `blowfish`.
    Blowfish,
    /// 8-byte block: triple DES with three keys (the kernel's `des3_ede`).
    Des3Ede,
    /// GOST R 34.12-2015's 128-bit block cipher, 256-bit key.
    Kuznyechik,
    /// Adiantum's pair `xchacha12,aes` (only with the adiantum mode).
    XChaCha12Aes,
    /// Adiantum's pair `xchacha20,aes`.
    XChaCha20Aes,
    /// `cipher_null`: identity, key size 0.
    Null,
}

impl Alg {
    pub fn name(self) -> &'static str {
        match self {
            Alg::Aes => "aes",
            Alg::Serpent => "serpent",
            Alg::Twofish => "twofish",
            Alg::Camellia => "camellia",
            Alg::Cast5 => "cast5",
            Alg::Blowfish => "blowfish",
            Alg::Des3Ede => "des3_ede",
            Alg::Kuznyechik => "kuznyechik",
            Alg::XChaCha12Aes => "xchacha12,aes",
            Alg::XChaCha20Aes => "xchacha20,aes",
            Alg::Null => "cipher_null",
        }
    }

    /// Cipher block size in bytes, which is also dm-crypt's IV size for
    /// the chain modes that take one (never below 8: the kernel widens it
    /// so a 64-bit sector number fits).
    pub fn block_size(self) -> usize {
        match self {
            Alg::Cast5 | Alg::Blowfish | Alg::Des3Ede => 8,
            _ => 16,
        }
    }
}

/// Chaining mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chain {
    Ecb,
    Cbc,
    Xts,
    /// The kernel's `lrw` template: the last 16 key bytes are the tweak key.
    Lrw,
    /// The wide-block `adiantum` template (a 32-byte IV).
    Adiantum,
}

impl Chain {
    pub fn name(self) -> &'static str {
        match self {
            Chain::Ecb => "ecb",
            Chain::Cbc => "cbc",
            Chain::Xts => "xts",
            Chain::Lrw => "lrw",
            Chain::Adiantum => "adiantum",
        }
    }
}

/// The hash of an ESSIV salt, by its kernel crypto API name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EssivHash {
    Sha1,
    Sha256,
    Sha512,
    Rmd160,
    /// Whirlpool truncated to 256 bits (the kernel's `wp256`).
    Wp256,
    Wp384,
    Wp512,
}

impl EssivHash {
    fn from_name(name: &str) -> Option<EssivHash> {
        Some(match name {
            "sha1" => EssivHash::Sha1,
            "sha256" => EssivHash::Sha256,
            "sha512" => EssivHash::Sha512,
            "rmd160" => EssivHash::Rmd160,
            "wp256" => EssivHash::Wp256,
            "wp384" => EssivHash::Wp384,
            "wp512" => EssivHash::Wp512,
            _ => return None,
        })
    }
}

/// IV generator (dm-crypt `ivmode[:ivopts]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IvMode {
    /// No IV (ecb, or an ivmode ignored because the chain mode takes none).
    None,
    Plain,
    Plain64,
    Plain64Be,
    /// `essiv:HASH`: plain64 encrypted with the hash of the key.
    Essiv(EssivHash),
    Benbi,
    Null,
    /// loop-AES compatibility (v2 with 64 keys, v3 with a 65th as seed).
    Lmk,
    /// TrueCrypt before 4.1: seeded IV plus ciphertext whitening.
    Tcw,
    /// BitLocker: the encrypted byte offset of the sector.
    Eboiv,
    /// BitLocker's Elephant diffuser on top of `eboiv`.
    Elephant,
    /// udm only: TrueCrypt's legacy CBC chains (`CHAIN-cbc-tcrypt`,
    /// `CHAIN-cbci-tcrypt`), tcw's IV and whitening per CBC pass. The
    /// chain itself is in the spec text (`tcrypt_cbc.rs`); `alg` is its
    /// first cipher.
    TcryptCbc,
}

/// A parsed cipher specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherSpec {
    pub alg: Alg,
    pub chain: Chain,
    pub iv: IvMode,
    /// Number of transforms the key is split into (legacy `cipher:N-...`).
    pub keycount: u32,
}

/// Largest key count accepted (the kernel has no fixed limit; 64 is what lmk
/// uses and more makes no sense for a real volume).
const MAX_KEYCOUNT: u32 = 64;

fn err(spec: &str, msg: impl std::fmt::Display) -> CryptoError {
    CryptoError::new(format!("cipher spec '{spec}': {msg}"))
}

fn parse_alg(spec: &str, name: &str) -> Result<Alg, CryptoError> {
    match name {
        "aes" => Ok(Alg::Aes),
        "serpent" => Ok(Alg::Serpent),
        "twofish" => Ok(Alg::Twofish),
        "camellia" => Ok(Alg::Camellia),
        "cast5" => Ok(Alg::Cast5),
        "blowfish" => Ok(Alg::Blowfish),
        "des3_ede" => Ok(Alg::Des3Ede),
        "kuznyechik" => Ok(Alg::Kuznyechik),
        "xchacha12,aes" => Ok(Alg::XChaCha12Aes),
        "xchacha20,aes" => Ok(Alg::XChaCha20Aes),
        "cipher_null" => Ok(Alg::Null),
        "" => Err(err(spec, "cipher name is missing")),
        other => Err(err(
            spec,
            format!(
                "cipher '{other}' is not supported by udm (supported: aes, serpent, twofish, camellia, kuznyechik, cast5, blowfish, des3_ede, cipher_null; xchacha12,aes and xchacha20,aes with adiantum)"
            ),
        )),
    }
}

fn parse_chain(spec: &str, name: &str) -> Result<Chain, CryptoError> {
    match name {
        "ecb" => Ok(Chain::Ecb),
        "cbc" => Ok(Chain::Cbc),
        "xts" => Ok(Chain::Xts),
        "lrw" => Ok(Chain::Lrw),
        "adiantum" => Ok(Chain::Adiantum),
        "gcm" | "ccm" | "rfc4106" | "rfc4309" | "rfc7539" | "rfc7539esp" | "authenc" | "aegis128"
        | "aegis256" | "morus640" | "morus1280" => Err(err(
            spec,
            format!(
                "chain mode '{name}' is an AEAD/integrity mode, which needs dm-integrity; udm does not support it"
            ),
        )),
        "" => Err(err(spec, "chain mode is missing")),
        other => Err(err(
            spec,
            format!("chain mode '{other}' is not supported by udm (supported: xts, lrw, cbc, ecb, adiantum)"),
        )),
    }
}

fn parse_iv(spec: &str, mode: &str, opts: Option<&str>) -> Result<IvMode, CryptoError> {
    let no_opts = |iv: IvMode| match opts {
        None | Some("") => Ok(iv),
        Some(o) => Err(err(
            spec,
            format!("IV mode '{mode}' takes no options, got ':{o}'"),
        )),
    };
    match mode {
        "plain" => no_opts(IvMode::Plain),
        "plain64" => no_opts(IvMode::Plain64),
        "plain64be" => no_opts(IvMode::Plain64Be),
        "benbi" => no_opts(IvMode::Benbi),
        "null" => no_opts(IvMode::Null),
        "lmk" => no_opts(IvMode::Lmk),
        "tcw" => no_opts(IvMode::Tcw),
        "eboiv" => no_opts(IvMode::Eboiv),
        "elephant" => no_opts(IvMode::Elephant),
        "essiv" => match opts {
            None | Some("") => Err(err(spec, "digest algorithm missing for ESSIV mode (use essiv:sha256)")),
            Some(h) => EssivHash::from_name(h).map(IvMode::Essiv).ok_or_else(|| err(
                spec,
                format!("ESSIV hash '{h}' is not supported by udm (supported: sha1, sha256, sha512, rmd160, wp256, wp384, wp512)"),
            )),
        },
        "random" => Err(err(
            spec,
            "IV mode 'random' needs dm-integrity to store the IVs; udm does not support it",
        )),
        other => Err(err(
            spec,
            format!(
                "invalid IV mode '{other}' (supported: plain, plain64, plain64be, essiv:HASH, benbi, null, lmk, tcw, eboiv, elephant)"
            ),
        )),
    }
}

/// Adiantum and its cipher pair go together, and its 32-byte IV takes
/// only the IV modes that just place a sector number.
fn check_adiantum(spec: &str, alg: Alg, chain: Chain, iv: IvMode) -> Result<(), CryptoError> {
    let pair = matches!(alg, Alg::XChaCha12Aes | Alg::XChaCha20Aes);
    match (pair, chain == Chain::Adiantum) {
        (true, false) => Err(err(
            spec,
            format!(
                "'{}' is adiantum's cipher pair: use {}-adiantum-plain64",
                alg.name(),
                alg.name()
            ),
        )),
        (false, true) => Err(err(
            spec,
            format!(
                "adiantum takes xchacha12,aes or xchacha20,aes, not '{}'",
                alg.name()
            ),
        )),
        (true, true)
            if !matches!(
                iv,
                IvMode::Plain | IvMode::Plain64 | IvMode::Plain64Be | IvMode::Benbi | IvMode::Null
            ) =>
        {
            Err(err(
                spec,
                "adiantum takes the IV modes plain, plain64, plain64be, benbi or null",
            ))
        }
        _ => Ok(()),
    }
}

/// Most ciphers in a TrueCrypt chain.
pub const MAX_TCRYPT_CHAIN: usize = 3;

/// How the ciphers of a TrueCrypt legacy CBC chain are chained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cascade {
    /// One CBC pass per cipher (`cbc-tcrypt`; TrueCrypt's "inner CBC").
    Inner,
    /// One CBC pass of the whole chain as a block cipher (`cbci-tcrypt`;
    /// TrueCrypt's "outer CBC").
    Outer,
}

/// One cipher of a TrueCrypt chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcryptPart {
    pub alg: Alg,
    /// TrueCrypt's blowfish (`blowfish_le`): the kernel's blowfish on
    /// byte-swapped 32-bit words.
    pub le: bool,
}

impl TcryptPart {
    /// The key size TrueCrypt used for the cipher.
    pub fn key_len(self) -> usize {
        match self.alg {
            Alg::Blowfish => 56,
            Alg::Cast5 => 16,
            Alg::Des3Ede => 24,
            _ => 32,
        }
    }
}

/// udm only: a `CHAIN-cbc-tcrypt` / `CHAIN-cbci-tcrypt` spec, TrueCrypt's
/// legacy CBC chains that the kernel cannot map (`tcrypt_cbc.rs` has the
/// format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcryptChain {
    parts: [Option<TcryptPart>; MAX_TCRYPT_CHAIN],
    pub cascade: Cascade,
}

impl TcryptChain {
    /// The ciphers, first applied first on encryption.
    pub fn parts(&self) -> impl DoubleEndedIterator<Item = TcryptPart> + '_ {
        self.parts.iter().flatten().copied()
    }

    /// The IV seed and whitening bytes at the key's end: the largest
    /// block size (the IV of its passes) plus 16.
    pub fn seed_len(&self) -> usize {
        self.parts().map(|p| p.alg.block_size()).max().unwrap_or(16) + 16
    }

    /// The whole key's length: every cipher's key, then the seed.
    pub fn key_len(&self) -> usize {
        self.parts().map(TcryptPart::key_len).sum::<usize>() + self.seed_len()
    }
}

fn parse_tcrypt_part(spec: &str, name: &str) -> Result<TcryptPart, CryptoError> {
    let alg = match name {
        "aes" => Alg::Aes,
        "serpent" => Alg::Serpent,
        "twofish" => Alg::Twofish,
        "blowfish_le" => Alg::Blowfish,
        "cast5" => Alg::Cast5,
        "des3_ede" => Alg::Des3Ede,
        "blowfish" => {
            return Err(err(
                spec,
                "TrueCrypt's blowfish is the little-endian one: name it blowfish_le",
            ))
        }
        other => {
            return Err(err(
                spec,
                format!(
                    "cipher '{other}' is not one of TrueCrypt's CBC ciphers (aes, serpent, twofish, blowfish_le, cast5, des3_ede)"
                ),
            ))
        }
    };
    Ok(TcryptPart {
        alg,
        le: name == "blowfish_le",
    })
}

/// Parse `spec` if it is one of udm's TrueCrypt legacy CBC specs (None:
/// another spec).
pub fn tcrypt_chain(spec: &str) -> Option<Result<TcryptChain, CryptoError>> {
    let (chain, cascade) = if let Some(c) = spec.strip_suffix("-cbc-tcrypt") {
        (c, Cascade::Inner)
    } else {
        (spec.strip_suffix("-cbci-tcrypt")?, Cascade::Outer)
    };
    Some(parse_tcrypt_chain(spec, chain, cascade))
}

fn parse_tcrypt_chain(
    spec: &str,
    chain: &str,
    cascade: Cascade,
) -> Result<TcryptChain, CryptoError> {
    let names: Vec<&str> = chain.split('-').collect();
    if chain.is_empty() || names.len() > MAX_TCRYPT_CHAIN {
        return Err(err(
            spec,
            "a TrueCrypt chain is one to three ciphers joined by '-' (e.g. serpent-twofish-aes)",
        ));
    }
    let mut parts = [None; MAX_TCRYPT_CHAIN];
    for (slot, name) in parts.iter_mut().zip(&names) {
        *slot = Some(parse_tcrypt_part(spec, name)?);
    }
    let c = TcryptChain { parts, cascade };
    let mut sizes = c.parts().map(|p| p.alg.block_size());
    let first = sizes.next().unwrap_or(16);
    if cascade == Cascade::Outer && sizes.any(|s| s != first) {
        return Err(err(
            spec,
            "cbci-tcrypt (outer CBC) needs ciphers of one block size; TrueCrypt chained mixed ones with cbc-tcrypt",
        ));
    }
    Ok(c)
}

/// Parse a dm-crypt cipher specification.
pub fn parse(spec: &str) -> Result<CipherSpec, CryptoError> {
    if spec.is_empty() {
        return Err(CryptoError::new("cipher spec is empty"));
    }
    if spec.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CryptoError::new(
            "cipher spec contains whitespace or control characters",
        ));
    }
    if let Some(chain) = tcrypt_chain(spec) {
        let c = chain?;
        return Ok(CipherSpec {
            alg: c.parts().next().map_or(Alg::Aes, |p| p.alg),
            chain: Chain::Cbc,
            iv: IvMode::TcryptCbc,
            keycount: 1,
        });
    }
    let (alg, chain, ivmode, ivopts, keycount) = if let Some(api) = spec.strip_prefix("capi:") {
        parse_capi(spec, api)?
    } else {
        parse_legacy(spec)?
    };
    let iv = match (chain, ivmode) {
        // ECB takes no IV: the kernel ignores an ivmode (with a warning).
        (Chain::Ecb, _) => IvMode::None,
        (_, None) | (_, Some("")) => return Err(err(spec, "IV mechanism required")),
        (_, Some(m)) => parse_iv(spec, m, ivopts)?,
    };
    if alg == Alg::Null && chain != Chain::Ecb {
        return Err(err(spec, "cipher_null is only supported with ecb"));
    }
    check_adiantum(spec, alg, chain, iv)?;
    if matches!(chain, Chain::Xts | Chain::Lrw) && alg.block_size() != 16 {
        return Err(err(
            spec,
            format!(
                "{} needs a 16-byte block cipher; {} has 8-byte blocks (use cbc)",
                chain.name(),
                alg.name()
            ),
        ));
    }
    if matches!(iv, IvMode::Eboiv | IvMode::Elephant) && alg.block_size() != 16 {
        return Err(err(
            spec,
            format!(
                "IV mode eboiv/elephant needs a 16-byte block cipher, not {}",
                alg.name()
            ),
        ));
    }
    Ok(CipherSpec {
        alg,
        chain,
        iv,
        keycount,
    })
}

type Parts<'a> = (Alg, Chain, Option<&'a str>, Option<&'a str>, u32);

/// `cipher[:keycount]-chainmode-ivmode[:ivopts]`, split as the kernel's
/// `crypt_ctr_cipher_old` does (first `-`, next `-`, then first `:`).
fn parse_legacy(spec: &str) -> Result<Parts<'_>, CryptoError> {
    if spec.contains('(') {
        return Err(err(
            spec,
            "'(' is only allowed in the capi: form (e.g. capi:xts(aes)-plain64)",
        ));
    }
    let mut it = spec.splitn(3, '-');
    let cipher_kc = it.next().unwrap_or("");
    let chain = it.next();
    let rest = it.next();
    let (cipher, keycount) = match cipher_kc.split_once(':') {
        None => (cipher_kc, 1),
        Some((c, kc)) => {
            let n = crate::core::units::parse_decimal(kc)
                .ok()
                .filter(|n| n.is_power_of_two() && *n <= u64::from(MAX_KEYCOUNT))
                .map(|n| n as u32)
                .ok_or_else(|| {
                    err(
                        spec,
                        format!(
                            "bad cipher key count '{kc}' (a power of two from 1 to {MAX_KEYCOUNT})"
                        ),
                    )
                })?;
            (c, n)
        }
    };
    let (ivmode, ivopts) = match rest {
        None => (None, None),
        Some(r) => match r.split_once(':') {
            None => (Some(r), None),
            Some((m, o)) => (Some(m), Some(o)),
        },
    };
    let alg = parse_alg(spec, cipher)?;
    // Compatibility default of the original mapping format: a bare cipher,
    // or chainmode `plain` without an ivmode, means cbc-plain.
    let (chain, ivmode) = match (chain, ivmode) {
        (None, _) | (Some("plain"), None) => (Chain::Cbc, Some("plain")),
        (Some(c), m) => (parse_chain(spec, c)?, m),
    };
    Ok((alg, chain, ivmode, ivopts, keycount))
}

/// `capi:<api>-ivmode[:ivopts]`, split as `crypt_ctr_cipher_new` does (last
/// `:` then last `-`).
fn parse_capi<'a>(spec: &'a str, api: &'a str) -> Result<Parts<'a>, CryptoError> {
    let (api, ivopts) = match api.rsplit_once(':') {
        Some((a, o)) => (a, Some(o)),
        None => (api, None),
    };
    let (api, ivmode) = match api.rsplit_once('-') {
        Some((a, m)) => (a, Some(m)),
        None => (api, None),
    };
    if api.starts_with("authenc(") || (api.starts_with("essiv(") && api.contains("authenc")) {
        return Err(err(
            spec,
            format!("'{api}' is an AEAD/integrity construction, which udm does not support"),
        ));
    }
    let open = api.find('(');
    let (chain_name, inner) = match (open, api.strip_suffix(')')) {
        (Some(i), Some(body)) if i > 0 => (&api[..i], &body[i + 1..]),
        _ => {
            return Err(err(
                spec,
                format!("crypto API spec '{api}' is not of the form mode(cipher), e.g. xts(aes)"),
            ))
        }
    };
    let chain = parse_chain(spec, chain_name)?;
    let pair = chain == Chain::Adiantum && !inner.contains('(');
    if inner.contains('(') || (inner.contains(',') && !pair) {
        return Err(err(
            spec,
            format!("nested crypto API spec '{inner}' is not supported by udm"),
        ));
    }
    let alg = parse_alg(spec, inner)?;
    // The capi form has no key count; lmk implies loop-AES's 64 keys.
    let keycount = if ivmode == Some("lmk") { 64 } else { 1 };
    Ok((alg, chain, ivmode, ivopts, keycount))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CipherSpec {
        parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn legacy_and_capi_forms_agree() {
        let a = p("aes-xts-plain64");
        assert_eq!(a, p("capi:xts(aes)-plain64"));
        assert_eq!(a.alg, Alg::Aes);
        assert_eq!(a.chain, Chain::Xts);
        assert_eq!(a.iv, IvMode::Plain64);
        assert_eq!(p("aes-cbc-essiv:sha256"), p("capi:cbc(aes)-essiv:sha256"));
        assert_eq!(
            p("aes-cbc-essiv:sha256").iv,
            IvMode::Essiv(EssivHash::Sha256)
        );
        assert_eq!(p("aes-xts-essiv:wp256").iv, IvMode::Essiv(EssivHash::Wp256));
        assert_eq!(p("aes-lrw-benbi"), p("capi:lrw(aes)-benbi"));
        assert_eq!(p("aes-lrw-plain64").chain, Chain::Lrw);
        assert_eq!(p("camellia-xts-plain64").alg, Alg::Camellia);
        assert_eq!(p("blowfish-cbc-essiv:sha256").alg, Alg::Blowfish);
        assert_eq!(p("cast5-cbc-plain64").alg, Alg::Cast5);
        assert_eq!(p("serpent-cbc-tcw").iv, IvMode::Tcw);
        assert_eq!(p("aes-cbc-elephant").iv, IvMode::Elephant);
        assert_eq!(p("aes-cbc-eboiv").iv, IvMode::Eboiv);
        assert_eq!(p("aes:64-cbc-lmk").keycount, 64);
        let a = p("xchacha12,aes-adiantum-plain64");
        assert_eq!((a.alg, a.chain), (Alg::XChaCha12Aes, Chain::Adiantum));
        assert_eq!(a, p("capi:adiantum(xchacha12,aes)-plain64"));
        assert_eq!(p("xchacha20,aes-adiantum-plain64").alg, Alg::XChaCha20Aes);
        assert_eq!(p("capi:cbc(aes)-lmk").keycount, 64);
        assert_eq!(p("serpent-cbc-plain64be").iv, IvMode::Plain64Be);
        assert_eq!(p("twofish-xts-benbi").iv, IvMode::Benbi);
    }

    #[test]
    fn compatibility_defaults() {
        let cbc_plain = p("aes-cbc-plain");
        assert_eq!(p("aes"), cbc_plain);
        assert_eq!(p("aes-plain"), cbc_plain);
        assert_eq!(p("aes-ecb").iv, IvMode::None);
        assert_eq!(p("aes-ecb-plain64").iv, IvMode::None);
        assert_eq!(p("cipher_null-ecb").alg, Alg::Null);
        assert_eq!(p("capi:ecb(cipher_null)").alg, Alg::Null);
    }

    #[test]
    fn keycount() {
        assert_eq!(p("aes:4-cbc-plain64").keycount, 4);
        assert!(parse("aes:3-cbc-plain64").is_err());
        assert!(parse("aes:0-cbc-plain64").is_err());
        assert!(parse("aes:x-cbc-plain64").is_err());
    }

    #[test]
    fn tcrypt_chains_parse_and_refuse_by_name() {
        let c = |s: &str| {
            tcrypt_chain(s)
                .unwrap()
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        let l = c("serpent-blowfish_le-aes-cbc-tcrypt");
        assert_eq!(l.cascade, Cascade::Inner);
        assert_eq!(l.key_len(), 152, "cryptsetup's key size for this chain");
        assert!(l.parts().nth(1).unwrap().le);
        assert_eq!(c("blowfish_le-cbc-tcrypt").key_len(), 80);
        assert_eq!(c("blowfish_le-aes-cbc-tcrypt").key_len(), 120);
        let l = c("serpent-twofish-aes-cbci-tcrypt");
        assert_eq!((l.cascade, l.key_len()), (Cascade::Outer, 128));
        let s = p("blowfish_le-aes-cbc-tcrypt");
        assert_eq!((s.alg, s.iv), (Alg::Blowfish, IvMode::TcryptCbc));
        assert!(tcrypt_chain("aes-cbc-tcw").is_none());
        assert!(tcrypt_chain("aes-xts-plain64").is_none());
        for (s, word) in [
            ("blowfish-cbc-tcrypt", "blowfish_le"),
            ("camellia-cbc-tcrypt", "camellia"),
            ("-cbc-tcrypt", "one to three"),
            ("aes-aes-aes-aes-cbc-tcrypt", "one to three"),
            ("blowfish_le-aes-cbci-tcrypt", "one block size"),
        ] {
            let e = parse(s).expect_err(s).to_string();
            assert!(e.contains(word), "{s}: {e}");
        }
    }

    #[test]
    fn refusals_name_the_part() {
        for (s, word) in [
            ("aes-cbc-elephant:sha256", "no options"),
            ("aes-cbc-random", "dm-integrity"),
            ("blowfish-xts-plain64", "16-byte block"),
            ("cast5-lrw-benbi", "16-byte block"),
            ("blowfish-cbc-elephant", "16-byte block"),
            ("xchacha12,aes-xts-plain64", "adiantum's cipher pair"),
            ("aes-adiantum-plain64", "xchacha12,aes"),
            ("xchacha12,aes-adiantum-essiv:sha256", "IV modes"),
            (
                "capi:adiantum(xchacha12,aes,nhpoly1305)-plain64",
                "not supported",
            ),
            ("capi:gcm(aes)-random", "gcm"),
            ("capi:authenc(hmac(sha256),xts(aes))-random", "AEAD"),
            ("aes-cbc-essiv:md4", "md4"),
            ("aes-xts", "IV mechanism required"),
            ("aes-xts-bogus", "bogus"),
            ("des-cbc-plain", "des"),
            ("aes-ctr-plain64", "ctr"),
            ("aes-xts(x)-plain64", "capi"),
            ("capi:xts-plain64", "mode(cipher)"),
            ("cipher_null-cbc-plain", "cipher_null"),
            ("aes-xts-plain64:x", "no options"),
        ] {
            let e = parse(s).expect_err(s).to_string();
            assert!(e.contains(word), "{s}: {e}");
        }
    }
}
