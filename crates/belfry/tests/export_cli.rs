//! `belfry task list` and `belfry task export` of the real binary against spawned servers:
//! an export of one server's queue, imported into another server on another store, makes the
//! same tasks again, payloads byte for byte.

use std::collections::BTreeSet;

mod common;

use common::cli::{belfry, fails, json, ok, text};
use common::{serve, Served};

/// The export's lines, checked to be one JSON object each.
fn lines(ndjson: &str) -> Vec<String> {
    let lines: Vec<String> = ndjson.lines().map(str::to_owned).collect();
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(value.is_object(), "{line}");
    }
    lines
}

/// Imports `body` into `queue` of `server` through `task import`.
fn import(server: &Served, queue: &str, body: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.ndjson");
    std::fs::write(&file, body).unwrap();
    json(server, &["task", "import", queue, file.to_str().unwrap()])
}

#[test]
fn an_export_imported_elsewhere_makes_the_same_tasks() {
    let source = serve(&["--store", "memory"]);
    ok(&source, &["queue", "create", "jobs"]);
    let mut body = String::new();
    for i in 0..2_500 {
        body.push_str(&format!(
            "{{\"payload\": {{\"n\": {i}}}, \"delay_ms\": {}}}\n",
            3_600_000 + i * 1_000
        ));
    }
    body.push_str(concat!(
        r#"{"payload": {"b": 1, "a": 1.50}, "delay_ms": 7200000, "idempotency_key": "order-7", "#,
        r#""headers": {"X-Trace": "t-1"}, "priority": "high", "late_policy": "dead", "#,
        r#""late_after_ms": 5000}"#,
        "\n",
        r#"{"payload_base64": "AAEC/w==", "delay_ms": 86400000}"#,
        "\n",
        r#"{"payload": "leased"}"#,
        "\n",
    ));
    assert_eq!(import(&source, "jobs", &body)["created"], 2_503);
    let leased = json(&source, &["task", "lease", "jobs", "--visibility", "10m"]);
    assert_eq!(leased["tasks"][0]["payload"], "leased");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.ndjson");
    let (success, stdout, stderr) =
        belfry(&source, &["task", "export", "jobs", file.to_str().unwrap()]);
    assert!(success, "{stderr}");
    assert!(stdout.is_empty(), "the tasks go to the file: {stdout}");
    assert!(
        stderr.contains("exported 2503 tasks from jobs (1 of them leased"),
        "{stderr}"
    );
    let exported = std::fs::read_to_string(&file).unwrap();
    let exported_lines = lines(&exported);
    assert_eq!(exported_lines.len(), 2_503);
    // The payload as the producer wrote it, and everything it was submitted with.
    let keyed = exported_lines
        .iter()
        .find(|l| l.contains("order-7"))
        .unwrap();
    assert!(
        keyed.starts_with(r#"{"run_at_ms":"#)
            && keyed.ends_with(concat!(
                r#""payload":{"b": 1, "a": 1.50},"idempotency_key":"order-7","#,
                r#""headers":{"X-Trace":"t-1"},"priority":"high","late_policy":"dead","#,
                r#""late_after_ms":5000}"#
            )),
        "{keyed}"
    );
    assert!(exported.contains(r#""payload_base64":"AAEC/w==""#));

    // Into a server on the embedded store.
    let data = dir.path().join("data");
    let target = serve(&["--data-dir", data.to_str().unwrap()]);
    ok(&target, &["queue", "create", "jobs"]);
    let answer = import(&target, "jobs", &exported);
    assert_eq!(
        (&answer["created"], &answer["refused"]),
        (&2_503.into(), &0.into())
    );
    let keyed = json(&target, &["task", "get", "jobs", "--key", "order-7"]);
    assert_eq!(keyed["priority"], "high");
    assert_eq!(keyed["late_policy"], "dead");
    let raw = ok(
        &target,
        &["task", "get", "jobs", "--key", "order-7", "--json"],
    );
    assert!(raw.contains(r#""payload":{"b": 1, "a": 1.50}"#), "{raw}");

    // The second server's export is the first's (in its own order), but for the task that
    // was leased: it was due in the past, so the import made it due on arrival.
    let (success, again, stderr) = belfry(&target, &["task", "export", "jobs"]);
    assert!(success, "{stderr}");
    assert!(stderr.contains("exported 2503 tasks from jobs"), "{stderr}");
    let unleased = |lines: Vec<String>| -> BTreeSet<String> {
        lines
            .into_iter()
            .filter(|l| !l.contains("\"leased\""))
            .collect()
    };
    let first = unleased(exported_lines);
    assert_eq!(first.len(), 2_502);
    assert_eq!(unleased(lines(&again)), first);
}

#[test]
fn a_task_target_is_exported_whole_and_listing_pages() {
    let server = serve(&["--store", "memory"]);
    ok(
        &server,
        &[
            "queue",
            "create",
            "hook",
            "--webhook",
            "http://93.184.216.34/x",
        ],
    );
    let target = "http://93.184.216.34/own?token=abc";
    let added = json(
        &server,
        &[
            "task",
            "add",
            "hook",
            "--payload",
            "1",
            "--delay",
            "1h",
            "--target",
            target,
        ],
    );
    let id = text(&added["id"]);
    for n in 2..=3 {
        let payload = n.to_string();
        ok(
            &server,
            &[
                "task",
                "add",
                "hook",
                "--payload",
                &payload,
                "--delay",
                "2h",
            ],
        );
    }
    // Listed without the target's query string, exported with it.
    let page = json(&server, &["task", "list", "hook", "--limit", "2"]);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 2);
    let shown = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.as_str());
    assert_eq!(
        shown.unwrap()["target"],
        "http://93.184.216.34/own?<redacted>"
    );
    let next = text(&page["next_after"]);
    let rest = json(
        &server,
        &["task", "list", "hook", "--after", &next, "--limit", "2"],
    );
    assert_eq!(rest["tasks"].as_array().unwrap().len(), 1);
    assert!(rest.get("next_after").is_none(), "{rest}");
    let table = ok(&server, &["task", "list", "hook", "--limit", "2"]);
    assert!(
        table.starts_with("TASK") && table.contains("scheduled"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "more: belfry task list hook --after {next} --limit 2"
        )),
        "{table}"
    );
    let (success, exported, _) = belfry(&server, &["task", "export", "hook", "-"]);
    assert!(success);
    assert!(
        exported.contains(&format!("\"target\":\"{target}\"")),
        "{exported}"
    );

    let empty = ok(&server, &["queue", "create", "empty"]);
    assert!(!empty.is_empty());
    let none = ok(&server, &["task", "list", "empty"]);
    assert_eq!(none.trim(), "no scheduled or leased tasks in empty");
    let unknown = fails(&server, &["task", "export", "nope"]);
    assert!(unknown.contains("queue_not_found"), "{unknown}");
}

/// `task cancel` with several ids, keys, or a file of ids from `task list`: the bulk route,
/// every outcome listed, and a failure when any task was not cancelled.
#[test]
fn many_tasks_cancelled_by_ids_keys_and_a_file() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "jobs"]);
    let mut body = String::new();
    for i in 0..2_100 {
        body.push_str(&format!(
            "{{\"payload\": {i}, \"delay_ms\": 3600000, \"idempotency_key\": \"k{i}\"}}\n"
        ));
    }
    assert_eq!(import(&server, "jobs", &body)["created"], 2_100);
    let page = json(&server, &["task", "list", "jobs", "--limit", "3"]);
    let ids: Vec<String> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| text(&t["id"]))
        .collect();

    let out = ok(&server, &["task", "cancel", "jobs", &ids[0], &ids[1]]);
    assert_eq!(out.trim(), "cancelled 2");
    // One already cancelled: listed, and the command fails after printing.
    let (success, out, err) = belfry(&server, &["task", "cancel", "jobs", &ids[1], &ids[2]]);
    assert!(!success);
    assert!(out.starts_with("cancelled 1"), "{out}");
    assert!(
        out.contains(&format!("{} not cancelled: it is cancelled", ids[1])),
        "{out}"
    );
    assert!(err.contains("1 of 2 tasks not cancelled"), "{err}");
    let (success, out, _) = belfry(
        &server,
        &[
            "task", "cancel", "jobs", "--key", "k100", "--key", "nope", "--json",
        ],
    );
    assert!(!success, "one key names no task");
    let by_key: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(by_key["cancelled"], 1, "{by_key}");
    assert!(
        by_key["not_found"]
            .as_array()
            .unwrap()
            .contains(&"nope".into()),
        "{by_key}"
    );

    // Every id of the queue, from a file of what `task list` printed: three requests.
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["task", "list", "jobs", "--limit", "1000"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let page = json(&server, &args);
        all.extend(
            page["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| text(&t["id"])),
        );
        match page.get("next_after") {
            Some(next) => after = Some(text(next)),
            None => break,
        }
    }
    assert_eq!(all.len(), 2_100 - 4);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ids.txt");
    std::fs::write(&file, all.join("\n") + "\n\n").unwrap();
    let out = ok(
        &server,
        &[
            "task",
            "cancel",
            "jobs",
            "--ids-file",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out.trim(), "cancelled 2096");
    let none = ok(&server, &["task", "list", "jobs"]);
    assert_eq!(none.trim(), "no scheduled or leased tasks in jobs");
    let unknown = fails(&server, &["task", "cancel", "nope", &ids[0], &ids[1]]);
    assert!(unknown.contains("queue_not_found"), "{unknown}");

    // A file is checked whole before anything is sent: a bad line cancels nothing. A
    // byte-order mark and CRLF line ends are no part of an id.
    let fresh: Vec<String> = (0..2)
        .map(|i| {
            let added = json(
                &server,
                &[
                    "task",
                    "add",
                    "jobs",
                    "--delay",
                    "1h",
                    "--payload",
                    &i.to_string(),
                ],
            );
            text(&added["id"])
        })
        .collect();
    std::fs::write(
        &file,
        format!("{}\r\nnot-an-id\r\n{}\r\n", fresh[0], fresh[1]),
    )
    .unwrap();
    let args = [
        "task",
        "cancel",
        "jobs",
        "--ids-file",
        file.to_str().unwrap(),
    ];
    let bad = fails(&server, &args);
    assert!(bad.contains("line 2") && bad.contains("not-an-id"), "{bad}");
    assert_eq!(
        json(&server, &["task", "list", "jobs"])["tasks"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    std::fs::write(&file, format!("\u{feff}{}\r\n{}\r\n", fresh[0], fresh[1])).unwrap();
    assert_eq!(ok(&server, &args).trim(), "cancelled 2");
}

/// A task without a payload (`null`) is exported like any other; a schedule's firing is left
/// out (its schedule makes it), and said so; an export that fails leaves an earlier file of
/// its name as it was, and no partial one.
#[test]
fn null_payloads_firings_and_a_failed_export() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "jobs"]);
    ok(&server, &["task", "add", "jobs", "--delay", "1h"]);
    ok(
        &server,
        &[
            "schedule", "create", "jobs", "--every", "1h", "--id", "hourly", "--paused",
        ],
    );
    ok(&server, &["schedule", "run", "hourly"]);
    let listed = json(&server, &["task", "list", "jobs"]);
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 2, "{listed}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.ndjson");
    let path = file.to_str().unwrap();
    let (success, _, stderr) = belfry(&server, &["task", "export", "jobs", path]);
    assert!(success, "{stderr}");
    assert!(
        stderr.contains("exported 1 tasks from jobs; left out 1 schedule firings"),
        "{stderr}"
    );
    let exported = std::fs::read_to_string(&file).unwrap();
    assert_eq!(lines(&exported).len(), 1);
    assert!(exported.contains(r#""payload":null"#), "{exported}");
    // It imports back.
    let answer = import(&server, "jobs", &exported);
    assert_eq!(answer["created"], 1, "{answer}");

    // A failed export keeps the earlier file whole.
    let (success, _, stderr) = belfry(&server, &["task", "export", "nope", path]);
    assert!(!success);
    assert!(stderr.contains("queue_not_found"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), exported);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no partial file left: {names:?}");
}
