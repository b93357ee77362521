//! End-to-end tests of API v1 against a real server on a loopback port.

#[macro_use]
mod common;

use common::{code, TestServer, T0};
use serde_json::{json, Value};

both_stores!(queue_lifecycle);
async fn queue_lifecycle(s: TestServer) {
    let created = s
        .ok(
            "PUT",
            "/v1/queues/orders",
            json!({"rate_per_s": 10, "burst": 20, "max_in_flight": 3,
                   "retry": {"max_attempts": 4, "backoff_initial_ms": 10, "backoff_max_ms": 100}}),
            201,
        )
        .await;
    assert_eq!(created["name"], "orders");
    assert_eq!(created["burst"], 20);
    assert_eq!(created["retry"]["max_attempts"], 4);
    assert_eq!(created["delivery"]["type"], "pull");
    assert_eq!(created["pending"], 0);

    // An update changes what it names and keeps the rest.
    let updated = s
        .ok("PUT", "/v1/queues/orders", json!({"rate_per_s": 2}), 200)
        .await;
    assert_eq!(updated["rate_per_s"], 2.0);
    assert_eq!(updated["max_in_flight"], 3);

    s.submit("orders", json!({"payload": 1, "delay_ms": 1000}))
        .await;
    s.submit("orders", json!({"payload": 2})).await;
    let got = s.ok("GET", "/v1/queues/orders", Value::Null, 200).await;
    assert_eq!(
        (got["pending"].as_u64(), got["due"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(got["in_flight"], 0);
    assert_eq!(got["dead"], 0);

    s.queue("another", json!({})).await;
    let list = s.ok("GET", "/v1/queues", Value::Null, 200).await;
    let names: Vec<_> = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, vec!["another", "orders"]);

    let paused = s
        .ok("POST", "/v1/queues/orders/pause", Value::Null, 200)
        .await;
    assert_eq!(paused["paused"], true);
    let resumed = s
        .ok("POST", "/v1/queues/orders/resume", Value::Null, 200)
        .await;
    assert_eq!(resumed["paused"], false);

    let (status, body) = s.call("DELETE", "/v1/queues/orders", Value::Null).await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = s.call("GET", "/v1/queues/orders", Value::Null).await;
    assert_eq!((status, code(&body)), (404, "queue_not_found"));
    let (status, body) = s.call("DELETE", "/v1/queues/orders", Value::Null).await;
    assert_eq!((status, code(&body)), (404, "queue_not_found"));
    let (status, body) = s.call("POST", "/v1/queues/orders/pause", Value::Null).await;
    assert_eq!((status, code(&body)), (404, "queue_not_found"));
    // Pausing an unknown queue did not create it.
    let (status, _) = s.call("GET", "/v1/queues/orders", Value::Null).await;
    assert_eq!(status, 404);
}

both_stores!(tasks_submit_get_duplicate_cancel_reschedule);
async fn tasks_submit_get_duplicate_cancel_reschedule(s: TestServer) {
    s.queue("q", json!({})).await;
    let created = s
        .ok(
            "POST",
            "/v1/queues/q/tasks",
            json!({"payload": {"hello": [1, 2]}, "delay_ms": 5000, "headers": {"x-a": "1"},
                   "priority": "high", "idempotency_key": "k1"}),
            201,
        )
        .await;
    assert_eq!(created["state"], "scheduled");
    assert_eq!(created["queue"], "q");
    assert_eq!(created["due_at_ms"], T0 + 5000);
    let id = created["id"].as_str().unwrap();
    assert_eq!(id.len(), 32);

    let task = s.task("q", id).await;
    assert_eq!(task["state"], "scheduled");
    assert_eq!(task["attempts"], 0);
    assert_eq!(task["payload"], json!({"hello": [1, 2]}));
    assert_eq!(task["headers"], json!({"x-a": "1"}));
    assert_eq!(task["priority"], "high");

    // The same idempotency key returns the existing task with 200.
    let dup = s
        .ok(
            "POST",
            "/v1/queues/q/tasks",
            json!({"payload": "other", "idempotency_key": "k1"}),
            200,
        )
        .await;
    assert_eq!(dup["duplicate"], true);
    assert_eq!(dup["id"], id);
    assert_eq!(dup["payload"], json!({"hello": [1, 2]}));

    // run_at and run_at_ms.
    let at = s
        .ok(
            "POST",
            "/v1/queues/q/tasks",
            json!({"run_at": "2026-01-01T00:01:00Z"}),
            201,
        )
        .await;
    assert_eq!(at["due_at_ms"], T0 + 60_000);
    let at_ms = s
        .ok(
            "POST",
            "/v1/queues/q/tasks",
            json!({"run_at_ms": T0 + 7}),
            201,
        )
        .await;
    assert_eq!(at_ms["due_at_ms"], T0 + 7);

    // Binary payloads come back as base64.
    let bin = s.submit("q", json!({"payload_base64": "AAEC/w=="})).await;
    assert_eq!(s.task("q", &bin).await["payload_base64"], "AAEC/w==");

    // Reschedule atomically.
    let moved = s
        .ok(
            "PATCH",
            &format!("/v1/queues/q/tasks/{id}"),
            json!({"delay_ms": 100}),
            200,
        )
        .await;
    assert_eq!(moved["due_at_ms"], T0 + 100);
    let (status, body) = s
        .call("PATCH", &format!("/v1/queues/q/tasks/{id}"), json!({}))
        .await;
    assert_eq!((status, code(&body)), (400, "invalid_due_time"));

    // Cancel: 204, then 409 since it is no longer scheduled; 404 for an unknown id.
    let (status, _) = s
        .call("DELETE", &format!("/v1/queues/q/tasks/{id}"), Value::Null)
        .await;
    assert_eq!(status, 204);
    assert_eq!(s.task("q", id).await["state"], "cancelled");
    let (status, body) = s
        .call("DELETE", &format!("/v1/queues/q/tasks/{id}"), Value::Null)
        .await;
    assert_eq!((status, code(&body)), (409, "task_not_scheduled"));
    let unknown = "0000000000000000000000000000beef";
    let (status, body) = s
        .call(
            "DELETE",
            &format!("/v1/queues/q/tasks/{unknown}"),
            Value::Null,
        )
        .await;
    assert_eq!((status, code(&body)), (404, "task_not_found"));
    let (status, body) = s
        .call("GET", &format!("/v1/queues/q/tasks/{unknown}"), Value::Null)
        .await;
    assert_eq!((status, code(&body)), (404, "task_not_found"));

    // A delivered task cannot be cancelled.
    let now = s.submit("q", json!({"payload": 1})).await;
    let leased = s.lease("q", json!({"max": 10})).await;
    let mine = leased.iter().find(|t| t["id"] == now.as_str()).unwrap();
    s.ok(
        "POST",
        &format!("/v1/queues/q/tasks/{now}/ack"),
        json!({"lease_id": mine["lease_id"]}),
        200,
    )
    .await;
    let (status, body) = s
        .call("DELETE", &format!("/v1/queues/q/tasks/{now}"), Value::Null)
        .await;
    assert_eq!((status, code(&body)), (409, "task_not_scheduled"));
}

both_stores!(get_cancel_and_reschedule_by_idempotency_key);
async fn get_cancel_and_reschedule_by_idempotency_key(s: TestServer) {
    s.queue("orders", json!({})).await;
    let key = "close-order/42";
    let path = "/v1/queues/orders/keys/close-order%2F42";
    let id = s
        .submit(
            "orders",
            json!({"payload": 1, "delay_ms": 60_000, "idempotency_key": key}),
        )
        .await;
    let other = s
        .submit(
            "orders",
            json!({"payload": 2, "delay_ms": 60_000, "idempotency_key": "k2"}),
        )
        .await;
    let got = s.ok("GET", path, Value::Null, 200).await;
    assert_eq!(got["id"], id.as_str());
    assert_eq!(got["idempotency_key"], key);
    // Reschedule by key: the keyed task moves, the other does not.
    let moved = s.ok("PATCH", path, json!({"delay_ms": 600_000}), 200).await;
    assert_eq!(moved["id"], id.as_str());
    assert_eq!(moved["due_at_ms"], T0 + 600_000);
    assert_eq!(s.task("orders", &other).await["due_at_ms"], T0 + 60_000);
    // Cancel by key.
    let (status, _) = s.call("DELETE", path, Value::Null).await;
    assert_eq!(status, 204);
    assert_eq!(s.task("orders", &id).await["state"], "cancelled");
    // An unknown key, an unknown queue, an oversized key: stable codes.
    let (status, body) = s
        .call("GET", "/v1/queues/orders/keys/nobody", Value::Null)
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("task_not_found"))
    );
    let (status, body) = s.call("GET", "/v1/queues/nope/keys/k2", Value::Null).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("queue_not_found"))
    );
    let long = "k".repeat(300);
    let (status, body) = s
        .call(
            "GET",
            &format!("/v1/queues/orders/keys/{long}"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
}

both_stores!(batch_submit_reports_each_task);
async fn batch_submit_reports_each_task(s: TestServer) {
    s.queue("q", json!({})).await;
    let body = s
        .ok(
            "POST",
            "/v1/queues/q/tasks:batch",
            json!({"tasks": [
                {"payload": 1},
                {"delay_ms": -5},
                {"payload": 3, "idempotency_key": "same"},
                {"payload": 4, "idempotency_key": "same"},
                {"delay_ms": "soon"},
            ]}),
            200,
        )
        .await;
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0]["state"], "scheduled");
    assert_eq!(code(&results[1]), "invalid_due_time");
    assert_eq!(results[2]["state"], "scheduled");
    assert_eq!(results[3]["duplicate"], true);
    assert_eq!(results[3]["id"], results[2]["id"]);
    assert_eq!(code(&results[4]), "invalid_request");
    let q = s.ok("GET", "/v1/queues/q", Value::Null, 200).await;
    assert_eq!(q["pending"], 2);

    let too_many: Vec<Value> = (0..1001).map(|_| json!({})).collect();
    let (status, body) = s
        .call(
            "POST",
            "/v1/queues/q/tasks:batch",
            json!({ "tasks": too_many }),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "batch_too_large"));
    let (status, body) = s
        .call("POST", "/v1/queues/nope/tasks:batch", json!({"tasks": []}))
        .await;
    assert_eq!((status, code(&body)), (404, "queue_not_found"));
}

