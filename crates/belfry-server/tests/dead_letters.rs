//! Dead letters through the API: deleting one, and redriving or deleting many in one call
//! (`DELETE /v1/queues/{queue}/dead/{id}`, `POST …/dead:redrive`, `POST …/dead:delete`).

#[macro_use]
mod common;

use common::{code, eventually, Receiver, TestServer};
use serde_json::{json, Value};

/// A pull queue `q` whose tasks die at their first nack; `n` tasks submitted (the first with
/// idempotency key `k0`), leased and nacked: their ids, in submit order.
async fn dead_letters(s: &TestServer, n: usize) -> Vec<String> {
    s.queue("q", json!({"retry": {"max_attempts": 1}})).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let mut task = json!({"payload": i});
        if i == 0 {
            task["idempotency_key"] = json!("k0");
        }
        ids.push(s.submit("q", task).await);
    }
    for leased in s.lease("q", json!({"max": n})).await {
        let id = leased["id"].as_str().unwrap();
        let nacked = s
            .ok(
                "POST",
                &format!("/v1/queues/q/tasks/{id}/nack"),
                json!({"lease_id": leased["lease_id"]}),
                200,
            )
            .await;
        assert_eq!(nacked["state"], "dead");
    }
    ids
}

both_stores!(one_dead_letter_is_deleted);
async fn one_dead_letter_is_deleted(s: TestServer) {
    let ids = dead_letters(&s, 2).await;
    let path = format!("/v1/queues/q/dead/{}", ids[0]);
    let (status, body) = s.call("DELETE", &path, Value::Null).await;
    assert_eq!(status, 204, "{body}");
    let task = s.task("q", &ids[0]).await;
    assert_eq!(task["state"], "cancelled");
    assert!(task.get("dead_reason").is_none(), "{task}");
    let page = s.ok("GET", "/v1/queues/q/dead", Value::Null, 200).await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["tasks"][0]["id"], ids[1].as_str());

    // Again: no longer a dead letter, and the message says what can be deleted.
    let (status, body) = s.call("DELETE", &path, Value::Null).await;
    assert_eq!((status, code(&body)), (409, "task_not_dead"), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("is cancelled, only dead letters can be deleted"),
        "{message}"
    );
    // A task of another queue is not found here; a malformed id is refused.
    s.queue("other", json!({})).await;
    let elsewhere = s.submit("other", json!({"payload": 1})).await;
    let (status, body) = s
        .call(
            "DELETE",
            &format!("/v1/queues/q/dead/{elsewhere}"),
            Value::Null,
        )
        .await;
    assert_eq!((status, code(&body)), (404, "task_not_found"), "{body}");
    let (status, body) = s
        .call("DELETE", "/v1/queues/q/dead/nope", Value::Null)
        .await;
    assert_eq!((status, code(&body)), (400, "invalid_task_id"), "{body}");
    let (status, body) = s
        .call(
            "DELETE",
            &format!("/v1/queues/gone/dead/{}", ids[1]),
            Value::Null,
        )
        .await;
    assert_eq!((status, code(&body)), (404, "queue_not_found"), "{body}");
}

/// The embedded engine forgets finished tasks' keys at once (the in-memory reference keeps
/// them, which the store contract allows).
#[tokio::test]
async fn a_deleted_dead_letters_key_is_free_again_on_the_engine() {
    let s = TestServer::start_engine().await;
    let ids = dead_letters(&s, 1).await;
    let (status, _) = s
        .call(
            "POST",
            "/v1/queues/q/tasks",
            json!({"payload": 2, "idempotency_key": "k0"}),
        )
        .await;
    assert_eq!(status, 200, "a dead letter holds its key");
    let path = format!("/v1/queues/q/dead/{}", ids[0]);
    assert_eq!(s.call("DELETE", &path, Value::Null).await.0, 204);
    let again = s
        .ok(
            "POST",
            "/v1/queues/q/tasks",
            json!({"payload": 2, "idempotency_key": "k0"}),
            201,
        )
        .await;
    assert_ne!(again["id"], ids[0].as_str(), "{again}");
}

