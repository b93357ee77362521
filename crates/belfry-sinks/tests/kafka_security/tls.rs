//! TLS: a sink trusting the test's CA delivers through the terminator; one that does not
//! trust it gets a retry naming the certificate problem.

use super::*;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

/// A throwaway CA and a server certificate it signed for 127.0.0.1 and localhost.
struct Pki {
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
    server: Arc<rustls::ServerConfig>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "belfry test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");

    let key = rcgen::KeyPair::generate().expect("server key");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("server params");
    let cert = params
        .signed_by(&key, &ca, &ca_key)
        .expect("server certificate");

    let dir = tempfile::tempdir().expect("temp dir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write the CA file");
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server TLS config");
    Pki {
        _dir: dir,
        ca_file,
        server: Arc::new(server),
    }
}

/// Accepts TLS on `listener` and forwards each connection's bytes to `backend` (plain TCP).
/// Stops with the test's runtime.
fn terminate_tls(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    backend: u16,
) {
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that gives up on our certificate ends the handshake: nothing to do.
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(("127.0.0.1", backend)).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
}

/// Tansu behind a TLS terminator: (the broker, the terminator's `host:port`, the PKI).
async fn tls_broker() -> (Tansu, String, Pki) {
    let pki = pki();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the TLS port");
    let tls_port = listener.local_addr().expect("TLS address").port();
    let tansu = Tansu::start(Some(tls_port), false).await;
    terminate_tls(listener, Arc::clone(&pki.server), tansu.port);
    (tansu, format!("127.0.0.1:{tls_port}"), pki)
}

fn tls_connection(broker: &str, ca_file: Option<&Path>) -> ConnectionSpec {
    ConnectionSpec {
        tls: TlsOptions {
            enabled: true,
            ca_file: ca_file.map(Path::to_path_buf),
        },
        ..ConnectionSpec::kafka([broker])
    }
}

/// A client of our own, trusting the CA, for making the topic and reading it back.
async fn tls_client(broker: &str, ca_file: &Path) -> Client {
    let config = belfry_sinks::kafka::tls::client_config(Some(ca_file)).expect("client TLS");
    ClientBuilder::new(vec![broker.to_owned()])
        .tls_config(config)
        .build()
        .await
        .expect("connect over TLS")
}

#[tokio::test]
async fn a_sink_trusting_the_ca_delivers_over_tls() {
    let (_tansu, broker, pki) = tls_broker().await;
    let client = tls_client(&broker, &pki.ca_file).await;
    create_topic(&client).await;

    let sink = sink(tls_connection(&broker, Some(&pki.ca_file)));
    assert_eq!(
        sink.deliver(&task(1, br#"{"n":1}"#), 1, 0).await,
        Outcome::Delivered
    );
    // The second delivery reuses the connection.
    assert_eq!(
        sink.deliver(&task(2, br#"{"n":2}"#), 1, 0).await,
        Outcome::Delivered
    );

    let payloads = read_payloads(&client).await;
    assert_eq!(
        payloads,
        vec![br#"{"n":1}"#.to_vec(), br#"{"n":2}"#.to_vec()]
    );
}

#[tokio::test]
async fn a_sink_not_trusting_the_certificate_retries_with_a_clear_reason() {
    let (_tansu, broker, pki) = tls_broker().await;
    let client = tls_client(&broker, &pki.ca_file).await;
    create_topic(&client).await;

    // System roots only: the test CA is not among them.
    let sink = sink(tls_connection(&broker, None));
    match sink.deliver(&task(1, b"{}"), 1, 0).await {
        Outcome::Retry { reason, .. } => assert!(
            reason.to_lowercase().contains("certificate"),
            "the reason should name the certificate problem: {reason}"
        ),
        other => panic!("expected a retry, got {other:?}"),
    }
    assert!(read_payloads(&client).await.is_empty());
}

#[tokio::test]
async fn a_plain_sink_against_a_tls_listener_retries() {
    let (_tansu, broker, pki) = tls_broker().await;
    let client = tls_client(&broker, &pki.ca_file).await;
    create_topic(&client).await;

    let sink = sink(ConnectionSpec::kafka([broker.as_str()]));
    let outcome = sink.deliver(&task(1, b"{}"), 1, 0).await;
    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    assert!(read_payloads(&client).await.is_empty());
}

#[test]
fn a_bad_ca_file_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "no certificates here\n").expect("write");
    for (ca_file, needle) in [
        (dir.path().join("absent.pem"), "cannot read"),
        (junk, "holds no certificate"),
    ] {
        let error = tls_connection("127.0.0.1:9093", Some(&ca_file))
            .validate("events")
            .unwrap_err();
        assert!(
            error.starts_with("connections.events.tls.ca_file:") && error.contains(needle),
            "{error}"
        );
    }
    let mut ca_without_tls = tls_connection("127.0.0.1:9093", Some(Path::new("/x.pem")));
    ca_without_tls.tls.enabled = false;
    let error = ca_without_tls.validate("events").unwrap_err();
    assert!(error.contains("tls.enabled = true"), "{error}");
}