both_stores!(lease_never_returns_a_task_before_it_is_due);
async fn lease_never_returns_a_task_before_it_is_due(s: TestServer) {
    s.queue("q", json!({})).await;
    let id = s.submit("q", json!({"payload": 1, "delay_ms": 5000})).await;
    assert!(s.lease("q", json!({"max": 10})).await.is_empty());
    s.advance(4999);
    assert!(s.lease("q", json!({"max": 10})).await.is_empty());
    // A long-poll parked before the task is due returns it once the clock gets there.
    let waiting = {
        let http = s.http.clone();
        let url = format!("{}/v1/queues/q/lease", s.base);
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"max": 10, "wait_ms": 30000}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    s.advance(1);
    let got = waiting.await.unwrap();
    let tasks = got["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{got}");
    assert_eq!(tasks[0]["id"], id.as_str());
    assert_eq!(tasks[0]["due_at_ms"], T0 + 5000);
    assert_eq!(tasks[0]["attempt"], 1);
    assert!(tasks[0]["lease_id"].is_string());
}

both_stores!(long_poll_wakes_on_submit_and_times_out_on_the_clock);
async fn long_poll_wakes_on_submit_and_times_out_on_the_clock(s: TestServer) {
    s.queue("q", json!({})).await;
    let poll = |wait_ms: u64| {
        let http = s.http.clone();
        let url = format!("{}/v1/queues/q/lease", s.base);
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"max": 5, "wait_ms": wait_ms}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let waiting = poll(30000);
    let id = s.submit("q", json!({"payload": "now"})).await;
    let got = waiting.await.unwrap();
    assert_eq!(got["tasks"][0]["id"], id.as_str());

    // With nothing to deliver, the poll ends when the (manual) clock passes wait_ms.
    let mut waiting = poll(1000);
    let got = loop {
        tokio::select! {
            got = &mut waiting => break got.unwrap(),
            _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => s.advance(1000),
        }
    };
    assert_eq!(got["tasks"], json!([]));
}

