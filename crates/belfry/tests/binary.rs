//! The real `belfry` binary: serve on the embedded engine, survive `kill -9`, stop on SIGTERM,
//! and the management subcommands.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use belfry_client::{Client, LeaseRequest, NewTask, QueueSpec};

mod common;

use common::{serve, serve_with_env, Served, BIN};

fn belfry(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run belfry");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn data_dir(dir: &Path) -> String {
    dir.join("data").to_string_lossy().into_owned()
}

#[tokio::test]
async fn accepted_tasks_survive_kill_9_and_are_delivered_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path());
    let mut expected = HashSet::new();
    let first_leased;
    {
        let server = serve(&["--data-dir", &data]);
        let client = Client::new(&server.url).unwrap();
        client
            .put_queue(
                "jobs",
                &QueueSpec {
                    max_in_flight: Some(1000),
                    ..QueueSpec::default()
                },
            )
            .await
            .unwrap();
        let tasks: Vec<NewTask> = (0..50)
            .map(|i| NewTask::json(serde_json::json!({ "n": i })))
            .collect();
        for item in client.submit_batch("jobs", &tasks).await.unwrap() {
            match item {
                belfry_client::BatchItem::Submitted(s) => {
                    expected.insert(s.id);
                }
                other => panic!("submit failed: {other:?}"),
            }
        }
        let one = client
            .submit("jobs", &NewTask::json(serde_json::json!("single")))
            .await
            .unwrap();
        expected.insert(one.id);
        // One task is leased (briefly) and never acked: it must come back too.
        let leased = client
            .lease(
                "jobs",
                &LeaseRequest {
                    max: Some(1),
                    visibility_ms: Some(200),
                    wait_ms: None,
                },
            )
            .await
            .unwrap();
        first_leased = leased[0].id.clone();
        // kill -9 (SIGKILL) right after the submits were acknowledged.
        drop(server);
    }
    let server = serve(&["--data-dir", &data]);
    let client = Client::new(&server.url).unwrap();
    let queue = client.get_queue("jobs").await.unwrap();
    assert_eq!(queue.max_in_flight, 1000, "queue config survives");
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < expected.len() && Instant::now() < deadline {
        let leased = client
            .lease(
                "jobs",
                &LeaseRequest {
                    max: Some(100),
                    visibility_ms: Some(60_000),
                    wait_ms: Some(1_000),
                },
            )
            .await
            .unwrap();
        let acks: Vec<(String, String)> = leased
            .iter()
            .map(|t| (t.id.clone(), t.lease_id.clone()))
            .collect();
        for t in leased {
            seen.insert(t.id);
        }
        if !acks.is_empty() {
            client.ack_batch("jobs", &acks).await.unwrap();
        }
    }
    assert_eq!(seen, expected, "every acknowledged submit is delivered");
    assert!(seen.contains(&first_leased));
}

#[test]
fn sigterm_stops_cleanly_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path());
    let mut server = serve(&["--data-dir", &data]);
    let pid = server.child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "belfry did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "exit status {exit:?}");
}

/// A second signal during the drain stops the server at once (status 1), rather than being
/// swallowed while the drain delay and the grace period run out.
#[test]
fn a_second_signal_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path());
    let mut server = serve_with_env(
        &["--data-dir", &data],
        &[("BELFRY_SHUTDOWN_DRAIN_DELAY", "30s")],
    );
    let pid = server.child.id().to_string();
    let signal = |name: &str| {
        let status = Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("run kill");
        assert!(status.success());
    };
    signal("-TERM");
    // The first is taken: the server is draining (its readiness says so), and still runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log.lock().unwrap().contains("SIGTERM received") {
        assert!(
            Instant::now() < deadline,
            "the first SIGTERM was not logged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.child.try_wait().unwrap().is_none(), "still draining");
    let second = Instant::now();
    signal("-INT");
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            second.elapsed() < Duration::from_secs(5),
            "a second signal did not stop it (the drain delay is 30 s)"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(1), "exit status {exit:?}");
}

