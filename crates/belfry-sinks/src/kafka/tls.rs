//! TLS to Kafka brokers: the client configuration rskafka wraps each broker connection in.
//!
//! Trusted roots are the system's (as the NATS client trusts them) plus, when the connection
//! names one, a PEM file of CA certificates. The server name checked against a broker's
//! certificate is the host of its address (`host:port`), so a certificate for brokers reached
//! by IP address needs that address among its subject alternative names.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

/// The client configuration for a TLS connection: the system's roots, and the CA certificates
/// in `ca_file`. Errors say what is wrong with the file, without naming the config key (the
/// caller adds it).
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    // A system without a CA bundle still works with an explicit CA file.
    let _ = roots.add_parsable_certificates(crate::trust::system_roots().iter().cloned());
    if let Some(path) = ca_file {
        for cert in crate::trust::read_ca_file(path)? {
            roots.add(cert).map_err(|error| {
                format!("{}: not a usable CA certificate: {error}", path.display())
            })?;
        }
    }
    if roots.is_empty() {
        return Err(
            "no trusted CA certificates: the system has none; name a PEM file of CA certificates in tls.ca_file"
                .to_owned(),
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS setup failed: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write the test file");
        path
    }

    #[test]
    fn bad_ca_files_are_clear_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing.pem");
        let error = client_config(Some(&missing)).unwrap_err();
        assert!(
            error.contains("cannot read") && error.contains("missing.pem"),
            "{error}"
        );

        let empty = write(&dir, "empty.pem", "not a certificate\n");
        let error = client_config(Some(&empty)).unwrap_err();
        assert!(error.contains("holds no certificate"), "{error}");

        let broken = write(
            &dir,
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\n%%%%\n-----END CERTIFICATE-----\n",
        );
        let error = client_config(Some(&broken)).unwrap_err();
        assert!(error.contains("broken.pem"), "{error}");

        let garbage_der = write(
            &dir,
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        );
        let error = client_config(Some(&garbage_der)).unwrap_err();
        assert!(error.contains("not a usable CA certificate"), "{error}");
    }

    #[test]
    fn a_generated_ca_is_accepted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("self-signed CA");
        let path = write(&dir, "ca.pem", &ca.pem());
        assert!(client_config(Some(&path)).is_ok());
    }
}
