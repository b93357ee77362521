//! Sink conformance: ONE scenario list, run against every sink (webhook, Redis Streams, NATS
//! JetStream, Kafka), each against a real server the test starts on a free loopback port.
//!
//! Sinks are built the way the server builds them: a `SinkSpec` and declared `Connections`
//! through `StandardSinks`. Every scenario reads deliveries back with a real consumer.
//! A new sink joins by adding a `Backend` variant and one line to `conformance!` at the end.
#![cfg(all(feature = "redis-streams", feature = "nats", feature = "kafka"))]

mod servers;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{QueueName, Task, TaskId};
use belfry_sinks::{
    Attempt, ConnectionKind, ConnectionSpec, Connections, KafkaSpec, NatsSpec, Outcome,
    RedisStreamSpec, Sink, SinkFactory, SinkSpec, StandardSinks, TargetPolicy, WebhookSpec,
};
use bytes::Bytes;
use servers::{GarbageServer, KafkaServer, NatsServer, Receiver, RedisServer};

const QUEUE: &str = "orders.eu-1";
/// The NATS stream (and its subjects) and the Redis stream / Kafka topic the sinks write to.
const NATS_STREAM: &str = "BELFRY";
const NATS_SUBJECT: &str = "tasks.orders";
const STREAM: &str = "belfry-tasks";
/// Largest message the NATS stream accepts, so a larger payload is a permanent refusal.
const NATS_MESSAGE_BYTES_MAX: i32 = 4096;
/// A delivery limit short enough to keep the timeout scenario fast, long enough that a healthy
/// loopback broker always answers within it.
const SHORT_TIMEOUT_MS: u64 = 300;
/// How long a sink may take to reach a server that came back (NATS reconnects on its own
/// schedule, capped at 2 s).
const RECOVERY_DEADLINE: Duration = Duration::from_secs(20);
/// Tasks in the ordering and close scenarios.
const BATCH_TASKS: usize = 100;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Webhook,
    Redis,
    Nats,
    Kafka,
}

/// The server behind one sink, and how to read what it received.
enum Backend {
    Webhook(Receiver),
    Redis(RedisServer),
    Nats(NatsServer),
    Kafka(KafkaServer),
}

/// A delivery as a consumer sees it, whatever the system.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Received {
    payload: Vec<u8>,
    task_id: String,
    queue: String,
    attempt: String,
    due_at_ms: String,
    shard: Option<(String, String)>,
    /// A schedule's firing: the schedule's id and the fire time.
    firing: Option<(String, String)>,
    /// The task's own headers, by lower-case name.
    own: Vec<(String, String)>,
}

/// Which sink to build for a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Normal,
    ShortTimeout,
}

impl Backend {
    async fn start(kind: Kind) -> Backend {
        match kind {
            Kind::Webhook => Backend::Webhook(Receiver::start().await),
            Kind::Redis => Backend::Redis(RedisServer::start().await),
            Kind::Nats => {
                let server = NatsServer::start().await;
                create_nats_stream(&server).await;
                Backend::Nats(server)
            }
            Kind::Kafka => {
                let server = KafkaServer::start().await;
                server.create_topic(STREAM, 1).await;
                Backend::Kafka(server)
            }
        }
    }

    fn connections(&self) -> Connections {
        match self {
            Backend::Webhook(_) => Connections::empty(),
            Backend::Redis(server) => Connections::empty().with(
                "main",
                ConnectionSpec::url(ConnectionKind::Redis, server.url()),
            ),
            Backend::Nats(server) => Connections::empty().with(
                "main",
                ConnectionSpec::url(ConnectionKind::Nats, server.url()),
            ),
            Backend::Kafka(server) => {
                Connections::empty().with("main", ConnectionSpec::kafka([server.broker()]))
            }
        }
    }

    fn spec(&self, variant: Variant) -> SinkSpec {
        let timeout_ms = match variant {
            Variant::Normal => 5_000,
            Variant::ShortTimeout => SHORT_TIMEOUT_MS,
        };
        match self {
            Backend::Webhook(receiver) => SinkSpec::Webhook(WebhookSpec {
                timeout_ms,
                ..WebhookSpec::new(receiver.url())
            }),
            Backend::Redis(_) => SinkSpec::RedisStream(RedisStreamSpec {
                timeout_ms,
                ..RedisStreamSpec::new("main", STREAM)
            }),
            Backend::Nats(_) => SinkSpec::Nats(NatsSpec {
                timeout_ms,
                ..NatsSpec::new("main", NATS_SUBJECT)
            }),
            Backend::Kafka(_) => SinkSpec::Kafka(KafkaSpec {
                timeout_ms,
                key: Some("task_id".into()),
                ..KafkaSpec::new("main", STREAM)
            }),
        }
    }

