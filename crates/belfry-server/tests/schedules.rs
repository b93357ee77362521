//! Schedules end to end: the `/v1/schedules` routes, the runner creating tasks at fire times
//! (driven by a manual clock), misfires after downtime, and the queue forecast.

mod common;

use std::sync::Arc;
use std::time::Duration;

use belfry_core::{Clock, ManualClock};
use belfry_server::schedules::Schedules;
use belfry_server::Server;
use belfry_store::{MemoryStore, Store};
use common::{code, eventually, test_config, TestServer, T0};
use serde_json::{json, Value};

const MINUTE: u64 = 60_000;

/// A test server with the schedule routes and runner, started the way `belfry serve` does.
struct Scheduled {
    s: TestServer,
    schedules: Schedules,
    /// The store, kept to start the next server on after a stop.
    store: Arc<dyn Store>,
}

impl Scheduled {
    async fn start() -> Self {
        Self::start_on(Arc::new(MemoryStore::new()), ManualClock::new(T0)).await
    }

    /// On an existing store and clock: a restart after "downtime".
    async fn start_on(store: Arc<dyn Store>, clock: ManualClock) -> Self {
        let config = test_config();
        let dyn_clock = Arc::new(clock.clone()) as Arc<dyn Clock>;
        // The builder fires the schedules due at start-up, serves their routes and runs the
        // runner: nothing to wire here, as in `belfry serve`.
        let handle = Server::builder(config, store.clone())
            .clock(dyn_clock)
            .start()
            .await
            .expect("server starts");
        let schedules = handle.schedules().clone();
        Scheduled {
            s: TestServer::from_handle(handle, clock, store.clone()),
            schedules,
            store,
        }
    }

    /// Moves the clock and wakes the runner and the queues.
    fn advance(&self, ms: u64) {
        self.s.advance(ms);
        self.schedules.wake();
    }

    async fn stop(self) -> (Arc<dyn Store>, ManualClock) {
        let clock = self.s.clock.clone();
        self.s.handle.stop().await.expect("clean stop");
        (self.store, clock)
    }

    async fn create(&self, body: Value) -> Value {
        self.s.ok("POST", "/v1/schedules", body, 201).await
    }

    /// Leases and acks until `n` tasks came (or fails after the poll deadline); returns them
    /// sorted by due time, then by shard.
    async fn lease_n(&self, queue: &str, n: usize) -> Vec<Value> {
        let mut got: Vec<Value> = Vec::new();
        let deadline = tokio::time::Instant::now() + common::POLL_DEADLINE;
        while got.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "gave up waiting for {n} tasks in {queue}, have {got:?}"
            );
            let leased = self.s.lease(queue, json!({"max": 100})).await;
            if leased.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for task in &leased {
                let id = task["id"].as_str().unwrap();
                self.s
                    .ok(
                        "POST",
                        &format!("/v1/queues/{queue}/tasks/{id}/ack"),
                        json!({"lease_id": task["lease_id"]}),
                        200,
                    )
                    .await;
            }
            got.extend(leased);
        }
        assert_eq!(got.len(), n, "exactly {n} tasks: {got:?}");
        got.sort_by_key(|t| {
            (
                t["due_at_ms"].as_u64(),
                t["headers"]["Belfry-Shard"].as_str().map(str::to_owned),
            )
        });
        got
    }

    async fn pending(&self, queue: &str) -> u64 {
        let q = self
            .s
            .ok("GET", &format!("/v1/queues/{queue}"), Value::Null, 200)
            .await;
        q["pending"].as_u64().unwrap()
    }
}

