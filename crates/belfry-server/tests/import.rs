//! The streamed task import (`POST /v1/queues/{queue}/tasks:import`) against a real server on
//! loopback: every line stored, bad lines reported by number, duplicates counted, a cut body
//! and a refused batch answered with counts true to what was applied, the body limit.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use belfry_store::{MemoryStore, Store};
use common::faults::FaultyStore;
use common::{code, test_config, TestServer, T0};
use serde_json::{json, Value};

const IMPORT: &str = "/v1/queues/q/tasks:import";

async fn pull_queue(s: &TestServer) {
    s.queue("q", json!({})).await;
}

/// Posts `body` (with its Content-Length); returns the status, the answer, and its
/// `Retry-After`.
async fn import(s: &TestServer, body: impl Into<reqwest::Body>) -> (u16, Value, Option<String>) {
    let response = s
        .http
        .post(format!("{}{IMPORT}", s.base))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, response.json().await.unwrap(), retry_after)
}

/// Writes `head` (a request line and headers, without the blank line) and `parts` of a body
/// over a raw connection, then closes its write half: a body shorter than it declared, or a
/// chunked one without its last chunk, is cut off. Returns the status and the JSON answer.
async fn send_raw(s: &TestServer, head: &str, parts: &[String]) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(s.handle.local_addr())
        .await
        .unwrap();
    conn.write_all(format!("{head}\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    for part in parts {
        // The server may stop reading (and answer) before the end.
        if conn.write_all(part.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = conn.shutdown().await;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// `parts` as chunks of a chunked body, ended with its last chunk when `finish`.
fn chunked(parts: &[String], finish: bool) -> Vec<String> {
    let mut framed: Vec<String> = parts
        .iter()
        .map(|p| format!("{:x}\r\n{p}\r\n", p.len()))
        .collect();
    if finish {
        framed.push("0\r\n\r\n".into());
    }
    framed
}

async fn pending(s: &TestServer) -> u64 {
    let queue = s.ok("GET", "/v1/queues/q", Value::Null, 200).await;
    queue["pending"].as_u64().unwrap()
}

/// The (line, code) of each listed error.
fn errors(answer: &Value) -> Vec<(u64, String)> {
    answer["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let code = e["error"]["code"].as_str().unwrap().to_owned();
            (e["line"].as_u64().unwrap(), code)
        })
        .collect()
}

fn task_line(i: u64) -> String {
    // Due times alternate between the two forms a line may give.
    let due = if i % 2 == 0 {
        json!({"delay_ms": 1_000 + i})
    } else {
        json!({"run_at_ms": T0 + 5_000 + i})
    };
    let mut task = json!({"payload": {"n": i, "text": format!("task {i}")},
                          "idempotency_key": format!("k{i}")});
    task.as_object_mut()
        .unwrap()
        .extend(due.as_object().unwrap().clone());
    format!("{task}\n")
}

#[tokio::test]
async fn twenty_thousand_lines_are_each_stored_as_given() {
    const LINES: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let engine = belfry_store::Engine::open(dir.path(), belfry_store::EngineOptions::default())
        .expect("engine opens");
    let faulty = FaultyStore::new(Arc::new(engine));
    let s = TestServer::start_with_sinks(test_config(), faulty.clone(), None, None).await;
    pull_queue(&s).await;
    let body: String = (0..LINES).map(task_line).collect();
    let (status, answer, _) = import(&s, body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"created": LINES, "duplicates": 0, "refused": 0, "errors": [], "complete": true})
    );
    assert_eq!(pending(&s).await, LINES);
    // Submitted in batches of the batch submit's size, never more.
    let puts = faulty.puts.lock().clone();
    assert_eq!(puts.len(), 20, "{puts:?}");
    assert!(puts.iter().all(|&n| n == 1_000), "{puts:?}");
    for i in (0..LINES).step_by(997).chain([LINES - 1]) {
        let task = s
            .ok("GET", &format!("/v1/queues/q/keys/k{i}"), Value::Null, 200)
            .await;
        let due = if i % 2 == 0 {
            T0 + 1_000 + i
        } else {
            T0 + 5_000 + i
        };
        assert_eq!(task["due_at_ms"], due, "{task}");
        assert_eq!(
            task["payload"],
            json!({"n": i, "text": format!("task {i}")}),
            "{task}"
        );
    }
    drop(s);
    drop(dir);
}

