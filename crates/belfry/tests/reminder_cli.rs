//! `belfry reminder ...` and `belfry feed` end to end: the real binary against a spawned
//! `belfry serve`, subscribers streamed from a file (and stdin) through the bulk endpoint.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;

use common::{serve, Served, BIN};

/// Runs `belfry ARGS --server URL` with `stdin` on its standard input.
fn run(server: &Served, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .args(["--server", &server.url])
        .env_remove("BELFRY_SERVER")
        .env_remove("BELFRY_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run belfry");
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("belfry finishes")
}

/// Runs `belfry ARGS`; returns (exit code, stdout, stderr).
fn belfry(server: &Served, args: &[&str]) -> (Option<i32>, String, String) {
    let out = run(server, args, b"");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(server: &Served, args: &[&str]) -> String {
    let (code, stdout, stderr) = belfry(server, args);
    assert_eq!(code, Some(0), "belfry {args:?} failed: {stderr}");
    stdout
}

fn json(server: &Served, args: &[&str]) -> Value {
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let stdout = ok(server, &with_json);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

/// Runs a command that must fail as an API error: exit code 1, the code in stderr.
fn fails_with(server: &Served, args: &[&str], code: &str) -> String {
    let (exit, _, stderr) = belfry(server, args);
    assert_eq!(exit, Some(1), "belfry {args:?}: {stderr}");
    assert!(stderr.contains(code), "belfry {args:?}: {stderr}");
    stderr
}

#[test]
fn reminders_subscribers_and_the_feed_from_the_command_line() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "push"]);
    let dir = tempfile::tempdir().expect("temp dir");

    let created = ok(
        &server,
        &[
            "reminder",
            "create",
            "kickoff",
            "--queue",
            "push",
            "--in",
            "1h",
            "--content",
            r#"{"title": "Kick-off"}"#,
            "--urgent",
            "--chunk-size",
            "100",
            "--users-per-second",
            "500",
        ],
    );
    assert!(created.contains("reminder:    kickoff"), "{created}");
    assert!(created.contains("priority:    urgent"), "{created}");
    // The hint is relative to this machine's clock: 59m 59s or 1h, depending on timing.
    assert!(
        created.contains("(in 59m") || created.contains("(in 1h)"),
        "{created}"
    );
    assert!(created.contains("500 users/s"), "{created}");
    let daily = json(
        &server,
        &[
            "reminder",
            "create",
            "daily",
            "--queue",
            "push",
            "--cron",
            "0 9 * * *",
            "--timezone",
            "Europe/Paris",
        ],
    );
    assert_eq!(daily["cron"], "0 9 * * *");
    assert_eq!(daily["timezone"], "Europe/Paris");
    assert_eq!(daily["priority"], "normal");
    let later = json(
        &server,
        &[
            "reminder",
            "create",
            "--queue",
            "push",
            "--at",
            "2099-01-01T00:00:00Z",
        ],
    );
    assert_eq!(later["run_at_ms"], 4_070_908_800_000u64);

    // A file with bad lines (4: an empty id; 8: a JSON object, not an id), and duplicates
    // (5 and 7).
    let users = dir.path().join("users.ndjson");
    std::fs::write(
        &users,
        "u1\n\"u2\"\n42\n\"\"\nu1\nu3\n\"u2\"\n{\"user\":\"u4\"}\n",
    )
    .expect("write file");
    let users = users.to_str().expect("utf-8 path");
    // Named without --file, the file is refused as a user id, and nothing is sent.
    let (exit, _, stderr) = belfry(&server, &["reminder", "subscribe", "kickoff", users]);
    assert_eq!(exit, Some(1));
    assert!(stderr.contains("names a file, not a user"), "{stderr}");
    assert!(stderr.contains("use --file"), "{stderr}");
    let answer = ok(
        &server,
        &["reminder", "subscribe", "kickoff", "--file", users],
    );
    assert!(
        answer.contains("changed:   4 (new subscriptions)"),
        "{answer}"
    );
    assert!(answer.contains("unchanged: 2"), "{answer}");
    assert!(answer.contains("refused:   2"), "{answer}");
    assert!(answer.contains("line 4: "), "{answer}");
    assert!(
        answer.contains("line 8: a JSON object or array"),
        "{answer}"
    );
    let count = ok(&server, &["reminder", "count", "kickoff"]);
    assert_eq!(count.trim(), "kickoff: 4 subscribers");

    // Users on the command line (one bulk call), and NDJSON on stdin.
    let answer = json(&server, &["reminder", "subscribe", "kickoff", "u9", "u1"]);
    assert_eq!(
        (answer["changed"].as_u64(), answer["unchanged"].as_u64()),
        (Some(1), Some(1))
    );
    let piped = run(
        &server,
        &["reminder", "subscribe", "kickoff", "--file", "-"],
        b"u10\nu11\n",
    );
    let stdout = String::from_utf8_lossy(&piped.stdout);
    assert!(piped.status.success(), "{piped:?}");
    assert!(stdout.contains("changed:   2"), "{stdout}");
    assert_eq!(
        json(&server, &["reminder", "count", "kickoff"])["subscribers"],
        7
    );
    assert_eq!(
        json(&server, &["reminder", "get", "kickoff"])["subscribers"],
        7
    );

    // The feed shows the reminder to a subscriber, urgent, not to a stranger or too soon.
    let feed = ok(&server, &["feed", "u1"]);
    assert!(feed.contains("urgent"), "{feed}");
    assert!(feed.contains("kickoff"), "{feed}");
    assert!(feed.contains("Kick-off"), "{feed}");
    let feed = json(&server, &["feed", "42", "--limit", "5"]);
    assert_eq!(feed["reminders"][0]["id"], "kickoff");
    assert_eq!(feed["degraded"], false);
    let soon = ok(&server, &["feed", "u1", "--within", "30m"]);
    assert_eq!(soon.trim(), "no reminders for u1 in the next 30m");
    let stranger = ok(&server, &["feed", "stranger"]);
    assert!(stranger.contains("no reminders for stranger"), "{stranger}");

    let listed = ok(&server, &["reminder", "list"]);
    assert!(listed.contains("kickoff"), "{listed}");
    assert!(listed.contains("daily"), "{listed}");
    let listed = json(&server, &["reminder", "list", "--queue", "push"]);
    assert_eq!(listed["reminders"].as_array().map(Vec::len), Some(3));

    // Unsubscribe the same file: the four are removed, the repeats and the bad line counted.
    let answer = ok(
        &server,
        &["reminder", "unsubscribe", "kickoff", "--file", users],
    );
    assert!(answer.contains("changed:   4 (removed)"), "{answer}");
    assert!(answer.contains("unchanged: 2"), "{answer}");
    assert!(answer.contains("line 4: "), "{answer}");
    ok(&server, &["reminder", "unsubscribe", "kickoff", "u9"]);
    let count = ok(&server, &["reminder", "count", "kickoff"]);
    assert_eq!(count.trim(), "kickoff: 2 subscribers");
    let feed = ok(&server, &["feed", "u1"]);
    assert!(feed.contains("no reminders for u1"), "{feed}");

    // A body cut off part way: what came before is applied and printed, the command fails.
    let cut = dir.path().join("cut.json");
    std::fs::write(&cut, r#"["u20", "u21", "u2"#).expect("write file");
    let cut = cut.to_str().expect("utf-8 path");
    let (exit, stdout, stderr) = belfry(&server, &["reminder", "subscribe", "kickoff", "-f", cut]);
    assert_eq!(exit, Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("changed:   2"), "{stdout}");
    assert!(stdout.contains("incomplete"), "{stdout}");
    assert!(stderr.contains("body_incomplete"), "{stderr}");

    let deleted = ok(&server, &["reminder", "delete", "kickoff"]);
    assert_eq!(deleted.trim(), "deleted reminder kickoff");

    // Errors: the server's code and message, exit code 1 as every API error.
    fails_with(
        &server,
        &["reminder", "get", "kickoff"],
        "reminder_not_found",
    );
    fails_with(
        &server,
        &["reminder", "count", "ghost"],
        "reminder_not_found",
    );
    fails_with(
        &server,
        &["reminder", "subscribe", "ghost", "--file", users],
        "reminder_not_found",
    );
    // A body of megabytes: the server refuses the call before reading it and stops reading,
    // which the client sees as a broken pipe; the CLI still gives the server's reason.
    let many = dir.path().join("many.ndjson");
    let ids: String = (0..400_000).map(|i| format!("user{i}\n")).collect();
    std::fs::write(&many, ids).expect("write ids");
    let many = many.to_str().expect("utf-8 path");
    for verb in ["subscribe", "unsubscribe"] {
        let stderr = fails_with(
            &server,
            &["reminder", verb, "ghost", "--file", many],
            "reminder_not_found",
        );
        assert!(!stderr.contains("Broken pipe"), "{stderr}");
    }
    fails_with(
        &server,
        &["feed", "u1", "--within", "40d"],
        "invalid_request",
    );
    for size in ["0", "50001"] {
        let stderr = fails_with(
            &server,
            &[
                "reminder",
                "create",
                "--queue",
                "push",
                "--in",
                "1m",
                "--chunk-size",
                size,
            ],
            "invalid_reminder",
        );
        assert!(stderr.contains("chunk_size must be 1 to 50000"), "{stderr}");
    }
    fails_with(
        &server,
        // `--delay` is `--in`, as in `task add`.
        &["reminder", "create", "--queue", "nowhere", "--delay", "1m"],
        "queue_not_found",
    );
    // Caught before anything is sent.
    let (exit, _, stderr) = belfry(
        &server,
        &[
            "reminder",
            "create",
            "--queue",
            "push",
            "--in",
            "1m",
            "--content",
            "hi",
        ],
    );
    assert_eq!(exit, Some(1));
    assert!(stderr.contains("--content must be JSON"), "{stderr}");
    let (exit, _, stderr) = belfry(&server, &["reminder", "create", "--queue", "push"]);
    assert_ne!(exit, Some(0));
    assert!(stderr.contains("--in"), "a time is required: {stderr}");
    let (exit, _, stderr) = belfry(&server, &["reminder", "subscribe", "daily"]);
    assert_eq!(exit, Some(1));
    assert!(stderr.contains("--file"), "users or a file: {stderr}");
    let missing = dir.path().join("missing.ndjson");
    let (exit, _, stderr) = belfry(
        &server,
        &[
            "reminder",
            "subscribe",
            "daily",
            "--file",
            missing.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(exit, Some(1));
    assert!(stderr.contains("--file: open"), "{stderr}");
}

#[test]
fn reminders_are_updated_and_their_subscribers_listed_or_checked() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "push"]);
    ok(
        &server,
        &["reminder", "create", "r1", "--queue", "push", "--in", "1h"],
    );
    ok(&server, &["reminder", "subscribe", "r1", "c", "a", "b"]);

    let all = ok(&server, &["reminder", "subscribers", "r1"]);
    assert_eq!(all.trim(), "a\nb\nc");
    let page = ok(&server, &["reminder", "subscribers", "r1", "--limit", "2"]);
    assert_eq!(
        page.trim(),
        "a\nb\nmore: belfry reminder subscribers r1 --after b --limit 2"
    );
    let rest = json(&server, &["reminder", "subscribers", "r1", "--after", "b"]);
    assert_eq!(rest["users"], serde_json::json!(["c"]), "{rest}");
    let yes = ok(&server, &["reminder", "subscribers", "r1", "b"]);
    assert_eq!(yes.trim(), "b is subscribed to r1");
    // "No" exits 1 (as grep does), saying so on stdout and nothing on stderr.
    let (exit, no, stderr) = belfry(&server, &["reminder", "subscribers", "r1", "zed", "--json"]);
    assert_eq!((exit, stderr.as_str()), (Some(1), ""));
    assert_eq!(no.trim(), r#"{"subscribed":false}"#);
    // A user called `count` (whose single-user path is the count route) is looked up too.
    let (exit, count, _) = belfry(&server, &["reminder", "subscribers", "r1", "count"]);
    assert_eq!(exit, Some(1));
    assert_eq!(count.trim(), "count is not subscribed to r1");
    ok(
        &server,
        &["reminder", "subscribe", "r1", "count", "coun", "countz"],
    );
    let count = ok(&server, &["reminder", "subscribers", "r1", "count"]);
    assert_eq!(count.trim(), "count is subscribed to r1");
    ok(
        &server,
        &["reminder", "unsubscribe", "r1", "count", "coun", "countz"],
    );

    let updated = json(
        &server,
        &[
            "reminder",
            "update",
            "r1",
            "--content",
            r#"{"t": 2}"#,
            "--urgent",
        ],
    );
    assert_eq!(updated["content"], serde_json::json!({"t": 2}));
    assert_eq!(updated["priority"], "urgent");
    let updated = json(
        &server,
        &[
            "reminder",
            "update",
            "r1",
            "--cron",
            "0 9 * * *",
            "--timezone",
            "Europe/Paris",
            "--normal",
        ],
    );
    assert_eq!(
        (&updated["cron"], &updated["timezone"], &updated["priority"]),
        (
            &Value::from("0 9 * * *"),
            &Value::from("Europe/Paris"),
            &Value::from("normal")
        )
    );
    assert_eq!(updated["content"], serde_json::json!({"t": 2}), "kept");
    let (exit, _, stderr) = belfry(&server, &["reminder", "update", "r1"]);
    assert_eq!(exit, Some(1));
    assert!(stderr.contains("nothing to change"), "{stderr}");
    let (exit, _, stderr) = belfry(
        &server,
        &[
            "reminder",
            "update",
            "r1",
            "--at",
            "2099-01-01T00:00:00Z",
            "--cron",
            "0 9 * * *",
        ],
    );
    assert_eq!(exit, Some(2), "a usage error: {stderr}");
    fails_with(
        &server,
        &["reminder", "update", "ghost", "--urgent"],
        "reminder_not_found",
    );

    // One user across reminders: listed, then every subscription ended (with --yes only).
    ok(
        &server,
        &["reminder", "create", "r2", "--queue", "push", "--in", "2h"],
    );
    ok(&server, &["reminder", "subscribe", "r2", "b"]);
    let listed = ok(&server, &["feed", "b", "--subscriptions"]);
    assert!(listed.contains("r1") && listed.contains("r2"), "{listed}");
    let (exit, _, stderr) = belfry(&server, &["feed", "b", "--unsubscribe-all"]);
    assert_eq!(exit, Some(1));
    assert!(stderr.contains("--yes"), "{stderr}");
    let ended = ok(&server, &["feed", "b", "--unsubscribe-all", "--yes"]);
    assert_eq!(ended.trim(), "b unsubscribed from 2 reminders");
    let listed = json(&server, &["feed", "b", "--subscriptions"]);
    assert_eq!(listed["reminders"], serde_json::json!([]), "{listed}");
    let none = ok(&server, &["feed", "b", "--subscriptions"]);
    assert_eq!(none.trim(), "b is subscribed to no reminder");
}
