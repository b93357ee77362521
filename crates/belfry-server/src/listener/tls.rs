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
            let encrypted = std::fs::read(key)
                .is_ok_and(|bytes| bytes.windows(23).any(|w| w == b"BEGIN ENCRYPTED PRIVATE"));
            TlsError(if encrypted {
                format!(
                    "tls.key: {} is encrypted, and belfry reads unencrypted keys: decrypt it \
                     (`openssl pkey -in KEY -out KEY.plain`) and keep it readable by belfry only",
                    key.display()
                )
            } else {
                format!(
                    "tls.key: {} holds no private key (expected a PEM \"PRIVATE KEY\" block)",
                    key.display()
                )
            })
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("tls: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| refused(&e, cert, key))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Why rustls would not take the certificate and key, in words that point at the file to fix:
/// a key that is not the certificate's, or a certificate it cannot use (an X.509 version 1
/// certificate was reported as a key that does not fit).
fn refused(error: &rustls::Error, cert: &Path, key: &Path) -> TlsError {
    let (cert, key) = (cert.display(), key.display());
    TlsError(match error {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            format!("tls: the key {key} does not fit the certificate {cert}: use the key the certificate was made for")
        }
        rustls::Error::InvalidCertificate(_) | rustls::Error::Other(_)
            if format!("{error:?}").contains("UnsupportedCertVersion") =>
        {
            format!(
                "tls.cert: {cert} is an X.509 version 1 certificate; TLS needs version 3: make it \
                 with extensions (openssl: -addext \"subjectAltName=DNS:...\" or -extfile)"
            )
        }
        rustls::Error::InvalidCertificate(_) | rustls::Error::Other(_) => {
            format!("tls.cert: {cert} cannot be used: {error}")
        }
        other => {
            format!("tls: the certificate {cert} and key {key} cannot be used together: {other}")
        }
    })
}
