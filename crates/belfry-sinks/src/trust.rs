//! The CA certificates a connection trusts (`[connections.NAME.tls] ca_file`, and
//! `[webhooks] ca_file` for every webhook).
//!
//! [`read_ca_file`] reads and checks the file once, when the config is loaded and again when a
//! sink is built, so a missing, unreadable or malformed file is a config error naming the
//! file, never a failure at delivery time.

use std::io::Read;
use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// Largest CA file read. A bundle of every public root is about 250 KiB.
pub const CA_FILE_LEN_MAX: u64 = 4 << 20;

/// The certificates in the PEM file at `path`, each checked to be usable as a trust anchor.
/// The error says what is wrong with the file, and names it.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let file =
        std::fs::File::open(path).map_err(|error| format!("cannot read {shown}: {error}"))?;
    let mut bytes = Vec::new();
    file.take(CA_FILE_LEN_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("cannot read {shown}: {error}"))?;
    if bytes.len() as u64 > CA_FILE_LEN_MAX {
        return Err(format!(
            "{shown} is larger than {CA_FILE_LEN_MAX} bytes; expected a PEM file of CA certificates"
        ));
    }
    let certs = rustls_pemfile::certs(&mut bytes.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{shown} is not a PEM file of certificates: {error}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{shown} holds no certificate; expected PEM blocks starting with -----BEGIN CERTIFICATE-----"
        ));
    }
    let mut store = RootCertStore::empty();
    for (index, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|error| {
            format!(
                "certificate {} in {shown} is not a usable CA certificate: {error}",
                index + 1
            )
        })?;
    }
    Ok(certs)
}

/// The system's trusted roots that rustls can use, read once per process: every queue on a
/// TLS connection shares them. Roots rustls refuses are left out (a client would refuse the
/// whole store over one of them).
pub(crate) fn system_roots() -> &'static [CertificateDer<'static>] {
    static SYSTEM: std::sync::OnceLock<Vec<CertificateDer<'static>>> = std::sync::OnceLock::new();
    SYSTEM.get_or_init(|| {
        let system = rustls_native_certs::load_native_certs();
        for error in &system.errors {
            tracing::debug!(%error, "a system root certificate store could not be read");
        }
        let mut store = RootCertStore::empty();
        system
            .certs
            .into_iter()
            .filter(|cert| store.add(cert.clone()).is_ok())
            .collect()
    })
}

/// The system's trusted roots followed by `extra`, as one PEM text. The Redis client trusts
/// either its built-in choice of roots or exactly the PEM it is given; this lets a
/// connection's CA file add to the system's roots as documented.
#[cfg(feature = "redis-streams")]
pub(crate) fn system_roots_and(extra: &[CertificateDer<'static>]) -> Vec<u8> {
    let mut pem = Vec::new();
    for cert in system_roots().iter().chain(extra) {
        push_pem(&mut pem, cert);
    }
    pem
}

/// Appends `cert` to `pem` as a `CERTIFICATE` block (base64 in lines of 64 characters).
#[cfg(feature = "redis-streams")]
fn push_pem(pem: &mut Vec<u8>, cert: &CertificateDer<'_>) {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
    pem.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.extend_from_slice(line);
        pem.push(b'\n');
    }
    pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ca_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let error = read_ca_file(&missing).unwrap_err();
        assert!(
            error.contains("cannot read") && error.contains("missing.pem"),
            "{error}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = read_ca_file(&empty).unwrap_err();
        assert!(error.contains("holds no certificate"), "{error}");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let error = read_ca_file(&garbage).unwrap_err();
        assert!(error.contains("garbage.pem"), "{error}");
        let error = read_ca_file(dir.path()).unwrap_err();
        assert!(error.contains("cannot read"), "{error}");
    }

    #[cfg(feature = "redis-streams")]
    #[test]
    fn a_ca_file_is_trusted_next_to_the_system_roots() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.pem()).unwrap();
        let certs = read_ca_file(&path).unwrap();
        assert_eq!(certs.len(), 1);
        let pem = system_roots_and(&certs);
        let back = rustls_pemfile::certs(&mut pem.as_slice())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        assert_eq!(back.last(), Some(&certs[0]));
        let system = rustls_native_certs::load_native_certs().certs.len();
        assert!(system == 0 || back.len() > 1, "{} of {system}", back.len());
    }
}
