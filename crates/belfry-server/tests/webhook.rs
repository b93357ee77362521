//! Webhook delivery against a real HTTP receiver on loopback, with the server's clock moved
//! by hand.

#[macro_use]
mod common;

use belfry_core::Clock;
use common::{eventually, Receiver, TestServer, T0};
use serde_json::{json, Value};

fn header<'a>(r: &'a common::Received, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn webhook_queue(s: &TestServer, name: &str, receiver: &Receiver, extra: Value) {
    let mut config = json!({
        "delivery": {"type": "webhook", "url": receiver.url(), "secret": "s3cret", "timeout_ms": 5000},
        "retry": {"max_attempts": 5, "backoff_initial_ms": 1000, "backoff_max_ms": 600000},
    });
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            config.insert(k.clone(), v.clone());
        }
    }
    s.queue(name, config).await;
}

/// Moves the clock and waits until the dispatcher has looked at the store at the new time
/// (a claim turn with that clock finished), so a following "nothing delivered yet" observes
/// a dispatcher that looked and found nothing due, not one that has not run.
async fn advance_and_look(s: &TestServer, ms: u64) {
    s.advance(ms);
    let now = s.clock.wall_ms();
    eventually("a dispatch turn at the new time", || async {
        (s.handle.service().dispatch_stats().looked_at_ms >= now).then_some(())
    })
    .await;
}

/// Moves the clock `step_ms` at a time until `done` holds.
async fn advance_until(s: &TestServer, step_ms: u64, what: &str, done: impl Fn() -> bool) {
    eventually(what, || {
        let ok = done();
        if !ok {
            s.advance(step_ms);
        }
        async move { ok.then_some(()) }
    })
    .await
}

both_stores!(retries_server_errors_then_delivers_signed_and_never_early);
async fn retries_server_errors_then_delivers_signed_and_never_early(s: TestServer) {
    let receiver =
        Receiver::start(&s.clock, vec![(500, vec![]), (503, vec![]), (200, vec![])]).await;
    webhook_queue(&s, "hooks", &receiver, json!({})).await;
    let id = s
        .submit(
            "hooks",
            json!({"payload": {"a": 1}, "delay_ms": 5000, "headers": {"x-trace": "t1"}}),
        )
        .await;
    advance_and_look(&s, 4999).await;
    // Not due: still scheduled, nothing sent.
    assert_eq!(s.task("hooks", &id).await["state"], "scheduled");
    assert_eq!(receiver.count(), 0);

    advance_until(&s, 1, "the first attempt", || receiver.count() >= 1).await;
    advance_until(&s, 250, "three attempts", || receiver.count() >= 3).await;
    let done = eventually("the task is done", || async {
        let task = s.task("hooks", &id).await;
        (task["state"] == "done").then_some(task)
    })
    .await;
    assert_eq!(done["attempts"], 3);

    let got = receiver.received();
    assert_eq!(got.len(), 3);
    for (i, r) in got.iter().enumerate() {
        assert!(
            r.at_ms >= T0 + 5000,
            "attempt {i} arrived at {} before due",
            r.at_ms
        );
        assert_eq!(header(r, "belfry-task-id"), id);
        assert_eq!(header(r, "belfry-queue"), "hooks");
        assert_eq!(header(r, "belfry-attempt"), (i + 1).to_string());
        assert_eq!(header(r, "x-trace"), "t1");
        assert_eq!(
            serde_json::from_slice::<Value>(&r.body).unwrap(),
            json!({"a": 1})
        );
        let timestamp = header(r, "belfry-timestamp");
        let signature = header(r, "belfry-signature");
        assert!(
            belfry_sinks::verify_signature(b"s3cret", timestamp, &r.body, signature),
            "bad signature {signature:?}"
        );
        let signature_v2 = header(r, "belfry-signature-v2");
        assert!(
            belfry_sinks::verify_signature_v2(b"s3cret", &id, timestamp, &r.body, signature_v2),
            "bad v2 signature {signature_v2:?}"
        );
    }
    // Each retry waited at least half its backoff (1 s, then 2 s) after the previous attempt.
    assert!(got[1].at_ms >= got[0].at_ms + 500);
    assert!(got[2].at_ms >= got[1].at_ms + 1000);
}