fn message(value: &Value) -> &str {
    value["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn schedule_lifecycle_through_http() {
    let t = Scheduled::start().await;
    t.s.queue("reports", json!({})).await;

    let created = t
        .create(json!({
            "id": "daily-report",
            "queue": "reports",
            "cron": "30 2 * * *",
            // Any case is the zone; it is stored as the database spells it.
            "timezone": "america/new_york",
            "payload": {"report": "sales"},
            "headers": {"X-Kind": "report"},
            "priority": "high",
            "late": {"policy": "skip", "after_ms": 3600000},
        }))
        .await;
    assert_eq!(created["id"], "daily-report");
    assert_eq!(created["queue"], "reports");
    assert_eq!(created["cron"], "30 2 * * *");
    assert_eq!(created["timezone"], "America/New_York");
    assert_eq!(created["payload"], json!({"report": "sales"}));
    assert_eq!(created["headers"], json!({"X-Kind": "report"}));
    assert_eq!(created["priority"], "high");
    assert_eq!(
        created["late"],
        json!({"policy": "skip", "after_ms": 3600000})
    );
    assert_eq!(created["shard_count"], 1);
    assert_eq!(created["misfire"], "fire_once");
    assert_eq!(created["paused"], false);
    // T0 is 2026-01-01T00:00Z = 2025-12-31 19:00 in New York: next 02:30 EST is 07:30Z.
    assert_eq!(created["next_fire_at"], "2026-01-01T07:30:00Z");
    assert_eq!(
        created["next_fire_at_ms"],
        T0 + 7 * 60 * MINUTE + 30 * MINUTE
    );
    assert_eq!(
        created["next_fire_local"],
        "2026-01-01T02:30:00-05:00[America/New_York]"
    );

    let got =
        t.s.ok("GET", "/v1/schedules/daily-report", Value::Null, 200)
            .await;
    assert_eq!(got, created);

    // A generated id.
    let other = t
        .create(json!({"queue": "reports", "every_ms": 90_000, "payload_base64": "AAE="}))
        .await;
    let other_id = other["id"].as_str().unwrap().to_owned();
    assert_eq!(other_id.len(), 32);
    assert_eq!(other["every_ms"], 90_000);
    assert_eq!(other["payload_base64"], "AAE=");
    assert_eq!(other["next_fire_at_ms"], T0 + 90_000);
    assert!(other.get("timezone").is_none());

    let list = t.s.ok("GET", "/v1/schedules", Value::Null, 200).await;
    let mut ids: Vec<_> = list["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    let mut expected = vec!["daily-report".to_owned(), other_id.clone()];
    expected.sort();
    assert_eq!(ids, expected);

    // Next fire times across the 2026-03-08 spring-forward in New York: 02:30 does not exist
    // that day and fires once at 03:00 EDT.
    let replaced =
        t.s.ok(
            "PUT",
            "/v1/schedules/daily-report",
            json!({"queue": "reports", "cron": "30 2 * * *", "timezone": "America/New_York",
                   "start_at": "2026-03-07T00:00:00Z"}),
            200,
        )
        .await;
    assert_eq!(replaced["start_at"], "2026-03-07T00:00:00Z");
    assert_eq!(replaced["priority"], "normal");
    let next =
        t.s.ok(
            "GET",
            "/v1/schedules/daily-report/next?n=3",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(next["timezone"], "America/New_York");
    let times = next["fire_times"].as_array().unwrap();
    let local: Vec<_> = times.iter().map(|t| t["local"].as_str().unwrap()).collect();
    assert_eq!(
        local,
        vec![
            "2026-03-07T02:30:00-05:00[America/New_York]",
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-03-09T02:30:00-04:00[America/New_York]",
        ]
    );
    assert_eq!(times[1]["at"], "2026-03-08T07:00:00Z");
    assert_eq!(times[0]["at_ms"].as_u64(), Some(1_772_868_600_000));
    let default_n =
        t.s.ok("GET", "/v1/schedules/daily-report/next", Value::Null, 200)
            .await;
    assert_eq!(default_n["fire_times"].as_array().unwrap().len(), 10);

    let paused =
        t.s.ok("POST", "/v1/schedules/daily-report/pause", Value::Null, 200)
            .await;
    assert_eq!(paused["paused"], true);
    assert!(paused.get("next_fire_at").is_none(), "{paused}");
    let resumed =
        t.s.ok(
            "POST",
            "/v1/schedules/daily-report/resume",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(resumed["paused"], false);
    assert_eq!(resumed["next_fire_at"], "2026-03-07T07:30:00Z");

    let (status, body) =
        t.s.call("DELETE", "/v1/schedules/daily-report", Value::Null)
            .await;
    assert_eq!(status, 204, "{body}");
    for (method, path) in [
        ("GET", "/v1/schedules/daily-report"),
        ("DELETE", "/v1/schedules/daily-report"),
        ("POST", "/v1/schedules/daily-report/pause"),
        ("POST", "/v1/schedules/daily-report/resume"),
        ("GET", "/v1/schedules/daily-report/next"),
    ] {
        let (status, body) = t.s.call(method, path, Value::Null).await;
        assert_eq!(
            (status, code(&body)),
            (404, "schedule_not_found"),
            "{method} {path}"
        );
    }
    let (status, body) =
        t.s.call(
            "PUT",
            "/v1/schedules/daily-report",
            json!({"queue": "reports", "every_ms": 1000}),
        )
        .await;
    assert_eq!((status, code(&body)), (404, "schedule_not_found"));
    t.stop().await;
}

#[tokio::test]
async fn the_list_filters_by_queue_pages_and_refuses_other_parameters() {
    let t = Scheduled::start().await;
    for queue in ["a", "b"] {
        t.s.queue(queue, json!({})).await;
        for n in 0..2 {
            t.create(json!({"id": format!("{queue}-{n}"), "queue": queue, "every_ms": 60_000}))
                .await;
        }
    }
    let ids = |answer: &Value| -> Vec<String> {
        answer["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = t.s.ok("GET", "/v1/schedules", Value::Null, 200).await;
    assert_eq!(ids(&all), ["a-0", "a-1", "b-0", "b-1"]);
    let of_b =
        t.s.ok("GET", "/v1/schedules?queue=b", Value::Null, 200)
            .await;
    assert_eq!(ids(&of_b), ["b-0", "b-1"]);
    // Pages of `limit` after `after`, `next_after` on all but the last; without `limit`, every
    // schedule and no `next_after`.
    assert!(all.get("next_after").is_none(), "{all}");
    let first =
        t.s.ok("GET", "/v1/schedules?limit=3", Value::Null, 200)
            .await;
    assert_eq!(ids(&first), ["a-0", "a-1", "b-0"]);
    assert_eq!(first["next_after"], "b-0");
    let last =
        t.s.ok("GET", "/v1/schedules?limit=3&after=b-0", Value::Null, 200)
            .await;
    assert_eq!(ids(&last), ["b-1"]);
    assert!(last.get("next_after").is_none(), "{last}");
    let of_a =
        t.s.ok("GET", "/v1/schedules?queue=a&after=a-0", Value::Null, 200)
            .await;
    assert_eq!(ids(&of_a), ["a-1"]);
    for (path, expected) in [
        ("/v1/schedules?limit=0", "invalid_request"),
        ("/v1/schedules?limit=1001", "invalid_request"),
        ("/v1/schedules?color=red", "invalid_request"),
        ("/v1/schedules?after=..", "invalid_schedule_id"),
        ("/v1/schedules?queue=bad%20name", "invalid_queue_name"),
    ] {
        let (status, answer) = t.s.call("GET", path, Value::Null).await;
        assert_eq!((status, code(&answer)), (400, expected), "{path}: {answer}");
    }
}

/// Concurrent creates share store calls (they are coalesced), yet each request gets its own
/// answer: every id is created once (201) and every other create of it is refused (409), a
/// create into a missing queue fails alone, and each answer describes its own schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_each_get_their_own_answer() {
    let t = Arc::new(Scheduled::start().await);
    t.s.queue("jobs", json!({})).await;
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..300u32 {
        let t = Arc::clone(&t);
        creates.spawn(async move {
            // Ids 0..100, each sent three times (i, i + 100, i + 200: their residues mod 7
            // differ, so at most one of the three names the missing queue).
            let queue = if i % 7 == 6 { "missing" } else { "jobs" };
            let body = json!({
                "id": format!("s-{}", i % 100),
                "queue": queue,
                "every_ms": 1_000 + u64::from(i),
                "payload": {"create": i},
            });
            let (status, value) = t.s.call("POST", "/v1/schedules", body).await;
            (i, status, value)
        });
    }
    let mut created = std::collections::BTreeMap::new();
    while let Some(joined) = creates.join_next().await {
        let (i, status, value) = joined.unwrap();
        match status {
            201 => {
                assert_eq!(value["id"], format!("s-{}", i % 100), "{value}");
                assert_eq!(
                    value["every_ms"],
                    1_000 + u64::from(i),
                    "another create's answer: {value}"
                );
                assert!(
                    created.insert(i % 100, i).is_none(),
                    "s-{} created twice",
                    i % 100
                );
            }
            409 => assert_eq!(code(&value), "schedule_exists", "{value}"),
            404 => {
                assert_eq!(i % 7, 6, "create {i}: {value}");
                assert_eq!(code(&value), "queue_not_found", "{value}");
            }
            other => panic!("create {i}: {other} {value}"),
        }
    }
    // Every id exists, as its one successful create made it.
    assert_eq!(created.len(), 100);
    for (n, i) in created {
        let stored =
            t.s.ok("GET", &format!("/v1/schedules/s-{n}"), Value::Null, 200)
                .await;
        assert_eq!(stored["every_ms"], 1_000 + u64::from(i), "{stored}");
        assert_eq!(stored["payload"], json!({"create": i}), "{stored}");
    }
}

#[tokio::test]
async fn bad_input_is_refused_with_stable_codes_and_nothing_is_stored() {
    let t = Scheduled::start().await;
    t.s.queue("q", json!({})).await;
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            json!({"queue": "q", "cron": "0 9 32 * *"}),
            400,
            "invalid_schedule",
            "field 3 (day of month) \"32\"",
        ),
        (
            json!({"queue": "q", "cron": "0 9 * *"}),
            400,
            "invalid_schedule",
            "has 5 fields",
        ),
        (
            json!({"queue": "q", "cron": "0 9 * * *", "timezone": "Mars/Olympus_Mons"}),
            400,
            "invalid_schedule",
            "Mars/Olympus_Mons",
        ),
        (
            json!({"queue": "q", "every_ms": 999}),
            400,
            "invalid_schedule",
            "at least 1000",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "start_at_ms": T0 + 10, "end_at_ms": T0}),
            400,
            "invalid_schedule",
            "before start_at",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "end_at": "9999-12-31T23:59:59Z"}),
            400,
            "invalid_schedule",
            "after 9999-12-30T22:00:00Z, the latest time belfry takes",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "start_at_ms": u64::MAX}),
            400,
            "invalid_schedule",
            "start_at_ms 18446744073709551615 is after 9999-12-30T22:00:00Z",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "shard_count": 0}),
            400,
            "invalid_schedule",
            "shard_count",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "shard_count": 1001}),
            400,
            "invalid_schedule",
            "shard_count",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "headers": {"Belfry-Shard": "1"}}),
            400,
            "invalid_schedule",
            "set by belfry itself",
        ),
        (json!({"queue": "q"}), 400, "invalid_schedule", "cron"),
        (
            json!({"queue": "q", "every_ms": 1000, "id": "not ok!"}),
            400,
            "invalid_schedule_id",
            "not ok!",
        ),
        (
            json!({"queue": "nowhere", "every_ms": 1000}),
            404,
            "queue_not_found",
            "nowhere",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "misfire": "sometimes"}),
            400,
            "invalid_request",
            "sometimes",
        ),
        (
            json!({"queue": "q", "every_ms": 1000, "color": "blue"}),
            400,
            "invalid_request",
            "color",
        ),
    ];
    for (body, status, expected_code, hint) in cases {
        let (got, answer) = t.s.call("POST", "/v1/schedules", body.clone()).await;
        assert_eq!(
            (got, code(&answer)),
            (status, expected_code),
            "{body}: {answer}"
        );
        assert!(
            message(&answer).contains(hint),
            "{body}: message {:?} should mention {hint:?}",
            message(&answer)
        );
    }
    let (status, answer) = t.s.raw("POST", "/v1/schedules", Some("{".into())).await;
    assert_eq!((status, code(&answer)), (400, "malformed_json"));
    let list = t.s.ok("GET", "/v1/schedules", Value::Null, 200).await;
    assert_eq!(list["schedules"], json!([]), "nothing was stored");

    // Duplicate ids.
    t.create(json!({"id": "once", "queue": "q", "every_ms": 1000}))
        .await;
    let (status, answer) =
        t.s.call(
            "POST",
            "/v1/schedules",
            json!({"id": "once", "queue": "q", "every_ms": 5000}),
        )
        .await;
    assert_eq!((status, code(&answer)), (409, "schedule_exists"));
    let kept = t.s.ok("GET", "/v1/schedules/once", Value::Null, 200).await;
    assert_eq!(kept["every_ms"], 1000, "the first one is unchanged");

    // A bad replacement leaves the schedule as it was.
    let (status, answer) =
        t.s.call(
            "PUT",
            "/v1/schedules/once",
            json!({"queue": "q", "cron": "* * * * * * *"}),
        )
        .await;
    assert_eq!((status, code(&answer)), (400, "invalid_schedule"));
    let (status, answer) =
        t.s.call(
            "PUT",
            "/v1/schedules/once",
            json!({"id": "other", "queue": "q", "every_ms": 2000}),
        )
        .await;
    assert_eq!((status, code(&answer)), (400, "invalid_request"));
    let kept = t.s.ok("GET", "/v1/schedules/once", Value::Null, 200).await;
    assert_eq!(kept["every_ms"], 1000);

    // Path and query checks.
    let (status, answer) = t.s.call("GET", "/v1/schedules/bad%20id", Value::Null).await;
    assert_eq!((status, code(&answer)), (400, "invalid_schedule_id"));
    for query in ["n=0", "n=1001", "n=x", "m=1"] {
        let (status, answer) =
            t.s.call(
                "GET",
                &format!("/v1/schedules/once/next?{query}"),
                Value::Null,
            )
            .await;
        assert_eq!((status, code(&answer)), (400, "invalid_request"), "{query}");
    }
    let (status, answer) =
        t.s.call("GET", "/v1/schedules/once/next?n=1000", Value::Null)
            .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["fire_times"].as_array().unwrap().len(), 1000);
    for query in [
        "step_ms=999",
        "horizon_ms=0",
        "horizon_ms=2678400001&step_ms=3600000",
        "horizon_ms=20000001&step_ms=1000",
        "horizon_ms=x",
    ] {
        let (status, answer) =
            t.s.call(
                "GET",
                &format!("/v1/queues/q/forecast?{query}"),
                Value::Null,
            )
            .await;
        assert_eq!(
            (status, code(&answer)),
            (400, "invalid_request"),
            "{query}: {answer}"
        );
    }
    let (status, answer) =
        t.s.call("GET", "/v1/queues/nowhere/forecast", Value::Null)
            .await;
    assert_eq!((status, code(&answer)), (404, "queue_not_found"));
    t.stop().await;
}