/// `RUST_LOG`, which wins over `log.level`, is checked as that is: "loud" is a target to
/// tracing, and would have silenced every line.
#[test]
fn a_rust_log_that_is_not_a_filter_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--store", "memory", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RUST_LOG", "loud")
        .env_remove("BELFRY_CONFIG")
        .output()
        .expect("run belfry serve");
    assert!(!out.status.success(), "it must not start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RUST_LOG") && stderr.contains("is not a level"),
        "{stderr}"
    );
}

#[test]
fn config_with_an_unknown_key_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("belfry.toml");
    std::fs::write(
        &path,
        "listen = \"127.0.0.1:0\"\n[limits]\npayload_maxx = \"1 MiB\"\n",
    )
    .unwrap();
    let (ok, _, stderr) = belfry(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("payload_maxx"), "{stderr}");
}

#[test]
fn serve_refuses_a_data_dir_that_is_not_belfrys_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("thesis.tex"), "chapter one").unwrap();
    let data = dir.path().to_string_lossy().into_owned();
    let (ok, _, stderr) = belfry(&["serve", "--listen", "127.0.0.1:0", "--data-dir", &data]);
    assert!(!ok, "serve must refuse a foreign directory");
    assert!(stderr.contains("not a belfry data directory"), "{stderr}");
    assert!(stderr.contains("thesis.tex"), "{stderr}");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["thesis.tex"], "nothing may be written into it");
}
#[test]
fn management_subcommands_talk_to_the_server() {
    let server = serve(&["--store", "memory"]);
    let url = server.url.clone();
    let run = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--server", &url]);
        belfry(&all)
    };
    let (ok, out, err) = run(&[
        "queue",
        "create",
        "mail",
        "--rate",
        "5",
        "--max-attempts",
        "3",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("mail") && out.contains("5/s"), "{out}");

    let (ok, out, err) = run(&["queue", "list", "--json"]);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["queues"][0]["name"], "mail");

    let (ok, out, err) = run(&[
        "task",
        "add",
        "mail",
        "--payload",
        "{\"to\":\"a\"}",
        "--delay",
        "1h",
        "--json",
    ]);
    assert!(ok, "{err}");
    let added: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = added["id"].as_str().unwrap().to_owned();

    let (ok, out, err) = run(&["task", "get", "mail", &id]);
    assert!(ok, "{err}");
    assert!(
        out.contains("scheduled") && out.contains("{\"to\":\"a\"}"),
        "{out}"
    );

    let (ok, out, _) = run(&["queue", "pause", "mail"]);
    assert!(ok && out.contains("[paused]"), "{out}");
    let (ok, out, _) = run(&["queue", "resume", "mail"]);
    assert!(ok && !out.contains("[paused]"), "{out}");
    let (ok, out, _) = run(&["queue", "get", "mail"]);
    assert!(ok && out.contains("pending 1"), "{out}");

    let (ok, out, err) = run(&["task", "cancel", "mail", &id]);
    assert!(ok, "{err}");
    assert!(out.contains("cancelled"), "{out}");
    // Errors print the server's message and exit non-zero.
    let (ok, _, err) = run(&["task", "cancel", "mail", &id]);
    assert!(!ok);
    assert!(err.contains("task_not_scheduled"), "{err}");
    let (ok, _, err) = run(&["task", "add", "nosuch"]);
    assert!(!ok);
    assert!(
        err.contains("belfry queue create NAME") && err.contains("(HTTP 404)"),
        "{err}"
    );

    let (ok, out, _) = run(&["dead", "list", "mail"]);
    assert!(ok && out.contains("no dead letters"), "{out}");
    let (ok, _, err) = run(&["dead", "redrive", "mail", &id]);
    assert!(!ok && err.contains("task_not_dead"), "{err}");

    let (ok, out, _) = run(&["queue", "delete", "mail"]);
    assert!(ok && out.contains("deleted"), "{out}");
    let (ok, _, err) = run(&["queue", "get", "mail"]);
    assert!(!ok && err.contains("queue_not_found"), "{err}");
    // The advice is the command's, not the route's.
    assert!(
        err.contains("belfry queue create NAME") && !err.contains("PUT /v1"),
        "{err}"
    );
}