/// Large payloads are submitted in smaller batches: a batch never holds more payload than a
/// single submit's body may (`limits.request_max`), whatever the count.
#[tokio::test]
async fn a_batch_of_large_payloads_is_cut_at_the_request_size() {
    let config = belfry_server::ServerConfig {
        request_bytes_max: 64 * 1024,
        payload_bytes_max: 16 * 1024,
        ..test_config()
    };
    let faulty = FaultyStore::new(Arc::new(MemoryStore::new()));
    let s = TestServer::start_with_sinks(config, faulty.clone(), None, None).await;
    pull_queue(&s).await;
    let text = "x".repeat(10_000);
    let body: String = (0..30)
        .map(|i| format!("{}\n", json!({"payload": {"i": i, "text": text}})))
        .collect();
    let (status, answer, _) = import(&s, body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["created"], 30, "{answer}");
    let puts = faulty.puts.lock().clone();
    // About 10 KB a payload: a batch is sent once it holds 64 KiB, so 7 tasks at most.
    assert!(puts.iter().all(|&n| n <= 7), "{puts:?}");
    assert_eq!(puts.iter().sum::<usize>(), 30, "{puts:?}");
}

#[tokio::test]
async fn bad_lines_are_reported_by_number_and_the_others_applied() {
    let s = TestServer::start().await;
    pull_queue(&s).await;
    // The test server takes payloads of 1 KiB and requests of 64 KiB: a line is bounded by
    // the request limit.
    let lines = [
        r#"{"payload": 1}"#.to_owned(),
        r#"{"payload": "#.to_owned(),
        r#"{"payload": 2, "delay": 5}"#.to_owned(),
        "  \t".to_owned(),
        format!(r#"{{"payload": "{}"}}"#, "x".repeat(2_000)),
        format!(r#"{{"payload": "{}"}}"#, "y".repeat(70_000)),
        "{\"payload\": 3, \"delay_ms\": 7}\r".to_owned(),
        r#"{"payload": 4, "delay_ms": -1}"#.to_owned(),
        r#"{"payload": 5}"#.to_owned(),
    ];
    // The last line has no newline: it is a line all the same.
    let body = lines.join("\n");
    let (status, answer, _) = import(&s, body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["created"], 3, "{answer}");
    assert_eq!(answer["refused"], 5, "{answer}");
    assert_eq!(answer["complete"], true, "{answer}");
    let expected: Vec<(u64, String)> = [
        (2, "malformed_json"),
        (3, "invalid_request"),
        (5, "payload_too_large"),
        (6, "payload_too_large"),
        (8, "invalid_due_time"),
    ]
    .iter()
    .map(|(l, c)| (*l, c.to_string()))
    .collect();
    assert_eq!(errors(&answer), expected, "{answer}");
    let long = &answer["errors"][3]["error"]["message"];
    assert!(long.as_str().unwrap().contains("65536 bytes"), "{long}");
    assert_eq!(pending(&s).await, 3);
    // The line ended by \r\n is read without its \r.
    let leased = s
        .lease("q", json!({"max": 10, "visibility_ms": 60_000}))
        .await;
    assert_eq!(leased.len(), 2, "only lines 1 and 9 are due now");
    s.advance(7);
    let leased = s
        .lease("q", json!({"max": 10, "visibility_ms": 60_000}))
        .await;
    assert_eq!(leased[0]["payload"], 3, "{leased:?}");
}

#[tokio::test]
async fn a_repeated_idempotency_key_is_a_duplicate_not_a_new_task() {
    let s = TestServer::start().await;
    pull_queue(&s).await;
    s.submit("q", json!({"payload": "first", "idempotency_key": "old"}))
        .await;
    let body = [
        r#"{"payload": "again", "idempotency_key": "old"}"#,
        r#"{"payload": "new", "idempotency_key": "new"}"#,
        r#"{"payload": "new twice", "idempotency_key": "new"}"#,
        r#"{"payload": "no key"}"#,
    ]
    .join("\n");
    let (status, answer, _) = import(&s, body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (
            &answer["created"],
            &answer["duplicates"],
            &answer["refused"]
        ),
        (&json!(2), &json!(2), &json!(0)),
        "{answer}"
    );
    let old = s.ok("GET", "/v1/queues/q/keys/old", Value::Null, 200).await;
    assert_eq!(old["payload"], "first");
    assert_eq!(pending(&s).await, 3);
}

#[tokio::test]
async fn a_body_cut_off_answers_what_was_applied_and_where_it_stopped() {
    let s = TestServer::start().await;
    pull_queue(&s).await;
    let whole: String = (0..3).map(task_line).collect();
    let half = &task_line(3)[..20];
    // A chunked body without its last chunk, cut in the middle of line 4.
    let parts = chunked(&[whole.clone(), half.to_owned()], false);
    let head = format!("POST {IMPORT} HTTP/1.1\r\ntransfer-encoding: chunked");
    let (status, answer) = send_raw(&s, &head, &parts).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(code(&answer), "body_incomplete", "{answer}");
    assert_eq!(answer["created"], 3, "{answer}");
    assert_eq!(answer["complete"], false, "{answer}");
    assert_eq!(answer["stopped_at_line"], 4, "{answer}");
    assert_eq!(pending(&s).await, 3);

    // A body shorter than its Content-Length, broken off right after line 2 of the next
    // import (k1 and k2 are known already: duplicates).
    let body: String = (1..5).map(task_line).collect();
    let sent: String = (1..3).map(task_line).collect();
    let head = format!("POST {IMPORT} HTTP/1.1\r\ncontent-length: {}", body.len());
    let (status, answer) = send_raw(&s, &head, &[sent]).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(code(&answer), "body_incomplete", "{answer}");
    assert_eq!(
        (&answer["created"], &answer["duplicates"]),
        (&json!(0), &json!(2)),
        "{answer}"
    );
    assert_eq!(answer["stopped_at_line"], 3, "{answer}");
    assert_eq!(pending(&s).await, 3);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_up_front_or_where_it_crosses() {
    let mut config = test_config();
    config.import_body_bytes_max = 1_000;
    let s = TestServer::start_with(config).await;
    pull_queue(&s).await;
    let big: String = (0..40).map(task_line).collect();
    assert!(big.len() > 1_000);
    let (status, answer, _) = import(&s, big.clone()).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(code(&answer), "payload_too_large", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limits.import_body_max"),
        "{answer}"
    );
    assert_eq!(
        pending(&s).await,
        0,
        "a declared length over the limit reads nothing"
    );

    // Without a declared length the lines wholly within the limit are applied.
    let parts: Vec<String> = (0..40).map(task_line).collect();
    let head = format!("POST {IMPORT} HTTP/1.1\r\ntransfer-encoding: chunked");
    let (status, answer) = send_raw(&s, &head, &chunked(&parts, true)).await;
    assert_eq!(status, 413, "{answer}");
    let applied = answer["created"].as_u64().unwrap();
    let within = parts
        .iter()
        .scan(0, |sum, p| {
            *sum += p.len();
            Some(*sum)
        })
        .take_while(|&sum| sum <= 1_000)
        .count() as u64;
    assert_eq!(applied, within, "{answer}");
    assert_eq!(answer["stopped_at_line"], within + 1, "{answer}");
    assert_eq!(pending(&s).await, applied);
}

#[tokio::test]
async fn a_batch_the_store_refuses_stops_the_import_at_its_first_line() {
    let faulty = FaultyStore::new(Arc::new(MemoryStore::new()) as Arc<dyn Store>);
    let s = TestServer::start_with_sinks(test_config(), faulty.clone(), None, None).await;
    pull_queue(&s).await;
    // The first put (of lines 1 to 1,001, line 10 refused) is stored, the second refused.
    faulty.puts_refused_from.store(1, Ordering::SeqCst);
    let body: String = (1..=2_500)
        .map(|line| match line {
            10 | 1_500 => "not a task\n".to_owned(),
            _ => task_line(line),
        })
        .collect();
    let (status, answer, retry_after) = import(&s, body).await;
    assert_eq!(status, 507, "{answer}");
    assert_eq!(code(&answer), "insufficient_storage", "{answer}");
    assert!(retry_after.is_some(), "a full disk says when to come back");
    assert_eq!(answer["created"], 1_000, "{answer}");
    assert_eq!(answer["refused"], 1, "line 1,500 is in the refused batch");
    assert_eq!(errors(&answer), vec![(10, "malformed_json".to_owned())]);
    assert_eq!(answer["complete"], false, "{answer}");
    assert_eq!(answer["stopped_at_line"], 1_002, "{answer}");
    assert_eq!(pending(&s).await, 1_000);
}

#[tokio::test]
async fn an_unknown_queue_is_refused_before_the_body_is_read() {
    let s = TestServer::start().await;
    let (status, answer, _) = import(&s, task_line(1)).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(code(&answer), "queue_not_found", "{answer}");
}

/// A body that stops arriving is answered as any slow request body is, `408
/// request_timeout`, with the counts of what came before it; a malformed line's error names
/// its column, not the parser's "line 1".
#[tokio::test]
async fn a_body_that_stalls_is_a_timeout_with_what_was_applied() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = belfry_server::ServerConfig {
        http_body_read_timeout_ms: 300,
        ..test_config()
    };
    let s = TestServer::start_with(config).await;
    pull_queue(&s).await;
    let mut conn = tokio::net::TcpStream::connect(s.handle.local_addr())
        .await
        .unwrap();
    let lines = format!("{}{{\"payload\": nope}}\n", task_line(0));
    let head = format!(
        "POST {IMPORT} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{lines}\r\n",
        lines.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // Nothing more is sent, and the write half stays open: the server's body timeout ends it.
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");
    assert_eq!(
        (body["created"].as_u64(), body["refused"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(body["stopped_at_line"], 3, "{body}");
    let message = body["errors"][0]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the line is not valid JSON") && !message.contains("line 1"),
        "{message}"
    );
    assert_eq!(pending(&s).await, 1);
}