    fn sink(&self, variant: Variant) -> Arc<dyn Sink> {
        build(self.connections(), &self.spec(variant))
    }

    /// A sink of this kind whose connection leads to a server that answers garbage.
    fn garbage_sink(&self, port: u16) -> Arc<dyn Sink> {
        let (connections, spec) = match self {
            Backend::Webhook(_) => (
                Connections::empty(),
                SinkSpec::Webhook(WebhookSpec {
                    timeout_ms: 2_000,
                    ..WebhookSpec::new(format!("http://127.0.0.1:{port}/hook"))
                }),
            ),
            Backend::Redis(_) => (
                Connections::empty().with(
                    "main",
                    ConnectionSpec::url(ConnectionKind::Redis, format!("redis://127.0.0.1:{port}")),
                ),
                self.spec(Variant::ShortTimeout),
            ),
            Backend::Nats(_) => (
                Connections::empty().with(
                    "main",
                    ConnectionSpec::url(ConnectionKind::Nats, format!("nats://127.0.0.1:{port}")),
                ),
                self.spec(Variant::ShortTimeout),
            ),
            Backend::Kafka(_) => (
                Connections::empty()
                    .with("main", ConnectionSpec::kafka([format!("127.0.0.1:{port}")])),
                self.spec(Variant::ShortTimeout),
            ),
        };
        build(connections, &spec)
    }

    /// A sink and a task that the target refuses for good, and what the reason must mention.
    async fn refusal(&self) -> Vec<(Arc<dyn Sink>, Task, &'static str)> {
        match self {
            Backend::Webhook(receiver) => {
                receiver.behaviour.status.store(413, Ordering::SeqCst);
                vec![(self.sink(Variant::Normal), task(1, b"{}"), "413")]
            }
            Backend::Redis(server) => {
                let mut connection = server.connection().await;
                let () = redis::cmd("SET")
                    .arg("taken")
                    .arg("a string")
                    .query_async(&mut connection)
                    .await
                    .expect("SET");
                let wrong_type = build(
                    self.connections(),
                    &SinkSpec::RedisStream(RedisStreamSpec::new("main", "taken")),
                );
                let mut bad_password = ConnectionSpec::url(ConnectionKind::Redis, server.url());
                bad_password.username = Some("nobody".into());
                bad_password.password = Some("wrong".into());
                let auth = build(
                    Connections::empty().with("main", bad_password),
                    &self.spec(Variant::Normal),
                );
                vec![
                    (wrong_type, task(1, b"{}"), "WRONGTYPE"),
                    (auth, task(2, b"{}"), "redis error"),
                ]
            }
            Backend::Nats(server) => {
                let large = vec![b'x'; NATS_MESSAGE_BYTES_MAX as usize * 2];
                seal_nats_stream(server, "SEALED", "sealed.>").await;
                let sealed = build(
                    self.connections(),
                    &SinkSpec::Nats(NatsSpec::new("main", "sealed.orders")),
                );
                vec![
                    (
                        self.sink(Variant::Normal),
                        task_with_payload(2, large),
                        "10054",
                    ),
                    // JSStreamSealedErr: a sealed stream never takes a message again.
                    (sealed, task(3, b"{}"), "10109"),
                ]
            }
            // Kafka's refusal, SASL credentials refused, needs a broker with SASL:
            // `tests/kafka_security/sasl.rs`. An unknown topic is retried (`not_there_yet`).
            Backend::Kafka(_) => Vec::new(),
        }
    }

    /// A sink to a destination that does not exist yet, and what creates it.
    async fn missing_destination(&self) -> Option<Arc<dyn Sink>> {
        match self {
            Backend::Nats(_) => Some(build(
                self.connections(),
                &SinkSpec::Nats(NatsSpec::new("main", "later.orders")),
            )),
            Backend::Kafka(_) => Some(build(
                self.connections(),
                &SinkSpec::Kafka(KafkaSpec::new("main", "later-topic")),
            )),
            Backend::Webhook(_) | Backend::Redis(_) => None,
        }
    }

