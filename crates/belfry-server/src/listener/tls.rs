//! HTTPS: the certificate chain and key the operator names (`tls.cert`, `tls.key`, PEM),
//! loaded once into a rustls configuration; each accepted connection's handshake must finish
//! within the header read timeout, so a client that connects and never says hello is closed
//! like one that never sends a request.

use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the certificate or key could not be used; the message names the file and what to fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// The server's TLS configuration from a PEM certificate chain (the server's certificate
/// first) and a PEM private key (PKCS#8, PKCS#1 or SEC1). HTTP/1.1 only, as the listener.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let open = |path: &Path, what: &str| {
        std::fs::File::open(path)
            .map(BufReader::new)
            .map_err(|e| TlsError(format!("tls.{what}: cannot read {}: {e}", path.display())))
    };
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut open(cert, "cert")?)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError(format!("tls.cert: {}: not PEM: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(TlsError(format!(
            "tls.cert: {} holds no certificate (expected PEM blocks \"BEGIN CERTIFICATE\")",
            cert.display()
        )));
    }
    let private: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut open(key, "key")?)
        .map_err(|e| TlsError(format!("tls.key: {}: not PEM: {e}", key.display())))?
        .ok_or_else(|| {
            TlsError(format!(
                "tls.key: {} holds no private key (expected a PEM \"PRIVATE KEY\" block)",
                key.display()
            ))
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("tls: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            TlsError(format!(
                "tls: the key {} does not fit the certificate {}: {e}",
                key.display(),
                cert.display()
            ))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
