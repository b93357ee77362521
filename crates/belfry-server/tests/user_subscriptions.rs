//! One user across reminders: `GET /v1/users/{user}/subscriptions` lists the reminders they
//! are subscribed to, `DELETE` ends all their subscriptions (and their feed empties at once).

#[macro_use]
mod common;

use common::{code, TestServer};
use serde_json::{json, Value};

const HOUR_MS: u64 = 3_600_000;

both_stores!(a_users_subscriptions_are_listed_and_ended_at_once);
async fn a_users_subscriptions_are_listed_and_ended_at_once(s: TestServer) {
    s.queue("push", json!({})).await;
    for (id, users) in [
        ("r1", ["ann", "bob"]),
        ("r2", ["ann", "cat"]),
        ("r3", ["bob", "cat"]),
    ] {
        let body = json!({"id": id, "queue": "push", "delay_ms": HOUR_MS,
                          "content": {"title": id}});
        s.ok("POST", "/v1/reminders", body, 201).await;
        for user in users {
            let path = format!("/v1/reminders/{id}/subscribers/{user}");
            s.ok("PUT", &path, Value::Null, 201).await;
        }
    }
    let listed = s
        .ok("GET", "/v1/users/ann/subscriptions", Value::Null, 200)
        .await;
    let ids: Vec<&str> = listed["reminders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r1", "r2"], "{listed}");
    assert_eq!(listed["reminders"][1]["content"], json!({"title": "r2"}));
    assert_eq!(
        (&listed["user"], &listed["truncated"]),
        (&json!("ann"), &json!(false))
    );
    // The feed has them, and is cached.
    let feed = s
        .ok("GET", "/v1/users/ann/reminders", Value::Null, 200)
        .await;
    assert_eq!(feed["reminders"].as_array().unwrap().len(), 2);

    let ended = s
        .ok("DELETE", "/v1/users/ann/subscriptions", Value::Null, 200)
        .await;
    assert_eq!(ended, json!({"unsubscribed": 2}));
    let listed = s
        .ok("GET", "/v1/users/ann/subscriptions", Value::Null, 200)
        .await;
    assert_eq!(listed["reminders"], json!([]));
    let feed = s
        .ok("GET", "/v1/users/ann/reminders", Value::Null, 200)
        .await;
    assert_eq!(
        feed["reminders"],
        json!([]),
        "the feed forgot them at once: {feed}"
    );
    // The others keep theirs; the counts moved.
    let count = s
        .ok(
            "GET",
            "/v1/reminders/r1/subscribers/count",
            Value::Null,
            200,
        )
        .await;
    assert_eq!(count["subscribers"], 1);
    let bob = s
        .ok("GET", "/v1/users/bob/subscriptions", Value::Null, 200)
        .await;
    assert_eq!(bob["reminders"].as_array().unwrap().len(), 2);
    // Nothing to end is no error; a malformed user id is.
    let again = s
        .ok("DELETE", "/v1/users/ann/subscriptions", Value::Null, 200)
        .await;
    assert_eq!(again, json!({"unsubscribed": 0}));
    let long = "x".repeat(200);
    let (status, body) = s
        .call(
            "GET",
            &format!("/v1/users/{long}/subscriptions"),
            Value::Null,
        )
        .await;
    assert_eq!((status, code(&body)), (400, "invalid_user_id"), "{body}");
}
