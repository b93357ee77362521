//! HTTPS end to end: a certificate made by the test (self-signed, for 127.0.0.1), a server
//! started with it, and clients that trust it, that do not, and that speak plain HTTP; and
//! TLS handshakes that never finish, at the connection cap.

mod common;

use std::sync::Arc;
use std::time::Duration;

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

    handle.stop().await.unwrap();
}

/// Everything the server sends on `stream` until it closes it (within 10 s).
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends `request` on a new connection to `port` and parses the answer: its head, and the
/// error code and message of its JSON body.
async fn exchange(port: u16, request: &[u8]) -> (String, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(request).await.expect("send");
    let answer = read_until_closed(&mut stream).await;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    let text = |field: &str| json["error"][field].as_str().unwrap_or_default().to_owned();
    (head.to_owned(), text("code"), text("message"))
}

/// Found by the HTTP audit: plain HTTP sent to the HTTPS port got a raw TLS alert, which
/// curl reports as "HTTP/0.9". It gets a plain-text 400 saying to use https; and TLS sent to
/// the plain port is told that port speaks plain HTTP.
#[tokio::test]
async fn the_wrong_protocol_for_the_port_is_answered_with_what_to_use() {
    let cert = self_signed();
    let config = tls::load(&cert.cert, &cert.key).expect("the certificate loads");
    let https = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .tls(config)
        .start()
        .await
        .expect("server starts");
    let (head, code, message) = exchange(
        https.local_addr().port(),
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(code, "malformed_http");
    assert!(
        message.starts_with("this port serves HTTPS: use https://"),
        "{message}"
    );
    https.stop().await.unwrap();

    let plain = Server::builder(test_config(), Arc::new(MemoryStore::new()))
        .start()
        .await
        .expect("server starts");
    // The start of a TLS ClientHello: a handshake record (0x16), TLS 1.0 record version.
    let hello = [
        0x16, 0x03, 0x01, 0x00, 0x2a, 0x01, 0x00, 0x00, 0x26, 0x03, 0x03,
    ];
    let (head, code, message) = exchange(plain.local_addr().port(), &hello).await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    assert_eq!(code, "malformed_http");
    assert!(message.contains("plain HTTP"), "{message}");
    plain.stop().await.unwrap();
}

/// Found by the HTTP audit: connections that never finished their TLS handshake could not
/// be evicted, so at the cap a newcomer waited up to the header read timeout (here a
/// minute). They are evictable like silent plain connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_light_client_takes_the_place_of_a_silent_tls_connection() {
    const CAP: usize = 4;
    let cert = self_signed();
    let config = tls::load(&cert.cert, &cert.key).expect("the certificate loads");
    let handle = Server::builder(
        belfry_server::ServerConfig {
            http_connections_max: CAP,
            http_connections_per_client_max: Some(CAP),
            http_header_read_timeout_ms: 60_000,
            http_idle_timeout_ms: 60_000,
            ..test_config()
        },
        Arc::new(MemoryStore::new()),
    )
    .tls(config)
    .start()
    .await
    .expect("server starts");
    let addr = handle.local_addr();
    let stats = &handle.service().connections;
    // 127.0.0.1 holds every place with connections that never say hello.
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    let heavy: std::net::IpAddr = [127, 0, 0, 1].into();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stats.open_from(heavy) < CAP {
        assert!(
            std::time::Instant::now() < deadline,
            "the cap was never reached"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 127.0.0.2, light, is served well before the handshake timeout frees a place.
    let light = reqwest::Client::builder()
        .no_proxy()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let answer = light
        .get(format!("https://127.0.0.1:{}/healthz", addr.port()))
        .send()
        .await
        .expect("served at the cap");
    assert_eq!(answer.status(), 200);
    assert_eq!(stats.evicted.load(std::sync::atomic::Ordering::Relaxed), 1);
    drop(held);
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

/// A certificate valid from `from` to `until` (years), written as PEM into a temporary dir.
fn dated(from: i32, until: i32) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
    params.not_before = rcgen::date_time_ymd(from, 1, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    let made = params.self_signed(&key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cert.pem");
    std::fs::write(&path, made.pem()).unwrap();
    (dir, path)
}

#[test]
fn certificate_dates_are_read_and_judged() {
    let (_dir, path) = dated(2020, 2021);
    let dates = tls::CertDates::read(&path).expect("dates read");
    let year_2020 = 1_577_836_800;
    let year_2021 = 1_609_459_200;
    assert_eq!((dates.not_before, dates.not_after), (year_2020, year_2021));
    let expired = dates.judge(&path, year_2021 + 3 * 86_400).unwrap_err();
    assert!(
        expired.contains("expired at 2021-01-01T00:00:00Z (3 days ago)")
            && expired.contains("renew"),
        "{expired}"
    );
    let early = dates.judge(&path, year_2020 - 1).unwrap_err();
    assert!(early.contains("valid only from 2020-01-01"), "{early}");
    let soon = dates.judge(&path, year_2021 - 5 * 86_400).unwrap_err();
    assert!(soon.contains("in 5 days"), "{soon}");
    let fine = dates.judge(&path, year_2020 + 86_400).unwrap();
    assert!(fine.contains("valid until 2021-01-01T00:00:00Z"), "{fine}");
    // Not a certificate at all: said, not a panic.
    let junk = path.with_file_name("junk.pem");
    std::fs::write(
        &junk,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let error = tls::CertDates::read(&junk).unwrap_err().to_string();
    assert!(error.contains("not an X.509 certificate"), "{error}");
}
