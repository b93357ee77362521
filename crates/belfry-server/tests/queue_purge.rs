//! `POST /v1/queues/{queue}/purge`: every task of the queue goes — scheduled, leased, dead —
//! and the queue stays, with its settings.

#[macro_use]
mod common;

use common::{code, eventually, Receiver, TestServer};
use serde_json::{json, Value};

both_stores!(a_purge_drops_every_task_and_keeps_the_queue);
async fn a_purge_drops_every_task_and_keeps_the_queue(s: TestServer) {
    let config = json!({"rate_per_s": 50, "retry": {"max_attempts": 1}});
    s.queue("q", config).await;
    let leased = s.submit("q", json!({"payload": "leased"})).await;
    let dead = s.submit("q", json!({"payload": "dead"})).await;
    let mut lease = None;
    for task in s.lease("q", json!({"max": 2})).await {
        if task["id"] == dead.as_str() {
            let path = format!("/v1/queues/q/tasks/{dead}/nack");
            s.ok("POST", &path, json!({"lease_id": task["lease_id"]}), 200)
                .await;
        } else {
            lease = Some(task["lease_id"].clone());
        }
    }
    let later = json!({"payload": "later", "delay_ms": 60_000, "idempotency_key": "k1"});
    let scheduled = s.submit("q", later.clone()).await;

    let answer = s.ok("POST", "/v1/queues/q/purge", Value::Null, 200).await;
    assert_eq!(
        answer,
        json!({"purged": {"pending": 1, "in_flight": 1, "dead": 1}})
    );
    let queue = s.ok("GET", "/v1/queues/q", Value::Null, 200).await;
    assert_eq!(
        (&queue["pending"], &queue["in_flight"], &queue["dead"]),
        (&json!(0), &json!(0), &json!(0)),
        "{queue}"
    );
    assert_eq!(queue["rate_per_s"], 50.0, "the settings stay: {queue}");
    for id in [&leased, &dead, &scheduled] {
        let (status, body) = s
            .call("GET", &format!("/v1/queues/q/tasks/{id}"), Value::Null)
            .await;
        assert_eq!((status, code(&body)), (404, "task_not_found"), "{body}");
    }
    // The lease taken before holds nothing; the purged task's key is free.
    let path = format!("/v1/queues/q/tasks/{leased}/ack");
    let (status, body) = s.call("POST", &path, json!({"lease_id": lease})).await;
    assert_eq!((status, code(&body)), (404, "task_not_found"), "{body}");
    let again = s.ok("POST", "/v1/queues/q/tasks", later, 201).await;
    assert_ne!(again["id"], scheduled.as_str());

    let (status, body) = s.call("POST", "/v1/queues/gone/purge", Value::Null).await;
    assert_eq!((status, code(&body)), (404, "queue_not_found"), "{body}");
}

both_stores!(a_purged_push_queue_delivers_nothing_it_held);
async fn a_purged_push_queue_delivers_nothing_it_held(s: TestServer) {
    let receiver = Receiver::start(&s.clock, vec![]).await;
    let delivery = json!({"type": "webhook", "url": receiver.url()});
    s.queue("hooks", json!({ "delivery": delivery })).await;
    for i in 0..5 {
        s.submit("hooks", json!({"payload": i, "delay_ms": 10_000}))
            .await;
    }
    s.ok("POST", "/v1/queues/hooks/purge", Value::Null, 200)
        .await;
    s.submit("hooks", json!({"payload": "after", "delay_ms": 10_000}))
        .await;
    s.advance(20_000);
    eventually("the task submitted after the purge", || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;
    // Delivered in due order, and the purged ones were due with it: had they survived, they
    // would have come first.
    let received = receiver.received();
    assert_eq!(received.len(), 1, "only the task put after the purge");
    assert_eq!(received[0].body, b"\"after\"");
}

both_stores!(a_purge_frees_the_in_flight_cap);
/// A purge frees a pull queue's in-flight cap at once: the purged leases hold no slot (before,
/// new tasks waited until the purged leases' visibility ran out).
async fn a_purge_frees_the_in_flight_cap(s: TestServer) {
    s.queue("capped", json!({"max_in_flight": 3})).await;
    for _ in 0..3 {
        s.submit("capped", json!({"payload": 1})).await;
    }
    let held = s
        .lease("capped", json!({"max": 10, "visibility_ms": 600_000}))
        .await;
    assert_eq!(held.len(), 3);
    s.ok("POST", "/v1/queues/capped/purge", Value::Null, 200)
        .await;
    for _ in 0..3 {
        s.submit("capped", json!({"payload": 2})).await;
    }
    let leased = s.lease("capped", json!({"max": 10})).await;
    assert_eq!(leased.len(), 3, "the cap is free after the purge");
}