    async fn create_missing_destination(&self) {
        match self {
            Backend::Nats(server) => {
                server
                    .jetstream()
                    .await
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: "LATER".to_owned(),
                        subjects: vec!["later.>".to_owned()],
                        ..Default::default()
                    })
                    .await
                    .expect("create the stream");
            }
            Backend::Kafka(server) => server.create_topic("later-topic", 1).await,
            Backend::Webhook(_) | Backend::Redis(_) => {}
        }
    }

    async fn stop(&mut self) {
        match self {
            Backend::Webhook(s) => s.stop().await,
            Backend::Redis(s) => s.stop(),
            Backend::Nats(s) => s.stop(),
            Backend::Kafka(s) => s.stop(),
        }
    }

    async fn restart(&mut self) {
        match self {
            Backend::Webhook(s) => s.restart().await,
            Backend::Redis(s) => s.restart().await,
            Backend::Nats(s) => s.restart().await,
            Backend::Kafka(s) => {
                s.restart().await;
                // Memory storage: the topic went with the old process.
                s.create_topic(STREAM, 1).await;
            }
        }
    }

    /// Makes the target hang: answers nothing while keeping connections open.
    fn hang(&mut self) {
        match self {
            Backend::Webhook(s) => s.behaviour.delay_ms.store(5_000, Ordering::SeqCst),
            Backend::Redis(s) => s.process.as_mut().expect("running").pause(),
            Backend::Nats(s) => s.process.as_mut().expect("running").pause(),
            Backend::Kafka(s) => s.process.as_mut().expect("running").pause(),
        }
    }

    fn unhang(&mut self) {
        match self {
            Backend::Webhook(s) => s.behaviour.delay_ms.store(0, Ordering::SeqCst),
            Backend::Redis(s) => s.process.as_mut().expect("running").resume(),
            Backend::Nats(s) => s.process.as_mut().expect("running").resume(),
            Backend::Kafka(s) => s.process.as_mut().expect("running").resume(),
        }
    }

    /// Everything received so far, in arrival (stream) order.
    async fn received(&self) -> Vec<Received> {
        match self {
            Backend::Webhook(receiver) => {
                let requests = receiver.requests.lock().expect("requests").clone();
                requests
                    .into_iter()
                    .map(|request| from_headers(request.body, &request.headers))
                    .collect()
            }
            Backend::Redis(server) => read_redis(server).await,
            Backend::Nats(server) => read_nats(server).await,
            Backend::Kafka(server) => read_kafka(server).await,
        }
    }
}

fn build(connections: Connections, spec: &SinkSpec) -> Arc<dyn Sink> {
    let factory = StandardSinks::new(TargetPolicy::ALLOW_PRIVATE, 8, connections).expect("factory");
    factory
        .build(&QueueName::new(QUEUE).expect("queue name"), spec)
        .unwrap_or_else(|error| panic!("build {spec:?}: {error}"))
}

async fn create_nats_stream(server: &NatsServer) {
    server
        .jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: NATS_STREAM.to_owned(),
            subjects: vec!["tasks.>".to_owned()],
            max_message_size: NATS_MESSAGE_BYTES_MAX,
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("create the JetStream stream");
}

/// Creates stream `name` capturing `subjects`, then seals it (a stream cannot be created
/// sealed).
async fn seal_nats_stream(server: &NatsServer, name: &str, subjects: &str) {
    let jetstream = server.jetstream().await;
    let mut config = async_nats::jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![subjects.to_owned()],
        ..Default::default()
    };
    jetstream
        .create_stream(config.clone())
        .await
        .expect("create the stream to seal");
    config.sealed = true;
    jetstream
        .update_stream(config)
        .await
        .expect("seal the stream");
}

/// Metadata from `belfry-*` headers (webhook, NATS, Kafka).
fn from_headers(payload: Vec<u8>, headers: &[(String, String)]) -> Received {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let shard = get("belfry-shard").zip(get("belfry-shard-count"));
    let firing = get("belfry-schedule").zip(get("belfry-fire-time"));
    let own = headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
        .filter(|(n, _)| n.starts_with("x-"))
        .collect();
    Received {
        payload,
        task_id: get("belfry-task-id").unwrap_or_default(),
        queue: get("belfry-queue").unwrap_or_default(),
        attempt: get("belfry-attempt").unwrap_or_default(),
        due_at_ms: get("belfry-due-at").unwrap_or_default(),
        shard,
        firing,
        own,
    }
}

