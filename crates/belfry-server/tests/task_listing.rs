//! `GET /v1/queues/{queue}/tasks`: a queue's scheduled and leased tasks, a page at a time.

#[macro_use]
mod common;

use std::collections::BTreeSet;

use common::{code, Receiver, TestServer};
use serde_json::{json, Value};

/// Every page of the queue's listing with `query` (`limit=…&…`), checking `next_after`.
async fn walk(s: &TestServer, queue: &str, query: &str) -> Vec<Value> {
    let mut tasks = Vec::new();
    let mut after = String::new();
    loop {
        let path = format!("/v1/queues/{queue}/tasks?{query}{after}");
        let page = s.ok("GET", &path, Value::Null, 200).await;
        let got = page["tasks"].as_array().unwrap().clone();
        tasks.extend(got.iter().cloned());
        match page.get("next_after") {
            Some(next) => after = format!("&after={}", next.as_str().unwrap()),
            None => return tasks,
        }
    }
}

both_stores!(live_tasks_are_listed_a_page_at_a_time);
async fn live_tasks_are_listed_a_page_at_a_time(s: TestServer) {
    s.queue("q", json!({"retry": {"max_attempts": 1}})).await;
    let mut live = BTreeSet::new();
    for i in 0..5 {
        let task = json!({"payload": {"n": i}, "delay_ms": 60_000 * (i + 1)});
        live.insert(s.submit("q", task).await);
    }
    let keyed = json!({"payload": "keyed", "idempotency_key": "order-7",
        "headers": {"X-Trace": "t-1"}, "priority": "high"});
    let keyed = s.submit("q", keyed).await;
    let acked = s.submit("q", json!({"payload": "acked"})).await;
    let dead = s.submit("q", json!({"payload": "dead"})).await;
    let mut lease_until = None;
    for task in s.lease("q", json!({"max": 3})).await {
        let id = task["id"].as_str().unwrap();
        let lease = json!({"lease_id": task["lease_id"]});
        if id == acked {
            let path = format!("/v1/queues/q/tasks/{id}/ack");
            s.ok("POST", &path, lease, 200).await;
        } else if id == dead {
            let path = format!("/v1/queues/q/tasks/{id}/nack");
            s.ok("POST", &path, lease, 200).await;
        } else {
            assert_eq!(id, keyed);
            lease_until = Some(task["lease_until_ms"].clone());
        }
    }
    live.insert(keyed.clone());

    let all = walk(&s, "q", "limit=2").await;
    let ids: Vec<&str> = all.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), live.len(), "each once: {ids:?}");
    assert_eq!(
        ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
        live
    );
    let leased = all.iter().find(|t| t["id"] == keyed.as_str()).unwrap();
    assert_eq!(leased["state"], "leased");
    assert_eq!(leased["lease_until_ms"], lease_until.unwrap());
    assert_eq!(leased["payload"], "keyed");
    assert_eq!(leased["idempotency_key"], "order-7");
    assert_eq!(leased["headers"], json!({"X-Trace": "t-1"}));
    assert_eq!(leased["priority"], "high");
    assert!(all
        .iter()
        .all(|t| t["state"] == "scheduled" || t["id"] == keyed.as_str()));

    // One page of all of them; without payloads on request.
    let page = s.ok(
        "GET",
        "/v1/queues/q/tasks?limit=1000&payload=false",
        Value::Null,
        200,
    );
    let page = page.await;
    assert!(page.get("next_after").is_none(), "{page}");
    let tasks = page["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), live.len());
    assert!(tasks.iter().all(|t| t.get("payload").is_none()), "{page}");
    // The default page is 100.
    let page = s.ok("GET", "/v1/queues/q/tasks", Value::Null, 200).await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), live.len());
}

both_stores!(a_listing_shows_a_task_target_whole_only_when_asked);
async fn a_listing_shows_a_task_target_whole_only_when_asked(s: TestServer) {
    let receiver = Receiver::start(&s.clock, vec![]).await;
    let delivery = json!({"type": "webhook", "url": receiver.url()});
    s.queue("hooks", json!({ "delivery": delivery })).await;
    let target = format!("{}?token=abc", receiver.url());
    let task = json!({"payload": 1, "target": target, "delay_ms": 60_000});
    s.submit("hooks", task).await;

    let page = s
        .ok("GET", "/v1/queues/hooks/tasks", Value::Null, 200)
        .await;
    let shown = &page["tasks"][0]["target"];
    assert_eq!(shown, &json!(format!("{}?<redacted>", receiver.url())));
    let path = "/v1/queues/hooks/tasks?full_target=true";
    let page = s.ok("GET", path, Value::Null, 200).await;
    assert_eq!(page["tasks"][0]["target"], json!(target));
}

both_stores!(bad_listing_queries_are_refused);
async fn bad_listing_queries_are_refused(s: TestServer) {
    s.queue("q", json!({})).await;
    for (query, status, expected) in [
        ("limit=0", 400, "invalid_request"),
        ("limit=1001", 400, "invalid_request"),
        ("limit=ten", 400, "invalid_request"),
        ("after=nope", 400, "invalid_task_id"),
        ("colour=red", 400, "invalid_request"),
    ] {
        let path = format!("/v1/queues/q/tasks?{query}");
        let (got, body) = s.call("GET", &path, Value::Null).await;
        assert_eq!((got, code(&body)), (status, expected), "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty(), "{query}: {body}");
    }
    let (got, body) = s.call("GET", "/v1/queues/gone/tasks", Value::Null).await;
    assert_eq!((got, code(&body)), (404, "queue_not_found"), "{body}");
}
