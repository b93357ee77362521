//! `belfry schedule ...` against a spawned `belfry serve`, and a schedule firing on the real
//! clock through the real binary (the runner `serve` starts).

use std::time::{Duration, Instant};

use belfry_client::{Client, LeaseRequest};

mod common;

use common::cli::{belfry, json, ok};
use common::{serve, Served};

/// How long the test waits for an every-second schedule to fire on the real clock.
const FIRE_DEADLINE: Duration = Duration::from_secs(30);

fn serve_in_memory() -> Served {
    serve(&["--store", "memory"])
}

#[test]
fn schedule_subcommands_against_a_running_server() {
    let server = serve_in_memory();
    ok(&server, &["queue", "create", "jobs"]);

    let created = ok(
        &server,
        &[
            "schedule",
            "create",
            "jobs",
            "--id",
            "nightly",
            "--cron",
            "30 2 * * *",
            "--timezone",
            "Europe/Paris",
            "--payload",
            r#"{"job": "backup"}"#,
            "--shards",
            "2",
        ],
    );
    assert!(
        created.contains("nightly -> jobs: cron \"30 2 * * *\" in Europe/Paris, 2 shards"),
        "{created}"
    );
    assert!(
        created.contains("[Europe/Paris]"),
        "local next time: {created}"
    );

    let every = json(
        &server,
        &[
            "schedule", "create", "jobs", "--every", "90s", "--id", "often", "--paused",
        ],
    );
    assert_eq!(every["every_ms"], 90_000);
    assert_eq!(every["paused"], true);

    let listed = ok(&server, &["schedule", "list"]);
    assert!(listed.contains("nightly -> jobs"), "{listed}");
    assert!(listed.contains("often -> jobs: every 1m 30s"), "{listed}");
    let listed = json(&server, &["schedule", "list"]);
    let ids: Vec<_> = listed["schedules"]
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|s| s["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids, vec!["nightly", "often"]);

    let got = json(&server, &["schedule", "get", "nightly"]);
    assert_eq!(got["payload"], serde_json::json!({"job": "backup"}));
    assert_eq!(got["shard_count"], 2);

    let next = json(&server, &["schedule", "next", "nightly", "-n", "3"]);
    let times = next["fire_times"].as_array().expect("fire times");
    assert_eq!(times.len(), 3);
    for t in times {
        let local = t["local"].as_str().unwrap_or_default();
        assert!(local.contains("T02:30:00+0"), "{local}");
        assert!(local.ends_with("[Europe/Paris]"), "{local}");
    }
    let human = ok(&server, &["schedule", "next", "nightly", "--count", "2"]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two fire times: {human}");
    assert!(lines[0].starts_with("FIRES AT"), "{human}");
    assert!(lines[1].ends_with("[Europe/Paris]"), "{human}");

    let paused = json(&server, &["schedule", "pause", "nightly"]);
    assert_eq!(paused["paused"], true);
    let resumed = ok(&server, &["schedule", "resume", "often"]);
    assert!(resumed.contains("next "), "{resumed}");

    let forecast = json(
        &server,
        &[
            "schedule",
            "forecast",
            "jobs",
            "--horizon",
            "10m",
            "--step",
            "5m",
        ],
    );
    let totals: Vec<_> = forecast["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["firings"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(totals.len(), 2);
    // `often` fires every 90 s from its resume: three or four times in each 5 minutes.
    assert!(totals.iter().all(|n| (3..=4).contains(n)), "{totals:?}");

    // Replace: the whole definition, named by its id; what is left out takes its default.
    let replaced = json(
        &server,
        &[
            "schedule",
            "replace",
            "nightly",
            "jobs",
            "--cron",
            "0 0 23 L * *",
            "--timezone",
            "Europe/Berlin",
        ],
    );
    assert_eq!(replaced["id"], "nightly");
    assert_eq!(replaced["cron"], "0 0 23 L * *");
    assert_eq!(replaced["shard_count"], 1, "{replaced}");
    assert_eq!(
        replaced["paused"], false,
        "a replacement is active: {replaced}"
    );
    let local = replaced["next_fire_local"].as_str().unwrap_or_default();
    assert!(
        local.contains("T23:00:00+0") && local.ends_with("[Europe/Berlin]"),
        "{local}"
    );
    let (success, _, stderr) = belfry(
        &server,
        &["schedule", "replace", "nope", "jobs", "--every", "1m"],
    );
    assert!(
        !success && stderr.contains("schedule_not_found"),
        "{stderr}"
    );

    // Run by hand: one task per shard, due now, the schedule untouched.
    let out = ok(&server, &["schedule", "run", "nightly"]);
    assert!(out.starts_with("ran nightly into jobs: "), "{out}");
    assert_eq!(out.trim().split(' ').count(), 5, "one task id: {out}");
    let queue = json(&server, &["queue", "get", "jobs"]);
    assert_eq!(queue["pending"], 1, "{queue}");

    ok(&server, &["schedule", "delete", "nightly"]);
    let (success, _, stderr) = belfry(&server, &["schedule", "get", "nightly"]);
    assert!(!success);
    assert!(stderr.contains("schedule_not_found"), "{stderr}");

    // Bad input: the server's message reaches the user, naming the field.
    let (success, _, stderr) = belfry(
        &server,
        &["schedule", "create", "jobs", "--cron", "0 25 * * *"],
    );
    assert!(!success);
    assert!(stderr.contains("invalid_schedule"), "{stderr}");
    assert!(stderr.contains("field 2 (hour)"), "{stderr}");
    let (success, _, stderr) = belfry(&server, &["schedule", "create", "jobs"]);
    assert!(!success, "a rule is required");
    assert!(stderr.contains("--cron"), "{stderr}");
}

#[tokio::test]
async fn a_schedule_fires_on_the_real_clock_in_a_served_binary() {
    let server = serve_in_memory();
    ok(&server, &["queue", "create", "ticks"]);
    let created = json(
        &server,
        &[
            "schedule", "create", "ticks", "--every", "1s", "--id", "second",
        ],
    );
    let first_fire = created["next_fire_at_ms"]
        .as_u64()
        .expect("a next fire time");
    let client = Client::new(&server.url).expect("client");
    let deadline = Instant::now() + FIRE_DEADLINE;
    let leased = loop {
        let leased = client
            .lease(
                "ticks",
                &LeaseRequest {
                    max: Some(1),
                    visibility_ms: None,
                    wait_ms: Some(1_000),
                },
            )
            .await
            .expect("lease");
        if !leased.is_empty() {
            break leased;
        }
        assert!(Instant::now() < deadline, "the schedule never fired");
    };
    assert_eq!(leased[0].due_at_ms, first_fire);
    assert!(leased[0].lease_until_ms > first_fire);
}
