//! What a failed TLS handshake with a receiver means, in words an operator can act on.
//!
//! The HTTP client reports a refused certificate as rustls's `Debug` names
//! (`invalid peer certificate: UnknownIssuer`, `Other(OtherError(CaUsedAsEndEntity))`), which
//! say neither what is wrong nor what to change. [`certificate_advice`] finds the rustls error
//! among a failure's causes and says both.
//!
//! Which roots a webhook trusts is set where the client is built
//! ([`super::target::try_client_trusting`]): the Mozilla roots built into the binary, the
//! system's roots, and `webhooks.ca_file`.

use rustls::CertificateError;

/// What to fix when `error` (or one of its causes) is a certificate the client refused;
/// `None` for any other failure.
pub(crate) fn certificate_advice(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(error);
    // A bounded walk: error chains are finite, but be defensive about long ones.
    for _ in 0..16 {
        let current = source?;
        if let Some(found) = as_rustls(current) {
            return match found {
                rustls::Error::InvalidCertificate(certificate) => Some(explain(certificate)),
                _ => None,
            };
        }
        source = current.source();
    }
    None
}

/// The rustls error `error` is, or wraps as an I/O error. The TLS stream reports handshake
/// failures as an `io::Error` whose inner error is the rustls one, and the connector wraps
/// that in another `io::Error`; `io::Error::source` skips inner errors, so they are looked at
/// here.
fn as_rustls<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = error;
    // Two levels are seen in practice; a few more cost nothing.
    for _ in 0..4 {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        let inner = current.downcast_ref::<std::io::Error>()?.get_ref()?;
        current = inner as &(dyn std::error::Error + 'static);
    }
    None
}

fn explain(error: &CertificateError) -> String {
    const TRUSTED: &str =
        "belfry trusts the Mozilla roots, this machine's trusted roots and webhooks.ca_file";
    match error {
        CertificateError::UnknownIssuer => format!(
            "the receiver's certificate is not signed by a trusted CA: set webhooks.ca_file to \
             the CA that signed it (or to the certificate itself if it is self-signed); {TRUSTED}"
        ),
        CertificateError::BadSignature => format!(
            "the receiver's certificate has a signature that does not verify: its chain is \
             broken or it was not signed by the CA it names; {TRUSTED}"
        ),
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the receiver's certificate has expired: renew it (or check this machine's clock)"
                .to_owned()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the receiver's certificate is not valid yet: check the clocks of this machine and \
             of the receiver"
                .to_owned()
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "the receiver's certificate does not name the URL's host: use a host name the \
             certificate lists, or give the receiver a certificate that lists this one"
                .to_owned()
        }
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "the receiver's certificate is not made for a TLS server (its extended key usage \
             lacks serverAuth)"
                .to_owned()
        }
        CertificateError::Revoked => "the receiver's certificate was revoked".to_owned(),
        CertificateError::Other(other) if other.to_string().contains("CaUsedAsEndEntity") => {
            "the receiver presents a CA certificate as its own (basicConstraints CA:TRUE, as \
             `openssl req -x509` makes by default), which TLS clients refuse: give the receiver \
             a certificate signed by that CA, and set webhooks.ca_file to the CA"
                .to_owned()
        }
        other => format!("the receiver's certificate was refused ({other:?}); {TRUSTED}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_errors_are_found_under_io_errors_and_explained() {
        // As the connector reports it: an I/O error around the TLS stream's I/O error.
        let wrapped = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        ));
        let advice = certificate_advice(&wrapped).expect("found under the io::Error");
        assert!(
            advice.contains("not signed by a trusted CA") && advice.contains("webhooks.ca_file"),
            "{advice}"
        );
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert!(certificate_advice(&expired)
            .expect("a rustls error itself")
            .contains("expired"));
        // Not a certificate problem: left to the generic description.
        let other = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(certificate_advice(&other), None);
        assert_eq!(
            certificate_advice(&rustls::Error::DecryptError),
            None,
            "only refused certificates get advice"
        );
    }
}
