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

/// When the server's own certificate (the first in the chain) may be used, in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertDates {
    pub not_before: i64,
    pub not_after: i64,
}

/// How many days before expiry the start-up log warns.
const EXPIRY_WARNING_DAYS: i64 = 14;

impl CertDates {
    /// The dates of the first certificate in the PEM file `cert` (the file [`load`] took).
    pub fn read(cert: &Path) -> Result<CertDates, TlsError> {
        use x509_cert::der::Decode;
        let file = std::fs::File::open(cert)
            .map_err(|e| TlsError(format!("tls.cert: cannot read {}: {e}", cert.display())))?;
        let first = rustls_pemfile::certs(&mut BufReader::new(file))
            .next()
            .transpose()
            .map_err(|e| TlsError(format!("tls.cert: {}: not PEM: {e}", cert.display())))?
            .ok_or_else(|| {
                TlsError(format!("tls.cert: {} holds no certificate", cert.display()))
            })?;
        let parsed = x509_cert::Certificate::from_der(first.as_ref()).map_err(|e| {
            TlsError(format!(
                "tls.cert: {}: not an X.509 certificate: {e}",
                cert.display()
            ))
        })?;
        let validity = parsed.tbs_certificate.validity;
        let seconds = |time: x509_cert::time::Time| {
            i64::try_from(time.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
        };
        Ok(CertDates {
            not_before: seconds(validity.not_before),
            not_after: seconds(validity.not_after),
        })
    }

    /// What an operator should hear about these dates at `now` (Unix seconds): `Err` when
    /// clients will refuse the certificate or soon will, `Ok` otherwise.
    pub fn judge(&self, cert: &Path, now: i64) -> Result<String, String> {
        let at = |seconds: i64| {
            jiff::Timestamp::from_second(seconds)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| format!("{seconds} (Unix seconds)"))
        };
        let cert = cert.display();
        let days = |seconds: i64| seconds.div_euclid(86_400);
        if now >= self.not_after {
            Err(format!(
                "tls.cert: {cert} expired at {} ({} days ago): clients refuse it; renew it and \
                 restart belfry",
                at(self.not_after),
                days(now - self.not_after)
            ))
        } else if now < self.not_before {
            Err(format!(
                "tls.cert: {cert} is valid only from {}: clients refuse it until then (is this \
                 machine's clock right?)",
                at(self.not_before)
            ))
        } else if self.not_after - now < EXPIRY_WARNING_DAYS * 86_400 {
            Err(format!(
                "tls.cert: {cert} expires at {}, in {} days: renew it and restart belfry",
                at(self.not_after),
                days(self.not_after - now)
            ))
        } else {
            Ok(format!(
                "tls.cert: {cert} is valid until {}",
                at(self.not_after)
            ))
        }
    }
}

/// Says at start-up until when the certificate `cert` is valid (a warning when clients refuse
/// it or will within two weeks), and shows the expiry on `/metrics`; the server serves either
/// way, as the certificate is the operator's to renew.
pub fn announce_dates(cert: &Path) {
    let dates = match CertDates::read(cert) {
        Ok(dates) => dates,
        Err(why) => {
            tracing::warn!("{why}: its expiry is not checked");
            return;
        }
    };
    let now = jiff::Timestamp::now().as_second();
    match dates.judge(cert, now) {
        Ok(fine) => tracing::info!("{fine}"),
        Err(warning) => tracing::warn!("{warning}"),
    }
    metrics::gauge!(crate::metrics::TLS_CERT_NOT_AFTER).set(dates.not_after as f64);
}