async fn read_redis(server: &RedisServer) -> Vec<Received> {
    let mut connection = server.connection().await;
    type Entry = (String, Vec<Vec<u8>>);
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(STREAM)
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .unwrap_or_default();
    entries
        .into_iter()
        .map(|(_, fields)| {
            let pairs: Vec<(String, Vec<u8>)> = fields
                .chunks(2)
                .map(|pair| {
                    (
                        String::from_utf8_lossy(&pair[0]).into_owned(),
                        pair[1].clone(),
                    )
                })
                .collect();
            let text = |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            Received {
                payload: pairs
                    .iter()
                    .find(|(n, _)| n == "payload")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default(),
                task_id: text("id").unwrap_or_default(),
                queue: text("queue").unwrap_or_default(),
                attempt: text("attempt").unwrap_or_default(),
                due_at_ms: text("due_at_ms").unwrap_or_default(),
                shard: text("shard").zip(text("shard_count")),
                firing: text("schedule").zip(text("fire_time")),
                own: pairs
                    .iter()
                    .filter_map(|(n, v)| {
                        n.strip_prefix("header:").map(|name| {
                            (
                                name.to_ascii_lowercase(),
                                String::from_utf8_lossy(v).into_owned(),
                            )
                        })
                    })
                    .collect(),
            }
        })
        .collect()
}

async fn read_nats(server: &NatsServer) -> Vec<Received> {
    let jetstream = server.jetstream().await;
    let Ok(mut stream) = jetstream.get_stream(NATS_STREAM).await else {
        return Vec::new();
    };
    let Ok(info) = stream.info().await else {
        return Vec::new();
    };
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return out;
    }
    for sequence in first..=last {
        let Ok(message) = stream.get_raw_message(sequence).await else {
            continue;
        };
        let headers: Vec<(String, String)> = message
            .headers
            .iter()
            .flat_map(|(name, values)| {
                let name = name.to_string();
                values
                    .iter()
                    .map(move |v| (name.clone(), v.as_str().to_owned()))
            })
            .collect();
        let mut received = from_headers(message.payload.to_vec(), &headers);
        // The broker de-duplicates on Nats-Msg-Id: it must be the task id.
        let msg_id = headers
            .iter()
            .find(|(n, _)| n == "Nats-Msg-Id")
            .map(|(_, v)| v.clone());
        assert_eq!(msg_id.as_deref(), Some(received.task_id.as_str()));
        received.own.retain(|(n, _)| n.starts_with("x-"));
        out.push(received);
    }
    out
}

async fn read_kafka(server: &KafkaServer) -> Vec<Received> {
    let client = server.client().await;
    let Ok(partition) = client
        .partition_client(
            STREAM,
            0,
            rskafka::client::partition::UnknownTopicHandling::Retry,
        )
        .await
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let Ok((records, high_watermark)) =
            partition.fetch_records(offset, 1..10_000_000, 200).await
        else {
            return out;
        };
        for record in &records {
            let headers: Vec<(String, String)> = record
                .record
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            let mut received =
                from_headers(record.record.value.clone().unwrap_or_default(), &headers);
            // The spec keys records by task id.
            assert_eq!(
                record.record.key.as_deref(),
                Some(received.task_id.as_bytes())
            );
            received.own.retain(|(n, _)| n.starts_with("x-"));
            out.push(received);
            offset = record.offset + 1;
        }
        if records.is_empty() || offset >= high_watermark {
            return out;
        }
    }
}

fn task(n: u128, payload: &'static [u8]) -> Task {
    task_with_payload(n, payload.to_vec())
}

fn task_with_payload(n: u128, payload: Vec<u8>) -> Task {
    belfry_sinks::testing::leased_task(
        TaskId(0xbe1f_0000_0000_0000_0000_0000_0000_0000 + n),
        QUEUE,
        1_700_000_000_000 + n as u64,
        Bytes::from(payload),
    )
}

