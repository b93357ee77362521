//! Tokens through the real binary: `belfry token create` makes a token and its config lines,
//! `belfry serve` accepts it (or `BELFRY_ADMIN_TOKEN`), the CLI sends `BELFRY_TOKEN`, and a
//! server reachable from other machines refuses to start without any token.

use std::process::Command;

mod common;

use common::{serve, serve_with_env, Served, BIN};

/// Runs `belfry ARGS --server URL` with `BELFRY_TOKEN` set to `token` (or unset).
fn belfry(server: &Served, token: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .args(["--server", &server.url])
        .env_remove("BELFRY_SERVER")
        .env_remove("BELFRY_TOKEN")
        .env_remove("BELFRY_CA_FILE");
    if let Some(token) = token {
        command.env("BELFRY_TOKEN", token);
    }
    let out = command.output().expect("run belfry");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `belfry token create`: (the token, the config lines).
fn create_token(scopes: &[&str]) -> (String, String) {
    named_token("ops", scopes)
}

/// `belfry token create --name NAME`: (the token, the config lines).
fn named_token(name: &str, scopes: &[&str]) -> (String, String) {
    let mut args = vec!["token", "create", "--offline", "--name", name];
    for scope in scopes {
        args.extend(["--scope", scope]);
    }
    let out = Command::new(BIN).args(&args).output().expect("run belfry");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let token = printed.lines().nth(1).unwrap().trim().to_owned();
    let lines = printed[printed.find("[[auth.tokens]]").unwrap()..].to_owned();
    assert!(
        !lines.contains(&token),
        "the config lines hold the hash, not the token"
    );
    (token, lines)
}

#[test]
fn a_configured_token_is_required_and_accepted() {
    let (token, lines) = create_token(&["admin"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("belfry.toml");
    std::fs::write(&config, format!("[auth]\n{lines}")).unwrap();
    let server = serve(&["--store", "memory", "--config", config.to_str().unwrap()]);

    let (ok, _, stderr) = belfry(&server, None, &["queue", "create", "jobs"]);
    assert!(!ok, "a call without a token is refused");
    assert!(stderr.contains("unauthorized"), "{stderr}");
    let (ok, _, stderr) = belfry(&server, Some("bfy_wrong"), &["queue", "list"]);
    assert!(!ok && stderr.contains("unauthorized"), "{stderr}");
    let (ok, _, stderr) = belfry(&server, Some(&token), &["queue", "create", "jobs"]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = belfry(&server, Some(&token), &["queue", "list"]);
    assert!(ok && stdout.contains("jobs"), "{stdout} {stderr}");
}

/// `task export` works with a `produce:<queue>` token alone (listing with whole targets is
/// a producer's right; the queue's count for the progress bar is not needed), and a `read`
/// token's refused export leaves the earlier file as it was.
#[test]
fn an_export_needs_produce_and_a_refused_one_keeps_the_earlier_file() {
    let (admin, admin_lines) = named_token("ops", &["admin"]);
    let (producer, producer_lines) = named_token("shop", &["produce:jobs"]);
    let (reader, reader_lines) = named_token("dashboard", &["read"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("belfry.toml");
    let tokens = format!("[auth]\n{admin_lines}\n{producer_lines}\n{reader_lines}");
    std::fs::write(&config, tokens).unwrap();
    let server = serve(&["--store", "memory", "--config", config.to_str().unwrap()]);
    let (ok, _, stderr) = belfry(&server, Some(&admin), &["queue", "create", "jobs"]);
    assert!(ok, "{stderr}");
    let add = ["task", "add", "jobs", "--delay", "1h", "--payload", "7"];
    let (ok, _, stderr) = belfry(&server, Some(&producer), &add);
    assert!(ok, "{stderr}");

    let file = dir.path().join("jobs.ndjson");
    let export = ["task", "export", "jobs", file.to_str().unwrap()];
    let (ok, _, stderr) = belfry(&server, Some(&producer), &export);
    assert!(ok, "{stderr}");
    let first = std::fs::read_to_string(&file).unwrap();
    assert_eq!(first.lines().count(), 1, "{first}");
    let (ok, _, stderr) = belfry(&server, Some(&reader), &export);
    assert!(!ok && stderr.contains("forbidden"), "{stderr}");
    assert!(stderr.contains("was not written"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), first);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no partial file"
    );
}

#[test]
fn the_admin_token_from_the_environment_is_accepted() {
    let admin = "an-admin-token-for-a-first-start";
    let server = serve_with_env(&["--store", "memory"], &[("BELFRY_ADMIN_TOKEN", admin)]);
    let (ok, _, stderr) = belfry(&server, None, &["queue", "list"]);
    assert!(!ok && stderr.contains("unauthorized"), "{stderr}");
    let (ok, _, stderr) = belfry(&server, Some(admin), &["queue", "list"]);
    assert!(ok, "{stderr}");
}

#[test]
fn a_public_address_without_a_token_refuses_to_start_and_says_how_to_fix_it() {
    let out = Command::new(BIN)
        .args(["serve", "--store", "memory", "--listen", "0.0.0.0:0"])
        .env_remove("BELFRY_ADMIN_TOKEN")
        .env_remove("BELFRY_CONFIG")
        .output()
        .expect("run belfry serve");
    assert!(!out.status.success(), "it must not start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("belfry token create") && stderr.contains("allow_unauthenticated"),
        "{stderr}"
    );
}

/// `belfry serve` with `BELFRY_TLS_CERT`/`BELFRY_TLS_KEY` serves HTTPS; the CLI reaches it with
/// `--ca-file` (the test's self-signed certificate), and not without.
#[test]
fn https_with_a_certificate_the_cli_is_told_to_trust() {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let server = serve_with_env(
        &["--store", "memory"],
        &[
            ("BELFRY_TLS_CERT", cert.to_str().unwrap()),
            ("BELFRY_TLS_KEY", key.to_str().unwrap()),
        ],
    );
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let ca = cert.to_str().unwrap();
    let (ok, _, stderr) = belfry(&server, None, &["queue", "create", "tls", "--ca-file", ca]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = belfry(&server, None, &["queue", "list", "--ca-file", ca]);
    assert!(ok && stdout.contains("tls"), "{stdout} {stderr}");
    let (ok, _, stderr) = belfry(&server, None, &["queue", "list"]);
    assert!(!ok, "an untrusted certificate is refused");
    // Said as a trust problem, with the fix, not as a server that is not running.
    assert!(
        stderr.contains("is not trusted") && stderr.contains("--ca-file"),
        "{stderr}"
    );
}

/// Secrets — the admin token, a configured token, a webhook signing secret, a broker
/// password — appear in no log line (at debug level), no API answer and no metric, after the
/// server has used each of them.
#[tokio::test]
async fn secrets_appear_in_no_log_answer_or_metric() {
    let admin = "admin-secret-token-7f3a9c1e55";
    let (configured, lines) = create_token(&["read"]);
    let webhook_secret = "whsec-d41d8cd98f00b204";
    let broker_password = "broker-pass-0c2f1e9a";
    // In the URL: the NATS client logs each address it tries, at debug level.
    let nats_url_password = "nats-url-pass-5e7b2d4c";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("belfry.toml");
    std::fs::write(
        &config,
        format!(
            "[webhooks]\nallow_private_targets = true\n\n\
             [connections.main]\ntype = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n\
             password = \"{broker_password}\"\n\n\
             [connections.bus]\ntype = \"nats\"\n\
             url = \"nats://natsuser:{nats_url_password}@127.0.0.1:1\"\n\n[auth]\n{lines}"
        ),
    )
    .unwrap();
    let server = serve_with_env(
        &["--store", "memory", "--config", config.to_str().unwrap()],
        &[("BELFRY_ADMIN_TOKEN", admin), ("RUST_LOG", "debug")],
    );
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let call = |method: reqwest::Method, path: &str, token: &str, body: Option<String>| {
        let mut request = http
            .request(method, format!("{}{path}", server.url))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.body(body);
        }
        async move {
            let answer = request.send().await.expect("reaches the server");
            (answer.status().as_u16(), answer.text().await.unwrap())
        }
    };
    let mut answers = String::new();
    let webhook = format!(
        r#"{{"delivery": {{"type": "webhook", "url": "http://127.0.0.1:9/hook", "secret": "{webhook_secret}"}}}}"#
    );
    let stream = r#"{"delivery": {"type": "redis_stream", "connection": "main", "stream": "s"}}"#;
    let nats = r#"{"delivery": {"type": "nats", "connection": "bus", "subject": "s"}}"#;
    for (method, path, token, body) in [
        ("PUT", "/v1/queues/hooks", admin, Some(webhook)),
        ("PUT", "/v1/queues/events", admin, Some(stream.to_owned())),
        ("PUT", "/v1/queues/bus", admin, Some(nats.to_owned())),
        ("POST", "/v1/queues/bus/tasks", admin, Some("{}".into())),
        ("POST", "/v1/queues/hooks/tasks", admin, Some("{}".into())),
        ("POST", "/v1/queues/events/tasks", admin, Some("{}".into())),
        ("GET", "/v1/queues/hooks", &configured, None),
        ("GET", "/v1/queues", &configured, None),
        ("PUT", "/v1/queues/nope", &configured, Some("{}".into())),
        ("GET", "/metrics", admin, None),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let (status, text) = call(method, path, token, body).await;
        assert!(status < 500, "{path}: {status} {text}");
        answers.push_str(&text);
    }
    // Let the deliveries fail and be logged (the webhook target and the broker are down).
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let (_, metrics) = call(reqwest::Method::GET, "/metrics", admin, None).await;
    answers.push_str(&metrics);
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("hooks"), "the log was captured: {log}");
    assert!(
        log.contains("async_nats"),
        "the NATS client's attempts were logged: {log}"
    );
    for secret in [
        admin,
        configured.as_str(),
        webhook_secret,
        broker_password,
        nats_url_password,
    ] {
        assert!(!log.contains(secret), "a secret is in the log: {secret}");
        assert!(
            !answers.contains(secret),
            "a secret is in an answer: {secret}"
        );
    }
}

/// `belfry token create|list|revoke` against a running server, with its admin token.
#[test]
fn tokens_are_made_listed_and_revoked_from_the_cli() {
    let admin = "an-admin-token-for-the-token-commands";
    let server = serve_with_env(&["--store", "memory"], &[("BELFRY_ADMIN_TOKEN", admin)]);
    let (ok, stdout, stderr) = belfry(
        &server,
        Some(admin),
        &["token", "create", "--name", "dash", "--scope", "read"],
    );
    assert!(ok, "{stderr}");
    let made = stdout.lines().nth(1).unwrap_or("").trim().to_owned();
    assert!(made.starts_with("bfy_"), "{stdout}");
    let (ok, stdout, stderr) = belfry(&server, Some(admin), &["token", "list"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("dash") && stdout.contains("api") && stdout.contains("read"));
    assert!(!stdout.contains(&made), "a listing never shows a token");
    let (ok, _, stderr) = belfry(&server, Some(&made), &["queue", "list"]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = belfry(&server, Some(&made), &["token", "list"]);
    assert!(!ok && stderr.contains("forbidden"), "{stderr}");
    let (ok, stdout, stderr) = belfry(&server, Some(admin), &["token", "revoke", "dash"]);
    assert!(ok && stdout.contains("revoked dash"), "{stdout} {stderr}");
    let (ok, _, stderr) = belfry(&server, Some(&made), &["queue", "list"]);
    assert!(!ok && stderr.contains("unauthorized"), "{stderr}");
}
