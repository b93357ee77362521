//! `POST /v1/queues/{queue}/tasks:cancel`: many scheduled tasks cancelled in one call, by id
//! or by idempotency key; the rest reported, not failed.

#[macro_use]
mod common;

use common::{code, eventually, Receiver, TestServer};
use serde_json::{json, Value};

both_stores!(tasks_cancelled_by_id_and_by_key);
async fn tasks_cancelled_by_id_and_by_key(s: TestServer) {
    s.queue("q", json!({})).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let task = json!({"payload": i, "delay_ms": 60_000, "idempotency_key": format!("k{i}")});
        ids.push(s.submit("q", task).await);
    }
    let leased = s.submit("q", json!({"payload": "leased"})).await;
    assert_eq!(s.lease("q", json!({"max": 1})).await.len(), 1);
    let unknown = "00000000000000000000000000000001";

    let body = json!({"ids": [ids[0], ids[1], leased, ids[0], unknown]});
    let answer = s.ok("POST", "/v1/queues/q/tasks:cancel", body, 200).await;
    assert_eq!(
        answer,
        json!({
            "cancelled": 2,
            "not_scheduled": [
                {"id": leased, "state": "leased"},
                {"id": ids[0], "state": "cancelled"},
            ],
            "not_found": [unknown],
        })
    );
    let body = json!({"keys": ["k2", "k3", "nope", "k0"]});
    let answer = s.ok("POST", "/v1/queues/q/tasks:cancel", body, 200).await;
    assert_eq!(answer["cancelled"], 2, "{answer}");
    // k0's task was cancelled by the first call: a store may have forgotten its key (not
    // found) or still know it (not scheduled); either way nothing more is cancelled.
    let forgotten =
        answer["not_found"] == json!(["nope", "k0"]) && answer["not_scheduled"] == json!([]);
    let known = answer["not_found"] == json!(["nope"])
        && answer["not_scheduled"] == json!([{"id": ids[0], "key": "k0", "state": "cancelled"}]);
    assert!(forgotten || known, "{answer}");
    for id in &ids {
        let task = s
            .ok("GET", &format!("/v1/queues/q/tasks/{id}"), Value::Null, 200)
            .await;
        assert_eq!(task["state"], "cancelled", "{task}");
    }
    let queue = s.ok("GET", "/v1/queues/q", Value::Null, 200).await;
    assert_eq!(
        (&queue["pending"], &queue["in_flight"]),
        (&json!(0), &json!(1))
    );
}

both_stores!(a_push_queue_delivers_none_of_the_cancelled);
async fn a_push_queue_delivers_none_of_the_cancelled(s: TestServer) {
    let receiver = Receiver::start(&s.clock, vec![]).await;
    let delivery = json!({"type": "webhook", "url": receiver.url()});
    s.queue("hooks", json!({ "delivery": delivery })).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(
            s.submit("hooks", json!({"payload": i, "delay_ms": 10_000}))
                .await,
        );
    }
    let body = json!({ "ids": ids[..9] });
    let answer = s
        .ok("POST", "/v1/queues/hooks/tasks:cancel", body, 200)
        .await;
    assert_eq!(answer["cancelled"], 9, "{answer}");
    s.advance(20_000);
    eventually("the one left delivered", || async {
        (receiver.count() >= 1).then_some(())
    })
    .await;
    // All ten were due together and go out in submit order: a cancelled one delivered would
    // have come first.
    let received = receiver.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, b"9");
}

both_stores!(bad_bulk_cancels_are_refused);
async fn bad_bulk_cancels_are_refused(s: TestServer) {
    s.queue("q", json!({})).await;
    let many: Vec<String> = (0..1_001).map(|i| format!("k{i}")).collect();
    let long_key = "k".repeat(2_000);
    for (body, expected) in [
        (json!({}), "invalid_request"),
        (json!({"ids": []}), "invalid_request"),
        (json!({"keys": many}), "invalid_request"),
        (json!({"ids": ["x"], "keys": ["k"]}), "invalid_request"),
        (json!({"ids": ["not-an-id"]}), "invalid_task_id"),
        (json!({"keys": [long_key]}), "invalid_request"),
        (json!({"ids": "x"}), "invalid_request"),
        (json!({"limit": 5}), "invalid_request"),
    ] {
        let (status, answer) = s
            .call("POST", "/v1/queues/q/tasks:cancel", body.clone())
            .await;
        assert_eq!((status, code(&answer)), (400, expected), "{body}: {answer}");
    }
    let body = json!({"ids": ["00000000000000000000000000000001"]});
    let (status, answer) = s.call("POST", "/v1/queues/gone/tasks:cancel", body).await;
    assert_eq!(
        (status, code(&answer)),
        (404, "queue_not_found"),
        "{answer}"
    );
}