async fn wait_received(backend: &Backend, count: usize) -> Vec<Received> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let received = backend.received().await;
        if received.len() >= count || Instant::now() > deadline {
            return received;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect_retry(outcome: &Outcome, context: &str) {
    match outcome {
        Outcome::Retry { reason, .. } => assert!(!reason.is_empty(), "{context}: empty reason"),
        other => panic!("{context}: expected a retry, got {other:?}"),
    }
}

// ---- the scenarios ----

/// Delivered, and read back by a consumer: payload exactly, metadata, a schedule's firing and
/// shard, own headers.
async fn delivered(kind: Kind) {
    let backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::Normal);
    let mut task = task(7, br#"{"order":42,"note":"caf\u00e9"}"#);
    task.headers = vec![
        ("X-Trace".into(), "t-1".into()),
        ("Belfry-Shard".into(), "3".into()),
        ("Belfry-Shard-Count".into(), "8".into()),
        ("Belfry-Schedule".into(), "nightly".into()),
        ("Belfry-Fire-Time".into(), "1700000000000".into()),
        ("Belfry-Task-Id".into(), "forged".into()),
    ];
    assert_eq!(
        sink.deliver(&task, 3, 1_700_000_000_500).await,
        Outcome::Delivered
    );
    let received = wait_received(&backend, 1).await;
    assert_eq!(received.len(), 1, "{kind:?}: {received:?}");
    assert_eq!(
        received[0],
        Received {
            payload: task.payload.to_vec(),
            task_id: task.id.to_string(),
            queue: QUEUE.into(),
            attempt: "3".into(),
            due_at_ms: task.due_at_ms.to_string(),
            shard: Some(("3".into(), "8".into())),
            firing: Some(("nightly".into(), "1700000000000".into())),
            own: vec![("x-trace".into(), "t-1".into())],
        },
        "{kind:?}"
    );
    if !matches!(kind, Kind::Webhook) {
        assert_eq!(sink.target(), "main", "the connection's name");
    }
}

/// Down: retried (never rejected). Back: delivered again without a new sink.
async fn down_then_back(kind: Kind) {
    let mut backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::ShortTimeout);
    assert_eq!(
        sink.deliver(&task(1, b"{}"), 1, 0).await,
        Outcome::Delivered
    );
    backend.stop().await;
    let outcome = sink.deliver(&task(2, b"{}"), 1, 0).await;
    expect_retry(&outcome, &format!("{kind:?} while down"));
    // Every sink reports what its last delivery saw of the target.
    assert!(
        matches!(sink.health(), belfry_sinks::SinkHealth::Unreachable(_)),
        "{kind:?}: {:?}",
        sink.health()
    );
    backend.restart().await;
    let deadline = Instant::now() + RECOVERY_DEADLINE;
    loop {
        match sink.deliver(&task(3, b"{}"), 1, 0).await {
            Outcome::Delivered => break,
            Outcome::Retry { reason, .. } => {
                assert!(
                    Instant::now() < deadline,
                    "{kind:?} never recovered: {reason}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Outcome::Reject { reason } => panic!("{kind:?} rejected after a restart: {reason}"),
        }
    }
    assert_eq!(
        sink.health(),
        belfry_sinks::SinkHealth::Reachable,
        "{kind:?}"
    );
    let received = wait_received(&backend, 1).await;
    assert!(
        received
            .iter()
            .any(|r| r.task_id == task(3, b"").id.to_string()),
        "{kind:?}: {received:?}"
    );
}

/// A permanent refusal is a rejection that says why.
async fn refused(kind: Kind) {
    let backend = Backend::start(kind).await;
    let refusals = backend.refusal().await;
    assert!(!refusals.is_empty(), "{kind:?} has no refusal to try");
    for (sink, task, needle) in refusals {
        match sink.deliver(&task, 1, 0).await {
            Outcome::Reject { reason } => {
                assert!(
                    reason.contains(needle),
                    "{kind:?}: {reason:?} lacks {needle:?}"
                )
            }
            other => panic!("{kind:?} ({needle}): expected a rejection, got {other:?}"),
        }
    }
}

/// A stream or topic that does not exist yet is retried, not a dead letter (a stream being
/// created, JetStream or a broker starting after a restart answer alike), and delivered once
/// it exists. A dead letter at the first attempt had emptied queues into their dead letters
/// during a broker restart.
async fn not_there_yet(kind: Kind) {
    let backend = Backend::start(kind).await;
    let sink = backend
        .missing_destination()
        .await
        .expect("a kind with one");
    let outcome = sink.deliver(&task(1, b"{}"), 1, 0).await;
    expect_retry(&outcome, &format!("{kind:?} before it exists"));
    backend.create_missing_destination().await;
    let deadline = Instant::now() + RECOVERY_DEADLINE;
    loop {
        match sink.deliver(&task(1, b"{}"), 2, 0).await {
            Outcome::Delivered => break,
            Outcome::Retry { reason, .. } => {
                assert!(
                    Instant::now() < deadline,
                    "{kind:?} never delivered: {reason}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Outcome::Reject { reason } => panic!("{kind:?} rejected: {reason}"),
        }
    }
}

/// A target that answers nothing: a retry once the limit passes, not a hang.
async fn timeout(kind: Kind) {
    let mut backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::ShortTimeout);
    // Connected first, so the hang hits a live connection mid-request.
    assert_eq!(
        sink.deliver(&task(1, b"{}"), 1, 0).await,
        Outcome::Delivered
    );
    backend.hang();
    let started = Instant::now();
    let outcome = sink.deliver(&task(2, b"{}"), 1, 0).await;
    let took = started.elapsed();
    backend.unhang();
    expect_retry(&outcome, &format!("{kind:?} hung"));
    assert!(
        took < Duration::from_millis(SHORT_TIMEOUT_MS * 2 + 1_000),
        "{kind:?}: took {took:?}"
    );
}

/// Many tasks through `deliver_batch`: all delivered, and they arrive in due order.
async fn batch_in_due_order(kind: Kind) {
    let backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::Normal);
    let tasks: Vec<Task> = (0..BATCH_TASKS as u128).map(|n| task(n, b"{}")).collect();
    let mut outcomes = Vec::new();
    // In chunks of the sink's batch size, as the dispatcher does.
    let batch_max = sink.batch_max().max(1);
    assert!(
        matches!(kind, Kind::Webhook) || batch_max > 1,
        "{kind:?}: stream sinks publish many per round trip"
    );
    let attempts: Vec<Attempt<'_>> = tasks
        .iter()
        .map(|task| Attempt { task, attempt: 1 })
        .collect();
    for chunk in attempts.chunks(batch_max) {
        outcomes.extend(sink.deliver_batch(chunk, 0).await);
    }
    assert_eq!(outcomes, vec![Outcome::Delivered; BATCH_TASKS], "{kind:?}");
    let received = wait_received(&backend, BATCH_TASKS).await;
    let ids: Vec<String> = received.iter().map(|r| r.task_id.clone()).collect();
    let expected: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(ids, expected, "{kind:?}: not in due order");
}

/// Batches a dispatcher has in flight at once on one sink: more records together than a
/// client keeps unacknowledged (NATS: [`belfry_sinks::nats::ACKS_IN_FLIGHT_MAX`]). Every
/// one is delivered, none waits for a timeout.
async fn many_batches_at_once(kind: Kind) {
    const BATCHES: usize = 32;
    let backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::Normal);
    let batch_max = sink.batch_max().max(1);
    let total = BATCHES * batch_max;
    let tasks: Arc<Vec<Task>> = Arc::new((0..total as u128).map(|n| task(n, b"{}")).collect());
    let started = Instant::now();
    let calls: Vec<_> = (0..BATCHES)
        .map(|b| {
            let (sink, tasks) = (Arc::clone(&sink), Arc::clone(&tasks));
            tokio::spawn(async move {
                let attempts: Vec<Attempt<'_>> = tasks[b * batch_max..(b + 1) * batch_max]
                    .iter()
                    .map(|task| Attempt { task, attempt: 1 })
                    .collect();
                sink.deliver_batch(&attempts, 0).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(total);
    for call in calls {
        outcomes.extend(call.await.expect("delivery task"));
    }
    let took = started.elapsed();
    let failed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| **o != Outcome::Delivered)
        .collect();
    assert!(
        failed.is_empty(),
        "{kind:?}: {} of {total} not delivered after {took:?}, first: {:?}",
        failed.len(),
        failed.first()
    );
    let received = wait_received(&backend, total).await;
    let ids: std::collections::HashSet<&str> =
        received.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids.len(), total, "{kind:?}: distinct tasks received");
}

/// `close` waits for deliveries in flight; afterwards the sink answers retry.
async fn close_with_deliveries_in_flight(kind: Kind) {
    let backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::Normal);
    let tasks: Arc<Vec<Task>> =
        Arc::new((0..BATCH_TASKS as u128).map(|n| task(n, b"{}")).collect());
    let in_flight = {
        let sink = Arc::clone(&sink);
        let tasks = Arc::clone(&tasks);
        tokio::spawn(async move {
            let attempts: Vec<Attempt<'_>> = tasks
                .iter()
                .map(|task| Attempt { task, attempt: 1 })
                .collect();
            let mut outcomes = Vec::new();
            for chunk in attempts.chunks(sink.batch_max().max(1)) {
                outcomes.extend(sink.deliver_batch(chunk, 0).await);
            }
            outcomes
        })
    };
    // Let the first batch start, then close.
    tokio::time::sleep(Duration::from_millis(5)).await;
    sink.close().await;
    let outcomes = in_flight.await.expect("delivery task");
    // Whatever started before close finished as delivered; anything after is a retry.
    let delivered = outcomes
        .iter()
        .filter(|o| **o == Outcome::Delivered)
        .count();
    for outcome in &outcomes[delivered..] {
        expect_retry(outcome, &format!("{kind:?} after close"));
    }
    // A webhook holds no connection of its own (one pooled client serves every queue), so
    // its close lets nothing go; a stream sink refuses work once closed.
    if !matches!(kind, Kind::Webhook) {
        expect_retry(
            &sink.deliver(&task(999, b"{}"), 1, 0).await,
            &format!("{kind:?} deliver after close"),
        );
    }
    let received = wait_received(&backend, delivered).await;
    assert!(
        received.len() >= delivered,
        "{kind:?}: {} < {delivered}",
        received.len()
    );
}

/// A server that sends garbage and closes: a retry, no panic.
async fn garbage_is_retried(kind: Kind) {
    let backend = Backend::start(kind).await;
    let garbage = GarbageServer::start().await;
    let sink = backend.garbage_sink(garbage.port);
    for n in 0..3 {
        expect_retry(
            &sink.deliver(&task(n, b"{}"), 1, 0).await,
            &format!("{kind:?} garbage"),
        );
    }
    let attempts = [Attempt {
        task: &task(9, b"{}"),
        attempt: 1,
    }];
    for outcome in sink.deliver_batch(&attempts, 0).await {
        expect_retry(&outcome, &format!("{kind:?} garbage batch"));
    }
}

/// `open` reports an unreachable broker (without failing anything) and a reachable one.
async fn open_reports_reachability(kind: Kind) {
    let mut backend = Backend::start(kind).await;
    let sink = backend.sink(Variant::ShortTimeout);
    assert_eq!(sink.open().await, Ok(()), "{kind:?}");
    if matches!(kind, Kind::Webhook) {
        // Opening a webhook checks nothing: a probe request could have side effects.
        return;
    }
    backend.stop().await;
    let later = backend.sink(Variant::ShortTimeout);
    let error = later.open().await.expect_err("unreachable");
    assert!(
        matches!(&error, belfry_sinks::OpenError::Unreachable(reason) if reason.contains("main")),
        "{kind:?}: {error:?}"
    );
}

macro_rules! conformance {
    ($($module:ident => $kind:expr),* $(,)?) => {$(
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivered() { super::delivered($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn down_then_back() { super::down_then_back($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn timeout() { super::timeout($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batch_in_due_order() { super::batch_in_due_order($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn many_batches_at_once() { super::many_batches_at_once($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn close_with_deliveries_in_flight() {
                super::close_with_deliveries_in_flight($kind).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn garbage_is_retried() { super::garbage_is_retried($kind).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn open_reports_reachability() { super::open_reports_reachability($kind).await }
        }
    )*};
}

/// Scenarios some kinds have: a permanent refusal (Kafka's needs SASL, see `refusal`), and a
/// destination that does not exist yet (a webhook's or a Redis stream's always does).
mod by_kind {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn webhook_refused() {
        refused(Kind::Webhook).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_stream_refused() {
        refused(Kind::Redis).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nats_refused() {
        refused(Kind::Nats).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nats_not_there_yet() {
        not_there_yet(Kind::Nats).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kafka_not_there_yet() {
        not_there_yet(Kind::Kafka).await
    }
}

conformance! {
    webhook => Kind::Webhook,
    redis_stream => Kind::Redis,
    nats => Kind::Nats,
    kafka => Kind::Kafka,
}
