//! What `/metrics` counts, checked against a workload driven here. The recorder is one per
//! process, so each test uses queues of its own and reads only their series (and the feed
//! counter, which only one test here touches).

mod common;

use common::{eventually, test_config, TestServer, T0};
use serde_json::{json, Value};

/// The value of the sample `series` (name and labels exactly as rendered), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

async fn sample(s: &TestServer, series: &str) -> Option<f64> {
    value(&s.metrics_text().await, series)
}

/// A client may send any token as its method; the label takes only HTTP's methods, so
/// made-up ones cannot add series without bound.
#[tokio::test]
async fn made_up_methods_share_one_label() {
    let s = TestServer::start().await;
    for i in 0..5 {
        let (status, _) = s.raw(&format!("EVIL{i}"), "/v1/queues", None).await;
        assert_eq!(status, 405);
    }
    let text = s.metrics_text().await;
    assert!(
        !text.contains("EVIL"),
        "a made-up method became a label:\n{text}"
    );
    let other = "belfry_http_request_duration_seconds_count{method=\"other\",route=\"/v1/queues\",status=\"405\"}";
    assert!(
        value(&text, other).unwrap_or(0.0) >= 5.0,
        "{other} in:\n{text}"
    );
}

/// One outcome a feed request: a revalidation answered `304` is `not_modified`, not also `ok`.
#[tokio::test]
async fn a_feed_304_counts_once() {
    let s = TestServer::start().await;
    let ok = "belfry_feed_requests_total{outcome=\"ok\"}";
    let not_modified = "belfry_feed_requests_total{outcome=\"not_modified\"}";
    let before = (
        sample(&s, ok).await.unwrap_or(0.0),
        sample(&s, not_modified).await.unwrap_or(0.0),
    );
    let first = s
        .http
        .get(format!("{}/v1/users/u1/reminders", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    for _ in 0..3 {
        let again = s
            .http
            .get(format!("{}/v1/users/u1/reminders", s.base))
            .header("if-none-match", &etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304);
    }
    let after = (
        sample(&s, ok).await.unwrap_or(0.0),
        sample(&s, not_modified).await.unwrap_or(0.0),
    );
    assert_eq!((after.0 - before.0, after.1 - before.1), (1.0, 3.0));
}

/// A deleted queue's gauges go to 0 at the next refresh rather than keep their last values
/// (an alert on `belfry_tasks_due` or on the oldest due age would otherwise never clear).
#[tokio::test]
async fn a_deleted_queue_gauges_read_zero() {
    let s = TestServer::start_with(refreshed_often()).await;
    s.queue("gauged-gone", json!({})).await;
    for i in 0..3 {
        s.submit("gauged-gone", json!({"payload": i})).await;
    }
    assert_eq!(s.lease("gauged-gone", json!({"max": 1})).await.len(), 1);
    s.advance(3_000);
    let pending = "belfry_tasks_pending{queue=\"gauged-gone\"}";
    let in_flight = "belfry_tasks_in_flight{queue=\"gauged-gone\"}";
    let age = "belfry_queue_oldest_due_age_seconds{queue=\"gauged-gone\"}";
    let shown = |text: &str| {
        (
            value(text, pending),
            value(text, in_flight),
            value(text, age),
        )
    };
    eventually("the gauges show the queue", || async {
        let text = s.metrics_text().await;
        (shown(&text) == (Some(2.0), Some(1.0), Some(3.0))).then_some(())
    })
    .await;
    s.ok("DELETE", "/v1/queues/gauged-gone", Value::Null, 204)
        .await;
    eventually("the deleted queue's gauges read 0", || async {
        let text = s.metrics_text().await;
        (shown(&text) == (Some(0.0), Some(0.0), Some(0.0))).then_some(())
    })
    .await;
}

/// A server whose per-queue gauges are refreshed every 10 ms (of real time: the gauges read
/// the manual clock, which only the test moves).
fn refreshed_often() -> belfry_server::ServerConfig {
    let mut config = test_config();
    config.metrics_refresh_ms = 10;
    config
}

/// Waits until the gauge `series` reads `want`.
async fn gauge_reads(s: &TestServer, series: &str, want: f64) {
    eventually(&format!("{series} reads {want}"), || async {
        (sample(s, series).await == Some(want)).then_some(())
    })
    .await;
}

/// Queue lag shows while nothing is delivered (where the lateness histogram records
/// nothing): a paused queue's oldest due task ages with the clock, and the age is 0 again
/// once that task is delivered.
#[tokio::test]
async fn a_paused_queue_oldest_due_age_grows_until_delivered() {
    let s = TestServer::start_with(refreshed_often()).await;
    s.queue("lagging", json!({})).await;
    let age = "belfry_queue_oldest_due_age_seconds{queue=\"lagging\"}";
    gauge_reads(&s, age, 0.0).await;
    let id = s.submit("lagging", json!({"payload": 1})).await;
    s.ok("POST", "/v1/queues/lagging/pause", Value::Null, 200)
        .await;
    s.advance(5_000);
    gauge_reads(&s, age, 5.0).await;
    // A task due later does not make the queue look younger.
    s.submit("lagging", json!({"payload": 2, "delay_ms": 1_000}))
        .await;
    s.advance(10_000);
    gauge_reads(&s, age, 15.0).await;
    // The queue's GET names the oldest due time too.
    let queue = s.ok("GET", "/v1/queues/lagging", Value::Null, 200).await;
    let submitted_at = belfry_core::Clock::wall_ms(&s.clock) - 15_000;
    assert_eq!(queue["oldest_due_ms"], submitted_at, "{queue}");
    assert!(s.lease("lagging", json!({})).await.is_empty(), "paused");
    s.ok("POST", "/v1/queues/lagging/resume", Value::Null, 200)
        .await;
    let leased = s.lease("lagging", json!({"max": 2})).await;
    assert_eq!(leased.len(), 2);
    assert_eq!(leased[0]["id"], id.as_str());
    for task in &leased {
        let path = format!(
            "/v1/queues/lagging/tasks/{}/ack",
            task["id"].as_str().unwrap()
        );
        s.ok("POST", &path, json!({"lease_id": task["lease_id"]}), 200)
            .await;
    }
    gauge_reads(&s, age, 0.0).await;
    let queue = s.ok("GET", "/v1/queues/lagging", Value::Null, 200).await;
    assert!(queue.get("oldest_due_ms").is_none(), "nothing due: {queue}");
}

/// A lease that runs out (a consumer that crashed or overran its visibility timeout) is
/// counted once: not again by the claims, gauge refreshes, reads and late ack after it.
#[tokio::test]
async fn an_expired_lease_counts_once() {
    let s = TestServer::start_with(refreshed_often()).await;
    s.queue("expiring", json!({})).await;
    let id = s.submit("expiring", json!({"payload": 1})).await;
    let expired = "belfry_leases_expired_total{queue=\"expiring\"}";
    let first = s.lease("expiring", json!({"visibility_ms": 100})).await;
    assert_eq!(first.len(), 1);
    s.advance(50);
    assert!(s.lease("expiring", json!({})).await.is_empty());
    assert_eq!(sample(&s, expired).await, None, "nothing ran out yet");
    s.advance(1_000);
    // The gauge refresh ends the lease (it counts at the new time) before any claim.
    let due = "belfry_tasks_due{queue=\"expiring\"}";
    gauge_reads(&s, due, 1.0).await;
    s.task("expiring", &id).await;
    let (status, _) = s
        .call(
            "POST",
            &format!("/v1/queues/expiring/tasks/{id}/ack"),
            json!({"lease_id": first[0]["lease_id"]}),
        )
        .await;
    assert_eq!(status, 409, "the late ack is refused");
    let again = s.lease("expiring", json!({})).await;
    assert_eq!(again[0]["attempt"], 2);
    assert_eq!(sample(&s, expired).await, Some(1.0));
    assert!(s.lease("expiring", json!({})).await.is_empty());
    s.advance(1_000);
    gauge_reads(&s, due, 0.0).await;
    assert_eq!(sample(&s, expired).await, Some(1.0));
}

/// Tasks a schedule's firings and a reminder's fan-out store are submitted to their queue,
/// as tasks sent through the API are.
#[tokio::test]
async fn schedule_and_reminder_tasks_count_as_submitted() {
    let s = TestServer::start().await;
    s.queue("by-schedule", json!({})).await;
    s.queue("by-reminder", json!({})).await;
    s.ok(
        "POST",
        "/v1/schedules",
        json!({"id": "metered", "queue": "by-schedule", "every_ms": 1000, "shard_count": 2,
               "start_at_ms": T0 + 1000}),
        201,
    )
    .await;
    s.ok(
        "POST",
        "/v1/reminders",
        json!({"id": "metered", "queue": "by-reminder", "delay_ms": 1000, "chunk_size": 2,
               "content": {}}),
        201,
    )
    .await;
    for user in ["a", "b", "c"] {
        s.ok(
            "PUT",
            &format!("/v1/reminders/metered/subscribers/{user}"),
            Value::Null,
            201,
        )
        .await;
    }
    s.advance(1000);
    let schedule = "belfry_tasks_submitted_total{queue=\"by-schedule\"}";
    let reminder = "belfry_tasks_submitted_total{queue=\"by-reminder\"}";
    eventually(
        "the firing's and the fan-out's tasks are counted",
        || async {
            let text = s.metrics_text().await;
            // One firing of two shards; three users in chunks of two.
            (value(&text, schedule) == Some(2.0) && value(&text, reminder) == Some(2.0))
                .then_some(())
        },
    )
    .await;
}

/// Lateness is measured for a task's first delivery: a lease that expired and was taken again
/// is a consumer's failure, not the scheduler's delay.
#[tokio::test]
async fn a_lease_taken_again_adds_no_lateness() {
    let s = TestServer::start().await;
    s.queue("late-again", json!({})).await;
    s.submit("late-again", json!({"payload": 1})).await;
    s.advance(4_000);
    assert_eq!(
        s.lease("late-again", json!({"visibility_ms": 100}))
            .await
            .len(),
        1
    );
    s.advance(60_000);
    let again = s.lease("late-again", json!({})).await;
    assert_eq!(again[0]["attempt"], 2);
    let text = s.metrics_text().await;
    let count = "belfry_firing_lateness_seconds_count{queue=\"late-again\"}";
    let sum = "belfry_firing_lateness_seconds_sum{queue=\"late-again\"}";
    assert_eq!(value(&text, count), Some(1.0), "in:\n{text}");
    assert_eq!(value(&text, sum), Some(4.0), "in:\n{text}");
}

/// Every metric on the page says what it counts (`# HELP`), so a Prometheus user needs no docs
/// to read it: a new metric without its line in `metric_help.rs` fails here.
#[tokio::test]
async fn every_metric_has_its_help() {
    let s = TestServer::start().await;
    s.queue("helped", json!({})).await;
    s.submit("helped", json!({"payload": 1})).await;
    s.lease("helped", json!({})).await;
    let text = s.metrics_text().await;
    let typed: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    assert!(typed.len() >= 20, "{text}");
    for name in typed {
        assert!(
            text.lines().any(|line| line
                .strip_prefix("# HELP ")
                .is_some_and(|rest| rest.split(' ').next() == Some(name))),
            "{name} has no # HELP"
        );
    }
}
