//! Stream deliveries end to end through HTTP, against real brokers on loopback started by the
//! test (redis-server, nats-server -js, and the Tansu Kafka-protocol broker; the sink
//! conformance suite's harness): a queue whose delivery names a declared connection, tasks
//! submitted due in one second, read back with a real consumer. Payload, metadata headers
//! and never-early are checked; so are the refusals of bad delivery specs, and that only a
//! webhook's delivery shows `secret_set`.

mod common;

#[allow(dead_code)]
#[path = "../../belfry-sinks/tests/conformance/servers.rs"]
mod servers;

use std::sync::Arc;

use belfry_core::{Clock, ManualClock};
use belfry_sinks::{ConnectionKind, ConnectionSpec, Connections};
use belfry_store::MemoryStore;
use common::{eventually, test_config, TestServer, T0};
use serde_json::{json, Value};
use servers::{KafkaServer, NatsServer, RedisServer};

/// One message as a consumer read it: payload and metadata, whatever the broker's form.
#[derive(Debug)]
struct Message {
    payload: Vec<u8>,
    task_id: String,
    queue: String,
    attempt: String,
    due_at_ms: String,
    trace: Option<String>,
}

async fn start(connections: Connections) -> TestServer {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new());
    let handle = belfry_server::Server::builder(test_config(), store.clone())
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
        .connections(connections)
        .start()
        .await
        .expect("server starts");
    TestServer::from_handle(handle, clock, store)
}