both_stores!(ack_nack_extend_and_lease_expiry);
async fn ack_nack_extend_and_lease_expiry(s: TestServer) {
    s.queue(
        "q",
        json!({"retry": {"max_attempts": 3, "backoff_initial_ms": 100, "backoff_max_ms": 1000}}),
    )
    .await;
    let id = s.submit("q", json!({"payload": 1})).await;
    let path = |op: &str| format!("/v1/queues/q/tasks/{id}/{op}");

    // Lease with a short visibility; it expires on the clock and the task is due again.
    let first = s.lease("q", json!({"visibility_ms": 100})).await;
    let lease1 = first[0]["lease_id"].clone();
    assert_eq!(s.task("q", &id).await["state"], "leased");
    s.advance(100);
    let (status, body) = s
        .call("POST", &path("ack"), json!({"lease_id": lease1}))
        .await;
    assert_eq!((status, code(&body)), (409, "lease_expired"));
    let second = s.lease("q", json!({"visibility_ms": 1000})).await;
    assert_eq!(second[0]["attempt"], 2);
    let lease2 = second[0]["lease_id"].clone();
    assert_ne!(lease1, lease2);

    // Extend moves the deadline; the old deadline passing does not end the lease.
    let extended = s
        .ok(
            "POST",
            &path("extend"),
            json!({"lease_id": lease2, "visibility_ms": 5000}),
            200,
        )
        .await;
    assert_eq!(extended["lease_until_ms"], s.clock_now() + 5000);
    s.advance(2000);
    // Nack with an explicit delay: due again later.
    let nacked = s
        .ok(
            "POST",
            &path("nack"),
            json!({"lease_id": lease2, "delay_ms": 300}),
            200,
        )
        .await;
    assert_eq!(nacked["state"], "scheduled");
    assert_eq!(nacked["due_at_ms"], s.clock_now() + 300);
    assert!(s.lease("q", json!({})).await.is_empty());
    s.advance(300);
    let third = s.lease("q", json!({})).await;
    assert_eq!(third[0]["attempt"], 3);
    // The last attempt nacked: a dead letter.
    let dead = s
        .ok(
            "POST",
            &path("nack"),
            json!({"lease_id": third[0]["lease_id"]}),
            200,
        )
        .await;
    assert_eq!(dead["state"], "dead");
    let task = s.task("q", &id).await;
    assert_eq!(task["state"], "dead");

    // Dead letters: list, redrive (once), 409 when not dead.
    let page = s.ok("GET", "/v1/queues/q/dead", Value::Null, 200).await;
    assert_eq!(page["tasks"][0]["id"], id.as_str());
    assert!(page["tasks"][0]["dead_reason"].is_string());
    assert_eq!(page["tasks"][0]["payload"], 1, "{page}");
    // Without payloads (the console's list of ids and reasons): everything else is there.
    let bare = s
        .ok("GET", "/v1/queues/q/dead?payload=false", Value::Null, 200)
        .await;
    let mut without = page["tasks"][0].clone();
    without.as_object_mut().unwrap().remove("payload");
    assert_eq!(bare["tasks"][0], without);
    let (status, body) = s
        .call("GET", "/v1/queues/q/dead?payload=no", Value::Null)
        .await;
    assert_eq!((status, code(&body)), (400, "invalid_request"), "{body}");
    let redriven = s
        .ok(
            "POST",
            &format!("/v1/queues/q/dead/{id}/redrive"),
            Value::Null,
            200,
        )
        .await;
    assert_eq!(redriven["state"], "scheduled");
    assert_eq!(redriven["attempts"], 0);
    let (status, body) = s
        .call(
            "POST",
            &format!("/v1/queues/q/dead/{id}/redrive"),
            Value::Null,
        )
        .await;
    assert_eq!((status, code(&body)), (409, "task_not_dead"));
    let fourth = s.lease("q", json!({})).await;
    let acked = s
        .ok(
            "POST",
            &path("ack"),
            json!({"lease_id": fourth[0]["lease_id"]}),
            200,
        )
        .await;
    assert_eq!(acked["state"], "done");
    assert_eq!(s.task("q", &id).await["state"], "done");
    let (status, body) = s
        .call(
            "POST",
            &path("ack"),
            json!({"lease_id": fourth[0]["lease_id"]}),
        )
        .await;
    assert_eq!((status, code(&body)), (409, "lease_expired"));
}