both_stores!(client_error_is_dead_at_once);
async fn client_error_is_dead_at_once(s: TestServer) {
    let receiver = Receiver::start(&s.clock, vec![(404, vec![])]).await;
    webhook_queue(&s, "hooks", &receiver, json!({})).await;
    let id = s.submit("hooks", json!({"payload": 1})).await;
    let page = eventually("a dead letter", || async {
        let page = s.ok("GET", "/v1/queues/hooks/dead", Value::Null, 200).await;
        (!page["tasks"].as_array().unwrap().is_empty()).then_some(page)
    })
    .await;
    assert_eq!(page["tasks"][0]["id"], id.as_str());
    assert_eq!(page["tasks"][0]["attempts"], 1);
    assert!(
        page["tasks"][0]["dead_reason"]
            .as_str()
            .unwrap()
            .contains("404"),
        "{page}"
    );
    assert_eq!(receiver.count(), 1);
    let q = s.ok("GET", "/v1/queues/hooks", Value::Null, 200).await;
    assert_eq!(q["dead"], 1);
}

both_stores!(retry_after_is_honoured);
async fn retry_after_is_honoured(s: TestServer) {
    let receiver = Receiver::start(
        &s.clock,
        vec![(429, vec![("retry-after", "120")]), (200, vec![])],
    )
    .await;
    webhook_queue(&s, "hooks", &receiver, json!({})).await;
    let id = s.submit("hooks", json!({"payload": 1})).await;
    let task = eventually("the first attempt is recorded", || async {
        let task = s.task("hooks", &id).await;
        (task["state"] == "scheduled" && task["attempts"] == 1).then_some(task)
    })
    .await;
    // The receiver asked for 120 s, longer than the 0.5–1 s backoff: it wins.
    assert_eq!(task["due_at_ms"], T0 + 120_000);
    advance_and_look(&s, 119_999).await;
    assert_eq!(s.task("hooks", &id).await["state"], "scheduled");
    assert_eq!(receiver.count(), 1);
    s.advance(1);
    eventually("the second attempt succeeds", || async {
        (s.task("hooks", &id).await["state"] == "done").then_some(())
    })
    .await;
    assert_eq!(receiver.count(), 2);
    assert!(receiver.received()[1].at_ms >= T0 + 120_000);
}

