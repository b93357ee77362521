//! The task, dead-letter and queue verbs of the real `belfry` binary against a spawned
//! `belfry serve`: a pull consumer by hand (lease, ack, nack, extend), tasks by idempotency
//! key, dead letters, `--json` printing the server's answer as received, and error lines.

use std::process::Command;

use serde_json::Value;

mod common;

use common::cli::{add_and_lease, belfry, fails, json, ok, text};
use common::{serve, serve_with_env, Served, BIN};

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    since.as_millis() as u64
}

#[test]
fn lease_then_ack_round_trip() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "work"]);
    let added = json(
        &server,
        &["task", "add", "work", "--payload", r#"{"to": "a"}"#],
    );
    let id = text(&added["id"]);

    let table = ok(&server, &["task", "lease", "work", "--visibility", "10m"]);
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("TASK") && header.contains("LEASED UNTIL"),
        "{table}"
    );
    let row = lines.next().unwrap_or_default();
    assert!(
        row.starts_with(&id) && row.contains(r#"{"to":"a"}"#),
        "{table}"
    );
    assert!(
        row.contains("(in 9m 5") || row.contains("(in 10m)"),
        "relative: {row}"
    );
    let lease_id = row
        .split_whitespace()
        .nth(1)
        .expect("a lease column")
        .to_owned();

    let acked = ok(&server, &["task", "ack", "work", &id, &lease_id]);
    assert_eq!(acked.trim(), format!("{id} done"));
    let task = json(&server, &["task", "get", "work", &id]);
    assert_eq!(task["state"], "done");
    let stale = fails(&server, &["task", "ack", "work", &id, &lease_id]);
    assert!(stale.starts_with("error: lease_expired: "), "{stale}");

    let empty = ok(&server, &["task", "lease", "work"]);
    assert_eq!(empty.trim(), "no task due in work");
}

#[test]
fn ack_several_tasks_at_once() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "work"]);
    ok(&server, &["task", "add", "work"]);
    ok(&server, &["task", "add", "work"]);
    let leased = json(&server, &["task", "lease", "work", "--max", "2"]);
    let tasks = leased["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 2, "{leased}");
    let words: Vec<String> = tasks
        .iter()
        .flat_map(|t| [text(&t["id"]), text(&t["lease_id"])])
        .collect();
    let mut args = vec!["task", "ack", "work"];
    args.extend(words.iter().map(String::as_str));
    let out = ok(&server, &args);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" done")).count(),
        2,
        "{out}"
    );
    // The same leases again: every ack fails, and the command says so.
    let (success, out, err) = belfry(&server, &args);
    assert!(!success && err.contains("2 of 2 acks failed"), "{err}");
    assert_eq!(out.matches("lease_expired").count(), 2, "{out}");
}

#[test]
fn nack_with_delay_and_extend() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "work"]);
    let (id, lease_id) = add_and_lease(&server, "work", "1m");

    let before = now_ms();
    let extended = json(
        &server,
        &[
            "task",
            "extend",
            "work",
            &id,
            &lease_id,
            "--visibility",
            "10m",
        ],
    );
    assert_eq!(extended["state"], "leased");
    let until = extended["lease_until_ms"].as_u64().expect("lease_until_ms");
    assert!(
        until >= before + 600_000 && until <= now_ms() + 600_000,
        "{extended}"
    );

    let before = now_ms();
    let nacked = ok(
        &server,
        &[
            "task",
            "nack",
            "work",
            &id,
            &lease_id,
            "--delay",
            "1h",
            "--reason",
            "smtp down",
        ],
    );
    assert!(
        nacked.starts_with(&format!("{id} scheduled again, due ")),
        "{nacked}"
    );
    assert!(
        nacked.contains("(in 59m 5") || nacked.contains("(in 1h)"),
        "{nacked}"
    );
    let task = json(&server, &["task", "get", "work", &id]);
    assert_eq!(task["state"], "scheduled");
    let due = task["due_at_ms"].as_u64().expect("due_at_ms");
    assert!(
        due >= before + 3_600_000 && due <= now_ms() + 3_600_000,
        "{task}"
    );
    // Not due for an hour: nothing to lease, and the old lease is gone.
    assert_eq!(
        json(&server, &["task", "lease", "work"])["tasks"],
        Value::Array(vec![])
    );
    let stale = fails(
        &server,
        &[
            "task",
            "extend",
            "work",
            &id,
            &lease_id,
            "--visibility",
            "1m",
        ],
    );
    assert!(stale.contains("lease_expired"), "{stale}");
}