/// Creates the queue, submits three tasks due in a second, checks nothing is published
/// before then (after the dispatcher looked), then that all three arrive with their metadata.
async fn deliver_three(
    s: &TestServer,
    delivery: Value,
    read: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Message>> + Send>>,
) {
    let created = s.queue("events", json!({ "delivery": delivery })).await;
    assert!(
        created.get("warnings").is_none(),
        "the broker is up, yet: {created}"
    );
    assert_eq!(created["delivery"]["connection"], "main");
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            s.submit(
                "events",
                json!({"payload": {"n": i}, "delay_ms": 1000, "headers": {"x-trace": format!("t{i}")}}),
            )
            .await,
        );
    }
    s.clock.advance(std::time::Duration::from_millis(999));
    s.handle.wake_all();
    let looked = s.clock.wall_ms();
    eventually("a dispatch turn before the due time", || async {
        (s.handle.service().dispatch_stats().looked_at_ms >= looked).then_some(())
    })
    .await;
    assert!(read().await.is_empty(), "published before due");
    s.advance(1);
    let messages = eventually("three messages in the broker", || async {
        let messages = read().await;
        (messages.len() >= 3).then_some(messages)
    })
    .await;
    assert_eq!(messages.len(), 3, "{messages:?}");
    for (i, (message, id)) in messages.iter().zip(&ids).enumerate() {
        // Due order within the queue, payload byte for byte, metadata on every message.
        assert_eq!(&message.task_id, id);
        let payload: Value = serde_json::from_slice(&message.payload).expect("JSON payload");
        assert_eq!(payload, json!({"n": i}));
        assert_eq!(message.queue, "events");
        assert_eq!(message.attempt, "1");
        assert_eq!(message.due_at_ms, (T0 + 1000).to_string());
        assert_eq!(message.trace.as_deref(), Some(format!("t{i}").as_str()));
    }
    eventually("the tasks acknowledged", || async {
        let q = s.ok("GET", "/v1/queues/events", Value::Null, 200).await;
        (q["pending"] == 0 && q["in_flight"] == 0).then_some(())
    })
    .await;
    let q = s.ok("GET", "/v1/queues/events", Value::Null, 200).await;
    assert_eq!(q["delivery_health"], "reachable", "{q}");
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn from_headers(payload: Vec<u8>, headers: &[(String, String)]) -> Message {
    let get = |name: &str| header(headers, name).unwrap_or_default().to_owned();
    Message {
        payload,
        task_id: get("belfry-task-id"),
        queue: get("belfry-queue"),
        attempt: get("belfry-attempt"),
        due_at_ms: get("belfry-due-at"),
        trace: header(headers, "x-trace").map(str::to_owned),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stream_delivery_end_to_end() {
    let redis = RedisServer::start().await;
    let connections = Connections::empty().with(
        "main",
        ConnectionSpec::url(ConnectionKind::Redis, redis.url()),
    );
    let s = start(connections).await;
    let url = redis.url();
    let read = move || {
        let url = url.clone();
        Box::pin(async move {
            let client = redis::Client::open(url).expect("redis url");
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            type Entry = (String, Vec<(String, Vec<u8>)>);
            let entries: Vec<Entry> = redis::cmd("XRANGE")
                .arg("belfry-events")
                .arg("-")
                .arg("+")
                .query_async(&mut connection)
                .await
                .unwrap_or_default();
            entries
                .into_iter()
                .map(|(_, fields)| {
                    let text = |name: &str| {
                        fields
                            .iter()
                            .find(|(n, _)| n == name)
                            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                    };
                    Message {
                        payload: fields
                            .iter()
                            .find(|(n, _)| n == "payload")
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default(),
                        task_id: text("id").unwrap_or_default(),
                        queue: text("queue").unwrap_or_default(),
                        attempt: text("attempt").unwrap_or_default(),
                        due_at_ms: text("due_at_ms").unwrap_or_default(),
                        trace: text("header:x-trace"),
                    }
                })
                .collect()
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Message>> + Send>>
    };
    deliver_three(
        &s,
        json!({"type": "redis_stream", "connection": "main", "stream": "belfry-{queue}"}),
        read,
    )
    .await;
    s.handle.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_jetstream_delivery_end_to_end() {
    let nats = NatsServer::start().await;
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: "EVENTS".to_owned(),
            subjects: vec!["events.>".to_owned()],
            ..Default::default()
        })
        .await
        .expect("create the stream");
    let connections = Connections::empty().with(
        "main",
        ConnectionSpec::url(ConnectionKind::Nats, nats.url()),
    );
    let s = start(connections).await;
    let jetstream = nats.jetstream().await;
    let read = move || {
        let jetstream = jetstream.clone();
        Box::pin(async move {
            let Ok(mut stream) = jetstream.get_stream("EVENTS").await else {
                return Vec::new();
            };
            let Ok(info) = stream.info().await else {
                return Vec::new();
            };
            let mut out = Vec::new();
            if info.state.messages == 0 {
                return out;
            }
            for sequence in info.state.first_sequence..=info.state.last_sequence {
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
                let received = from_headers(message.payload.to_vec(), &headers);
                // The broker de-duplicates redeliveries on Nats-Msg-Id: the task id.
                assert_eq!(
                    header(&headers, "Nats-Msg-Id"),
                    Some(received.task_id.as_str())
                );
                out.push(received);
            }
            out
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Message>> + Send>>
    };
    deliver_three(
        &s,
        json!({"type": "nats", "connection": "main", "subject": "events.orders"}),
        read,
    )
    .await;
    s.handle.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_delivery_end_to_end() {
    let kafka = KafkaServer::start().await;
    kafka.create_topic("events", 1).await;
    let connections = Connections::empty().with("main", ConnectionSpec::kafka([kafka.broker()]));
    let s = start(connections).await;
    let client = Arc::new(kafka.client().await);
    let read = move || {
        let client = client.clone();
        Box::pin(async move {
            let Ok(partition) = client
                .partition_client(
                    "events",
                    0,
                    rskafka::client::partition::UnknownTopicHandling::Retry,
                )
                .await
            else {
                return Vec::new();
            };
            let Ok((records, _)) = partition.fetch_records(0, 1..10_000_000, 200).await else {
                return Vec::new();
            };
            records
                .iter()
                .map(|record| {
                    let headers: Vec<(String, String)> = record
                        .record
                        .headers
                        .iter()
                        .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                        .collect();
                    let received =
                        from_headers(record.record.value.clone().unwrap_or_default(), &headers);
                    // Keyed by task id, as the delivery asked.
                    assert_eq!(
                        record.record.key.as_deref(),
                        Some(received.task_id.as_bytes())
                    );
                    received
                })
                .collect()
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Message>> + Send>>
    };
    deliver_three(
        &s,
        json!({"type": "kafka", "connection": "main", "topic": "events", "key": "task_id"}),
        read,
    )
    .await;
    s.handle.stop().await.expect("clean stop");
}

#[tokio::test]
async fn bad_stream_deliveries_are_refused_naming_the_field() {
    // Declared but never reached: creating a queue never connects.
    let connections = Connections::empty()
        .with(
            "main",
            ConnectionSpec::url(ConnectionKind::Redis, "redis://127.0.0.1:9/0"),
        )
        .with("bus", ConnectionSpec::kafka(["127.0.0.1:9"]))
        .with(
            "events",
            ConnectionSpec::url(ConnectionKind::Nats, "nats://127.0.0.1:9"),
        );
    let s = start(connections).await;
    let nats = |subject: &str| json!({"type": "nats", "connection": "events", "subject": subject});
    let cases = [
        (
            json!({"type": "carrier_pigeon"}),
            "invalid_request",
            "carrier_pigeon",
        ),
        (
            json!({"type": "redis_stream", "connection": "nope", "stream": "s"}),
            "invalid_delivery",
            "delivery.connection",
        ),
        (
            json!({"type": "nats", "connection": "main", "subject": "s"}),
            "invalid_delivery",
            "delivery.connection",
        ),
        (
            json!({"type": "kafka", "connection": "bus", "topic": ""}),
            "invalid_delivery",
            "delivery.topic",
        ),
        // Missing, ill-typed and unknown fields are refused like the other bad stream
        // deliveries, naming the field once.
        (
            json!({"type": "redis_stream", "connection": "main"}),
            "invalid_delivery",
            "delivery: missing field `stream`",
        ),
        (
            json!({"type": "nats", "connection": "events"}),
            "invalid_delivery",
            "delivery: missing field `subject`",
        ),
        (
            json!({"type": "kafka", "topic": "t"}),
            "invalid_delivery",
            "delivery: missing field `connection`",
        ),
        (
            json!({"type": "redis_stream", "connection": "main", "stream": "s", "maxlen": -5}),
            "invalid_delivery",
            "delivery.maxlen: invalid value: integer `-5`",
        ),
        (
            json!({"type": "nats", "connection": "events", "subject": "s", "timeout_ms": 1.5}),
            "invalid_delivery",
            "delivery.timeout_ms: invalid type: floating point `1.5`",
        ),
        (
            json!({"type": "kafka", "connection": "bus", "topic": "t", "partition": 1}),
            "invalid_delivery",
            "delivery.partition: unknown field `partition`",
        ),
        // Subjects the NATS server owns: a task there is a request to the server (this one
        // would delete stream X), not a message.
        (
            nats("$JS.API.STREAM.DELETE.X"),
            "invalid_delivery",
            "delivery.subject: \"$JS.API.STREAM.DELETE.X\" is in the \"$JS.\" namespace",
        ),
        (
            nats("$JS.ACK.S.C.1.1.1.1.0"),
            "invalid_delivery",
            "\"$JS.\"",
        ),
        (
            nats("$SYS.REQ.SERVER.PING"),
            "invalid_delivery",
            "\"$SYS.\"",
        ),
        (nats("_INBOX.abc"), "invalid_delivery", "\"_INBOX.\""),
        // Trimming to zero entries would drop every task as it is appended.
        (
            json!({"type": "redis_stream", "connection": "main", "stream": "s", "maxlen": 0}),
            "invalid_delivery",
            "delivery.maxlen: at least 1; leave it out for no trimming",
        ),
    ];
    for (delivery, code, hint) in cases {
        let (status, answer) = s
            .call(
                "PUT",
                "/v1/queues/q",
                json!({ "delivery": delivery.clone() }),
            )
            .await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some(code)),
            "{delivery}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(hint),
            "{delivery}: {message:?} should name {hint}"
        );
        assert!(!message.contains("delivery: delivery"), "{message:?}");
    }
    // An unreachable broker is reported, not refused.
    let created = s
        .queue(
            "later",
            json!({"delivery": {"type": "redis_stream", "connection": "main", "stream": "s"}}),
        )
        .await;
    let warnings = created["warnings"].to_string();
    assert!(warnings.contains("not reachable"), "{created}");
    // The stores' subjects stay open: key-value and object-store buckets are streams.
    for (name, subject) in [("kv", "$KV.bucket.key"), ("objects", "$O.bucket.C.x")] {
        let created = s.queue(name, json!({ "delivery": nats(subject) })).await;
        assert_eq!(created["delivery"]["subject"], subject, "{created}");
    }
    s.handle.stop().await.expect("clean stop");
}

/// A broker that refuses the connection for good (here Redis refusing the password) is not
/// "not reachable yet ... will be retried": the answer warns that tasks will be dead-lettered,
/// the health says refused, and it stays refused once a task was dead-lettered at its first
/// attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_warns_of_dead_letters() {
    let redis = RedisServer::start().await;
    let mut wrong_password = ConnectionSpec::url(ConnectionKind::Redis, redis.url());
    wrong_password.username = Some("nobody".into());
    wrong_password.password = Some("wrong".into());
    let s = start(Connections::empty().with("main", wrong_password)).await;
    let delivery = json!({"type": "redis_stream", "connection": "main", "stream": "s"});
    let created = s.queue("events", json!({ "delivery": delivery })).await;
    let warnings = created["warnings"].to_string();
    assert!(
        warnings.contains("refused the connection")
            && warnings.contains("dead-lettered at their first attempt")
            && !warnings.contains("will be retried"),
        "{created}"
    );
    let health = |q: &Value| q["delivery_health"].as_str().unwrap_or_default().to_owned();
    assert!(health(&created).starts_with("refused: "), "{created}");
    let id = s.submit("events", json!({"payload": 1})).await;
    s.advance(1);
    let dead = eventually("the task dead-lettered", || async {
        let task = s.task("events", &id).await;
        (task["state"] == "dead").then_some(task)
    })
    .await;
    assert_eq!(dead["attempts"], 1, "{dead}");
    let q = s.ok("GET", "/v1/queues/events", Value::Null, 200).await;
    assert!(health(&q).starts_with("refused: "), "{q}");
    s.handle.stop().await.expect("clean stop");
}

/// A stream delivery takes no secret (its connection's credentials live in the server's
/// config), so its queue shows no `secret_set`, which would read as "no secret" where there
/// is nothing to set; a webhook's says whether it has one.
#[tokio::test]
async fn only_webhook_deliveries_show_secret_set() {
    // Declared but never reached: creating a queue never connects.
    let connections = Connections::empty()
        .with(
            "main",
            ConnectionSpec::url(ConnectionKind::Redis, "redis://127.0.0.1:9/0"),
        )
        .with(
            "events",
            ConnectionSpec::url(ConnectionKind::Nats, "nats://127.0.0.1:9"),
        )
        .with("bus", ConnectionSpec::kafka(["127.0.0.1:9"]));
    let s = start(connections).await;
    let streams = [
        (
            "rs",
            json!({"type": "redis_stream", "connection": "main", "stream": "s"}),
        ),
        (
            "n",
            json!({"type": "nats", "connection": "events", "subject": "s"}),
        ),
        (
            "k",
            json!({"type": "kafka", "connection": "bus", "topic": "t"}),
        ),
    ];
    for (name, delivery) in streams {
        let created = s.queue(name, json!({ "delivery": delivery })).await;
        let (_, got) = s
            .call("GET", &format!("/v1/queues/{name}"), Value::Null)
            .await;
        for shown in [&created, &got] {
            assert_eq!(shown["delivery"]["type"], delivery["type"], "{shown}");
            assert!(
                shown["delivery"].get("secret_set").is_none(),
                "a {} delivery has no secret to be set: {shown}",
                delivery["type"]
            );
        }
    }
    let url = "http://127.0.0.1:9/hook";
    let plain = s
        .queue("w", json!({"delivery": {"type": "webhook", "url": url}}))
        .await;
    assert_eq!(plain["delivery"]["secret_set"], false, "{plain}");
    let signed = s
        .queue(
            "ws",
            json!({"delivery": {"type": "webhook", "url": url, "secret": "s3cret"}}),
        )
        .await;
    assert_eq!(signed["delivery"]["secret_set"], true, "{signed}");
    s.handle.stop().await.expect("clean stop");
}
