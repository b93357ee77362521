//! The dead-letter verbs of the real `belfry` binary against a spawned `belfry serve`: get,
//! list, redrive and delete, one task or many, and `--all` with its summary.

use serde_json::Value;

mod common;

use common::cli::{add_and_lease, belfry, fails, json, ok, text};
use common::serve;

#[test]
fn dead_get_list_and_redrive() {
    let server = serve(&["--store", "memory"]);
    ok(
        &server,
        &["queue", "create", "fragile", "--max-attempts", "1"],
    );
    let (id, lease_id) = add_and_lease(&server, "fragile", "30s");
    let out = ok(
        &server,
        &[
            "task",
            "nack",
            "fragile",
            &id,
            &lease_id,
            "--reason",
            "bad input",
        ],
    );
    assert_eq!(
        out.trim(),
        format!("{id} is a dead letter now (out of attempts)")
    );

    let dead = ok(&server, &["dead", "get", "fragile", &id]);
    assert!(
        dead.contains("state:") && dead.contains(" dead\n"),
        "{dead}"
    );
    assert!(dead.contains("dead because:"), "{dead}");
    let listed = ok(&server, &["dead", "list", "fragile"]);
    assert!(
        listed.starts_with("TASK") && listed.contains(&id),
        "{listed}"
    );
    let got = json(&server, &["dead", "get", "fragile", &id]);
    assert_eq!(got["state"], "dead");

    let redriven = json(&server, &["dead", "redrive", "fragile", &id]);
    assert_eq!(
        (&redriven["state"], &redriven["attempts"]),
        (&Value::from("scheduled"), &Value::from(0))
    );
    let not_dead = fails(&server, &["dead", "redrive", "fragile", &id]);
    assert!(not_dead.contains("task_not_dead"), "{not_dead}");
    // Shown, but with a note that it is no dead letter.
    let shown = ok(&server, &["dead", "get", "fragile", &id]);
    assert!(
        shown.contains("note: not a dead letter: the task is scheduled"),
        "{shown}"
    );
    assert!(!dead.contains("note:"), "{dead}");
}

/// `n` dead letters in queue `fragile` (one attempt each, nacked): their ids.
fn dead_letters(server: &common::Served, n: usize) -> Vec<String> {
    ok(
        server,
        &["queue", "create", "fragile", "--max-attempts", "1"],
    );
    for i in 0..n {
        ok(
            server,
            &["task", "add", "fragile", "--payload", &i.to_string()],
        );
    }
    let leased = json(
        server,
        &["task", "lease", "fragile", "--max", &n.to_string()],
    );
    let tasks = leased["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), n, "{leased}");
    for task in tasks {
        let (id, lease) = (text(&task["id"]), text(&task["lease_id"]));
        ok(server, &["task", "nack", "fragile", &id, &lease]);
    }
    let mut ids: Vec<String> = tasks.iter().map(|t| text(&t["id"])).collect();
    ids.sort();
    ids
}

#[test]
fn dead_letters_are_deleted_one_by_one_or_many_at_once() {
    let server = serve(&["--store", "memory"]);
    let ids = dead_letters(&server, 4);
    let out = ok(&server, &["dead", "delete", "fragile", &ids[0]]);
    assert_eq!(
        out.trim(),
        format!("deleted dead letter {} of fragile", ids[0])
    );
    let got = json(&server, &["task", "get", "fragile", &ids[0]]);
    assert_eq!(got["state"], "cancelled");
    let again = fails(&server, &["dead", "delete", "fragile", &ids[0]]);
    assert!(again.contains("task_not_dead"), "{again}");

    // Several ids: one request; what was not a dead letter is listed, not an error.
    let out = ok(
        &server,
        &["dead", "delete", "fragile", &ids[0], &ids[1], &ids[2]],
    );
    assert!(
        out.starts_with("deleted 2 dead letters of fragile; 1 left"),
        "{out}"
    );
    assert!(
        out.contains(&format!("not a dead letter: {} is cancelled", ids[0])),
        "{out}"
    );
    let answer = json(&server, &["dead", "redrive", "fragile", &ids[3], &ids[0]]);
    assert_eq!(answer["redriven"], 1, "{answer}");
    assert_eq!(answer["dead_left"], 0, "{answer}");
    assert_eq!(answer["not_dead"][0]["id"], ids[0].as_str(), "{answer}");

    // Neither ids nor --all, or both: clap says what is wrong.
    let (success, _, stderr) = belfry(&server, &["dead", "delete", "fragile"]);
    assert!(!success && stderr.contains("--all"), "{stderr}");
    let (success, _, stderr) = belfry(&server, &["dead", "delete", "fragile", &ids[0], "--all"]);
    assert!(
        !success && stderr.contains("cannot be used with"),
        "{stderr}"
    );
}

/// Leases queue `fragile` until nothing is pending: its tasks, each found more than 1 ms
/// late, are dead-lettered by their late policy instead of handed out.
fn lease_until_dry(server: &common::Served) {
    for _ in 0..20 {
        let answer = json(server, &["task", "lease", "fragile", "--max", "1000"]);
        assert_eq!(answer["tasks"], serde_json::json!([]), "all late");
        if json(server, &["queue", "get", "fragile"])["pending"] == 0 {
            return;
        }
    }
    panic!("tasks still pending after 20 leases");
}

#[test]
fn all_dead_letters_are_redriven_or_deleted_a_thousand_at_a_time() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "fragile"]);
    // 2,500 tasks that die at their first lease (each is found more than 1 ms late), so that
    // --all needs three requests.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("late.ndjson");
    let line = r#"{"payload": 1, "late_policy": "dead", "late_after_ms": 1}"#;
    std::fs::write(&file, format!("{line}\n").repeat(2_500)).unwrap();
    ok(
        &server,
        &["task", "import", "fragile", file.to_str().unwrap()],
    );
    lease_until_dry(&server);
    let queue = json(&server, &["queue", "get", "fragile"]);
    assert_eq!(queue["dead"], 2_500, "{queue}");

    let out = ok(&server, &["dead", "redrive", "fragile", "--all"]);
    assert_eq!(out.trim(), "redriven 2500 dead letters of fragile; 0 left");
    lease_until_dry(&server);
    let answer = json(&server, &["dead", "delete", "fragile", "--all"]);
    assert_eq!(
        answer,
        serde_json::json!({"deleted": 2_500, "not_dead": [], "not_found": [], "dead_left": 0})
    );
    let queue = json(&server, &["queue", "get", "fragile"]);
    assert_eq!(
        (&queue["dead"], &queue["pending"]),
        (&Value::from(0), &Value::from(0))
    );
}
