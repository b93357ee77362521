//! Reminders end to end through HTTP: subscribers (one at a time and in bulk), the fan-out
//! into the queue at the due time (driven by a manual clock), the user feed with its cache
//! headers, and bad input. One scenario list, run on the in-memory model and on the embedded engine.

mod common;

use std::collections::BTreeSet;

use common::{eventually, test_config, TestServer, T0};
use serde_json::{json, Value};

const MINUTE: u64 = 60_000;

async fn pull_queue(s: &TestServer) {
    s.queue("push", json!({})).await;
}

/// Leases every chunk due now and returns the users in them, in order.
async fn lease_users(s: &TestServer) -> Vec<String> {
    let tasks = s.lease("push", json!({"max": 1000, "wait_ms": 0})).await;
    tasks
        .iter()
        .flat_map(|t| {
            t["payload"]["users"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

async fn bulk(s: &TestServer, path: &str, body: &str) -> (u16, Value) {
    let response = s
        .http
        .post(format!("{}{}", s.base, path))
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Sends `chunks` as a chunked body over a raw connection; with `finish` false the body is
/// cut off (the connection's write half closes without the last chunk). Returns the status
/// and the JSON answer.
async fn post_chunked(s: &TestServer, path: &str, chunks: &[String], finish: bool) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(s.handle.local_addr())
        .await
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    for chunk in chunks {
        let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
        // The server may stop reading (and answer) before the end.
        if conn.write_all(framed.as_bytes()).await.is_err() {
            break;
        }
    }
    if finish {
        let _ = conn.write_all(b"0\r\n\r\n").await;
    }
    let _ = conn.shutdown().await;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn lifecycle(s: TestServer) {
    pull_queue(&s).await;
    let created = s
        .ok(
            "POST",
            "/v1/reminders",
            json!({"id": "kickoff", "queue": "push", "delay_ms": MINUTE,
                   "content": {"title": "Kick-off"}, "chunk_size": 2}),
            201,
        )
        .await;
    assert_eq!(created["next_fire_ms"], T0 + MINUTE);
    assert_eq!(created["priority"], "normal");

    let (status, _) = s
        .call("PUT", "/v1/reminders/kickoff/subscribers/u1", Value::Null)
        .await;
    assert_eq!(status, 201);
    let (status, again) = s
        .call("PUT", "/v1/reminders/kickoff/subscribers/u1", Value::Null)
        .await;
    assert_eq!(
        (status, &again["new"]),
        (200, &json!(false)),
        "subscribing twice is once"
    );

    let (status, answer) = bulk(
        &s,
        "/v1/reminders/kickoff/subscribers",
        "u2\n\"u3\"\n\n7\nu1\n\"\"\nu4\n",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["changed"], 4);
    assert_eq!(answer["unchanged"], 1);
    assert_eq!(answer["refused"], 1);
    assert_eq!(answer["errors"][0]["line"], 6);
    assert_eq!(answer["complete"], true);
    let count = s
        .ok(
            "GET",
            "/v1/reminders/kickoff/subscribers/count",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(count["subscribers"], 5);
    let page = s
        .ok(
            "GET",
            "/v1/reminders/kickoff/subscribers?limit=3",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(page["users"], json!(["7", "u1", "u2"]));
    let rest = s
        .ok(
            "GET",
            &format!(
                "/v1/reminders/kickoff/subscribers?limit=3&after={}",
                page["next_after"].as_str().unwrap()
            ),
            Value::Null,
            200,
        )
        .await;
    assert_eq!(rest["users"], json!(["u3", "u4"]));
    assert!(rest.get("next_after").is_none());

    // The feed, with its cache headers; a PATCH shows at once.
    let feed = s
        .http
        .get(format!("{}/v1/users/u1/reminders", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status(), 200);
    let etag = feed.headers()["etag"].to_str().unwrap().to_owned();
    assert!(feed.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("max-age="));
    let body: Value = feed.json().await.unwrap();
    assert_eq!(body["reminders"][0]["id"], "kickoff");
    assert_eq!(body["reminders"][0]["content"]["title"], "Kick-off");
    let same = s
        .http
        .get(format!("{}/v1/users/u1/reminders", s.base))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(same.status(), 304);
    let any = s
        .http
        .get(format!("{}/v1/users/u1/reminders", s.base))
        .header("if-none-match", "*")
        .send()
        .await
        .unwrap();
    assert_eq!(any.status(), 304, "* matches any current answer");
    let patch = |body: Value| s.ok("PATCH", "/v1/reminders/kickoff", body, 200);
    patch(json!({"content": {"title": "Kick-off!"}})).await;
    let changed = s
        .http
        .get(format!("{}/v1/users/u1/reminders", s.base))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(
        changed.status(),
        200,
        "the PATCH invalidated the cached content"
    );
    let body: Value = changed.json().await.unwrap();
    assert_eq!(body["reminders"][0]["content"]["title"], "Kick-off!");
    // A PATCH without content keeps it; `null` is a content like any other.
    let kept = patch(json!({"priority": "normal"})).await;
    assert_eq!(kept["content"]["title"], "Kick-off!", "{kept}");
    let nulled = patch(json!({"content": null})).await;
    assert_eq!(nulled["content"], Value::Null, "{nulled}");
    patch(json!({"content": {"title": "Kick-off!"}})).await;

    // Unsubscribed before the fan-out: not in any chunk.
    let (status, _) = s
        .call(
            "DELETE",
            "/v1/reminders/kickoff/subscribers/u4",
            Value::Null,
        )
        .await;
    assert_eq!(status, 204);
    let (status, e) = s
        .call(
            "DELETE",
            "/v1/reminders/kickoff/subscribers/u4",
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("user_not_found"))
    );

    // Nothing before the time; then the chunks, once.
    assert!(lease_users(&s).await.is_empty());
    s.advance(MINUTE);
    let users = eventually("the fan-out's chunks", || async {
        let users = lease_users(&s).await;
        (!users.is_empty()).then_some(users)
    })
    .await;
    let mut all = users;
    s.advance(10);
    all.extend(lease_users(&s).await);
    assert_eq!(all, vec!["7", "u1", "u2", "u3"]);

    let fired = s.ok("GET", "/v1/reminders/kickoff", Value::Null, 200).await;
    assert_eq!(fired["next_fire_ms"], Value::Null);
    assert_eq!(fired["firings"], 1);
    let (status, e) = s
        .call("PUT", "/v1/reminders/kickoff/subscribers/u9", Value::Null)
        .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("reminder_fired"))
    );
    eventually("the feed drops the fired reminder", || async {
        let feed = s
            .ok("GET", "/v1/users/u1/reminders", Value::Null, 200)
            .await;
        feed["reminders"]
            .as_array()
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;

    let (status, _) = s.call("DELETE", "/v1/reminders/kickoff", Value::Null).await;
    assert_eq!(status, 204);
    let (status, e) = s.call("GET", "/v1/reminders/kickoff", Value::Null).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("reminder_not_found"))
    );
}

async fn feed_order(s: TestServer) {
    pull_queue(&s).await;
    for (id, delay, priority) in [
        ("a", 3, "normal"),
        ("b", 1, "normal"),
        ("c", 5, "urgent"),
        ("far", 100_000, "urgent"),
    ] {
        s.ok(
            "POST",
            "/v1/reminders",
            json!({"id": id, "queue": "push", "delay_ms": delay * MINUTE, "priority": priority, "content": {"n": id}}),
            201,
        )
        .await;
        s.ok(
            "PUT",
            &format!("/v1/reminders/{id}/subscribers/42"),
            Value::Null,
            201,
        )
        .await;
    }
    let ids = |feed: &Value| -> Vec<String> {
        feed["reminders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let feed = s
        .ok("GET", "/v1/users/42/reminders", Value::Null, 200)
        .await;
    assert_eq!(
        ids(&feed),
        vec!["c", "b", "a"],
        "urgent first, then due order; within a day"
    );
    let feed = s
        .ok("GET", "/v1/users/42/reminders?limit=1", Value::Null, 200)
        .await;
    assert_eq!(ids(&feed), vec!["c"], "urgent reminders make the cut");
    let feed = s
        .ok(
            "GET",
            &format!("/v1/users/42/reminders?within_ms={}", 2 * MINUTE),
            Value::Null,
            200,
        )
        .await;
    assert_eq!(ids(&feed), vec!["b"]);
    let feed = s
        .ok("GET", "/v1/users/nobody/reminders", Value::Null, 200)
        .await;
    assert_eq!(ids(&feed), Vec::<String>::new());
}

async fn bad_input(s: TestServer) {
    pull_queue(&s).await;
    let code = |v: &Value| v["error"]["code"].as_str().unwrap_or_default().to_owned();
    let cases = [
        (
            json!({"queue": "push", "delay_ms": 1, "chunk_size": 0}),
            "invalid_reminder",
        ),
        (
            json!({"queue": "push", "delay_ms": 1, "chunk_size": 50_001}),
            "invalid_reminder",
        ),
        (
            json!({"queue": "push", "cron": "61 * * * *"}),
            "invalid_reminder",
        ),
        (
            json!({"queue": "push", "delay_ms": 1, "run_at_ms": 5}),
            "invalid_reminder",
        ),
        (json!({"queue": "push"}), "invalid_reminder"),
        // Refused by name, as a task's are, not as a JSON type error.
        (json!({"queue": "push", "delay_ms": -1}), "invalid_reminder"),
        (
            json!({"queue": "push", "run_at_ms": -5}),
            "invalid_reminder",
        ),
        (
            json!({"queue": "push", "delay_ms": 1, "users_per_second": 0}),
            "invalid_reminder",
        ),
        (json!({"queue": "nope", "delay_ms": 1}), "queue_not_found"),
        (
            json!({"id": "bad id", "queue": "push", "delay_ms": 1}),
            "invalid_reminder_id",
        ),
        (
            json!({"queue": "push", "delay_ms": 1, "colour": "red"}),
            "invalid_request",
        ),
        // Past the year 9999: it would never fire, yet read as fired.
        (
            json!({"queue": "push", "run_at_ms": i64::MAX}),
            "invalid_reminder",
        ),
    ];
    for (body, want) in cases {
        let (status, e) = s.call("POST", "/v1/reminders", body.clone()).await;
        assert!((400..500).contains(&status), "{body}: {status}");
        assert_eq!(code(&e), want, "{body}: {e}");
        assert!(!e["error"]["message"].as_str().unwrap().is_empty());
    }
    // A user id that is not UTF-8 once decoded is a bad user id, not a bad request.
    let (status, e) = s
        .call("PUT", "/v1/reminders/r/subscribers/%FF", Value::Null)
        .await;
    assert_eq!(
        (status, code(&e)),
        (400, "invalid_user_id".to_owned()),
        "{e}"
    );
    let (status, e) = s
        .raw("POST", "/v1/reminders", Some("{not json".into()))
        .await;
    assert_eq!((status, code(&e).as_str()), (400, "malformed_json"));
    let (status, e) = s.call("GET", "/v1/reminders/ghost", Value::Null).await;
    assert_eq!((status, code(&e).as_str()), (404, "reminder_not_found"));
    // A time zone alone cannot move a cron reminder: the message says what to send.
    let made = s
        .ok(
            "POST",
            "/v1/reminders",
            json!({"id": "tz", "queue": "push", "cron": "0 20 * * *", "timezone": "asia/tokyo"}),
            201,
        )
        .await;
    assert_eq!(made["timezone"], "Asia/Tokyo", "the database's spelling");
    let (status, e) = s
        .call(
            "PATCH",
            "/v1/reminders/tz",
            json!({"timezone": "Asia/Tokyo"}),
        )
        .await;
    assert_eq!((status, code(&e).as_str()), (400, "invalid_reminder"));
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("send both"),
        "{e}"
    );
    // A new cron alone keeps the reminder's zone ("20:00 Tokyo" to "21:00 Tokyo"); it went to
    // UTC, nine hours off.
    let patched = s
        .ok(
            "PATCH",
            "/v1/reminders/tz",
            json!({"cron": "0 21 * * *"}),
            200,
        )
        .await;
    assert_eq!(
        (&patched["cron"], &patched["timezone"]),
        (&json!("0 21 * * *"), &json!("Asia/Tokyo"))
    );
    let (status, e) = s
        .call("PUT", "/v1/reminders/ghost/subscribers/u1", Value::Null)
        .await;
    assert_eq!((status, code(&e).as_str()), (404, "reminder_not_found"));

    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "r", "queue": "push", "delay_ms": MINUTE}),
        201,
    )
    .await;
    let long = "x".repeat(129);
    let (status, e) = s
        .call(
            "PUT",
            &format!("/v1/reminders/r/subscribers/{long}"),
            Value::Null,
        )
        .await;
    assert_eq!((status, code(&e).as_str()), (400, "invalid_user_id"));
    let (status, e) = s
        .call("GET", "/v1/reminders/r/subscribers/nobody", Value::Null)
        .await;
    assert_eq!((status, code(&e).as_str()), (404, "user_not_found"));
    for query in [
        "within_ms=0",
        "within_ms=99999999999",
        "limit=0",
        "limit=1001",
        "colour=red",
    ] {
        let (status, e) = s
            .call(
                "GET",
                &format!("/v1/users/u1/reminders?{query}"),
                Value::Null,
            )
            .await;
        assert_eq!(
            (status, code(&e).as_str()),
            (400, "invalid_request"),
            "{query}"
        );
    }

    // A cut array: what came before the cut is kept, and the answer says where it stopped.
    let (status, answer) = bulk(
        &s,
        "/v1/reminders/r/subscribers",
        r#"["a","b",{"x":1},"c","d"#,
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "body_incomplete");
    assert_eq!(answer["complete"], false);
    assert_eq!(answer["stopped_at_line"], 5);
    assert_eq!(
        (answer["changed"].as_u64(), answer["refused"].as_u64()),
        (Some(3), Some(1))
    );
    let count = s
        .ok("GET", "/v1/reminders/r/subscribers/count", Value::Null, 200)
        .await;
    assert_eq!(count["subscribers"], 3);
    // A body broken off mid-stream (the client goes away): what was read is kept.
    let (status, answer) = post_chunked(
        &s,
        "/v1/reminders/r/subscribers",
        &["x1\nx2\n".into(), "x3\nx".into()],
        false,
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "body_incomplete");
    let count = s
        .ok("GET", "/v1/reminders/r/subscribers/count", Value::Null, 200)
        .await;
    assert_eq!(
        count["subscribers"], 6,
        "x1, x2 and x3 were read before the cut"
    );
    let (status, answer) = bulk(&s, "/v1/reminders/r/subscribers:delete", "[\"a\", \"zz\"]").await;
    assert_eq!(status, 200);
    assert_eq!(
        (answer["changed"].as_u64(), answer["unchanged"].as_u64()),
        (Some(1), Some(1))
    );
}

/// A bulk body over `limits.subscribers_body_max` is refused up front when it declares its
/// length, and stops at the limit when it does not; the ids before the limit stay.
#[tokio::test]
async fn a_bulk_body_over_the_limit_is_refused() {
    let mut config = test_config();
    config.subscribers_body_bytes_max = 1_000;
    let s = TestServer::start_with(config).await;
    pull_queue(&s).await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "r", "queue": "push", "delay_ms": MINUTE}),
        201,
    )
    .await;
    let big: String = (0..500).map(|i| format!("{i}\n")).collect();
    let (status, answer) = bulk(&s, "/v1/reminders/r/subscribers", &big).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "payload_too_large");
    let count = s
        .ok("GET", "/v1/reminders/r/subscribers/count", Value::Null, 200)
        .await;
    assert_eq!(
        count["subscribers"], 0,
        "a declared length over the limit reads nothing"
    );

    let chunks: Vec<String> = (0..50)
        .map(|k| (k * 20..k * 20 + 20).map(|i| format!("{i}\n")).collect())
        .collect();
    let (status, answer) = post_chunked(&s, "/v1/reminders/r/subscribers", &chunks, true).await;
    assert_eq!(status, 413);
    let applied = answer["changed"].as_u64().unwrap();
    assert!(applied > 0 && applied < 1_000, "{answer}");
    assert!(answer["stopped_at_line"].as_u64().unwrap() > applied);
    let count = s
        .ok("GET", "/v1/reminders/r/subscribers/count", Value::Null, 200)
        .await;
    assert_eq!(count["subscribers"], applied);

    // One chunk that crosses the limit: its lines wholly within the limit are applied, and
    // the answer stops at the line the limit cuts.
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "r2", "queue": "push", "delay_ms": MINUTE}),
        201,
    )
    .await;
    let one = vec![(0..1_000).map(|i| format!("{i}\n")).collect::<String>()];
    let (status, answer) = post_chunked(&s, "/v1/reminders/r2/subscribers", &one, false).await;
    assert_eq!(status, 413, "{answer}");
    // "0\n" to "99\n" take 290 bytes, then 4 a line: 177 more lines within 1,000 bytes.
    assert_eq!(answer["changed"], 277, "{answer}");
    assert_eq!(answer["stopped_at_line"], 278, "{answer}");
}