both_stores!(batch_ack_reports_each_ack);
async fn batch_ack_reports_each_ack(s: TestServer) {
    s.queue("q", json!({})).await;
    for i in 0..3 {
        s.submit("q", json!({ "payload": i })).await;
    }
    let leased = s.lease("q", json!({"max": 10})).await;
    assert_eq!(leased.len(), 3);
    let mut acks: Vec<Value> = leased
        .iter()
        .map(|t| json!({"id": t["id"], "lease_id": t["lease_id"]}))
        .collect();
    acks.push(json!({"id": leased[0]["id"], "lease_id": leased[0]["lease_id"]}));
    acks.push(json!({"id": "nope", "lease_id": "1"}));
    let body = s
        .ok("POST", "/v1/queues/q/ack", json!({ "acks": acks }), 200)
        .await;
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    for r in &results[..3] {
        assert_eq!(r["ok"], true, "{r}");
    }
    assert_eq!(code(&results[3]), "lease_expired");
    assert_eq!(code(&results[4]), "invalid_task_id");
    let q = s.ok("GET", "/v1/queues/q", Value::Null, 200).await;
    assert_eq!(
        (q["pending"].as_u64(), q["in_flight"].as_u64()),
        (Some(0), Some(0))
    );
}

both_stores!(rate_limit_is_observable);
async fn rate_limit_is_observable(s: TestServer) {
    s.queue("q", json!({"rate_per_s": 5, "burst": 5})).await;
    let tasks: Vec<Value> = (0..20).map(|i| json!({ "payload": i })).collect();
    s.ok(
        "POST",
        "/v1/queues/q/tasks:batch",
        json!({ "tasks": tasks }),
        200,
    )
    .await;
    assert_eq!(s.lease("q", json!({"max": 100})).await.len(), 5);
    assert_eq!(s.lease("q", json!({"max": 100})).await.len(), 0);
    s.advance(200);
    assert_eq!(s.lease("q", json!({"max": 100})).await.len(), 1);
    s.advance(1000);
    assert_eq!(s.lease("q", json!({"max": 100})).await.len(), 5);
    s.advance(60_000);
    assert_eq!(
        s.lease("q", json!({"max": 100})).await.len(),
        5,
        "burst caps the refill"
    );
}

