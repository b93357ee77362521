//! TLS to the brokers, against real servers on 127.0.0.1: a redis-server and a nats-server
//! (with JetStream) each serving a certificate from a throwaway CA made here. A delivery
//! through a connection that trusts the CA (`tls.ca_file`) arrives; one through a connection
//! that does not is a retry that says why, never a panic. When a server binary is missing the
//! tests fail and say how to install it (`scripts/test.sh` does). A nats-server that also
//! requires a user and password checks the connection's credentials.
#![cfg(all(feature = "redis-streams", feature = "nats"))]

use belfry_sinks::testing::{free_port, leased_task, require_program, wait_until};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use belfry_core::{QueueName, Task, TaskId};
use belfry_sinks::{
    ConnectionKind, ConnectionSpec, Connections, NatsSpec, Outcome, RedisStreamSpec, Sink,
    SinkFactory, SinkSpec, StandardSinks, TargetPolicy,
};
use bytes::Bytes;

const QUEUE: &str = "orders";

/// A CA and a server certificate it signed for 127.0.0.1 and localhost, as PEM files.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "belfry test CA");
        let ca = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let key = rcgen::KeyPair::generate().expect("server key");
        let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let server = rcgen::CertificateParams::new(names)
            .expect("server certificate")
            .signed_by(&key, &ca, &ca_key)
            .expect("sign the server certificate");
        let pki = Pki {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        std::fs::write(pki.ca(), ca.pem()).expect("write CA");
        std::fs::write(pki.cert(), server.pem()).expect("write certificate");
        std::fs::write(pki.key(), key.serialize_pem()).expect("write key");
        pki
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

/// A server this test started; killed by its PID (through `Child`) on drop.
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(command: &mut Command) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("start {command:?}: {error}"))
}

/// A redis-server that speaks TLS only (no plain port) and asks no client certificate.
async fn start_redis(pki: &Pki) -> Server {
    require_program("redis-server", "apt-get install redis-server");
    let port = free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let child = spawn(
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(pki.cert())
            .arg("--tls-key-file")
            .arg(pki.key())
            .arg("--tls-ca-cert-file")
            .arg(pki.ca())
            .args(["--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path()),
    );
    let server = Server {
        child,
        port,
        _dir: dir,
    };
    let ca = pki.ca();
    wait_until("redis-server (TLS)", || {
        let ca = ca.clone();
        async move {
            let Ok(mut connection) = redis_client(port, &ca).await else {
                return false;
            };
            let pong: redis::RedisResult<String> =
                redis::cmd("PING").query_async(&mut connection).await;
            pong.is_ok()
        }
    })
    .await;
    server
}

/// A test's own TLS client for the server on `port`, trusting only `ca`.
async fn redis_client(
    port: u16,
    ca: &Path,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let root_cert = std::fs::read(ca).expect("read CA");
    redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}/0"),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        },
    )?
    .get_multiplexed_async_connection()
    .await
}

/// Credentials a test's nats-server requires (`--user`, `--pass`).
type Login = Option<(&'static str, &'static str)>;

/// A nats-server with JetStream that speaks TLS only (and requires `login`, when given).
async fn start_nats(pki: &Pki, login: Login) -> Server {
    require_program("nats-server", "apt-get install nats-server");
    let port = free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let child = spawn(
        Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js"])
            .arg("-sd")
            .arg(dir.path())
            .arg("--tls")
            .arg("--tlscert")
            .arg(pki.cert())
            .arg("--tlskey")
            .arg(pki.key())
            .args(login.map_or(Vec::new(), |(user, pass)| {
                vec!["--user", user, "--pass", pass]
            })),
    );
    let server = Server {
        child,
        port,
        _dir: dir,
    };
    let ca = pki.ca();
    wait_until("nats-server (TLS)", || {
        let ca = ca.clone();
        async move {
            let Ok(client) = nats_client(port, &ca, login).await else {
                return false;
            };
            // Ready once JetStream answers, not only the client port.
            match client.request("$JS.API.INFO", "".into()).await {
                Ok(reply) => reply.payload.starts_with(b"{"),
                Err(_) => false,
            }
        }
    })
    .await;
    server
}

async fn nats_client(
    port: u16,
    ca: &Path,
    login: Login,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    let options = match login {
        Some((user, pass)) => {
            async_nats::ConnectOptions::with_user_and_password(user.to_owned(), pass.to_owned())
        }
        None => async_nats::ConnectOptions::new(),
    };
    options
        .require_tls(true)
        .add_root_certificates(ca.to_path_buf())
        .connect(format!("tls://127.0.0.1:{port}"))
        .await
}