#[tokio::test]
async fn cron_firings_become_tasks_due_at_their_fire_times() {
    let t = Scheduled::start().await;
    t.s.queue("ticks", json!({"max_in_flight": 100})).await;
    t.create(json!({
        "id": "every-minute",
        "queue": "ticks",
        "cron": "* * * * *",
        "payload": {"hello": "world"},
        "headers": {"X-From": "cron"},
    }))
    .await;

    t.advance(MINUTE);
    let first = t.lease_n("ticks", 1).await;
    assert_eq!(first[0]["due_at_ms"], T0 + MINUTE);
    assert_eq!(first[0]["payload"], json!({"hello": "world"}));
    assert_eq!(first[0]["headers"]["X-From"], "cron");
    assert!(first[0]["headers"].get("Belfry-Shard").is_none());

    // Two more minutes in one step: a late tick, not a misfire (within 60 s of the second).
    t.advance(2 * MINUTE);
    let next = t.lease_n("ticks", 2).await;
    let due: Vec<_> = next
        .iter()
        .map(|t| t["due_at_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(due, vec![T0 + 2 * MINUTE, T0 + 3 * MINUTE]);

    let schedule =
        t.s.ok("GET", "/v1/schedules/every-minute", Value::Null, 200)
            .await;
    assert_eq!(schedule["next_fire_at_ms"], T0 + 4 * MINUTE);

    // Paused schedules do not fire, and resuming does not replay the pause.
    t.s.ok("POST", "/v1/schedules/every-minute/pause", Value::Null, 200)
        .await;
    t.advance(10 * MINUTE);
    let resumed =
        t.s.ok(
            "POST",
            "/v1/schedules/every-minute/resume",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(resumed["next_fire_at_ms"], T0 + 14 * MINUTE);
    t.advance(MINUTE);
    let after = t.lease_n("ticks", 1).await;
    assert_eq!(after[0]["due_at_ms"], T0 + 14 * MINUTE);
    assert_eq!(t.pending("ticks").await, 0, "nothing else was created");

    let metrics = t.s.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("belfry_schedule_firings_total{queue=\"ticks\"}")),
        "per-queue firing counter:\n{metrics}"
    );
    t.stop().await;
}

/// The runner stores a firing `schedules.lead` (500 ms by default) before its fire time, so
/// its work is done when the time comes; the task is due at the fire time and is not leased
/// a moment earlier.
#[tokio::test]
async fn a_firing_is_stored_ahead_by_the_lead_and_leased_only_at_its_time() {
    assert_eq!(test_config().schedule_lead_ms, 500, "the default lead");
    let t = Scheduled::start().await;
    t.s.queue("ahead", json!({})).await;
    t.create(json!({"id": "minutely", "queue": "ahead", "cron": "* * * * *"}))
        .await;
    let fire = T0 + MINUTE;

    // 400 ms before the fire time: inside the lead, so the tick stores the firing now.
    t.advance(MINUTE - 400);
    let pending = eventually("the firing stored ahead of its time", || async {
        let n = t.pending("ahead").await;
        (n > 0).then_some(n)
    })
    .await;
    assert_eq!(pending, 1);
    // Never early: nothing to lease until the clock reaches the fire time.
    assert!(t.s.lease("ahead", json!({"max": 10})).await.is_empty());
    // The schedule's cursor moves past the stored firing (the tick writes it right after
    // the firing's task, so a read between the two still sees the old one).
    eventually("the cursor past the stored firing", || async {
        let schedule =
            t.s.ok("GET", "/v1/schedules/minutely", Value::Null, 200)
                .await;
        (schedule["next_fire_at_ms"] == fire + MINUTE).then_some(())
    })
    .await;

    t.advance(400);
    let leased = t.lease_n("ahead", 1).await;
    assert_eq!(leased[0]["due_at_ms"], fire);
    assert_eq!(t.pending("ahead").await, 0, "one firing, not two");
    t.stop().await;
}

#[tokio::test]
async fn sharded_firings_create_one_task_per_shard() {
    let t = Scheduled::start().await;
    t.s.queue("slices", json!({"max_in_flight": 100})).await;
    t.create(
        json!({"id": "sliced", "queue": "slices", "every_ms": 5000, "shard_count": 3,
                    "headers": {"X-Job": "reindex"}}),
    )
    .await;
    t.advance(5000);
    let tasks = t.lease_n("slices", 3).await;
    for (i, task) in tasks.iter().enumerate() {
        assert_eq!(task["due_at_ms"], T0 + 5000);
        assert_eq!(task["headers"]["Belfry-Shard"], i.to_string());
        assert_eq!(task["headers"]["Belfry-Shard-Count"], "3");
        assert_eq!(task["headers"]["X-Job"], "reindex");
    }
    t.stop().await;
}

#[tokio::test]
async fn misfire_policies_after_downtime() {
    let t = Scheduled::start().await;
    for (queue, policy) in [("skip", "skip"), ("once", "fire_once"), ("all", "catch_up")] {
        t.s.queue(queue, json!({"max_in_flight": 1000})).await;
        t.create(json!({"id": queue, "queue": queue, "every_ms": 10_000, "misfire": policy}))
            .await;
    }
    let (store, clock) = t.stop().await;

    // Ten minutes and five seconds of downtime: fire times T0+10 s ... T0+600 s were missed,
    // except the six within the last 60 s (T0+550 s ... T0+600 s).
    clock.advance(Duration::from_millis(10 * MINUTE + 5_000));
    let t = Scheduled::start_on(store, clock).await;
    // The start-up tick has already run: counts need no waiting.
    assert_eq!(t.pending("skip").await, 6);
    assert_eq!(t.pending("once").await, 1);
    assert_eq!(t.pending("all").await, 60);
    // ... and it is in the metrics, misfires counted (counters are per process: at least).
    let metrics = t.s.metrics_text().await;
    let value = |prefix: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(value("belfry_schedule_misfires_total") >= 3.0, "{metrics}");
    assert!(
        value("belfry_schedule_firings_total{queue=\"all\"}") >= 60.0,
        "{metrics}"
    );

    let once = t.lease_n("once", 1).await;
    assert_eq!(once[0]["due_at_ms"], T0 + 600_000, "the latest missed time");
    let skip = t.lease_n("skip", 6).await;
    assert_eq!(skip[0]["due_at_ms"], T0 + 550_000);
    let all = t.lease_n("all", 60).await;
    assert_eq!(all[0]["due_at_ms"], T0 + 10_000);
    assert_eq!(all[59]["due_at_ms"], T0 + 600_000);

    // Then every schedule continues on its rhythm.
    t.advance(5_000);
    for queue in ["skip", "once", "all"] {
        let next = t.lease_n(queue, 1).await;
        assert_eq!(next[0]["due_at_ms"], T0 + 610_000, "{queue}");
    }
    t.stop().await;
}

/// On the engine, reopened from its files: the restart is of storage too, not a new server
/// over the same store object.
#[tokio::test]
async fn restart_does_not_fire_twice() {
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        Arc::new(
            belfry_store::Engine::open(dir.path(), belfry_store::EngineOptions::default())
                .expect("the engine opens: the previous one is closed"),
        )
    };
    let t = Scheduled::start_on(open(), ManualClock::new(T0)).await;
    t.s.queue("q", json!({"max_in_flight": 100})).await;
    t.create(json!({"id": "s", "queue": "q", "every_ms": 10_000}))
        .await;
    t.advance(10_000);
    t.lease_n("q", 1).await;
    let (store, clock) = t.stop().await;
    drop(store);
    let t = Scheduled::start_on(open(), clock).await;
    let list = t.s.ok("GET", "/v1/schedules", Value::Null, 200).await;
    assert_eq!(list["schedules"][0]["next_fire_at_ms"], T0 + 20_000);
    assert_eq!(
        t.pending("q").await,
        0,
        "the start-up tick fired nothing again"
    );
    t.stop().await;
}