both_stores!(max_in_flight_is_observable);
async fn max_in_flight_is_observable(s: TestServer) {
    s.queue("q", json!({"max_in_flight": 2})).await;
    for i in 0..5 {
        s.submit("q", json!({ "payload": i })).await;
    }
    let leased = s
        .lease("q", json!({"max": 10, "visibility_ms": 1000}))
        .await;
    assert_eq!(leased.len(), 2);
    assert!(s.lease("q", json!({"max": 10})).await.is_empty());
    let id = leased[0]["id"].as_str().unwrap();
    s.ok(
        "POST",
        &format!("/v1/queues/q/tasks/{id}/ack"),
        json!({"lease_id": leased[0]["lease_id"]}),
        200,
    )
    .await;
    assert_eq!(
        s.lease("q", json!({"max": 10, "visibility_ms": 1000}))
            .await
            .len(),
        1
    );
    // Expired leases free their slot too.
    s.advance(1000);
    assert_eq!(s.lease("q", json!({"max": 10})).await.len(), 2);
}

both_stores!(high_priority_overtakes_normal);
async fn high_priority_overtakes_normal(s: TestServer) {
    s.queue("q", json!({})).await;
    for i in 0..3 {
        s.submit("q", json!({ "payload": i })).await;
    }
    let urgent = s
        .submit("q", json!({"payload": "urgent", "priority": "high"}))
        .await;
    let first = s.lease("q", json!({"max": 1})).await;
    assert_eq!(first[0]["id"], urgent.as_str());
    assert_eq!(first[0]["priority"], "high");
    let rest = s.lease("q", json!({"max": 10})).await;
    let payloads: Vec<_> = rest.iter().map(|t| t["payload"].clone()).collect();
    assert_eq!(
        payloads,
        vec![json!(0), json!(1), json!(2)],
        "then due order"
    );
}

