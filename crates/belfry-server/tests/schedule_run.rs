//! `POST /v1/schedules/{id}/run`: a schedule fired once by hand, outside its timetable.

#[macro_use]
mod common;

use common::{code, TestServer};
use serde_json::{json, Value};

both_stores!(a_schedule_runs_by_hand_once_per_call_and_keeps_its_timetable);
async fn a_schedule_runs_by_hand_once_per_call_and_keeps_its_timetable(s: TestServer) {
    s.queue("jobs", json!({})).await;
    let body = json!({"id": "nightly", "queue": "jobs", "cron": "0 0 3 * * *",
                      "shard_count": 2, "payload": {"job": "backup"}, "paused": true});
    let created = s.ok("POST", "/v1/schedules", body, 201).await;
    let now = belfry_core::Clock::wall_ms(&s.clock);

    let run = s
        .ok("POST", "/v1/schedules/nightly/run", Value::Null, 201)
        .await;
    assert_eq!(
        (&run["schedule"], &run["queue"], &run["fired_at_ms"]),
        (&json!("nightly"), &json!("jobs"), &json!(now)),
        "{run}"
    );
    let tasks = run["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "one task per shard: {run}");
    assert!(tasks.iter().all(|t| t["duplicate"] == false), "{run}");
    // Due now, with the firing's headers, though the schedule is paused.
    let mut leased = s.lease("jobs", json!({"max": 10})).await;
    leased.sort_by_key(|t| t["headers"]["Belfry-Shard"].as_str().unwrap().to_owned());
    assert_eq!(leased.len(), 2);
    for (shard, task) in leased.iter().enumerate() {
        assert_eq!(task["payload"], json!({"job": "backup"}));
        assert_eq!(task["due_at_ms"], now);
        let headers = &task["headers"];
        assert_eq!(headers["Belfry-Schedule"], "nightly", "{task}");
        assert_eq!(headers["Belfry-Fire-Time"], now.to_string(), "{task}");
        assert_eq!(headers["Belfry-Shard"], shard.to_string(), "{task}");
        assert_eq!(headers["Belfry-Shard-Count"], "2", "{task}");
    }
    // The same millisecond: the same run. A millisecond later: another.
    let again = s
        .ok("POST", "/v1/schedules/nightly/run", Value::Null, 201)
        .await;
    assert_eq!(again["tasks"][0]["id"], tasks[0]["id"]);
    assert_eq!(again["tasks"][0]["duplicate"], true);
    s.advance(1);
    let later = s
        .ok("POST", "/v1/schedules/nightly/run", Value::Null, 201)
        .await;
    assert_eq!(later["tasks"][0]["duplicate"], false);
    assert_ne!(later["tasks"][0]["id"], tasks[0]["id"]);
    // The timetable did not move: still paused, nothing replayed.
    let schedule = s.ok("GET", "/v1/schedules/nightly", Value::Null, 200).await;
    assert_eq!(schedule["paused"], true);
    assert_eq!(schedule.get("next_fire_at"), created.get("next_fire_at"));

    let (status, answer) = s.call("POST", "/v1/schedules/nope/run", Value::Null).await;
    assert_eq!(
        (status, code(&answer)),
        (404, "schedule_not_found"),
        "{answer}"
    );
    s.ok("DELETE", "/v1/queues/jobs", Value::Null, 204).await;
    let (status, answer) = s
        .call("POST", "/v1/schedules/nightly/run", Value::Null)
        .await;
    assert_eq!(
        (status, code(&answer)),
        (404, "queue_not_found"),
        "{answer}"
    );
}
