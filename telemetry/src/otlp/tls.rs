//! The TLS side of an `https://` endpoint: a rustls client (ring provider) that trusts the CA
//! certificates of `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`, else the Mozilla roots that
//! `webpki-roots` ships; ALPN asks for HTTP/2 (gRPC) or HTTP/1.1.

use super::config::CaFile;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// Connects TLS sessions to one collector.
pub struct Tls {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

/// What to set when a CA file cannot be used.
fn advice(ca: &CaFile) -> String {
    format!(
        "set {} to a readable PEM file of the CA certificates that signed the collector's certificate, \
         or unset it to trust the system's public roots",
        ca.var
    )
}

/// The root store: the certificates of `ca`, else the public roots.
fn roots(ca: Option<&CaFile>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let Some(ca) = ca else {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(roots);
    };
    let path = ca.path.display();
    let pem = std::fs::read(&ca.path).map_err(|e| format!("{}={path}: {e}; {}", ca.var, advice(ca)))?;
    let mut n = 0usize;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("{}={path}: not PEM ({e}); {}", ca.var, advice(ca)))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}={path}: a certificate it holds is unusable ({e}); {}", ca.var, advice(ca)))?;
        n += 1;
    }
    if n == 0 {
        return Err(format!("{}={path}: no PEM certificate in it; {}", ca.var, advice(ca)));
    }
    Ok(roots)
}

impl Tls {
    /// TLS to `host`; `h2`: offer only HTTP/2 (gRPC), else only HTTP/1.1.
    pub fn new(host: &str, ca: Option<&CaFile>, h2: bool) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots(ca)?)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
        // An IPv6 literal arrives in brackets from the URL's authority.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let server_name =
            ServerName::try_from(bare.to_string()).map_err(|e| format!("TLS server name {host:?}: {e}"))?;
        Ok(Tls { connector: TlsConnector::from(Arc::new(cfg)), server_name })
    }
}