#[test]
fn get_reschedule_and_cancel_by_idempotency_key() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "orders"]);
    let key = "close/order 42";
    let added = json(
        &server,
        &[
            "task",
            "add",
            "orders",
            "--delay",
            "1m",
            "--idempotency-key",
            key,
        ],
    );
    let by_key = json(&server, &["task", "get", "orders", "--key", key]);
    assert_eq!(by_key["id"], added["id"]);
    // `--key` names it in `task add` too: the repeat answers the same task.
    let again = json(
        &server,
        &["task", "add", "orders", "--delay", "1m", "--key", key],
    );
    assert_eq!(again["id"], added["id"]);

    let before = now_ms();
    let moved = json(
        &server,
        &[
            "task",
            "reschedule",
            "orders",
            "--key",
            key,
            "--delay",
            "10m",
        ],
    );
    let due = moved["due_at_ms"].as_u64().expect("due_at_ms");
    assert!(
        due >= before + 600_000 && due <= now_ms() + 600_000,
        "{moved}"
    );
    let at = ok(
        &server,
        &[
            "task",
            "reschedule",
            "orders",
            "--key",
            key,
            "--at",
            "2030-01-01T00:00:00Z",
        ],
    );
    assert!(
        at.contains("due:") && at.contains("2030-01-01T00:00:00Z (in "),
        "{at}"
    );
    let id = text(&added["id"]);
    let by_ms = json(
        &server,
        &[
            "task",
            "reschedule",
            "orders",
            &id,
            "--at-ms",
            "1924992000000",
        ],
    );
    assert_eq!(by_ms["due_at_ms"], 1_924_992_000_000_u64);

    let cancelled = ok(&server, &["task", "cancel", "orders", "--key", key]);
    assert!(cancelled.starts_with("cancelled"), "{cancelled}");
    assert_eq!(
        json(&server, &["task", "get", "orders", &id])["state"],
        "cancelled"
    );
    let again = fails(&server, &["task", "cancel", "orders", "--key", key]);
    assert!(again.contains("task_not_scheduled"), "{again}");
    let unknown = fails(&server, &["task", "get", "orders", "--key", "nope"]);
    assert!(unknown.contains("task_not_found"), "{unknown}");
    let neither = belfry(&server, &["task", "get", "orders"]);
    assert!(!neither.0 && neither.2.contains("<ID>"), "{}", neither.2);
}

/// `--json` prints the server's answer byte for byte, not a re-serialisation.
#[tokio::test]
async fn json_output_is_the_servers_answer() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "raw", "--rate", "2.5"]);
    let added = json(
        &server,
        &[
            "task",
            "add",
            "raw",
            "--delay",
            "1h",
            "--payload",
            r#"{"z": 1, "a": 1.50}"#,
        ],
    );
    let id = text(&added["id"]);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (args, path) in [
        (
            vec!["task", "get", "raw", id.as_str()],
            format!("/v1/queues/raw/tasks/{id}"),
        ),
        (vec!["queue", "get", "raw"], "/v1/queues/raw".to_owned()),
        (vec!["queue", "list"], "/v1/queues".to_owned()),
        (
            vec!["dead", "list", "raw"],
            "/v1/queues/raw/dead".to_owned(),
        ),
    ] {
        let direct = http
            .get(format!("{}{path}", server.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut with_json = args.clone();
        with_json.push("--json");
        assert_eq!(ok(&server, &with_json), direct, "{args:?}");
    }
    // An empty answer (204) prints nothing.
    assert_eq!(ok(&server, &["task", "cancel", "raw", &id, "--json"]), "");
    // An API error prints the server's error object on stdout too, and still fails.
    let missing = "0000000000000000000000000000abcd";
    let (success, stdout, stderr) = belfry(&server, &["task", "get", "raw", missing, "--json"]);
    assert!(!success, "{stdout}");
    let error: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(error["error"]["code"], "task_not_found", "{stdout}");
    assert!(stderr.contains("task_not_found"), "{stderr}");
}

/// `https://` to a server that serves plain HTTP says so, rather than "corrupt message".
#[test]
fn https_to_a_plain_http_server_says_it_answered_plain_http() {
    let server = serve(&["--store", "memory"]);
    let url = server.url.replacen("http://", "https://", 1);
    let out = Command::new(BIN)
        .args(["queue", "list", "--server", &url])
        .env_remove("BELFRY_SERVER")
        .env_remove("BELFRY_CA_FILE")
        .output()
        .expect("run belfry");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("serves plain HTTP") && stderr.contains("use http://"),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_server_is_one_line_with_a_hint() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = Command::new(BIN)
        .args(["queue", "list", "--server", &url])
        .output()
        .expect("run belfry");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach belfry at {url}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("--server") && stderr.contains("BELFRY_SERVER"),
        "{stderr}"
    );
}