#[tokio::test]
async fn forecast_counts_stored_tasks_and_future_firings() {
    let t = Scheduled::start().await;
    t.s.queue("fc", json!({})).await;
    t.s.queue("elsewhere", json!({})).await;
    t.create(json!({"id": "m", "queue": "fc", "every_ms": MINUTE, "shard_count": 2}))
        .await;
    t.create(json!({"id": "x", "queue": "elsewhere", "cron": "* * * * * *"}))
        .await;
    t.create(json!({"id": "p", "queue": "fc", "every_ms": 1000, "paused": true}))
        .await;
    t.s.submit("fc", json!({"delay_ms": 90_000})).await;
    t.s.submit("fc", json!({"delay_ms": 100_000})).await;

    let answer =
        t.s.ok(
            "GET",
            "/v1/queues/fc/forecast?horizon_ms=300000&step_ms=60000",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(answer["queue"], "fc");
    assert_eq!(answer["from_ms"], T0);
    let steps = answer["steps"].as_array().unwrap();
    let column =
        |name: &str| -> Vec<u64> { steps.iter().map(|s| s[name].as_u64().unwrap()).collect() };
    assert_eq!(column("tasks"), vec![0, 2, 0, 0, 0]);
    assert_eq!(column("firings"), vec![0, 2, 2, 2, 2]);
    assert_eq!(column("total"), vec![0, 4, 2, 2, 2]);
    assert_eq!(
        column("start_ms"),
        (0..5).map(|i| T0 + i * MINUTE).collect::<Vec<_>>()
    );

    // Defaults: an hour by minutes.
    let default =
        t.s.ok("GET", "/v1/queues/fc/forecast", Value::Null, 200)
            .await;
    assert_eq!(default["steps"].as_array().unwrap().len(), 60);
    assert_eq!(default["step_ms"], MINUTE);

    // Once fired, a firing is counted as a stored task and no longer as a future firing.
    t.advance(MINUTE);
    eventually("the first firing", || async {
        (t.pending("fc").await == 4).then_some(())
    })
    .await;
    // The tick writes the cursor right after the firing's tasks: until then a forecast
    // counts the firing twice, stored and still to come.
    eventually("the cursor past the first firing", || async {
        let schedule = t.s.ok("GET", "/v1/schedules/m", Value::Null, 200).await;
        (schedule["next_fire_at_ms"] == T0 + 2 * MINUTE).then_some(())
    })
    .await;
    let answer =
        t.s.ok(
            "GET",
            "/v1/queues/fc/forecast?horizon_ms=120000&step_ms=60000",
            Value::Null,
            200,
        )
        .await;
    let steps = answer["steps"].as_array().unwrap();
    // From T0+60 s: the fired tasks (due T0+60 s) and the two submitted ones, then T0+120 s.
    let tasks: Vec<_> = steps.iter().map(|s| s["tasks"].as_u64().unwrap()).collect();
    let firings: Vec<_> = steps
        .iter()
        .map(|s| s["firings"].as_u64().unwrap())
        .collect();
    assert_eq!(tasks, vec![4, 0]);
    assert_eq!(firings, vec![0, 2]);
    t.stop().await;
}

#[tokio::test]
async fn firings_are_created_once_across_an_engine_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        Arc::new(
            belfry_store::Engine::open(dir.path(), belfry_store::EngineOptions::default())
                .expect("the engine opens"),
        )
    };
    let t = Scheduled::start_on(open(), ManualClock::new(T0)).await;
    t.s.queue("q", json!({"max_in_flight": 100})).await;
    t.create(json!({"id": "s", "queue": "q", "every_ms": 10_000, "misfire": "catch_up"}))
        .await;
    t.advance(10_000);
    let first = t.lease_n("q", 1).await;
    assert_eq!(first[0]["due_at_ms"], T0 + 10_000);
    let (store, clock) = t.stop().await;
    drop(store);

    // Thirty seconds down: the firings at 20, 30 and 40 s are due at start-up, and the one at
    // 10 s (finished, its key possibly forgotten by the engine) is not created again.
    clock.advance(Duration::from_millis(30_000));
    let t = Scheduled::start_on(open(), clock).await;
    assert_eq!(t.pending("q").await, 3);
    let due: Vec<_> = t
        .lease_n("q", 3)
        .await
        .iter()
        .map(|task| task["due_at_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(due, vec![T0 + 20_000, T0 + 30_000, T0 + 40_000]);
    let schedule = t.s.ok("GET", "/v1/schedules/s", Value::Null, 200).await;
    assert_eq!(schedule["next_fire_at_ms"], T0 + 50_000);
    t.stop().await;
}

#[tokio::test]
async fn a_schedule_whose_queue_was_deleted_says_so_and_drops_its_firings() {
    let t = Scheduled::start().await;
    t.s.queue("gone", json!({})).await;
    t.create(json!({"id": "orphan", "queue": "gone", "every_ms": 1000}))
        .await;
    let before =
        t.s.ok("GET", "/v1/schedules/orphan", Value::Null, 200)
            .await;
    assert!(before.get("queue_missing").is_none(), "{before}");
    t.s.ok("DELETE", "/v1/queues/gone", Value::Null, 204).await;
    let after =
        t.s.ok("GET", "/v1/schedules/orphan", Value::Null, 200)
            .await;
    assert_eq!(after["queue_missing"], true);
    // Its firings are dropped (counted), and the schedule moves on.
    t.advance(1_000);
    eventually("the firing dropped", || async {
        let text = t.s.metrics_text().await;
        text.lines()
            .any(|l| l.starts_with("belfry_schedule_firings_dropped_total") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    let later =
        t.s.ok("GET", "/v1/schedules/orphan", Value::Null, 200)
            .await;
    assert_eq!(later["next_fire_at_ms"], T0 + 2_000);
    // Recreated, the queue gets firings again.
    t.s.queue("gone", json!({})).await;
    t.advance(1_000);
    eventually("a firing in the recreated queue", || async {
        (t.pending("gone").await == 1).then_some(())
    })
    .await;
    t.stop().await;
}

#[tokio::test]
async fn an_unreadable_stored_schedule_is_reported_not_fatal() {
    let t = Scheduled::start().await;
    t.s.queue("q", json!({})).await;
    t.create(json!({"id": "fine", "queue": "q", "every_ms": 1000}))
        .await;
    t.store
        .put_meta(
            belfry_schedule::SCHEDULES_NAMESPACE,
            "broken",
            bytes::Bytes::from_static(b"not a schedule"),
        )
        .unwrap();
    let (status, answer) = t.s.call("GET", "/v1/schedules/broken", Value::Null).await;
    assert_eq!(
        (status, code(&answer)),
        (500, "schedule_corrupt"),
        "{answer}"
    );
    // The others still list and fire.
    let list = t.s.ok("GET", "/v1/schedules", Value::Null, 200).await;
    assert_eq!(list["schedules"].as_array().map(Vec::len), Some(1));
    t.advance(1000);
    let fired = t.lease_n("q", 1).await;
    assert_eq!(fired[0]["due_at_ms"], T0 + 1000);
    t.stop().await;
}

/// A schedule's payload is bounded like a reminder's content (64 KiB), below the task limit:
/// a schedule is metadata, held in memory and copied into every checkpoint.
#[tokio::test]
async fn a_schedule_payload_is_bounded_below_the_task_limit() {
    let config = belfry_server::ServerConfig {
        payload_bytes_max: 1024 * 1024,
        request_bytes_max: 2 * 1024 * 1024,
        ..test_config()
    };
    let s = TestServer::start_with(config).await;
    s.queue("q", json!({})).await;
    let big = "z".repeat(70 * 1024);
    // As a task it fits.
    s.ok("POST", "/v1/queues/q/tasks", json!({"payload": big}), 201)
        .await;
    let (status, answer) = s
        .call(
            "POST",
            "/v1/schedules",
            json!({"queue": "q", "every_ms": 60_000, "payload": big}),
        )
        .await;
    assert_eq!(
        (status, code(&answer)),
        (413, "payload_too_large"),
        "{answer}"
    );
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("65536"),
        "{answer}"
    );
    let small = "z".repeat(60 * 1024);
    s.ok(
        "POST",
        "/v1/schedules",
        json!({"queue": "q", "every_ms": 60_000, "payload": small}),
        201,
    )
    .await;
}
