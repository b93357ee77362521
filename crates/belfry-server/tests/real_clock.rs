//! Push delivery on the real clock, with no wake-up at the due time: the dispatcher must
//! wake by its own timers. (Manual-clock tests wake every queue when they move the clock, which
//! once hid a dispatcher that slept through an earlier timer: tasks due in 3 s went out after
//! 10 s.)

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::faults::{RecordingSink, RecordingSinks};
use serde_json::json;

const DUE_IN_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_submitted_ahead_are_delivered_when_due_by_the_dispatchers_own_timers() {
    let dir = tempfile::tempdir().unwrap();
    let engine =
        belfry_store::Engine::open(dir.path(), belfry_store::EngineOptions::default()).unwrap();
    let sink = Arc::new(RecordingSink::default());
    let handle = belfry_server::Server::builder(common::test_config(), Arc::new(engine))
        .sinks(Arc::new(RecordingSinks(sink.clone())))
        .start()
        .await
        .expect("server starts");
    let base = format!("http://{}", handle.local_addr());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let put = http
        .put(format!("{base}/v1/queues/q"))
        .json(&json!({"delivery": {"type": "webhook", "url": "http://127.0.0.1:9/x"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let submitted = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|i| json!({"payload": i, "delay_ms": DUE_IN_MS}))
        .collect();
    let batch = http
        .post(format!("{base}/v1/queues/q/tasks:batch"))
        .json(&json!({ "tasks": tasks }))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 200);
    // Due in 2 s; allow a generous second for a loaded machine, far below the 10 s a
    // dispatcher waiting for its empty-queue recheck would take.
    let deadline = submitted + Duration::from_millis(DUE_IN_MS + 1_500);
    while sink.count() < 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = submitted.elapsed();
    assert_eq!(
        sink.count(),
        100,
        "only {} delivered after {took:?}",
        sink.count()
    );
    for seen in sink.seen() {
        assert!(seen.now_ms >= seen.due_at_ms, "{seen:?} delivered early");
    }
    handle.stop().await.expect("clean stop");
}