/// The lines of a help text's `heading` section (`Commands:`, `Arguments:`).
fn section<'a>(help: &'a str, heading: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

fn help(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .arg("--help")
        .output()
        .expect("help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every subcommand of every noun says what it does in `--help`, and what each of its
/// arguments is.
#[test]
fn every_subcommand_has_help_text() {
    for noun in ["queue", "task", "dead", "schedule", "reminder", "token"] {
        let text = help(&[noun]);
        let commands: Vec<&str> = section(&text, "Commands:")
            .into_iter()
            .filter(|l| !l.trim_start().starts_with("help "))
            .collect();
        assert!(commands.len() >= 3, "{noun}: {text}");
        for line in commands {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert!(words.len() >= 3, "{noun}: {line:?} has no description");
            // Every argument of the subcommand says what it is.
            let sub = help(&[noun, words[0]]);
            for argument in section(&sub, "Arguments:") {
                assert!(
                    argument.split_whitespace().count() >= 2,
                    "{noun} {}: argument {argument:?} has no description",
                    words[0]
                );
            }
        }
    }
    let out = Command::new(BIN)
        .args(["task", "lease", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--visibility") && help.contains("--wait"),
        "{help}"
    );
}

/// `belfry queue create NAME --kafka CONNECTION:TOPIC` (and its Redis Streams and NATS
/// equivalents) make stream queues over the connections the server's config declares; a
/// connection it does not declare is refused with the field named.
#[test]
fn queue_create_with_stream_deliveries() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("belfry.toml");
    std::fs::write(
        &config,
        r#"
[connections.bus]
type = "kafka"
brokers = ["127.0.0.1:9"]

[connections.cache]
type = "redis"
url = "redis://127.0.0.1:9/0"

[connections.events]
type = "nats"
url = "nats://127.0.0.1:9"
"#,
    )
    .expect("write config");
    let config = config.to_string_lossy().into_owned();
    let server = serve(&["--store", "memory", "--config", &config]);
    let created = ok(
        &server,
        &[
            "queue",
            "create",
            "k",
            "--kafka",
            "bus:orders",
            "--key",
            "task_id",
            "--json",
        ],
    );
    let created: serde_json::Value = serde_json::from_str(&created).expect("JSON");
    assert_eq!(
        created["delivery"],
        serde_json::json!({"type": "kafka", "connection": "bus", "topic": "orders", "key": "task_id", "timeout_ms": 10000})
    );
    // Nothing listens on port 9: reported, not refused.
    assert!(
        created["warnings"].to_string().contains("not reachable"),
        "{created}"
    );
    let args = [
        "queue",
        "create",
        "r",
        "--redis-stream",
        "cache:tasks",
        "--maxlen",
        "1000",
    ];
    let (success, stdout, stderr) = belfry(&server, &args);
    assert!(success, "{stderr}");
    // The server's warning reaches the user, on stderr; stdout is the queue.
    assert!(
        stderr.starts_with("warning: the delivery target is not reachable yet"),
        "{stderr}"
    );
    assert!(stdout.contains("redis_stream cache:tasks"), "{stdout}");
    // A stream delivery's timeout, as a webhook's.
    let created = ok(
        &server,
        &[
            "queue",
            "create",
            "n",
            "--nats",
            "events:orders.due",
            "--timeout",
            "2s",
            "--json",
        ],
    );
    let created: serde_json::Value = serde_json::from_str(&created).expect("JSON");
    assert_eq!(created["delivery"]["timeout_ms"], 2_000, "{created}");
    let shown = ok(&server, &["queue", "get", "n"]);
    assert!(shown.contains("nats events:orders.due"), "{shown}");
    let (success, _, stderr) = belfry(&server, &["queue", "create", "p", "--timeout", "2s"]);
    assert!(!success);
    assert!(
        stderr.contains("--timeout is a push delivery's"),
        "{stderr}"
    );
    // Undeclared connection, and a value without the colon: one clear line each.
    let (success, _, stderr) = belfry(&server, &["queue", "create", "x", "--kafka", "nope:t"]);
    assert!(!success);
    assert!(
        stderr.contains("invalid_delivery") && stderr.contains("delivery.connection"),
        "{stderr}"
    );
    let (success, _, stderr) = belfry(&server, &["queue", "create", "x", "--nats", "events"]);
    assert!(!success);
    assert!(stderr.contains("CONNECTION:TARGET"), "{stderr}");
}

/// A command line written as one string (no argument holds a space).
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn late_policies_and_durations_from_the_command_line() {
    let server = serve(&["--store", "memory"]);
    // A queue's default late policy, and its retry delays and webhook timeout as durations.
    let create = "queue create orders --late dead --late-after 10m --backoff-initial 2s \
                  --backoff-max 1h";
    let queue = json(&server, &words(create));
    assert_eq!(queue["late_policy"], "dead");
    assert_eq!(queue["late_after_ms"], 600_000);
    assert_eq!(queue["retry"]["backoff_initial_ms"], 2_000);
    assert_eq!(queue["retry"]["backoff_max_ms"], 3_600_000);
    let shown = ok(&server, &["queue", "get", "orders"]);
    assert!(shown.contains("dead letter past 10m late"), "{shown}");
    assert!(shown.contains("backoff 2s doubling to 1h"), "{shown}");
    // The earlier millisecond flags still work.
    let queue = json(
        &server,
        &words("queue create orders --backoff-initial-ms 1500"),
    );
    assert_eq!(queue["retry"]["backoff_initial_ms"], 1_500);
    let hook = "queue create hook --webhook http://93.184.216.34/x --timeout 3s";
    assert_eq!(json(&server, &words(hook))["delivery"]["timeout_ms"], 3_000);

    // A task inherits the queue's policy or names its own; `task get` shows which.
    let inherited = json(&server, &words("task add orders --delay 1m"));
    let own = "task add orders --delay 1m --late skip --late-after 30s";
    let own = json(&server, &words(own));
    let get = |task: &Value| json(&server, &["task", "get", "orders", &text(&task["id"])]);
    let inherited = get(&inherited);
    assert_eq!(inherited["late_policy"], "dead");
    assert_eq!(inherited["late_after_ms"], 600_000);
    assert_eq!(get(&own)["late_policy"], "skip");
    let shown = ok(&server, &["task", "get", "orders", &text(&own["id"])]);
    assert!(shown.contains("skip past 30s late"), "{shown}");

    // A schedule's firings.
    let every = "schedule create orders --every 1h --late skip --late-after 5m";
    assert_eq!(
        json(&server, &words(every))["late"],
        serde_json::json!({"policy": "skip", "after_ms": 300_000})
    );

    // Inconsistent flags are refused before anything is sent, naming the flags.
    for (flags, hint) in [
        ("--late skip", "--late skip needs --late-after"),
        (
            "--late fire --late-after 1m",
            "--late-after applies to --late skip or dead",
        ),
        ("--late dead --late-after soon", "--late-after"),
    ] {
        let command = format!("task add orders {flags}");
        let stderr = fails(&server, &words(&command));
        assert!(stderr.contains(hint), "{command}: {stderr}");
    }
    let (success, _, stderr) = belfry(&server, &words("queue create q2 --late later"));
    assert!(
        !success && stderr.contains("[possible values: fire, skip, dead]"),
        "{stderr}"
    );
}

/// Payloads too big for the command line come from a file or stdin: JSON with
/// `--payload-file`, any bytes with `--binary-file` (sent as base64, stored as they are).
#[test]
fn payloads_come_from_files_and_stdin() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "files", "--pull"]);
    let dir = tempfile::tempdir().unwrap();
    // 200 KB of JSON: more than one command-line argument may hold (128 KiB on Linux).
    let big = serde_json::json!({"items": vec!["x".repeat(100); 2_000]});
    let json_file = dir.path().join("payload.json");
    std::fs::write(&json_file, big.to_string()).unwrap();
    let added = json(
        &server,
        &[
            "task",
            "add",
            "files",
            "--payload-file",
            json_file.to_str().unwrap(),
        ],
    );
    let got = json(&server, &["task", "get", "files", &text(&added["id"])]);
    assert_eq!(got["payload"], big);

    let bytes: Vec<u8> = (0..=255u8).cycle().take(3_000).collect();
    let binary = dir.path().join("payload.bin");
    std::fs::write(&binary, &bytes).unwrap();
    let added = json(
        &server,
        &[
            "task",
            "add",
            "files",
            "--binary-file",
            binary.to_str().unwrap(),
        ],
    );
    let got = json(&server, &["task", "get", "files", &text(&added["id"])]);
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(text(&got["payload_base64"]))
        .unwrap();
    assert_eq!(decoded, bytes);

    // From stdin.
    let mut child = Command::new(BIN)
        .args([
            "task",
            "add",
            "files",
            "--payload-file",
            "-",
            "--json",
            "--server",
            &server.url,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"from": "stdin"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let added: Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = json(&server, &["task", "get", "files", &text(&added["id"])]);
    assert_eq!(got["payload"]["from"], "stdin");

    // Not JSON: said, with the way to send such bytes.
    let error = fails(
        &server,
        &[
            "task",
            "add",
            "files",
            "--payload-file",
            binary.to_str().unwrap(),
        ],
    );
    assert!(
        error.contains("not JSON") && error.contains("--binary-file"),
        "{error}"
    );
}

/// `task add --target` sends the task's own URL; `task get` shows it without its query
/// string; a pull queue refuses a target with a line that says why.
#[test]
fn a_task_with_its_own_target() {
    let server = serve_with_env(
        &["--store", "memory"],
        &[("BELFRY_ALLOW_PRIVATE_TARGETS", "true")],
    );
    ok(
        &server,
        &[
            "queue",
            "create",
            "hooks",
            "--webhook",
            "http://127.0.0.1:9/hook",
        ],
    );
    let added = json(
        &server,
        &[
            "task",
            "add",
            "hooks",
            "--delay",
            "1h",
            "--target",
            "http://127.0.0.1:9/own?token=secret",
        ],
    );
    let id = text(&added["id"]);
    let shown = ok(&server, &["task", "get", "hooks", &id]);
    assert!(
        shown.contains("target:") && shown.contains("http://127.0.0.1:9/own?<redacted>"),
        "{shown}"
    );
    assert!(!shown.contains("secret"), "{shown}");

    ok(&server, &["queue", "create", "pull"]);
    let refused = fails(
        &server,
        &["task", "add", "pull", "--target", "https://example.com/x"],
    );
    assert!(
        refused.contains("target_not_supported") || refused.contains("pull queue"),
        "{refused}"
    );
}

/// The pending count of `queue`, as `queue get --json` shows it.
fn pending(server: &Served, queue: &str) -> u64 {
    let shown = json(server, &["queue", "get", queue]);
    shown["pending"]
        .as_u64()
        .unwrap_or_else(|| panic!("{shown}"))
}

/// `task import` streams a file, prints the counts and each refused line (text and `--json`),
/// and what it acknowledged survives a `kill -9` of the server.
#[test]
fn task_import_streams_a_file_reports_bad_lines_and_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let server = serve(&["--data-dir", &data]);
    ok(&server, &["queue", "create", "bulk"]);
    let mut body = String::new();
    for i in 1..=3_000 {
        match i {
            5 => body.push_str("{\"bogus\": 1}\n"),
            6 => body.push('\n'),
            _ => body.push_str(&format!(
                "{{\"payload\": {{\"n\": {i}}}, \"delay_ms\": 3600000, \"idempotency_key\": \"k{i}\"}}\n"
            )),
        }
    }
    let file = dir.path().join("tasks.ndjson");
    std::fs::write(&file, body).unwrap();
    let shown = ok(&server, &["task", "import", "bulk", file.to_str().unwrap()]);
    assert!(
        shown.contains("created") && shown.contains("2998"),
        "{shown}"
    );
    assert!(shown.contains("line 5: invalid_request:"), "{shown}");

    // Again with one new line: every other line is a duplicate, and --json prints the answer.
    let again = dir.path().join("again.ndjson");
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("{\"payload\": 0, \"idempotency_key\": \"new\"}\n");
    std::fs::write(&again, text).unwrap();
    let answer = json(
        &server,
        &["task", "import", "bulk", again.to_str().unwrap()],
    );
    assert_eq!(answer["created"], 1, "{answer}");
    assert_eq!(answer["duplicates"], 2_998, "{answer}");
    assert_eq!(answer["errors"][0]["line"], 5, "{answer}");
    assert_eq!(answer["errors"][0]["error"]["code"], "invalid_request");
    assert_eq!(answer["complete"], true, "{answer}");

    // Errors say what to fix, in one line.
    let missing = fails(&server, &["task", "import", "bulk", "/nonexistent/tasks"]);
    assert!(
        missing.contains("FILE: open /nonexistent/tasks"),
        "{missing}"
    );
    let unknown = fails(&server, &["task", "import", "nope", file.to_str().unwrap()]);
    assert!(unknown.contains("queue_not_found"), "{unknown}");

    // `Served` is dropped with SIGKILL: no shutdown, no flush. The answer promised durability.
    drop(server);
    let server = serve(&["--data-dir", &data]);
    assert_eq!(pending(&server, "bulk"), 2_999);
    let task = json(&server, &["task", "get", "bulk", "--key", "k3000"]);
    assert_eq!(task["payload"]["n"], 3_000, "{task}");
}