/// Bulk subscribe of many ids in one streamed body: every id arrives, in batches.
async fn bulk_many(s: TestServer) {
    pull_queue(&s).await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "big", "queue": "push", "delay_ms": MINUTE, "chunk_size": 5000}),
        201,
    )
    .await;
    let body: String = (0..25_000).map(|i| format!("{i}\n")).collect();
    let (status, answer) = bulk(&s, "/v1/reminders/big/subscribers", &body).await;
    assert_eq!(
        (status, answer["changed"].as_u64()),
        (200, Some(25_000)),
        "{answer}"
    );
    s.advance(MINUTE);
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + common::POLL_DEADLINE;
    while seen.len() < 25_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "got {} users",
            seen.len()
        );
        for user in lease_users(&s).await {
            assert!(seen.insert(user), "a user twice");
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// `GET /v1/reminders/{id}` shows a paced fan-out's progress by chunks, and `null` when none
/// is running; the list shows the same, and the subscriber count, for every reminder of a
/// page (the console draws its table from that one call).
async fn fanout_progress(s: TestServer) {
    pull_queue(&s).await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "slow", "queue": "push", "delay_ms": MINUTE, "chunk_size": 1, "users_per_second": 1}),
        201,
    )
    .await;
    bulk(&s, "/v1/reminders/slow/subscribers", "1\n2\n3\n4\n5\n").await;
    s.ok("GET", "/v1/users/1/reminders", Value::Null, 200).await;
    let before = s.ok("GET", "/v1/reminders/slow", Value::Null, 200).await;
    assert_eq!(before["fanout"], Value::Null);
    let listed = s
        .ok("GET", "/v1/reminders?limit=10", Value::Null, 200)
        .await;
    assert_eq!(listed["reminders"][0]["subscribers"], 5, "{listed}");
    assert_eq!(listed["reminders"][0]["fanout"], Value::Null, "{listed}");
    s.advance(MINUTE);
    // One user a second, made a second ahead: chunks 0 and 1 at the fire time.
    let progress = eventually("the fan-out's first chunks", || async {
        let r = s.ok("GET", "/v1/reminders/slow", Value::Null, 200).await;
        (r["fanout"]["chunk"] == 2).then_some(r)
    })
    .await;
    assert_eq!(progress["fanout"]["chunks"], 5);
    assert_eq!(progress["fanout"]["users"], 2);
    assert_eq!(progress["fanout"]["firing_ms"], T0 + MINUTE);
    let listed = s.ok("GET", "/v1/reminders", Value::Null, 200).await;
    let shown = &listed["reminders"][0];
    assert_eq!(shown["subscribers"], 5, "{listed}");
    assert_eq!(shown["fanout"]["chunks"], 5, "{listed}");
    assert_eq!(shown["fanout"]["firing_ms"], T0 + MINUTE, "{listed}");
    let metrics = s.metrics_text().await;
    for name in [
        "belfry_reminder_fanouts_running",
        "belfry_reminder_chunks_pending",
        "belfry_reminder_chunks_created_total",
        "belfry_reminder_subscribers",
        "belfry_feed_requests_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

/// A reminder whose queue was deleted says so in its `GET`, and its firing is dropped and
/// counted rather than failing every step.
async fn queue_deleted(s: TestServer) {
    s.queue("gone", json!({})).await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "orphan", "queue": "gone", "delay_ms": MINUTE}),
        201,
    )
    .await;
    bulk(&s, "/v1/reminders/orphan/subscribers", "1\n2\n").await;
    let before = s.ok("GET", "/v1/reminders/orphan", Value::Null, 200).await;
    assert!(before.get("queue_missing").is_none(), "{before}");
    s.ok("DELETE", "/v1/queues/gone", Value::Null, 204).await;
    let after = s.ok("GET", "/v1/reminders/orphan", Value::Null, 200).await;
    assert_eq!(after["queue_missing"], true, "{after}");
    s.advance(MINUTE);
    // Fired, and its fan-out over rather than stuck at its first chunk.
    eventually("the firing done with", || async {
        let r = s.ok("GET", "/v1/reminders/orphan", Value::Null, 200).await;
        (r["firings"] == 1 && r["fanout"] == Value::Null).then_some(())
    })
    .await;
    // Counted (the recorder is the process's: other tests may add to it, never take away),
    // once the step that wrote the firing has reported it, just after.
    eventually("the dropped fan-out counted", || async {
        let text = s.metrics_text().await;
        let dropped = text
            .lines()
            .find_map(|l| l.strip_prefix("belfry_reminder_fanouts_dropped_total "))
            .and_then(|v| v.parse::<f64>().ok());
        dropped.is_some_and(|n| n >= 1.0).then_some(())
    })
    .await;
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(TestServer::start().await).await; })*
        }
        mod engine {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(TestServer::start_engine().await).await; })*
        }
    };
}

on_both_stores!(
    lifecycle,
    feed_order,
    bad_input,
    bulk_many,
    fanout_progress,
    queue_deleted
);