both_stores!(paused_queue_accepts_but_delivers_nothing);
async fn paused_queue_accepts_but_delivers_nothing(s: TestServer) {
    s.queue("q", json!({"paused": true})).await;
    let id = s.submit("q", json!({"payload": 1})).await;
    assert!(s.lease("q", json!({"max": 10})).await.is_empty());
    // A long-poll parked on a paused queue is woken by resume.
    let waiting = {
        let http = s.http.clone();
        let url = format!("{}/v1/queues/q/lease", s.base);
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"wait_ms": 30000}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    s.ok("POST", "/v1/queues/q/resume", Value::Null, 200).await;
    let got = waiting.await.unwrap();
    assert_eq!(got["tasks"][0]["id"], id.as_str());
}

#[tokio::test]
async fn metrics_and_health_endpoints() {
    let s = TestServer::start().await;
    s.queue("metered", json!({})).await;
    s.submit("metered", json!({"payload": 1})).await;
    let leased = s.lease("metered", json!({})).await;
    assert_eq!(leased.len(), 1);
    s.ok("GET", "/healthz", Value::Null, 200).await;
    s.ok("GET", "/readyz", Value::Null, 200).await;
    let text = s.metrics_text().await;
    for name in [
        "belfry_tasks_submitted_total{queue=\"metered\"}",
        "belfry_tasks_dispatched_total{queue=\"metered\"}",
        "belfry_firing_lateness_seconds_bucket",
        "belfry_http_request_duration_seconds_bucket",
        // Counters an alert watches are there before their first event.
        "belfry_dispatch_claim_errors_total",
        "belfry_outcome_write_errors_total",
        "belfry_schedule_tick_errors_total",
        "belfry_schedule_misfires_total",
        "belfry_reminder_step_errors_total",
        "belfry_feed_requests_total{outcome=\"degraded\"}",
    ] {
        assert!(text.contains(name), "missing {name} in:\n{text}");
    }
}

impl TestServer {
    fn clock_now(&self) -> u64 {
        use belfry_core::Clock;
        self.clock.wall_ms()
    }
}

both_stores!(late_policies_skip_or_dead_letter_after_an_outage);
async fn late_policies_skip_or_dead_letter_after_an_outage(s: TestServer) {
    s.queue("q", json!({})).await;
    let skipped = s
        .submit(
            "q",
            json!({"payload": 1, "late": {"policy": "skip", "after_ms": 1000}}),
        )
        .await;
    let dead = s
        .submit(
            "q",
            json!({"payload": 2, "late": {"policy": "dead", "after_ms": 1000}}),
        )
        .await;
    let fired = s
        .submit(
            "q",
            json!({"payload": 3, "late": {"policy": "skip", "after_ms": 60000}}),
        )
        .await;
    s.advance(5000);
    let leased = s.lease("q", json!({"max": 10})).await;
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0]["id"], fired.as_str());
    assert_eq!(s.task("q", &skipped).await["state"], "skipped");
    assert_eq!(s.task("q", &dead).await["state"], "dead");
    let (status, body) = s
        .call(
            "POST",
            "/v1/queues/q/tasks",
            json!({"late": {"policy": "later"}}),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "invalid_request"));
}