#[test]
fn queue_purge_needs_yes_and_drops_every_task() {
    let server = serve(&["--store", "memory"]);
    ok(&server, &["queue", "create", "work", "--rate", "5"]);
    for _ in 0..3 {
        ok(
            &server,
            &["task", "add", "work", "--payload", "1", "--delay", "1h"],
        );
    }
    let refused = fails(&server, &["queue", "purge", "work"]);
    assert!(refused.contains("--yes"), "{refused}");
    assert_eq!(
        json(&server, &["queue", "get", "work"])["pending"],
        3,
        "nothing purged"
    );
    let out = ok(&server, &["queue", "purge", "work", "--yes"]);
    assert_eq!(
        out.trim(),
        "purged work: 3 scheduled, 0 in flight and 0 dead tasks dropped; the queue and its \
         settings stay"
    );
    let queue = json(&server, &["queue", "get", "work"]);
    assert_eq!(
        (&queue["pending"], &queue["rate_per_s"]),
        (&Value::from(0), &Value::from(5.0))
    );
    let answer = json(&server, &["queue", "purge", "work", "--yes"]);
    assert_eq!(
        answer,
        serde_json::json!({"purged": {"pending": 0, "in_flight": 0, "dead": 0}})
    );
    let missing = fails(&server, &["queue", "purge", "nope", "--yes"]);
    assert!(missing.contains("queue_not_found"), "{missing}");
}

