//! Running the `belfry` binary's client commands against a spawned server.

use std::process::Command;

use serde_json::Value;

use super::{Served, BIN};

/// Runs `belfry ARGS --server URL`; returns (success, stdout, stderr).
pub fn belfry(server: &Served, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .args(["--server", &server.url])
        .env_remove("BELFRY_SERVER")
        .output()
        .expect("run belfry");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn ok(server: &Served, args: &[&str]) -> String {
    let (success, stdout, stderr) = belfry(server, args);
    assert!(success, "belfry {args:?} failed: {stderr}");
    stdout
}

/// Runs the command with `--json` and parses what it printed.
pub fn json(server: &Served, args: &[&str]) -> Value {
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let stdout = ok(server, &with_json);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

/// Runs a command that must fail; returns its stderr, which must be one line.
pub fn fails(server: &Served, args: &[&str]) -> String {
    let (success, stdout, stderr) = belfry(server, args);
    assert!(!success, "belfry {args:?} succeeded: {stdout}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

pub fn text(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("a string: {value}"))
        .to_owned()
}

/// Adds a task due now and leases it: (task id, lease id).
pub fn add_and_lease(server: &Served, queue: &str, visibility: &str) -> (String, String) {
    let added = json(server, &["task", "add", queue, "--payload", r#"{"n": 1}"#]);
    let leased = json(
        server,
        &["task", "lease", queue, "--visibility", visibility],
    );
    let task = &leased["tasks"][0];
    assert_eq!(task["id"], added["id"], "{leased}");
    (text(&task["id"]), text(&task["lease_id"]))
}