fn task(n: u128) -> Task {
    leased_task(
        TaskId(0x7150_0000_0000_0000_0000_0000_0000_0000 + n),
        QUEUE,
        1_700_000_000_000,
        Bytes::from_static(b"{\"over\":\"tls\"}"),
    )
}

/// A sink built the way the server builds one: from a declared connection named `name`.
fn build(connections: Connections, spec: SinkSpec) -> Arc<dyn Sink> {
    StandardSinks::new(TargetPolicy::default(), 4, connections)
        .expect("sink factory")
        .build(&QueueName::new(QUEUE).expect("queue name"), &spec)
        .unwrap_or_else(|error| panic!("build {spec:?}: {error}"))
}

fn connection(kind: ConnectionKind, url: String, tls: bool, ca: Option<PathBuf>) -> ConnectionSpec {
    let mut spec = ConnectionSpec::url(kind, url);
    spec.tls.enabled = tls;
    spec.tls.ca_file = ca;
    spec
}

/// The reason of a retry; panics on any other outcome.
fn retry_reason(outcome: Outcome) -> String {
    match outcome {
        Outcome::Retry { reason, .. } => reason,
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[tokio::test]
async fn redis_over_tls_delivers_with_the_ca_and_retries_without_it() {
    let pki = Pki::new();
    let server = start_redis(&pki).await;
    let port = server.port;
    let redis = ConnectionKind::Redis;
    let connections = Connections::empty()
        // rediss:// alone turns TLS on.
        .with(
            "url",
            connection(
                redis,
                format!("rediss://127.0.0.1:{port}/0"),
                false,
                Some(pki.ca()),
            ),
        )
        // tls.enabled turns a redis:// URL into TLS.
        .with(
            "flag",
            connection(
                redis,
                format!("redis://localhost:{port}/0"),
                true,
                Some(pki.ca()),
            ),
        )
        .with(
            "untrusted",
            connection(redis, format!("rediss://127.0.0.1:{port}/0"), false, None),
        )
        .with(
            "plain",
            connection(redis, format!("redis://127.0.0.1:{port}/0"), false, None),
        );
    for (n, name) in [(1, "url"), (2, "flag")] {
        let sink = build(
            connections.clone(),
            SinkSpec::RedisStream(RedisStreamSpec::new(name, "belfry:tls")),
        );
        assert_eq!(
            sink.deliver(&task(n), 1, 0).await,
            Outcome::Delivered,
            "{name}"
        );
    }
    let mut reader = redis_client(port, &pki.ca()).await.expect("test client");
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("belfry:tls")
        .arg("-")
        .arg("+")
        .query_async(&mut reader)
        .await
        .expect("XRANGE");
    let ids: Vec<String> = entries
        .iter()
        .filter_map(|(_, fields)| {
            fields
                .iter()
                .find(|(k, _)| k == "id")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(ids, [task(1).id.to_string(), task(2).id.to_string()]);

    let untrusted = build(
        connections.clone(),
        SinkSpec::RedisStream(RedisStreamSpec::new("untrusted", "belfry:tls")),
    );
    let reason = retry_reason(untrusted.deliver(&task(3), 1, 0).await);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    // Plain text to the TLS port: refused by the server, still a retry.
    let plain = build(
        connections,
        SinkSpec::RedisStream(RedisStreamSpec::new("plain", "belfry:tls")),
    );
    retry_reason(plain.deliver(&task(4), 1, 0).await);
    let len: u64 = redis::cmd("XLEN")
        .arg("belfry:tls")
        .query_async(&mut reader)
        .await
        .expect("XLEN");
    assert_eq!(len, 2, "only the trusted connections delivered");
}

#[tokio::test]
async fn a_bad_ca_file_is_a_config_error() {
    let pki = Pki::new();
    let bad = pki.dir.path().join("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    for (kind, url) in [
        (ConnectionKind::Redis, "rediss://127.0.0.1:1/0"),
        (ConnectionKind::Nats, "tls://127.0.0.1:1"),
    ] {
        for ca in [bad.clone(), pki.dir.path().join("missing.pem"), pki.key()] {
            let spec = connection(kind, url.to_owned(), true, Some(ca.clone()));
            let error = Connections::empty()
                .insert("main", spec)
                .expect_err("a bad CA file is refused");
            assert!(
                error.starts_with("connections.main.tls.ca_file: "),
                "{error}"
            );
            let file = ca.file_name().unwrap().to_string_lossy().into_owned();
            assert!(error.contains(&file), "{error}");
        }
    }
}

#[tokio::test]
async fn nats_over_tls_delivers_with_the_ca_and_retries_without_it() {
    let pki = Pki::new();
    let server = start_nats(&pki, None).await;
    let port = server.port;
    let client = nats_client(port, &pki.ca(), None)
        .await
        .expect("test client");
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: "TLS".to_owned(),
            subjects: vec!["tls.>".to_owned()],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("create the JetStream stream");
    let nats = ConnectionKind::Nats;
    let connections = Connections::empty()
        .with(
            "trusted",
            connection(
                nats,
                format!("nats://127.0.0.1:{port}"),
                true,
                Some(pki.ca()),
            ),
        )
        .with(
            "untrusted",
            connection(nats, format!("nats://127.0.0.1:{port}"), true, None),
        );
    let subject = "tls.orders";
    let trusted = build(
        connections.clone(),
        SinkSpec::Nats(NatsSpec::new("trusted", subject)),
    );
    assert_eq!(trusted.deliver(&task(1), 1, 0).await, Outcome::Delivered);
    let message = stream
        .get_raw_message(1)
        .await
        .expect("the published message");
    assert_eq!(&message.payload[..], &task(1).payload[..]);
    let untrusted = build(
        connections,
        SinkSpec::Nats(NatsSpec::new("untrusted", subject)),
    );
    let reason = retry_reason(untrusted.deliver(&task(2), 1, 0).await);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    assert_eq!(stream.info().await.expect("stream info").state.messages, 1);
}

/// A server that requires a user and password: the connection's credentials let the sink in,
/// and a wrong password is a permanent refusal (a dead letter with the reason), not a retry
/// loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_credentials_let_the_sink_in_and_a_wrong_password_is_refused() {
    const LOGIN: Login = Some(("belfry", "s3cret-nats"));
    let pki = Pki::new();
    let server = start_nats(&pki, LOGIN).await;
    let port = server.port;
    let client = nats_client(port, &pki.ca(), LOGIN)
        .await
        .expect("test client");
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: "AUTH".to_owned(),
            subjects: vec!["auth.>".to_owned()],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("create the JetStream stream");
    let url = format!("nats://127.0.0.1:{port}");
    let with = |password: &str| {
        let mut spec = connection(ConnectionKind::Nats, url.clone(), true, Some(pki.ca()));
        spec.username = Some("belfry".to_owned());
        spec.password = Some(password.to_owned());
        spec
    };
    // The same credentials in the URL: the sink takes them out of the address (which the
    // client logs) and sends them as the keys are sent.
    let in_url = connection(
        ConnectionKind::Nats,
        format!("nats://belfry:s3cret-nats@127.0.0.1:{port}"),
        true,
        Some(pki.ca()),
    );
    let connections = Connections::empty()
        .with("right", with("s3cret-nats"))
        .with("wrong", with("not-it"))
        .with("in-url", in_url);
    let right = build(
        connections.clone(),
        SinkSpec::Nats(NatsSpec::new("right", "auth.orders")),
    );
    assert_eq!(right.deliver(&task(1), 1, 0).await, Outcome::Delivered);
    assert_eq!(stream.info().await.expect("stream info").state.messages, 1);
    let from_url = build(
        connections.clone(),
        SinkSpec::Nats(NatsSpec::new("in-url", "auth.orders")),
    );
    assert_eq!(from_url.deliver(&task(3), 1, 0).await, Outcome::Delivered);
    assert_eq!(stream.info().await.expect("stream info").state.messages, 2);
    let wrong = build(
        connections,
        SinkSpec::Nats(NatsSpec::new("wrong", "auth.orders")),
    );
    match wrong.deliver(&task(2), 1, 0).await {
        Outcome::Reject { reason } => {
            assert!(reason.to_lowercase().contains("author"), "{reason}");
            assert!(
                !reason.contains("not-it"),
                "the password is not echoed: {reason}"
            );
        }
        other => panic!("a wrong password: expected a rejection, got {other:?}"),
    }
    assert_eq!(stream.info().await.expect("stream info").state.messages, 2);
}