/// A webhook receiver on loopback that answers `200` and sends the head (request line and
/// headers) of each request it gets; connections without a request (the server's probe of a
/// new queue's target) are ignored.
fn receiver() -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a receiver");
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (heads, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && matches!(stream.read(&mut byte), Ok(1)) {
                head.push(byte[0]);
            }
            if head.ends_with(b"\r\n\r\n") {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                let _ = heads.send(String::from_utf8_lossy(&head).to_lowercase());
            }
        }
    });
    (url, received)
}

/// `queue create --header` round trip: the headers reach the receiver with each task, replacing
/// a task header of the same name; the queue shows their names, never a value; a header
/// belfry sets itself is refused naming `delivery.headers`.
#[test]
fn a_webhook_queue_with_fixed_headers() {
    let server = serve_with_env(
        &["--store", "memory"],
        &[("BELFRY_ALLOW_PRIVATE_TARGETS", "true")],
    );
    let (url, heads) = receiver();
    let create = [
        "queue",
        "create",
        "hooks",
        "--webhook",
        &url,
        "--header",
        "Authorization: Bearer queue-value-1",
        "--header",
        "X-Env:  prod ",
    ];
    let created = ok(&server, &create);
    assert!(
        created.contains("headers:") && created.contains("Authorization, X-Env (values hidden)"),
        "{created}"
    );
    let shown = json(&server, &["queue", "get", "hooks"]);
    assert_eq!(
        shown["delivery"]["headers_set"],
        serde_json::json!(["Authorization", "X-Env"])
    );
    assert!(!shown.to_string().contains("queue-value-1"), "{shown}");

    let add = [
        "task",
        "add",
        "hooks",
        "--header",
        "authorization=Bearer task-value",
    ];
    ok(&server, &add);
    let head = heads
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the task was delivered");
    assert!(
        head.contains("\r\nauthorization: bearer queue-value-1\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nx-env: prod\r\n"), "{head}");
    assert!(!head.contains("task-value"), "{head}");

    let refused = fails(
        &server,
        &[
            "queue",
            "create",
            "hooks",
            "--webhook",
            &url,
            "--header",
            "Host: h",
        ],
    );
    assert!(
        refused.contains("delivery.headers") && refused.contains("Host"),
        "{refused}"
    );
}
