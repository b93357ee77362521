//! The Kafka sink over TLS and with SASL, against the real Tansu broker on loopback.
//!
//! SASL: Tansu started with `--authentication`, and sinks built from declared connections the
//! way the server builds them (see `sasl.rs` for what this Tansu can and cannot show).
//!
//! TLS: Tansu (0.6) cannot serve TLS from its command line (its `--cert` and `--key` flags
//! exclude each other, and it needs both), so the broker sits behind a TLS terminator this test
//! runs: rustls with a certificate from a CA the test makes, forwarding each connection to
//! Tansu's plain listener. Tansu advertises the terminator's address, so every connection the
//! client opens (bootstrap and partition leaders) is TLS.
//!
//! A missing `tansu` fails these tests with an install hint, as in the conformance suite.
#![cfg(feature = "kafka")]

use belfry_sinks::testing::{free_port, leased_task, tansu_bin};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{QueueName, Task, TaskId};
use belfry_sinks::{
    ConnectionSpec, Connections, KafkaSpec, Outcome, Sink, SinkFactory, SinkSpec, StandardSinks,
    TargetPolicy, TlsOptions,
};
use bytes::Bytes;
use rskafka::client::partition::UnknownTopicHandling;
use rskafka::client::{Client, ClientBuilder};

const TOPIC: &str = "secured";
const QUEUE: &str = "orders";
/// How long a freshly started broker may take to listen.
const STARTUP_DEADLINE: Duration = Duration::from_secs(30);
/// The sinks' delivery limit. No test here expects a delivery to time out: a refused login
/// comes back when the client's retry budget (a quarter of this limit, see
/// `kafka::client_deadline`) is spent, and the attempts themselves have the rest. When that
/// budget was 80 % of the limit, the attempts ran past it under a loaded CI machine.
const TIMEOUT_MS: u64 = 10_000;

// ---- the broker ----

/// A Tansu process this test started; killed by its PID on drop.
struct Tansu {
    child: Child,
    port: u16,
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tansu {
    /// Listens on a free port and advertises `advertised_port` (the TLS terminator's, or its
    /// own). `--authentication` makes every client log in with SASL.
    async fn start(advertised_port: Option<u16>, authentication: bool) -> Tansu {
        let port = free_port();
        let listener = format!("tcp://127.0.0.1:{port}");
        let advertised = format!("tcp://127.0.0.1:{}", advertised_port.unwrap_or(port));
        let mut command = Command::new(tansu_bin());
        command
            .arg("broker")
            .args(["--listener-url", &listener])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "memory://tansu/"])
            .args(["--cluster-id", &format!("belfry-sec-{port}")]);
        if authentication {
            command.arg("--authentication");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("start {command:?}: {error}"));
        let tansu = Tansu { child, port };
        let deadline = Instant::now() + STARTUP_DEADLINE;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "tansu did not listen on {port}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tansu
    }

    fn broker(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Makes `TOPIC` (one partition) through `client` and waits until the metadata shows it.
async fn create_topic(client: &Client) {
    client
        .controller_client()
        .expect("controller client")
        .create_topic(TOPIC, 1, 1, 5_000)
        .await
        .expect("create topic");
    let deadline = Instant::now() + STARTUP_DEADLINE;
    while !client
        .list_topics()
        .await
        .is_ok_and(|topics| topics.iter().any(|t| t.name == TOPIC))
    {
        assert!(Instant::now() < deadline, "topic {TOPIC} never showed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The payloads of every record in `TOPIC`.
async fn read_payloads(client: &Client) -> Vec<Vec<u8>> {
    let partition = client
        .partition_client(TOPIC, 0, UnknownTopicHandling::Retry)
        .await
        .expect("partition client");
    let (records, _) = partition
        .fetch_records(0, 1..10_000_000, 500)
        .await
        .expect("fetch records");
    records
        .into_iter()
        .map(|r| r.record.value.unwrap_or_default())
        .collect()
}

// ---- sinks ----

fn sink(connection: ConnectionSpec) -> Arc<dyn Sink> {
    let connections = Connections::empty().with("main", connection);
    let factory = StandardSinks::new(TargetPolicy::ALLOW_PRIVATE, 8, connections).expect("factory");
    let spec = SinkSpec::Kafka(KafkaSpec {
        timeout_ms: TIMEOUT_MS,
        ..KafkaSpec::new("main", TOPIC)
    });
    factory
        .build(&QueueName::new(QUEUE).expect("queue name"), &spec)
        .unwrap_or_else(|error| panic!("build {spec:?}: {error}"))
}

fn task(n: u128, payload: &'static [u8]) -> Task {
    leased_task(
        TaskId(0x5ec0_0000_0000_0000_0000_0000_0000_0000 + n),
        QUEUE,
        1_700_000_000_000,
        Bytes::from_static(payload),
    )
}

mod sasl;
mod tls;
