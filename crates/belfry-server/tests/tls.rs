//! HTTPS end to end: a certificate made by the test (self-signed, for 127.0.0.1), a server
//! started with it, and clients that trust it, that do not, and that speak plain HTTP.

mod common;

use std::sync::Arc;

use belfry_server::listener::tls;
use belfry_server::Server;
use belfry_store::MemoryStore;
use common::test_config;

struct Cert {
    _dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    pem: String,
}

fn self_signed() -> Cert {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("make a certificate");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let pem = made.cert.pem();
    std::fs::write(&cert, &pem).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    Cert {
        _dir: dir,
        cert,
        key,
        pem,
    }
}

#[tokio::test]
async fn the_server_speaks_https_to_clients_that_trust_its_certificate() {
    let cert = self_signed();
    let config = tls::load(&cert.cert, &cert.key).expect("the certificate loads");
    let handle = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .tls(config)
        .start()
        .await
        .expect("server starts");
    let port = handle.local_addr().port();

    let trusting = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let answer = trusting
        .put(format!("https://127.0.0.1:{port}/v1/queues/secure"))
        .body("{}")
        .send()
        .await
        .expect("an HTTPS request");
    assert_eq!(answer.status(), 201);
    let listed: serde_json::Value = trusting
        .get(format!("https://127.0.0.1:{port}/v1/queues"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["queues"][0]["name"], "secure");

    // A client that does not trust the certificate refuses the server.
    let untrusting = reqwest::Client::builder().no_proxy().build().unwrap();
    let refused = untrusting
        .get(format!("https://127.0.0.1:{port}/healthz"))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "an unknown certificate must not be accepted"
    );

    // Plain HTTP to the HTTPS port gets no HTTP answer.
    let plain = untrusting
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP must not be served"
    );
    handle.stop().await.unwrap();
}

#[test]
fn bad_certificate_files_say_which_and_why() {
    let cert = self_signed();
    let missing = cert.cert.with_file_name("nope.pem");
    let error = tls::load(&missing, &cert.key).unwrap_err().to_string();
    assert!(
        error.contains("tls.cert") && error.contains("nope.pem"),
        "{error}"
    );
    let error = tls::load(&cert.key, &cert.key).unwrap_err().to_string();
    assert!(error.contains("no certificate"), "{error}");
    let error = tls::load(&cert.cert, &cert.cert).unwrap_err().to_string();
    assert!(error.contains("no private key"), "{error}");
    let other = self_signed();
    let error = tls::load(&cert.cert, &other.key).unwrap_err().to_string();
    assert!(error.contains("does not fit"), "{error}");
    // An encrypted key is said to be one, not "no private key".
    let encrypted = cert.key.with_file_name("encrypted.pem");
    std::fs::write(
        &encrypted,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkqhkiG9w0BBQ0wSjApBgkqhkiG\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let error = tls::load(&cert.cert, &encrypted).unwrap_err().to_string();
    assert!(
        error.contains("is encrypted") && error.contains("decrypt"),
        "{error}"
    );
    // A version 1 certificate with its own key (made by `openssl x509 -req -signkey`, no
    // extensions) is said to be one, not a key that does not fit.
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let error = tls::load(
        &fixtures.join("x509-v1-cert.pem"),
        &fixtures.join("x509-v1-key.pem"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("version 1") && !error.contains("does not fit"),
        "{error}"
    );
}
