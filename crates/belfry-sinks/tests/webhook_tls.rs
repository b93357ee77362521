//! Webhooks over HTTPS against a real TLS receiver on 127.0.0.1, whose certificates come from
//! a throwaway CA made here: trusted through `webhooks.ca_file`, refused (with a reason that
//! says what to set) without it, and a CA certificate served as the receiver's own explained.

use std::path::PathBuf;
use std::sync::Arc;

use belfry_core::{QueueName, TaskId};
use belfry_sinks::testing::leased_task;
use belfry_sinks::{
    Connections, Outcome, SinkFactory, SinkSpec, StandardSinks, TargetPolicy, WebhookSpec,
};
use bytes::Bytes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA (as a PEM file) and two server identities for 127.0.0.1: a leaf the CA signed, and
/// the CA's own certificate with its key (what `openssl req -x509` gives as a "self-signed
/// certificate").
struct Pki {
    dir: tempfile::TempDir,
    leaf: Arc<rustls::ServerConfig>,
    ca_as_leaf: Arc<rustls::ServerConfig>,
}

fn server_config(cert: &rcgen::Certificate, key: &rcgen::KeyPair) -> Arc<rustls::ServerConfig> {
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server TLS config");
    Arc::new(config)
}

impl Pki {
    fn new() -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "belfry webhook test CA");
        let ca = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("leaf params")
            .signed_by(&key, &ca, &ca_key)
            .expect("sign the leaf");
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write the CA file");
        Pki {
            dir,
            leaf: server_config(&leaf, &key),
            ca_as_leaf: server_config(&ca, &ca_key),
        }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

/// An HTTPS receiver on an ephemeral loopback port that answers every request 200 and counts
/// the requests it read. Stops with the test's runtime.
async fn start_tls_receiver(
    config: Arc<rustls::ServerConfig>,
) -> (u16, Arc<std::sync::Mutex<u32>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let port = listener.local_addr().expect("address").port();
    let seen = Arc::new(std::sync::Mutex::new(0));
    let counter = seen.clone();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                // A handshake the client refuses ends here.
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                *counter.lock().expect("counter") += 1;
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, seen)
}

async fn deliver(sinks: &StandardSinks, port: u16) -> Outcome {
    let queue = QueueName::new("tls").expect("queue name");
    let spec = SinkSpec::Webhook(WebhookSpec::new(format!("https://127.0.0.1:{port}/hook")));
    let sink = sinks.build(&queue, &spec).expect("valid spec");
    let task = leased_task(TaskId(7), "tls", 0, Bytes::from_static(b"{}"));
    sink.deliver(&task, 1, 1_700_000_000_000).await
}

fn factory(ca_file: Option<PathBuf>) -> Result<StandardSinks, belfry_sinks::SinkError> {
    StandardSinks::with_webhook_ca(
        TargetPolicy::ALLOW_PRIVATE,
        4,
        Connections::empty(),
        ca_file.as_deref(),
    )
}

fn retry_reason(outcome: Outcome) -> String {
    match outcome {
        Outcome::Retry { reason, .. } => reason,
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[tokio::test]
async fn a_private_ca_is_trusted_through_webhooks_ca_file() {
    let pki = Pki::new();
    let (port, seen) = start_tls_receiver(pki.leaf.clone()).await;

    let untrusting = factory(None).expect("factory");
    let reason = retry_reason(deliver(&untrusting, port).await);
    assert!(
        reason.contains("not signed by a trusted CA") && reason.contains("set webhooks.ca_file"),
        "{reason}"
    );
    assert!(!reason.contains("UnknownIssuer"), "{reason}");
    assert_eq!(*seen.lock().expect("counter"), 0);

    let trusting = factory(Some(pki.ca_file())).expect("factory with the CA");
    assert_eq!(deliver(&trusting, port).await, Outcome::Delivered);
    assert_eq!(*seen.lock().expect("counter"), 1);
}

#[tokio::test]
async fn a_ca_certificate_served_as_the_receivers_own_is_explained() {
    let pki = Pki::new();
    let (port, _seen) = start_tls_receiver(pki.ca_as_leaf.clone()).await;
    let sinks = factory(Some(pki.ca_file())).expect("factory with the CA");
    let reason = retry_reason(deliver(&sinks, port).await);
    assert!(
        reason.contains("presents a CA certificate as its own") && !reason.contains("OtherError"),
        "{reason}"
    );
}

#[test]
fn a_bad_ca_file_names_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.pem");
    let error = factory(Some(missing)).err().expect("refused").to_string();
    assert!(
        error.contains("webhooks.ca_file: cannot read") && error.contains("missing.pem"),
        "{error}"
    );
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let error = factory(Some(garbage)).err().expect("refused").to_string();
    assert!(
        error.contains("webhooks.ca_file:") && error.contains("holds no certificate"),
        "{error}"
    );
}