both_stores!(gives_up_after_max_attempts);
async fn gives_up_after_max_attempts(s: TestServer) {
    let receiver = Receiver::start(&s.clock, vec![(500, vec![])]).await;
    webhook_queue(
        &s,
        "hooks",
        &receiver,
        json!({"retry": {"max_attempts": 2, "backoff_initial_ms": 100, "backoff_max_ms": 100}}),
    )
    .await;
    let id = s.submit("hooks", json!({"payload": 1})).await;
    advance_until(&s, 100, "two attempts", || receiver.count() >= 2).await;
    let task = eventually("a dead letter", || async {
        let task = s.task("hooks", &id).await;
        (task["state"] == "dead").then_some(task)
    })
    .await;
    assert!(
        task["dead_reason"]
            .as_str()
            .unwrap()
            .contains("gave up after 2"),
        "{task}"
    );
    // Redrive delivers it again (the receiver still fails, so it is retried).
    s.ok(
        "POST",
        &format!("/v1/queues/hooks/dead/{id}/redrive"),
        Value::Null,
        200,
    )
    .await;
    eventually("a third attempt after redrive", || async {
        (receiver.count() >= 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn paused_webhook_queue_holds_tasks_until_resumed() {
    let s = TestServer::start().await;
    let receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    webhook_queue(&s, "hooks", &receiver, json!({"paused": true})).await;
    let id = s.submit("hooks", json!({"payload": 1})).await;
    advance_and_look(&s, 10_000).await;
    assert_eq!(s.task("hooks", &id).await["state"], "scheduled");
    s.ok("POST", "/v1/queues/hooks/resume", Value::Null, 200)
        .await;
    eventually("delivery after resume", || async {
        (s.task("hooks", &id).await["state"] == "done").then_some(())
    })
    .await;
    assert_eq!(receiver.count(), 1);
}

both_stores!(a_slow_webhook_does_not_delay_another_queue);
async fn a_slow_webhook_does_not_delay_another_queue(s: TestServer) {
    let slow = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let fast = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    slow.hold();
    webhook_queue(&s, "slow", &slow, json!({})).await;
    webhook_queue(&s, "fast", &fast, json!({})).await;
    let stuck = s.submit("slow", json!({"payload": 1})).await;
    eventually("the slow receiver holds a request", || async {
        (slow.count() == 1).then_some(())
    })
    .await;
    let quick = s.submit("fast", json!({"payload": 2})).await;
    eventually("the fast queue delivers", || async {
        (s.task("fast", &quick).await["state"] == "done").then_some(())
    })
    .await;
    assert_eq!(s.task("slow", &stuck).await["state"], "leased");
    slow.release();
    eventually("the slow queue finishes", || async {
        (s.task("slow", &stuck).await["state"] == "done").then_some(())
    })
    .await;
}

#[tokio::test]
async fn webhook_rate_limit_holds_across_the_clock() {
    let s = TestServer::start().await;
    let receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    webhook_queue(&s, "hooks", &receiver, json!({"rate_per_s": 2, "burst": 2})).await;
    let tasks: Vec<Value> = (0..5).map(|i| json!({ "payload": i })).collect();
    s.ok(
        "POST",
        "/v1/queues/hooks/tasks:batch",
        json!({ "tasks": tasks }),
        200,
    )
    .await;
    eventually("the burst is delivered", || async {
        let q = s.ok("GET", "/v1/queues/hooks", Value::Null, 200).await;
        (q["pending"] == 3 && q["in_flight"] == 0).then_some(())
    })
    .await;
    // Without the clock moving, no more tokens: the other three stay pending.
    assert_eq!(receiver.count(), 2);
    s.advance(500);
    eventually("one more after half a second", || async {
        (receiver.count() == 3).then_some(())
    })
    .await;
    advance_until(&s, 500, "all delivered", || receiver.count() == 5).await;
}

#[tokio::test]
async fn graceful_shutdown_drains_in_flight_deliveries() {
    let s = TestServer::start().await;
    let receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    receiver.hold();
    webhook_queue(&s, "hooks", &receiver, json!({})).await;
    let id = s.submit("hooks", json!({"payload": 1})).await;
    eventually("the delivery is in flight", || async {
        (receiver.count() == 1).then_some(())
    })
    .await;
    let service = s.handle.service().clone();
    let TestServer { handle, store, .. } = s;
    handle.shutdown();
    let stopped = tokio::spawn(handle.wait());
    eventually("shutdown began", || async {
        service.stopping.is_cancelled().then_some(())
    })
    .await;
    // The delivery is held by the receiver, so the server cannot have finished stopping.
    assert!(!stopped.is_finished());
    receiver.release();
    stopped.await.unwrap().expect("clean shutdown");
    let task = store
        .get(
            &belfry_core::QueueName::new("hooks").unwrap(),
            id.parse().unwrap(),
            T0,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        task.state,
        belfry_core::TaskState::Done,
        "acked before exit"
    );
}

/// A queue stored with a target the server's configuration now refuses (private targets
/// allowed before a restart, not after) keeps its tasks, and says in its `delivery_health`
/// why nothing is delivered, rather than showing no health at all.
#[tokio::test]
async fn a_stored_target_the_configuration_now_refuses_shows_in_the_queues_health() {
    let store: std::sync::Arc<dyn belfry_store::Store> =
        std::sync::Arc::new(belfry_store::MemoryStore::new());
    let before =
        TestServer::start_with_sinks(common::test_config(), store.clone(), None, None).await;
    before
        .ok(
            "PUT",
            "/v1/queues/hooks",
            json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/x"}}),
            201,
        )
        .await;
    before.handle.stop().await.expect("clean shutdown");
    let config = belfry_server::ServerConfig {
        allow_private_targets: false,
        ..common::test_config()
    };
    let after = TestServer::start_with_sinks(config, store, None, None).await;
    let queue = after.ok("GET", "/v1/queues/hooks", Value::Null, 200).await;
    let health = queue["delivery_health"].as_str().unwrap_or_default();
    assert!(
        health.starts_with("unreachable: not delivering: this server's configuration refuses"),
        "{queue}"
    );
    // Pointed at an allowed target, it delivers again: the refusal is gone.
    after
        .ok(
            "PUT",
            "/v1/queues/hooks",
            json!({"delivery": {"type": "webhook", "url": "http://93.184.216.34/x"}}),
            200,
        )
        .await;
    let queue = after.ok("GET", "/v1/queues/hooks", Value::Null, 200).await;
    assert!(
        !queue["delivery_health"]
            .as_str()
            .unwrap_or_default()
            .contains("refuses"),
        "{queue}"
    );
    after.handle.stop().await.expect("clean shutdown");
}

#[tokio::test]
async fn private_targets_are_refused_by_default() {
    let config = belfry_server::ServerConfig {
        allow_private_targets: false,
        ..common::test_config()
    };
    let s = TestServer::start_with(config).await;
    let (status, body) = s
        .call(
            "PUT",
            "/v1/queues/hooks",
            json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/x"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "webhook_target_refused");
}

/// A webhook queue's `PUT` probes its target as a stream queue's does: nothing listening is a
/// warning (the queue is saved, deliveries will be retried); a listening target is none.
#[tokio::test]
async fn put_warns_about_a_webhook_target_that_does_not_answer() {
    let s = TestServer::start().await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let url = format!("http://{closed}/nobody");
    let (status, created) = s
        .call(
            "PUT",
            "/v1/queues/down",
            json!({"delivery": {"type": "webhook", "url": url}}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let warnings = created["warnings"].to_string();
    assert!(
        warnings.contains("not reachable yet")
            && warnings.contains(&format!("could not connect to {closed}"))
            && warnings.contains("will be retried"),
        "{created}"
    );
    let health = created["delivery_health"].as_str().unwrap_or_default();
    assert!(health.starts_with("unreachable: "), "{created}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = listener.local_addr().unwrap();
    let created = s
        .ok(
            "PUT",
            "/v1/queues/up",
            json!({"delivery": {"type": "webhook", "url": format!("http://{open}/hook")}}),
            201,
        )
        .await;
    assert!(created.get("warnings").is_none(), "{created}");
    assert_eq!(created["delivery_health"], "reachable", "{created}");
    s.handle.stop().await.expect("clean shutdown");
}

/// A host name that resolves to an address the server forbids passes the URL check (only DNS
/// can tell), so `PUT` resolves it: the answer warns that its tasks will be dead-lettered and
/// the health says refused, from before the first task and after it. Needs a name other than
/// `localhost` that resolves to a non-public address: this machine's host name usually does.
#[tokio::test]
async fn put_warns_about_a_name_resolving_to_a_forbidden_address() {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .map(|addrs| addrs.collect())
        .unwrap_or_default();
    if host.is_empty()
        || !resolved
            .iter()
            .any(|a| belfry_sinks::non_public_range(a.ip()).is_some())
    {
        eprintln!("skipped: host name {host:?} does not resolve to a non-public address");
        return;
    }
    let config = belfry_server::ServerConfig {
        allow_private_targets: false,
        ..common::test_config()
    };
    let s = TestServer::start_with(config).await;
    let url = format!("http://{host}:9/hook");
    let created = s
        .ok(
            "PUT",
            "/v1/queues/inside",
            json!({"delivery": {"type": "webhook", "url": url}}),
            201,
        )
        .await;
    let warnings = created["warnings"].to_string();
    assert!(
        warnings.contains("refused")
            && warnings.contains("forbidden target")
            && warnings.contains("dead-lettered at their first attempt"),
        "{created}"
    );
    let health = |q: &Value| q["delivery_health"].as_str().unwrap_or_default().to_owned();
    assert!(
        health(&created).starts_with("refused: forbidden target"),
        "{created}"
    );
    let id = s.submit("inside", json!({"payload": 1})).await;
    s.advance(1);
    let dead = common::eventually("the task dead-lettered", || async {
        let task = s.task("inside", &id).await;
        (task["state"] == "dead").then_some(task)
    })
    .await;
    assert_eq!(dead["attempts"], 1, "{dead}");
    let queue = s.ok("GET", "/v1/queues/inside", Value::Null, 200).await;
    assert!(
        health(&queue).starts_with("refused: forbidden target"),
        "{queue}"
    );
    s.handle.stop().await.expect("clean shutdown");
}

both_stores!(a_task_with_its_own_target_is_delivered_there);
async fn a_task_with_its_own_target_is_delivered_there(s: TestServer) {
    let queue_receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let own_receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    webhook_queue(&s, "hooks", &queue_receiver, json!({})).await;
    let target = format!("{}?token=abc", own_receiver.url());
    let id = s
        .submit(
            "hooks",
            json!({"payload": {"n": 1}, "target": target, "headers": {"X-A": "b"}}),
        )
        .await;
    s.submit("hooks", json!({"payload": {"n": 2}})).await;

    eventually("both delivered", || async {
        (own_receiver.count() == 1 && queue_receiver.count() == 1).then_some(())
    })
    .await;
    let own = &own_receiver.received()[0];
    assert_eq!(own.body, br#"{"n":1}"#);
    assert_eq!(header(own, "belfry-task-id"), id);
    assert_eq!(header(own, "x-a"), "b");
    assert!(header(own, "belfry-signature-v2").starts_with("v2="));
    assert_eq!(queue_receiver.received()[0].body, br#"{"n":2}"#);
    // Shown as a queue's URL is: no query string.
    let task = s
        .ok(
            "GET",
            &format!("/v1/queues/hooks/tasks/{id}"),
            Value::Null,
            200,
        )
        .await;
    assert_eq!(task["target"], format!("{}?<redacted>", own_receiver.url()));
}

#[tokio::test]
async fn task_targets_are_checked_on_submit() {
    let config = belfry_server::ServerConfig {
        allow_private_targets: false,
        ..common::test_config()
    };
    let s = TestServer::start_with(config).await;
    s.queue(
        "hooks",
        json!({"delivery": {"type": "webhook", "url": "https://example.com/hook"}}),
    )
    .await;
    s.queue("pull", json!({})).await;
    let refused = |queue: &'static str, target: &'static str| {
        let s = &s;
        async move {
            let (status, body) = s
                .call(
                    "POST",
                    &format!("/v1/queues/{queue}/tasks"),
                    json!({"payload": 1, "target": target}),
                )
                .await;
            assert_eq!(status, 400, "{body}");
            (
                body["error"]["code"].as_str().unwrap().to_owned(),
                body["error"]["message"].as_str().unwrap().to_owned(),
            )
        }
    };
    let (code, message) = refused("hooks", "http://127.0.0.1:9/x").await;
    assert_eq!(code, "webhook_target_refused");
    assert!(
        message.starts_with("target: ") && message.contains("loopback"),
        "{message}"
    );
    let (code, _) = refused("hooks", "ftp://example.com/x").await;
    assert_eq!(code, "webhook_target_refused");
    let (code, message) = refused("pull", "https://example.com/x").await;
    assert_eq!(code, "target_not_supported");
    assert!(message.contains("pull queue"), "{message}");
    // In a batch, only the task with the bad target fails.
    let answer = s
        .ok(
            "POST",
            "/v1/queues/hooks/tasks:batch",
            json!({"tasks": [
                {"payload": 1, "target": "https://example.org/a"},
                {"payload": 2, "target": "http://10.0.0.1/a"},
            ]}),
            200,
        )
        .await;
    assert_eq!(answer["results"][0]["state"], "scheduled", "{answer}");
    assert_eq!(
        answer["results"][1]["error"]["code"], "webhook_target_refused",
        "{answer}"
    );
    let id = answer["results"][0]["id"].as_str().unwrap();
    let task = s
        .ok(
            "GET",
            &format!("/v1/queues/hooks/tasks/{id}"),
            Value::Null,
            200,
        )
        .await;
    assert_eq!(task["target"], "https://example.org/a");
}

/// Tasks sent to their own slow target hold no calls to their queue's host: another queue on
/// that host is delivered while they hang.
#[tokio::test]
async fn a_slow_task_target_does_not_hold_the_queue_hosts_calls() {
    let config = belfry_server::ServerConfig {
        dispatch_per_target_max: 2,
        ..common::test_config()
    };
    let s = TestServer::start_with(config).await;
    let shared_host = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let slow = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    slow.hold();
    // Longer than the test waits: without the fix the slow calls would hold the host's
    // calls for the whole test, not time out and hand them back.
    let patient =
        json!({"delivery": {"type": "webhook", "url": shared_host.url(), "timeout_ms": 300_000}});
    webhook_queue(&s, "targets", &shared_host, patient).await;
    webhook_queue(&s, "other", &shared_host, json!({})).await;
    for n in 0..5 {
        s.submit("targets", json!({"payload": n, "target": slow.url()}))
            .await;
    }
    eventually(
        "the slow target holds more than the host's calls",
        || async { (slow.count() > 2).then_some(()) },
    )
    .await;
    s.submit("other", json!({"payload": "other"})).await;
    eventually("the other queue delivered", || async {
        (shared_host.count() == 1).then_some(())
    })
    .await;
    assert_eq!(shared_host.received()[0].body, br#""other""#);
    slow.release();
}

/// A queue whose secret is being rotated says so, and echoes neither secret.
#[tokio::test]
async fn a_rotating_secret_is_shown_as_set_and_never_echoed() {
    let s = TestServer::start().await;
    let receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let shown = s
        .queue(
            "hooks",
            json!({"delivery": {"type": "webhook", "url": receiver.url(),
                "secret": "new-secret-1", "previous_secret": "old-secret-0"}}),
        )
        .await;
    let text = shown.to_string();
    assert!(
        !text.contains("new-secret-1") && !text.contains("old-secret-0"),
        "{text}"
    );
    assert_eq!(shown["delivery"]["secret_set"], true, "{shown}");
    assert_eq!(shown["delivery"]["previous_secret_set"], true, "{shown}");
    // The rotation ends by leaving the previous secret out.
    let after = s
        .queue(
            "hooks",
            json!({"delivery": {"type": "webhook", "url": receiver.url(), "secret": "new-secret-1"}}),
        )
        .await;
    assert!(
        after["delivery"].get("previous_secret_set").is_none(),
        "{after}"
    );
}

/// A schedule's `target` takes its firings (not the queue's URL); it is checked on create as
/// a task's is, and shown without its query string.
#[tokio::test]
async fn a_schedules_target_takes_its_firings() {
    let s = TestServer::start().await;
    let queue_receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let own = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    webhook_queue(&s, "hooks", &queue_receiver, json!({})).await;
    s.queue("pull", json!({})).await;
    let every_minute =
        |queue: &str, target: &str| json!({"queue": queue, "every_ms": 60_000, "target": target});
    let (status, body) = s
        .call("POST", "/v1/schedules", every_minute("pull", &own.url()))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "target_not_supported", "{body}");
    let (status, body) = s
        .call(
            "POST",
            "/v1/schedules",
            every_minute("hooks", "ftp://example.com/x"),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "webhook_target_refused", "{body}");

    let created = s
        .ok(
            "POST",
            "/v1/schedules",
            json!({"id": "own", "queue": "hooks", "every_ms": 60_000,
                "payload": {"n": 1}, "target": format!("{}?k=v", own.url())}),
            201,
        )
        .await;
    assert_eq!(created["target"], format!("{}?<redacted>", own.url()));
    s.advance(60_000);
    s.handle.schedules().wake();
    eventually("the firing at the schedule's target", || async {
        (own.count() >= 1).then_some(())
    })
    .await;
    assert_eq!(queue_receiver.count(), 0);
    let firing = &own.received()[0];
    assert_eq!(firing.body, br#"{"n":1}"#);
    assert_eq!(header(firing, "belfry-schedule"), "own");
}

both_stores!(fixed_headers_arrive_on_every_attempt_and_replace_task_headers);
/// A queue's fixed headers (`delivery.headers`) arrive on every attempt, retries included,
/// replacing a task header of the same name; a task's own target at the queue URL's origin
/// gets them too, one elsewhere (a producer's choice) does not.
async fn fixed_headers_arrive_on_every_attempt_and_replace_task_headers(s: TestServer) {
    let receiver = Receiver::start(&s.clock, vec![(503, vec![]), (200, vec![])]).await;
    let elsewhere = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let fixed = json!({"Authorization": "Bearer queue-token", "X-Env": "prod"});
    let delivery =
        json!({"delivery": {"type": "webhook", "url": receiver.url(), "headers": fixed}});
    webhook_queue(&s, "hooks", &receiver, delivery).await;
    let task_headers = json!({"authorization": "Bearer task-token", "X-Trace": "t1"});
    let id = s
        .submit("hooks", json!({"payload": 1, "headers": task_headers}))
        .await;
    advance_until(&s, 250, "a retry after the 503", || receiver.count() >= 2).await;
    let own = format!("{}?own=1", receiver.url());
    s.submit("hooks", json!({"payload": 2, "target": own}))
        .await;
    let other = json!({"payload": 3, "target": elsewhere.url(), "headers": task_headers});
    s.submit("hooks", other).await;
    eventually("the targets delivered", || async {
        (receiver.count() == 3 && elsewhere.count() == 1).then_some(())
    })
    .await;

    for (i, r) in receiver.received().iter().enumerate() {
        let auth: Vec<_> = r.headers.get_all("authorization").iter().collect();
        assert_eq!(auth, ["Bearer queue-token"], "request {i}");
        assert_eq!(header(r, "x-env"), "prod", "request {i}");
    }
    let first = &receiver.received()[..2];
    assert!(first.iter().all(|r| header(r, "belfry-task-id") == id));
    assert_eq!(header(&first[1], "belfry-attempt"), "2");
    assert_eq!(header(&first[1], "x-trace"), "t1");
    let there = &elsewhere.received()[0];
    assert_eq!(header(there, "authorization"), "Bearer task-token");
    assert_eq!(header(there, "x-env"), "");
}

/// `GET` shows a queue's fixed headers by name, never a value; they follow `secret` on update:
/// kept by an update that leaves `delivery` out, dropped by a `delivery` given without them.
#[tokio::test]
async fn fixed_headers_are_shown_by_name_only_and_follow_the_secret_on_update() {
    let s = TestServer::start().await;
    let receiver = Receiver::start(&s.clock, vec![(200, vec![])]).await;
    let delivery = json!({"type": "webhook", "url": receiver.url(), "secret": "s3cret",
        "headers": {"X-Env": "value-env-1", "Authorization": "Bearer value-auth-2"}});
    let created = s.queue("hooks", json!({ "delivery": delivery })).await;
    let got = s.ok("GET", "/v1/queues/hooks", Value::Null, 200).await;
    let list = s.ok("GET", "/v1/queues", Value::Null, 200).await;
    for shown in [&created, &got, &list["queues"][0]] {
        let text = shown.to_string();
        assert!(
            !text.contains("value-env-1") && !text.contains("value-auth-2"),
            "{text}"
        );
        assert_eq!(
            shown["delivery"]["headers_set"],
            json!(["Authorization", "X-Env"]),
            "{shown}"
        );
        assert!(shown["delivery"].get("headers").is_none(), "{shown}");
    }
    // Like the secret: an update without `delivery` keeps them.
    let kept = s.queue("hooks", json!({"rate_per_s": 5})).await;
    assert_eq!(
        kept["delivery"]["headers_set"],
        json!(["Authorization", "X-Env"])
    );
    assert_eq!(kept["delivery"]["secret_set"], true);
    // A new `delivery` without them is replaced whole: no headers, as no secret.
    let replaced = json!({"delivery": {"type": "webhook", "url": receiver.url()}});
    let replaced = s.queue("hooks", replaced).await;
    assert!(
        replaced["delivery"].get("headers_set").is_none(),
        "{replaced}"
    );
    assert_eq!(replaced["delivery"]["secret_set"], false);
}

/// A header belfry sets itself, one no request can carry, one name twice in two cases, or too
/// many: `400 invalid_queue_config` naming `delivery.headers` and the header, never a value.
#[tokio::test]
async fn refused_fixed_headers_name_the_field_and_the_header() {
    let s = TestServer::start().await;
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("X-H{i}"), json!("v"))).collect();
    let cases = [
        (json!({"Host": "value-1"}), "Host"),
        (json!({"Belfry-Task-Id": "value-1"}), "Belfry-Task-Id"),
        (json!({"Content-Type": "value-1"}), "Content-Type"),
        (json!({"Transfer-Encoding": "value-1"}), "Transfer-Encoding"),
        (json!({"X-Bad": "value-1\r\nX-Injected: 1"}), "X-Bad"),
        (json!({"Bad Name": "value-1"}), "Bad Name"),
        (json!({"X-Env": "value-1", "x-env": "value-1"}), "X-Env"),
        (Value::Object(many), "at most 32 headers"),
    ];
    for (headers, named) in cases {
        let body = json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/hook",
            "headers": headers}});
        let (status, answer) = s.call("PUT", "/v1/queues/hooks", body).await;
        assert_eq!(status, 400, "{headers}: {answer}");
        assert_eq!(common::code(&answer), "invalid_queue_config", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("delivery.headers: ") && message.contains(named),
            "{message}"
        );
        assert!(!message.contains("value-1"), "{message}");
    }
    let (status, _) = s.call("GET", "/v1/queues/hooks", Value::Null).await;
    assert_eq!(status, 404, "nothing was created");
}