both_stores!(a_queue_late_policy_applies_to_tasks_that_name_none);
async fn a_queue_late_policy_applies_to_tasks_that_name_none(s: TestServer) {
    let queue = s
        .queue("q", json!({"late_policy": "dead", "late_after_ms": 1000}))
        .await;
    assert_eq!(queue["late_policy"], "dead");
    assert_eq!(queue["late_after_ms"], 1000);
    // Inherits the queue's policy.
    let inherited = s.submit("q", json!({"payload": 1})).await;
    // Names its own, in the flat form, and so is delivered however late.
    let own = s
        .submit("q", json!({"payload": 2, "late_policy": "fire"}))
        .await;
    let skipped = s
        .submit(
            "q",
            json!({"payload": 3, "late_policy": "skip", "late_after_ms": 1000}),
        )
        .await;
    s.advance(5000);
    let leased = s.lease("q", json!({"max": 10})).await;
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0]["id"], own.as_str());
    // Each task shows the policy it was stored with: its queue's, or its own.
    let inherited = s.task("q", &inherited).await;
    assert_eq!(inherited["state"], "dead");
    assert_eq!(inherited["late_policy"], "dead");
    assert_eq!(inherited["late_after_ms"], 1000);
    let skipped = s.task("q", &skipped).await;
    assert_eq!(skipped["state"], "skipped");
    assert_eq!(skipped["late_policy"], "skip");
    assert_eq!(skipped["late_after_ms"], 1000);
    let own = s.task("q", own.as_str()).await;
    assert_eq!(own["late_policy"], "fire");
    assert!(own.get("late_after_ms").is_none(), "{own}");
    // The queue's policy survives an update that does not mention it, and can be reset.
    let queue = s.queue("q", json!({"rate_per_s": 5})).await;
    assert_eq!(queue["late_policy"], "dead");
    // The nested form tasks and schedules accept works on queues too.
    let queue = s
        .queue("q", json!({"late": {"policy": "skip", "after_ms": 250}}))
        .await;
    assert_eq!(queue["late_policy"], "skip");
    assert_eq!(queue["late_after_ms"], 250);
    let queue = s.queue("q", json!({"late_policy": "fire"})).await;
    assert_eq!(queue["late_policy"], "fire");
    assert!(queue.get("late_after_ms").is_none());
    // Every inconsistent combination is refused with a message, on tasks and on queues.
    for bad in [
        json!({"late_policy": "skip"}),
        json!({"late_after_ms": 5}),
        json!({"late_policy": "fire", "late_after_ms": 5}),
        json!({"late_policy": "dead", "late_after_ms": 5, "late": {"policy": "fire"}}),
        json!({"late_policy": "sometimes", "late_after_ms": 5}),
    ] {
        let (status, body) = s.call("POST", "/v1/queues/q/tasks", bad.clone()).await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_request"),
            "task {bad}"
        );
        let (status, body) = s.call("PUT", "/v1/queues/q", bad.clone()).await;
        assert_eq!(
            (status, code(&body)),
            (400, "invalid_request"),
            "queue {bad}"
        );
    }
}

