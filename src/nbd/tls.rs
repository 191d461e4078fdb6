//! TLS for NBD (`NBD_OPT_STARTTLS`) with rustls, configured the way nbdkit
//! and qemu are: `--tls=off|on|require`, `--tls-certificates DIR` holding
//! `ca-cert.pem`, `server-cert.pem` and `server-key.pem`, and
//! `--tls-verify-peer` to accept only clients with a certificate signed by
//! that CA (access control by certificate). So scripts and certificate
//! directories made for nbdkit or qemu-nbd carry over unchanged.
//!
//! Pre-shared keys (nbdkit's `--tls-psk`) are not offered: rustls has no
//! TLS-PSK support for external keys, and no maintained pure-Rust TLS
//! stack of comparable quality has it either.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// nbdkit's `--tls` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: STARTTLS is refused.
    #[default]
    Off,
    /// TLS offered: a client may upgrade, or stay in plain text.
    On,
    /// TLS required: every option but STARTTLS and ABORT is refused with
    /// `NBD_REP_ERR_TLS_REQD` until the client upgraded.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "no" => Ok(TlsMode::Off),
            "on" | "yes" => Ok(TlsMode::On),
            "require" | "required" => Ok(TlsMode::Require),
            _ => Err(format!("--tls expects off, on or require, got '{s}'")),
        }
    }
}

/// TLS settings of a server.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    pub mode: TlsMode,
    /// Directory with `server-cert.pem`, `server-key.pem` (and
    /// `ca-cert.pem` for `verify_peer`).
    pub certificates: Option<PathBuf>,
    /// Require a client certificate signed by `ca-cert.pem`.
    pub verify_peer: bool,
}

/// Refuse options that cannot take effect: an administrator who gave
/// `--tls-verify-peer` believes clients need a certificate, and a server
/// that silently serves plain clients then is worse than one that does
/// not start.
pub fn check_options(opts: &TlsOptions) -> Result<(), String> {
    if opts.mode != TlsMode::Off {
        return Ok(());
    }
    if opts.verify_peer {
        return Err(
            "--tls-verify-peer has no effect without --tls: add --tls=require \
                    (every client then needs a certificate signed by ca-cert.pem)"
                .into(),
        );
    }
    if opts.certificates.is_some() {
        return Err(
            "--tls-certificates has no effect without --tls: add --tls=require \
                    (or --tls=on), or drop --tls-certificates"
                .into(),
        );
    }
    Ok(())
}

/// The rustls server configuration for `opts`, or `None` with TLS off.
pub fn server_config(opts: &TlsOptions) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    check_options(opts)?;
    if opts.mode == TlsMode::Off {
        return Ok(None);
    }
    let dir = opts.certificates.as_deref().ok_or(
        "--tls=on/require needs --tls-certificates DIR (with server-cert.pem and server-key.pem)",
    )?;
    let certs = load_certs(&dir.join("server-cert.pem"))?;
    let key_path = dir.join("server-key.pem");
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| {
        format!(
            "cannot read the TLS private key {}: {e} (a PEM private key is expected)",
            key_path.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS setup: {e}"))?;
    let builder = if opts.verify_peer {
        let ca_path = dir.join("ca-cert.pem");
        let mut roots = rustls::RootCertStore::empty();
        for c in load_certs(&ca_path)? {
            roots
                .add(c)
                .map_err(|e| format!("{}: unusable CA certificate: {e}", ca_path.display()))?;
        }
        let v =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("--tls-verify-peer: {e}"))?;
        builder.with_client_cert_verifier(v)
    } else {
        builder.with_no_client_auth()
    };
    let cfg = builder.with_single_cert(certs, key).map_err(|e| {
        format!(
            "{}: the certificate does not match server-key.pem or is unusable: {e}",
            dir.join("server-cert.pem").display()
        )
    })?;
    Ok(Some(Arc::new(cfg)))
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: bad PEM certificate: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_without_tls_are_refused() {
        let o = TlsOptions {
            mode: TlsMode::Off,
            certificates: None,
            verify_peer: true,
        };
        let e = check_options(&o).unwrap_err();
        assert!(
            e.contains("--tls-verify-peer") && e.contains("--tls=require"),
            "{e}"
        );
        let o = TlsOptions {
            mode: TlsMode::Off,
            certificates: Some("/nonexistent".into()),
            verify_peer: false,
        };
        assert!(check_options(&o)
            .unwrap_err()
            .contains("--tls-certificates"));
        assert!(check_options(&TlsOptions::default()).is_ok());
    }
}