/// The soft and hard open-files limits of process `pid`, from /proc.
fn open_files_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open-files line");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[test]
fn serve_raises_a_low_open_files_limit_to_its_hard_limit() {
    let server = common::serve_after("ulimit -S -n 256", &["--store", "memory"]);
    let (soft, hard) = open_files_limits(server.child.id());
    assert_eq!(soft, hard, "the soft limit was raised to the hard one");
    let log = server.log.lock().unwrap().clone();
    assert!(
        log.contains(&format!("raised the open-files limit from 256 to {hard}")),
        "{log}"
    );
}

#[test]
fn serve_warns_when_the_hard_open_files_limit_cannot_hold_the_connection_cap() {
    // Soft and hard at 512: nothing to raise, and 10,000 connections do not fit.
    let server = common::serve_after("ulimit -n 512", &["--store", "memory"]);
    assert_eq!(open_files_limits(server.child.id()), (512, 512));
    let log = server.log.lock().unwrap().clone();
    assert!(!log.contains("raised the open-files limit"), "{log}");
    assert!(
        log.contains(
            "the open-files limit is 512 (hard limit 512), below http.connections_max (10000)"
        ),
        "{log}"
    );
}

/// Writes `request` on a fresh connection to `served`, ends the sending side, and reads the
/// answer to its end.
fn half_closed_exchange(served: &Served, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let addr = served.url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(request).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client that ends its sending side once its whole request is sent (`nc -N`, socat, some
/// proxies) gets its answer, and the request is made: hyper used to drop both.
#[test]
fn a_request_followed_by_a_half_close_is_answered() {
    let served = serve(&["--store", "memory"]);
    let put = half_closed_exchange(
        &served,
        b"PUT /v1/queues/q HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
    );
    assert!(put.starts_with("HTTP/1.1 201"), "{put}");
    let submit = half_closed_exchange(
        &served,
        b"POST /v1/queues/q/tasks HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\
          connection: close\r\n\r\n{}",
    );
    assert!(submit.starts_with("HTTP/1.1 201"), "{submit}");
}

/// A `nats-server` with a user and password on a free port, stopped (by its PID) on drop.
struct Nats {
    child: std::process::Child,
    port: u16,
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nats_with_password(user: &str, password: &str) -> Nats {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("nats-server")
        .args([
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--user",
            user,
            "--pass",
            password,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nats-server runs (apt-get install nats-server; scripts/test.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nats-server did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Nats { child, port }
}

/// A connection's password is never logged, even at `trace`, where the NATS client traces
/// the CONNECT message it sends (user and password in it).
#[test]
fn a_nats_password_is_not_logged_even_at_trace() {
    let password = "NATS-PASSWORD-NEVER-LOGGED";
    let nats = nats_with_password("belfry", password);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("belfry.toml");
    std::fs::write(
        &config,
        format!(
            "[connections.n]\ntype = \"nats\"\nurl = \"nats://127.0.0.1:{}\"\n\
             username = \"belfry\"\npassword = \"{password}\"\n",
            nats.port
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let served = serve_with_env(
        &["--store", "memory", "--config", config],
        &[("RUST_LOG", "trace")],
    );
    let (ok, _, err) = belfry(&[
        "queue",
        "create",
        "nq",
        "--nats",
        "n:s",
        "--server",
        &served.url,
    ]);
    assert!(ok, "{err}");
    // The client connected and logged what it does (the filter ran on its events).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served.log.lock().unwrap().contains("async_nats") {
        assert!(Instant::now() < deadline, "no async_nats event in the log");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = served.log.lock().unwrap().clone();
    assert!(!log.contains(password), "the password is in the log");
}

/// SIGHUP (sent by tools expecting a reload, or by a closing terminal) is ignored with a
/// warning, where its default would end the process on the spot, without a drain.
#[test]
fn sighup_is_ignored_with_a_warning() {
    let mut server = serve(&["--store", "memory"]);
    let pid = server.child.id().to_string();
    let kill = |name: &str| {
        assert!(Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap()
            .success())
    };
    kill("-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .log
        .lock()
        .unwrap()
        .contains("SIGHUP received and ignored")
    {
        assert!(Instant::now() < deadline, "SIGHUP was not logged");
        assert!(
            server.child.try_wait().unwrap().is_none(),
            "SIGHUP ended the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, out, err) = belfry(&["queue", "list", "--server", &server.url]);
    assert!(ok, "the server still answers after SIGHUP: {out} {err}");
    kill("-TERM");
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "exit status {exit:?}");
}

/// A signal while the store is being opened stops the start at once: here a Redis that
/// accepts connections and never answers would hold it for the connect timeout (30 s).
#[test]
fn a_signal_while_the_store_opens_stops_the_start_at_once() {
    use std::io::{BufRead, BufReader};
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("redis://127.0.0.1:{port}"))
        .env("RUST_LOG", "info")
        .env("BELFRY_REDIS_CONNECT_TIMEOUT", "30s")
        .env("BELFRY_REDIS_COMMAND_TIMEOUT", "30s")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let log = |want: &str| loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the log goes on");
        if line.contains(want) {
            return;
        }
    };
    log("connecting to the Redis store");
    let sent = Instant::now();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    log("stopped while opening the store");
    let exit = child.wait().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?} after the signal",
        sent.elapsed()
    );
    assert!(exit.success(), "exit status {exit:?}");
    drop(silent);
}

/// One answer read from `conn`: its head (lower-cased) and body, by its content-length.
fn read_answer(conn: &mut std::net::TcpStream) -> (String, Vec<u8>) {
    use std::io::Read;
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        assert_eq!(
            conn.read(&mut byte).unwrap(),
            1,
            "the connection closed mid-answer"
        );
        bytes.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    conn.read_exact(&mut body).unwrap();
    (head, body)
}

/// During the drain delay every answer says `Connection: close`, so that a client's pool
/// reconnects (to another node) while this one still serves, instead of keeping a connection
/// that the end of the drain cuts under its next request.
#[test]
fn answers_during_the_drain_close_their_connection() {
    use std::io::{Read, Write};
    let mut server = serve_with_env(
        &["--store", "memory"],
        &[("BELFRY_SHUTDOWN_DRAIN_DELAY", "30s")],
    );
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let get = b"GET /v1/queues HTTP/1.1\r\nhost: x\r\n\r\n";
    conn.write_all(get).unwrap();
    let (head, _) = read_answer(&mut conn);
    assert!(
        head.starts_with("http/1.1 200") && !head.contains("connection: close"),
        "{head}"
    );
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .log
        .lock()
        .unwrap()
        .contains("still serving until the drain delay ends")
    {
        assert!(Instant::now() < deadline, "the drain did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The same kept-alive connection: served, and told to close.
    conn.write_all(get).unwrap();
    let (head, _) = read_answer(&mut conn);
    assert!(
        head.starts_with("http/1.1 200") && head.contains("connection: close"),
        "{head}"
    );
    let mut rest = Vec::new();
    assert_eq!(
        conn.read_to_end(&mut rest).unwrap(),
        0,
        "the server closed it"
    );
    let _ = server.child.kill();
}

/// With `log.format = "json"`, why the server stopped is a JSON line on stdout too (for a
/// log collector), besides the `error:` line on stderr.
#[test]
fn a_failed_start_is_logged_as_json_when_the_log_is_json() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refused.local_addr().unwrap().port();
    drop(refused);
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("redis://127.0.0.1:{port}"))
        .env("BELFRY_LOG_FORMAT", "json")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a log line")).expect("JSON");
    assert_eq!(last["level"], "ERROR", "{last}");
    let error = last["fields"]["error"].as_str().unwrap();
    assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
}
