//! API fuzzing against a real server on loopback: every documented route gets bodies built
//! from the API's own field names with values of every JSON type, and raw mutations of them
//! (truncated, bytes flipped, garbage). Whatever comes in, the answer is a well-formed 2xx or
//! 4xx with the standard error body, never a 5xx, a hang or a dead server. Seeded by proptest:
//! a failure prints the case that reproduces it.

mod common;

use std::time::Duration;

use common::{documented_routes, TestServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

/// Field names the API knows, so generated bodies reach deep into validation rather than
/// stopping at "unknown field".
const FIELDS: &[&str] = &[
    "payload",
    "payload_base64",
    "delay_ms",
    "run_at",
    "run_at_ms",
    "headers",
    "priority",
    "idempotency_key",
    "late_policy",
    "late_after_ms",
    "late",
    "policy",
    "after_ms",
    "tasks",
    "max",
    "visibility_ms",
    "wait_ms",
    "lease_id",
    "id",
    "reason",
    "rate_per_s",
    "burst",
    "max_in_flight",
    "retry",
    "max_attempts",
    "backoff_initial_ms",
    "backoff_max_ms",
    "delivery",
    "type",
    "url",
    "secret",
    "timeout_ms",
    "connection",
    "stream",
    "subject",
    "topic",
    "key",
    "paused",
    "queue",
    "cron",
    "timezone",
    "every_ms",
    "shard_count",
    "misfire",
    "acks",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        // Small, edge and huge numbers; long-poll waits stay short whatever is drawn.
        prop_oneof![
            Just(-1i64),
            Just(0),
            Just(1),
            Just(7),
            Just(40),
            Just(i64::MAX),
            Just(1 << 53)
        ]
        .prop_map(Value::from),
        Just(json!(1.5)),
        Just(json!(f64::MAX)),
        prop_oneof![
            Just(""),
            Just("pull"),
            Just("webhook"),
            Just("kafka"),
            Just("high"),
            Just("skip"),
            Just("* * * * * *"),
            Just("2030-01-01T00:00:00Z"),
            Just("not a time"),
            Just("http://127.0.0.1:9/x"),
            Just("00000000000000000000000000000000"),
            Just("é\u{0}\r\n"),
        ]
        .prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..6).prop_map(|pairs| {
                Value::Object(
                    pairs
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

/// A body: generated JSON, or its text mutated.
fn json_text() -> impl Strategy<Value = Vec<u8>> {
    value().prop_map(|v| v.to_string().into_bytes())
}

fn body() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        Just(None),
        json_text().prop_map(Some),
        (json_text(), any::<prop::sample::Index>())
            .prop_map(|(text, at)| Some(text[..at.index(text.len() + 1)].to_vec())),
        (json_text(), any::<prop::sample::Index>(), any::<u8>()).prop_map(
            |(mut text, at, byte)| {
                if !text.is_empty() {
                    let i = at.index(text.len());
                    text[i] = byte;
                }
                Some(text)
            }
        ),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
    ]
}

/// A path parameter: a plausible one, or something hostile (percent-encoded).
fn param() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("q".to_owned()),
        Just("00000000000000000000000000000000".to_owned()),
        Just("%2F..%2F".to_owned()),
        Just("%00".to_owned()),
        Just("x".repeat(300)),
        "[a-z0-9_.-]{1,12}",
    ]
}

#[test]
fn no_request_gets_a_server_error() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(async {
        let s = TestServer::start().await;
        s.queue("q", json!({})).await;
        s
    });
    let routes = documented_routes();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let case = (prop::sample::select(routes), param(), param(), body());
    // (2xx, 4xx) answers seen: the run must have reached both, or it tested little.
    let seen = std::cell::Cell::new((0u32, 0u32));
    runner
        .run(&case, |((method, path), first, second, body)| {
            let concrete = path
                .replace("{queue}", &first)
                .replace("{schedule}", &first)
                .replace("{id}", &second)
                .replace("{key}", &second);
            let url = format!("{}{}", server.base, concrete);
            let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let (status, text) = runtime.block_on(async {
                let mut request = http.request(method, &url);
                if let Some(body) = body {
                    request = request
                        .header("content-type", "application/json")
                        .body(body);
                }
                let response = request.send().await.expect("the server answers");
                let status = response.status().as_u16();
                (status, response.text().await.unwrap_or_default())
            });
            prop_assert!(status < 500, "{path} as {concrete}: {status} {text}");
            let (ok, refused) = seen.get();
            seen.set(if status < 300 {
                (ok + 1, refused)
            } else {
                (ok, refused + 1)
            });
            if status >= 400 {
                let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                prop_assert!(
                    answer["error"]["code"].is_string() && answer["error"]["message"].is_string(),
                    "{concrete}: {status} without the error body: {text:?}"
                );
            }
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
    let (ok, refused) = seen.get();
    assert!(
        ok >= 10 && refused >= 100,
        "only {ok} accepted and {refused} refused requests: the generator misses the API"
    );
    // Still serving after all of it.
    runtime.block_on(async {
        let (status, _) = server.call("GET", "/healthz", Value::Null).await;
        assert_eq!(status, 200);
        server.handle.stop().await.expect("clean stop");
    });
}