/// A real restart: the second server opens the engine's files anew (the first engine is
/// closed), so what it knows came from disk, not from a store object both servers shared.
#[tokio::test]
async fn a_restarted_server_knows_its_queues() {
    use belfry_core::Clock;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let clock = belfry_core::ManualClock::new(T0);
    let start = || async {
        let engine = belfry_store::Engine::open(dir.path(), belfry_store::EngineOptions::default())
            .expect("the engine opens: the previous one is closed");
        belfry_server::Server::builder(common::test_config(), Arc::new(engine))
            .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
            .start()
            .await
            .unwrap()
    };
    let first = start().await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", first.local_addr());
    let put = http
        .put(format!("{base}/v1/queues/kept"))
        .json(&json!({"rate_per_s": 3, "paused": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    first.stop().await.unwrap();

    let second = start().await;
    let base = format!("http://{}", second.local_addr());
    let got: Value = http
        .get(format!("{base}/v1/queues/kept"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["rate_per_s"], 3.0);
    assert_eq!(got["paused"], true);
    second.stop().await.unwrap();
}

/// The value of the sample `series` (name and labels exactly as rendered) in a Prometheus text
/// page, if present.
fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Metric handles are cached per thread after the first request: later requests must still
/// be counted, each once. Other tests in this process share the route label (not this
/// queue's), so the route's count is checked to grow by at least ours.
#[tokio::test]
async fn repeated_submits_are_each_counted() {
    let s = TestServer::start().await;
    s.queue("counted-each", json!({})).await;
    let route = "belfry_http_request_duration_seconds_count{method=\"POST\",route=\"/v1/queues/{queue}/tasks\",status=\"201\"}";
    let before = metric_value(&s.metrics_text().await, route).unwrap_or(0.0);
    for i in 0..5 {
        s.submit("counted-each", json!({"payload": i})).await;
    }
    let text = s.metrics_text().await;
    assert_eq!(
        metric_value(
            &text,
            "belfry_tasks_submitted_total{queue=\"counted-each\"}"
        ),
        Some(5.0),
        "in:\n{text}"
    );
    let after = metric_value(&text, route).unwrap_or(0.0);
    assert!(after - before >= 5.0, "{route}: {before} then {after}");
}

/// `GET /v1/queues` answers in pages: `limit` names at most, `next_after` to continue, every
/// queue exactly once across the pages; a bad `limit` or parameter is a 400 that says what to
/// send.
#[tokio::test]
async fn queues_are_listed_in_pages() {
    let s = TestServer::start().await;
    let names: Vec<String> = (0..7).map(|i| format!("q{i}")).collect();
    for name in &names {
        s.ok("PUT", &format!("/v1/queues/{name}"), json!({}), 201)
            .await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/queues?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = s.ok("GET", &path, Value::Null, 200).await;
        pages += 1;
        let queues = page["queues"].as_array().unwrap();
        assert!(queues.len() <= 3, "{page}");
        seen.extend(
            queues
                .iter()
                .map(|q| q["name"].as_str().unwrap().to_owned()),
        );
        match page["next_after"].as_str() {
            Some(after) => path = format!("/v1/queues?limit=3&after={after}"),
            None => break,
        }
    }
    assert_eq!(seen, names, "every queue once, in name order");
    assert_eq!(pages, 3);
    let all = s.ok("GET", "/v1/queues", Value::Null, 200).await;
    assert_eq!(all["queues"].as_array().unwrap().len(), 7);
    assert!(all.get("next_after").is_none(), "{all}");
    for bad in [
        "/v1/queues?limit=0",
        "/v1/queues?limit=1001",
        "/v1/queues?page=2",
    ] {
        let (status, answer) = s.raw("GET", bad, None).await;
        assert_eq!(
            (status, code(&answer)),
            (400, "invalid_request"),
            "{bad}: {answer}"
        );
    }
}

both_stores!(a_lease_expired_on_its_last_attempt_does_not_cost_the_next_lease_its_task);
async fn a_lease_expired_on_its_last_attempt_does_not_cost_the_next_lease_its_task(s: TestServer) {
    s.queue("q", json!({"retry": {"max_attempts": 1}})).await;
    let first = s.submit("q", json!({"payload": 1})).await;
    let leased = s.lease("q", json!({"visibility_ms": 100})).await;
    assert_eq!(leased[0]["id"], first.as_str());
    let second = s.submit("q", json!({"payload": 2})).await;
    s.advance(100);
    // The first task's only attempt got no ack. The next lease of one task sends it to the
    // dead letters and answers the second, which is due, rather than nothing.
    let next = s.lease("q", json!({"max": 1})).await;
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0]["id"], second.as_str());
    let dead = s.task("q", &first).await;
    assert_eq!(dead["state"], "dead");
    let reason = dead["dead_reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("no acknowledgement after 1 attempt "),
        "{reason}"
    );
    // The claim that found it out of attempts made no attempt: the count is the one made.
    assert_eq!(dead["attempts"], 1, "{dead}");
}