both_stores!(many_dead_letters_are_redriven_and_deleted);
async fn many_dead_letters_are_redriven_and_deleted(s: TestServer) {
    let ids = dead_letters(&s, 5).await;
    let scheduled = s
        .submit("q", json!({"payload": "x", "delay_ms": 60_000}))
        .await;
    s.queue("other", json!({})).await;
    let elsewhere = s.submit("other", json!({"payload": 1})).await;

    // By id: each named task is redriven once; the rest are reported, not errors.
    let answer = s
        .ok(
            "POST",
            "/v1/queues/q/dead:redrive",
            json!({"ids": [ids[1], ids[1], scheduled, elsewhere]}),
            200,
        )
        .await;
    assert_eq!(
        answer,
        json!({
            "redriven": 1,
            "not_dead": [{"id": ids[1], "state": "scheduled"}, {"id": scheduled, "state": "scheduled"}],
            "not_found": [elsewhere],
            "dead_left": 4,
        })
    );
    // The first two in id order (the dead letters 0 and 2) are deleted.
    let answer = s
        .ok("POST", "/v1/queues/q/dead:delete", json!({"limit": 2}), 200)
        .await;
    assert_eq!(
        answer,
        json!({"deleted": 2, "not_dead": [], "not_found": [], "dead_left": 2})
    );
    for id in [&ids[0], &ids[2]] {
        assert_eq!(s.task("q", id).await["state"], "cancelled");
    }
    let answer = s
        .ok(
            "POST",
            "/v1/queues/q/dead:redrive",
            json!({"limit": 1000}),
            200,
        )
        .await;
    assert_eq!(
        (&answer["redriven"], &answer["dead_left"]),
        (&json!(2), &json!(0))
    );
    let page = s.ok("GET", "/v1/queues/q/dead", Value::Null, 200).await;
    assert_eq!(page["tasks"], json!([]));
    // The redriven ones are due now, attempts reset.
    let mut leased: Vec<String> = s
        .lease("q", json!({"max": 10}))
        .await
        .iter()
        .map(|l| {
            assert_eq!(l["attempt"], 1, "{l}");
            l["id"].as_str().unwrap().to_owned()
        })
        .collect();
    leased.sort();
    let mut expected = vec![ids[1].clone(), ids[3].clone(), ids[4].clone()];
    expected.sort();
    assert_eq!(leased, expected);
    // Nothing left to act on: a call is still answered, with nothing done.
    let answer = s
        .ok(
            "POST",
            "/v1/queues/q/dead:delete",
            json!({"limit": 10}),
            200,
        )
        .await;
    assert_eq!(
        (&answer["deleted"], &answer["dead_left"]),
        (&json!(0), &json!(0))
    );
}

both_stores!(bulk_bodies_that_name_nothing_clearly_are_refused);
async fn bulk_bodies_that_name_nothing_clearly_are_refused(s: TestServer) {
    s.queue("q", json!({})).await;
    let too_many: Vec<String> = (0..1001).map(|_| "0".repeat(32)).collect();
    for (body, code_wanted, says) in [
        (json!({}), "invalid_request", "give either ids"),
        (
            json!({"ids": ["a"], "limit": 3}),
            "invalid_request",
            "not both",
        ),
        (json!({"ids": []}), "invalid_request", "between 1 and 1000"),
        (json!({"ids": too_many}), "invalid_request", "got 1001"),
        (json!({"limit": 0}), "invalid_request", "between 1 and 1000"),
        (
            json!({"limit": 1001}),
            "invalid_request",
            "between 1 and 1000",
        ),
        (json!({"ids": ["zz"]}), "invalid_task_id", "ids[0]"),
        (json!({"idz": ["a"]}), "invalid_request", "idz"),
    ] {
        for route in ["dead:redrive", "dead:delete"] {
            let (status, answer) = s
                .call("POST", &format!("/v1/queues/q/{route}"), body.clone())
                .await;
            assert_eq!(
                (status, code(&answer)),
                (400, code_wanted),
                "{body} {answer}"
            );
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{body}: {message}");
        }
    }
    let (status, answer) = s
        .call("POST", "/v1/queues/gone/dead:redrive", json!({"limit": 1}))
        .await;
    assert_eq!(
        (status, code(&answer)),
        (404, "queue_not_found"),
        "{answer}"
    );
}

both_stores!(a_bulk_redrive_wakes_a_push_queue);
async fn a_bulk_redrive_wakes_a_push_queue(s: TestServer) {
    // The receiver refuses the first three calls (each task's only attempt), then accepts.
    let refuse = || (400, vec![]);
    let script = vec![refuse(), refuse(), refuse(), (200, vec![])];
    let receiver = Receiver::start(&s.clock, script).await;
    s.queue(
        "hooks",
        json!({"retry": {"max_attempts": 1},
               "delivery": {"type": "webhook", "url": receiver.url()}}),
    )
    .await;
    for i in 0..3 {
        s.submit("hooks", json!({"payload": i})).await;
    }
    eventually("three dead letters", || async {
        let page = s.ok("GET", "/v1/queues/hooks/dead", Value::Null, 200).await;
        (page["tasks"].as_array().unwrap().len() == 3).then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    let answer = s
        .ok(
            "POST",
            "/v1/queues/hooks/dead:redrive",
            json!({"limit": 3}),
            200,
        )
        .await;
    assert_eq!(answer["redriven"], 3);
    eventually("each delivered again", || async {
        (receiver.count() >= 6).then_some(())
    })
    .await;
    // Woken by the redrive, not found by the idle queue's next look (`EMPTY_RECHECK_MS`,
    // 10 s later): without the wake-up this took 10 s.
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}
